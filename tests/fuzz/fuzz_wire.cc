// libFuzzer target for the hook <-> daemon wire decoder (runtime/wire.h).
//
// Checks, for arbitrary bytes: decode() returns (never throws, crashes or trips a sanitizer) and
// every failure carries a reason; whatever decodes re-encodes to bytes that decode to an equal
// message and re-encode identically (the encoding is canonical and decode loses nothing it keeps).
//
//   fuzz_wire -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/wire
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/wire.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_wire: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kforge::wire;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kforge::StatusOr<WireMessage> m = decode(bytes);
  if (!m.ok()) {
    if (m.status().message().empty()) fail("rejected without a reason", "");
    return 0;
  }
  const std::string once = encode(*m);
  kforge::StatusOr<WireMessage> again = decode(once);
  if (!again.ok()) fail("re-encoded message does not decode", again.status().message());
  if (!(*again == *m)) fail("round trip changed the message", std::string(message_type_name(message_type(*m))));
  if (encode(*again) != once) fail("encoding is not canonical", std::string(message_type_name(message_type(*m))));
  return 0;
}

// libFuzzer target for OpSignature's canonical decoder (runtime/op_signature.h).
//
// Checks, for arbitrary bytes: OpSignature::decode() returns (never throws, crashes or trips a
// sanitizer) with a reason on failure; a decoded signature re-encodes to exactly the input (decode
// accepts the canonical form only), decodes again to an equal signature with the same id, and
// can be printed and turned into launch-plan sizes (the daemon does both with what it receives).
//
//   fuzz_op_signature -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/op_signature
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/op_signature.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_op_signature: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kforge::OpSignature;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kforge::StatusOr<OpSignature> sig = OpSignature::decode(bytes);
  if (!sig.ok()) {
    if (sig.status().message().empty()) fail("rejected without a reason", "");
    return 0;
  }
  const std::string once = sig->encode();
  if (once != bytes) fail("decode accepted a non-canonical encoding", sig->to_string());
  kforge::StatusOr<OpSignature> again = OpSignature::decode(once);
  if (!again.ok()) fail("re-encoded signature does not decode", again.status().message());
  if (!(*again == *sig)) fail("round trip changed the signature", sig->to_string());
  if (again->encode() != once) fail("encoding is not canonical", sig->to_string());
  if (again->id() != sig->id()) fail("round trip changed the id", sig->to_string());
  (void)sig->to_string();
  (void)sig->named_sizes();
  return 0;
}

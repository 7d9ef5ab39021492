// libFuzzer target: Store::parse_manifest on arbitrary bytes. A manifest comes from disk or from
// an imported bundle; whatever the bytes, parsing must fail cleanly or yield an entry whose key
// matches its content.
//
// Random bytes almost never pass the frame's SHA-256, so the first input byte picks a mode:
//   even: the rest is the whole file (exercises the frame checks);
//   odd:  the rest is the FlatBuffer payload, wrapped here in a valid frame (magic "kforgeMF",
//         version 1, reserved 0, length, SHA-256: Note [Cache layout] in cache/store.cc), so the
//         FlatBuffers verifier and the decoders behind it see fuzzed data.
#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cache/store.h"

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string framed(std::string_view payload) {
  std::string out("kforgeMF", 8);
  put_le(out, 1, 4);
  put_le(out, 0, 4);
  put_le(out, payload.size(), 8);
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  out.append(reinterpret_cast<const char*>(h), sizeof h);
  out += payload;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file = (data[0] & 1) ? framed(rest) : std::string(rest);
  auto entry = kforge::Store::parse_manifest(file);
  if (entry.ok()) {
    // A parsed manifest's key is recomputed from its signature and environment.
    if (!(entry->key == kforge::entry_key(entry->signature, entry->environment))) __builtin_trap();
    (void)entry->signature.to_string();
    (void)entry->spec.resolve(entry->signature);
  }
  return 0;
}

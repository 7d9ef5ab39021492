// libFuzzer target for the bundle reader (cache/bundle.h, parse_bundle_bytes).
//
// Random bytes almost never get past a bundle's SHA-256, so the first input byte picks what the
// rest is, and the target frames it correctly (Note [Bundle format] in cache/bundle.cc) to reach
// each layer:
//   0: the whole bundle file, as is (framing, flags, lengths, signature block);
//   1: the zstd-compressed payload, in a header with the right sizes and checksum (the bounded
//      decompressor, a lying or truthful content size);
//   2: the msgpack payload, compressed and framed (entry structure, manifests via
//      Store::parse_manifest, blob hashes and references).
// Checks: parse_bundle_bytes returns (never throws, crashes, trips a sanitizer or exceeds the rss
// limit) with an error naming the bundle, and whatever it accepts is consistent: each entry's blobs
// are exactly its manifest's references, with matching sizes and SHA-256.
//
//   fuzz_bundle -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/bundle
#include <sodium.h>
#include <zstd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cache/bundle.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_bundle: %s: %s\n", what, detail.c_str());
  std::abort();
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string sha256_of(std::string_view data) {
  std::string h(crypto_hash_sha256_BYTES, '\0');
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(h.data()), reinterpret_cast<const unsigned char*>(data.data()),
                     data.size());
  return h;
}

// An unsigned bundle around `compressed`, with the header fields and checksum right.
std::string frame(std::string_view compressed, uint64_t content_size, uint32_t entries) {
  std::string file("\x89KFB\r\n\x1a\n", 8);
  put_le(file, 1, 4);
  put_le(file, 0, 4);
  put_le(file, compressed.size(), 8);
  put_le(file, content_size, 8);
  put_le(file, entries, 4);
  put_le(file, 0, 4);
  file.append(compressed);
  file += sha256_of(file);
  return file;
}

std::string hex(const std::string& raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (sodium_init() < 0) fail("setup", "sodium_init failed");
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const uint8_t mode = data[0] % 3;

  std::string bundle;
  if (mode == 0) {
    bundle.assign(rest);
  } else if (mode == 1) {
    // The content size comes from the input too (little-endian, first 4 bytes), so the fuzzer
    // explores declared sizes that are smaller, larger and equal to what the frame holds.
    if (rest.size() < 5) return 0;
    uint64_t declared = 0;
    for (int i = 3; i >= 0; --i) declared = (declared << 8) | static_cast<uint8_t>(rest[static_cast<size_t>(i)]);
    bundle = frame(rest.substr(5), declared, static_cast<uint8_t>(rest[4]));
  } else {
    if (rest.empty()) return 0;
    std::string z(ZSTD_compressBound(rest.size() - 1), '\0');
    size_t n = ZSTD_compress(z.data(), z.size(), rest.data() + 1, rest.size() - 1, 1);
    if (ZSTD_isError(n)) fail("setup", ZSTD_getErrorName(n));
    z.resize(n);
    bundle = frame(z, rest.size() - 1, static_cast<uint8_t>(rest[0]));
  }

  kforge::ImportOptions options;
  options.limits.max_payload_bytes = 64u << 20;   // stays far below -rss_limit_mb
  kforge::StatusOr<kforge::ParsedBundle> parsed = kforge::parse_bundle_bytes(bundle, "fuzz", options);
  if (!parsed.ok()) {
    if (parsed.status().message().rfind("bundle fuzz: ", 0) != 0) {
      fail("error does not name the bundle", parsed.status().message());
    }
    return 0;
  }
  for (const kforge::BundleEntry& e : parsed->entries) {
    if (e.blobs.size() != e.entry.blobs.size()) fail("accepted entry", "blob count differs from the manifest's");
    for (size_t i = 0; i < e.blobs.size(); ++i) {
      const kforge::BlobRef& ref = e.entry.blobs[i];
      if (e.blobs[i].name != ref.name || e.blobs[i].bytes.size() != ref.size ||
          hex(sha256_of(e.blobs[i].bytes)) != ref.sha256_hex) {
        fail("accepted entry", "blob '" + ref.name + "' does not match its reference");
      }
    }
  }
  return 0;
}

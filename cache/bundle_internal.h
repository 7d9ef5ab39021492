// Internal to cache/: what bundle.cc (the format: export, import) and bundle_keys.cc (Ed25519 key
// files) share: the constants of Note [Bundle format], files written atomically and read bounded,
// libsodium's start and hashes, and the wrapper that keeps exceptions from leaving the cache.
#pragma once

#include <sodium.h>
#include <sys/stat.h>
#include <zstd.h>

#include <array>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace kforge::bundle_detail {


constexpr std::array<uint8_t, 8> kMagic = {0x89, 'K', 'F', 'B', '\r', '\n', 0x1a, '\n'};
constexpr uint32_t kBundleVersion = 1;
constexpr uint32_t kFlagSigned = 1;
constexpr size_t kHeaderSize = 40;
constexpr size_t kChecksumSize = crypto_hash_sha256_BYTES;
constexpr size_t kSignatureBlockSize = crypto_sign_PUBLICKEYBYTES + crypto_sign_BYTES;
constexpr size_t kMaxBlobName = 256;
constexpr size_t kMaxKeyFileBytes = 4096;
// Compression level 9: a fair trade for cubins and shared objects (several times faster than
// 19 for a few percent of size); exports are rare but may carry a whole cache.
constexpr int kZstdLevel = 9;
constexpr int kZstdWindowLogMax = 27;
constexpr const char* kPublicKeyTag = "kforge-ed25519-public ";
constexpr const char* kSecretKeyTag = "kforge-ed25519-secret ";

static_assert(kChecksumSize == 32 && crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_BYTES == 64);
static_assert(crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_SEEDBYTES == 32);

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* d) const noexcept { ZSTD_freeDCtx(d); }
};

// Wipes a string that held secret material (key file text, hex) before it is freed.
class SecretText {
 public:
  SecretText() = default;
  SecretText(const SecretText&) = delete;
  SecretText& operator=(const SecretText&) = delete;
  ~SecretText() {
    if (!s.empty()) sodium_memzero(s.data(), s.size());
  }
  std::string s;
};

Status ensure_sodium();
std::array<uint8_t, 32> sha256(std::string_view data);
std::string short_hex(const std::string& hex);

enum class Placement { kReplace, kRefuseExisting };
// Writes `data` to `path` through a temp file in the same directory, so readers never see a
// partial file. kRefuseExisting places it with link(), which fails atomically if `path` exists
// (an O_EXCL create of `path` itself would leave a partial key file behind after a crash).
// `exact_mode` sets the mode regardless of umask (secret keys); otherwise umask applies.
Status write_file_atomically(const std::string& path, std::string_view data, mode_t mode, bool exact_mode,
                             Placement placement);

struct FileBytes {
  std::string bytes;
  struct stat st {};
};
// Reads a whole regular file of at most `max_bytes`. `nofollow` refuses a symlink at `path`.
StatusOr<FileBytes> read_file_bounded(const std::string& path, uint64_t max_bytes, bool nofollow, std::string_view what);

// Runs `f`, turning any exception (std::bad_alloc from a huge bundle, above all) into a Status:
// nothing throws out of this file's public functions.
template <typename F>
auto no_throw(std::string_view context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return out_of_range(std::string(context) + ": out of memory");
  } catch (const std::exception& e) {
    return internal_error(std::string(context) + ": " + e.what());
  }
}

}  // namespace kforge::bundle_detail

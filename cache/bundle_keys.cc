// Ed25519 key files for signing bundles (cache/bundle.h: PublicKey, SigningKey).
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "cache/bundle.h"
#include "cache/bundle_internal.h"
#include "runtime/file_io.h"

namespace kforge {

using namespace bundle_detail;

namespace {

// Public half of "<tag><hex>\n" parsing. Accepts exactly the tag, 2*n hex digits and an optional
// final newline. Never echoes the text: it may be a secret.
bool parse_key_line(std::string_view text, std::string_view tag, uint8_t* out, size_t n) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.size() != tag.size() + 2 * n || text.substr(0, tag.size()) != tag) return false;
  std::string_view hex = text.substr(tag.size());
  size_t bin_len = 0;
  const char* end = nullptr;
  // sodium_hex2bin runs in constant time with respect to the digits: safe for secrets.
  if (sodium_hex2bin(out, n, hex.data(), hex.size(), nullptr, &bin_len, &end) != 0) return false;
  return bin_len == n && end == hex.data() + hex.size();
}

}  // namespace

// ---- keys ---------------------------------------------------------------------------------------

std::string PublicKey::fingerprint() const {
  auto h = sha256(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  return file_io::to_hex(h.data(), 8);
}

StatusOr<PublicKey> PublicKey::load(const std::string& path) {
  return no_throw("public key file " + path, [&]() -> StatusOr<PublicKey> {
    KFORGE_RETURN_IF_ERROR(ensure_sodium());
    KFORGE_ASSIGN_OR_RETURN(FileBytes f, read_file_bounded(path, kMaxKeyFileBytes, false, "public key file"));
    PublicKey k;
    if (!parse_key_line(f.bytes, kPublicKeyTag, k.bytes.data(), k.bytes.size())) {
      return invalid_argument("public key file " + path + ": expected one line 'kforge-ed25519-public <64 hex digits>'");
    }
    if (crypto_core_ed25519_is_valid_point(k.bytes.data()) != 1) {
      return invalid_argument("public key file " + path + ": not a valid Ed25519 public key");
    }
    return k;
  });
}

Status PublicKey::save(const std::string& path) const {
  return no_throw("public key file " + path, [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(ensure_sodium());   // the temp name's random suffix
    std::string text = std::string(kPublicKeyTag) + file_io::to_hex(bytes.data(), bytes.size()) + "\n";
    return write_file_atomically(path, text, 0644, /*exact_mode=*/false, Placement::kRefuseExisting);
  });
}

StatusOr<SigningKey> SigningKey::generate() {
  KFORGE_RETURN_IF_ERROR(ensure_sodium());
  SigningKey k;
  crypto_sign_keypair(k.public_key.bytes.data(), k.secret.data());
  return k;
}

StatusOr<SigningKey> SigningKey::load(const std::string& path) {
  return no_throw("secret key file " + path, [&]() -> StatusOr<SigningKey> {
    KFORGE_RETURN_IF_ERROR(ensure_sodium());
    // O_NOFOLLOW and the owner check: a key planted or swapped by someone else must not sign.
    KFORGE_ASSIGN_OR_RETURN(FileBytes f, read_file_bounded(path, kMaxKeyFileBytes, true, "secret key file"));
    SecretText text;
    text.s = std::move(f.bytes);
    if (f.st.st_uid != ::geteuid()) {
      return invalid_argument("secret key file " + path + " is owned by uid " + std::to_string(f.st.st_uid) +
                              ", not by this user (uid " + std::to_string(::geteuid()) + ")");
    }
    if ((f.st.st_mode & 0177) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(f.st.st_mode & 07777));
      return invalid_argument("secret key file " + path + " has mode " + mode +
                              "; it must be readable by its owner only (run: chmod 600 " + path + ")");
    }
    SigningKey k;
    if (!parse_key_line(text.s, kSecretKeyTag, k.secret.data(), k.secret.size())) {
      sodium_memzero(k.secret.data(), k.secret.size());
      return invalid_argument("secret key file " + path + ": expected one line 'kforge-ed25519-secret <128 hex digits>'");
    }
    // The secret carries its public half; recompute it from the seed so a damaged file cannot
    // produce signatures that verify under no key the user knows.
    std::array<uint8_t, 64> recomputed{};
    crypto_sign_seed_keypair(k.public_key.bytes.data(), recomputed.data(), k.secret.data());
    bool consistent = sodium_memcmp(recomputed.data(), k.secret.data(), recomputed.size()) == 0;
    sodium_memzero(recomputed.data(), recomputed.size());
    if (!consistent) {
      sodium_memzero(k.secret.data(), k.secret.size());
      return invalid_argument("secret key file " + path + " is damaged (its public half does not match its seed)");
    }
    return k;
  });
}

Status SigningKey::save(const std::string& path) const {
  return no_throw("secret key file " + path, [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(ensure_sodium());
    SecretText text;
    text.s.assign(kSecretKeyTag);
    text.s.resize(text.s.size() + 2 * secret.size() + 1);
    sodium_bin2hex(text.s.data() + std::strlen(kSecretKeyTag), 2 * secret.size() + 1, secret.data(), secret.size());
    text.s.back() = '\n';   // replaces the terminator sodium_bin2hex wrote
    return write_file_atomically(path, text.s, 0600, /*exact_mode=*/true, Placement::kRefuseExisting);
  });
}

}  // namespace kforge

// Bundles: one file that carries cache entries from one cache to another (staging ->
// production), zstd-compressed and optionally signed with Ed25519.
//
//   StatusOr<SigningKey> key = SigningKey::load("staging.key");          // kforge cache keygen
//   export_bundle(store, {}, "kernels.kfb", &*key);                      // {} = every entry
//   ImportOptions opts; opts.trusted_key = PublicKey::load("staging.pub").value();
//   StatusOr<ImportReport> r = import_bundle(prod_store, "kernels.kfb", opts);
//
// Promises:
// - Import checks everything before it writes anything: the file's framing and checksum, the
//   signature (when a trusted key is given, the bundle must be signed by exactly that key), the
//   decompressed size limits, and every manifest and blob (Store::parse_manifest, SHA-256). A
//   bundle with any flipped byte, truncated, or signed by another key is refused with an error
//   naming what was wrong, and the target cache is left unchanged. (Only a failure while
//   publishing, such as a full disk, can leave some entries imported; each is still atomic.)
// - Export -> import reproduces every manifest and blob byte for byte. Import keeps the target's
//   state files: an entry quarantined there stays quarantined.
// - Secret keys are files of mode 0600; they never appear in errors or logs.
// - Nothing throws. The file format is Note [Bundle format] in bundle.cc.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/store.h"

namespace kforge {

struct PublicKey {
  std::array<uint8_t, 32> bytes{};
  // File format: one line "kforge-ed25519-public <64 hex digits>\n". load() also refuses bytes
  // that are not a valid Ed25519 point.
  static StatusOr<PublicKey> load(const std::string& path);
  Status save(const std::string& path) const;   // refuses to overwrite, like SigningKey::save
  std::string fingerprint() const;   // first 16 hex digits of SHA-256(bytes), for messages
  friend bool operator==(const PublicKey&, const PublicKey&) = default;
};

struct SigningKey {
  std::array<uint8_t, 64> secret{};  // libsodium Ed25519 secret key (seed + public key)
  PublicKey public_key;
  static StatusOr<SigningKey> generate();
  // File format: "kforge-ed25519-secret <128 hex digits>\n", mode 0600 (refused if wider, or
  // owned by another user, or a symbolic link, or if its public half does not match its seed).
  static StatusOr<SigningKey> load(const std::string& path);
  Status save(const std::string& path) const;   // creates with 0600; refuses to overwrite
};

// Upper bounds on what a bundle may contain, checked before the memory is allocated. Export
// checks the same defaults, so it never writes a bundle that import would refuse.
struct BundleLimits {
  uint64_t max_payload_bytes = uint64_t{4} << 30;   // decompressed payload (the file is bounded by
                                                    // ZSTD_compressBound of this plus framing)
  size_t max_entries = size_t{1} << 16;
  size_t max_blobs_per_entry = 64;
  uint64_t max_manifest_bytes = uint64_t{16} << 20;
  uint64_t max_blob_bytes = (uint64_t{4} << 30) - 1; // msgpack bin32's own limit
};

struct ExportReport {
  size_t entries = 0;
  uint64_t file_bytes = 0;
  bool signed_bundle = false;
};

// Writes the entries with `keys` (every entry if empty; duplicates ignored) to `path` atomically
// (temp + rename; an existing file at `path` is replaced). Every entry is verified while read.
StatusOr<ExportReport> export_bundle(const Store& store, const std::vector<EntryKey>& keys,
                                     const std::string& path, const SigningKey* signing_key);

struct ImportOptions {
  // If set, the bundle must carry a valid signature by this key.
  std::optional<PublicKey> trusted_key;
  // Refuse unsigned bundles even without a trusted key (then any valid signature is not enough:
  // a trusted key is required, so this only makes sense together with trusted_key; without one,
  // every bundle is refused).
  bool require_signature = false;
  BundleLimits limits;
};

struct ImportReport {
  size_t entries_imported = 0;
  size_t entries_identical = 0;   // already present with identical manifest bytes (and intact blobs)
  // True when the bundle was verified as signed by trusted_key. A signed bundle imported without
  // a trusted key still has its signature verified, but only against the key it carries (which
  // proves integrity, not origin): this stays false and only signer_fingerprint is set.
  bool signature_checked = false;
  std::string signer_fingerprint; // empty when unsigned
};

StatusOr<ImportReport> import_bundle(Store& store, const std::string& path, const ImportOptions& options);

// One entry of a bundle after every check import makes before publishing.
struct BundleEntry {
  std::string manifest;           // exact bytes, as Store::read_manifest_bytes gave them on export
  StoredEntry entry;              // Store::parse_manifest(manifest)
  std::vector<BlobData> blobs;    // in the manifest's blob order, each matching its BlobRef
};

struct ParsedBundle {
  std::vector<BundleEntry> entries;
  std::optional<PublicKey> signer;   // set when the bundle is signed (signature verified)
};

// Everything import_bundle checks, on bytes already in memory, without a Store (also the libFuzzer
// entry point). `name` prefixes every error ("bundle <name>: ...").
StatusOr<ParsedBundle> parse_bundle_bytes(std::string_view bytes, std::string_view name,
                                          const ImportOptions& options);

}  // namespace kforge

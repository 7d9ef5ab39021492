#include "cache/bundle.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <set>
#include <utility>

#include "runtime/msgpack_codec.h"
#include "cache/bundle_internal.h"
#include "runtime/file_io.h"
#include "runtime/unique_fd.h"

// Note [Bundle format]
// ~~~~~~~~~~~~~~~~~~~~
// A bundle is one file; integers are little-endian.
//
//   offset  size  field
//   0       8     magic "\x89KFB\r\n\x1a\n" (PNG-style: catches text-mode and 7-bit transfers)
//   8       4     format version (1)
//   12      4     flags: bit 0 = signed; every other bit must be 0
//   16      8     P = size of the compressed payload
//   24      8     U = declared size of the decompressed payload
//   32      4     entry count (must equal the payload's)
//   36      4     reserved, must be 0
//   40      P     payload: one zstd frame
//   40+P    32    checksum: SHA-256(header || payload)
//   72+P    32    signer's Ed25519 public key          } only when flags bit 0 is set
//   104+P   64    Ed25519 signature over               }
//                 (header || checksum)
//
// The file must be exactly this long: shorter is "truncated", longer is "trailing bytes". The
// checksum covers the header too, so a flipped byte anywhere is caught even where a header field
// would still pass its own checks; the signature covers the checksum, hence every byte before it.
//
// The decompressed payload is msgpack:
//   [ entry* ]                    entry = [ manifest: bin, [ blob* ] ]
//                                 blob  = [ name: str, sha256: bin(32), bytes: bin ]
// Blobs appear in the manifest's blob order; each must match its BlobRef (name, hash, size) and
// no blob may be missing or extra.
//
// Nothing in the file is trusted before it is checked: lengths are compared with the file size and
// with BundleLimits before any allocation; U only bounds decompression (which must produce exactly
// U bytes) and is never used to size a buffer in one step, so a lying header cannot make import
// allocate more than the payload really decompresses to (itself at most max_payload_bytes).

namespace kforge {
namespace {

using namespace bundle_detail;
using file_io::get_le;
using file_io::put_u32;
using file_io::put_u64;

uint32_t get_u32(std::string_view s, size_t at) { return static_cast<uint32_t>(get_le(s, at, 4)); }
uint64_t get_u64(std::string_view s, size_t at) { return get_le(s, at, 8); }

// ---- payload ------------------------------------------------------------------------------------

// Decompresses one zstd frame that must produce exactly `declared` bytes. The buffer grows
// geometrically with what the frame actually produces, so a header that lies about `declared`
// costs nothing; the frame's own content-size field is ignored for the same reason.
StatusOr<std::string> decompress_exact(std::string_view in, uint64_t declared) {
  std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return internal_error("cannot create a zstd decompression context");
  // Bound the decoder's window (its own memory, 128 MiB) at zstd's default limit, stated here
  // because the constant is not in zstd's stable API; our compressor never needs more.
  size_t rc = ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, kZstdWindowLogMax);
  if (ZSTD_isError(rc)) return internal_error(std::string("zstd: ") + ZSTD_getErrorName(rc));

  // One byte beyond `declared` of room lets an over-long frame show itself.
  const uint64_t cap = declared + 1;
  std::string out;
  size_t produced = 0;
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  for (;;) {
    if (produced == out.size()) {
      uint64_t next = std::min<uint64_t>(cap, std::max<uint64_t>(uint64_t{1} << 20, uint64_t{out.size()} * 2));
      out.resize(static_cast<size_t>(next));
    }
    ZSTD_outBuffer ob{out.data(), out.size(), produced};
    size_t r = ZSTD_decompressStream(dctx.get(), &ob, &ib);
    if (ZSTD_isError(r)) {
      return invalid_argument(std::string("payload is not valid zstd data (") + ZSTD_getErrorName(r) + ")");
    }
    produced = ob.pos;
    if (produced > declared) {
      return invalid_argument("payload decompresses to more than the " + std::to_string(declared) +
                              " bytes the header declares");
    }
    if (r == 0) break;   // frame complete and flushed
    if (ib.pos == ib.size && ob.pos < ob.size) return invalid_argument("payload's zstd frame is truncated");
  }
  if (ib.pos != ib.size) {
    return invalid_argument(std::to_string(ib.size - ib.pos) + " unexpected bytes after the payload's zstd frame");
  }
  if (produced != declared) {
    return invalid_argument("payload decompresses to " + std::to_string(produced) + " bytes, but the header declares " +
                            std::to_string(declared));
  }
  out.resize(produced);
  return out;
}

StatusOr<std::string> compress(std::string_view in) {
  std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> cctx(ZSTD_createCCtx());
  if (!cctx) return internal_error("cannot create a zstd compression context");
  std::string out(ZSTD_compressBound(in.size()), '\0');
  size_t n = ZSTD_compressCCtx(cctx.get(), out.data(), out.size(), in.data(), in.size(), kZstdLevel);
  if (ZSTD_isError(n)) return internal_error(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

std::string entry_label(size_t i, const EntryKey& key) {
  return "entry " + std::to_string(i) + " (key " + short_hex(key.hex()) + ")";
}

// Reads one payload entry and checks it completely: manifest, every blob's hash, and that the
// blobs are exactly the manifest's references.
StatusOr<BundleEntry> read_entry(const codec::Reader& r, size_t index, const BundleLimits& limits) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(2));
  BundleEntry out;
  KFORGE_ASSIGN_OR_RETURN(out.manifest, r.field(0, "manifest").bin(static_cast<size_t>(limits.max_manifest_bytes)));
  StatusOr<StoredEntry> parsed = Store::parse_manifest(out.manifest);
  if (!parsed.ok()) {
    return Status(parsed.status().code(), "entry " + std::to_string(index) + ": manifest: " + parsed.status().message());
  }
  out.entry = std::move(parsed).value();
  const std::string label = entry_label(index, out.entry.key);
  if (out.entry.blobs.size() > limits.max_blobs_per_entry) {
    return out_of_range(label + ": manifest references " + std::to_string(out.entry.blobs.size()) +
                        " blobs, more than the limit of " + std::to_string(limits.max_blobs_per_entry));
  }

  codec::Reader blobs = r.field(1, "blobs");
  KFORGE_RETURN_IF_ERROR(blobs.expect_array(0, limits.max_blobs_per_entry));
  size_t n = blobs.array_size().value();
  struct Carried {
    std::string name, sha256_hex, bytes;
    bool used = false;
  };
  std::vector<Carried> carried;
  carried.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    codec::Reader b = blobs.at(i);
    KFORGE_RETURN_IF_ERROR(b.expect_array(3));
    Carried c;
    KFORGE_ASSIGN_OR_RETURN(c.name, b.field(0, "name").str(kMaxBlobName));
    KFORGE_ASSIGN_OR_RETURN(std::string digest, b.field(1, "sha256").bin(32));
    if (digest.size() != 32) return b.field(1, "sha256").error("expected 32 bytes, got " + std::to_string(digest.size()));
    KFORGE_ASSIGN_OR_RETURN(c.bytes, b.field(2, "bytes").bin(static_cast<size_t>(limits.max_blob_bytes)));
    c.sha256_hex = file_io::to_hex(reinterpret_cast<const uint8_t*>(digest.data()), digest.size());
    auto actual = sha256(c.bytes);
    if (file_io::to_hex(actual.data(), actual.size()) != c.sha256_hex) {
      return invalid_argument(label + ": blob '" + c.name + "' does not match its SHA-256 " + short_hex(c.sha256_hex));
    }
    carried.push_back(std::move(c));
  }

  for (const BlobRef& ref : out.entry.blobs) {
    auto it = std::find_if(carried.begin(), carried.end(), [&](const Carried& c) {
      return !c.used && c.name == ref.name && c.sha256_hex == ref.sha256_hex;
    });
    if (it == carried.end()) {
      return invalid_argument(label + ": manifest references blob '" + ref.name + "' (sha256 " +
                              short_hex(ref.sha256_hex) + ") which the bundle does not carry");
    }
    if (it->bytes.size() != ref.size) {
      return invalid_argument(label + ": blob '" + ref.name + "' is " + std::to_string(it->bytes.size()) +
                              " bytes, but the manifest says " + std::to_string(ref.size));
    }
    it->used = true;
    out.blobs.push_back(BlobData{ref.name, std::move(it->bytes)});
  }
  for (const Carried& c : carried) {
    if (!c.used) {
      return invalid_argument(label + ": bundle carries blob '" + c.name + "' (sha256 " + short_hex(c.sha256_hex) +
                              ") that the manifest does not reference");
    }
  }
  return out;
}

// At least ZSTD_compressBound(max_payload_bytes): the most a compressor may emit for a payload
// within the limit. Capped so that adding the framing can never overflow.
uint64_t max_compressed_size(const BundleLimits& limits) {
  const uint64_t p = std::min<uint64_t>(limits.max_payload_bytes, uint64_t{1} << 56);
  return p + (p >> 7) + (uint64_t{1} << 17);
}

struct Header {
  uint32_t version = 0;
  uint32_t flags = 0;
  uint64_t payload_size = 0;
  uint64_t content_size = 0;
  uint32_t entry_count = 0;
};

std::string encode_header(const Header& h) {
  std::string out(reinterpret_cast<const char*>(kMagic.data()), kMagic.size());
  put_u32(out, h.version);
  put_u32(out, h.flags);
  put_u64(out, h.payload_size);
  put_u64(out, h.content_size);
  put_u32(out, h.entry_count);
  put_u32(out, 0);
  return out;
}

// A bundle whose framing, checksum and signature have been checked; the payload is still opaque.
struct Framed {
  Header header;
  std::string_view payload;
  std::optional<PublicKey> signer;
};

std::string truncated_message(size_t size) {
  return "truncated (" + std::to_string(size) + " bytes; a bundle is at least " +
         std::to_string(kHeaderSize + kChecksumSize) + ")";
}

// Everything outside the payload, in the order that gives the most useful message: what the
// file is, whether it is whole, whether it is intact, and only then who signed it.
StatusOr<Framed> check_framing(std::string_view bytes, const ImportOptions& options) {
  const BundleLimits& limits = options.limits;
  // A prefix of the magic is a cut-off bundle, not some other file.
  const size_t magic_len = std::min(bytes.size(), kMagic.size());
  if (magic_len > 0 && std::memcmp(bytes.data(), kMagic.data(), magic_len) != 0) {
    return invalid_argument("not a kforge bundle (bad magic)");
  }
  if (bytes.size() < kHeaderSize + kChecksumSize) return invalid_argument(truncated_message(bytes.size()));

  Framed f;
  Header& h = f.header;
  h.version = get_u32(bytes, 8);
  h.flags = get_u32(bytes, 12);
  h.payload_size = get_u64(bytes, 16);
  h.content_size = get_u64(bytes, 24);
  h.entry_count = get_u32(bytes, 32);
  if (h.version != kBundleVersion) {
    if (h.version > kBundleVersion) {
      return invalid_argument("bundle format version " + std::to_string(h.version) +
                              " is newer than this kforge reads (" + std::to_string(kBundleVersion) + "); upgrade kforge");
    }
    return invalid_argument("unknown bundle format version " + std::to_string(h.version));
  }
  if ((h.flags & ~kFlagSigned) != 0) return invalid_argument("unknown header flags " + std::to_string(h.flags));
  if (get_u32(bytes, 36) != 0) return invalid_argument("reserved header field is not zero");
  if (h.content_size > limits.max_payload_bytes) {
    return out_of_range("header declares a payload of " + std::to_string(h.content_size) +
                        " bytes uncompressed, more than the limit of " + std::to_string(limits.max_payload_bytes));
  }
  if (h.entry_count > limits.max_entries) {
    return out_of_range("header declares " + std::to_string(h.entry_count) + " entries, more than the limit of " +
                        std::to_string(limits.max_entries));
  }
  const uint64_t max_compressed = max_compressed_size(limits);
  if (h.payload_size > max_compressed) {
    return out_of_range("header declares a compressed payload of " + std::to_string(h.payload_size) +
                        " bytes, more than the limit of " + std::to_string(max_compressed));
  }
  const bool is_signed = (h.flags & kFlagSigned) != 0;
  const uint64_t expected = kHeaderSize + h.payload_size + kChecksumSize + (is_signed ? kSignatureBlockSize : 0);
  if (bytes.size() < expected) {
    return invalid_argument("truncated (" + std::to_string(bytes.size()) + " of " + std::to_string(expected) + " bytes)");
  }
  if (bytes.size() > expected) {
    return invalid_argument(std::to_string(bytes.size() - expected) + " unexpected bytes after the end of the bundle");
  }

  const size_t checksum_at = kHeaderSize + static_cast<size_t>(h.payload_size);
  const std::string_view checksum = bytes.substr(checksum_at, kChecksumSize);
  auto actual = sha256(bytes.substr(0, checksum_at));
  if (std::memcmp(actual.data(), checksum.data(), kChecksumSize) != 0) {
    return invalid_argument("payload checksum mismatch (file corrupted or truncated)");
  }
  f.payload = bytes.substr(kHeaderSize, static_cast<size_t>(h.payload_size));

  if (!is_signed) {
    if (options.trusted_key) {
      return invalid_argument("unsigned bundle, but a trusted key was given (" + options.trusted_key->fingerprint() + ")");
    }
    return f;
  }
  const std::string_view block = bytes.substr(checksum_at + kChecksumSize);
  PublicKey signer;
  std::memcpy(signer.bytes.data(), block.data(), signer.bytes.size());
  if (options.trusted_key && !(*options.trusted_key == signer)) {
    return invalid_argument("signed by key " + signer.fingerprint() + " but the trusted key is " +
                            options.trusted_key->fingerprint());
  }
  std::string message(bytes.substr(0, kHeaderSize));
  message.append(checksum);
  const auto* sig = reinterpret_cast<const unsigned char*>(block.data() + crypto_sign_PUBLICKEYBYTES);
  if (crypto_sign_verify_detached(sig, reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                                  signer.bytes.data()) != 0) {
    return invalid_argument("signature by key " + signer.fingerprint() +
                            " does not verify (file corrupted or tampered with)");
  }
  f.signer = signer;
  return f;
}

StatusOr<std::vector<BundleEntry>> read_payload(const Framed& f, const BundleLimits& limits) {
  // The decompressed text is freed as soon as msgpack holds its own copy, so the peak is about
  // twice the payload, not three times.
  msgpack::object_handle oh;
  {
    StatusOr<std::string> raw = decompress_exact(f.payload, f.header.content_size);
    if (!raw.ok()) return raw.status();
    codec::Limits lim;
    lim.max_bytes = static_cast<size_t>(limits.max_payload_bytes);
    lim.max_array = std::max(limits.max_entries, std::max<size_t>(limits.max_blobs_per_entry, 3));
    lim.max_map = 0;
    lim.max_str = kMaxBlobName;
    lim.max_bin = static_cast<size_t>(std::max(limits.max_blob_bytes, limits.max_manifest_bytes));
    lim.max_depth = 4;
    StatusOr<msgpack::object_handle> parsed = codec::parse(*raw, lim);
    if (!parsed.ok()) return Status(parsed.status().code(), "payload: " + parsed.status().message());
    oh = std::move(parsed).value();
  }
  codec::Reader root(oh.get(), "payload");
  KFORGE_ASSIGN_OR_RETURN(size_t n, root.array_size());
  if (n != f.header.entry_count) {
    return invalid_argument("payload has " + std::to_string(n) + " entries, but the header declares " +
                            std::to_string(f.header.entry_count));
  }
  std::set<EntryKey> seen;
  std::vector<BundleEntry> entries;
  entries.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    KFORGE_ASSIGN_OR_RETURN(BundleEntry e, read_entry(root.at(i), i, limits));
    if (!seen.insert(e.entry.key).second) {
      return invalid_argument(entry_label(i, e.entry.key) + ": the bundle carries this key twice");
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

StatusOr<ParsedBundle> parse_bundle_impl(std::string_view bytes, const ImportOptions& options) {
  if (options.require_signature && !options.trusted_key) {
    return invalid_argument("a signature is required but no trusted key was given (any key can sign a bundle)");
  }
  KFORGE_RETURN_IF_ERROR(ensure_sodium());
  KFORGE_ASSIGN_OR_RETURN(Framed framed, check_framing(bytes, options));
  ParsedBundle out;
  out.signer = framed.signer;
  KFORGE_ASSIGN_OR_RETURN(out.entries, read_payload(framed, options.limits));
  return out;
}

Status with_bundle_name(std::string_view name, const Status& s) {
  return Status(s.code(), "bundle " + std::string(name) + ": " + s.message());
}

}  // namespace

using namespace bundle_detail;

// ---- export / import ----------------------------------------------------------------------------

StatusOr<ParsedBundle> parse_bundle_bytes(std::string_view bytes, std::string_view name, const ImportOptions& options) {
  StatusOr<ParsedBundle> r = no_throw("import", [&] { return parse_bundle_impl(bytes, options); });
  if (!r.ok()) return with_bundle_name(name, r.status());
  return r;
}

StatusOr<ExportReport> export_bundle(const Store& store, const std::vector<EntryKey>& keys, const std::string& path,
                                     const SigningKey* signing_key) {
  auto run = [&]() -> StatusOr<ExportReport> {
    KFORGE_RETURN_IF_ERROR(ensure_sodium());
    const BundleLimits limits;
    std::vector<EntryKey> selected;
    if (keys.empty()) {
      KFORGE_ASSIGN_OR_RETURN(selected, store.list());
      // A directory scan's order is arbitrary; sorted keys make equal caches give equal bundles.
      std::sort(selected.begin(), selected.end());
    } else {
      std::set<EntryKey> seen;
      for (const EntryKey& k : keys) {
        if (seen.insert(k).second) selected.push_back(k);
      }
    }
    if (selected.size() > limits.max_entries) {
      return out_of_range(std::to_string(selected.size()) + " entries, more than a bundle may carry (" +
                          std::to_string(limits.max_entries) + ")");
    }

    msgpack::sbuffer buf;
    codec::Packer pk(buf);
    pk.pack_array(static_cast<uint32_t>(selected.size()));
    for (const EntryKey& key : selected) {
      const std::string label = "entry " + key.hex();
      StatusOr<std::string> manifest = store.read_manifest_bytes(key);
      if (!manifest.ok()) return Status(manifest.status().code(), label + ": " + manifest.status().message());
      StatusOr<StoredEntry> entry = Store::parse_manifest(*manifest);
      if (!entry.ok()) return Status(entry.status().code(), label + ": " + entry.status().message());
      if (manifest->size() > limits.max_manifest_bytes || entry->blobs.size() > limits.max_blobs_per_entry) {
        return out_of_range(label + ": manifest or blob count exceeds what a bundle may carry");
      }
      pk.pack_array(2);
      pk.pack_bin(static_cast<uint32_t>(manifest->size()));
      pk.pack_bin_body(manifest->data(), static_cast<uint32_t>(manifest->size()));
      pk.pack_array(static_cast<uint32_t>(entry->blobs.size()));
      for (const BlobRef& ref : entry->blobs) {
        StatusOr<std::string> bytes = store.read_blob(ref);   // hash-checked: never export a bad blob
        if (!bytes.ok()) {
          return Status(bytes.status().code(), label + ": blob '" + ref.name + "': " + bytes.status().message());
        }
        if (bytes->size() > limits.max_blob_bytes || ref.name.size() > kMaxBlobName) {
          return out_of_range(label + ": blob '" + ref.name + "' exceeds what a bundle may carry");
        }
        std::string digest;
        if (ref.sha256_hex.size() != 64) return internal_error(label + ": blob '" + ref.name + "' has a malformed hash");
        digest.resize(32);
        size_t bin_len = 0;
        if (sodium_hex2bin(reinterpret_cast<unsigned char*>(digest.data()), 32, ref.sha256_hex.data(), 64, nullptr,
                           &bin_len, nullptr) != 0 || bin_len != 32) {
          return internal_error(label + ": blob '" + ref.name + "' has a malformed hash");
        }
        pk.pack_array(3);
        pk.pack_str(static_cast<uint32_t>(ref.name.size()));
        pk.pack_str_body(ref.name.data(), static_cast<uint32_t>(ref.name.size()));
        pk.pack_bin(32);
        pk.pack_bin_body(digest.data(), 32);
        pk.pack_bin(static_cast<uint32_t>(bytes->size()));
        pk.pack_bin_body(bytes->data(), static_cast<uint32_t>(bytes->size()));
      }
      if (buf.size() > limits.max_payload_bytes) {
        return out_of_range("the entries exceed the bundle payload limit of " + std::to_string(limits.max_payload_bytes) +
                            " bytes; export fewer entries per bundle");
      }
    }

    Header h;
    h.version = kBundleVersion;
    h.flags = signing_key != nullptr ? kFlagSigned : 0;
    h.content_size = buf.size();
    h.entry_count = static_cast<uint32_t>(selected.size());
    KFORGE_ASSIGN_OR_RETURN(std::string payload, compress(std::string_view(buf.data(), buf.size())));
    buf.clear();
    h.payload_size = payload.size();

    std::string file = encode_header(h);
    file.reserve(kHeaderSize + payload.size() + kChecksumSize + kSignatureBlockSize);
    file.append(payload);
    payload = std::string();
    auto checksum = sha256(file);
    file.append(reinterpret_cast<const char*>(checksum.data()), checksum.size());
    if (signing_key != nullptr) {
      std::string message = file.substr(0, kHeaderSize);
      message.append(reinterpret_cast<const char*>(checksum.data()), checksum.size());
      std::array<uint8_t, crypto_sign_BYTES> sig{};
      crypto_sign_detached(sig.data(), nullptr, reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                           signing_key->secret.data());
      file.append(reinterpret_cast<const char*>(signing_key->public_key.bytes.data()), crypto_sign_PUBLICKEYBYTES);
      file.append(reinterpret_cast<const char*>(sig.data()), sig.size());
    }
    KFORGE_RETURN_IF_ERROR(write_file_atomically(path, file, 0644, /*exact_mode=*/false, Placement::kReplace));
    ExportReport report;
    report.entries = selected.size();
    report.file_bytes = file.size();
    report.signed_bundle = signing_key != nullptr;
    return report;
  };
  StatusOr<ExportReport> r = no_throw("export", run);
  if (!r.ok()) return Status(r.status().code(), "export to " + path + ": " + r.status().message());
  return r;
}

StatusOr<ImportReport> import_bundle(Store& store, const std::string& path, const ImportOptions& options) {
  StatusOr<ParsedBundle> parsed = no_throw("import", [&]() -> StatusOr<ParsedBundle> {
    const uint64_t max_file = max_compressed_size(options.limits) + kHeaderSize + kChecksumSize + kSignatureBlockSize;
    StatusOr<FileBytes> file = read_file_bounded(path, max_file, false, "bundle");
    if (!file.ok()) return file.status();
    return parse_bundle_bytes(file->bytes, path, options);
  });
  if (!parsed.ok()) return parsed.status();

  // Every check passed; only now does the target cache change.
  return no_throw("bundle " + path, [&]() -> StatusOr<ImportReport> {
    ImportReport report;
    if (parsed->signer) {
      report.signature_checked = options.trusted_key.has_value();   // parse refused any other signer
      report.signer_fingerprint = parsed->signer->fingerprint();
    }
    for (BundleEntry& e : parsed->entries) {
      StatusOr<std::string> existing = store.read_manifest_bytes(e.entry.key);
      if (existing.ok() && *existing == e.manifest) {
        // Same manifest: skip it unless one of its blobs is missing or damaged here, in which case
        // republishing repairs the entry.
        bool intact = std::all_of(e.entry.blobs.begin(), e.entry.blobs.end(),
                                  [&](const BlobRef& ref) { return store.read_blob(ref).ok(); });
        if (intact) {
          ++report.entries_identical;
          continue;
        }
      }
      StatusOr<EntryKey> key = store.publish_manifest_bytes(e.manifest, e.blobs);
      if (!key.ok()) {
        return Status(key.status().code(), "bundle " + path + ": publishing entry " + e.entry.key.hex() + " failed after " +
                                               std::to_string(report.entries_imported) +
                                               " entries were imported: " + key.status().message());
      }
      ++report.entries_imported;
    }
    return report;
  });
}

}  // namespace kforge

#include "cache/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include <flatbuffers/flatbuffers.h>

#include "cache/cache_dir.h"
#include "cache/manifest_generated.h"
#include "runtime/msgpack_codec.h"
#include "runtime/unique_fd.h"

// Note [Cache layout]
// ~~~~~~~~~~~~~~~~~~~
// Files under the root (store.h lists them) and the rules that make the store safe without locks:
//
// * Every file is written under tmp/ with a unique name (kind.pid.random), fsynced when
//   options.durable, and only then given its final name by rename (or link, where an existing
//   file must win). A writer killed at any point leaves only tmp/ files, unreferenced blobs and
//   the side files of an entry whose manifest never appeared (below). Nothing waits for anyone.
//
// * Checksummed frame. Manifests and state files start with a 56-byte header:
//     magic[8] | format version u32 | reserved u32 (0) | payload length u64 | SHA-256(payload)
//   (integers little-endian), followed by the payload: the FlatBuffer of cache/manifest.fbs, or the
//   msgpack state record. A flipped bit anywhere, in the header or the payload, and any truncation
//   or appended byte, fail the frame check before a parser sees the payload. The FlatBuffers
//   verifier then checks the structure, the canonical decoders check the signature, environment
//   and kernel spec, and the key recomputed from the signature and environment must equal the key
//   in the file name (so a manifest copied to another name is refused as well).
//
// * Publish order: blobs, state file (only if absent), use record (only if absent), manifest. The
//   manifest's rename is the moment the entry exists; everything it refers to is already in place
//   (and durable) by then, so a reader that sees a manifest sees a whole entry. Republishing
//   renames a new manifest over the old one: readers get the old or the new file, never a mix.
//
// * State file: created "active" at publish (unless one exists: a quarantined key stays
//   quarantined), replaced by rename on every change. Because every entry has one, a missing or
//   unreadable state file is detected, and it makes the entry disabled: deleting or corrupting a
//   quarantine record must never bring a bad kernel back. It carries the key it belongs to.
//
// * Use record used/<k0k1>/<key>: an empty file whose mtime is the last use; created at publish
//   with mtime 0 ("never used"), moved forward by touch() with one utimensat. Losing it only
//   loses LRU information, but verify_all reports it.
//
// * Removal unlinks the manifest first (the entry disappears at once), then the state file and
//   the use record. State and use records without a manifest ("orphans": an interrupted publish
//   or removal, or a deleted manifest) are not entries. Like tmp/ files they may belong to a
//   writer in progress, so both verify_all and gc leave them alone until they are older than
//   gc_grace_ms; then verify_all reports them (as a missing manifest) and gc deletes them. The
//   same grace protects unreferenced blobs: a publisher touches an existing blob before it
//   renames a manifest that refers to it, so gc never deletes a blob a concurrent publish is about
//   to use (except in the instant between gc's stat and unlink of a blob unused for the whole
//   grace period). Fan-out directories are never removed, so a publisher's mkdir can never lose
//   a race against a cleaner.

namespace kforge {

struct StoreShared {
  // Set once at open when VERSION is missing or corrupt in a cache that has entries; every
  // operation except verify_all then fails with it.
  Status version_error;
  std::mutex mu;
  std::set<EntryKey> reported;                        // guarded by mu
  std::function<void(const CacheProblem&)> callback;  // guarded by mu; empty = stderr
};

namespace {

constexpr std::string_view kVersionText = "kforge-cache 1\n";
constexpr std::string_view kVersionPrefix = "kforge-cache ";
constexpr uint32_t kManifestFormatVersion = 1;
constexpr uint32_t kStateFormatVersion = 1;
constexpr size_t kFrameHeaderBytes = 56;
static_assert(kFrameHeaderBytes % 8 == 0, "the payload must stay 8-byte aligned for FlatBuffers");
constexpr std::string_view kManifestMagic{"kforgeMF", 8};
constexpr std::string_view kStateMagic{"kforgeST", 8};
constexpr size_t kMaxManifestPayload = 16u << 20;  // a kernel's source alone may be 1 MiB
constexpr size_t kMaxStatePayload = 16u << 10;
constexpr size_t kMaxReasonBytes = 4096;
constexpr uint64_t kMaxBlobBytes = uint64_t{1} << 32;
constexpr size_t kMaxBlobs = 64;
constexpr size_t kMaxBlobNameBytes = 64;
constexpr size_t kMinPrefixDigits = 4;
constexpr size_t kSha256Bytes = crypto_hash_sha256_BYTES;
constexpr std::string_view kManifestSuffix = ".kfm";
constexpr std::string_view kStateSuffix = ".state";

// ---- small helpers -------------------------------------------------------------------------------

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ms_of(const struct timespec& t) { return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1000000; }

// When a file was last written (or touched, for blobs): the age that the grace period measures.
// Use records keep the last use in their mtime (0 = never), so for them it is the ctime, which
// creation and utimensat set. Not the ctime of the others: a state file is installed by link(),
// and unlinking a second link left by a killed writer would make the survivor look new.
int64_t written_ms(const struct stat& st, bool use_record = false) {
  return use_record ? ms_of(st.st_ctim) : ms_of(st.st_mtim);
}

std::string hex_of(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string sha256_hex(std::string_view bytes) {
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return hex_of(h.data(), h.size());
}

// Printable excerpt of untrusted bytes for an error message.
std::string excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

Status io_error(std::string_view what, const std::string& path, int err) {
  return unavailable(std::string(what) + " " + path + ": " + std::strerror(err));
}

Status corrupt(const std::string& kind_and_path, std::string_view what) {
  return invalid_argument(kind_and_path + ": " + std::string(what));
}

// Runs a public operation so that nothing throws out of the store (std::bad_alloc from a builder
// or a container is the realistic case).
template <typename F>
auto guarded(std::string_view op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return internal_error("cache " + std::string(op) + ": " + e.what());
  } catch (...) {
    return internal_error("cache " + std::string(op) + ": unknown exception");
  }
}


struct DirCloser {
  void operator()(DIR* d) const noexcept { ::closedir(d); }
};

// Unlinks a temporary file unless it was installed (or handed over).
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)) {}
  TmpFile(TmpFile&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  TmpFile& operator=(TmpFile&&) = delete;
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;
  ~TmpFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const noexcept { return path_; }
  void release() noexcept { path_.clear(); }

 private:
  std::string path_;
};

Status fsync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return io_error("cannot open directory", dir, errno);
  if (::fsync(fd.get()) != 0) return io_error("cannot fsync directory", dir, errno);
  return Status();
}

std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

// mkdir that tolerates an existing directory; a new directory's entry is made durable too, or a
// crash could lose every file renamed into it.
Status ensure_dir(const std::string& dir, bool durable) {
  if (::mkdir(dir.c_str(), 0700) == 0) return durable ? fsync_dir(parent_of(dir)) : Status();
  if (errno != EEXIST) return io_error("cannot create directory", dir, errno);
  return Status();
}

// Names in a directory (no "." or ".."), sorted. A missing directory is empty (verify_all
// reports a missing layout directory separately).
StatusOr<std::vector<std::string>> list_names(const std::string& dir) {
  std::unique_ptr<DIR, DirCloser> d(::opendir(dir.c_str()));
  if (!d) {
    if (errno == ENOENT) return std::vector<std::string>{};
    return io_error("cannot list directory", dir, errno);
  }
  std::vector<std::string> names;
  errno = 0;
  while (const struct dirent* e = ::readdir(d.get())) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  if (errno != 0) return io_error("cannot list directory", dir, errno);
  std::sort(names.begin(), names.end());
  return names;
}

// Reads a whole regular file of at most max_bytes. Symbolic links are refused (O_NOFOLLOW): the
// cache holds code that runs in users' processes. not_found when the file does not exist.
StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return not_found(path + ": missing");
    if (errno == ELOOP) return invalid_argument(path + ": is a symbolic link");
    return io_error("cannot open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return invalid_argument(path + ": " + std::to_string(size) + " bytes, over the limit of " +
                            std::to_string(max_bytes));
  }
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read", path, errno);
    if (n == 0) break;  // shrank while we read: the frame check reports the truncation
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot write", path, errno);
    done += static_cast<size_t>(n);
  }
  return Status();
}

// ---- the layout ------------------------------------------------------------------------------------

struct Layout {
  const std::string& root;
  bool durable;

  std::string tmp_dir() const { return root + "/tmp"; }
  std::string manifest_dir(const std::string& hex) const { return root + "/manifests/" + hex.substr(0, 2); }
  std::string manifest(const EntryKey& k) const {
    std::string h = k.hex();
    return manifest_dir(h) + "/" + h + std::string(kManifestSuffix);
  }
  std::string state_dir(const std::string& hex) const { return root + "/state/" + hex.substr(0, 2); }
  std::string state(const EntryKey& k) const {
    std::string h = k.hex();
    return state_dir(h) + "/" + h + std::string(kStateSuffix);
  }
  std::string used_dir(const std::string& hex) const { return root + "/used/" + hex.substr(0, 2); }
  std::string used(const EntryKey& k) const {
    std::string h = k.hex();
    return used_dir(h) + "/" + h;
  }
  std::string trial_dir() const { return root + "/trial"; }
  std::string trial(const EntryKey& k) const { return trial_dir() + "/" + k.hex(); }
  std::string blob_dir(const std::string& sha) const { return root + "/blobs/" + sha.substr(0, 2); }
  std::string blob(const std::string& sha) const { return blob_dir(sha) + "/" + sha; }

  // A new file under tmp/ holding `bytes`, fsynced when durable. The name is unique across
  // processes (pid) and within one (random), so no writer ever opens another's file.
  StatusOr<TmpFile> write_tmp(std::string_view kind, std::string_view bytes) const {
    uint8_t rnd[8];
    randombytes_buf(rnd, sizeof rnd);
    const std::string path =
        tmp_dir() + "/" + std::string(kind) + "." + std::to_string(::getpid()) + "." + hex_of(rnd, sizeof rnd);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    UniqueFd fd(::open(path.c_str(), flags, 0600));
    if (!fd.valid() && errno == ENOENT) {  // tmp/ itself was removed: put it back
      KFORGE_RETURN_IF_ERROR(ensure_dir(tmp_dir(), durable));
      fd = UniqueFd(::open(path.c_str(), flags, 0600));
    }
    if (!fd.valid()) return io_error("cannot create", path, errno);
    TmpFile tmp(path);
    KFORGE_RETURN_IF_ERROR(write_all(fd.get(), bytes, path));
    if (durable && ::fsync(fd.get()) != 0) return io_error("cannot fsync", path, errno);
    return tmp;
  }

  // Gives a tmp file its final name, replacing what is there.
  Status install_replace(TmpFile& tmp, const std::string& final_path) const {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(final_path), durable));
    if (::rename(tmp.path().c_str(), final_path.c_str()) != 0) return io_error("cannot rename into", final_path, errno);
    tmp.release();
    return durable ? fsync_dir(parent_of(final_path)) : Status();
  }

  // Gives a tmp file its final name unless a file already has it (link fails on an existing name,
  // rename would not). Returns whether it was installed.
  StatusOr<bool> install_if_absent(TmpFile& tmp, const std::string& final_path) const {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(final_path), durable));
    if (::link(tmp.path().c_str(), final_path.c_str()) != 0) {
      if (errno == EEXIST) return false;
      return io_error("cannot link into", final_path, errno);
    }
    if (durable) KFORGE_RETURN_IF_ERROR(fsync_dir(parent_of(final_path)));
    return true;  // ~TmpFile unlinks the tmp name
  }
};

// "<32 hex>.kfm" in the fan-out directory of its first two digits -> key.
std::optional<EntryKey> key_from_name(std::string_view dir, std::string_view name, std::string_view suffix) {
  if (name.size() != 32 + suffix.size() || name.substr(32) != suffix) return std::nullopt;
  std::string_view hex = name.substr(0, 32);
  if (!is_lower_hex(hex) || hex.substr(0, 2) != dir) return std::nullopt;
  auto k = SignatureId::from_hex(hex);
  if (!k.ok()) return std::nullopt;
  return *k;
}

bool is_fanout_name(std::string_view name) { return name.size() == 2 && is_lower_hex(name); }

struct FanoutFile {
  std::string dir;  // the two-digit directory
  std::string name;
  std::string path;
};

// Every file two levels under `base` (base/<xx>/<name>). First-level names that are not fan-out
// directories are appended to *strays.
StatusOr<std::vector<FanoutFile>> scan_fanout(const std::string& base, std::vector<std::string>* strays) {
  KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> dirs, list_names(base));
  std::vector<FanoutFile> files;
  for (const std::string& d : dirs) {
    const std::string dir_path = base + "/" + d;
    struct stat st {};
    if (!is_fanout_name(d) || ::lstat(dir_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      if (strays != nullptr) strays->push_back(dir_path);
      continue;
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(dir_path));
    for (std::string& n : names) files.push_back({d, n, dir_path + "/" + n});
  }
  return files;
}

// ---- the checksummed frame (Note [Cache layout]) ----------------------------------------------------

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_le(std::string_view b, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(b[off + i])} << (8 * i);
  return v;
}

std::string frame(std::string_view magic, uint32_t version, std::string_view payload) {
  std::string out;
  out.reserve(kFrameHeaderBytes + payload.size());
  out += magic;
  put_u32(out, version);
  put_u32(out, 0);
  put_u64(out, payload.size());
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  out.append(reinterpret_cast<const char*>(h.data()), h.size());
  out += payload;
  return out;
}

// The payload of a framed file, or what is wrong with it (without the file's name: callers add it).
StatusOr<std::string_view> unframe(std::string_view file, std::string_view magic, uint32_t version,
                                   size_t max_payload) {
  if (file.size() < kFrameHeaderBytes) {
    return invalid_argument("truncated (" + std::to_string(file.size()) + " bytes, shorter than the " +
                            std::to_string(kFrameHeaderBytes) + "-byte header)");
  }
  if (file.substr(0, 8) != magic) return invalid_argument("bad magic '" + excerpt(file.substr(0, 8)) + "'");
  const auto v = static_cast<uint32_t>(get_le(file, 8, 4));
  if (v != version) {
    return invalid_argument("format version " + std::to_string(v) + ", this kforge reads " + std::to_string(version));
  }
  if (get_le(file, 12, 4) != 0) return invalid_argument("reserved header field is not zero");
  const uint64_t len = get_le(file, 16, 8);
  if (len > max_payload) {
    return invalid_argument("payload length " + std::to_string(len) + " over the limit of " +
                            std::to_string(max_payload));
  }
  const uint64_t expected = kFrameHeaderBytes + len;
  if (file.size() < expected) {
    return invalid_argument("truncated (" + std::to_string(file.size()) + " of " + std::to_string(expected) +
                            " bytes)");
  }
  if (file.size() > expected) {
    return invalid_argument(std::to_string(file.size() - expected) + " unexpected bytes after the " +
                            std::to_string(expected) + "-byte record");
  }
  std::string_view payload = file.substr(kFrameHeaderBytes);
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  if (std::memcmp(h.data(), file.data() + 24, kSha256Bytes) != 0) {
    return invalid_argument("checksum mismatch (SHA-256 of the content differs from the header's)");
  }
  return payload;
}

// ---- manifests ----------------------------------------------------------------------------------------

Status check_blob_ref(const std::string& field, std::string_view name, std::string_view sha, uint64_t size) {
  if (name.empty() || name.size() > kMaxBlobNameBytes) {
    return invalid_argument(field + ".name: must be 1 to " + std::to_string(kMaxBlobNameBytes) + " bytes");
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.')) {
      return invalid_argument(field + ".name: '" + excerpt(name) + "' has characters outside [A-Za-z0-9_.-]");
    }
  }
  // The hash becomes a path under blobs/: anything but 64 lowercase hex digits is refused.
  if (sha.size() != 64 || !is_lower_hex(sha)) {
    return invalid_argument(field + ".sha256: '" + excerpt(sha) + "' is not 64 lowercase hex digits");
  }
  if (size > kMaxBlobBytes) {
    return invalid_argument(field + ".size: " + std::to_string(size) + " over the limit of " +
                            std::to_string(kMaxBlobBytes));
  }
  return Status();
}

std::string encode_manifest(const CacheEntry& e, const std::vector<BlobRef>& refs) {
  flatbuffers::FlatBufferBuilder b(1024 + e.spec.source.size());
  const std::string sig = e.signature.encode();
  const std::string env = e.environment.encode();
  const std::string spec = e.spec.encode();
  auto bytes = [&](const std::string& s) {
    return b.CreateVector(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  auto sig_off = bytes(sig);
  auto env_off = bytes(env);
  auto spec_off = bytes(spec);
  std::vector<flatbuffers::Offset<fb::BlobRef>> blob_offs;
  for (const BlobRef& r : refs) {
    auto name = b.CreateString(r.name);
    auto sha = b.CreateString(r.sha256_hex);
    blob_offs.push_back(fb::CreateBlobRef(b, name, sha, r.size));
  }
  auto blobs = b.CreateVector(blob_offs);
  const VerificationReport& v = e.verification;
  auto ver = fb::CreateVerificationReport(b, v.trials, v.max_abs_error, v.rel_error, v.torch_max_abs_error,
                                          v.torch_rel_error, v.passed, b.CreateString(v.details));
  const Timings& t = e.timings;
  auto tim = fb::CreateTimings(b, t.baseline_ns, t.candidate_ns, t.spread, t.runs);
  const Provenance& p = e.provenance;
  auto prov = fb::CreateProvenance(b, b.CreateString(p.proposer), b.CreateString(p.search_id),
                                   b.CreateString(p.kforge_version), p.created_unix_ms, b.CreateString(p.host));
  b.Finish(fb::CreateManifest(b, kManifestFormatVersion, sig_off, env_off, spec_off, blobs, ver, tim, prov),
           fb::ManifestIdentifier());
  return frame(kManifestMagic, kManifestFormatVersion,
               std::string_view(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize()));
}

std::string_view view(const flatbuffers::Vector<uint8_t>* v) {
  return {reinterpret_cast<const char*>(v->data()), v->size()};
}
std::string str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

// Everything but the status; errors name the part that is wrong, not the file.
StatusOr<StoredEntry> parse_manifest_impl(std::string_view file) {
  KFORGE_ASSIGN_OR_RETURN(std::string_view payload,
                          unframe(file, kManifestMagic, kManifestFormatVersion, kMaxManifestPayload));
  // FlatBuffers reads scalars in place, so the buffer must be 8-byte aligned whatever the caller's.
  std::vector<uint64_t> aligned((payload.size() + 7) / 8);
  std::memcpy(aligned.data(), payload.data(), payload.size());
  const auto* buf = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 8;
  opts.max_tables = 4 * kMaxBlobs + 16;
  flatbuffers::Verifier verifier(buf, payload.size(), opts);
  if (!fb::VerifyManifestBuffer(verifier)) return invalid_argument("FlatBuffers verifier rejected the manifest");
  const fb::Manifest* m = fb::GetManifest(buf);
  if (m->format_version() != kManifestFormatVersion) {
    return invalid_argument("manifest format version " + std::to_string(m->format_version()) + ", expected " +
                            std::to_string(kManifestFormatVersion));
  }
  StoredEntry e;
  auto sig = OpSignature::decode(view(m->signature()));
  if (!sig.ok()) return invalid_argument("signature: " + sig.status().message());
  e.signature = std::move(sig).value();
  auto env = Environment::decode(view(m->environment()));
  if (!env.ok()) return invalid_argument("environment: " + env.status().message());
  e.environment = std::move(env).value();
  auto spec = KernelSpec::decode(view(m->kernel_spec()));
  if (!spec.ok()) return invalid_argument("kernel spec: " + spec.status().message());
  e.spec = std::move(spec).value();
  if (m->blobs() != nullptr) {
    if (m->blobs()->size() > kMaxBlobs) {
      return invalid_argument(std::to_string(m->blobs()->size()) + " blobs, over the limit of " +
                              std::to_string(kMaxBlobs));
    }
    for (flatbuffers::uoffset_t i = 0; i < m->blobs()->size(); ++i) {
      const fb::BlobRef* r = m->blobs()->Get(i);
      BlobRef ref{r->name()->str(), r->sha256()->str(), r->size()};
      const std::string field = "blobs[" + std::to_string(i) + "]";
      KFORGE_RETURN_IF_ERROR(check_blob_ref(field, ref.name, ref.sha256_hex, ref.size));
      for (const BlobRef& prev : e.blobs) {
        if (prev.name == ref.name) return invalid_argument(field + ".name: duplicate name '" + ref.name + "'");
      }
      e.blobs.push_back(std::move(ref));
    }
  }
  const fb::VerificationReport* v = m->verification();
  e.verification = {v->trials(),          v->max_abs_error(), v->rel_error(),   v->torch_max_abs_error(),
                    v->torch_rel_error(), v->passed(),        str(v->details())};
  const fb::Timings* t = m->timings();
  e.timings = {t->baseline_ns(), t->candidate_ns(), t->spread(), t->runs()};
  const fb::Provenance* p = m->provenance();
  e.provenance = {str(p->proposer()), str(p->search_id()), str(p->kforge_version()), p->created_unix_ms(),
                  str(p->host())};
  e.key = entry_key(e.signature, e.environment);
  e.manifest_bytes = file.size();
  return e;
}

// ---- state files -----------------------------------------------------------------------------------

std::string encode_state(const EntryKey& key, const EntryStatus& s) {
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  pk.pack_array(6);
  pk.pack_uint32(kStateFormatVersion);
  pk.pack(key.hex());
  pk.pack_uint8(static_cast<uint8_t>(s.state));
  pk.pack(s.reason);
  pk.pack_int64(s.changed_unix_ms);
  s.pinned ? pk.pack_true() : pk.pack_false();
  return frame(kStateMagic, kStateFormatVersion, std::string_view(buf.data(), buf.size()));
}

StatusOr<EntryStatus> decode_state(std::string_view file, const EntryKey& key) {
  KFORGE_ASSIGN_OR_RETURN(std::string_view payload, unframe(file, kStateMagic, kStateFormatVersion, kMaxStatePayload));
  codec::Limits limits;
  limits.max_bytes = kMaxStatePayload;
  limits.max_str = kMaxReasonBytes;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(payload, limits));
  codec::Reader r(oh.get(), "state");
  KFORGE_RETURN_IF_ERROR(r.expect_array(6));
  KFORGE_ASSIGN_OR_RETURN(int64_t version, r.field(0, "version").i64());
  if (version != kStateFormatVersion) {
    return r.field(0, "version").error("unsupported version " + std::to_string(version));
  }
  KFORGE_ASSIGN_OR_RETURN(std::string owner, r.field(1, "key").str(32));
  if (owner != key.hex()) return r.field(1, "key").error("belongs to entry " + excerpt(owner));
  EntryStatus s;
  KFORGE_ASSIGN_OR_RETURN(int64_t state, r.field(2, "state").i64_in(0, 2));
  s.state = static_cast<EntryState>(state);
  KFORGE_ASSIGN_OR_RETURN(s.reason, r.field(3, "reason").str(kMaxReasonBytes));
  KFORGE_ASSIGN_OR_RETURN(s.changed_unix_ms, r.field(4, "changed_unix_ms").i64());
  KFORGE_ASSIGN_OR_RETURN(s.pinned, r.field(5, "pinned").boolean());
  return s;
}

// The status of an entry as its files say. Never fails: what cannot be read makes the entry
// disabled with a reason naming the file, so that corruption can only take a kernel out of use.
// *state_ok says whether the state file was read (gc keeps entries whose pin it cannot know).
EntryStatus read_status(const Layout& l, const EntryKey& key, bool* state_ok = nullptr) {
  EntryStatus s;
  const std::string path = l.state(key);
  auto bytes = read_file(path, kFrameHeaderBytes + kMaxStatePayload);
  StatusOr<EntryStatus> parsed = bytes.ok() ? decode_state(*bytes, key) : StatusOr<EntryStatus>(bytes.status());
  if (parsed.ok()) {
    s = std::move(parsed).value();
  } else {
    s.state = EntryState::kDisabled;
    s.reason = bytes.status().code() == StatusCode::kNotFound ? "state file " + path + " is missing"
               : bytes.ok() ? "state file " + path + " is corrupt: " + parsed.status().message()
                            : "state file unreadable: " + bytes.status().message();
  }
  if (state_ok != nullptr) *state_ok = parsed.ok();
  struct stat st {};
  if (::stat(l.used(key).c_str(), &st) == 0) {
    const int64_t t = ms_of(st.st_mtim);
    s.last_use_unix_ms = t > 0 ? t : 0;
  }
  return s;
}

Status write_state(const Layout& l, const EntryKey& key, const EntryStatus& s) {
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("state", encode_state(key, s)));
  return l.install_replace(tmp, l.state(key));
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Creates the entry's state file ("active") and use record ("never used") unless they exist.
Status ensure_side_files(const Layout& l, const EntryKey& key) {
  const std::string state_path = l.state(key);
  if (!exists(state_path)) {
    EntryStatus active;
    active.changed_unix_ms = now_ms();
    KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("state", encode_state(key, active)));
    KFORGE_ASSIGN_OR_RETURN(bool installed, l.install_if_absent(tmp, state_path));
    (void)installed;  // someone else's state file wins: it may be a quarantine
  }
  const std::string used_path = l.used(key);
  if (!exists(used_path)) {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(used_path), l.durable));
    UniqueFd fd(::open(used_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.valid()) {
      const struct timespec never[2] = {{0, 0}, {0, 0}};
      if (::futimens(fd.get(), never) != 0) return io_error("cannot set times of", used_path, errno);
      if (l.durable) KFORGE_RETURN_IF_ERROR(fsync_dir(parent_of(used_path)));
    } else if (errno != EEXIST) {
      return io_error("cannot create", used_path, errno);
    }
  }
  return Status();
}

// A blob to install: bytes when the caller has them; without bytes the blob must be in the cache.
struct BlobToInstall {
  BlobRef ref;
  std::optional<std::string_view> bytes;
};

Status install_blob(const Layout& l, const BlobToInstall& b) {
  const std::string path = l.blob(b.ref.sha256_hex);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == b.ref.size) {
    // Already there (content-addressed). Touch it: gc spares blobs younger than its grace period,
    // and the manifest that will refer to it is not visible yet.
    if (::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) return Status();
    if (errno != ENOENT) return io_error("cannot touch", path, errno);
    // gc removed it between the two calls: write it again below.
  }
  if (!b.bytes) return not_found("blob '" + b.ref.name + "' (" + path + ") is neither supplied nor in the cache");
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("blob", *b.bytes));
  return l.install_replace(tmp, path);  // replaces a blob of the wrong size or type
}

// Publishes a verified manifest (Note [Cache layout], "Publish order").
Status install_entry(const Layout& l, const EntryKey& key, std::string_view manifest,
                     const std::vector<BlobToInstall>& blobs) {
  for (const BlobToInstall& b : blobs) KFORGE_RETURN_IF_ERROR(install_blob(l, b));
  KFORGE_RETURN_IF_ERROR(ensure_side_files(l, key));
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("manifest", manifest));
  KFORGE_RETURN_IF_ERROR(l.install_replace(tmp, l.manifest(key)));
  // A concurrent remove() of the same key may have deleted the side files between our check and
  // the rename; the entry is ours now, so put them back (a missing state file would disable it).
  return ensure_side_files(l, key);
}

// A manifest file and what it holds, after every check of Note [Cache layout]; errors name the file.
struct VerifiedManifest {
  std::string bytes;
  StoredEntry entry;
};

StatusOr<VerifiedManifest> read_manifest(const Layout& l, const EntryKey& key) {
  const std::string path = l.manifest(key);
  auto bytes = read_file(path, kFrameHeaderBytes + kMaxManifestPayload);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return not_found("no cache entry " + key.hex());
    return Status(bytes.status().code(), "manifest " + bytes.status().message());
  }
  auto e = parse_manifest_impl(*bytes);
  if (!e.ok()) return corrupt("manifest " + path, e.status().message());
  if (e->key != key) {
    return corrupt("manifest " + path, "holds entry " + e->key.hex() + ", not the one its name says");
  }
  return VerifiedManifest{std::move(bytes).value(), std::move(e).value()};
}

StatusOr<StoredEntry> load_entry(const Layout& l, const EntryKey& key) {
  KFORGE_ASSIGN_OR_RETURN(VerifiedManifest m, read_manifest(l, key));
  m.entry.status = read_status(l, key);
  return std::move(m.entry);
}

Status remove_entry_files(const Layout& l, const EntryKey& key) {
  const std::string m = l.manifest(key);
  if (::unlink(m.c_str()) != 0) {
    if (errno == ENOENT) return not_found("no cache entry " + key.hex());
    return io_error("cannot remove", m, errno);
  }
  for (const std::string& p : {l.state(key), l.used(key)}) {
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return io_error("cannot remove", p, errno);
  }
  return l.durable ? fsync_dir(parent_of(m)) : Status();
}

Status require_entry(const Layout& l, const EntryKey& key) {
  if (exists(l.manifest(key))) return Status();
  return not_found("no cache entry " + key.hex());
}

// Streams a file through SHA-256 (blobs can be large; verify_all does not keep them in memory).
StatusOr<std::string> sha256_of_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return io_error("cannot open", path, errno);
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read", path, errno);
    if (n == 0) break;
    crypto_hash_sha256_update(&st, buf.data(), static_cast<unsigned long long>(n));
  }
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256_final(&st, h.data());
  return hex_of(h.data(), h.size());
}

// Checks VERSION, creating it in a cache that was never used. Returns an error for a cache of
// another format (open refuses it); a missing or damaged VERSION in a used cache goes to *damage
// instead, so that verify_all can still look at everything else.
Status check_version(const Layout& l, Status* damage) {
  const std::string path = l.root + "/VERSION";
  auto v = read_file(path, 256);
  if (!v.ok() && v.status().code() == StatusCode::kNotFound) {
    if (!exists(l.root + "/manifests")) {
      KFORGE_RETURN_IF_ERROR(ensure_dir(l.tmp_dir(), l.durable));
      KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("VERSION", kVersionText));
      return l.install_replace(tmp, path);
    }
    // VERSION is written before manifests/ is created, so manifests/ without VERSION means it was
    // lost, unless another process set the cache up between our two looks: look again.
    v = read_file(path, 256);
    if (!v.ok() && v.status().code() == StatusCode::kNotFound) {
      *damage = not_found("cache VERSION file " + path + " is missing, but the cache has a manifests/ directory");
      return Status();
    }
  }
  if (!v.ok()) {
    *damage = Status(v.status().code(), "cache VERSION file " + v.status().message());
    return Status();
  }
  const std::string_view text = *v;
  if (text == kVersionText) return Status();
  const std::string_view number = text.substr(std::min(text.size(), kVersionPrefix.size()));
  const bool well_formed = text.substr(0, kVersionPrefix.size()) == kVersionPrefix && number.size() >= 2 &&
                           number.back() == '\n' &&
                           std::all_of(number.begin(), number.end() - 1, [](char c) { return c >= '0' && c <= '9'; });
  const std::string_view expected = kVersionText.substr(0, kVersionText.size() - 1);
  if (well_formed) {
    return invalid_argument("cache " + l.root + " has format '" + std::string(text.substr(0, text.size() - 1)) + "' (" +
                            path + "); this kforge reads '" + std::string(expected) + "'");
  }
  *damage = invalid_argument("cache VERSION file " + path + " is corrupt: '" + excerpt(text) + "', expected '" +
                             std::string(expected) + "'");
  return Status();
}

void default_problem_report(const CacheProblem& p) {
  std::fprintf(stderr, "kforge: cache entry %s is unusable and treated as a miss: %s\n",
               p.key ? p.key->hex().c_str() : "?", p.what.c_str());
}

}  // namespace

// ---- Store ---------------------------------------------------------------------------------------------

StatusOr<Store> Store::open(const std::string& root, StoreOptions options) {
  return guarded("open", [&]() -> StatusOr<Store> {
    // sodium_init is idempotent and thread-safe; it only fails when no entropy source exists.
    if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
    KFORGE_ASSIGN_OR_RETURN(CacheDir dir, CacheDir::open(root));
    Store s;
    s.root_ = dir.path();
    s.options_ = options;
    s.shared_ = std::make_shared<StoreShared>();
    KFORGE_RETURN_IF_ERROR(check_version(Layout{s.root_, options.durable}, &s.shared_->version_error));
    if (s.shared_->version_error.ok()) {
      for (const char* sub : {"tmp", "manifests", "blobs", "state", "used"}) {
        KFORGE_RETURN_IF_ERROR(ensure_dir(s.root_ + "/" + sub, options.durable));
      }
    }
    return s;
  });
}

namespace {
Status opened(const std::shared_ptr<StoreShared>& shared) {
  if (!shared) return internal_error("use of a moved-from cache Store");
  return shared->version_error;
}
}  // namespace

StatusOr<EntryKey> Store::publish(const CacheEntry& entry) {
  return guarded("publish", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    if (entry.blobs.size() > kMaxBlobs) {
      return invalid_argument(std::to_string(entry.blobs.size()) + " blobs, over the limit of " +
                              std::to_string(kMaxBlobs));
    }
    std::vector<BlobRef> refs;
    std::vector<BlobToInstall> blobs;
    for (size_t i = 0; i < entry.blobs.size(); ++i) {
      const BlobData& b = entry.blobs[i];
      BlobRef ref{b.name, sha256_hex(b.bytes), b.bytes.size()};
      const std::string field = "blobs[" + std::to_string(i) + "]";
      KFORGE_RETURN_IF_ERROR(check_blob_ref(field, ref.name, ref.sha256_hex, ref.size));
      for (const BlobRef& prev : refs) {
        if (prev.name == ref.name) return invalid_argument(field + ".name: duplicate name '" + ref.name + "'");
      }
      refs.push_back(ref);
      blobs.push_back({ref, std::string_view(b.bytes)});
    }
    const std::string manifest = encode_manifest(entry, refs);
    // Publish only what load() will accept: this is where an invalid spec or an oversized entry is
    // refused, instead of becoming an entry nobody can read.
    auto parsed = parse_manifest_impl(manifest);
    if (!parsed.ok()) return invalid_argument("cannot publish the entry: " + parsed.status().message());
    KFORGE_RETURN_IF_ERROR(install_entry(Layout{root_, options_.durable}, parsed->key, manifest, blobs));
    return parsed->key;
  });
}

StatusOr<EntryKey> Store::publish_manifest_bytes(std::string_view manifest, const std::vector<BlobData>& blobs) {
  return guarded("publish_manifest_bytes", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    auto parsed = parse_manifest_impl(manifest);
    if (!parsed.ok()) return invalid_argument("manifest: " + parsed.status().message());
    std::vector<BlobToInstall> install;
    for (const BlobRef& ref : parsed->blobs) install.push_back({ref, std::nullopt});
    for (const BlobData& b : blobs) {
      auto it =
          std::find_if(install.begin(), install.end(), [&](const BlobToInstall& x) { return x.ref.name == b.name; });
      if (it == install.end()) return invalid_argument("blob '" + excerpt(b.name) + "' is not in the manifest");
      if (it->bytes) return invalid_argument("blob '" + b.name + "' supplied twice");
      if (b.bytes.size() != it->ref.size || sha256_hex(b.bytes) != it->ref.sha256_hex) {
        return invalid_argument("blob '" + b.name + "' does not match the manifest's size and SHA-256");
      }
      it->bytes = std::string_view(b.bytes);
    }
    KFORGE_RETURN_IF_ERROR(install_entry(Layout{root_, options_.durable}, parsed->key, manifest, install));
    return parsed->key;
  });
}

StatusOr<StoredEntry> Store::parse_manifest(std::string_view manifest) {
  return guarded("parse_manifest", [&]() -> StatusOr<StoredEntry> {
    if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
    return parse_manifest_impl(manifest);
  });
}

StatusOr<StoredEntry> Store::load(const EntryKey& key) const {
  return guarded("load", [&]() -> StatusOr<StoredEntry> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    return load_entry(Layout{root_, options_.durable}, key);
  });
}

StatusOr<std::optional<StoredEntry>> Store::lookup(const OpSignature& sig, const Environment& env) const {
  return guarded("lookup", [&]() -> StatusOr<std::optional<StoredEntry>> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const EntryKey key = entry_key(sig, env);
    auto e = load_entry(l, key);
    std::optional<CacheProblem> problem;
    if (e.ok()) {
      // The key is a 128-bit hash; comparing what the manifest holds makes a collision a miss.
      if (e->signature == sig && e->environment == env) return std::optional<StoredEntry>(std::move(e).value());
      problem = CacheProblem{l.manifest(key), "manifest holds another signature or environment with the same key", key};
    } else if (e.status().code() == StatusCode::kNotFound) {
      return std::optional<StoredEntry>();
    } else {
      problem = CacheProblem{l.manifest(key), e.status().message(), key};
    }
    std::function<void(const CacheProblem&)> cb;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->reported.insert(key).second) return std::optional<StoredEntry>();
      cb = shared_->callback;
    }
    if (cb) {
      cb(*problem);
    } else {
      default_problem_report(*problem);
    }
    return std::optional<StoredEntry>();
  });
}

StatusOr<std::string> Store::read_blob(const BlobRef& ref) const {
  return guarded("read_blob", [&]() -> StatusOr<std::string> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    KFORGE_RETURN_IF_ERROR(check_blob_ref("blob", ref.name, ref.sha256_hex, ref.size));
    const std::string path = Layout{root_, options_.durable}.blob(ref.sha256_hex);
    auto bytes = read_file(path, ref.size);  // a longer file fails here, before it is read
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return not_found("blob " + path + " is missing");
      return Status(bytes.status().code(), "blob " + bytes.status().message());
    }
    if (bytes->size() != ref.size) {
      return corrupt("blob " + path,
                     "truncated (" + std::to_string(bytes->size()) + " of " + std::to_string(ref.size) + " bytes)");
    }
    if (sha256_hex(*bytes) != ref.sha256_hex) return corrupt("blob " + path, "SHA-256 mismatch (content corrupt)");
    return bytes;
  });
}

StatusOr<std::vector<EntryKey>> Store::list() const {
  return guarded("list", [&]() -> StatusOr<std::vector<EntryKey>> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/manifests", nullptr));
    std::vector<EntryKey> keys;
    for (const FanoutFile& f : files) {
      if (auto k = key_from_name(f.dir, f.name, kManifestSuffix)) keys.push_back(*k);
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  });
}

StatusOr<EntryKey> Store::resolve_prefix(std::string_view hex_prefix) const {
  return guarded("resolve_prefix", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    std::string p(hex_prefix);
    for (char& c : p) {
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    }
    if (!is_lower_hex(p)) return invalid_argument("key prefix '" + excerpt(hex_prefix) + "' is not hexadecimal");
    if (p.size() < kMinPrefixDigits) {
      return invalid_argument("key prefix '" + p + "' is too short: give at least " + std::to_string(kMinPrefixDigits) +
                              " hex digits");
    }
    if (p.size() > 32) return invalid_argument("key prefix '" + excerpt(p) + "' is longer than a key (32 hex digits)");
    const std::string dir = Layout{root_, options_.durable}.manifest_dir(p);
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(dir));
    std::vector<EntryKey> matches;
    for (const std::string& n : names) {
      auto k = key_from_name(p.substr(0, 2), n, kManifestSuffix);
      if (k && n.compare(0, p.size(), p) == 0) matches.push_back(*k);
    }
    if (matches.empty()) return not_found("no cache entry matches '" + p + "'");
    if (matches.size() > 1) {
      std::string msg =
          "key prefix '" + p + "' is ambiguous; it matches " + std::to_string(matches.size()) + " entries:";
      for (size_t i = 0; i < matches.size() && i < 16; ++i) msg += " " + matches[i].hex();
      if (matches.size() > 16) msg += " ...";
      return invalid_argument(msg);
    }
    return matches[0];
  });
}

Status Store::remove(const EntryKey& key) {
  return guarded("remove", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    return remove_entry_files(Layout{root_, options_.durable}, key);
  });
}

Status Store::set_state(const EntryKey& key, EntryState state, std::string reason) {
  return guarded("set_state", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    if (static_cast<uint8_t>(state) > 2) return invalid_argument("unknown entry state");
    if (reason.size() > kMaxReasonBytes) {
      return invalid_argument("reason is " + std::to_string(reason.size()) + " bytes, over the limit of " +
                              std::to_string(kMaxReasonBytes));
    }
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    EntryStatus s = read_status(l, key);  // keeps the pin (unknown, i.e. off, if unreadable)
    s.state = state;
    s.reason = state == EntryState::kActive ? std::string() : std::move(reason);
    s.changed_unix_ms = now_ms();
    return write_state(l, key, s);
  });
}

Status Store::set_pinned(const EntryKey& key, bool pinned) {
  return guarded("set_pinned", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    // An unreadable state file reads as disabled with a reason; writing that back keeps the entry
    // disabled, so pinning never re-enables anything.
    EntryStatus s = read_status(l, key);
    s.pinned = pinned;
    return write_state(l, key, s);
  });
}

Status Store::touch(const EntryKey& key) const {
  return guarded("touch", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const std::string path = l.used(key);
    if (::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) return Status();
    if (errno != ENOENT) return io_error("cannot touch", path, errno);
    // The use record was lost; recreate it, but only for an entry that exists.
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(path), false));
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return io_error("cannot create", path, errno);
    if (::futimens(fd.get(), nullptr) != 0) return io_error("cannot touch", path, errno);
    return Status();
  });
}

StatusOr<std::string> Store::read_manifest_bytes(const EntryKey& key) const {
  return guarded("read_manifest_bytes", [&]() -> StatusOr<std::string> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    // Export must never carry a corrupt entry elsewhere: the same checks as load().
    KFORGE_ASSIGN_OR_RETURN(VerifiedManifest m, read_manifest(Layout{root_, options_.durable}, key));
    return std::move(m.bytes);
  });
}

void Store::set_problem_callback(std::function<void(const CacheProblem&)> cb) {
  if (!shared_) return;
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->callback = std::move(cb);
}

// ---- trial markers ------------------------------------------------------------------------------------

namespace {

constexpr uint64_t kMaxTrialMarkerBytes = 16;

// A marker's pid, or why the file is not a marker ("pid\n", nothing else).
StatusOr<int32_t> parse_trial_marker(const std::string& path) {
  KFORGE_ASSIGN_OR_RETURN(std::string text, read_file(path, kMaxTrialMarkerBytes));
  if (text.size() < 2 || text.back() != '\n') return invalid_argument(path + ": not a trial marker (expected a pid and a newline)");
  int64_t pid = 0;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return invalid_argument(path + ": not a trial marker (expected a pid and a newline)");
    pid = pid * 10 + (text[i] - '0');
  }
  if (pid <= 0 || pid > INT32_MAX) return invalid_argument(path + ": not a trial marker (pid " + text.substr(0, text.size() - 1) + ")");
  return static_cast<int32_t>(pid);
}

}  // namespace

Status Store::write_trial_marker(const EntryKey& key, int32_t pid) {
  return guarded("write_trial_marker", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("trial", std::to_string(pid) + "\n"));
    return l.install_replace(tmp, l.trial(key));
  });
}

Status Store::remove_trial_marker(const EntryKey& key) {
  return guarded("remove_trial_marker", [&]() -> Status {
    const Layout l{root_, options_.durable};
    const std::string path = l.trial(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error("cannot remove", path, errno);
    return Status();
  });
}

StatusOr<std::vector<Store::TrialMarker>> Store::trial_markers() const {
  return guarded("trial_markers", [&]() -> StatusOr<std::vector<TrialMarker>> {
    const Layout l{root_, options_.durable};
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(l.trial_dir()));
    std::vector<TrialMarker> out;
    for (const std::string& n : names) {
      StatusOr<EntryKey> key = EntryKey::from_hex(n);
      if (!key.ok() || key->hex() != n) continue;
      const std::string path = l.trial_dir() + "/" + n;
      StatusOr<int32_t> pid = parse_trial_marker(path);
      if (pid.ok()) out.push_back(TrialMarker{*key, *pid, path});
    }
    return out;
  });
}

// ---- verify_all ----------------------------------------------------------------------------------------

StatusOr<std::vector<CacheProblem>> Store::verify_all() const {
  return guarded("verify_all", [&]() -> StatusOr<std::vector<CacheProblem>> {
    if (!shared_) return internal_error("use of a moved-from cache Store");
    const Layout l{root_, options_.durable};
    const int64_t settled_before = now_ms() - options_.gc_grace_ms;
    std::vector<CacheProblem> problems;
    auto add = [&](std::string path, std::string what, std::optional<EntryKey> key = std::nullopt) {
      problems.push_back({std::move(path), std::move(what), key});
    };
    auto add_strays = [&](const std::vector<std::string>& strays) {
      for (const std::string& s : strays) add(s, "unknown file in the cache (not part of the layout; left in place)");
    };
    if (!shared_->version_error.ok()) add(root_ + "/VERSION", shared_->version_error.message());

    // The root holds the layout and nothing else.
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> top, list_names(root_));
    const std::set<std::string> known{"VERSION", "manifests", "blobs", "state", "used", "tmp", "trial"};
    for (const std::string& n : top) {
      if (!known.count(n)) add(root_ + "/" + n, "unknown file in the cache (not part of the layout; left in place)");
    }
    for (const char* sub : {"manifests", "blobs", "state", "used", "tmp"}) {
      struct stat st {};
      const std::string p = root_ + "/" + sub;
      if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) add(p, "directory missing or not a directory");
    }

    // Manifests.
    std::vector<std::string> strays;
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> manifests, scan_fanout(root_ + "/manifests", &strays));
    std::map<EntryKey, std::vector<BlobRef>> entries;  // parsed entries
    std::set<EntryKey> present;                        // every well-named manifest, parsed or not
    for (const FanoutFile& f : manifests) {
      auto key = key_from_name(f.dir, f.name, kManifestSuffix);
      if (!key) {
        strays.push_back(f.path);
        continue;
      }
      present.insert(*key);
      auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxManifestPayload);
      if (!bytes.ok()) {
        if (bytes.status().code() != StatusCode::kNotFound) add(f.path, bytes.status().message(), key);
        continue;  // not found: removed while we scanned
      }
      auto e = parse_manifest_impl(*bytes);
      if (!e.ok()) {
        add(f.path, e.status().message(), key);
      } else if (e->key != *key) {
        add(f.path, "holds entry " + e->key.hex() + ", not the one its name says", key);
      } else {
        entries[*key] = e->blobs;
      }
    }

    // Blobs: every blob's content must hash to its name, referenced or not (a later publish may
    // reuse an unreferenced one without rewriting it).
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> blob_files, scan_fanout(root_ + "/blobs", &strays));
    std::map<std::string, uint64_t> blob_sizes;  // sha -> size, for blobs whose content is right
    for (const FanoutFile& f : blob_files) {
      struct stat st {};
      if (f.name.size() != 64 || !is_lower_hex(f.name) || f.name.compare(0, 2, f.dir) != 0 ||
          ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        strays.push_back(f.path);
        continue;
      }
      auto h = sha256_of_file(f.path);
      if (!h.ok()) {
        add(f.path, h.status().message());
      } else if (*h != f.name) {
        add(f.path, "blob content does not match its SHA-256 name (corrupt)");
      } else {
        blob_sizes[f.name] = static_cast<uint64_t>(st.st_size);
      }
    }
    std::set<std::string> blob_reported;
    for (const auto& [key, refs] : entries) {
      for (const BlobRef& r : refs) {
        const std::string path = l.blob(r.sha256_hex);
        auto it = blob_sizes.find(r.sha256_hex);
        if (it == blob_sizes.end()) {
          if (!exists(path)) add(path, "blob missing (entry's '" + r.name + "')", key);
          // else: corrupt, reported above
        } else if (it->second != r.size && blob_reported.insert(path).second) {
          add(path, "blob is " + std::to_string(it->second) + " bytes, the manifest says " + std::to_string(r.size),
              key);
        }
      }
    }

    // State files and use records, and which entries lack them. Side files without a manifest are
    // reported once per key, under the manifest's name: that is the file that is missing.
    std::map<EntryKey, std::string> orphans;
    auto side_files = [&](const char* sub, std::string_view suffix, bool is_state) -> Status {
      KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/" + sub, &strays));
      std::set<EntryKey> seen;
      for (const FanoutFile& f : files) {
        auto key = key_from_name(f.dir, f.name, suffix);
        struct stat st {};
        if (!key || ::lstat(f.path.c_str(), &st) != 0) {
          strays.push_back(f.path);
          continue;
        }
        seen.insert(*key);
        if (!present.count(*key)) {
          // Young: a writer may be in progress (Note [Cache layout]).
          if (written_ms(st, !is_state) <= settled_before) orphans.emplace(*key, f.path);
          continue;
        }
        if (!S_ISREG(st.st_mode)) {
          add(f.path, "not a regular file", key);
        } else if (is_state) {
          auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxStatePayload);
          StatusOr<EntryStatus> s = bytes.ok() ? decode_state(*bytes, *key) : StatusOr<EntryStatus>(bytes.status());
          if (!s.ok()) add(f.path, "state file unreadable, entry treated as disabled: " + s.status().message(), key);
        } else if (st.st_size != 0) {
          add(f.path, "use record should be empty but has " + std::to_string(st.st_size) + " bytes", key);
        }
      }
      for (const EntryKey& k : present) {
        if (seen.count(k)) continue;
        const std::string path = is_state ? l.state(k) : l.used(k);
        if (exists(path) || !exists(l.manifest(k))) continue;  // changed while we scanned
        add(path, is_state ? "state file missing, entry treated as disabled" : "use record missing", k);
      }
      return Status();
    };
    KFORGE_RETURN_IF_ERROR(side_files("state", kStateSuffix, true));
    KFORGE_RETURN_IF_ERROR(side_files("used", "", false));
    for (const auto& [key, side] : orphans) {
      if (exists(l.manifest(key))) continue;  // published while we scanned
      add(l.manifest(key),
          "manifest missing, but " + side +
              " remains (an interrupted publish or removal, or a deleted manifest); gc removes it",
          key);
    }

    // trial/ (made by the first trial, so it may be absent): markers, "<pid>\n" under an entry's key.
    {
      struct stat st {};
      const std::string dir = l.trial_dir();
      if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) add(dir, "not a directory (trial markers live there)");
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> trials, list_names(l.trial_dir()));
    for (const std::string& n : trials) {
      const std::string p = l.trial_dir() + "/" + n;
      StatusOr<EntryKey> key = EntryKey::from_hex(n);
      if (!key.ok() || key->hex() != n) {
        strays.push_back(p);
        continue;
      }
      StatusOr<int32_t> pid = parse_trial_marker(p);
      if (!pid.ok() && pid.status().code() != StatusCode::kNotFound) add(p, pid.status().message(), *key);
    }

    // tmp/: young files belong to writers in progress; old ones were abandoned.
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> tmps, list_names(l.tmp_dir()));
    for (const std::string& n : tmps) {
      const std::string p = l.tmp_dir() + "/" + n;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) continue;
      if (!S_ISREG(st.st_mode)) {
        strays.push_back(p);
      } else if (written_ms(st) <= settled_before) {
        add(p, "abandoned temporary file (a writer was interrupted); gc removes it");
      }
    }
    add_strays(strays);
    std::stable_sort(problems.begin(), problems.end(),
                     [](const CacheProblem& a, const CacheProblem& b) { return a.path < b.path; });
    return problems;
  });
}

// ---- gc ------------------------------------------------------------------------------------------------

StatusOr<GcReport> Store::gc(uint64_t max_bytes) {
  return guarded("gc", [&]() -> StatusOr<GcReport> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const int64_t settled_before = now_ms() - options_.gc_grace_ms;

    struct Candidate {
      EntryKey key;
      uint64_t manifest_bytes = 0;
      int64_t lru_ms = 0;
      std::vector<BlobRef> blobs;
      bool removable = false;
    };
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> manifests, scan_fanout(root_ + "/manifests", nullptr));
    std::vector<Candidate> entries;
    std::set<EntryKey> present;
    std::map<std::string, uint64_t> refcount;
    for (const FanoutFile& f : manifests) {
      auto key = key_from_name(f.dir, f.name, kManifestSuffix);
      struct stat st {};
      if (!key || ::lstat(f.path.c_str(), &st) != 0) continue;
      present.insert(*key);
      Candidate c;
      c.key = *key;
      c.manifest_bytes = static_cast<uint64_t>(st.st_size);
      auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxManifestPayload);
      auto e = bytes.ok() ? parse_manifest_impl(*bytes) : StatusOr<StoredEntry>(bytes.status());
      // A corrupt manifest is left for the user to inspect (verify_all reports it); it still counts.
      if (e.ok() && e->key == *key) {
        bool state_ok = false;
        const EntryStatus s = read_status(l, *key, &state_ok);
        // An entry whose state file cannot be read might be pinned: keep it. A quarantined entry
        // is kept too: dropping it would drop the quarantine, and the same kernel published again
        // would come back active without anyone deciding to trust it (only remove() forgets it).
        c.removable = state_ok && !s.pinned && s.state != EntryState::kQuarantined;
        c.lru_ms = s.last_use_unix_ms > 0 ? s.last_use_unix_ms : ms_of(st.st_mtim);
        c.blobs = e->blobs;
        for (const BlobRef& r : c.blobs) ++refcount[r.sha256_hex];
      }
      entries.push_back(std::move(c));
    }
    std::map<std::string, uint64_t> blob_size;
    for (const auto& [sha, n] : refcount) {
      struct stat st {};
      if (::lstat(l.blob(sha).c_str(), &st) == 0) blob_size[sha] = static_cast<uint64_t>(st.st_size);
    }
    GcReport report;
    uint64_t total = 0;
    for (const Candidate& c : entries) total += c.manifest_bytes;
    for (const auto& [sha, size] : blob_size) total += size;
    report.bytes_before = total;

    std::vector<const Candidate*> order;
    for (const Candidate& c : entries) {
      if (c.removable) order.push_back(&c);
    }
    std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
      return a->lru_ms != b->lru_ms ? a->lru_ms < b->lru_ms : a->key < b->key;
    });
    for (const Candidate* c : order) {
      if (total <= max_bytes) break;
      Status s = remove_entry_files(l, c->key);
      if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
      present.erase(c->key);
      total -= c->manifest_bytes;
      for (const BlobRef& r : c->blobs) {
        if (--refcount[r.sha256_hex] == 0) {
          total -= blob_size.count(r.sha256_hex) ? blob_size[r.sha256_hex] : 0;
          blob_size.erase(r.sha256_hex);
        }
      }
      report.removed.push_back(c->key);
    }
    report.bytes_after = total;

    // Unreferenced blobs past the grace period. A publisher touches a blob before it renames the
    // manifest that refers to it, so a blob referenced by a manifest newer than our scan is young.
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> blob_files, scan_fanout(root_ + "/blobs", nullptr));
    for (const FanoutFile& f : blob_files) {
      struct stat st {};
      if (f.name.size() != 64 || !is_lower_hex(f.name) || ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        continue;  // not ours to delete: verify_all reports it
      }
      auto it = refcount.find(f.name);
      if ((it != refcount.end() && it->second > 0) || written_ms(st) > settled_before) continue;
      if (::unlink(f.path.c_str()) == 0) ++report.blobs_removed;
    }
    // Side files whose manifest is gone (Note [Cache layout]), then abandoned tmp files.
    using SideDir = std::pair<const char*, std::string_view>;
    for (const auto& [sub, suffix] : {SideDir{"state", kStateSuffix}, SideDir{"used", ""}}) {
      KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/" + sub, nullptr));
      for (const FanoutFile& f : files) {
        auto key = key_from_name(f.dir, f.name, suffix);
        struct stat st {};
        if (!key || present.count(*key) || ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
            written_ms(st, suffix.empty()) > settled_before) {
          continue;
        }
        if (exists(l.manifest(*key))) continue;  // published while we worked
        ::unlink(f.path.c_str());
      }
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> tmps, list_names(l.tmp_dir()));
    for (const std::string& n : tmps) {
      const std::string p = l.tmp_dir() + "/" + n;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || written_ms(st) > settled_before) continue;
      if (::unlink(p.c_str()) == 0) ++report.tmp_removed;
    }
    // Trial markers of entries that are gone (removed here, or older than the grace period: a
    // marker is written just before its entry's first launch) say nothing any more.
    const std::set<EntryKey> removed(report.removed.begin(), report.removed.end());
    KFORGE_ASSIGN_OR_RETURN(std::vector<TrialMarker> markers, trial_markers());
    for (const TrialMarker& m : markers) {
      struct stat st {};
      if (::lstat(m.path.c_str(), &st) != 0) continue;
      const bool entry_gone = removed.count(m.key) > 0 || (!exists(l.manifest(m.key)) && written_ms(st) <= settled_before);
      if (entry_gone && ::unlink(m.path.c_str()) == 0) ++report.trial_markers_removed;
    }
    return report;
  });
}

}  // namespace kforge

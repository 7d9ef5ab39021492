// The build cache's key and files (build_cache.h).
#include "search_daemon/worker/build_cache.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "runtime/cpu_kernel_abi.h"
#include "runtime/file_io.h"
#include "runtime/unique_fd.h"
#include "search_daemon/worker/compile_options.h"
#include "search_daemon/worker/cpu_kernel_abi_text.h"

// Note [Build cache files]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// One file per key, <cache_dir>/<k0k1>/<key>.art, made by writing <cache_dir>/tmp/<key>.<pid>.<rnd>,
// fsync and rename, so a reader sees a whole old file or a whole new one, never a torn one, and
// concurrent builders of one key simply both rename (same content). The frame:
//
//   magic "kforgeBC" | format u32 | reserved u32 (0) | body length u64 | SHA-256(body)   (56 bytes)
//   body: key (64 hex) | compiled u8 | name length u32 | name | log length u64 | log
//         | artifact length u64 | artifact
//
// (little-endian). The hash covers the whole body, not just the artifact: a flipped bit in the
// status byte would otherwise turn a compile error into "compiled" with an empty artifact. The
// key inside must equal the file's name, so a file copied or renamed to another key is refused.
// Anything that fails these checks is treated as a miss; the rebuild renames a good file over it.
//
// What is cached: deterministic outcomes only, i.e. a successful build, a compiler that exited
// with an error, and an object refused by the import policy. A compiler killed for its budget, or
// by a signal (the OOM killer), says nothing about the source, and caching it would fail the
// candidate forever even under a larger budget. Rejected compile options cost no compile and are
// not cached either.

namespace kforge::build_cache {

namespace {

constexpr std::string_view kFrameMagic{"kforgeBC", 8};
constexpr uint32_t kFrameFormat = 1;
constexpr size_t kFrameHeaderBytes = 56;
constexpr size_t kSha256Bytes = crypto_hash_sha256_BYTES;
// Bumped when the frame or the meaning of a key changes (the fixed flags are in the key itself).
constexpr std::string_view kKeyDomain = "kforge-build-key 1";

using file_io::fsync_dir;
using file_io::io_error;
using file_io::put_u32;
using file_io::put_u64;
using file_io::write_all;

// mkdir -p: the components above `dir` may be anything the system provides (/tmp may be a link);
// `dir` itself must be ours.
Status make_cache_dir(const std::string& dir) {
  if (dir.empty()) return invalid_argument("build cache directory is empty");
  for (size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1)) {
    const std::string parent = dir.substr(0, slash);
    if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) return io_error("cannot create directory", parent, errno);
  }
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return ensure_private_dir(d);
}

std::array<uint8_t, kSha256Bytes> sha256(std::string_view bytes) {
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return h;
}

void put_field(std::string& out, std::string_view field) {
  put_u64(out, field.size());
  out.append(field);
}

// Reads little-endian fields from a bounded buffer; every read checks what is left.
class FrameReader {
 public:
  explicit FrameReader(std::string_view b) : b_(b) {}
  std::optional<uint64_t> uint(size_t bytes) {
    if (b_.size() - pos_ < bytes) return std::nullopt;
    const uint64_t v = file_io::get_le(b_, pos_, bytes);
    pos_ += bytes;
    return v;
  }
  std::optional<std::string_view> bytes(uint64_t n) {
    if (b_.size() - pos_ < n) return std::nullopt;
    std::string_view v = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return v;
  }
  bool at_end() const noexcept { return pos_ == b_.size(); }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// <cache_dir>/<k0k1>, the directory of the key's file.
std::string fanout_dir(const std::string& cache_dir, const std::string& key) {
  return cache_dir + "/" + key.substr(0, 2);
}

}  // namespace

Status prepare_cache_dir(const std::string& cache_dir) {
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  KFORGE_RETURN_IF_ERROR(make_cache_dir(cache_dir));
  return ensure_private_dir(cache_dir + "/tmp");
}

Status ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return io_error("cannot create directory", dir, errno);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return io_error("cannot stat", dir, errno);
  if (S_ISLNK(st.st_mode)) return invalid_argument("build cache directory " + dir + " is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return invalid_argument("build cache directory " + dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return invalid_argument("build cache directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                            ", not to this process's uid " + std::to_string(::geteuid()));
  }
  return Status();
}

std::string cache_key(const KernelSpec& spec, const std::string& identity) {
  std::string in;
  put_field(in, kKeyDomain);
  put_field(in, backend_name(spec.backend));
  put_field(in, identity);
  put_field(in, std::to_string(KFORGE_CPU_ABI_VERSION));
  put_field(in, kCpuKernelAbiHeaderText);
  if (spec.backend == Backend::kCpu) {
    put_u64(in, kFixedCpuFlags.size());
    for (const char* f : kFixedCpuFlags) put_field(in, f);
  }
  put_field(in, spec.source);
  put_u64(in, spec.entry_points.size());
  for (const std::string& e : spec.entry_points) put_field(in, e);
  put_u64(in, spec.compile_options.size());
  for (const std::string& o : spec.compile_options) put_field(in, o);
  auto h = sha256(in);
  return file_io::to_hex(h.data(), h.size());
}

std::string encode_frame(const std::string& key, const CacheRecord& r) {
  std::string body;
  body.reserve(key.size() + 32 + r.artifact_name.size() + r.log.size() + r.artifact.size());
  body.append(key);
  body.push_back(r.compiled ? '\1' : '\0');
  put_u32(body, static_cast<uint32_t>(r.artifact_name.size()));
  body.append(r.artifact_name);
  put_u64(body, r.log.size());
  body.append(r.log);
  put_u64(body, r.artifact.size());
  body.append(r.artifact);

  std::string out(kFrameMagic);
  put_u32(out, kFrameFormat);
  put_u32(out, 0);
  put_u64(out, body.size());
  auto h = sha256(body);
  out.append(reinterpret_cast<const char*>(h.data()), h.size());
  out.append(body);
  return out;
}

std::optional<CacheRecord> decode_frame(std::string_view file, const std::string& key) {
  if (file.size() < kFrameHeaderBytes || file.substr(0, kFrameMagic.size()) != kFrameMagic) return std::nullopt;
  FrameReader header(file.substr(kFrameMagic.size(), kFrameHeaderBytes - kFrameMagic.size()));
  auto format = header.uint(4), reserved = header.uint(4), length = header.uint(8);
  auto digest = header.bytes(kSha256Bytes);
  if (!format || *format != kFrameFormat || !reserved || *reserved != 0 || !length || !digest) return std::nullopt;
  std::string_view body = file.substr(kFrameHeaderBytes);
  if (*length != body.size()) return std::nullopt;
  auto h = sha256(body);
  if (std::memcmp(h.data(), digest->data(), h.size()) != 0) return std::nullopt;

  FrameReader r(body);
  auto stored_key = r.bytes(key.size());
  auto compiled = r.uint(1);
  if (!stored_key || *stored_key != key || !compiled || *compiled > 1) return std::nullopt;
  auto name_len = r.uint(4);
  auto name = name_len ? r.bytes(*name_len) : std::nullopt;
  auto log_len = name ? r.uint(8) : std::nullopt;
  auto log = log_len ? r.bytes(*log_len) : std::nullopt;
  auto art_len = log ? r.uint(8) : std::nullopt;
  auto art = art_len ? r.bytes(*art_len) : std::nullopt;
  if (!art || !r.at_end()) return std::nullopt;
  CacheRecord rec;
  rec.compiled = *compiled == 1;
  rec.artifact_name = std::string(*name);
  rec.log = std::string(*log);
  rec.artifact = std::string(*art);
  if (rec.compiled == rec.artifact_name.empty()) return std::nullopt;
  return rec;
}

StatusOr<std::optional<CacheRecord>> read_entry(const std::string& cache_dir, const std::string& key) {
  const std::string entry_path = fanout_dir(cache_dir, key) + "/" + key + ".art";
  StatusOr<std::string> file = file_io::read_file(entry_path, kMaxArtifactFileBytes);
  if (file.ok()) {
    // nullopt when damaged: the caller rebuilds, and write_entry's rename replaces it.
    return decode_frame(*file, key);
  }
  if (file.status().code() != StatusCode::kNotFound && file.status().code() != StatusCode::kInvalidArgument) {
    // kInvalidArgument (a symbolic link, not a regular file, oversized) is damage as well, and
    // rename replaces a link rather than following it; anything else is the disk failing.
    return file.status();
  }
  return std::optional<CacheRecord>();
}

Status write_entry(const std::string& cache_dir, const std::string& key, const CacheRecord& r) {
  // Installed by rename after fsync (Note [Build cache files]); a unique temporary name per
  // writer, so concurrent builders of one key never write the same file.
  const std::string fanout = fanout_dir(cache_dir, key);
  const std::string entry_path = fanout + "/" + key + ".art";
  KFORGE_RETURN_IF_ERROR(ensure_private_dir(fanout));
  uint8_t rnd[8];
  randombytes_buf(rnd, sizeof rnd);
  const std::string tmp = cache_dir + "/tmp/" + key + "." + std::to_string(::getpid()) + "." + file_io::to_hex(rnd, sizeof rnd);
  const std::string frame = encode_frame(key, r);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return io_error("cannot create", tmp, errno);
    Status s = write_all(fd.get(), frame, tmp);
    if (s.ok() && ::fsync(fd.get()) != 0) s = io_error("cannot fsync", tmp, errno);
    if (s.ok() && ::rename(tmp.c_str(), entry_path.c_str()) != 0) s = io_error("cannot rename into", entry_path, errno);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  return fsync_dir(fanout);
}

}  // namespace kforge::build_cache

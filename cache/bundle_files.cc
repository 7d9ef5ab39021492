// The bundle code's files and libsodium (cache/bundle_internal.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/bundle_internal.h"
#include "runtime/file_io.h"
#include "runtime/unique_fd.h"

namespace kforge::bundle_detail {

namespace {

using file_io::fsync_dir;
using file_io::write_all;

Status errno_error(const std::string& what, const std::string& path, int err) {
  return file_io::io_error(what, path, err);
}

// Removes a temporary file unless the caller commits (renamed or linked it into place).
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!committed_) ::unlink(path_.c_str());
  }
  const std::string& path() const noexcept { return path_; }
  void commit() noexcept { committed_ = true; }

 private:
  std::string path_;
  bool committed_ = false;
};

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string random_suffix() {
  std::array<uint8_t, 8> r{};
  randombytes_buf(r.data(), r.size());
  return file_io::to_hex(r.data(), r.size());
}

}  // namespace

Status ensure_sodium() {
  static const int rc = sodium_init();   // thread-safe once; 1 = already initialized
  if (rc < 0) return internal_error("libsodium failed to initialize");
  return Status();
}


std::array<uint8_t, 32> sha256(std::string_view data) {
  std::array<uint8_t, 32> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(data.data()), data.size());
  return h;
}

std::string short_hex(const std::string& hex) { return hex.substr(0, 12) + "…"; }

Status write_file_atomically(const std::string& path, std::string_view data, mode_t mode, bool exact_mode,
                             Placement placement) {
  TempFile tmp(path + ".tmp." + random_suffix());
  UniqueFd fd(::open(tmp.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd.valid()) return errno_error("cannot create", tmp.path(), errno);
  if (exact_mode && ::fchmod(fd.get(), mode) != 0) return errno_error("cannot chmod", tmp.path(), errno);
  KFORGE_RETURN_IF_ERROR(write_all(fd.get(), data, tmp.path()));
  if (::fsync(fd.get()) != 0) return errno_error("cannot fsync", tmp.path(), errno);
  if (fd.close() != 0) return errno_error("cannot close", tmp.path(), errno);
  if (placement == Placement::kReplace) {
    if (::rename(tmp.path().c_str(), path.c_str()) != 0) return errno_error("cannot rename onto", path, errno);
    tmp.commit();
  } else {
    if (::link(tmp.path().c_str(), path.c_str()) != 0) {
      if (errno == EEXIST) return invalid_argument(path + " already exists; refusing to overwrite it");
      return errno_error("cannot create", path, errno);
    }
    // tmp's destructor unlinks the temp name; the file lives on under `path`.
  }
  return fsync_dir(parent_dir(path));
}

StatusOr<FileBytes> read_file_bounded(const std::string& path, uint64_t max_bytes, bool nofollow,
                                      std::string_view what) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0)));
  if (!fd.valid()) {
    if (errno == ELOOP && nofollow) {
      return invalid_argument(std::string(what) + " " + path + " is a symbolic link; refusing it");
    }
    if (errno == ENOENT) return not_found(std::string(what) + " " + path + " does not exist");
    return errno_error("cannot open " + std::string(what), path, errno);
  }
  FileBytes out;
  if (::fstat(fd.get(), &out.st) != 0) return errno_error("cannot stat", path, errno);
  if (!S_ISREG(out.st.st_mode)) return invalid_argument(std::string(what) + " " + path + " is not a regular file");
  uint64_t size = static_cast<uint64_t>(out.st.st_size);
  if (size > max_bytes) {
    return out_of_range(std::string(what) + " " + path + " is " + std::to_string(size) +
                        " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  out.bytes.resize(size);
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(fd.get(), out.bytes.data() + got, std::min<size_t>(size - got, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("cannot read", path, errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  // A file that changes size while read is someone else's write in progress: refuse, do not guess.
  char extra;
  if (got != size || ::read(fd.get(), &extra, 1) != 0) {
    return unavailable(std::string(what) + " " + path + " changed size while being read");
  }
  return out;
}

}  // namespace kforge::bundle_detail

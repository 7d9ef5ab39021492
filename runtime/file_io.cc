#include "runtime/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "runtime/unique_fd.h"

namespace kforge::file_io {

namespace {

struct DirCloser {
  void operator()(DIR* d) const noexcept { ::closedir(d); }
};

}  // namespace

Status io_error(std::string_view what, const std::string& path, int err) {
  return unavailable(std::string(what) + " " + path + ": " + std::strerror(err));
}

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
    return invalid_argument(path + ": " + std::to_string(size) + " bytes, over the limit of " + std::to_string(max_bytes));
  }
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd.get(), bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read", path, errno);
    if (n == 0) break;   // shrank while we read: the caller's format check reports the truncation
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot write", path, errno);
    done += static_cast<size_t>(n);
  }
  return Status();
}

Status write_new_file(const std::string& path, std::string_view bytes, bool durable) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return io_error("cannot create", path, errno);
  KFORGE_RETURN_IF_ERROR(write_all(fd.get(), bytes, path));
  if (durable && ::fsync(fd.get()) != 0) return io_error("cannot fsync", path, errno);
  return Status();
}

Status fsync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return io_error("cannot open directory", dir, errno);
  if (::fsync(fd.get()) != 0) return io_error("cannot fsync directory", dir, errno);
  return Status();
}

Status ensure_dir(const std::string& dir, bool durable) {
  if (::mkdir(dir.c_str(), 0700) == 0) return durable ? fsync_dir(parent_of(dir)) : Status();
  if (errno != EEXIST) return io_error("cannot create directory", dir, errno);
  return Status();
}

StatusOr<std::vector<std::string>> list_names(const std::string& dir) {
  std::unique_ptr<DIR, DirCloser> d(::opendir(dir.c_str()));
  if (!d) {
    if (errno == ENOENT) return std::vector<std::string>{};
    return io_error("cannot list directory", dir, errno);
  }
  std::vector<std::string> names;
  errno = 0;
  while (const struct dirent* e = ::readdir(d.get())) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  if (errno != 0) return io_error("cannot list directory", dir, errno);
  std::sort(names.begin(), names.end());
  return names;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

std::string to_hex(const uint8_t* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(std::string_view bytes, size_t offset, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[offset + i])} << (8 * i);
  return v;
}

}  // namespace kforge::file_io

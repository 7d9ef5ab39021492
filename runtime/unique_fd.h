// UniqueFd: the one RAII owner of a POSIX file descriptor (cache, bundles, the worker's builder).
// Closes on destruction; move-only.
//
//   UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd.valid()) return io_error(...);
//   if (fd.close() != 0) ...     // writers close explicitly: close() can report write-back errors
#pragma once

#include <unistd.h>

#include <utility>

namespace kforge {

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  // Closes now and returns close()'s result (-1 with errno set on failure).
  int close() noexcept { return ::close(std::exchange(fd_, -1)); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_;
};

}  // namespace kforge

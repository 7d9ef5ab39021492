#include "interposer/hook/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kforge::hook {

void log_line(std::string_view message) noexcept {
  // A bounded stack buffer: a diagnostic must not fail for want of memory.
  static constexpr std::string_view kPrefix = "kforge: ";
  char buf[2048];
  size_t n = 0;
  std::memcpy(buf, kPrefix.data(), kPrefix.size());
  n += kPrefix.size();
  const size_t room = sizeof buf - n - 1;
  const size_t take = message.size() < room ? message.size() : room;
  if (take > 0) std::memcpy(buf + n, message.data(), take);
  n += take;
  buf[n++] = '\n';
  const int saved_errno = errno;   // callers may be between a failing call and its errno check
  size_t off = 0;
  while (off < n) {
    const ssize_t w = ::write(STDERR_FILENO, buf + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  errno = saved_errno;
}

}  // namespace kforge::hook

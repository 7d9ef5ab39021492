#include "runtime/daemon_endpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kforge {

Status secure_ipc_directory(std::string_view endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  if (endpoint.substr(0, kIpc.size()) != kIpc) return Status();
  const std::string path(endpoint.substr(kIpc.size()));
  const size_t slash = path.rfind('/');
  if (path.empty() || path[0] != '/' || slash == std::string::npos || slash == 0) {
    return invalid_argument("daemon endpoint " + std::string(endpoint) + " is not an absolute ipc:// path in a directory");
  }
  const std::string dir = path.substr(0, slash);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return unavailable("cannot create " + dir + " for the daemon socket: " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return unavailable("cannot stat " + dir + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode)) return invalid_argument("daemon socket directory " + dir + " is a symbolic link; refused");
  if (!S_ISDIR(st.st_mode)) return invalid_argument("daemon socket directory " + dir + " is not a directory; refused");
  if (st.st_uid != ::geteuid()) {
    return invalid_argument("daemon socket directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                            ", not this user; refused");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return invalid_argument("daemon socket directory " + dir + " has mode " + mode +
                            " (must be 0700); refused. Fix: chmod 700 " + dir);
  }
  return Status();
}

Status check_curve_key(std::string_view key, std::string_view what) {
  static constexpr std::string_view kZ85 =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (key.size() != 40) {
    return invalid_argument(std::string(what) + " is " + std::to_string(key.size()) +
                            " characters long; a CURVE key is 40 z85 characters (kforged --curve-keygen prints the daemon's)");
  }
  for (const char c : key) {
    if (kZ85.find(c) == std::string_view::npos) {
      return invalid_argument(std::string(what) + " has a character outside the z85 alphabet; a CURVE key is 40 z85 "
                              "characters (kforged --curve-keygen prints the daemon's)");
    }
  }
  return Status();
}

StatusOr<std::string> client_server_key(std::string_view endpoint, std::string_view server_key, std::string_view key_what) {
  constexpr std::string_view kBlank = " \t\r\n";
  const size_t first = server_key.find_first_not_of(kBlank);
  server_key = first == std::string_view::npos ? std::string_view()
                                               : server_key.substr(first, server_key.find_last_not_of(kBlank) - first + 1);
  const bool tcp = endpoint.substr(0, 6) == "tcp://";
  if (tcp && server_key.empty()) {
    return invalid_argument("daemon endpoint " + std::string(endpoint) + " is tcp://, which kforged serves only with CURVE: set " +
                            std::string(key_what) + " to the daemon's CURVE public key");
  }
  if (!tcp && !server_key.empty()) {
    return invalid_argument(std::string(key_what) + " is set but the daemon endpoint " + std::string(endpoint) +
                            " is not tcp:// (ipc:// sockets are protected by their directory, not CURVE)");
  }
  if (tcp) KFORGE_RETURN_IF_ERROR(check_curve_key(server_key, key_what));
  return std::string(server_key);
}

std::string default_daemon_endpoint(std::string_view xdg_runtime_dir, unsigned uid) {
  if (!xdg_runtime_dir.empty() && xdg_runtime_dir.front() == '/') {
    return "ipc://" + std::string(xdg_runtime_dir) + "/kforge/daemon.sock";
  }
  return "ipc:///tmp/kforge-" + std::to_string(uid) + "/daemon.sock";
}

}  // namespace kforge

#include "tools/daemon_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "runtime/control_message.h"
#include "runtime/daemon_endpoint.h"
#include "runtime/file_io.h"
#include "runtime/transport.h"

namespace kforge {

using namespace file_io;   // NOLINT: read_file, list_names, ensure_dir, io_error

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// The last `lines` lines of a file, for error messages.
std::string tail_of(const std::string& path, int lines) {
  StatusOr<std::string> text = read_file(path, 16u << 20);
  if (!text.ok()) return "";
  const std::string& s = *text;
  size_t pos = s.size();
  if (pos > 0 && s[pos - 1] == '\n') --pos;
  for (int i = 0; i < lines && pos > 0; ++i) {
    const size_t nl = s.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  return s.substr(pos == 0 ? 0 : pos + 1);
}

}  // namespace

std::string default_state_dir() {
  if (const std::string x = env_or("XDG_STATE_HOME", ""); !x.empty()) return x + "/kforge";
  return env_or("HOME", "/tmp") + "/.local/state/kforge";
}

std::string resolve_daemon_endpoint(const std::string& given) {
  if (!given.empty()) return given;
  if (const std::string e = env_or("KFORGE_DAEMON_ENDPOINT", ""); !e.empty()) return e;
  return default_daemon_endpoint(env_or("XDG_RUNTIME_DIR", ""), static_cast<unsigned>(::getuid()));
}

StatusOr<nlohmann::json> query_daemon_status(const std::string& endpoint, const std::string& server_key,
                                             int timeout_ms) {
  if (Status s = secure_ipc_directory(endpoint); !s.ok()) return s;
  StatusOr<std::string> key = client_server_key(endpoint, server_key, "the daemon's server key");
  if (!key.ok()) return key.status();
  std::string why;
  std::optional<std::string> reply = transport::request_reply(
      endpoint, *key, control::encode_request(control::ControlRequest{control::Request::kStatus, std::nullopt}), timeout_ms, why);
  if (!reply) return unavailable("no kforged answers at " + endpoint + " (" + why + ")");
  StatusOr<std::string> text = control::decode_status_reply(*reply);
  if (!text.ok()) return invalid_argument("the daemon at " + endpoint + " answered: " + text.status().message());
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("the daemon at " + endpoint + " sent a status that is not JSON");
  return j;
}

StatusOr<DaemonHandle> ensure_daemon(const InstallLayout& layout, const DaemonRequest& request, std::ostream& err) {
  DaemonHandle h;
  h.endpoint = resolve_daemon_endpoint(request.endpoint);
  if (StatusOr<nlohmann::json> st = query_daemon_status(h.endpoint, request.server_key, 1500); st.ok()) {
    h.status = *st;
    h.pid = st->value("/daemon/pid"_json_pointer, 0);
    return h;
  } else if (st.status().code() != StatusCode::kUnavailable) {
    return st.status();
  }
  if (h.endpoint.rfind("ipc://", 0) != 0) {
    return unavailable("no kforged answers at " + h.endpoint + ": kforge starts daemons only on this host (ipc://)");
  }
  if (::access(layout.kforged.c_str(), X_OK) != 0) {
    return not_found("no kforged at " + layout.kforged + " to start (" + std::strerror(errno) +
                     "); use --no-daemon to run with the cache only");
  }
  const std::string state_dir = request.state_dir.empty() ? default_state_dir() : request.state_dir;
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return unavailable("cannot create the daemon's state directory " + state_dir + ": " + ec.message());
  ::chmod(state_dir.c_str(), 0700);
  h.log_path = state_dir + "/kforged.log";
  std::vector<std::string> args{layout.kforged, "--endpoint", h.endpoint};
  if (!request.cache_dir.empty()) args.insert(args.end(), {"--cache-dir", request.cache_dir});
  if (!request.state_dir.empty()) args.insert(args.end(), {"--state-dir", request.state_dir});
  args.insert(args.end(), request.extra_args.begin(), request.extra_args.end());
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  const int log_fd = ::open(h.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (log_fd < 0) return io_error("cannot open the daemon log", h.log_path, errno);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return internal_error(std::string("cannot fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setsid();
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    // A terminal's signals stay with the program; the daemon's own defaults apply.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execv(cargs[0], cargs.data());
    ::_exit(127);
  }
  ::close(log_fd);
  h.pid = pid;
  h.started_here = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(request.start_timeout_ms);
  while (true) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      const std::string how = WIFEXITED(st) ? "exit code " + std::to_string(WEXITSTATUS(st))
                                            : "signal " + std::to_string(WTERMSIG(st));
      return unavailable("kforged exited while starting (" + how + "); the end of " + h.log_path + ":\n" +
                         tail_of(h.log_path, 8));
    }
    if (StatusOr<nlohmann::json> s = query_daemon_status(h.endpoint, request.server_key, 500); s.ok()) {
      h.status = *s;
      return h;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return unavailable("kforged (pid " + std::to_string(pid) + ") did not answer within " +
                         std::to_string(request.start_timeout_ms / 1000) + " s; see " + h.log_path);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  (void)err;
}

}  // namespace kforge

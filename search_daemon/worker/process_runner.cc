// Running an external program under a budget (process_runner.h).
#include "search_daemon/worker/process_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "runtime/unique_fd.h"

extern char** environ;

namespace kforge {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

class SpawnFileActions {
 public:
  SpawnFileActions() { ok_ = ::posix_spawn_file_actions_init(&fa_) == 0; }
  SpawnFileActions(const SpawnFileActions&) = delete;
  SpawnFileActions& operator=(const SpawnFileActions&) = delete;
  ~SpawnFileActions() {
    if (ok_) ::posix_spawn_file_actions_destroy(&fa_);
  }
  bool ok() const noexcept { return ok_; }
  posix_spawn_file_actions_t* get() noexcept { return &fa_; }

 private:
  posix_spawn_file_actions_t fa_{};
  bool ok_ = false;
};

class SpawnAttr {
 public:
  SpawnAttr() { ok_ = ::posix_spawnattr_init(&at_) == 0; }
  SpawnAttr(const SpawnAttr&) = delete;
  SpawnAttr& operator=(const SpawnAttr&) = delete;
  ~SpawnAttr() {
    if (ok_) ::posix_spawnattr_destroy(&at_);
  }
  bool ok() const noexcept { return ok_; }
  posix_spawnattr_t* get() noexcept { return &at_; }

 private:
  posix_spawnattr_t at_{};
  bool ok_ = false;
};

// A spawned process group: until reaped, destruction kills the whole group and reaps the leader,
// so no error path leaves a compiler running or a zombie behind.
class ChildGroup {
 public:
  explicit ChildGroup(pid_t pid) : pid_(pid) {}
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    if (pid_ <= 0) return;
    kill_group();
    int status = 0;
    (void)wait(&status);
  }
  pid_t pid() const noexcept { return pid_; }
  void kill_group() const noexcept {
    ::kill(-pid_, SIGKILL);  // the leader's pid is the group id (POSIX_SPAWN_SETPGROUP, 0)
    ::kill(pid_, SIGKILL);
  }
  // Blocks until the leader is gone; then nothing is left to clean up.
  bool wait(int* status) noexcept {
    if (pid_ <= 0) return false;
    pid_t r;
    do {
      r = ::waitpid(pid_, status, 0);
    } while (r < 0 && errno == EINTR);
    pid_ = -1;
    return r > 0;
  }

 private:
  pid_t pid_;
};

}  // namespace

StatusOr<ProcessResult> run_process(const std::vector<std::string>& args, const std::string& dir, uint32_t budget_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(budget_ms);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return unavailable("cannot create a pipe: " + errno_text(errno));
  UniqueFd read_end(fds[0]), write_end(fds[1]);

  SpawnFileActions fa;
  SpawnAttr attr;
  if (!fa.ok() || !attr.ok()) return internal_error("posix_spawn setup failed");
  int rc = ::posix_spawn_file_actions_addopen(fa.get(), 0, "/dev/null", O_RDONLY, 0);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(fa.get(), write_end.get(), 1);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(fa.get(), write_end.get(), 2);
  if (rc == 0 && !dir.empty()) rc = ::posix_spawn_file_actions_addchdir_np(fa.get(), dir.c_str());
  // The host process (the worker) may block or ignore signals; the compiler must start clean.
  sigset_t empty_mask, defaults;
  sigemptyset(&empty_mask);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGCHLD, SIGALRM, SIGUSR1, SIGUSR2}) sigaddset(&defaults, s);
  if (rc == 0) rc = ::posix_spawnattr_setflags(attr.get(), POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (rc == 0) rc = ::posix_spawnattr_setpgroup(attr.get(), 0);
  if (rc == 0) rc = ::posix_spawnattr_setsigmask(attr.get(), &empty_mask);
  if (rc == 0) rc = ::posix_spawnattr_setsigdefault(attr.get(), &defaults);
  if (rc != 0) return internal_error("posix_spawn setup failed: " + errno_text(rc));

  pid_t pid = -1;
  rc = ::posix_spawnp(&pid, argv[0], fa.get(), attr.get(), argv.data(), environ);
  if (rc != 0) return unavailable("cannot run '" + args[0] + "': " + errno_text(rc));
  ChildGroup child(pid);
  write_end.reset();  // only the child holds the write end now: EOF means every writer is gone

  // A pidfd tells us when the driver exits even if a tool it started keeps the pipe open. Without
  // one (kernel before 5.3) we wait for EOF, then reap.
  UniqueFd pidfd;
#ifdef SYS_pidfd_open
  pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif

  ProcessResult result;
  bool pipe_open = true, leader_exited = false;
  std::array<char, 65536> buf;
  while (pipe_open || (!leader_exited && pidfd.valid())) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      result.timed_out = true;
      break;
    }
    // Rounded up, so a sub-millisecond remainder does not turn into a busy loop of poll(0).
    const auto left_ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    std::array<pollfd, 2> pfds{};
    nfds_t n = 0;
    const nfds_t pipe_slot = pipe_open ? n++ : 2;
    if (pipe_open) pfds[pipe_slot] = {read_end.get(), POLLIN, 0};
    const nfds_t pid_slot = !leader_exited && pidfd.valid() ? n++ : 2;
    if (pid_slot < 2) pfds[pid_slot] = {pidfd.get(), POLLIN, 0};
    int r = ::poll(pfds.data(), n, static_cast<int>(std::min<int64_t>(left_ms, INT32_MAX)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return internal_error("poll failed: " + errno_text(errno));
    if (pipe_slot < 2 && pfds[pipe_slot].revents != 0) {
      ssize_t got = ::read(read_end.get(), buf.data(), buf.size());
      if (got < 0 && errno != EINTR && errno != EAGAIN) return internal_error("reading the compiler's output failed: " + errno_text(errno));
      if (got == 0) pipe_open = false;
      if (got > 0) {
        // Keep draining past the cap: a compiler blocked on a full pipe would only time out.
        const size_t room = kMaxProcessOutputBytes - result.output.size();
        const size_t take = std::min(room, static_cast<size_t>(got));
        result.output.append(buf.data(), take);
        if (take < static_cast<size_t>(got)) result.output_truncated = true;
      }
    }
    if (pid_slot < 2 && pfds[pid_slot].revents != 0) leader_exited = true;
  }
  // On a timeout, everything goes. After a normal exit the leader is a zombie until reaped, so its
  // group id cannot be reused yet: killing the group now removes only tools it left behind.
  if (result.timed_out || leader_exited) child.kill_group();
  int status = 0;
  if (!child.wait(&status)) return internal_error("waitpid failed: " + errno_text(errno));
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  if (result.output_truncated) result.output += "\n[kforge: output truncated at 1 MiB]";
  return result;
}

}  // namespace kforge

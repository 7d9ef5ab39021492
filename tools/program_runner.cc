#include "tools/program_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>

extern char** environ;

namespace kforge {

namespace {

std::atomic<pid_t> g_child{0};

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Note [Signal forwarding]: only what was sent to kforge by another process (kill, sigqueue,
// tgkill: si_code <= 0); the terminal's signals (SI_KERNEL) already reached the whole group.
void forward(int sig, siginfo_t* info, void*) {
  const pid_t child = g_child.load();
  if (child > 0 && info != nullptr && info->si_code <= 0) ::kill(child, sig);
}

struct ForwardingScope {
  struct sigaction old[sizeof kForwarded / sizeof kForwarded[0]];
  explicit ForwardingScope(pid_t child) {
    g_child.store(child);
    for (size_t i = 0; i < sizeof kForwarded / sizeof kForwarded[0]; ++i) {
      struct sigaction sa {};
      sa.sa_sigaction = forward;
      sa.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&sa.sa_mask);
      ::sigaction(kForwarded[i], &sa, &old[i]);
    }
  }
  ~ForwardingScope() {
    for (size_t i = 0; i < sizeof kForwarded / sizeof kForwarded[0]; ++i) ::sigaction(kForwarded[i], &old[i], nullptr);
    g_child.store(0);
  }
};

std::vector<std::string> child_environment(const std::map<std::string, std::string>& set,
                                           const std::vector<std::string>& unset) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (set.count(name) != 0) continue;
    bool drop = false;
    for (const std::string& u : unset) drop = drop || u == name;
    if (!drop) out.push_back(kv);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

ProgramResult run_program(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                          const std::vector<std::string>& unset, const std::string& who, std::ostream& err) {
  ProgramResult r;
  if (argv.empty()) {
    err << who << ": no program to run\n";
    r.exit_code = kExitKforgeFailed;
    return r;
  }
  const std::vector<std::string> env = child_environment(set, unset);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  // exec's errno comes back through a close-on-exec pipe: EOF means the program runs.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    err << who << ": cannot create a pipe: " << std::strerror(errno) << "\n";
    r.exit_code = kExitKforgeFailed;
    return r;
  }
  std::cout.flush();
  err.flush();
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    err << who << ": cannot fork: " << std::strerror(errno) << "\n";
    ::close(fds[0]);
    ::close(fds[1]);
    r.exit_code = kExitKforgeFailed;
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    const int e = errno;
    (void)!::write(fds[1], &e, sizeof e);
    ::_exit(kExitNotFound);
  }
  ::close(fds[1]);
  ForwardingScope scope(pid);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(fds[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    err << who << ": cannot run " << argv[0] << ": " << std::strerror(exec_errno) << "\n";
    r.exit_code = exec_errno == ENOENT ? kExitNotFound : kExitCannotRun;
    return r;
  }
  r.started = true;
  if (WIFEXITED(st)) {
    r.exit_code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
    r.core = WCOREDUMP(st);
    r.exit_code = 128 + r.signal;
  }
  return r;
}

int exit_like(const ProgramResult& r) {
  if (r.signal == 0) return r.exit_code;
  std::cout.flush();
  std::cerr.flush();
  // Re-raise with the default action, so whoever waits for kforge sees the same death. A core
  // dump of kforge is not the child's: keep cores off for ourselves.
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  ::sigaction(r.signal, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, r.signal);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(r.signal);
  return 128 + r.signal;   // a signal whose default is to ignore (SIGWINCH, SIGCHLD): exit like a shell
}

std::string describe_result(const ProgramResult& r) {
  if (!r.started) return "did not start";
  if (r.signal != 0) {
    const char* name = ::sigabbrev_np(r.signal);
    return std::string("killed by SIG") + (name != nullptr ? name : std::to_string(r.signal)) +
           (r.core ? " (core dumped)" : "");
  }
  return "exit code " + std::to_string(r.exit_code);
}

}  // namespace kforge

#include "search_daemon/evaluator/worker_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace kforge::eval {

namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return std::string("died of ") + (abbrev != nullptr ? std::string("SIG") + abbrev : "signal") + " (signal " +
           std::to_string(sig) + ")";
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

// Note [Idle workers]. Between fork and exec, so only system calls: SCHED_IDLE, else nice 19.
void lower_priority_in_child() {
  sched_param param{};
  param.sched_priority = 0;
  if (::sched_setscheduler(0, SCHED_IDLE, &param) != 0) (void)::setpriority(PRIO_PROCESS, 0, 19);
}

}  // namespace

std::string_view worker_priority_name(WorkerPriority p) {
  switch (p) {
    case WorkerPriority::kIdle: return "idle";
    case WorkerPriority::kNormal: return "normal";
  }
  return "?";
}

std::optional<WorkerPriority> parse_worker_priority(std::string_view text) {
  if (text == "idle") return WorkerPriority::kIdle;
  if (text == "normal") return WorkerPriority::kNormal;
  return std::nullopt;
}

std::string scheduling_of(pid_t pid) {
  const int policy = ::sched_getscheduler(pid);
  if (policy < 0) return "unknown (" + errno_text("sched_getscheduler") + ")";
  switch (policy & ~SCHED_RESET_ON_FORK) {
    case SCHED_IDLE: return "SCHED_IDLE";
    case SCHED_BATCH:
    case SCHED_OTHER: {
      errno = 0;
      const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(pid));
      if (nice == -1 && errno != 0) return "unknown (" + errno_text("getpriority") + ")";
      return std::string((policy & ~SCHED_RESET_ON_FORK) == SCHED_BATCH ? "SCHED_BATCH" : "SCHED_OTHER") + " nice " +
             std::to_string(nice);
    }
    case SCHED_FIFO:
    case SCHED_RR: {
      sched_param param{};
      const int prio = ::sched_getparam(pid, &param) == 0 ? param.sched_priority : -1;
      return std::string((policy & ~SCHED_RESET_ON_FORK) == SCHED_FIFO ? "SCHED_FIFO " : "SCHED_RR ") +
             std::to_string(prio);
    }
    default: return "scheduling policy " + std::to_string(policy);
  }
}

// The ZeroMQ side of one worker: a context, a PAIR socket bound in a private directory (removed
// with it).
struct WorkerProcess::Channel {
  std::string dir;
  std::string endpoint;
  zmq::context_t context;
  zmq::socket_t socket{context, zmq::socket_type::pair};

  ~Channel() {
    socket.close();
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

  // One message without waiting; false when none could be read (the caller polls again).
  bool receive(std::string& bytes) {
    zmq::message_t msg;
    try {
      if (!socket.recv(msg, zmq::recv_flags::dontwait)) return false;
    } catch (const zmq::error_t&) {
      return false;
    }
    bytes = msg.to_string();
    return true;
  }

  // Sends (waiting at most the send timeout for the worker); false with `why`.
  bool send(const std::string& bytes, std::string& why) {
    try {
      if (socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none)) return true;
      why = "the worker did not take it within 30 s";
    } catch (const zmq::error_t& e) {
      why = e.what();
    }
    return false;
  }

  static StatusOr<std::unique_ptr<Channel>> open() {
    auto c = std::make_unique<Channel>();
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    std::string base = (runtime != nullptr && *runtime == '/') ? runtime : "/tmp";
    std::string tmpl = base + "/kforge-eval-XXXXXX";
    if (tmpl.size() + 16 > 100) tmpl = "/tmp/kforge-eval-XXXXXX";   // ipc paths must fit sun_path
    if (::mkdtemp(tmpl.data()) == nullptr) return unavailable(errno_text(("mkdtemp " + tmpl).c_str()));
    c->dir = tmpl;
    c->endpoint = "ipc://" + c->dir + "/worker.sock";
    try {
      c->socket.set(zmq::sockopt::linger, 0);
      c->socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxEvalMessageBytes));
      c->socket.set(zmq::sockopt::sndtimeo, 30000);
      c->socket.bind(c->endpoint);
    } catch (const zmq::error_t& e) {
      return unavailable("cannot bind " + c->endpoint + ": " + e.what());
    }
    return c;
  }
};

std::string WorkerOptions::default_program() {
  if (const char* p = std::getenv("KFORGE_WORKER"); p != nullptr && *p != '\0') return p;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kforge-worker";
  // Beside the program (the bundle's bin/), else a build tree's search_daemon/ next to its bench/.
  const std::filesystem::path beside = self.parent_path() / "kforge-worker";
  const std::filesystem::path build_tree = self.parent_path().parent_path() / "search_daemon" / "kforge-worker";
  if (!std::filesystem::exists(beside, ec) && std::filesystem::exists(build_tree, ec)) return build_tree.string();
  return beside.string();
}

WorkerProcess::WorkerProcess(WorkerOptions options) : options_(std::move(options)) {}

WorkerProcess::~WorkerProcess() { stop(true); }

std::string WorkerProcess::stop(bool kill_first) {
  std::string how;
  if (pid_ > 0) {
    if (kill_first) ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    how = r == pid_ ? describe_wait_status(status) : "could not be reaped";
  }
  pid_ = -1;
  if (alive_fd_ >= 0) ::close(alive_fd_);
  alive_fd_ = -1;
  ready_.reset();
  // A fresh socket for the next worker: nothing the dead one queued can reach its successor.
  channel_.reset();
  return how;
}

Status WorkerProcess::start() {
  if (pid_ > 0) return Status();
  if (options_.program.empty()) return invalid_argument("no kforge-worker program given");
  if (options_.build_cache_dir.empty()) return invalid_argument("no build cache directory given");
  KFORGE_ASSIGN_OR_RETURN(channel_, Channel::open());

  // Everything the child needs is built before fork: between fork and exec only async-signal-safe
  // calls are allowed (the daemon has other threads).
  std::vector<std::string> args = {options_.program, "--endpoint", channel_->endpoint, "--device", options_.device,
                                   "--build-cache", options_.build_cache_dir};
  int life[2];
  if (::pipe2(life, O_CLOEXEC) != 0) return unavailable(errno_text("pipe2"));
  args.push_back("--alive-fd");
  args.push_back(std::to_string(life[1]));
  for (const std::string& a : options_.extra_args) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool overridden = false;
    for (const auto& [k, v] : options_.env) overridden = overridden || kv.substr(0, kv.find('=')) == k;
    if (!overridden) env_strings.emplace_back(kv);
  }
  for (const auto& [k, v] : options_.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const bool idle = options_.priority == WorkerPriority::kIdle;

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(life[0]);
    ::close(life[1]);
    return unavailable(errno_text("fork"));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    if (idle) lower_priority_in_child();
    ::fcntl(life[1], F_SETFD, 0);   // the write end survives exec: the worker holds it until it dies
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(life[1]);
  pid_ = pid;
  alive_fd_ = life[0];
  ++starts_;

  // Wait for WorkerReady, or the worker's end.
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(options_.start_budget_ms);
  for (;;) {
    zmq_pollitem_t items[2] = {{channel_->socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, alive_fd_, ZMQ_POLLIN, 0}};
    const int n = zmq_poll(items, 2, ms_until(deadline));
    if (n < 0 && zmq_errno() == EINTR) continue;
    if (n < 0) {
      const std::string err = zmq_strerror(zmq_errno());
      stop(true);
      return unavailable("zmq_poll: " + err);
    }
    if (n == 0) {
      stop(true);
      return unavailable(options_.program + " did not report ready within " + std::to_string(options_.start_budget_ms) +
                         " ms and was killed");
    }
    if (items[0].revents & ZMQ_POLLIN) {
      std::string bytes;
      if (!channel_->receive(bytes)) continue;
      StatusOr<EvalMessage> m = decode_eval_message(bytes);
      if (!m.ok() || !std::holds_alternative<WorkerReady>(*m)) {
        stop(true);
        return unavailable("the worker's first message is not WorkerReady: " +
                           (m.ok() ? std::string("another message type") : m.status().message()));
      }
      ready_ = std::get<WorkerReady>(std::move(*m));
      return Status();
    }
    if (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
      const std::string how = stop(false);
      return unavailable(options_.program + " " + how + " before it was ready (its stderr says why)");
    }
  }
}

EvalResult WorkerProcess::failure(const EvalJob& job, EvalStatus status, std::string message, std::string phase) const {
  EvalResult r;
  r.job_id = job.job_id;
  r.status = status;
  r.message = std::move(message);
  r.phase = std::move(phase);
  return r;
}

EvalResult WorkerProcess::evaluate(const EvalJob& job) {
  phase_ms_.clear();
  phase_ = "start";
  phase_start_ = Clock::now();
  EvalResult r = run_job(job);
  enter_phase("");
  return r;
}

void WorkerProcess::enter_phase(const std::string& next) {
  const Clock::time_point now = Clock::now();
  phase_ms_.emplace_back(phase_, std::chrono::duration<double, std::milli>(now - phase_start_).count());
  phase_ = next;
  phase_start_ = now;
}

EvalResult WorkerProcess::run_job(const EvalJob& job) {
  if (Status s = start(); !s.ok()) return failure(job, EvalStatus::kWorkerError, "cannot start the worker: " + s.message(), "start");
  const pid_t worker_pid = pid_;

  const std::string bytes = encode(EvalMessage(job));
  if (std::string err; !channel_->send(bytes, err)) {
    stop(true);
    return failure(job, EvalStatus::kWorkerError, "cannot send the job to the worker: " + err, "start");
  }

  std::string phase = "start";
  uint32_t budget = options_.start_budget_ms;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(budget);
  for (;;) {
    zmq_pollitem_t items[2] = {{channel_->socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, alive_fd_, ZMQ_POLLIN, 0}};
    const int n = zmq_poll(items, 2, ms_until(deadline));
    if (n < 0 && zmq_errno() == EINTR) continue;
    if (n < 0) {
      const std::string err = zmq_strerror(zmq_errno());
      stop(true);
      return failure(job, EvalStatus::kWorkerError, "zmq_poll: " + err, phase);
    }
    if (n == 0) {
      stop(true);
      EvalResult r = failure(job, EvalStatus::kTimeout,
                             "no result within the " + phase + " budget of " + std::to_string(budget) +
                                 " ms: the worker was killed",
                             phase);
      r.worker_pid = worker_pid;
      return r;
    }
    // Messages first: a result that arrived just before the worker exited still counts.
    if (items[0].revents & ZMQ_POLLIN) {
      std::string in;
      if (!channel_->receive(in)) continue;
      StatusOr<EvalMessage> m = decode_eval_message(in);
      if (!m.ok()) {
        stop(true);
        return failure(job, EvalStatus::kWorkerError, "the worker sent a malformed message: " + m.status().message(), phase);
      }
      if (auto* p = std::get_if<JobPhase>(&*m)) {
        if (p->job_id != job.job_id) continue;
        enter_phase(p->phase);
        phase = p->phase;
        budget = p->budget_ms;
        deadline = Clock::now() + std::chrono::milliseconds(static_cast<uint64_t>(budget) + options_.grace_ms);
        continue;
      }
      if (auto* r = std::get_if<EvalResult>(&*m)) {
        if (r->job_id != job.job_id) continue;   // a stale answer; cannot happen with one job in flight
        EvalResult out = std::move(*r);
        out.worker_pid = worker_pid;
        // A fault the worker reported itself (a sticky CUDA error leaves its context unusable):
        // this worker is done; the next job gets a new one.
        if (out.status == EvalStatus::kFault) stop(true);
        return out;
      }
      continue;
    }
    if (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
      const std::string how = stop(false);
      // Note [Whose fault is a death in measure] in worker/measurer.cc: PyTorch's kernel alone.
      EvalResult r = phase == "baseline"
                         ? failure(job, EvalStatus::kWorkerError,
                                   "the worker " + how + " while PyTorch's own kernel ran alone (before any timed "
                                   "candidate call): not the candidate's doing",
                                   phase)
                         : failure(job, EvalStatus::kFault, "the worker " + how + " during " + phase, phase);
      r.worker_pid = worker_pid;
      return r;
    }
  }
}

}  // namespace kforge::eval

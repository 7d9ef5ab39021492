// WorkerProcess: one supervised kforge-worker, the isolation boundary around candidate code.
// The daemon (and the tests, and bench/) evaluate candidates only through this class: it spawns
// the worker, sends one job at a time, and watches it with a watchdog, so a candidate that hangs,
// traps or corrupts the worker costs that worker only, and comes back as an ordinary EvalResult.
//
//   WorkerOptions o;
//   o.program = WorkerOptions::default_program();     // kforge-worker beside this executable
//   o.device = "cpu";                                 // or "cuda:0"
//   o.build_cache_dir = cache_dir + "/builds";
//   WorkerProcess w(o);
//   EvalResult r = w.evaluate(job);                   // never throws, always returns a result
//   if (r.status == EvalStatus::kTimeout) ...         // the worker was killed and will be restarted
//
// Promises:
// - The channel is a ZeroMQ PAIR socket over ipc in a fresh 0700 directory of its own (mkdtemp),
//   removed with the object. The worker dies with its supervisor (PR_SET_PDEATHSIG).
// - Watchdog: the worker announces each phase of a job (JobPhase: build, verify, measure) with its
//   budget; a phase that has not ended when its budget plus `grace_ms` runs out gets the worker
//   SIGKILLed: result kTimeout, naming the phase and the budget. Before the first phase message
//   the job has `start_budget_ms`.
// - Death: the worker holds the write end of a pipe; its death (any signal, any exit) closes it,
//   which wakes the supervisor at once (no polling). Result kFault naming the signal and phase
//   ("the worker died of SIGSEGV during verify").
// - After a timeout, a death or a malformed message the worker is gone; the next evaluate()
//   starts a new one (starts() counts them). A worker that cannot start is kWorkerError with the
//   reason, and the next evaluate() tries again.
// - Priority: by default the worker, and everything it starts (python, torch's threads, the
//   compilers), runs at idle priority (Note [Idle workers]); WorkerPriority::kNormal leaves it at
//   the supervisor's own.
// - One thread at a time: evaluate() is not reentrant (the pool gives each worker one thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/status.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::eval {

// Note [Idle workers]
// A worker shares the host's cores with the serving processes it searches for (every CPU worker;
// a GPU worker too, for its compiles, python and launches). At normal priority a search took a
// quarter of a 2-core host's serving throughput (issue 21), which is the opposite of what kforge is
// for. So by default the worker is started at SCHED_IDLE (sched_setscheduler in the child, before
// exec, so python, every torch thread and every compiler it starts inherit it): it runs only on
// cycles no normal process wants. Where the kernel refuses SCHED_IDLE (a seccomp filter, an old
// kernel) the child falls back to nice 19, which still yields nearly all of a contended core; the
// worker says which it got in its WorkerReady note (scheduling_of). A dedicated staging host, where
// nothing else runs, can choose WorkerPriority::kNormal (workers.priority = "normal").
// Thread counts are bounded as well (the pool sets KFORGE_WORKER_CPU_THREADS, OMP_NUM_THREADS and
// MKL_NUM_THREADS alike; a CPU compile is one driver process, and builder refuses parallel LTO),
// so an idle worker never holds more runnable threads than its slot's cores.
//
// Why idle priority keeps speedups honest. A worker at SCHED_IDLE loses its core whenever a
// serving thread wakes, for as long as that thread runs; a timed call that lost its core is longer
// by that time, and the longer side of a pair is the likelier to be hit, so stalls would not fall
// on both sides alike. (1) Note [Preempted pairs] in worker/measurer.h: a round in which a thread
// of the worker was preempted while either side was timed is timed again. (2) Note [Paired timing]
// in worker/timing_stats.h: PyTorch's kernel and the candidate are timed back to back in
// alternating order and the speedup is the median of the paired ratios, so the odd disturbed round
// that stays moves nothing, and load that comes and goes over many rounds hits both sides alike.
// (3) Many disturbed rounds widen the median's interval: the speedup is then not significant and
// is not published. (4) Note [Plausible timing] in worker/measurer.h: a PyTorch time far over the
// cost model, or over what the serving processes observe, is measured again and never published.
// What idle priority costs is search time (a busy host leaves the worker few cycles) and, under
// sustained contention, phase budgets: the watchdog counts wall time, so a starved phase can end
// in kTimeout (workers.compile_budget_ms and run_budget_ms are generous for this reason).
enum class WorkerPriority : uint8_t {
  kIdle,     // SCHED_IDLE, else nice 19 (the default)
  kNormal,   // whatever the supervisor runs at
};
// "idle", "normal"
std::string_view worker_priority_name(WorkerPriority p);
// From "idle" / "normal"; nullopt for anything else.
std::optional<WorkerPriority> parse_worker_priority(std::string_view text);
// How process `pid` (0: this one) is scheduled, as the logs and WorkerReady's note say it:
// "SCHED_IDLE", "SCHED_OTHER nice 19", "SCHED_FIFO 10"; "unknown (<why>)" when it cannot be read.
std::string scheduling_of(pid_t pid);

struct WorkerOptions {
  std::string program;                 // the kforge-worker launcher
  std::string device = "cpu";          // "cpu" or "cuda:<ordinal>"
  std::string build_cache_dir;         // required: the builder's cache (created if missing)
  std::vector<std::string> extra_args; // appended to the worker's command line
  std::vector<std::pair<std::string, std::string>> env;   // set in the worker's environment
  uint32_t start_budget_ms = 120000;   // until WorkerReady (python, torch import, CUDA init)
  uint32_t grace_ms = 2000;            // watchdog slack over each phase's own budget
  WorkerPriority priority = WorkerPriority::kIdle;   // Note [Idle workers]

  // $KFORGE_WORKER, else kforge-worker in the directory of the running executable (else, in a build
  // tree, ../search_daemon/kforge-worker).
  static std::string default_program();
};

class WorkerProcess {
 public:
  explicit WorkerProcess(WorkerOptions options);
  ~WorkerProcess();   // kills the worker (SIGKILL) and reaps it; removes the socket directory
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Starts the worker now if none is running; evaluate() does this itself.
  Status start();
  // Runs one job to its result (see the promises above).
  EvalResult evaluate(const EvalJob& job);

  bool running() const noexcept { return pid_ > 0; }
  pid_t pid() const noexcept { return pid_; }
  uint64_t starts() const noexcept { return starts_; }
  // What the running worker said when it started (nullopt when none is running).
  const std::optional<WorkerReady>& ready() const noexcept { return ready_; }
  // The last evaluate()'s wall time per phase, as this side saw the worker's phase messages:
  // "start" (until the first, a worker start included), then each phase the worker entered
  // ("build", "verify", "baseline", "measure"), in order. Where an evaluation's time goes
  // (bench_search prints the medians).
  const std::vector<std::pair<std::string, double>>& last_phase_ms() const noexcept { return phase_ms_; }

 private:
  struct Channel;
  // Kills and reaps the worker; returns how it ended ("killed by SIGKILL", "exited with status 3").
  std::string stop(bool kill_first);
  EvalResult failure(const EvalJob& job, EvalStatus status, std::string message, std::string phase) const;
  // evaluate() without the phase bookkeeping; enter_phase closes the running phase's time.
  EvalResult run_job(const EvalJob& job);
  void enter_phase(const std::string& next);

  WorkerOptions options_;
  std::unique_ptr<Channel> channel_;
  pid_t pid_ = -1;
  int alive_fd_ = -1;   // read end of the worker's life pipe: readable (EOF) once it is gone
  uint64_t starts_ = 0;
  std::optional<WorkerReady> ready_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  std::string phase_;
  std::chrono::steady_clock::time_point phase_start_;
};

}  // namespace kforge::eval

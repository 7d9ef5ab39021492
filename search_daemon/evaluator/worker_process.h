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
// - One thread at a time: evaluate() is not reentrant (the pool gives each worker one thread).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/status.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::eval {

struct WorkerOptions {
  std::string program;                 // the kforge-worker launcher
  std::string device = "cpu";          // "cpu" or "cuda:<ordinal>"
  std::string build_cache_dir;         // required: the builder's cache (created if missing)
  std::vector<std::string> extra_args; // appended to the worker's command line
  std::vector<std::pair<std::string, std::string>> env;   // set in the worker's environment
  uint32_t start_budget_ms = 120000;   // until WorkerReady (python, torch import, CUDA init)
  uint32_t grace_ms = 2000;            // watchdog slack over each phase's own budget

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

 private:
  struct Channel;
  // Kills and reaps the worker; returns how it ended ("killed by SIGKILL", "exited with status 3").
  std::string stop(bool kill_first);
  EvalResult failure(const EvalJob& job, EvalStatus status, std::string message, std::string phase) const;

  WorkerOptions options_;
  std::unique_ptr<Channel> channel_;
  pid_t pid_ = -1;
  int alive_fd_ = -1;   // read end of the worker's life pipe: readable (EOF) once it is gone
  uint64_t starts_ = 0;
  std::optional<WorkerReady> ready_;
};

}  // namespace kforge::eval

// EvaluatorPool: the Evaluator kforged runs (evaluator.h): the daemon's evaluation slots, one
// supervised kforge-worker each (one per GPU, so no two timing runs ever share a GPU; CPU slots as
// configured), and the queue that feeds them.
//
//   EvaluatorPool pool({.devices = {"cuda:0", "cpu"}, .cpu_slots = 1, .program = ..., .build_cache_dir = ...});
//   pool.start();                                     // workers start in the background
//   pool.set_serving_gpus({{"GPU-5e2a...", {4242}}}); // the daemon, as hooks report
//   pool.submit(job, [](EvalResult r, JobPlacement where) { ... });   // on the slot's thread
//   size_t n = pool.idle_slots_for(sig);              // how many jobs for `sig` could start now
//
// Promises:
// - Each slot owns one WorkerProcess on its own thread; a job runs on a slot whose device matches
//   the job's signature (backend, and for CUDA the arch its worker reported). Jobs for a signature
//   no slot can run come back at once as kWorkerError saying so.
// - Among the idle slots that can run a job, it goes to one whose GPU no serving process uses
//   (set_serving_gpus; GPUs named by the UUID the slot's worker reported), else to the one whose
//   GPU the fewest use, the earliest slot on a tie (choose_slot). A busy slot is never waited for.
// - The callback learns where the job ran (JobPlacement): the slot, its GPU's UUID, and the serving
//   processes using that GPU when the slot handed the job to its worker or when the result came
//   back (the union: a process that attached or left meanwhile counts).
// - submit() never blocks and never throws; every submitted job gets exactly one callback, also
//   when the pool stops (kWorkerError "the daemon is stopping").
// - A worker that dies (a candidate's fault, a hang killed by the watchdog) is replaced by the
//   slot on its next job (WorkerProcess does it); restarts are counted.
// - "auto" means every GPU the CUDA driver shows (CUDA_VISIBLE_DEVICES applies), plus cpu when
//   cpu_slots > 0.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/evaluator/evaluator.h"
#include "search_daemon/evaluator/worker_process.h"

namespace kforge::eval {

struct PoolOptions {
  std::vector<std::string> devices = {"auto"};
  uint32_t cpu_slots = 1;
  std::string program;                   // kforge-worker
  std::string python;                    // KFORGE_PYTHON for the workers ("" = theirs)
  // Torch threads of each CPU worker, pinned to as many cores of their own (Note [Pinned CPU
  // workers]); 0: the daemon's cores divided among the CPU slots.
  uint32_t cpu_threads = 0;
  // Every worker's priority (Note [Idle workers] in worker_process.h); a GPU worker's torch and
  // OpenMP threads are bounded by cpu_threads too (1 when it is 0: its host side only launches).
  WorkerPriority priority = WorkerPriority::kIdle;
  std::string build_cache_dir;
  std::function<void(const std::string&)> log;   // one line per event worth an operator's eyes
};

struct SlotInfo {
  std::string device;                    // "cpu", "cuda:0"
  std::string state;                     // "starting", "idle", "busy", "failed: <why>"
  std::string arch;                      // from WorkerReady ("sm_90", "x86_64-avx2")
  std::string device_model;
  std::string uuid;                      // from WorkerReady: the GPU's UUID ("" for cpu, or unknown)
  std::vector<int> cpus;                 // a CPU slot's cores, its worker pinned to them (Note [Pinned CPU workers])
  uint64_t jobs = 0;
  uint64_t restarts = 0;                 // worker starts beyond the first
  double bandwidth_bytes_per_s = 0;
};

// Note [Pinned CPU workers]
// A CPU timing is only as fair as the conditions baseline and candidate run under. Each CPU slot's
// worker is pinned (sched_setaffinity, by the kforge-worker launcher) to cores of its own, with
// exactly that many torch threads, each bound to one core (OMP_PROC_BIND=close,
// OMP_PLACES=threads): PyTorch's kernel and the candidate run on one fixed set of cores, thread
// for thread, whatever torch's default would be, and two CPU slots never share a core while there
// are cores enough. The cores are those the daemon itself may run on (its affinity mask), taken
// in order: slot i gets n of them starting at i*n (wrapping round when there are fewer), n =
// workers.cpu_threads, or, when it is 0, the cores divided among the slots: half of them when
// the workers share the host with serving processes (workers.priority idle, the default), all of
// them on a host that only searches (normal). Half, because a worker's threads on every core
// reach the serving process even at SCHED_IDLE: on a 2-core VM, torchvision swin_t (one torch
// thread) ran +64.5% slower per step while a worker pinned to both cores searched, +8.5% with the
// worker on one core (bench/swin_serving.py; a SCHED_IDLE spin loop on the other core costs it
// nothing measurable: the wakeups of a worker's threads on the serving core do). Contention from
// other processes on those cores remains; Note [Plausible timing] in worker/measurer.h catches
// what it breaks.
std::vector<std::vector<int>> cpu_slot_cores(const std::vector<int>& allowed, uint32_t slots, uint32_t threads,
                                             bool share_host = true);
// The caches of `core` as sysfs describes them (/sys/devices/system/cpu/cpu<core>/cache):
// "L1d 48 KiB, L2 2 MiB per core; L3 480 MiB shared by 2 cores"; empty when sysfs says nothing.
// `root` replaces /sys/devices/system/cpu for tests.
std::string cpu_cache_text(int core, const std::string& root = "/sys/devices/system/cpu");
// The cores this process may run on (sched_getaffinity), in order.
std::vector<int> allowed_cpus();
// "0,1,4": a core list, as KFORGE_WORKER_CPUS and the logs write it.
std::string cpu_list(const std::vector<int>& cpus);

// One idle slot that could take a job: its index and how many serving processes use its GPU.
struct SlotCandidate {
  size_t slot = 0;
  size_t serving_processes = 0;
};
// The slot that takes the job: the fewest serving processes on its GPU (none, preferably), the
// earliest in `idle` on a tie. `idle` must not be empty.
size_t choose_slot(const std::vector<SlotCandidate>& idle);

class EvaluatorPool final : public Evaluator {
 public:
  explicit EvaluatorPool(PoolOptions options);
  ~EvaluatorPool() override;   // stop()
  EvaluatorPool(const EvaluatorPool&) = delete;
  EvaluatorPool& operator=(const EvaluatorPool&) = delete;

  // Resolves the devices and starts one thread (and worker) per slot. Fails for a device that does
  // not exist; a worker that fails to start is a slot in state "failed: ..." (retried per job).
  Status start();
  void submit(EvalJob job, Done done) override;
  // Slots that could take a job for `sig` and have nothing queued or running.
  size_t idle_slots_for(const OpSignature& sig) const override;
  // Slots that could ever take a job for `sig`.
  size_t slots_for(const OpSignature& sig) const;
  std::vector<SlotInfo> slots() const;
  // Blocks until every slot's worker has made its first start, ready ("idle") or not ("failed:
  // ..."), or until `timeout`; true if they all have. For tools that must know the slots' archs
  // before they submit (the daemon never waits: it submits and the slots pick up).
  bool wait_started(std::chrono::milliseconds timeout);
  // The serving processes (pids) using each GPU, by UUID: replaces what was set before. The daemon
  // calls it whenever the hooks' reports change it. Thread-safe; never calls back.
  void set_serving_gpus(std::map<std::string, std::vector<int32_t>> pids_by_uuid);
  // The measured copy bandwidth of a slot that runs `sig` (0 if none reported yet).
  double bandwidth_for(const OpSignature& sig) const;
  // What a kernel writer needs to know of the device that times sig's candidates, as a sentence or
  // two for a prompt: the model and ISA or arch, and for a CPU the threads and cores the worker
  // uses and the caches of its first core (cpu_cache_text). Empty until a matching worker is ready.
  std::string device_facts_for(const OpSignature& sig) const;
  // Fails every queued job, stops the threads and kills the workers.
  void stop();

 private:
  struct Slot;
  bool matches(const Slot& s, const OpSignature& sig) const;
  // Under mu_: whether `s` is the slot choose_slot picks for `sig` among the idle ones.
  bool chosen_for(const Slot& s, const OpSignature& sig) const;
  // Under mu_: who uses the GPU of `s` now.
  const std::vector<int32_t>* serving_on(const Slot& s) const;
  void run_slot(Slot& s);

  PoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<EvalJob, Done>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::map<std::string, std::vector<int32_t>> serving_;   // set_serving_gpus
  bool stopping_ = false;
};

}  // namespace kforge::eval

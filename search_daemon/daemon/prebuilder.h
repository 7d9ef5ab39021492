// Prebuilder: compiles a search's upcoming CUDA template candidates into the build cache the
// workers read, on the daemon's own threads at idle priority, while the GPU worker verifies and
// times other candidates (Note [Builds ahead]).
//
//   Prebuilder pre({.cache_dir = state_dir + "/builds", .threads = 4});
//   pre.hint(move.spec, "sm_90");    // never blocks, never throws
//   Prebuilder::Stats s = pre.stats();
//
// Note [Builds ahead]
// ~~~~~~~~~~~~~~~~~~~
// An evaluation is mostly its build: on an H100 a split-softmax candidate took 1136 ms, 1027 of them
// in NVRTC (bench_search, bench/results/2026-12-07-h100-demo-e2e-split-0ca206b.log), and the GPU
// worker builds, verifies and times one candidate after the other, so the GPU waits on the
// compiler. The search knows more than the candidate it submits: expanding a node adds its untried
// siblings to the tree (journaled before anything is evaluated), and MCTS holds back the rest of
// a proposal until progressive widening admits it (SearchStrategy::upcoming); those are what the
// search evaluates next. The session hands their specs to the prebuilder, which compiles
// it with the workers' own CandidateBuilder into the same build cache, under the same key (the
// spec, the arch, NVRTC's major.minor): the worker's build is then a cache hit. A worker that gets
// a candidate before its prebuild ends builds it itself, as without a prebuilder; both write the
// same entry (build_cache.cc's writes are whole or nothing).
//   - Template moves only. Their source is ours, and every family compiles in the test suite; a
//     language model's source is untrusted and is only ever compiled inside the isolated worker,
//     where a compiler that crashes or hangs costs one evaluation (here it would cost the daemon).
//   - CUDA only: a CPU candidate's compiler runs in its worker, pinned to the worker's cores.
//   - The threads run at SCHED_IDLE (nice 19 where that is refused), as the workers do, so the
//     builds use only cycles the serving processes leave.
//   - The newest hint is built first, and the queue keeps the kMaxQueued newest (an older hint is
//     for a part of the tree the search has moved away from); the session hints an expansion's
//     nodes lowest prior first, so its most promising one is built first. A spec already built
//     or queued is not queued again. The candidates a session submits are not hinted: their
//     worker builds them at once.
//   - A failed build is only counted: the worker builds it again and reports the error.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge::daemon {

struct PrebuilderOptions {
  std::string cache_dir;       // the workers' build cache (EvaluatorPool's build_cache_dir)
  uint32_t threads = 1;        // 0: no prebuilding (hint() only counts)
  bool idle_priority = true;   // SCHED_IDLE threads (Note [Builds ahead])
  uint32_t compile_budget_ms = 60000;
};

class Prebuilder {
 public:
  static constexpr size_t kMaxQueued = 64;
  // Specs remembered as built or queued; past it the memory starts over (a repeat is only a
  // cache hit).
  static constexpr size_t kMaxRemembered = 1u << 16;

  struct Stats {
    uint64_t hinted = 0;     // hint() calls for CUDA template specs
    uint64_t queued = 0;     // of those, queued (not seen before)
    uint64_t dropped = 0;    // pushed out of a full queue before a thread took them
    uint64_t built = 0;      // compiled by a prebuild thread (cache misses it filled)
    uint64_t cached = 0;     // already in the cache when a thread took them
    uint64_t failed = 0;     // compile errors, refused options, no NVRTC for the arch
    double build_ms = 0;     // summed over `built`
  };

  // Starts the threads. NVRTC is loaded on first use; where there is none, every hint is counted
  // as failed and nothing else happens.
  explicit Prebuilder(PrebuilderOptions options);
  ~Prebuilder();   // drops what is queued and waits for the builds in progress
  Prebuilder(const Prebuilder&) = delete;
  Prebuilder& operator=(const Prebuilder&) = delete;

  // Queues `spec` for a build for `arch` ("sm_90") if it is a CUDA spec from the template
  // proposer (`proposer` == "template") not seen before. Never blocks on a build.
  void hint(const KernelSpec& spec, const std::string& proposer, const std::string& arch) noexcept;

  Stats stats() const;

  // Waits until the queue is empty and no build is in progress (tests, benchmarks).
  void drain();

 private:
  struct Item {
    KernelSpec spec;
    int sm_major = 0;
    int sm_minor = 0;
  };
  void run();

  PrebuilderOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // work queued, or stopping
  std::condition_variable idle_cv_;   // the queue emptied and no build runs
  std::deque<Item> queue_;
  std::unordered_set<std::string> seen_;   // KernelSpec::id() hex of what was queued
  uint32_t busy_ = 0;
  bool stopping_ = false;
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace kforge::daemon

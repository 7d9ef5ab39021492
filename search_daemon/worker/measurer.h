// The measurer: how much faster a verified candidate is than PyTorch's own kernel for one signature,
// and whether the difference is real (Note [Paired timing] in timing_stats.h).
//
//   MeasureRun m = measure(device, candidate, request);
//   if (m.timing.significant && m.timing.speedup > 1) ...
//
// Note [Measurement]
// Baseline: PyTorch's kernel for the signature's dispatch key (CPU or CUDA), called through the
// dispatcher below autograd, exactly the kernel the hook replaces; it allocates its outputs as it
// always does. Candidate: outputs and scratch from torch's allocator, then the plan's launches,
// exactly what the hook's active path does. Each of max(measure_runs, 30) rounds times both, in
// alternating order, each after the device's caches were flushed (EvalDevice::flush_caches), on
// one of several input sets in rotation (fresh normal draws, as many as fit 128 MiB, 2 to 8), so
// neither side is timed on inputs the cache still holds. CUDA times are device times: the summed
// durations of the kernels each side ran, from CUPTI (Note [Kernel time] in cupti_timer.h), or where
// CUPTI is unavailable the time between two events on the stream (launch overhead on the host is not
// counted, on either side); CPU times are steady_clock around the call. warmup_runs rounds before
// are not counted. The achieved bandwidth and FLOP rate use the catalog's fewest bytes and FLOPs
// (runtime/op_catalog.h) over the candidate's median time.
//
// Note [Plausible timing]
// A speedup is only as good as the two times it divides. On a shared host a CPU timing can go
// wrong by orders of magnitude: a torch thread that loses its core for a time slice stalls an
// OpenMP region of PyTorch's kernel at its barrier, while a candidate that happens not to fork
// runs on; a 2-core VM under a busy serving process once measured PyTorch's layer_norm on a
// [64,128] float32 input at 16 ms against 62 us for the candidate, and published 239x. So each
// timing is held against the cost model: the op must move the catalog's bytes at no more than the
// device's measured copy bandwidth and costs at least one smallest call (EvalDevice's call
// floor, measured at start the same way). expected = bytes / ceiling + call floor. The model is
// memory-only and optimistic: PyTorch's kernels for awkward shapes (a row of 3, one CPU thread)
// run tens of times over it, so the ratio allowed (search.max_baseline_model_ratio) is generous,
// and the serving processes' own observation is the tighter check. The timing is implausible
// when PyTorch's median is over policy.max_baseline_model_ratio x expected (a baseline that slow
// is a broken measurement, not a slow kernel), or the candidate's median is under a quarter of
// the memory floor (bytes / ceiling: a kernel can beat the copy a little, its writes still in the
// L2 when it ends, but not by 4x; timing_stats.h's implausibility()). An implausible timing is measured again, up to kMaxTimingAttempts in all; one
// that stays implausible comes back with TimingOutcome::implausible saying why, and the daemon
// never publishes it (it also checks the baseline against what the serving processes observe:
// search_daemon/daemon/search_session.h). CPU workers are pinned to their own cores with a fixed
// number of torch threads (workers.cpu_threads), so baseline and candidate at least share one
// condition.
//
// Note [Preempted pairs]
// Workers run at idle priority (Note [Idle workers] in evaluator/worker_process.h), so a serving
// process that wakes takes the worker's core at once, for as long as it wants it. A timed call
// that lost its core is longer by the time the core was away, which has nothing to do with the
// kernel, and the side that runs longer is the likelier one to be hit, so under steady contention
// such stalls would not fall on both sides alike. Each round therefore reads the process's
// involuntary context switches (getrusage: every thread, torch's pool included) around each timed
// interval, and a round in which either side was preempted is timed again, up to kMaxRoundRetries
// times; a round that cannot be timed undisturbed is kept (on a host that busy the paired median,
// its confidence interval and the plausibility checks above are what remains). The check runs on
// CUDA workers too: a preempted launch thread leaves the GPU idle inside an event-timed interval.
//
// Note [Measuring within the budget]
// The supervisor kills a worker whose measure phase outlives its budget (workers.run_budget_ms), and
// the evaluation is lost. Retries are what can make an honest measurement that long: on a busy host
// nearly every round is preempted, and a slow baseline is measured again whole (a planted 20 ms
// sleep in PyTorch's kernel on a 2-core host took over 30 s in three attempts of 30 rounds, each
// round timed up to 5 times). So the retries spend what the budget leaves: past half of it no round
// is timed again, and another attempt starts only where one more as long as the last would end
// within 80% of it. A timing cut short this way is the last attempt's, with its implausibility
// still on it: the daemon publishes nothing it could not believe, it just gets the verdict in time.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <string>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/worker/candidate.h"
#include "search_daemon/worker/eval_device.h"

namespace kforge::eval {

struct MeasureRequest {
  const OpSignature* signature = nullptr;
  const ResolvedLaunchPlan* plan = nullptr;
  c10::OperatorHandle op;
  InputPolicy policy;
  uint32_t budget_ms = 0;   // the phase's watchdog (Note [Measuring within the budget]); 0: none
  // Told "baseline" before PyTorch's kernel first runs and "measure" after it returned (Note [Whose
  // fault is a death in measure]); may be empty.
  std::function<void(const char* phase)> on_phase;
};

inline constexpr uint32_t kMaxTimingAttempts = 3;

struct MeasureRun {
  TimingOutcome timing;
  bool fault = false;     // a CUDA error poisoned the context
  std::string error;      // non-empty: no timing (why)
};

MeasureRun measure(EvalDevice& device, const LoadedCandidate& candidate, const MeasureRequest& request);

}  // namespace kforge::eval

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
// counted, on either side); CPU times are steady_clock around the call. warmup_runs rounds before are not counted. The achieved bandwidth
// and FLOP rate use op_cost.h's fewest bytes and FLOPs over the candidate's median time.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

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
};

struct MeasureRun {
  TimingOutcome timing;
  bool fault = false;     // a CUDA error poisoned the context
  std::string error;      // non-empty: no timing (why)
};

MeasureRun measure(EvalDevice& device, const LoadedCandidate& candidate, const MeasureRequest& request);

}  // namespace kforge::eval

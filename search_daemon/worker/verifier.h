// The verifier: decides whether a candidate computes what PyTorch's kernel computes, on every input
// it may see in production, well enough to be put in front of users' traffic. It must hold against
// candidates that cheat, so it checks behaviour, not source.
//
//   VerifyRun v = verify(device, candidate, request);
//   if (v.fault) ...                      // the candidate poisoned the CUDA context: report, exit
//   else if (!v.outcome.failed_check.empty()) ...   // which check, which trial, where, by how much
//
// Note [Verification trials]
// At least kMinTrials trials, each with fresh inputs of the signature's exact dtypes, sizes,
// strides and pointer alignment (trial_data.h): normal, uniform, large magnitude, a large offset,
// all zeros, then the serving process's observed statistics and its captured real tensors when the
// job has them, then more normal draws. The reference of each trial is PyTorch's own kernel on the
// same inputs (called through the dispatcher) and PyTorch's kernel on the inputs converted to
// float64. Each trial runs the candidate 2 + determinism_runs times, into guarded, poisoned buffers
// (Note [Guarded buffers]), and checks, in this order (the first failure ends verification):
//   output_layout      the plan's outputs have PyTorch's dtypes, sizes and strides (before trial 1)
//   launch             the launch itself failed (bad parameters, too many resources)
//   out_of_bounds      a guard zone of an output, scratch buffer or input was written
//   input_modified     an input's bytes changed
//   not_written        an output element still holds the poison
//   async_write        (CUDA) an output changed after the stream was done: work escaped the stream
//   nondeterministic   a run with the blocks in another order (CPU) or simply again (CUDA)
//                      differs bit for bit from the first
//   uninitialized_read a run with scratch, shared memory (CPU) and outputs poisoned differently
//                      differs from the first: the candidate read memory it never wrote
//   stale_output       the output equals the previous trial's bit for bit though PyTorch's differs
//   nan_inf_positions  NaN positions, or Inf positions and signs, differ from PyTorch's output
//   accuracy           Note [Accuracy criterion] in runtime/accuracy.h, over the elements finite
//                      in both PyTorch's output and the reference; non-floating outputs must equal
//                      PyTorch's exactly
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/worker/candidate.h"
#include "search_daemon/worker/eval_device.h"

namespace kforge::eval {

struct VerifyRequest {
  const OpSignature* signature = nullptr;
  const KernelSpec* spec = nullptr;
  const ResolvedLaunchPlan* plan = nullptr;
  c10::OperatorHandle op;
  InputPolicy policy;
  const std::vector<wire::InputStats>* input_stats = nullptr;
  const std::vector<wire::CapturedInputs>* captured = nullptr;
  bool profile = false;   // Note [Verify profile] in verifier.cc
};

struct VerifyRun {
  VerifyOutcome outcome;
  bool fault = false;          // a CUDA error poisoned the context (outcome.detail says which)
  std::string worker_error;    // non-empty: the worker could not verify (not the candidate's fault)
};

VerifyRun verify(EvalDevice& device, const LoadedCandidate& candidate, const VerifyRequest& request);

// PyTorch's kernel on `stack` through the dispatcher; its tensor results. Throws what torch throws.
std::vector<at::Tensor> call_op(const c10::OperatorHandle& op, torch::jit::Stack stack);

}  // namespace kforge::eval

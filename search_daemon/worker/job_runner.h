// JobRunner: one EvalJob to its EvalResult inside kforge-worker: build -> check the plan against
// the device -> verify -> measure. The four verbs of an evaluation, each a separate component
// (builder.h, candidate.h, verifier.h, measurer.h); this file only sequences them and turns every
// outcome into a result value.
//
//   JobRunner runner(device, builder, [&](const JobPhase& p) { send(p); });
//   EvalResult r = runner.run(job);      // never throws
//   if (r.status == EvalStatus::kFault) exit(...);   // the CUDA context is gone
//
// Promises:
// - Before each phase (build, verify, measure) the phase callback announces it with its budget, so
//   the supervisor's watchdog can kill a hang in that phase (worker_process.h).
// - A compile error, a plan that does not fit the signature or the device (kRejected), a failed
//   check (kVerifyFailed, with the check, the trial and the detail), a CUDA error that poisons the
//   context (kFault) are results, never exceptions. kWorkerError means the worker could not judge
//   the candidate (a job for another device, an operator this torch lacks, an internal error).
// - A result that passed carries the built artifact and the worker's environment: everything the
//   daemon needs to publish a cache entry.
#pragma once

#include <functional>

#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/worker/builder.h"
#include "search_daemon/worker/eval_device.h"

namespace kforge::eval {

class JobRunner {
 public:
  using PhaseCallback = std::function<void(const JobPhase&)>;
  JobRunner(EvalDevice& device, const CandidateBuilder& builder, std::string compiler_identity, PhaseCallback on_phase)
      : device_(device), builder_(builder), compiler_(std::move(compiler_identity)), on_phase_(std::move(on_phase)) {}

  EvalResult run(const EvalJob& job);
  // KFORGE_WORKER_PROFILE (worker_config.h): verifications say where their time went.
  void set_verify_profile(bool on) { verify_profile_ = on; }

 private:
  EvalResult run_checked(const EvalJob& job, EvalResult& r);

  EvalDevice& device_;
  const CandidateBuilder& builder_;
  std::string compiler_;
  PhaseCallback on_phase_;
  bool verify_profile_ = false;
};

}  // namespace kforge::eval

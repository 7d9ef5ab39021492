#include "search_daemon/worker/job_runner.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <exception>
#include <optional>

#include "search_daemon/worker/candidate.h"
#include "search_daemon/worker/measurer.h"
#include "search_daemon/worker/verifier.h"

namespace kforge::eval {

namespace {

EvalResult& finish(EvalResult& r, EvalStatus status, std::string message, const char* phase) {
  r.status = status;
  r.message = std::move(message);
  r.phase = phase;
  return r;
}

// The compiler's first diagnostic line, for the one-line message (the whole log travels too).
std::string first_error_line(const std::string& log) {
  size_t pos = 0;
  std::string first;
  while (pos < log.size()) {
    const size_t end = log.find('\n', pos);
    std::string line = log.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (first.empty() && !line.empty()) first = line;
    if (line.find("error") != std::string::npos) return line.substr(0, 300);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return first.substr(0, 300);
}

}  // namespace

EvalResult JobRunner::run(const EvalJob& job) {
  EvalResult r;
  r.job_id = job.job_id;
  r.environment = device_.environment();
  if (!device_.is_cuda()) r.environment.compiler = compiler_;
  r.phase = "start";
  try {
    return run_checked(job, r);
  } catch (const std::exception& e) {
    (void)device_.synchronize();
    if (device_.context_lost()) return finish(r, EvalStatus::kFault, std::string("the CUDA context is lost: ") + e.what(), r.phase.c_str());
    return finish(r, EvalStatus::kWorkerError, std::string("internal error: ") + std::string(e.what()).substr(0, 400),
                  r.phase.c_str());
  }
}

EvalResult JobRunner::run_checked(const EvalJob& job, EvalResult& r) {
  const OpSignature& sig = job.signature;
  const Backend backend = device_.is_cuda() ? Backend::kCuda : Backend::kCpu;
  if (sig.target.backend != backend) {
    return finish(r, EvalStatus::kWorkerError,
                  "a " + std::string(backend_name(sig.target.backend)) + " signature was sent to the " + device_.name() +
                      " worker",
                  "start");
  }
  if (backend == Backend::kCuda && sig.target.arch != device_.environment().arch) {
    return finish(r, EvalStatus::kWorkerError,
                  "the signature is for " + sig.target.arch + " but " + device_.name() + " is " +
                      device_.environment().arch,
                  "start");
  }
  if (job.spec.backend != backend) {
    return finish(r, EvalStatus::kRejected,
                  "the candidate is a " + std::string(backend_name(job.spec.backend)) + " kernel for a " +
                      std::string(backend_name(backend)) + " signature",
                  "start");
  }
  const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(sig.op, sig.overload));
  if (!op) {
    return finish(r, EvalStatus::kWorkerError, "torch " + device_.environment().torch_version + " has no operator " + sig.op + (sig.overload.empty() ? "" : "." + sig.overload), "start");
  }
  size_t tensor_returns = 0;
  for (const c10::Argument& a : op->schema().returns()) {
    if (a.type()->kind() != c10::TypeKind::TensorType) {
      return finish(r, EvalStatus::kWorkerError, sig.op + " returns a non-tensor value; kforge replaces only operators that return tensors", "start");
    }
    ++tensor_returns;
  }

  // Build.
  r.phase = "build";
  on_phase_(JobPhase{job.job_id, "build", job.compile_budget_ms});
  StatusOr<BuildOutput> built = builder_.build(job.spec, job.compile_budget_ms);
  if (!built.ok()) return finish(r, EvalStatus::kWorkerError, "the build failed: " + built.status().message(), "build");
  r.build_log = built->log.substr(0, kMaxLogBytes);
  r.build_cached = built->cached;
  r.build_ms = built->build_ms;
  if (!built->compiled) {
    return finish(r, EvalStatus::kCompileError, "compile error: " + first_error_line(built->log), "build");
  }
  r.artifact_name = built->artifact_name;
  r.artifact = built->artifact;

  // The plan against the signature and the device.
  StatusOr<ResolvedLaunchPlan> plan = job.spec.resolve(sig);
  if (!plan.ok()) {
    return finish(r, EvalStatus::kRejected, "the launch plan does not fit the signature: " + plan.status().message(), "build");
  }
  if (plan->outputs.size() != tensor_returns) {
    return finish(r, EvalStatus::kRejected,
                  "the plan makes " + std::to_string(plan->outputs.size()) + " outputs but " + sig.op + " returns " +
                      std::to_string(tensor_returns),
                  "build");
  }
  for (size_t i = 0; i < plan->launches.size(); ++i) {
    const int64_t smem = plan->launches[i].shared_mem_bytes;
    if (smem > device_.max_shared_mem_bytes()) {
      return finish(r, EvalStatus::kRejected,
                    "launch " + std::to_string(i) + " asks for " + std::to_string(smem) +
                        " bytes of dynamic shared memory; " + device_.name() + " allows " +
                        std::to_string(device_.max_shared_mem_bytes()) + " per block",
                    "build");
    }
  }
  StatusOr<LoadedCandidate> candidate = LoadedCandidate::load(device_, job.spec, r.artifact_name, r.artifact);
  if (!candidate.ok()) {
    if (device_.context_lost()) return finish(r, EvalStatus::kFault, "loading the candidate lost the CUDA context: " + candidate.status().message(), "build");
    return finish(r, EvalStatus::kRejected, "the built candidate cannot be loaded: " + candidate.status().message(), "build");
  }

  // Verify.
  r.phase = "verify";
  on_phase_(JobPhase{job.job_id, "verify", job.run_budget_ms});
  VerifyRequest vr{&sig, &job.spec, &*plan, *op, job.policy, &job.input_stats, &job.captured, verify_profile_};
  VerifyRun v = verify(device_, *candidate, vr);
  r.verify = v.outcome;
  if (v.fault) {
    return finish(r, EvalStatus::kFault, v.outcome.failed_check + " in trial " + v.outcome.trial + ": " + v.outcome.detail, "verify");
  }
  if (!v.worker_error.empty()) return finish(r, EvalStatus::kWorkerError, v.worker_error, "verify");
  if (!v.outcome.failed_check.empty()) {
    return finish(r, EvalStatus::kVerifyFailed,
                  v.outcome.failed_check + " in trial " + v.outcome.trial + ": " + v.outcome.detail, "verify");
  }
  if (!job.policy.measure) return finish(r, EvalStatus::kVerified, "", "done");

  // Measure.
  r.phase = "measure";
  on_phase_(JobPhase{job.job_id, "measure", job.run_budget_ms});
  MeasureRequest mr{&sig, &*plan, *op, job.policy, job.run_budget_ms,
                    [&](const char* phase) { on_phase_(JobPhase{job.job_id, phase, job.run_budget_ms}); }};
  MeasureRun m = measure(device_, *candidate, mr);
  if (m.fault) return finish(r, EvalStatus::kFault, m.error, "measure");
  if (!m.error.empty()) return finish(r, EvalStatus::kWorkerError, m.error, "measure");
  r.timing = m.timing;
  return finish(r, EvalStatus::kMeasured, "", "done");
}

}  // namespace kforge::eval

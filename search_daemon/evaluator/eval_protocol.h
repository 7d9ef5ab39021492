// The daemon <-> worker protocol: what an evaluation asks for (EvalJob) and what it found
// (EvalResult), plus the two small messages that frame a worker's life (WorkerReady, JobPhase).
// One header for both sides, versioned, torch-free: the daemon never links torch.
//
//   EvalJob job;
//   job.job_id = 7; job.signature = sig; job.spec = spec;
//   std::string bytes = encode(EvalMessage(job));
//   StatusOr<EvalMessage> m = decode_eval_message(bytes);        // the worker's side
//   if (auto* r = std::get_if<EvalResult>(&*m)) pool.on_result(*r);
//
// Every message is the msgpack array ["kforge-eval", version, type, body]. Embedded vocabulary
// (signature, kernel spec, environment, captured inputs) is carried as the bytes of that type's own
// canonical encode() and decoded with its own bounded decoder, so the limits and error paths of
// runtime/ apply unchanged.
//
// Promises of decode_eval_message(): never throws, never crashes, bounded by kMaxEvalMessageBytes,
// and a reason that names the field ("EvalJob.policy.trials: expected integer, got string").
// Results are values: a compile error, a wrong answer, a fault or a timeout is an EvalResult with a
// status, never an error of the protocol.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/entry.h"
#include "runtime/environment.h"
#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace kforge::eval {

inline constexpr std::string_view kEvalMagic = "kforge-eval";
inline constexpr uint16_t kEvalVersion = 1;
// A job carries at most kMaxCapturedCalls captured calls of at most wire's 64 MiB each; the whole
// message is capped here.
inline constexpr size_t kMaxEvalMessageBytes = 256u << 20;
inline constexpr size_t kMaxCapturedCalls = 4;
inline constexpr size_t kMaxLogBytes = 1u << 20;          // build logs are truncated to this
inline constexpr size_t kMaxArtifactBytes = 64u << 20;    // a built .so / cubin / ptx
inline constexpr uint32_t kMinTrials = 5;                 // DESIGN.md: at least 5 trials
inline constexpr uint32_t kMinMeasureRuns = 30;           // DESIGN.md: median of at least 30 runs

// Values are protocol: append only.
enum class EvalMessageType : uint8_t { kJob = 1, kResult = 2, kReady = 3, kPhase = 4 };

// How the worker draws inputs and times. Encoded as
// [trials, seed, measure, measure_runs, warmup_runs, determinism_runs, self_baseline,
//  max_baseline_model_ratio] (the last two appended later; a policy without them has false and 0).
struct InputPolicy {
  uint32_t trials = 6;             // fresh input sets; raised to kMinTrials by the worker
  uint64_t seed = 0;               // the trials' inputs are a function of (seed, trial)
  bool measure = true;             // false: build and verify only
  uint32_t measure_runs = 30;      // timed pairs (baseline, candidate); raised to kMinMeasureRuns
  uint32_t warmup_runs = 3;
  uint32_t determinism_runs = 2;   // extra runs per trial that must agree bit for bit (>= 1)
  // The baseline slot times the candidate too: the timing's spread against itself (bench/), never
  // a speedup to publish.
  bool self_baseline = false;
  // Note [Plausible timing] in worker/measurer.h: a baseline slower than this many times the cost
  // model's expectation is re-measured, and flagged when it stays so. 0: no check.
  double max_baseline_model_ratio = 0;
  friend bool operator==(const InputPolicy&, const InputPolicy&) = default;
};

// Encoded as [job_id, signature, spec, policy, input_stats, captured, compile_budget_ms,
// run_budget_ms]; signature and spec are bins of their canonical encodings, captured an array of
// bins, each a wire-encoded CapturedInputs message.
struct EvalJob {
  static constexpr EvalMessageType kType = EvalMessageType::kJob;
  uint64_t job_id = 0;
  OpSignature signature;
  KernelSpec spec;
  InputPolicy policy;
  std::vector<wire::InputStats> input_stats;       // observed in the serving process (may be empty)
  std::vector<wire::CapturedInputs> captured;      // real calls, when the user enabled capture
  uint32_t compile_budget_ms = 60000;              // the build's watchdog
  uint32_t run_budget_ms = 30000;                  // each of verify and measure: the kernel's watchdog
  friend bool operator==(const EvalJob&, const EvalJob&) = default;
};

// Values are protocol: append only.
enum class EvalStatus : uint8_t {
  kMeasured = 0,        // built, verified, timed
  kVerified = 1,        // built and verified; not timed (policy.measure = false)
  kCompileError = 2,    // the compiler refused it (log in build_log)
  kRejected = 3,        // refused before running: bad plan, resources, forbidden imports
  kVerifyFailed = 4,    // ran and failed a check (verify.failed_check says which)
  kFault = 5,           // the kernel crashed the worker or left a sticky device error
  kTimeout = 6,         // the watchdog killed the worker (build, verify or measure phase)
  kWorkerError = 7,     // the worker could not do the job (not the candidate's fault)
};
std::string_view eval_status_name(EvalStatus s) noexcept;   // "measured", "compile_error", ...

// What verification found. failed_check is empty when every trial passed, else one of:
//   "launch", "out_of_bounds", "input_modified", "output_layout", "stale_output",
//   "nondeterministic", "uninitialized_read", "not_written", "nan_inf_positions", "accuracy".
// Encoded as [trials_run, trials_passed, failed_check, trial, detail, max_abs_error, rel_error,
// torch_max_abs_error, torch_rel_error, checks].
struct VerifyOutcome {
  uint32_t trials_run = 0;
  uint32_t trials_passed = 0;
  std::string failed_check;
  std::string trial;               // the failing trial's input distribution ("large", "zeros", ...)
  std::string detail;              // where and by how much
  double max_abs_error = 0;        // worst over the trials run: candidate vs float64 reference
  double rel_error = 0;
  double torch_max_abs_error = 0;  // PyTorch's kernel vs the same reference
  double torch_rel_error = 0;
  std::string checks;              // the trials and checks that ran, one line for the report
  friend bool operator==(const VerifyOutcome&, const VerifyOutcome&) = default;
};

// Timing of baseline (PyTorch's kernel through the dispatcher) and candidate, interleaved.
// Encoded as [clock, runs, baseline_median_ns, candidate_median_ns, baseline_spread,
// candidate_spread, speedup, noise_band, significant, bytes, flops, achieved_bytes_per_s,
// achieved_flops_per_s, bandwidth_ceiling_bytes_per_s, call_floor_ns, expected_baseline_ns,
// attempts, implausible] (the last four appended later; 14 fields: 0, 0, 1, "").
struct TimingOutcome {
  std::string clock;               // "steady_clock" (CPU), "cupti" (kernel durations) or "cuda_events"
  uint32_t runs = 0;
  double baseline_median_ns = 0;
  double candidate_median_ns = 0;
  double baseline_spread = 0;      // (p90 - p10) / median of the runs
  double candidate_spread = 0;
  double speedup = 0;              // exp(median ln(baseline_i / candidate_i)) over the interleaved
                                   // pairs (Note [Paired timing] in worker/timing_stats.h)
  double noise_band = 0;           // relative: |ln speedup| <= noise_band counts as no speedup
  bool significant = false;        // the speedup (or slowdown) is outside the noise band
  double bytes = 0;                // fewest bytes the op must move (inputs read, outputs written)
  double flops = 0;                // estimated floating-point operations (0: unknown for this op)
  double achieved_bytes_per_s = 0; // bytes / candidate median
  double achieved_flops_per_s = 0;
  double bandwidth_ceiling_bytes_per_s = 0;   // the worker's measured copy bandwidth
  // Note [Plausible timing] in worker/measurer.h.
  double call_floor_ns = 0;        // the device's measured cost of the smallest call
  double expected_baseline_ns = 0; // the cost model's time: bytes / ceiling + call floor
  uint32_t attempts = 1;           // timing runs made (more than 1: a run was implausible)
  std::string implausible;         // non-empty: why this timing cannot be believed (never published)
  friend bool operator==(const TimingOutcome&, const TimingOutcome&) = default;
};

// Encoded as [job_id, status, message, build_log, build_cached, build_ms, artifact_name, artifact,
// verify, timing, environment, worker_pid, phase]; environment as a bin of its canonical encoding
// (empty bin when the worker never reported one).
struct EvalResult {
  static constexpr EvalMessageType kType = EvalMessageType::kResult;
  uint64_t job_id = 0;
  EvalStatus status = EvalStatus::kWorkerError;
  std::string message;             // one line: why, for every status but kMeasured/kVerified
  std::string build_log;           // compiler output, truncated to kMaxLogBytes
  bool build_cached = false;       // the build came from the build cache: no compile ran
  double build_ms = 0;
  std::string artifact_name;       // "so", "cubin" or "ptx": the cache blob name
  std::string artifact;            // the built binary (empty unless built)
  VerifyOutcome verify;
  TimingOutcome timing;
  Environment environment;         // the worker's: what a cache entry of this result is keyed by
  int32_t worker_pid = 0;
  std::string phase;               // where it ended: "start", "build", "verify", "baseline", "measure", "done"
  friend bool operator==(const EvalResult&, const EvalResult&) = default;

  bool passed() const noexcept { return status == EvalStatus::kMeasured || status == EvalStatus::kVerified; }
  // The cache's view of the same facts, for publishing a winner.
  VerificationReport verification_report() const;
  Timings timings() const;
};

// First message of a worker, once it can take jobs. Encoded as
// [pid, device, environment, bandwidth_ceiling_bytes_per_s, max_shared_mem_bytes, note, device_uuid]
// (device_uuid appended later; a message of 6 fields has it "").
struct WorkerReady {
  static constexpr EvalMessageType kType = EvalMessageType::kReady;
  int32_t pid = 0;
  std::string device;              // "cpu", "cuda:0"
  Environment environment;
  double bandwidth_ceiling_bytes_per_s = 0;
  int64_t max_shared_mem_bytes = 0;   // per block, as the worker enforces it
  std::string note;                   // anything the operator should know ("NVRTC 13.0 from ...")
  // The GPU's UUID (runtime/cuda_driver.h gpu_uuid_string; at most wire::kMaxGpuUuidChars
  // letters, digits and '-'): the name serving processes use for it too, whatever their ordinals.
  // "" for cpu, or when the driver could not say.
  std::string device_uuid;
  friend bool operator==(const WorkerReady&, const WorkerReady&) = default;
};

// The worker enters a phase of a job: the supervisor's watchdog gives it budget_ms from now.
// Encoded as [job_id, phase, budget_ms].
struct JobPhase {
  static constexpr EvalMessageType kType = EvalMessageType::kPhase;
  uint64_t job_id = 0;
  std::string phase;               // "build", "verify", "baseline" (PyTorch's kernel alone), "measure"
  uint32_t budget_ms = 0;
  friend bool operator==(const JobPhase&, const JobPhase&) = default;
};

// Alternative i is the struct whose kType is i + 1.
using EvalMessage = std::variant<EvalJob, EvalResult, WorkerReady, JobPhase>;

std::string encode(const EvalMessage& m);
StatusOr<EvalMessage> decode_eval_message(std::string_view bytes);

}  // namespace kforge::eval

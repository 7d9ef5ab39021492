#include "search_daemon/evaluator/eval_protocol.h"

#include <cmath>
#include <limits>

#include "runtime/msgpack_codec.h"

namespace kforge::eval {

// Note [Eval channel bounds]
// The channel runs between kforge's own processes over a private 0700 ipc socket (worker_process.h),
// but the worker also runs candidate code, so a result is decoded as untrusted input all the same:
// the whole message is bounded (kMaxEvalMessageBytes), arrays by kMaxEvalArray and nesting by
// kMaxEvalDepth before msgpack-c builds its tree, and every embedded vocabulary type goes through
// its own bounded decoder. Big payloads (captured tensors, artifacts) are bins, which cost their
// bytes and nothing per element.

namespace {

using codec::open_record;
using codec::Packer;
using codec::read_bool;
using codec::read_embedded;
using codec::read_f64;
using codec::read_str;
using codec::read_uint;
using codec::Reader;

constexpr size_t kMaxEvalArray = 4096;
constexpr size_t kMaxEvalDepth = 8;
constexpr size_t kMaxText = 1u << 20;

// ---- bodies -------------------------------------------------------------------------------------

void pack_stats(Packer& pk, const wire::InputStats& s) {
  pk.pack_array(8);
  pk.pack_uint32(s.arg_index);
  pk.pack_f64(s.min);
  pk.pack_f64(s.max);
  pk.pack_f64(s.mean);
  pk.pack_f64(s.stddev);
  pk.pack_uint64(s.nan_count);
  pk.pack_uint64(s.inf_count);
  pk.pack_f64(s.zero_fraction);
}

Status read_stats(const Reader& r, wire::InputStats* s) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 8));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(0, "arg_index"), &s->arg_index, wire::kMaxArgIndex));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(1, "min"), &s->min));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(2, "max"), &s->max));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(3, "mean"), &s->mean));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(4, "stddev"), &s->stddev));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(5, "nan_count"), &s->nan_count));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(6, "inf_count"), &s->inf_count));
  Reader zf = r.field(7, "zero_fraction");
  KFORGE_RETURN_IF_ERROR(read_f64(zf, &s->zero_fraction));
  if (!(s->zero_fraction >= 0 && s->zero_fraction <= 1)) return zf.error("expected a value in [0, 1]");
  return Status();
}

void pack_body(Packer& pk, const EvalJob& j) {
  pk.pack_array(8);
  pk.pack_uint64(j.job_id);
  pk.pack_bytes(j.signature.encode());
  pk.pack_bytes(j.spec.encode());
  pk.pack_array(8);
  pk.pack_uint32(j.policy.trials);
  pk.pack_uint64(j.policy.seed);
  pk.pack(j.policy.measure);
  pk.pack_uint32(j.policy.measure_runs);
  pk.pack_uint32(j.policy.warmup_runs);
  pk.pack_uint32(j.policy.determinism_runs);
  pk.pack(j.policy.self_baseline);
  pk.pack_f64(j.policy.max_baseline_model_ratio);
  pk.pack_array(static_cast<uint32_t>(j.input_stats.size()));
  for (const wire::InputStats& s : j.input_stats) pack_stats(pk, s);
  pk.pack_array(static_cast<uint32_t>(j.captured.size()));
  for (const wire::CapturedInputs& c : j.captured) pk.pack_bytes(wire::encode(c));
  pk.pack_uint32(j.compile_budget_ms);
  pk.pack_uint32(j.run_budget_ms);
}

StatusOr<EvalMessage> read_job(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 8));
  EvalJob j;
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(0, "job_id"), &j.job_id));
  KFORGE_RETURN_IF_ERROR(read_embedded(b.field(1, "signature"), 1u << 20, &j.signature));
  KFORGE_RETURN_IF_ERROR(read_embedded(b.field(2, "spec"), kMaxKernelSourceBytes + (1u << 20), &j.spec));
  Reader p = b.field(3, "policy");
  KFORGE_RETURN_IF_ERROR(open_record(p, 6));
  KFORGE_RETURN_IF_ERROR(read_uint(p.field(0, "trials"), &j.policy.trials, 1000));
  KFORGE_RETURN_IF_ERROR(read_uint(p.field(1, "seed"), &j.policy.seed));
  KFORGE_RETURN_IF_ERROR(read_bool(p.field(2, "measure"), &j.policy.measure));
  KFORGE_RETURN_IF_ERROR(read_uint(p.field(3, "measure_runs"), &j.policy.measure_runs, 100000));
  KFORGE_RETURN_IF_ERROR(read_uint(p.field(4, "warmup_runs"), &j.policy.warmup_runs, 10000));
  KFORGE_RETURN_IF_ERROR(read_uint(p.field(5, "determinism_runs"), &j.policy.determinism_runs, 100));
  // Appended after version 1's first release: absent means false.
  KFORGE_ASSIGN_OR_RETURN(size_t policy_fields, p.array_size());
  if (policy_fields > 6) KFORGE_RETURN_IF_ERROR(read_bool(p.field(6, "self_baseline"), &j.policy.self_baseline));
  if (policy_fields > 7) {
    Reader f = p.field(7, "max_baseline_model_ratio");
    KFORGE_RETURN_IF_ERROR(read_f64(f, &j.policy.max_baseline_model_ratio));
    if (!(j.policy.max_baseline_model_ratio >= 0 && j.policy.max_baseline_model_ratio <= 1e9)) {
      return f.error("expected a ratio in [0, 1e9]");
    }
  }
  Reader stats = b.field(4, "input_stats");
  KFORGE_ASSIGN_OR_RETURN(size_t ns, stats.array_size());
  if (ns > wire::kMaxStatsPerEntry) return stats.error("more than " + std::to_string(wire::kMaxStatsPerEntry) + " entries");
  j.input_stats.resize(ns);
  for (size_t i = 0; i < ns; ++i) KFORGE_RETURN_IF_ERROR(read_stats(stats.at(i), &j.input_stats[i]));
  Reader cap = b.field(5, "captured");
  KFORGE_ASSIGN_OR_RETURN(size_t nc, cap.array_size());
  if (nc > kMaxCapturedCalls) return cap.error("more than " + std::to_string(kMaxCapturedCalls) + " captured calls");
  for (size_t i = 0; i < nc; ++i) {
    Reader c = cap.at(i);
    KFORGE_ASSIGN_OR_RETURN(std::string bytes, c.bin(wire::kMaxCapturedInputsBytes));
    StatusOr<wire::WireMessage> m = wire::decode(bytes);
    if (!m.ok()) return c.error(m.status().message());
    auto* ci = std::get_if<wire::CapturedInputs>(&*m);
    if (ci == nullptr) return c.error("expected a CapturedInputs message");
    j.captured.push_back(std::move(*ci));
  }
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(6, "compile_budget_ms"), &j.compile_budget_ms));
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(7, "run_budget_ms"), &j.run_budget_ms));
  return EvalMessage(std::move(j));
}

void pack_verify(Packer& pk, const VerifyOutcome& v) {
  pk.pack_array(10);
  pk.pack_uint32(v.trials_run);
  pk.pack_uint32(v.trials_passed);
  pk.pack_text(v.failed_check);
  pk.pack_text(v.trial);
  pk.pack_text(v.detail);
  pk.pack_f64(v.max_abs_error);
  pk.pack_f64(v.rel_error);
  pk.pack_f64(v.torch_max_abs_error);
  pk.pack_f64(v.torch_rel_error);
  pk.pack_text(v.checks);
}

Status read_verify(const Reader& r, VerifyOutcome* v) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 10));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(0, "trials_run"), &v->trials_run));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(1, "trials_passed"), &v->trials_passed));
  KFORGE_RETURN_IF_ERROR(read_str(r.field(2, "failed_check"), 64, &v->failed_check));
  KFORGE_RETURN_IF_ERROR(read_str(r.field(3, "trial"), 256, &v->trial));
  KFORGE_RETURN_IF_ERROR(read_str(r.field(4, "detail"), kMaxText, &v->detail));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(5, "max_abs_error"), &v->max_abs_error));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(6, "rel_error"), &v->rel_error));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(7, "torch_max_abs_error"), &v->torch_max_abs_error));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(8, "torch_rel_error"), &v->torch_rel_error));
  KFORGE_RETURN_IF_ERROR(read_str(r.field(9, "checks"), kMaxText, &v->checks));
  return Status();
}

void pack_timing(Packer& pk, const TimingOutcome& t) {
  pk.pack_array(18);
  pk.pack_text(t.clock);
  pk.pack_uint32(t.runs);
  pk.pack_f64(t.baseline_median_ns);
  pk.pack_f64(t.candidate_median_ns);
  pk.pack_f64(t.baseline_spread);
  pk.pack_f64(t.candidate_spread);
  pk.pack_f64(t.speedup);
  pk.pack_f64(t.noise_band);
  pk.pack(t.significant);
  pk.pack_f64(t.bytes);
  pk.pack_f64(t.flops);
  pk.pack_f64(t.achieved_bytes_per_s);
  pk.pack_f64(t.achieved_flops_per_s);
  pk.pack_f64(t.bandwidth_ceiling_bytes_per_s);
  pk.pack_f64(t.call_floor_ns);
  pk.pack_f64(t.expected_baseline_ns);
  pk.pack_uint32(t.attempts);
  pk.pack_text(t.implausible);
}

Status read_timing(const Reader& r, TimingOutcome* t) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 14));
  KFORGE_RETURN_IF_ERROR(read_str(r.field(0, "clock"), 64, &t->clock));
  KFORGE_RETURN_IF_ERROR(read_uint(r.field(1, "runs"), &t->runs));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(2, "baseline_median_ns"), &t->baseline_median_ns));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(3, "candidate_median_ns"), &t->candidate_median_ns));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(4, "baseline_spread"), &t->baseline_spread));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(5, "candidate_spread"), &t->candidate_spread));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(6, "speedup"), &t->speedup));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(7, "noise_band"), &t->noise_band));
  KFORGE_RETURN_IF_ERROR(read_bool(r.field(8, "significant"), &t->significant));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(9, "bytes"), &t->bytes));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(10, "flops"), &t->flops));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(11, "achieved_bytes_per_s"), &t->achieved_bytes_per_s));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(12, "achieved_flops_per_s"), &t->achieved_flops_per_s));
  KFORGE_RETURN_IF_ERROR(read_f64(r.field(13, "bandwidth_ceiling_bytes_per_s"), &t->bandwidth_ceiling_bytes_per_s));
  // Appended after version 1's first release (Note [Plausible timing]).
  KFORGE_ASSIGN_OR_RETURN(size_t fields, r.array_size());
  if (fields > 14) {
    KFORGE_RETURN_IF_ERROR(read_f64(r.field(14, "call_floor_ns"), &t->call_floor_ns));
    KFORGE_RETURN_IF_ERROR(read_f64(r.field(15, "expected_baseline_ns"), &t->expected_baseline_ns));
    KFORGE_RETURN_IF_ERROR(read_uint(r.field(16, "attempts"), &t->attempts, 100));
    KFORGE_RETURN_IF_ERROR(read_str(r.field(17, "implausible"), kMaxText, &t->implausible));
  }
  return Status();
}

// An environment that was never filled in travels as an empty bin.
void pack_environment(Packer& pk, const Environment& env) {
  pk.pack_bytes(env == Environment{} ? std::string() : env.encode());
}

Status read_environment_field(const Reader& r, Environment* env) {
  KFORGE_ASSIGN_OR_RETURN(std::string bytes, r.bin(64u << 10));
  if (bytes.empty()) {
    *env = Environment{};
    return Status();
  }
  StatusOr<Environment> e = Environment::decode(bytes);
  if (!e.ok()) return r.error(e.status().message());
  *env = std::move(*e);
  return Status();
}

void pack_body(Packer& pk, const EvalResult& r) {
  pk.pack_array(13);
  pk.pack_uint64(r.job_id);
  pk.pack_uint8(static_cast<uint8_t>(r.status));
  pk.pack_text(r.message);
  pk.pack_text(r.build_log.size() > kMaxLogBytes ? std::string_view(r.build_log).substr(0, kMaxLogBytes)
                                                 : std::string_view(r.build_log));
  pk.pack(r.build_cached);
  pk.pack_f64(r.build_ms);
  pk.pack_text(r.artifact_name);
  pk.pack_bytes(r.artifact);
  pack_verify(pk, r.verify);
  pack_timing(pk, r.timing);
  pack_environment(pk, r.environment);
  pk.pack_int32(r.worker_pid);
  pk.pack_text(r.phase);
}

StatusOr<EvalMessage> read_result(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 13));
  EvalResult r;
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(0, "job_id"), &r.job_id));
  uint8_t status = 0;
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(1, "status"), &status, static_cast<uint8_t>(EvalStatus::kWorkerError)));
  r.status = static_cast<EvalStatus>(status);
  KFORGE_RETURN_IF_ERROR(read_str(b.field(2, "message"), kMaxText, &r.message));
  KFORGE_RETURN_IF_ERROR(read_str(b.field(3, "build_log"), kMaxLogBytes, &r.build_log));
  KFORGE_RETURN_IF_ERROR(read_bool(b.field(4, "build_cached"), &r.build_cached));
  KFORGE_RETURN_IF_ERROR(read_f64(b.field(5, "build_ms"), &r.build_ms));
  KFORGE_RETURN_IF_ERROR(read_str(b.field(6, "artifact_name"), 16, &r.artifact_name));
  KFORGE_ASSIGN_OR_RETURN(r.artifact, b.field(7, "artifact").bin(kMaxArtifactBytes));
  KFORGE_RETURN_IF_ERROR(read_verify(b.field(8, "verify"), &r.verify));
  KFORGE_RETURN_IF_ERROR(read_timing(b.field(9, "timing"), &r.timing));
  KFORGE_RETURN_IF_ERROR(read_environment_field(b.field(10, "environment"), &r.environment));
  KFORGE_ASSIGN_OR_RETURN(int64_t pid, b.field(11, "worker_pid").i64_in(0, INT32_MAX));
  r.worker_pid = static_cast<int32_t>(pid);
  KFORGE_RETURN_IF_ERROR(read_str(b.field(12, "phase"), 64, &r.phase));
  return EvalMessage(std::move(r));
}

void pack_body(Packer& pk, const WorkerReady& w) {
  pk.pack_array(7);
  pk.pack_int32(w.pid);
  pk.pack_text(w.device);
  pack_environment(pk, w.environment);
  pk.pack_f64(w.bandwidth_ceiling_bytes_per_s);
  pk.pack_int64(w.max_shared_mem_bytes);
  pk.pack_text(w.note);
  pk.pack_text(w.device_uuid);
}

StatusOr<EvalMessage> read_ready(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 6));
  WorkerReady w;
  KFORGE_ASSIGN_OR_RETURN(int64_t pid, b.field(0, "pid").i64_in(1, INT32_MAX));
  w.pid = static_cast<int32_t>(pid);
  KFORGE_RETURN_IF_ERROR(read_str(b.field(1, "device"), 64, &w.device));
  KFORGE_RETURN_IF_ERROR(read_environment_field(b.field(2, "environment"), &w.environment));
  KFORGE_RETURN_IF_ERROR(read_f64(b.field(3, "bandwidth_ceiling_bytes_per_s"), &w.bandwidth_ceiling_bytes_per_s));
  KFORGE_ASSIGN_OR_RETURN(w.max_shared_mem_bytes, b.field(4, "max_shared_mem_bytes").i64_in(0, INT64_MAX));
  KFORGE_RETURN_IF_ERROR(read_str(b.field(5, "note"), kMaxText, &w.note));
  // Appended after version 1's first release: absent means "".
  KFORGE_ASSIGN_OR_RETURN(size_t fields, b.array_size());
  if (fields > 6) {
    Reader uuid = b.field(6, "device_uuid");
    KFORGE_RETURN_IF_ERROR(read_str(uuid, wire::kMaxGpuUuidChars, &w.device_uuid));
    for (char c : w.device_uuid) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-')) {
        return uuid.error("not a GPU UUID (expected letters, digits and '-')");
      }
    }
  }
  return EvalMessage(std::move(w));
}

void pack_body(Packer& pk, const JobPhase& p) {
  pk.pack_array(3);
  pk.pack_uint64(p.job_id);
  pk.pack_text(p.phase);
  pk.pack_uint32(p.budget_ms);
}

StatusOr<EvalMessage> read_phase(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 3));
  JobPhase p;
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(0, "job_id"), &p.job_id));
  KFORGE_RETURN_IF_ERROR(read_str(b.field(1, "phase"), 64, &p.phase));
  KFORGE_RETURN_IF_ERROR(read_uint(b.field(2, "budget_ms"), &p.budget_ms));
  return EvalMessage(std::move(p));
}

const char* type_label(uint64_t t) {
  switch (t) {
    case 1: return "EvalJob";
    case 2: return "EvalResult";
    case 3: return "WorkerReady";
    case 4: return "JobPhase";
  }
  return "?";
}

}  // namespace

std::string_view eval_status_name(EvalStatus s) noexcept {
  switch (s) {
    case EvalStatus::kMeasured: return "measured";
    case EvalStatus::kVerified: return "verified";
    case EvalStatus::kCompileError: return "compile_error";
    case EvalStatus::kRejected: return "rejected";
    case EvalStatus::kVerifyFailed: return "verify_failed";
    case EvalStatus::kFault: return "fault";
    case EvalStatus::kTimeout: return "timeout";
    case EvalStatus::kWorkerError: return "worker_error";
  }
  return "unknown";
}

VerificationReport EvalResult::verification_report() const {
  VerificationReport v;
  v.trials = verify.trials_run;
  v.max_abs_error = verify.max_abs_error;
  v.rel_error = verify.rel_error;
  v.torch_max_abs_error = verify.torch_max_abs_error;
  v.torch_rel_error = verify.torch_rel_error;
  v.passed = passed();
  v.details = verify.checks;
  if (!verify.failed_check.empty()) v.details += "; failed " + verify.failed_check + ": " + verify.detail;
  return v;
}

Timings EvalResult::timings() const {
  Timings t;
  t.baseline_ns = timing.baseline_median_ns;
  t.candidate_ns = timing.candidate_median_ns;
  t.spread = timing.candidate_spread;
  t.runs = timing.runs;
  return t;
}

std::string encode(const EvalMessage& m) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(4);
  pk.pack_text(kEvalMagic);
  pk.pack_uint16(kEvalVersion);
  std::visit(
      [&](const auto& body) {
        pk.pack_uint8(static_cast<uint8_t>(std::decay_t<decltype(body)>::kType));
        pack_body(pk, body);
      },
      m);
  return std::string(buf.data(), buf.size());
}

StatusOr<EvalMessage> decode_eval_message(std::string_view bytes) {
  codec::Limits limits;
  limits.max_bytes = kMaxEvalMessageBytes;
  limits.max_array = kMaxEvalArray;
  limits.max_map = 0;
  limits.max_str = kMaxKernelSourceBytes + (1u << 20);
  limits.max_bin = kMaxEvalMessageBytes;
  limits.max_depth = kMaxEvalDepth;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(bytes, limits));
  Reader env(oh.get(), "message");
  KFORGE_RETURN_IF_ERROR(env.expect_array(4));
  KFORGE_ASSIGN_OR_RETURN(std::string magic, env.field(0, "magic").str(32));
  if (magic != kEvalMagic) return env.error("not a kforge evaluation message (magic '" + magic + "')");
  KFORGE_ASSIGN_OR_RETURN(int64_t version, env.field(1, "version").i64_in(0, 65535));
  if (version != kEvalVersion) {
    return env.error("evaluation protocol version " + std::to_string(version) + " is not supported (this side speaks " +
                     std::to_string(kEvalVersion) + ")");
  }
  KFORGE_ASSIGN_OR_RETURN(int64_t type, env.field(2, "type").i64_in(0, 255));
  const Reader body(oh.get().via.array.ptr[3], type_label(static_cast<uint64_t>(type)));
  switch (type) {
    case 1: return read_job(body);
    case 2: return read_result(body);
    case 3: return read_ready(body);
    case 4: return read_phase(body);
  }
  return env.error("unknown message type " + std::to_string(type));
}

}  // namespace kforge::eval

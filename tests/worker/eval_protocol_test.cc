// The daemon <-> worker protocol (search_daemon/evaluator/eval_protocol.h): every message survives
// encode -> decode unchanged, and malformed bytes are rejected with a reason naming the field,
// never a crash.
#include <catch2/catch.hpp>

#include <random>

#include "runtime/msgpack_codec.h"
#include "search_daemon/evaluator/eval_protocol.h"

using namespace kforge;
using namespace kforge::eval;

namespace {

EvalJob sample_job() {
  EvalJob j;
  j.job_id = 42;
  TensorMeta t;
  t.sizes = {4, 16};
  t.strides = {16, 1};
  j.signature = OpSignature{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                            Target{Backend::kCpu, "x86_64-avx2"}};
  j.spec.backend = Backend::kCpu;
  j.spec.language = SourceLanguage::kCpp;
  j.spec.source = "extern \"C\" void k(const void*, void* const*) {}";
  j.spec.entry_points = {"k"};
  j.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  j.spec.plan.launches = {l};
  j.policy.trials = 7;
  j.policy.seed = 99;
  j.policy.self_baseline = true;
  j.policy.max_baseline_model_ratio = 50;
  j.input_stats.push_back(wire::InputStats{0, -3, 3, 0.1, 1.2, 0, 0, 0.25});
  wire::CapturedInputs c;
  c.pid = 7;
  c.signature_id = j.signature.id();
  c.tensors.push_back(wire::CapturedTensor{0, DType::kFloat32, {2}, {1}, std::string(8, '\1')});
  j.captured.push_back(c);
  j.run_budget_ms = 1234;
  return j;
}

}  // namespace

TEST_CASE("every evaluation message round-trips through encode and decode", "[eval_protocol]") {
  REQUIRE(sample_job().spec.validate().ok());
  EvalResult r;
  r.job_id = 42;
  r.status = EvalStatus::kVerifyFailed;
  r.message = "output 0 element [3, 15]: 0.5 vs 0.25";
  r.build_log = "warning: unused";
  r.artifact_name = "so";
  r.artifact = std::string("\x7f" "ELF\0\1", 6);
  r.verify.failed_check = "accuracy";
  r.verify.trial = "large";
  r.verify.max_abs_error = 0.25;
  r.timing.clock = "steady_clock";
  r.timing.runs = 30;
  r.timing.call_floor_ns = 900;
  r.timing.expected_baseline_ns = 7400;
  r.timing.attempts = 3;
  r.timing.implausible = "PyTorch's kernel measured 16 ms, 2160x the cost model's 7.4 us";
  r.environment = cpu_host_environment("2.11.0");
  r.worker_pid = 1234;
  r.phase = "verify";
  WorkerReady w{77, "cpu", cpu_host_environment("2.11.0"), 1e10, 1 << 20, "note", ""};
  WorkerReady gpu{78, "cuda:1", cpu_host_environment("2.11.0"), 4e12, 227 << 10, "NVRTC 13.0",
                  "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b"};
  JobPhase p{42, "measure", 3000};

  for (const EvalMessage& m : {EvalMessage(sample_job()), EvalMessage(r), EvalMessage(w), EvalMessage(gpu), EvalMessage(p)}) {
    StatusOr<EvalMessage> back = decode_eval_message(encode(m));
    REQUIRE(back.ok());
    CHECK(*back == m);
  }
}

TEST_CASE("WorkerReady names the worker's GPU by UUID, and a worker of an older build, without it, names none", "[eval_protocol]") {
  WorkerReady w{78, "cuda:1", cpu_host_environment("2.11.0"), 4e12, 227 << 10, "NVRTC 13.0",
                "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b"};
  const std::string bytes = encode(EvalMessage(w));
  // The same message as a 6-field body: drop the last element (a short text) and fix the count.
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  msgpack::object env = oh.get();
  msgpack::object& body = env.via.array.ptr[3];
  body.via.array.size = 6;
  msgpack::sbuffer old;
  msgpack::pack(old, env);
  StatusOr<EvalMessage> back = decode_eval_message(std::string(old.data(), old.size()));
  REQUIRE(back.ok());
  CHECK(std::get<WorkerReady>(*back).device_uuid.empty());
  CHECK(std::get<WorkerReady>(*back).device == "cuda:1");

  w.device_uuid = "GPU-5e2a910c d34f";
  StatusOr<EvalMessage> bad = decode_eval_message(encode(EvalMessage(w)));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "WorkerReady.device_uuid: not a GPU UUID (expected letters, digits and '-')");
  w.device_uuid = std::string(65, 'a');
  bad = decode_eval_message(encode(EvalMessage(w)));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "WorkerReady.device_uuid: string of 65 bytes exceeds 64");
}

TEST_CASE("malformed evaluation messages are rejected with the field named, never a crash", "[eval_protocol]") {
  const std::string good = encode(EvalMessage(sample_job()));
  CHECK_FALSE(decode_eval_message("").ok());
  CHECK_FALSE(decode_eval_message(good.substr(0, good.size() / 2)).ok());
  // A result that claims a status beyond the known ones.
  EvalResult r;
  std::string bytes = encode(EvalMessage(r));
  // Every truncation, and random byte flips, decode to an error or a valid message.
  for (size_t n = 0; n < good.size(); n += 7) CHECK_FALSE(decode_eval_message(good.substr(0, n)).ok());
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::string b = i % 2 ? good : bytes;
    b[rng() % b.size()] = static_cast<char>(rng());
    (void)decode_eval_message(b);   // must not crash
  }
  JobPhase p{1, "verify", 10};
  std::string phase = encode(EvalMessage(p));
  phase[2] = 'X';   // inside the magic string
  StatusOr<EvalMessage> bad = decode_eval_message(phase);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("magic") != std::string::npos);
}

TEST_CASE("a passing result maps onto the cache's verification report and timings", "[eval_protocol]") {
  EvalResult r;
  r.status = EvalStatus::kMeasured;
  r.verify.trials_run = 6;
  r.verify.checks = "6 trials";
  r.timing.baseline_median_ns = 200;
  r.timing.candidate_median_ns = 100;
  r.timing.runs = 30;
  CHECK(r.verification_report().passed);
  CHECK(r.verification_report().trials == 6);
  CHECK(r.timings().speedup() == Approx(2.0));
  r.status = EvalStatus::kTimeout;
  CHECK_FALSE(r.verification_report().passed);
}

TEST_CASE("a timing and a policy from before the plausibility check decode with none", "[eval_protocol]") {
  EvalResult r;
  r.status = EvalStatus::kMeasured;
  r.timing.clock = "cupti";
  r.timing.runs = 30;
  r.timing.speedup = 2;
  r.timing.implausible = "x";
  r.timing.attempts = 2;
  const std::string bytes = encode(EvalMessage(r));
  // Cut the timing record back to its first 14 fields, as an older worker wrote it.
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  msgpack::object env = oh.get();
  msgpack::object& timing = env.via.array.ptr[3].via.array.ptr[9];
  REQUIRE(timing.via.array.size == 18);
  timing.via.array.size = 14;
  msgpack::sbuffer old;
  msgpack::pack(old, env);
  StatusOr<EvalMessage> back = decode_eval_message(std::string(old.data(), old.size()));
  REQUIRE(back.ok());
  const TimingOutcome& t = std::get<EvalResult>(*back).timing;
  CHECK(t.speedup == 2);
  CHECK(t.implausible.empty());
  CHECK(t.attempts == 1);
  CHECK(t.call_floor_ns == 0);

  EvalJob j = sample_job();
  j.policy.max_baseline_model_ratio = 50;
  const std::string jb = encode(EvalMessage(j));
  msgpack::object_handle jh = msgpack::unpack(jb.data(), jb.size());
  msgpack::object jenv = jh.get();
  jenv.via.array.ptr[3].via.array.ptr[3].via.array.size = 7;   // policy without the ratio
  msgpack::sbuffer jold;
  msgpack::pack(jold, jenv);
  StatusOr<EvalMessage> jback = decode_eval_message(std::string(jold.data(), jold.size()));
  REQUIRE(jback.ok());
  CHECK(std::get<EvalJob>(*jback).policy.max_baseline_model_ratio == 0);
  CHECK(std::get<EvalJob>(*jback).policy.self_baseline);
}

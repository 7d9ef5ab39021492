// LLM search benchmark: how busy the worker stays while a language model takes minutes per answer,
// with the model's requests in the background (llm.concurrent_requests > 0) and with a search that
// waits for each answer (0), measured in one run.
//
//   build/bench/bench_llm_search                                      # 180 s answers, both modes
//   build/bench/bench_llm_search --answer-seconds 180 --seconds 360 --modes background --min-busy 0.8
//
// Needs KFORGE_WORKER (default: beside this program, then ../search_daemon) and, where python3 has
// no torch, KFORGE_PYTHON.
//
// Note [LLM search bench]
// What runs is kforged's search: SearchSessions (MCTS) for --signatures CPU softmax signatures at
// once, sharing one EvaluatorPool of one CPU kforge-worker, each with the template proposer and an
// LlmProposer whose client speaks HTTP to a model server in this process. The server is scripted,
// not a model: it answers every request after --answer-seconds with a correct softmax kernel for
// the CPU ABI (each answer a distinct spec: its source names the answer's number), so every answer
// the search waits for is built, verified and timed by the worker like a real one. Everything else
// (prompts, client, parsing, the sessions, the pool, the worker) is kforge's own.
// Each mode is one phase: a fresh pool, cache and state directory; the phase ends when every
// session has ended (its --budget evaluations, or --seconds of wall time). The worker is busy while
// at least one job is submitted and not yet answered (one slot: its jobs run one after the other);
// busy time over the phase's wall time is the number --min-busy checks. Output per mode: wall time,
// busy time and share, evaluations (template and LLM), evaluations per minute, the model requests
// and the best speedup each signature reached.
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "search_daemon/daemon/search_session.h"
#include "search_daemon/evaluator/evaluator_pool.h"
#include "search_daemon/proposers/llm/llm_client.h"
#include "search_daemon/proposers/llm/llm_proposer.h"
#include "search_daemon/proposers/templates/template_proposer.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

struct Options {
  double answer_seconds = 180;
  double seconds = 0;                 // each session's wall-time budget; 0: 2.5 answers
  uint32_t budget = 400;              // evaluations per signature
  size_t signatures = 2;
  uint32_t concurrent_requests = 4;
  uint32_t requests_per_search = 2;
  std::vector<std::string> modes = {"background", "waiting"};
  double min_busy = 0;                // > 0: exit 1 when the background mode's busy share is below
};

// ---- the scripted model -----------------------------------------------------------------------

constexpr const char* kSoftmaxSource = R"(#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  double m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  double s = 0;
  for (int64_t c = 0; c < cols; ++c) s += exp((double)xr[c] - m);
  for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(exp((double)xr[c] - m) / s);
}
)";

class SlowModel {
 public:
  explicit SlowModel(double answer_seconds) : delay_(std::chrono::duration<double>(answer_seconds)) {
    server_.Post("/v1/chat/completions", [this](const httplib::Request&, httplib::Response& res) { answer(res); });
    server_.Get("/ready", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
    server_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) {
      std::fprintf(stderr, "bench_llm_search: cannot bind the model server\n");
      std::exit(1);
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // The accept loop answers only once it runs; after this, stop() cannot miss it.
    httplib::Client probe("127.0.0.1", port_);
    probe.set_connection_timeout(std::chrono::seconds(10));
    for (int i = 0; i < 100 && !probe.Get("/ready"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~SlowModel() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    server_.stop();
    thread_.join();
  }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  void answer(httplib::Response& res) {
    const int n = ++requests_;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, delay_, [&] { return stopping_; })) {
        res.status = 503;
        return;
      }
    }
    const std::string source = "// answer " + std::to_string(n) + "\n" + kSoftmaxSource;
    const json plan = {{"summary", "one row per block, double accumulation (answer " + std::to_string(n) + ")"},
                       {"entry_points", {"softmax_rows"}},
                       {"outputs", {{{"like", 0}}}},
                       {"launches", {{{"entry", "softmax_rows"}, {"grid", {"size0_0"}}, {"block", {1}},
                                      {"args", {{{"input", 0}}, {{"output", 0}}, {{"size", "size0_1"}, {"type", "int64"}}}}}}}};
    const std::string text = "```cpp\n" + source + "```\n```json\n" + plan.dump() + "\n```\n";
    res.set_content(json{{"id", "bench"},
                         {"object", "chat.completion"},
                         {"model", "scripted"},
                         {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}, {"finish_reason", "stop"}}}},
                         {"usage", {{"prompt_tokens", 3000}, {"completion_tokens", 600}}}}
                        .dump(),
                    "application/json");
  }

  std::chrono::duration<double> delay_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

// ---- the worker's busy time -------------------------------------------------------------------

// The pool, with a clock on how long at least one job was outstanding (one slot: the worker's busy
// time, its queue included). Forwards everything.
class BusyMeter final : public eval::Evaluator {
 public:
  explicit BusyMeter(eval::Evaluator& inner) : inner_(inner) {}
  void submit(eval::EvalJob job, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (outstanding_++ == 0) since_ = Clock::now();
    }
    inner_.submit(std::move(job), [this, done = std::move(done)](eval::EvalResult r, eval::JobPlacement where) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--outstanding_ == 0) busy_ += Clock::now() - since_;
      }
      done(std::move(r), std::move(where));
    });
  }
  size_t idle_slots_for(const OpSignature& sig) const override { return inner_.idle_slots_for(sig); }
  double busy_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::duration b = busy_;
    if (outstanding_ > 0) b += Clock::now() - since_;
    return std::chrono::duration<double>(b).count();
  }

 private:
  eval::Evaluator& inner_;
  mutable std::mutex mu_;
  size_t outstanding_ = 0;
  Clock::time_point since_;
  Clock::duration busy_{};
};

// ---- one phase --------------------------------------------------------------------------------

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string self_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

std::string find_worker() {
  if (const char* w = std::getenv("KFORGE_WORKER"); w != nullptr && *w != '\0') return w;
  for (const fs::path& p : {fs::path(self_dir()) / "kforge-worker", fs::path(self_dir()) / ".." / "search_daemon" / "kforge-worker"}) {
    if (fs::exists(p)) return p.string();
  }
  return "kforge-worker";
}

OpSignature softmax(const std::string& arch, int64_t rows, int64_t cols) {
  TensorMeta t;
  t.sizes = {rows, cols};
  t.strides = {cols, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)}, Target{Backend::kCpu, arch}};
}

struct SignatureResult {
  std::string name;
  double best = 0;
  std::string best_label;
  std::string end;
};

struct PhaseResult {
  std::string mode;
  double wall = 0;
  double busy = 0;
  size_t evaluations = 0;
  size_t llm_evaluations = 0;
  size_t llm_measured = 0;
  int requests = 0;
  std::vector<SignatureResult> signatures;
};

PhaseResult run_phase(const Options& o, const std::string& mode) {
  test_support::TempDir dir("kforge-llm-bench");
  eval::PoolOptions po;
  po.devices = {"cpu"};
  po.cpu_slots = 1;
  po.program = find_worker();
  po.python = env_or("KFORGE_PYTHON", "");
  po.build_cache_dir = (dir.path / "builds").string();
  eval::EvaluatorPool pool(po);
  if (Status s = pool.start(); !s.ok() || !pool.wait_started(std::chrono::minutes(3))) {
    std::fprintf(stderr, "bench_llm_search: the worker did not start: %s\n", s.message().c_str());
    std::exit(1);
  }
  const std::string arch = pool.slots().at(0).arch;
  BusyMeter meter(pool);

  SlowModel model(o.answer_seconds);
  llm::LlmClientConfig cc;
  cc.base_url = model.base_url();
  cc.model = "scripted";
  cc.request_timeout_ms = static_cast<uint32_t>(o.answer_seconds * 1000 * 2 + 60000);
  cc.max_retries = 0;
  StatusOr<std::unique_ptr<llm::LlmClient>> client = llm::LlmClient::create(cc, [](std::string_view) {});
  if (!client.ok()) {
    std::fprintf(stderr, "bench_llm_search: %s\n", client.status().message().c_str());
    std::exit(1);
  }
  llm::LlmProposerOptions lo;
  lo.concurrent_requests = mode == "background" ? o.concurrent_requests : 0;
  lo.requests_per_search = o.requests_per_search;
  llm::LlmProposer llm_proposer(std::shared_ptr<llm::LlmClient>(std::move(*client)), [](std::string_view) {}, lo);
  search::TemplateProposer templates;

  std::atomic<uint64_t> total{0};
  std::atomic<uint64_t> job_ids{1};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<std::string, uint64_t>, std::string> proposer_of;   // (signature, node) -> proposer
  PhaseResult out;
  out.mode = mode;
  size_t finished = 0;
  std::vector<std::unique_ptr<daemon::SearchSession>> sessions;
  const int64_t shapes[][2] = {{16384, 3}, {4096, 49}, {2048, 1000}, {65536, 5}};
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < o.signatures; ++i) {
    const OpSignature sig = softmax(arch, shapes[i % 4][0], shapes[i % 4][1] + static_cast<int64_t>(i / 4));
    daemon::SessionContext c;
    c.evaluator = &meter;
    c.proposers = {&templates, &llm_proposer};
    c.options.max_evaluations = o.budget;
    c.options.seed = 11 + i;
    c.max_seconds = static_cast<uint32_t>(o.seconds);
    c.evaluations_total = &total;
    c.max_evaluations_total = 1000000;
    c.next_job_id = &job_ids;
    c.state_dir = (dir.path / "state").string();
    c.cache_dir = (dir.path / "cache").string();
    c.max_baseline_observed_ratio = 0;   // no serving process observed these signatures
    const std::string hex = sig.id().hex();
    c.on_event = [&, hex](daemon::SessionEvent e) {
      std::lock_guard<std::mutex> lock(mu);
      switch (e.kind) {
        case daemon::SessionEvent::Kind::kNode:
          proposer_of[{hex, e.node}] = e.proposer;
          break;
        case daemon::SessionEvent::Kind::kResult:
          ++out.evaluations;
          if (proposer_of[{hex, e.node}] == "llm") {
            ++out.llm_evaluations;
            if (e.status == eval::EvalStatus::kMeasured) ++out.llm_measured;
          }
          break;
        case daemon::SessionEvent::Kind::kFinished:
          ++finished;
          cv.notify_all();
          break;
        default:
          break;
      }
    };
    sessions.push_back(std::make_unique<daemon::SearchSession>(sig, std::vector<wire::InputStats>{},
                                                               std::vector<wire::CapturedInputs>{}, search::Roofline{}, c));
    out.signatures.push_back(SignatureResult{sig.to_string(), 0, "", ""});
  }
  for (auto& s : sessions) s->start();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == sessions.size(); });
  }
  out.wall = std::chrono::duration<double>(Clock::now() - start).count();
  out.busy = meter.busy_seconds();
  for (size_t i = 0; i < sessions.size(); ++i) {
    sessions[i]->join();
    const daemon::SessionProgress p = sessions[i]->progress();
    out.signatures[i].best = p.best_speedup;
    out.signatures[i].best_label = p.best_label;
    out.signatures[i].end = p.reason;
  }
  out.requests = model.requests();
  sessions.clear();
  return out;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_llm_search: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--answer-seconds") o.answer_seconds = std::stod(value());
    else if (a == "--seconds") o.seconds = std::stod(value());
    else if (a == "--budget") o.budget = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--signatures") o.signatures = std::stoul(value());
    else if (a == "--concurrent-requests") o.concurrent_requests = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--requests-per-search") o.requests_per_search = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--min-busy") o.min_busy = std::stod(value());
    else if (a == "--modes") {
      o.modes.clear();
      std::string v = value();
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        const std::string m = v.substr(at, comma - at);
        if (m != "background" && m != "waiting") {
          std::fprintf(stderr, "bench_llm_search: --modes: '%s' is not background or waiting\n", m.c_str());
          return false;
        }
        o.modes.push_back(m);
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "bench_llm_search: unknown argument %s (see the header of bench/llm_search_bench.cc)\n", a.c_str());
      return false;
    }
  }
  if (!(o.answer_seconds >= 0) || o.signatures == 0 || o.budget == 0 || o.concurrent_requests == 0) {
    std::fprintf(stderr, "bench_llm_search: --answer-seconds must be >= 0; --signatures, --budget and --concurrent-requests > 0\n");
    return false;
  }
  if (o.seconds <= 0) o.seconds = std::max(60.0, 2.5 * o.answer_seconds);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  std::string command = "bench_llm_search";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  std::printf("# %s\n# answers take %.0f s; %zu CPU softmax signatures searched at once (templates + LLM, MCTS), one "
              "CPU worker; each search ends at %u evaluations or %.0f s; background: %u requests at once, %u per search\n",
              command.c_str(), o.answer_seconds, o.signatures, o.budget, o.seconds, o.concurrent_requests, o.requests_per_search);
  std::fflush(stdout);
  std::vector<PhaseResult> results;
  for (const std::string& mode : o.modes) {
    PhaseResult r = run_phase(o, mode);
    std::printf("\n%s: wall %.1f s, worker busy %.1f s (%.1f%%), %zu evaluations (%zu from the model, %zu of them measured), "
                "%.1f evaluations per minute, %d model requests\n",
                r.mode.c_str(), r.wall, r.busy, 100 * r.busy / r.wall, r.evaluations, r.llm_evaluations, r.llm_measured,
                60.0 * static_cast<double>(r.evaluations) / r.wall, r.requests);
    for (const SignatureResult& s : r.signatures) {
      std::printf("  %s: best %.2fx (%s); ended: %s\n", s.name.c_str(), s.best, s.best_label.empty() ? "none" : s.best_label.c_str(),
                  s.end.c_str());
    }
    std::fflush(stdout);
    results.push_back(std::move(r));
  }
  int rc = 0;
  for (const PhaseResult& r : results) {
    if (r.mode == "background" && o.min_busy > 0) {
      const double share = r.busy / r.wall;
      std::printf("\nbackground busy share %.3f %s the required %.3f\n", share, share >= o.min_busy ? "meets" : "is BELOW", o.min_busy);
      if (share < o.min_busy) rc = 1;
      if (r.llm_evaluations == 0) {
        std::printf("background: no answer of the model was evaluated: not a combined search\n");
        rc = 1;
      }
    }
  }
  if (results.size() == 2 && results[0].wall > 0 && results[1].wall > 0) {
    const double a = 60.0 * static_cast<double>(results[0].evaluations) / results[0].wall;
    const double b = 60.0 * static_cast<double>(results[1].evaluations) / results[1].wall;
    std::printf("\nevaluations per minute: %s %.1f, %s %.1f (ratio %.2f)\n", results[0].mode.c_str(), a, results[1].mode.c_str(), b,
                b > 0 ? a / b : 0.0);
  }
  return rc;
}

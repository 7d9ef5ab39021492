// Search benchmark: what the tree buys. MCTS, greedy linear refinement and random sampling, at equal
// evaluation budgets, on the template space of several real signatures: the best verified speedup
// each has found after 1, 2, 4, ... evaluations, averaged over seeds, as a table, a CSV and an SVG
// plot.
//
//   build/bench/bench_search --device cpu [--budget 24] [--seeds 10] [--max-space 48] [--out DIR]
//   <bundle>/bin/bench_search --device cuda:0 --budget 32 --seeds 20 [--only 'bf16[8,|cumsum'] --out DIR
//
// Note [Search bench]
// Every configuration of each signature's template space (all of it, or --max-space of it in the
// space's fixed order, every family represented) is evaluated once by a real kforge-worker: built,
// verified with every trial and check, timed against PyTorch's kernel. Those outcomes are the
// landscape. Each strategy then runs against it, with the template proposer, for --budget
// evaluations and each seed: a candidate's outcome is the measured one (a candidate outside the
// evaluated part of the space is evaluated by the worker too). So strategies are compared on the
// same real measurements, and many seeds cost no GPU time. A strategy's score after k evaluations is
// the best speedup among its candidates that improve (verified, timed, significant, > 1), else 1
// (PyTorch's own kernel). The table also gives the best of the whole evaluated space, and per
// signature where an evaluation's wall time goes (median per phase: the worker's start, build,
// verify, PyTorch's kernel alone, measure), the search's speed as issue 23 asks for it.
//
// Needs KFORGE_WORKER (default: beside this program, then ../search_daemon) and, where python3 has
// no torch, KFORGE_PYTHON.
//
// Note [Landscape files]
// ~~~~~~~~~~~~~~~~~~~~~~
// --landscape-out FILE writes every outcome the worker measured (signature, label, status, speedup,
// noise band, significant, implausible) as tab-separated lines; --landscape-in FILE replays such a
// file with no worker: a candidate's outcome is the recorded one for its label. A GPU's whole
// spaces, measured once, then let the strategies be compared and tuned on any machine, every seed
// on the same measurements; a candidate the file lacks is counted (`missing`) and scores as a
// worker error (reward 0), so a replay of a partial landscape says how partial it was. A replay
// walks only the template families the file has configurations of for the signature
// (TemplateProposer's family set): a family added since the recording is not in the replayed
// space, while a changed family's new configurations are missing.
// --prebuild N (CUDA) compiles the configurations to be evaluated on N threads into the worker's
// build cache first, with the worker's own builder (Note [Builds ahead] in
// search_daemon/daemon/prebuilder.h), so the worker's builds are cache hits: a whole space of
// hundreds of configurations is evaluated in minutes, and the phase medians show an evaluation's
// time with the build cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda_environment.h"
#include "runtime/environment.h"
#include "runtime/nvrtc.h"
#include "search_daemon/evaluator/worker_process.h"
#include "search_daemon/proposers/templates/kernel_template.h"
#include "search_daemon/proposers/templates/template_proposer.h"
#include "search_daemon/search/landscape_file.h"
#include "search_daemon/search/search_strategy.h"
#include "search_daemon/worker/builder.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::search;
namespace fs = std::filesystem;

namespace {

TensorMeta tensor(DType dt, DeviceType dev, std::vector<int64_t> sizes) { return contiguous_tensor(dt, dev, std::move(sizes)); }

struct NamedSignature {
  std::string name;
  OpSignature sig;
};

std::vector<NamedSignature> signatures(bool cuda, const std::string& arch) {
  const DeviceType dev = cuda ? DeviceType::kCuda : DeviceType::kCpu;
  const Target target{cuda ? Backend::kCuda : Backend::kCpu, arch};
  const DType half = cuda ? DType::kFloat16 : DType::kFloat32;
  std::vector<NamedSignature> out;
  if (cuda) {
    out.push_back({"softmax f16[4096,4096]", OpSignature{"aten::_softmax", "", {Arg::tensor(tensor(half, dev, {4096, 4096})), Arg::integer(-1), Arg::boolean(false)}, target}});
    out.push_back({"layer_norm f16[8192,1024]", OpSignature{"aten::native_layer_norm", "", {Arg::tensor(tensor(half, dev, {8192, 1024})), Arg::int_list({1024}), Arg::tensor(tensor(half, dev, {1024})), Arg::tensor(tensor(half, dev, {1024})), Arg::real(1e-5)}, target}});
    out.push_back({"gelu f32[16777216]", OpSignature{"aten::gelu", "", {Arg::tensor(tensor(DType::kFloat32, dev, {16777216})), Arg::string("none")}, target}});
    // The per-op report's shapes where the spaces are larger and the families differ most.
    const DType bf = DType::kBFloat16;
    out.push_back({"softmax bf16[8,262144]", OpSignature{"aten::_softmax", "", {Arg::tensor(tensor(bf, dev, {8, 262144})), Arg::integer(-1), Arg::boolean(false)}, target}});
    out.push_back({"softmax bf16[4096,50257]", OpSignature{"aten::_softmax", "", {Arg::tensor(tensor(bf, dev, {4096, 50257})), Arg::integer(-1), Arg::boolean(false)}, target}});
    out.push_back({"softmax bf16[64,4096,512] d1", OpSignature{"aten::_softmax", "", {Arg::tensor(tensor(bf, dev, {64, 4096, 512})), Arg::integer(1), Arg::boolean(false)}, target}});
    out.push_back({"cumsum bf16[64,4096,512] d1", OpSignature{"aten::cumsum", "", {Arg::tensor(tensor(bf, dev, {64, 4096, 512})), Arg::integer(1), Arg::none()}, target}});
  } else {
    // Where PyTorch's CPU kernels vectorize along a short last dimension poorly (rows of 3 to 8)
    // the space has real winners; softmax over 1000-wide rows is one where PyTorch stays ahead.
    out.push_back({"softmax f32[16384,3]", OpSignature{"aten::_softmax", "", {Arg::tensor(tensor(DType::kFloat32, dev, {16384, 3})), Arg::integer(-1), Arg::boolean(false)}, target}});
    out.push_back({"log_softmax f32[16384,5]", OpSignature{"aten::_log_softmax", "", {Arg::tensor(tensor(DType::kFloat32, dev, {16384, 5})), Arg::integer(-1), Arg::boolean(false)}, target}});
    out.push_back({"layer_norm f32[16384,8]", OpSignature{"aten::native_layer_norm", "", {Arg::tensor(tensor(DType::kFloat32, dev, {16384, 8})), Arg::int_list({8}), Arg::tensor(tensor(DType::kFloat32, dev, {8})), Arg::tensor(tensor(DType::kFloat32, dev, {8})), Arg::real(1e-5)}, target}});
  }
  return out;
}


// The landscape: outcomes by spec id, evaluated on first need by the worker (or replayed).
class Landscape {
 public:
  Landscape(eval::WorkerProcess* w, OpSignature sig, std::string name, const LandscapeFile* replay, std::ostream* record)
      : w_(w), sig_(std::move(sig)), name_(std::move(name)), replay_(replay), record_(record),
        families_(replay != nullptr ? TemplateProposer::families_of(replay->labels(name_)) : std::set<std::string>{}) {}
  // The families a replay walks (Note [Landscape files]); empty, all, when measuring.
  const std::set<std::string>& families() const { return families_; }
  Outcome get(const KernelSpec& spec, const std::string& label) {
    const KernelId id = spec.id();
    if (auto it = memo_.find(id); it != memo_.end()) return it->second;
    Outcome o;
    if (replay_ != nullptr) {
      const auto it = replay_->outcomes.find({name_, label});
      if (it != replay_->outcomes.end()) {
        o = it->second;
      } else {
        o.status = eval::EvalStatus::kWorkerError;
        o.message = "not in the landscape file";
        ++missing_;
      }
      ++evaluated_;
      memo_.emplace(id, o);
      return o;
    }
    eval::EvalJob j;
    j.job_id = next_++;
    j.signature = sig_;
    j.spec = spec;
    j.policy.seed = 7;
    const eval::EvalResult r = w_->evaluate(j);
    o = outcome_of(r);
    ++evaluated_;
    std::map<std::string, double> spent;   // a phase entered twice (measure) counts once, summed
    for (const auto& [phase, ms] : w_->last_phase_ms()) {
      spent[phase] += ms;
      spent["total"] += ms;
    }
    for (const auto& [phase, ms] : spent) phase_ms_[phase].push_back(ms);
    if (r.build_cached) ++build_cache_hits_;
    std::printf("    %-60s %-14s %s\n", label.c_str(), std::string(eval::eval_status_name(r.status)).c_str(),
                r.status == eval::EvalStatus::kMeasured
                    ? (std::to_string(o.speedup) + "x" + (o.significant ? "" : " (noise)")).c_str()
                    : r.message.substr(0, 100).c_str());
    std::fflush(stdout);
    if (record_ != nullptr) {
      *record_ << LandscapeFile::line(name_, label, o);
      record_->flush();
    }
    memo_.emplace(id, o);
    return o;
  }
  size_t evaluated() const { return evaluated_; }
  size_t missing() const { return missing_; }
  // Where an evaluation's time went: the median wall time of each phase (as the supervisor saw the
  // worker's phase messages) and of the whole evaluation, over this signature's evaluations.
  std::string phase_medians() const {
    if (replay_ != nullptr) return "replayed (" + std::to_string(missing_) + " candidates not in the file)";
    std::string s;
    for (const char* p : {"start", "build", "verify", "baseline", "measure", "total"}) {
      const auto it = phase_ms_.find(p);
      if (it == phase_ms_.end() || it->second.empty()) continue;
      std::vector<double> v = it->second;
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s %.0f", s.empty() ? "" : ", ", p, v[v.size() / 2]);
      s += buf;
    }
    return s + " ms (" + std::to_string(build_cache_hits_) + " build cache hits)";
  }
  double best() const {
    double b = 1;
    for (const auto& [id, o] : memo_) {
      if (o.improves()) b = std::max(b, o.speedup);
    }
    return b;
  }

 private:
  eval::WorkerProcess* w_;
  OpSignature sig_;
  std::string name_;
  const LandscapeFile* replay_;
  std::ostream* record_;
  std::set<std::string> families_;
  std::map<KernelId, Outcome> memo_;
  uint64_t next_ = 1;
  size_t evaluated_ = 0, missing_ = 0;
  std::map<std::string, std::vector<double>> phase_ms_;
  size_t build_cache_hits_ = 0;
};

// Note [Landscape files]: the specs compiled on `threads` threads into `cache_dir` with the
// worker's builder for `arch`. Returns a line saying how many and how long.
std::string prebuild(const std::vector<KernelSpec>& specs, const std::string& cache_dir, const std::string& arch, uint32_t threads) {
  int major = 0, minor = 0;
  if (!parse_cuda_arch(arch, major, minor)) return "prebuild: not a CUDA architecture: " + arch;
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) return "prebuild: no NVRTC: " + nvrtc.status().message();
  const auto t0 = std::chrono::steady_clock::now();
  std::mutex mu;
  size_t next = 0, built = 0, cached = 0, failed = 0;
  std::vector<std::thread> pool;
  for (uint32_t i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      StatusOr<CandidateBuilder> b = CandidateBuilder::for_cuda(cache_dir, *nvrtc, major, minor);
      for (;;) {
        size_t k;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (next >= specs.size()) return;
          k = next++;
        }
        bool ok = false, hit = false;
        if (b.ok()) {
          StatusOr<BuildOutput> out = b->build(specs[k], 120000);
          ok = out.ok() && out->compiled;
          hit = ok && out->cached;
        }
        std::lock_guard<std::mutex> lock(mu);
        (ok ? (hit ? cached : built) : failed) += 1;
      }
    });
  }
  for (std::thread& th : pool) th.join();
  char buf[160];
  std::snprintf(buf, sizeof buf, "prebuild: %zu compiled, %zu already cached, %zu failed, in %.1f s on %u threads", built, cached,
                failed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), threads);
  return buf;
}

// Note [Prior ablation]
// ~~~~~~~~~~~~~~~~~~~~~
// What the tree buys apart from the priors: the template proposer with its knowledge taken out.
// The root's moves are uniform samples of the space (not each variant's best default), and a node's
// neighbours come in a seeded random order, every prior 1. "mcts/flat" and "greedy/flat" (with
// --ablate-priors) are the strategies on this proposer.
class FlatPriors final : public Proposer {
 public:
  FlatPriors(uint64_t seed, std::set<std::string> families) : inner_(std::move(families)), rng_(seed) {}
  std::string_view name() const override { return "template"; }
  bool supports(const OpSignature& sig) const override { return inner_.supports(sig); }
  std::vector<Move> propose(const ProposalRequest& r) override {
    std::vector<Move> out;
    if (r.parent == 0) {
      for (size_t tries = 0; tries < 8 * r.max_moves && out.size() < r.max_moves; ++tries) {
        std::optional<Move> m = inner_.sample(*r.signature, rng_);
        if (!m) break;
        if (r.tree->find(m->spec.id())) continue;
        bool repeat = false;
        for (const Move& o : out) repeat = repeat || o.spec.id() == m->spec.id();
        if (!repeat) out.push_back(std::move(*m));
      }
    } else {
      ProposalRequest all = r;
      all.max_moves = 1u << 20;
      out = inner_.propose(all);
      std::shuffle(out.begin(), out.end(), rng_);
      if (out.size() > r.max_moves) out.resize(r.max_moves);
    }
    for (Move& m : out) m.prior = 1;
    return out;
  }
  std::optional<Move> sample(const OpSignature& sig, std::mt19937_64& rng) override {
    std::optional<Move> m = inner_.sample(sig, rng);
    if (m) m->prior = 1;
    return m;
  }

 private:
  TemplateProposer inner_;
  std::mt19937_64 rng_;
};

// Best improving speedup after each evaluation (1 = PyTorch's kernel). A name ending in "/flat"
// runs the strategy on FlatPriors (Note [Prior ablation]).
std::vector<double> run_strategy(const std::string& name, const OpSignature& sig, uint32_t budget, uint64_t seed,
                                 Landscape& land, const StrategyOptions& base) {
  const bool flat = name.size() > 5 && name.compare(name.size() - 5, 5, "/flat") == 0;
  TemplateProposer proposer(land.families());
  FlatPriors flat_proposer(seed * 0x9E3779B97F4A7C15ull + 1, land.families());
  StrategyOptions o = base;
  o.max_evaluations = budget;
  o.seed = seed;
  std::unique_ptr<SearchStrategy> s = make_strategy(flat ? name.substr(0, name.size() - 5) : name, SearchTask{sig, {}},
                                                    {flat ? static_cast<Proposer*>(&flat_proposer) : &proposer}, o);
  std::vector<double> curve;
  double best = 1;
  while (!s->done() && curve.size() < budget) {
    std::vector<Candidate> batch = s->next_candidates(1);
    if (batch.empty()) break;
    std::vector<std::pair<uint64_t, Outcome>> results;
    for (const Candidate& c : batch) {
      Outcome out = land.get(c.move.spec, c.move.label);
      if (out.improves()) best = std::max(best, out.speedup);
      curve.push_back(best);
      results.emplace_back(c.node, out);
    }
    s->notify_results(results);
  }
  while (curve.size() < budget) curve.push_back(best);   // a search that ran out holds its best
  return curve;
}

std::string svg_plot(const std::map<std::string, std::map<std::string, std::vector<double>>>& curves, uint32_t budget) {
  // One panel per signature: mean best speedup vs evaluations, a line per strategy.
  const int pw = 360, ph = 240, pad = 50;
  const int panels = static_cast<int>(curves.size());
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' width='" + std::to_string(panels * (pw + pad) + pad) +
                  "' height='" + std::to_string(ph + 2 * pad) + "' font-family='sans-serif' font-size='11'>\n";
  const std::map<std::string, std::string> color = {{"mcts", "#d62728"}, {"greedy", "#1f77b4"}, {"random", "#7f7f7f"},
                                                    {"mcts/flat", "#ff9896"}, {"greedy/flat", "#aec7e8"}};
  int p = 0;
  for (const auto& [sig, by_strategy] : curves) {
    double top = 1.05;
    for (const auto& [st, c] : by_strategy) top = std::max(top, *std::max_element(c.begin(), c.end()) * 1.05);
    const int x0 = pad + p * (pw + pad), y0 = pad;
    s += "<text x='" + std::to_string(x0) + "' y='" + std::to_string(y0 - 10) + "'>" + sig + "</text>\n";
    s += "<rect x='" + std::to_string(x0) + "' y='" + std::to_string(y0) + "' width='" + std::to_string(pw) + "' height='" +
         std::to_string(ph) + "' fill='none' stroke='black'/>\n";
    auto X = [&](size_t k) { return x0 + static_cast<double>(pw) * static_cast<double>(k) / std::max<double>(1, budget - 1); };
    auto Y = [&](double v) { return y0 + ph - static_cast<double>(ph) * (v - 1.0) / (top - 1.0); };
    for (double tick = 1.0; tick <= top; tick += (top - 1) > 2 ? 0.5 : 0.1) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1fx", tick);
      s += "<text x='" + std::to_string(x0 - 40) + "' y='" + std::to_string(Y(tick) + 4) + "'>" + buf + "</text>\n";
    }
    s += "<text x='" + std::to_string(x0 + pw / 2 - 30) + "' y='" + std::to_string(y0 + ph + 30) + "'>evaluations (1.." +
         std::to_string(budget) + ")</text>\n";
    int legend = 0;
    for (const auto& [st, c] : by_strategy) {
      std::string pts;
      for (size_t k = 0; k < c.size(); ++k) pts += std::to_string(X(k)) + "," + std::to_string(Y(c[k])) + " ";
      const std::string col = color.count(st) ? color.at(st) : "black";
      s += "<polyline fill='none' stroke='" + col + "' stroke-width='2' points='" + pts + "'/>\n";
      s += "<text x='" + std::to_string(x0 + 10) + "' y='" + std::to_string(y0 + 15 + 14 * legend++) + "' fill='" + col + "'>" + st + "</text>\n";
    }
    ++p;
  }
  return s + "</svg>\n";
}

int usage() {
  std::fprintf(stderr, "usage: bench_search [--device cpu|cuda:N] [--budget N] [--seeds N] [--max-space N] [--only 'a|b'] [--out DIR]\n"
                       "                    [--prebuild THREADS] [--landscape-out FILE | --landscape-in FILE] [--ablate-priors]\n"
                       "  --only: the signatures whose names contain one of these texts, separated by '|'\n"
                       "  --prebuild: CUDA: compile the configurations to evaluate on THREADS threads first\n"
                       "  --landscape-out/-in: record the worker's outcomes / replay a recording without a worker\n"
                       "    (Note [Landscape files]; --landscape-in with --device cuda:N names the recording's device kind)\n"
                       "  --show-prior N: the N configurations the priors rank first, with their outcomes\n"
                       "  --c-puct X, --widening-c X, --widening-alpha X, --moves-per-expansion N: the tree's parameters\n"
                       "  --ablate-priors: also mcts/flat and greedy/flat, the proposer's priors taken out (Note [Prior ablation])\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", out_dir, only, landscape_in, landscape_out;
  uint32_t budget = 24, seeds = 10, max_space = 48, prebuild_threads = 0, show_prior = 0;
  bool ablate = false;
  StrategyOptions tree_options;   // the tree's parameters (Note [MCTS] in search/mcts.h)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ablate-priors") {
      ablate = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--device") device = v;
    else if (a == "--budget") budget = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--seeds") seeds = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--max-space") max_space = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--out") out_dir = v;
    else if (a == "--only") only = v;
    else if (a == "--show-prior") show_prior = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--c-puct") tree_options.c_puct = std::atof(v.c_str());
    else if (a == "--widening-c") tree_options.widening_c = std::atof(v.c_str());
    else if (a == "--widening-alpha") tree_options.widening_alpha = std::atof(v.c_str());
    else if (a == "--moves-per-expansion") tree_options.moves_per_expansion = static_cast<size_t>(std::atoi(v.c_str()));
    else if (a == "--prebuild") prebuild_threads = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--landscape-in") landscape_in = v;
    else if (a == "--landscape-out") landscape_out = v;
    else return usage();
  }
  if (budget == 0 || seeds == 0 || (!landscape_in.empty() && !landscape_out.empty())) return usage();
  const bool cuda = device != "cpu";
  const test_support::TempDir tmp("kforge-bench-search");   // under $TMPDIR; removed at exit
  std::optional<LandscapeFile> replay;
  std::optional<eval::WorkerProcess> w;
  eval::WorkerOptions wo;
  std::string arch, model;
  if (!landscape_in.empty()) {   // Note [Landscape files]
    StatusOr<LandscapeFile> r = LandscapeFile::load(landscape_in);
    if (!r.ok()) {
      std::fprintf(stderr, "bench_search: %s\n", r.status().message().c_str());
      return 1;
    }
    replay = std::move(*r);
    arch = !replay->arch.empty() ? replay->arch : cuda ? "sm_90" : cpu_host_environment("").arch;
    model = "replay of " + fs::path(landscape_in).filename().string();
  } else {
    wo.program = eval::WorkerOptions::default_program();
    wo.device = device;
    wo.build_cache_dir = (tmp.path / "builds").string();
    w.emplace(wo);
    if (Status s = w->start(); !s.ok()) {
      std::fprintf(stderr, "bench_search: cannot start %s: %s\n", wo.program.c_str(), s.message().c_str());
      return 1;
    }
    arch = cuda ? w->ready()->environment.arch : cpu_host_environment("").arch;
    model = w->ready()->environment.device_model;
  }
  std::ofstream record;
  if (!landscape_out.empty()) {
    record.open(landscape_out);
    if (!record) {
      std::fprintf(stderr, "bench_search: cannot write %s\n", landscape_out.c_str());
      return 1;
    }
    record << "# bench_search landscape (Note [Landscape files] in bench/search_bench.cc): signature, label, status, "
              "status name, speedup, noise band, significant, implausible\n# arch\t" << arch << "\n# device\t" << model << "\n";
  }
  std::printf("# bench_search --device %s --budget %u --seeds %u --max-space %u on %s (%s)\n", device.c_str(), budget,
              seeds, max_space, model.c_str(), arch.c_str());

  std::vector<std::string> strategies = {"mcts", "greedy", "random"};
  if (ablate) strategies.insert(strategies.end(), {"mcts/flat", "greedy/flat"});
  std::map<std::string, std::map<std::string, std::vector<double>>> mean_curves;
  std::map<std::string, double> space_best;
  std::map<std::string, size_t> space_size, evaluated;
  const auto t0 = std::chrono::steady_clock::now();
  for (const NamedSignature& ns : signatures(cuda, arch)) {
    if (!only.empty()) {
      bool wanted = false;
      for (size_t at = 0; at <= only.size();) {
        const size_t end = std::min(only.find('|', at), only.size());
        const std::string part = only.substr(at, end - at);
        wanted = wanted || (!part.empty() && ns.name.find(part) != std::string::npos);
        at = end + 1;
      }
      if (!wanted) continue;
    }
    std::printf("\n%s: %s\n", ns.name.c_str(), ns.sig.to_string().c_str());
    Landscape land(w ? &*w : nullptr, ns.sig, ns.name, replay ? &*replay : nullptr, record.is_open() ? &record : nullptr);
    // The landscape first: the space in its fixed order, spread over the families.
    std::vector<templates::TemplateConfig> space = TemplateProposer(land.families()).space(ns.sig);
    space_size[ns.name] = space.size();
    if (show_prior > 0) {
      // The configurations the priors rank first, each family's own ranking, beside their
      // (recorded or measured) outcomes: how well the priors know the landscape.
      std::vector<std::pair<double, const templates::TemplateConfig*>> ranked;
      for (const templates::TemplateConfig& c : space) {
        ranked.emplace_back(templates::find_template(c.family)->prior(ns.sig, c.values), &c);
      }
      std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::printf("  the priors' first %u:\n", show_prior);
      for (size_t k = 0; k < ranked.size() && k < show_prior; ++k) {
        StatusOr<Move> m = TemplateProposer::move_for(ns.sig, *ranked[k].second);
        if (!m.ok()) continue;
        const Outcome o = land.get(m->spec, m->label);
        std::printf("    prior %.3f  %-60s %s\n", ranked[k].first, m->label.c_str(),
                    o.measured() ? (std::to_string(o.speedup) + "x").c_str() : std::string(eval::eval_status_name(o.status)).c_str());
      }
    }
    std::vector<templates::TemplateConfig> chosen;
    const size_t n = std::min<size_t>(space.size(), max_space);
    for (size_t k = 0; k < n; ++k) chosen.push_back(space[k * space.size() / std::max<size_t>(n, 1)]);
    std::vector<Move> moves;
    for (const templates::TemplateConfig& c : chosen) {
      StatusOr<Move> m = TemplateProposer::move_for(ns.sig, c);
      if (m.ok()) moves.push_back(std::move(*m));
    }
    if (prebuild_threads > 0 && cuda && w) {
      std::vector<KernelSpec> specs;
      for (const Move& m : moves) specs.push_back(m.spec);
      std::printf("  %s\n", prebuild(specs, wo.build_cache_dir, arch, prebuild_threads).c_str());
      std::fflush(stdout);
    }
    const auto land_t0 = std::chrono::steady_clock::now();
    for (const Move& m : moves) (void)land.get(m.spec, m.label);
    if (!moves.empty() && w) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - land_t0).count();
      std::printf("  landscape: %zu evaluations in %.1f s, %.0f per minute\n", moves.size(), s, static_cast<double>(moves.size()) / s * 60);
    }
    for (const std::string& st : strategies) {
      std::vector<double> mean(budget, 0);
      for (uint32_t seed = 1; seed <= seeds; ++seed) {
        const std::vector<double> c = run_strategy(st, ns.sig, budget, seed, land, tree_options);
        for (uint32_t k = 0; k < budget; ++k) mean[k] += c[k] / seeds;
      }
      mean_curves[ns.name][st] = mean;
    }
    space_best[ns.name] = land.best();
    evaluated[ns.name] = land.evaluated();
    std::printf("  evaluation time, median per phase: %s\n", land.phase_medians().c_str());
    if (land.missing() > 0) std::printf("  %zu candidates were not in the landscape file (scored as worker errors)\n", land.missing());
  }
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60;

  std::printf("\nmean best verified speedup over %u seeds after k evaluations (1.00 = PyTorch's kernel)\n", seeds);
  std::vector<uint32_t> ks;
  for (uint32_t k = 1; k <= budget; k *= 2) ks.push_back(k);
  if (ks.back() != budget) ks.push_back(budget);
  std::printf("%-28s %-7s", "signature", "strategy");
  for (uint32_t k : ks) std::printf(" %7s", ("k=" + std::to_string(k)).c_str());
  std::printf("   space best (evaluated of size)\n");
  std::string csv = "signature,strategy,evaluations,mean_best_speedup\n";
  for (const auto& [sig, by] : mean_curves) {
    for (const std::string& st : strategies) {
      const std::vector<double>& c = by.at(st);
      std::printf("%-28s %-7s", sig.c_str(), st.c_str());
      for (uint32_t k : ks) std::printf(" %7.3f", c[k - 1]);
      if (st == "mcts") std::printf("   %.3f (%zu of %zu)", space_best[sig], evaluated[sig], space_size[sig]);
      std::printf("\n");
      for (uint32_t k = 0; k < budget; ++k) csv += sig + "," + st + "," + std::to_string(k + 1) + "," + std::to_string(c[k]) + "\n";
    }
  }
  std::printf("(%.1f minutes, %zu worker evaluations in all)\n", minutes,
              [&] { size_t s = 0; for (auto& [k, v] : evaluated) s += v; return s; }());
  if (!out_dir.empty()) {
    fs::create_directories(out_dir);
    std::ofstream(out_dir + "/search_bench.csv") << csv;
    std::ofstream(out_dir + "/search_bench.svg") << svg_plot(mean_curves, budget);
    std::printf("wrote %s/search_bench.csv and search_bench.svg\n", out_dir.c_str());
  }
  return 0;
}

// Worker benchmark: how many candidates one kforge-worker evaluates per minute (build, verify with
// every trial and check, time against PyTorch's kernel), with and without build-cache hits, and how
// far the timing of a candidate against itself strays from 1 (issue: within +-2%).
//
//   build/bench/bench_worker --device cpu     [--evals 8] [--self 8] [--elements 1048576]
//   <bundle>/bin/bench_worker --device cuda:0 [--evals 16] [--self 16] [--elements 16777216]
//
// Needs KFORGE_WORKER (the kforge-worker launcher; default: beside this program, then ../bin) and,
// where python3 on PATH has no torch, KFORGE_PYTHON.
//
// The candidate is aten::silu on a float32 vector, y = x / (1 + exp(-x)), one element per thread
// (CUDA) or 4096 per block (CPU). Phases, one worker throughout:
//   cold      N evaluations of N distinct candidates (a -D salt makes each one's build-cache key
//             new): every evaluation compiles
//   cached    the same N again: every build is a cache hit
//   self      M evaluations of one candidate with InputPolicy::self_baseline (the candidate in both
//             timing slots): the distribution of its "speedup" over itself
// Each evaluation is a whole job (>= 6 trials x 4 runs each, 30 timed pairs).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/silu_candidate.h"
#include "runtime/environment.h"
#include "search_daemon/evaluator/worker_process.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::eval;
using kforge::bench::silu_signature;
using kforge::bench::silu_spec;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string device = "cpu";
  int evals = 8;
  int self = 8;
  int64_t elements = 0;   // 0: 1 Mi (CPU) or 16 Mi (CUDA)
  std::string arch;       // CUDA: the device's, from the worker's WorkerReady
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Phase {
  const char* name;
  int evals = 0;
  int passed = 0;
  int cached = 0;
  double seconds = 0;
  std::vector<double> speedups;
  std::vector<double> bands;
  std::vector<double> build_ms;
  std::vector<double> baseline_ns;
  std::vector<double> candidate_ns;
  std::string first_failure;
};

Phase run_phase(WorkerProcess& w, const char* name, const OpSignature& sig, bool cuda, int count, int salt_base,
                bool self, uint64_t& job_id) {
  Phase p;
  p.name = name;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    EvalJob j;
    j.job_id = job_id++;
    j.signature = sig;
    j.spec = silu_spec(cuda, salt_base < 0 ? 0 : salt_base + i);
    j.policy.seed = static_cast<uint64_t>(i + 1);
    j.policy.self_baseline = self;
    const EvalResult r = w.evaluate(j);
    ++p.evals;
    if (r.status != EvalStatus::kMeasured) {
      if (p.first_failure.empty()) {
        p.first_failure = kforge::bench::failure_line(r);
      }
      continue;
    }
    ++p.passed;
    p.cached += r.build_cached ? 1 : 0;
    p.speedups.push_back(r.timing.speedup);
    p.bands.push_back(r.timing.noise_band);
    p.build_ms.push_back(r.build_ms);
    p.baseline_ns.push_back(r.timing.baseline_median_ns);
    p.candidate_ns.push_back(r.timing.candidate_median_ns);
  }
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

int usage() {
  std::fprintf(stderr, "usage: bench_worker [--device cpu|cuda:N] [--evals N] [--self N] [--elements N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--device") o.device = v;
    else if (a == "--evals") o.evals = std::atoi(v.c_str());
    else if (a == "--self") o.self = std::atoi(v.c_str());
    else if (a == "--elements") o.elements = std::atoll(v.c_str());
    else return usage();
  }
  const bool cuda = o.device != "cpu";
  if (o.elements <= 0) o.elements = cuda ? (int64_t{1} << 24) : (int64_t{1} << 20);

  const test_support::TempDir tmp("kforge-bench-worker");   // under $TMPDIR; removed at exit
  const fs::path& dir = tmp.path;
  WorkerOptions wo;
  wo.program = eval::WorkerOptions::default_program();
  wo.device = o.device;
  wo.build_cache_dir = (dir / "builds").string();
  WorkerProcess w(wo);
  const Clock::time_point s0 = Clock::now();
  if (Status s = w.start(); !s.ok()) {
    std::fprintf(stderr, "bench_worker: cannot start %s: %s\n", wo.program.c_str(), s.message().c_str());
    return 1;
  }
  const double start_s = std::chrono::duration<double>(Clock::now() - s0).count();
  const WorkerReady& ready = *w.ready();
  const std::string arch = cuda ? ready.environment.arch : cpu_host_environment("").arch;
  const OpSignature sig = silu_signature(cuda, o.elements, arch);

  std::printf("# bench_worker --device %s --evals %d --self %d --elements %lld\n", o.device.c_str(), o.evals, o.self,
              static_cast<long long>(o.elements));
  std::printf("# worker pid %d on %s (%s), started in %.1f s; %s\n", ready.pid, ready.device.c_str(),
              ready.environment.device_model.c_str(), start_s, ready.note.c_str());
  std::printf("# measured copy bandwidth %.1f GB/s; signature %s\n", ready.bandwidth_ceiling_bytes_per_s / 1e9,
              sig.to_string().c_str());

  uint64_t job_id = 1;
  // Salts start after a random-enough base so a rerun on the same build cache still compiles.
  const int salt = static_cast<int>(::getpid() % 100000) * 1000 + 1;
  const Phase cold = run_phase(w, "cold builds", sig, cuda, o.evals, salt, false, job_id);
  const Phase hot = run_phase(w, "build-cache hits", sig, cuda, o.evals, salt, false, job_id);
  const Phase self = run_phase(w, "self vs self", sig, cuda, o.self, -1, true, job_id);

  std::printf("\nphase               evals passed cached   seconds  evals/min  median build ms\n");
  for (const Phase* p : {&cold, &hot, &self}) {
    std::printf("%-18s %6d %6d %6d %9.2f %10.1f %16.1f\n", p->name, p->evals, p->passed, p->cached, p->seconds,
                p->seconds > 0 ? 60.0 * p->evals / p->seconds : 0, median(p->build_ms));
    if (!p->first_failure.empty()) std::printf("  first failure: %s\n", p->first_failure.c_str());
  }
  if (!hot.speedups.empty()) {
    std::printf("\nsilu candidate vs PyTorch (%d evaluations): median speedup %.3f (min %.3f, max %.3f); "
                "median times: PyTorch %.0f ns, candidate %.0f ns\n",
                static_cast<int>(hot.speedups.size()), median(hot.speedups),
                *std::min_element(hot.speedups.begin(), hot.speedups.end()),
                *std::max_element(hot.speedups.begin(), hot.speedups.end()), median(hot.baseline_ns),
                median(hot.candidate_ns));
  }
  if (!self.speedups.empty()) {
    std::vector<double> dev;
    int within = 0;
    for (double s : self.speedups) {
      dev.push_back(100.0 * (s - 1.0));
      within += std::abs(s - 1.0) <= 0.02 ? 1 : 0;
    }
    std::printf("self vs self (%d evaluations): speedup - 1 in %%: median %+.2f, min %+.2f, max %+.2f; "
                "%d of %d within +-2%%; median noise band %.2f%%\n",
                static_cast<int>(dev.size()), median(dev), *std::min_element(dev.begin(), dev.end()),
                *std::max_element(dev.begin(), dev.end()), within, static_cast<int>(dev.size()),
                100.0 * median(self.bands));
  }
  return cold.passed == cold.evals && hot.passed == hot.evals && self.passed == self.evals ? 0 : 1;
}

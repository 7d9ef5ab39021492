// Evaluator pool benchmark: evaluations per minute with one slot and with every slot of the pool,
// measured in one run, and their ratio (issue: with two GPUs, at least 1.8x one).
//
//   <bundle>/bin/bench_pool                         # every visible GPU (one worker each) vs the first
//   <bundle>/bin/bench_pool --devices cuda:0,cuda:1 [--jobs 32] [--rounds 2] [--elements 16777216]
//   build/bench/bench_pool --devices cpu --cpu-slots 2 [--cpu-threads 1] [--jobs 8]   # CPU slots, here
//
// Needs KFORGE_WORKER (the kforge-worker launcher; default: beside this program, then ../bin) and,
// where python3 on PATH has no torch, KFORGE_PYTHON.
//
// Each phase is a fresh EvaluatorPool with k slots (k = 1, then all), whose workers start and take
// one warm-up job each before the clock starts; then --jobs evaluations of distinct candidates
// (bench/silu_candidate.h, each salted so every build compiles: the work a search's evaluations
// are) are submitted at once, and the phase lasts until the last callback. Phases alternate
// (1, all, 1, all ... for --rounds rounds) so a drift of the machine touches both; each phase gets
// a build cache of its own. Every evaluation must pass (built, verified, measured): the run fails
// otherwise. Output: per phase the evaluations, seconds, evaluations per minute and the jobs each
// slot ran; then the median rate of each configuration and their ratio.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench/silu_candidate.h"
#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "search_daemon/evaluator/evaluator_pool.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::eval;
using kforge::bench::failure_line;
using kforge::bench::silu_signature;
using kforge::bench::silu_spec;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<std::string> devices;   // empty: every visible GPU, else cpu
  uint32_t cpu_slots = 2;
  uint32_t cpu_threads = 1;           // each CPU worker's torch threads (the slots must not share cores)
  int jobs = 0;                       // 0: 16 per slot of the larger pool
  int rounds = 2;
  int64_t elements = 0;               // 0: 1 Mi (CPU) or 16 Mi (CUDA)
};

struct Phase {
  size_t slots = 0;
  int jobs = 0;
  int passed = 0;
  double seconds = 0;
  std::map<std::string, int> per_device;
  std::string first_failure;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Every visible GPU as "cuda:N" (the pool's "auto" without the CPU), or {} without a driver.
std::vector<std::string> visible_gpus() {
  std::vector<std::string> out;
  StatusOr<const CudaDriver*> cu = CudaDriver::load();
  int count = 0;
  if (cu.ok() && (*cu)->cuInit(0) == CUDA_SUCCESS && (*cu)->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int i = 0; i < count; ++i) out.push_back("cuda:" + std::to_string(i));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

class Waiter {
 public:
  void done() {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    cv_.notify_all();
  }
  void wait_for(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
};

// One phase: a pool on `devices` (cpu_slots CPU slots when devices is {"cpu"}), warmed up, then
// `jobs` salted evaluations at once.
Phase run_phase(const std::vector<std::string>& devices, uint32_t cpu_slots, uint32_t cpu_threads, bool cuda, int64_t elements, int jobs,
                int salt, const fs::path& dir, uint64_t& job_id) {
  PoolOptions po;
  po.devices = devices;
  po.cpu_slots = cpu_slots;
  po.cpu_threads = cpu_threads;
  po.program = WorkerOptions::default_program();
  po.build_cache_dir = (dir / ("builds-" + std::to_string(salt))).string();
  EvaluatorPool pool(po);
  Phase p;
  if (Status s = pool.start(); !s.ok()) {
    p.first_failure = "pool start: " + s.message();
    return p;
  }
  p.slots = pool.slots().size();
  // The slots report their arch once their worker is up; nothing can be submitted for the right
  // arch before.
  if (!pool.wait_started(std::chrono::seconds(120))) {
    p.first_failure = "the pool's workers did not start in 120 s";
    return p;
  }
  for (const SlotInfo& s : pool.slots()) {
    if (s.arch.empty()) {
      p.first_failure = s.device + ": " + s.state;
      return p;
    }
  }
  const std::string arch = pool.slots().front().arch;
  const OpSignature sig = silu_signature(cuda, elements, arch);
  std::mutex mu;
  const auto submit = [&](int n, int salt_base, Waiter& w, bool count) {
    for (int i = 0; i < n; ++i) {
      EvalJob j;
      j.job_id = job_id++;
      j.signature = sig;
      j.spec = silu_spec(cuda, salt_base + i);
      j.policy.seed = static_cast<uint64_t>(i + 1);
      pool.submit(std::move(j), [&, count](EvalResult r, JobPlacement where) {
        if (count) {
          std::lock_guard<std::mutex> lock(mu);
          ++p.per_device[where.device];
          if (r.status == EvalStatus::kMeasured) {
            ++p.passed;
          } else if (p.first_failure.empty()) {
            p.first_failure = failure_line(r);
          }
        }
        w.done();
      });
    }
  };
  Waiter warm;   // one job per slot: each worker's first job pays its lazy start-up
  submit(static_cast<int>(p.slots), salt + 900, warm, false);
  warm.wait_for(static_cast<int>(p.slots));
  Waiter all;
  const Clock::time_point t0 = Clock::now();
  submit(jobs, salt, all, true);
  all.wait_for(jobs);
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  p.jobs = jobs;
  return p;
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_pool [--devices cuda:0,cuda:1|cpu] [--cpu-slots N] [--cpu-threads N] [--jobs N] [--rounds N] [--elements N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--devices") o.devices = split(v);
    else if (a == "--cpu-slots") o.cpu_slots = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--cpu-threads") o.cpu_threads = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--jobs") o.jobs = std::atoi(v.c_str());
    else if (a == "--rounds") o.rounds = std::atoi(v.c_str());
    else if (a == "--elements") o.elements = std::atoll(v.c_str());
    else return usage();
  }
  if (o.devices.empty()) o.devices = visible_gpus();
  if (o.devices.empty()) o.devices = {"cpu"};
  const bool cuda = o.devices.front() != "cpu";
  if (!cuda && o.devices.size() != 1) {
    std::fprintf(stderr, "bench_pool: cpu is one device with --cpu-slots slots\n");
    return 2;
  }
  if (cuda && std::any_of(o.devices.begin(), o.devices.end(), [](const std::string& d) { return d == "cpu"; })) {
    std::fprintf(stderr, "bench_pool: compare GPUs or CPU slots, not both\n");
    return 2;
  }
  const size_t most = cuda ? o.devices.size() : o.cpu_slots;
  if (most < 2) std::fprintf(stderr, "bench_pool: only one slot (%s): the ratio is 1 by construction\n", o.devices.front().c_str());
  if (o.jobs <= 0) o.jobs = static_cast<int>(16 * most);
  if (o.rounds <= 0) o.rounds = 1;
  if (o.elements <= 0) o.elements = cuda ? (int64_t{1} << 24) : (int64_t{1} << 20);

  const test_support::TempDir tmp("kforge-bench-pool");   // under $TMPDIR; removed at exit
  const fs::path& dir = tmp.path;
  std::string joined;
  for (const std::string& d : o.devices) joined += (joined.empty() ? "" : ",") + d;
  std::printf("# bench_pool --devices %s --cpu-slots %u --cpu-threads %u --jobs %d --rounds %d --elements %lld\n",
              joined.c_str(), o.cpu_slots, o.cpu_threads, o.jobs, o.rounds, static_cast<long long>(o.elements));

  uint64_t job_id = 1;
  int salt = static_cast<int>(::getpid() % 10000) * 100000 + 1;   // a rerun on a kept cache still compiles
  std::vector<double> one_rate, all_rate;
  bool ok = true;
  std::printf("\nround  slots   evals passed   seconds  evals/min  jobs per slot\n");
  for (int r = 1; r <= o.rounds; ++r) {
    for (const bool all : {false, true}) {
      const std::vector<std::string> devices = cuda && !all ? std::vector<std::string>{o.devices.front()} : o.devices;
      const uint32_t cpu_slots = !cuda && !all ? 1 : o.cpu_slots;
      const Phase p = run_phase(devices, cpu_slots, o.cpu_threads, cuda, o.elements, o.jobs, salt, dir, job_id);
      salt += 1000;
      const double rate = p.seconds > 0 ? 60.0 * p.passed / p.seconds : 0;
      std::string per;
      for (const auto& [device, n] : p.per_device) per += (per.empty() ? "" : ", ") + device + " " + std::to_string(n);
      std::printf("%5d %6zu %7d %6d %9.2f %10.1f  %s\n", r, p.slots, p.jobs, p.passed, p.seconds, rate, per.c_str());
      if (!p.first_failure.empty()) std::printf("  first failure: %s\n", p.first_failure.c_str());
      ok = ok && p.first_failure.empty() && p.passed == o.jobs;
      (all ? all_rate : one_rate).push_back(rate);
      std::fflush(stdout);
    }
  }
  const double one = median(one_rate);
  const double many = median(all_rate);
  std::printf("\nmedian evaluations/min: 1 slot %.1f, %zu slots %.1f; ratio %.2fx (target with two GPUs: >= 1.8x)\n",
              one, most, many, one > 0 ? many / one : 0.0);
  return ok ? 0 : 1;
}

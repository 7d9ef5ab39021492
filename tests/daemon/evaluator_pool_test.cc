// The evaluator pool's scheduling rules (search_daemon/evaluator/evaluator_pool.h), with scripted
// workers (tests/support/scripted_worker_main.cc) standing in for kforge-worker: among the idle
// slots that can run a job, the one whose GPU no serving process uses takes it (else the least
// used); and the job's callback learns where it ran and which serving processes used that GPU
// when it started or when it ended. Timing runs on a GPU a serving process is using are what the
// daemon flags, so both rules decide what an operator is told.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <condition_variable>
#include <cstdio>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "runtime/environment.h"
#include "search_daemon/evaluator/evaluator_pool.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::eval;
using kforge::test_support::TempDir;

namespace {

const std::string kGpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
const std::string kGpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000";

// Sets environment variables for one scope (the pool's workers inherit them).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { ::unsetenv(name_.c_str()); }

 private:
  std::string name_;
};

EvalJob cpu_job(uint64_t id) {
  EvalJob j;
  j.job_id = id;
  TensorMeta t;
  t.sizes = {4, 16};
  t.strides = {16, 1};
  j.signature = OpSignature{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                            Target{Backend::kCpu, cpu_host_environment("scripted").arch}};
  j.spec.backend = Backend::kCpu;
  j.spec.language = SourceLanguage::kCpp;
  j.spec.source = "extern \"C\" void k(const void*, void* const*) {}";
  j.spec.entry_points = {"k"};
  j.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  j.spec.plan.launches = {l};
  return j;
}

// A pool of two scripted CPU slots; the first worker to start names its GPU kGpuA, the second kGpuB.
struct ScriptedPool {
  TempDir dir{"kforge-pool-test"};
  ScopedEnv uuids{"KFORGE_SCRIPTED_UUIDS", kGpuA + "," + kGpuB};
  ScopedEnv claims{"KFORGE_SCRIPTED_DIR", dir.path.string()};
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  std::optional<EvaluatorPool> pool;

  explicit ScriptedPool(bool gated) {
    if (gated) {
      const std::string gate = (dir.path / "gate").string();
      REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
      ::setenv("KFORGE_SCRIPTED_GATE", gate.c_str(), 1);
    }
    PoolOptions o;
    o.devices = {"cpu"};
    o.cpu_slots = 2;
    o.program = KFORGE_SCRIPTED_WORKER;
    o.build_cache_dir = (dir.path / "builds").string();
    o.log = [this](const std::string& line) {
      if (line.find(" ready; ") == std::string::npos) return;
      std::lock_guard<std::mutex> lock(mu);
      ++ready;
      cv.notify_all();
    };
    pool.emplace(o);
    REQUIRE(pool->start().ok());
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return ready == 2; }));
  }
  ~ScriptedPool() {
    pool.reset();
    ::unsetenv("KFORGE_SCRIPTED_GATE");
  }
  std::string gate() const { return (dir.path / "gate").string(); }

  // Submits a job and returns its result's placement (waiting for the callback).
  JobPlacement run(uint64_t id) {
    std::mutex m;
    std::condition_variable done;
    std::optional<std::pair<EvalResult, JobPlacement>> got;
    pool->submit(cpu_job(id), [&](EvalResult r, JobPlacement where) {
      std::lock_guard<std::mutex> lock(m);
      got.emplace(std::move(r), std::move(where));
      done.notify_all();
    });
    std::unique_lock<std::mutex> lock(m);
    REQUIRE(done.wait_for(lock, std::chrono::seconds(60), [&] { return got.has_value(); }));
    CHECK(got->first.status == EvalStatus::kMeasured);
    return got->second;
  }
};

}  // namespace

TEST_CASE("choose_slot: the idle slot whose GPU no serving process uses, else the least used, else the first") {
  CHECK(choose_slot({{0, 0}, {1, 0}}) == 0);
  CHECK(choose_slot({{0, 2}, {1, 0}}) == 1);
  CHECK(choose_slot({{3, 1}, {5, 2}, {7, 1}}) == 3);
  CHECK(choose_slot({{4, 1}}) == 4);
}

TEST_CASE("evaluator pool: a job goes to the idle slot whose GPU no serving process uses, and learns who used its GPU") {
  ScriptedPool p(/*gated=*/false);
  std::vector<SlotInfo> slots = p.pool->slots();
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].uuid != slots[1].uuid);

  // Nobody serves: the first slot, alone on its GPU.
  JobPlacement where = p.run(1);
  CHECK(where.serving_pids.empty());
  CHECK(where.device == "cpu");

  // A serving process on GPU A: jobs go to B, every time.
  p.pool->set_serving_gpus({{kGpuA, {4242}}});
  for (uint64_t id = 2; id < 5; ++id) {
    where = p.run(id);
    CHECK(where.uuid == kGpuB);
    CHECK(where.serving_pids.empty());
  }
  // Both GPUs in use: the less used one, and the callback names its serving process.
  p.pool->set_serving_gpus({{kGpuA, {4242}}, {kGpuB, {101, 202}}});
  where = p.run(5);
  CHECK(where.uuid == kGpuA);
  CHECK(where.serving_pids == std::vector<int32_t>{4242});
}

TEST_CASE("evaluator pool: a serving process that starts using the GPU while a job runs is in its placement too") {
  ScriptedPool p(/*gated=*/true);
  p.pool->set_serving_gpus({{kGpuA, {4242}}});
  std::mutex m;
  std::condition_variable done;
  std::optional<JobPlacement> got;
  p.pool->submit(cpu_job(1), [&](EvalResult, JobPlacement where) {
    std::lock_guard<std::mutex> lock(m);
    got = std::move(where);
    done.notify_all();
  });
  // Opening the gate for writing returns once the worker waits on it: the job is running, on B.
  const int gate = ::open(p.gate().c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(gate >= 0);
  p.pool->set_serving_gpus({{kGpuA, {4242}}, {kGpuB, {777}}});
  REQUIRE(::write(gate, "x", 1) == 1);
  ::close(gate);
  std::unique_lock<std::mutex> lock(m);
  REQUIRE(done.wait_for(lock, std::chrono::seconds(60), [&] { return got.has_value(); }));
  CHECK(got->uuid == kGpuB);
  CHECK(got->serving_pids == std::vector<int32_t>{777});
}

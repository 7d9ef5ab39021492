// The evaluator pool's choice of slot (search_daemon/evaluator/evaluator_pool.h): among the idle
// slots that can run a job, the one whose GPU no serving process uses takes it, else the least
// used, else the earliest. The pool's placement with real workers on real GPUs (who used the GPU a
// timing ran on, flagged by the daemon) is tested end to end on a GPU host:
// tests/python/test_daemon_cuda.py. wait_started() is tested here with workers that cannot start,
// and the priority and thread variables a worker starts with (Note [Idle workers]) with a stand-in
// worker that writes them down.
#include <catch2/catch.hpp>

#include <sched.h>
#include <sys/resource.h>

#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "search_daemon/evaluator/evaluator_pool.h"
#include "tests/support/temp_dir.h"

using namespace kforge::eval;

TEST_CASE("choose_slot: the idle slot whose GPU no serving process uses, else the least used, else the first") {
  CHECK(choose_slot({{0, 0}, {1, 0}}) == 0);
  CHECK(choose_slot({{0, 2}, {1, 0}}) == 1);
  CHECK(choose_slot({{3, 1}, {5, 2}, {7, 1}}) == 3);
  CHECK(choose_slot({{4, 1}}) == 4);
  CHECK(choose_slot({{2, 3}, {6, 3}, {9, 0}}) == 9);
}

TEST_CASE("EvaluatorPool::wait_started: returns once every slot's first start is over, a failed one included") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  PoolOptions o;
  o.devices = {"cpu"};
  o.cpu_slots = 2;
  o.program = (t.path / "no-such-worker").string();   // every start fails at once
  o.build_cache_dir = (t.path / "builds").string();
  EvaluatorPool pool(o);
  REQUIRE(pool.start().ok());
  REQUIRE(pool.wait_started(std::chrono::seconds(60)));
  const std::vector<SlotInfo> slots = pool.slots();
  REQUIRE(slots.size() == 2);
  for (const SlotInfo& s : slots) {
    INFO(s.state);
    CHECK(s.state.rfind("failed: ", 0) == 0);
    CHECK(s.arch.empty());
  }
}

TEST_CASE("cpu_cache_text: a core's caches from sysfs, its own and those it shares, for the LLM prompt") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  auto index = [&](int i, const char* level, const char* type, const char* size, const char* shared) {
    const std::filesystem::path d = t.path / "cpu3" / "cache" / ("index" + std::to_string(i));
    std::filesystem::create_directories(d);
    std::ofstream(d / "level") << level << "\n";
    std::ofstream(d / "type") << type << "\n";
    std::ofstream(d / "size") << size << "\n";
    std::ofstream(d / "shared_cpu_list") << shared << "\n";
  };
  index(0, "1", "Data", "48K", "3");
  index(1, "1", "Instruction", "32K", "3");
  index(2, "2", "Unified", "2048K", "3");
  index(3, "3", "Unified", "491520K", "0-3,8-11");
  CHECK(cpu_cache_text(3, t.path.string()) == "L1d 48 KiB, L2 2 MiB per core; L3 480 MiB shared by 8 cores");
  CHECK(cpu_cache_text(4, t.path.string()).empty());   // no such core: nothing said
}

TEST_CASE("Note [Pinned CPU workers]: each CPU slot gets cores of its own, as many as its torch threads") {
  const std::vector<int> cores = {0, 1, 2, 3, 4, 5, 6, 7};
  // The default (threads 0) on a host that only searches (priority normal): the cores divided
  // among the slots.
  CHECK(cpu_slot_cores(cores, 1, 0, false) == std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(cpu_slot_cores(cores, 2, 0, false) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(cpu_slot_cores(cores, 3, 0, false) == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}});
  // Sharing the host with serving processes (priority idle, the default): half of them, at least one.
  CHECK(cpu_slot_cores(cores, 1, 0) == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  CHECK(cpu_slot_cores(cores, 2, 0) == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(cpu_slot_cores({0, 1}, 1, 0) == std::vector<std::vector<int>>{{0}});
  CHECK(cpu_slot_cores({3}, 1, 0) == std::vector<std::vector<int>>{{3}});
  // A fixed number of threads: that many cores each; fewer cores than asked: they wrap round.
  CHECK(cpu_slot_cores(cores, 2, 1) == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(cpu_slot_cores({0, 1}, 2, 2) == std::vector<std::vector<int>>{{0, 1}, {0, 1}});
  CHECK(cpu_slot_cores({2, 5}, 1, 16) == std::vector<std::vector<int>>{{2, 5}});   // bounded by the cores there are
  CHECK(cpu_slot_cores({}, 1, 0) == std::vector<std::vector<int>>{{}});
  CHECK(cpu_list({0, 3, 12}) == "0,3,12");
  CHECK_FALSE(allowed_cpus().empty());
}

namespace {

EvalJob cpu_job(uint64_t id, const std::string& arch = "x86_64") {
  kforge::TensorMeta t;
  t.sizes = {4, 16};
  t.strides = {16, 1};
  EvalJob j;
  j.job_id = id;
  j.signature = kforge::OpSignature{"aten::_softmax", "",
                                    {kforge::Arg::tensor(t), kforge::Arg::integer(-1), kforge::Arg::boolean(false)},
                                    kforge::Target{kforge::Backend::kCpu, arch}};
  return j;
}

// Counts the callbacks of each job id: the Evaluator's promise is exactly one each.
struct Callbacks {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, int> calls;
  std::map<uint64_t, EvalResult> results;
  Evaluator::Done done() {
    return [this](EvalResult r, JobPlacement) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls[r.job_id];
      results[r.job_id] = std::move(r);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return calls.size() >= n; });
  }
};

}  // namespace

TEST_CASE("Evaluator promise: every job gets exactly one callback, from a slot whose worker cannot start, or from stop()") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  PoolOptions o;
  o.devices = {"cpu"};
  o.cpu_slots = 2;
  o.program = (t.path / "no-such-worker").string();
  o.build_cache_dir = (t.path / "builds").string();
  Callbacks cb;
  {
    EvaluatorPool pool(o);
    REQUIRE(pool.start().ok());
    constexpr uint64_t kJobs = 40;
    for (uint64_t id = 1; id <= kJobs; ++id) pool.submit(cpu_job(id), cb.done());
    // Some are answered by the slots (the worker cannot start: a result), the rest by stop(); none twice.
    pool.stop();
    REQUIRE(cb.wait_for(kJobs, std::chrono::seconds(60)));
    std::lock_guard<std::mutex> lock(cb.mu);
    REQUIRE(cb.calls.size() == kJobs);
    for (const auto& [id, n] : cb.calls) {
      INFO("job " << id);
      CHECK(n == 1);
      const EvalResult& r = cb.results.at(id);
      CHECK(r.status == EvalStatus::kWorkerError);
      CHECK_FALSE(r.message.empty());
    }
  }
  // After stop: answered at once, on the caller's thread.
  EvaluatorPool stopped(o);
  REQUIRE(stopped.start().ok());
  stopped.stop();
  stopped.submit(cpu_job(100), cb.done());
  std::lock_guard<std::mutex> lock(cb.mu);
  CHECK(cb.calls.at(100) == 1);
  CHECK(cb.results.at(100).message == "the daemon is stopping");
}

TEST_CASE("Evaluator promise: a job no slot can run is answered at once, naming the backend and arch") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  PoolOptions o;
  o.devices = {"cpu"};
  o.cpu_slots = 1;
  o.program = (t.path / "no-such-worker").string();
  o.build_cache_dir = (t.path / "builds").string();
  EvaluatorPool pool(o);
  REQUIRE(pool.start().ok());
  Callbacks cb;
  EvalJob j = cpu_job(7);
  j.signature.target.backend = kforge::Backend::kCuda;
  j.signature.target.arch = "sm_90";
  pool.submit(std::move(j), cb.done());
  std::lock_guard<std::mutex> lock(cb.mu);
  REQUIRE(cb.calls.count(7) == 1);
  CHECK(cb.results.at(7).message == "no evaluation slot runs cuda sm_90 signatures");
}

namespace {

// How a process recorded itself: the policy and nice fields of its /proc/<pid>/stat line (fields
// 41 and 19; counted after the ')' that ends the command name, which may hold spaces).
struct Scheduling {
  int policy = -1;
  int nice = 99;
};

Scheduling parse_stat(const std::string& stat) {
  Scheduling s;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return s;
  std::istringstream in(stat.substr(close + 2));
  std::vector<std::string> fields;   // fields[0] is field 3 (state)
  for (std::string f; in >> f;) fields.push_back(f);
  if (fields.size() >= 39) {
    s.nice = std::stoi(fields[19 - 3]);
    s.policy = std::stoi(fields[41 - 3]);
  }
  return s;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A stand-in for kforge-worker that writes down how it was started (its /proc stat line and the
// thread variables it was given), then exits: the slot's start fails, after the record is written.
std::string recording_worker(const kforge::test_support::TempDir& t) {
  const std::string script = t / "record-worker.sh";
  std::ofstream(script) << "#!/bin/sh\n"
                        << "cat /proc/$$/stat > '" << (t / "stat") << ".tmp'\n"
                        << "echo \"$KFORGE_WORKER_CPU_THREADS $OMP_NUM_THREADS $MKL_NUM_THREADS\" > '" << (t / "threads")
                        << "'\n"
                        << "mv '" << (t / "stat") << ".tmp' '" << (t / "stat") << "'\n"
                        << "exit 3\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return script;
}

Scheduling start_recording_slot(const kforge::test_support::TempDir& t, PoolOptions o) {
  o.devices = {"cpu"};
  o.cpu_slots = 1;
  o.cpu_threads = 1;
  o.program = recording_worker(t);
  o.build_cache_dir = t / "builds";
  EvaluatorPool pool(o);
  REQUIRE(pool.start().ok());
  REQUIRE(pool.wait_started(std::chrono::seconds(60)));
  REQUIRE(std::filesystem::exists(t.path / "stat"));
  return parse_stat(read_text(t.path / "stat"));
}

}  // namespace

TEST_CASE("Note [Idle workers]: a pool's worker starts at SCHED_IDLE (else nice 19) with its thread count told to torch and OpenMP and MKL") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  const Scheduling s = start_recording_slot(t, PoolOptions{});
  INFO("policy " << s.policy << ", nice " << s.nice);
  CHECK((s.policy == SCHED_IDLE || (s.policy == SCHED_OTHER && s.nice == 19)));
  // On Linux an unprivileged process may always enter SCHED_IDLE: the fallback is for sandboxes.
  CHECK(s.policy == SCHED_IDLE);
  CHECK(read_text(t.path / "threads") == "1 1 1\n");
}

TEST_CASE("Note [Idle workers]: workers.priority = normal leaves the worker at the daemon's own priority") {
  const kforge::test_support::TempDir t("kforge-pool-test");
  PoolOptions o;
  o.priority = WorkerPriority::kNormal;
  const Scheduling s = start_recording_slot(t, o);
  CHECK(s.policy == ::sched_getscheduler(0));
  errno = 0;
  CHECK(s.nice == ::getpriority(PRIO_PROCESS, 0));
}

TEST_CASE("worker priority names: idle and normal, nothing else") {
  CHECK(parse_worker_priority("idle") == WorkerPriority::kIdle);
  CHECK(parse_worker_priority("normal") == WorkerPriority::kNormal);
  CHECK_FALSE(parse_worker_priority("low").has_value());
  CHECK_FALSE(parse_worker_priority("").has_value());
  CHECK(worker_priority_name(WorkerPriority::kIdle) == "idle");
  CHECK(scheduling_of(0).rfind("SCHED_", 0) == 0);
  CHECK_THAT(scheduling_of(-5), Catch::Contains("unknown ("));
}

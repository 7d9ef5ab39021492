// The evaluator pool's choice of slot (search_daemon/evaluator/evaluator_pool.h): among the idle
// slots that can run a job, the one whose GPU no serving process uses takes it, else the least
// used, else the earliest. The pool's placement with real workers on real GPUs (who used the GPU a
// timing ran on, flagged by the daemon) is tested end to end on a GPU host:
// tests/python/test_daemon_cuda.py. wait_started() is tested here with workers that cannot start.
#include <catch2/catch.hpp>

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

TEST_CASE("Note [Pinned CPU workers]: each CPU slot gets cores of its own, as many as its torch threads") {
  const std::vector<int> cores = {0, 1, 2, 3, 4, 5, 6, 7};
  // The default (threads 0): the cores divided among the slots.
  CHECK(cpu_slot_cores(cores, 1, 0) == std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(cpu_slot_cores(cores, 2, 0) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(cpu_slot_cores(cores, 3, 0) == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}});
  // A fixed number of threads: that many cores each; fewer cores than asked: they wrap round.
  CHECK(cpu_slot_cores(cores, 2, 1) == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(cpu_slot_cores({0, 1}, 2, 2) == std::vector<std::vector<int>>{{0, 1}, {0, 1}});
  CHECK(cpu_slot_cores({2, 5}, 1, 16) == std::vector<std::vector<int>>{{2, 5}});   // bounded by the cores there are
  CHECK(cpu_slot_cores({}, 1, 0) == std::vector<std::vector<int>>{{}});
  CHECK(cpu_list({0, 3, 12}) == "0,3,12");
  CHECK_FALSE(allowed_cpus().empty());
}

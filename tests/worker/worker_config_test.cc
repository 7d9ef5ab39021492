// The worker's configuration (search_daemon/worker/worker_config.h): read once, every bad value one
// error naming the variable and the value.
#include <catch2/catch.hpp>

#include <map>

#include "search_daemon/worker/worker_config.h"

using namespace kforge;
using namespace kforge::eval;

namespace {

WorkerConfig::Lookup table(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("worker config: defaults, the pool's settings, and one error per bad value") {
  StatusOr<WorkerConfig> d = WorkerConfig::from_env(table({}));
  REQUIRE(d.ok());
  CHECK(d->cpu_threads == 0);
  CHECK(d->cpus.empty());
  CHECK(d->cupti);
  CHECK(d->cxx == "c++");
  CHECK(d->to_string() == "cpu_threads=default cpus=(not pinned) cupti=on cxx=c++");

  StatusOr<WorkerConfig> pool = WorkerConfig::from_env(table(
      {{"KFORGE_WORKER_CPU_THREADS", "2"}, {"KFORGE_WORKER_CPUS", "0,1"}, {"KFORGE_WORKER_NO_CUPTI", "1"}, {"KFORGE_CXX", "clang++"}}));
  REQUIRE(pool.ok());
  CHECK(pool->cpu_threads == 2);
  CHECK(pool->cpus == "0,1");
  CHECK_FALSE(pool->cupti);
  CHECK(pool->cxx == "clang++");
  CHECK(WorkerConfig::from_env(table({{"KFORGE_WORKER_NO_CUPTI", "0"}}))->cupti);
  CHECK_FALSE(d->profile);
  CHECK_FALSE(WorkerConfig::from_env(table({{"KFORGE_WORKER_PROFILE", "0"}}))->profile);
  StatusOr<WorkerConfig> profiled = WorkerConfig::from_env(table({{"KFORGE_WORKER_PROFILE", "1"}}));
  REQUIRE(profiled.ok());
  CHECK(profiled->profile);
  CHECK(profiled->to_string() == "cpu_threads=default cpus=(not pinned) cupti=on cxx=c++ profile=on");

  for (const char* bad : {"0", "-1", "4097", "two", "2x"}) {
    StatusOr<WorkerConfig> c = WorkerConfig::from_env(table({{"KFORGE_WORKER_CPU_THREADS", bad}}));
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message() == std::string("KFORGE_WORKER_CPU_THREADS=") + bad + ": expected 1..4096");
  }
  StatusOr<WorkerConfig> cpus = WorkerConfig::from_env(table({{"KFORGE_WORKER_CPUS", "0-3"}}));
  REQUIRE_FALSE(cpus.ok());
  CHECK(cpus.status().message() == "KFORGE_WORKER_CPUS=0-3: expected a list of core numbers (\"0,1\")");
}

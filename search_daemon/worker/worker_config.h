// WorkerConfig: every variable the evaluation worker reads, parsed once when it starts
// (worker_main.cc) and said in its WorkerReady note; nothing in the worker calls getenv itself.
//
//   StatusOr<WorkerConfig> c = WorkerConfig::from_env(process_env());
//   if (!c.ok()) return fail(c.status().message());   // one line naming the variable and the value
//
// Variables (set by the daemon's pool for its workers; by hand only to debug one):
//   KFORGE_WORKER_CPU_THREADS   torch's intra-op threads for CPU work, 1..4096 (unset: torch's default)
//   KFORGE_WORKER_CPUS          the cores the launcher pinned the worker to ("0,1"; Note [Pinned CPU
//                               workers] in evaluator/evaluator_pool.h), reported only
//   KFORGE_WORKER_NO_CUPTI      any value but 0: time CUDA work with events, not CUPTI
//   KFORGE_CXX                  the compiler of CPU candidates (default c++)
//   KFORGE_WORKER_PROFILE       any value but 0: one line on stderr per verification, where its
//                               time went (Note [Verify profile] in verifier.cc)
// (The launcher reads KFORGE_PYTHON, KFORGE_WORKER_LIB_DIR and KFORGE_WORKER_CPUS before python
// starts: worker_launcher.cc.)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/status.h"

namespace kforge::eval {

struct WorkerConfig {
  uint32_t cpu_threads = 0;   // 0: torch's default
  std::string cpus;           // "" when not pinned
  bool cupti = true;
  std::string cxx = "c++";
  bool profile = false;

  using Lookup = std::function<std::optional<std::string>(const char* name)>;
  static StatusOr<WorkerConfig> from_env(const Lookup& env);
  // "cpu_threads=2 cpus=0,1 cupti=on cxx=c++"
  std::string to_string() const;
};

}  // namespace kforge::eval

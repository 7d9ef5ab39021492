// What a search session tells the daemon, and the states it goes through. Plain values: the
// session builds them on its thread, the daemon's I/O thread reads them (counters, log lines, the
// PUB socket, the status document). Printed names only at the edge (session_state_name).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/environment.h"
#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::daemon {

enum class SessionState : uint8_t {
  kStarting,    // before its journal is open
  kSearching,
  kStopped,     // the daemon stopped it; the journal resumes it next time
  kDone,        // a budget was spent or the space exhausted: final
  kFailed,      // it could not run (journal, cache, strategy): final
};
std::string_view session_state_name(SessionState s) noexcept;   // "starting", "searching", ...

struct SessionEvent {
  enum class Kind { kNode, kResult, kPublished, kFinished };
  Kind kind = Kind::kNode;
  SignatureId signature;
  uint64_t node = 0;
  uint64_t parent = 0;
  std::string proposer;
  std::string label;
  eval::EvalStatus status = eval::EvalStatus::kWorkerError;
  std::string message;              // result: why it failed; finished: why it ended
  SessionState end = SessionState::kDone;   // finished: the state it ended in
  double speedup = 0;
  std::string entry_key;            // published
  EnvironmentKey environment_key;   // published
  uint64_t evaluations = 0;         // finished: outcomes in the tree
  // result: where it ran (eval::JobPlacement's device and GPU UUID); result and published: the
  // serving processes that used that GPU while it was timed (Outcome::shared_gpu_pids).
  std::string device;
  std::string uuid;
  std::vector<int32_t> shared_gpu_pids;
  // result: why its timing cannot be believed (Outcome::implausible); "" when it can.
  std::string implausible;
  // result: whether the worker's build came from the build cache (no compile ran), and the
  // milliseconds its build took (eval::EvalResult's build_cached, build_ms).
  bool build_cached = false;
  double build_ms = 0;
};

}  // namespace kforge::daemon

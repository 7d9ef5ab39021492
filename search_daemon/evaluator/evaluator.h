// Evaluator: where a search sends its candidates to be built, verified and timed. The interface
// SearchSession depends on; EvaluatorPool (evaluator_pool.h: one supervised kforge-worker per
// slot) is the implementation kforged runs.
//
//   evaluator.submit(std::move(job), [](EvalResult r, JobPlacement where) { ... });
//   size_t n = evaluator.idle_slots_for(sig);   // how many more jobs for sig would start now
//
// Promises every implementation keeps:
// - submit() never blocks and never throws; every submitted job gets exactly one callback, with
//   its result as a value (a compile error, a failed check, a timeout are results), also when the
//   evaluator stops ("the daemon is stopping"). The callback may run on another thread.
// - idle_slots_for() is a hint for how many jobs to submit at once, never a promise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::eval {

// Where a job ran.
struct JobPlacement {
  std::string device;                    // the slot's device, "cuda:0"; "" when no slot ran it
  std::string uuid;                      // its GPU ("" for cpu, or unknown)
  // Serving processes using that GPU when the job started or when it ended (sorted, unique).
  std::vector<int32_t> serving_pids;
};

class Evaluator {
 public:
  using Done = std::function<void(EvalResult, JobPlacement)>;
  virtual ~Evaluator() = default;
  virtual void submit(EvalJob job, Done done) = 0;
  virtual size_t idle_slots_for(const OpSignature& sig) const = 0;
};

}  // namespace kforge::eval

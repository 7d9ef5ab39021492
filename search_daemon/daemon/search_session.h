// SearchSession: one signature's search, on a thread of its own: the loop generate -> evaluate ->
// notify of its SearchStrategy against an Evaluator (evaluator.h; kforged's is the pool), with the
// observers that give a result its effects (result_observers.h): the cache (a verified winner
// becomes an entry the hooks load), the journal (resume after a crash), and the daemon's events
// (KernelReady to the processes, the GUI's event stream, metrics).
//
//   SearchSession s(signature_record, context);   // opens the journal, restores the tree
//   s.start();                                    // the search thread
//   ... s.progress() ...                          // for status, from any thread
//   s.stop(); s.join();                           // in-flight evaluations finish first
//
// Promises:
// - Candidates are submitted only while the budgets allow: the signature's max evaluations and
//   wall time, and the daemon's max_evaluations_total (a shared counter), counting in-flight ones.
// - Every outcome is journaled (fdatasync) after its effects: a winner is in the cache before its
//   outcome is in the journal, so a daemon killed in between re-evaluates that one candidate once
//   and never loses a published kernel.
// - A result that improves (measured, significant, speedup > 1) and beats the best so far is
//   published at once (Store::publish: atomic, replaces this signature's entry for that
//   environment) and announced (Event::kPublished).
// - A result whose timing is implausible (Note [Plausible timing] in worker/measurer.h: flagged
//   by the worker, or a baseline over max_baseline_observed_ratio x what the serving processes
//   observe) is never published; its outcome and result event say why.
// - A result with timings (TimingOutcome::runs > 0) from a GPU that serving processes used while
//   it ran (eval::JobPlacement) has those pids in its outcome (journaled) and its events; the
//   log line of a winner published from it says so.
// - A proposer working in the background (Note [Asynchronous proposals] in proposer.h) never
//   ends the search for having nothing now: the session sleeps until it delivers (it wakes the
//   session), a result arrives, stop() or the wall-time budget; it never spins.
// - Nothing throws out of the thread; a session that cannot run (journal unusable) ends with
//   state failed and a reason.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/environment.h"
#include "runtime/op_signature.h"
#include "search_daemon/daemon/prebuilder.h"
#include "search_daemon/daemon/session_events.h"
#include "search_daemon/evaluator/evaluator.h"
#include "search_daemon/proposers/proposer.h"
#include "search_daemon/search/search_strategy.h"

namespace kforge::daemon {

struct SessionContext {
  eval::Evaluator* evaluator = nullptr;
  std::vector<search::Proposer*> proposers;
  std::string strategy = "mcts";
  search::StrategyOptions options;           // max_evaluations = the per-signature budget
  uint32_t max_seconds = 1800;
  std::atomic<uint64_t>* evaluations_total = nullptr;   // shared by every session
  uint64_t max_evaluations_total = 0;
  std::atomic<uint64_t>* next_job_id = nullptr;
  std::string state_dir;
  std::string cache_dir;
  uint32_t measure_runs = 30;
  uint32_t compile_budget_ms = 60000;
  uint32_t run_budget_ms = 30000;
  // Note [Plausible timing] in worker/measurer.h: the worker's check against the cost model
  // (InputPolicy::max_baseline_model_ratio), and the session's against what the serving processes
  // observe: a baseline over this many times their mean sampled time (search::Roofline's
  // baseline_ns) cannot be believed either. 0: no check.
  double max_baseline_model_ratio = 250;
  double max_baseline_observed_ratio = 20;
  // Note [Builds ahead] (prebuilder.h): the nodes a round adds and does not submit, hinted for a
  // build into the workers' cache. Null: none.
  Prebuilder* prebuilder = nullptr;
  std::function<void(SessionEvent)> on_event;   // called on the session thread
  std::function<void(const std::string&)> log;
};

struct SessionProgress {
  SessionState state = SessionState::kStarting;
  std::string reason;
  uint64_t nodes = 0;
  uint64_t evaluated = 0;
  uint64_t in_flight = 0;
  double best_speedup = 0;
  std::string best_label;
  std::string entry_key;
};

class SearchSession {
 public:
  SearchSession(OpSignature signature, std::vector<wire::InputStats> input_stats,
                std::vector<wire::CapturedInputs> captured, search::Roofline roofline, SessionContext context);
  ~SearchSession();
  SearchSession(const SearchSession&) = delete;
  SearchSession& operator=(const SearchSession&) = delete;

  void start();
  // Asks the search to end: nothing new is submitted, in-flight evaluations are awaited.
  void stop();
  // Ends the search for good (a person asked, from the GUI): in-flight evaluations finish first,
  // then the journal is marked done with `reason`, so a restarted daemon does not resume it.
  void stop_for_good(const std::string& reason);
  void join();
  bool finished() const noexcept { return finished_.load(); }
  SessionProgress progress() const;
  const OpSignature& signature() const noexcept { return signature_; }

 private:
  void run();
  void finish(SessionState state, const std::string& reason);
  // Note [Plausible timing]: why the worker's baseline cannot be believed against the serving
  // processes' own observation, or "".
  std::string implausible_against_observed(const eval::TimingOutcome& t) const;
  // A proposer's background work is done: the loop asks the strategy again.
  void wake();
  // Note [Builds ahead]: the tree's nodes from `first` on that have no outcome and are not in
  // `batch`, then the strategy's held-back moves (SearchStrategy::upcoming), hinted to
  // ctx_.prebuilder lowest prior first.
  void hint_builds(const search::SearchStrategy& strategy, size_t first, const std::vector<search::Candidate>& batch) const;

  // What a proposer's on_ready reaches: the session while it exists (unlinked by the destructor),
  // since a model's answer may arrive after the search ended.
  struct WakeLink {
    std::mutex mu;
    SearchSession* session = nullptr;
  };

  OpSignature signature_;
  std::vector<wire::InputStats> input_stats_;
  std::vector<wire::CapturedInputs> captured_;
  search::Roofline roofline_;
  SessionContext ctx_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::string final_reason_;   // guarded by mu_: set by stop_for_good()
  std::atomic<bool> finished_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Finished {
    uint64_t node = 0;
    eval::EvalResult result;
    eval::JobPlacement where;
  };
  std::deque<Finished> results_;
  bool woken_ = false;   // wake() since the loop last looked
  SessionProgress progress_;
  std::shared_ptr<WakeLink> wake_link_;
};

}  // namespace kforge::daemon

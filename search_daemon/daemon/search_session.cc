#include "search_daemon/daemon/search_session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#include "cache/store.h"
#include "search_daemon/daemon/result_observers.h"
#include "search_daemon/daemon/hot_signatures.h"
#include "search_daemon/daemon/journal.h"
#include "search_daemon/search/strategy_base.h"

namespace kforge::daemon {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SearchSession::SearchSession(OpSignature signature, std::vector<wire::InputStats> input_stats,
                             std::vector<wire::CapturedInputs> captured, search::Roofline roofline,
                             SessionContext context)
    : signature_(std::move(signature)),
      input_stats_(std::move(input_stats)),
      captured_(std::move(captured)),
      roofline_(roofline),
      ctx_(std::move(context)),
      wake_link_(std::make_shared<WakeLink>()) {
  wake_link_->session = this;
}

SearchSession::~SearchSession() {
  stop();
  join();
  std::lock_guard<std::mutex> lock(wake_link_->mu);
  wake_link_->session = nullptr;
}

void SearchSession::wake() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_all();
}

std::string SearchSession::implausible_against_observed(const eval::TimingOutcome& t) const {
  const double observed = roofline_.baseline_ns;
  const double ratio = ctx_.max_baseline_observed_ratio;
  if (ratio <= 0 || observed <= 0 || !(t.baseline_median_ns > ratio * observed)) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "PyTorch's kernel measured %.0f ns in the worker, %.0fx the %.0f ns the serving processes observe: a "
                "broken measurement (a contended host?)",
                t.baseline_median_ns, t.baseline_median_ns / observed, observed);
  return buf;
}

void SearchSession::hint_builds(const search::SearchStrategy& strategy, size_t first,
                                const std::vector<search::Candidate>& batch) const {
  const search::SearchTree& tree = strategy.tree();
  std::vector<const search::Move*> fresh = strategy.upcoming();
  for (size_t id = first; id < tree.size(); ++id) {
    const search::Node& n = tree.node(id);
    if (id == 0 || n.outcome.has_value()) continue;
    bool submitted = false;
    for (const search::Candidate& c : batch) submitted = submitted || c.node == id;
    if (!submitted) fresh.push_back(&n.move);
  }
  // The prebuilder builds the newest hint first: the most promising last.
  std::stable_sort(fresh.begin(), fresh.end(),
                   [](const search::Move* a, const search::Move* b) { return a->prior < b->prior; });
  for (const search::Move* m : fresh) ctx_.prebuilder->hint(m->spec, m->proposer, signature_.target.arch);
}

void SearchSession::start() { thread_ = std::thread([this] { run(); }); }

void SearchSession::stop() {
  stop_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void SearchSession::stop_for_good(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_reason_ = reason.empty() ? "stopped for good" : reason;
  }
  stop();
}

void SearchSession::join() {
  if (thread_.joinable()) thread_.join();
}

SessionProgress SearchSession::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

void SearchSession::finish(SessionState state, const std::string& reason) {
  uint64_t evaluated = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.state = state;
    progress_.reason = reason;
    evaluated = progress_.evaluated;
  }
  SessionEvent e;
  e.kind = SessionEvent::Kind::kFinished;
  e.signature = signature_.id();
  e.end = state;
  e.message = reason;
  e.evaluations = evaluated;
  if (ctx_.on_event) ctx_.on_event(e);
  finished_.store(true);
}

void SearchSession::run() {
  try {
    const SignatureId sig_id = signature_.id();
    auto log = [&](const std::string& line) {
      if (ctx_.log) ctx_.log("search " + sig_id.hex().substr(0, 12) + ": " + line);
    };
    StatusOr<SearchJournal> journal = SearchJournal::open(ctx_.state_dir, signature_, ctx_.strategy);
    if (!journal.ok()) return finish(SessionState::kFailed, "journal: " + journal.status().message());
    const SearchJournal::Contents& restored = journal->restored();
    if (restored.done) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        progress_.nodes = restored.tree.size();
        progress_.evaluated = restored.tree.evaluated();
        if (const search::Node* b = restored.tree.best()) {
          progress_.best_speedup = b->outcome->speedup;
          progress_.best_label = b->move.label;
        }
      }
      return finish(SessionState::kDone, "finished earlier: " + restored.done_reason);
    }
    if (restored.tree.size() > 1) {
      log("resuming from " + journal->path() + ": " + std::to_string(restored.tree.size() - 1) + " nodes, " +
          std::to_string(restored.tree.evaluated()) + " evaluated" +
          (restored.truncated_bytes > 0 ? ", a torn tail of " + std::to_string(restored.truncated_bytes) + " bytes cut" : ""));
    }
    StatusOr<Store> store = Store::open(ctx_.cache_dir);
    if (!store.ok()) return finish(SessionState::kFailed, "cache: " + store.status().message());

    search::SearchTask task{signature_, roofline_, [link = wake_link_] {
                              std::lock_guard<std::mutex> lock(link->mu);
                              if (link->session != nullptr) link->session->wake();
                            }};
    std::unique_ptr<search::SearchStrategy> strategy =
        search::make_strategy(ctx_.strategy, task, ctx_.proposers, ctx_.options, restored.tree);
    if (!strategy) return finish(SessionState::kFailed, "unknown strategy " + ctx_.strategy);

    size_t journaled = strategy->tree().size();
    double best = 0;
    if (const search::Node* b = strategy->tree().best()) best = b->outcome->speedup;
    // What each result does, in order (result_observers.h).
    WinnerPublisher publisher(*store, best, ctx_.on_event, log);
    OutcomeJournal journaled_outcomes(*journal);
    ResultEvents result_events(ctx_.on_event);
    ResultObserver* const observers[] = {&publisher, &journaled_outcomes, &result_events};
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_.state = SessionState::kSearching;
      progress_.best_speedup = best;
    }
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(ctx_.max_seconds);
    uint64_t in_flight = 0;
    std::string end_reason;
    bool stopped = false;   // by stop(): resumed from the journal next time, not done
    // Consecutive rounds in which the strategy, not done, offered nothing to evaluate.
    constexpr uint32_t kMaxEmptyRounds = 2 * search::kMaxRetriedProposals;
    uint32_t empty_rounds = 0;

    for (;;) {
      const search::SearchTree& tree = strategy->tree();
      const bool budget_left = tree.evaluated() + in_flight < ctx_.options.max_evaluations;
      if (stop_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        stopped = final_reason_.empty();
        end_reason = stopped ? "stopped" : final_reason_;
      }
      else if (Clock::now() >= deadline) end_reason = "wall-time budget of " + std::to_string(ctx_.max_seconds) + " s spent";
      else if (!budget_left && in_flight == 0) end_reason = "evaluation budget of " + std::to_string(ctx_.options.max_evaluations) + " spent";
      else if (strategy->done() && in_flight == 0) end_reason = "the search space is exhausted";
      if (!end_reason.empty() && in_flight == 0) break;

      // Submit what the slots can take now (at least one when nothing is running).
      if (end_reason.empty() && budget_left) {
        size_t want = ctx_.evaluator->idle_slots_for(signature_);
        if (want == 0 && in_flight == 0) want = 1;
        const uint64_t left = ctx_.options.max_evaluations - tree.evaluated() - in_flight;
        want = std::min<size_t>(want, left);
        std::vector<search::Candidate> batch;
        if (want > 0) batch = strategy->next_candidates(want);
        // Every node the strategy added (the candidates and their untried siblings) is journaled
        // before anything is evaluated.
        const size_t first_new = journaled;
        for (; journaled < strategy->tree().size(); ++journaled) {
          const search::Node& n = strategy->tree().node(journaled);
          if (Status s = journal->append_node(n); !s.ok()) {
            end_reason = "journal: " + s.message();
            break;
          }
          SessionEvent e;
          e.kind = SessionEvent::Kind::kNode;
          e.signature = sig_id;
          e.node = n.id;
          e.parent = n.parent;
          e.proposer = n.move.proposer;
          e.label = n.move.label;
          if (ctx_.on_event) ctx_.on_event(e);
        }
        if (ctx_.prebuilder != nullptr) hint_builds(*strategy, first_new, batch);
        for (search::Candidate& c : batch) {
          if (ctx_.evaluations_total->fetch_add(1) >= ctx_.max_evaluations_total) {
            ctx_.evaluations_total->fetch_sub(1);
            end_reason = "the daemon's evaluation budget of " + std::to_string(ctx_.max_evaluations_total) + " is spent";
            break;
          }
          eval::EvalJob job;
          job.job_id = ctx_.next_job_id->fetch_add(1);
          job.signature = signature_;
          job.spec = std::move(c.move.spec);
          job.policy.seed = ctx_.options.seed ^ (c.node * 0x9E3779B97F4A7C15ull);
          job.policy.measure_runs = ctx_.measure_runs;
          job.policy.max_baseline_model_ratio = ctx_.max_baseline_model_ratio;
          job.input_stats = input_stats_;
          job.captured = captured_;
          job.compile_budget_ms = ctx_.compile_budget_ms;
          job.run_budget_ms = ctx_.run_budget_ms;
          if (Status s = journal->append_submitted(c.node); !s.ok()) {
            ctx_.evaluations_total->fetch_sub(1);
            end_reason = "journal: " + s.message();
            break;
          }
          ++in_flight;
          const uint64_t node = c.node;
          ctx_.evaluator->submit(std::move(job), [this, node](eval::EvalResult r, eval::JobPlacement where) {
            std::lock_guard<std::mutex> lock(mu_);
            results_.push_back(Finished{node, std::move(r), std::move(where)});
            cv_.notify_all();
          });
        }
        if (in_flight == 0 && batch.empty() && end_reason.empty() && strategy->awaiting_proposals()) {
          // Note [Asynchronous proposals]: a model is writing; nothing else to do until it answers.
          std::unique_lock<std::mutex> lock(mu_);
          progress_.nodes = strategy->tree().size();
          progress_.evaluated = strategy->tree().evaluated();
          progress_.in_flight = 0;
          cv_.wait_until(lock, deadline, [&] { return woken_ || stop_.load(); });
          woken_ = false;
          continue;
        }
        if (in_flight == 0 && batch.empty() && end_reason.empty()) {
          // Note [Retried proposals] (strategy_base.cc): a proposer may ask to be asked again; a
          // few rounds, not forever.
          if (!strategy->done() && ++empty_rounds <= kMaxEmptyRounds) continue;
          end_reason = strategy->done() ? "the search space is exhausted" : "the proposers have nothing to evaluate";
          continue;
        }
        if (!batch.empty()) empty_rounds = 0;
      }

      if (in_flight == 0) continue;   // nothing to wait for: the loop's top decides what is next
      // Wait for results (or a stop).
      std::deque<Finished> ready;
      {
        std::unique_lock<std::mutex> lock(mu_);
        progress_.nodes = strategy->tree().size();
        progress_.evaluated = strategy->tree().evaluated();
        progress_.in_flight = in_flight;
        cv_.wait(lock, [&] { return !results_.empty() || woken_ || (stop_.load() && in_flight == 0); });
        woken_ = false;
        ready.swap(results_);
      }
      std::vector<std::pair<uint64_t, search::Outcome>> outcomes;
      for (auto& [node, r, where] : ready) {
        --in_flight;
        search::Outcome o = search::outcome_of(r);
        o.finished_unix_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       std::chrono::system_clock::now().time_since_epoch())
                                                       .count());
        // Timed on a GPU a serving process used meanwhile: flagged (the daemon counts and logs it).
        if (r.timing.runs > 0 && !where.uuid.empty()) o.shared_gpu_pids = where.serving_pids;
        if (o.measured() && o.implausible.empty()) o.implausible = implausible_against_observed(r.timing);
        const EvaluatedNode evaluated{signature_, node, strategy->tree().node(node), r, where, o};
        for (ResultObserver* observer : observers) {
          if (Status s = observer->on_result(evaluated); !s.ok() && end_reason.empty()) end_reason = "journal: " + s.message();
        }
        if (publisher.best() > best) {
          best = publisher.best();
          std::lock_guard<std::mutex> lock(mu_);
          progress_.best_speedup = best;
          progress_.best_label = publisher.best_label();
          progress_.entry_key = publisher.entry_key();
        }
        outcomes.emplace_back(node, std::move(o));
      }
      if (!outcomes.empty()) strategy->notify_results(outcomes);
    }
    // A search stopped by the daemon's shutdown is resumed next time; any other end is final.
    if (!stopped) (void)journal->append_done(end_reason);
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_.nodes = strategy->tree().size();
      progress_.evaluated = strategy->tree().evaluated();
      progress_.in_flight = 0;
    }
    finish(stopped ? SessionState::kStopped : SessionState::kDone, end_reason);
  } catch (const std::exception& e) {
    finish(SessionState::kFailed, std::string("internal error: ") + e.what());
  }
}

}  // namespace kforge::daemon

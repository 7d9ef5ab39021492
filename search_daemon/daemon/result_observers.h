// What a search does with each evaluated candidate: small observers SearchSession calls on its
// thread, in this order, for every result (the order is Note [Journal format]'s promise: a winner
// is in the cache before its outcome is in the journal).
//
//   WinnerPublisher   a result that improves on the best so far (measured, significant, > 1, a
//                     plausible timing) becomes a cache entry at once, and a kPublished event
//   OutcomeJournal    the outcome is journaled (fdatasync), so a restarted daemon resumes here
//   ResultEvents      the kResult event (the daemon counts it, logs what needs saying, PUBs it)
//
//   std::vector<ResultObserver*> observers{&publisher, &journal, &events};
//   for (ResultObserver* o : observers) KFORGE_RETURN_IF_ERROR(o->on_result(evaluated));
//
// An observer's error ends the search with it as the reason (a journal that cannot be written);
// a winner the cache refuses is logged and the search goes on (the next winner may be published).
#pragma once

#include <functional>
#include <string>

#include "cache/store.h"
#include "runtime/op_signature.h"
#include "runtime/status.h"
#include "search_daemon/daemon/journal.h"
#include "search_daemon/daemon/session_events.h"
#include "search_daemon/evaluator/evaluator.h"
#include "search_daemon/search/search_tree.h"

namespace kforge::daemon {

// One evaluated node and everything known about it.
struct EvaluatedNode {
  const OpSignature& signature;
  uint64_t id;                       // the node's id in the tree
  const search::Node& node;          // its move (spec, proposer, label) and parent
  const eval::EvalResult& result;
  const eval::JobPlacement& where;
  const search::Outcome& outcome;    // what the search learns (flags included)
};

class ResultObserver {
 public:
  virtual ~ResultObserver() = default;
  virtual Status on_result(const EvaluatedNode& n) = 0;
};

using EventSink = std::function<void(SessionEvent)>;
using LogSink = std::function<void(const std::string&)>;

class WinnerPublisher final : public ResultObserver {
 public:
  // `best`: the best speedup already published for the signature (a restored tree's).
  WinnerPublisher(Store& store, double best, EventSink emit, LogSink log)
      : store_(store), best_(best), emit_(std::move(emit)), log_(std::move(log)) {}
  Status on_result(const EvaluatedNode& n) override;
  double best() const noexcept { return best_; }
  const std::string& best_label() const noexcept { return best_label_; }
  const std::string& entry_key() const noexcept { return entry_key_; }

 private:
  Store& store_;
  double best_;
  std::string best_label_;
  std::string entry_key_;
  EventSink emit_;
  LogSink log_;
};

class OutcomeJournal final : public ResultObserver {
 public:
  explicit OutcomeJournal(SearchJournal& journal) : journal_(journal) {}
  Status on_result(const EvaluatedNode& n) override { return journal_.append_outcome(n.id, n.outcome); }

 private:
  SearchJournal& journal_;
};

class ResultEvents final : public ResultObserver {
 public:
  explicit ResultEvents(EventSink emit) : emit_(std::move(emit)) {}
  Status on_result(const EvaluatedNode& n) override;

 private:
  EventSink emit_;
};

}  // namespace kforge::daemon

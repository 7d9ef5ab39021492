// StrategyBase: the bookkeeping every SearchStrategy shares, so that each strategy's file holds only
// its rule for what to evaluate next. Internal to search/: callers see search_strategy.h alone.
//
// It owns the tree and keeps the promises of search_strategy.h that do not depend on the rule:
// - the budget: outcomes + evaluations in flight never exceed max_evaluations;
// - in-flight tracking: a node is handed out once; notify_results() takes only outcomes of nodes
//   in flight (anything else, a duplicate or an unknown id, is ignored) and backs each one up along
//   its lineage (visits, value_sum += reward(), virtual_loss -= 1; Node's statistics);
// - restore: statistics recomputed from the outcomes, and the nodes without an outcome handed out
//   before anything the rule picks: first those that were in flight (virtual_loss > 0 on the node
//   itself in the restored tree), then the others, each group in id order;
// - proposer calls: only proposers that support the signature, each call guarded (a proposer that
//   throws counts as one with nothing to offer), moves that fail KernelSpec::validate() or target
//   another backend dropped, duplicates of the tree dropped.
// - asynchronous proposers (Note [Asynchronous proposals] in proposer.h): a node a proposer is
//   working for is never exhausted for it nor asked of it again until its work is collected;
//   collected moves join the tree under that node and are handed out before anything the rule picks.
// - done() == (budget spent) or (nothing in flight, no proposer working, and the rule can produce
//   nothing), and next_candidates() returning nothing while nothing is in flight implies done() or
//   awaiting_proposals().
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "search_daemon/search/search_strategy.h"

namespace kforge::search {

// Note [Retried proposals] in strategy_base.cc: empty requests from one node that a proposer asked
// to retry before the node is exhausted.
inline constexpr uint32_t kMaxRetriedProposals = 3;

class StrategyBase : public SearchStrategy {
 public:
  StrategyBase(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored);
  // Releases what the proposers keep for this search (Proposer::release).
  ~StrategyBase() override;
  StrategyBase(const StrategyBase&) = delete;
  StrategyBase& operator=(const StrategyBase&) = delete;

  std::vector<Candidate> next_candidates(size_t max) final;
  void notify_results(const std::vector<std::pair<uint64_t, Outcome>>& results) final;
  bool done() const final;
  bool awaiting_proposals() const final { return !awaiting_.empty(); }
  const SearchTree& tree() const final { return tree_; }

 protected:
  // The rule: the next node to hand out (one that is pending()), growing the tree as it likes;
  // nullopt when it has nothing now. Once it returns nullopt, can_produce() must be false until
  // an outcome arrives.
  virtual std::optional<uint64_t> select() = 0;
  // Whether select() could return a node now. Const and cheap: it never calls a proposer, so it
  // may say yes where the proposers turn out to have nothing (select() then learns that).
  virtual bool can_produce() const = 0;

  // Not the root, no outcome, not in flight: a node that may be handed out.
  bool pending(uint64_t id) const;
  bool in_flight(uint64_t id) const { return in_flight_.count(id) != 0; }
  // The root, or a node with an outcome: what may be expanded (a failed node too: repairs).
  bool expandable(uint64_t id) const;
  // New moves from `parent`: every supporting proposer asked for up to max_moves, in proposer order,
  // then stable-sorted by prior (highest first). Moves whose spec is in the tree, or repeated in
  // the answer, are dropped; priors are clamped into [kMinPrior, 1]. A proposer working for
  // `parent` in the background is not asked; while one is and the others had nothing the last
  // time, nobody is asked until its work is collected.
  std::vector<Move> propose(uint64_t parent, size_t max_moves);
  // After propose(parent) gave nothing new: whether `parent` is exhausted. Not while a proposer
  // works for it in the background (Note [Asynchronous proposals]), nor while a proposer said
  // it may have moves later (ProposalRequest::retry_later: a server error, answers it could not
  // use) and the node has had fewer than kMaxRetriedProposals such empty requests (Note [Retried
  // proposals]).
  bool exhausted_after_empty_proposal(uint64_t parent);
  // One request's seed: a function of the strategy's seed, the node, and how often it was asked.
  uint64_t request_seed(uint64_t node);
  // Whether the move may enter the tree: a valid spec for the signature's backend.
  bool acceptable(const Move& m) const;

  static constexpr double kMinPrior = 1e-3;
  // A prior as strategies use it: clamped into [kMinPrior, 1], NaN as kMinPrior (a restored tree's
  // moves did not necessarily pass through propose()).
  static double usable_prior(double p) noexcept;

  SearchTask task_;
  std::vector<Proposer*> proposers_;   // those that support task_.signature
  StrategyOptions options_;
  SearchTree tree_;

 private:
  void hand_out(uint64_t id);
  size_t budget_left() const;
  // A request from `parent` (no seed, no result flags).
  ProposalRequest request_for(uint64_t parent, size_t max_moves);
  // Note [Collected moves first]: moves of finished background work join the tree.
  void collect_ready();

  std::set<uint64_t> in_flight_;
  std::deque<uint64_t> resume_;        // restored nodes without an outcome, handed out first
  std::map<uint64_t, uint32_t> requests_;   // per node: proposal requests made from it
  std::map<uint64_t, uint32_t> retried_;    // per node: empty requests a proposer asked to retry
  bool last_retry_later_ = false;           // the last propose() call's ProposalRequest::retry_later
  // Note [Asynchronous proposals]: per node, the proposers working for it in the background; the
  // nodes whose other proposers had nothing the last time they were asked meanwhile; per node,
  // the proposers given up after kMaxRetriedProposals empty answers; collected moves not yet
  // handed out.
  std::map<uint64_t, std::set<Proposer*>> awaiting_;
  std::set<uint64_t> quiet_;
  std::map<uint64_t, std::set<Proposer*>> given_up_;
  std::deque<uint64_t> collected_;
};

// splitmix64's finalizer: a cheap, well-mixed, platform-independent hash of a 64-bit value.
uint64_t mix64(uint64_t x) noexcept;

}  // namespace kforge::search

// SearchStrategy: how one signature's search spends its evaluations. Lifecycle-shaped (as in TVM's
// meta_schedule): the driver loop reads generate -> evaluate -> notify, until done.
//
//   std::unique_ptr<SearchStrategy> s = make_strategy("mcts", task, proposers, options);
//   while (!s->done()) {
//     std::vector<Candidate> batch = s->next_candidates(free_workers);   // may be empty for now
//     for (const Candidate& c : batch) pool.submit(job_for(c), ...);
//     s->notify_results(finished);                                       // outcomes, by node id
//   }
//   const Node* best = s->tree().best();
//
// Implementations beside this header: mcts.h (UCT/PUCT with proposer priors, progressive widening,
// virtual loss), greedy.h (greedy linear refinement: always expand the best so far) and
// random_search.h (uniform samples of the proposers' spaces): the baselines that measure what the
// tree buys at equal budget (bench/).
//
// Promises of every implementation:
// - next_candidates(n) returns at most n candidates, each a node of tree() that has no outcome and
//   is not already in flight; a spec already evaluated is never returned again (the tree dedupes).
//   Empty means nothing can be evaluated until results come back (or done()).
// - notify_results() accepts outcomes of candidates it returned, in any order and batching.
// - done() once max_evaluations outcomes were notified, or the proposers have nothing left.
// - A strategy made from a restored tree (the journal's) continues it: nodes with outcomes are
//   never proposed again, and nodes without come back first: those that were in flight when the
//   daemon died (the journal marks each with Node::virtual_loss = 1; a tree copied from a live
//   strategy has it already), then any that were proposed but not yet handed out, each group in
//   id order. Visits and values are recomputed from the outcomes (stored statistics are ignored).
// - next_candidates() returning nothing while nothing is in flight means done() or
//   awaiting_proposals(); after done() it returns nothing. Moves a proposer delivers later join the
//   tree under the node they were asked from and are handed out first (Note [Collected moves
//   first] in strategy_base.cc). notify_results() ignores an id that is not in flight (unknown, the root, never
//   handed out, or already answered).
// - Nothing throws; proposers are called from next_candidates (the search's own thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/op_signature.h"
#include "search_daemon/proposers/proposer.h"
#include "search_daemon/search/search_tree.h"

namespace kforge::search {

struct SearchTask {
  OpSignature signature;
  Roofline roofline;
  // Called from any thread when a proposer's asynchronous work for this search is done (Note
  // [Asynchronous proposals] in proposer.h): the driver loop should call next_candidates() again.
  // Empty: the driver polls.
  std::function<void()> wake{};
};

struct StrategyOptions {
  uint32_t max_evaluations = 64;    // outcomes after which the search is done
  uint64_t seed = 0;
  size_t moves_per_expansion = 4;   // max_moves asked of each proposer per expansion
  // MCTS (Note [MCTS] in mcts.h).
  double c_puct = 1.0;              // exploration weight
  double widening_c = 2.0;          // progressive widening: children <= widening_c * visits^widening_alpha
  double widening_alpha = 0.5;
  double virtual_loss = 1.0;        // value subtracted per in-flight evaluation below a node
  // Random search: consecutive samples that were already in the tree (or invalid) after which the
  // proposers' spaces count as used up.
  uint32_t max_duplicate_samples = 64;
};

struct Candidate {
  uint64_t node = 0;
  Move move;
};

class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  virtual std::string_view name() const = 0;
  virtual std::vector<Candidate> next_candidates(size_t max) = 0;
  virtual void notify_results(const std::vector<std::pair<uint64_t, Outcome>>& results) = 0;
  virtual bool done() const = 0;
  // Whether a proposer is working for this search in the background (Note [Asynchronous
  // proposals]): next_candidates() may then return nothing while nothing is in flight and the
  // search is not done; task.wake is called when that changes.
  virtual bool awaiting_proposals() const = 0;
  virtual const SearchTree& tree() const = 0;
  // Moves proposed and held back, not yet in the tree (MCTS's reserves under progressive
  // widening), best first within each node: what the search is likely to evaluate soon, for the
  // daemon to build ahead (Note [Builds ahead] in daemon/prebuilder.h). Valid until the next call
  // of any other method.
  virtual std::vector<const Move*> upcoming() const { return {}; }
};

// "mcts", "greedy" or "random"; nullptr for another name. `restored` continues a journaled tree
// (empty: a new search). The proposers must outlive the strategy.
std::unique_ptr<SearchStrategy> make_strategy(std::string_view name, SearchTask task, std::vector<Proposer*> proposers,
                                              StrategyOptions options, SearchTree restored = SearchTree());

}  // namespace kforge::search

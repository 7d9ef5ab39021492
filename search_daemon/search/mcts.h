// Mcts: Monte Carlo Tree Search over kernel candidates with proposer priors (PUCT), progressive
// widening and virtual loss. Reached through make_strategy("mcts", ...); Note [MCTS] says exactly
// what it does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "search_daemon/search/strategy_base.h"

namespace kforge::search {

// Note [MCTS]
// The tree: node 0 is PyTorch's own kernel (no spec, reward 0); every other node is a candidate
// proposed from its parent (a refinement, a variant, a repair). A node's state is pending (no
// outcome, not handed out), in flight, or evaluated (outcome set, reward() per Note [Reward]).
//
// Statistics (Node): N(n) = visits = outcomes in n's subtree, n included; W(n) = value_sum = the
// sum of their rewards; V(n) = virtual_loss = evaluations in flight in n's subtree, n included.
// An evaluation in flight counts as a visit that returned -virtual_loss (the option):
//   N'(n) = N(n) + V(n)
//   Q(n)  = (W(n) - virtual_loss * V(n)) / N'(n)            when N'(n) > 0
//   Q(n)  = first-play value = the parent's own reward()     when N'(n) = 0
//         = W(root) / N(root) for the root's children, 0 before the first outcome
// The first-play value says "a proposal from a kernel is, until measured, as good as that kernel":
// children of a fast kernel start optimistic, repairs of a failed one start at the failure's value.
// The root is PyTorch's kernel and has no reward of its own: its unvisited children start at the
// mean of the outcomes measured so far (real visits only: V(root) is not in it), the first of them
// at parity with PyTorch. At parity, once one child of the root measured 10x (Q = ln 10) its
// siblings stood 2.3 below it and PUCT's term reached them only after tens of evaluations: on the
// H100's softmax over dim 1 the search spent 64 evaluations under the family the priors ranked
// first (12.8x) and never measured the other family's best-ranked configuration (14.0x; the
// space's best, 15.7x, is in that family). Note [First play at the root].
//
// Selection (one candidate): first, a failed LLM candidate without children is widened and its
// pending child returned (Note [Repairs first] in mcts.cc); otherwise start at the root and at
// each node n
//   1. widen: if n may gain children (below), admit new children;
//   2. among n's children c that are pending, or evaluated and not found dead in this call, take the
//      highest  score(c) = Q(c) + c_puct * P(c) * sqrt(N'(n)) / (1 + N'(c)),  ties to the higher
//      prior, then the lower id. P(c) is the move's prior (as its proposer gave it, clamped into
//      [0.001, 1]) over the sum of the priors of n's children: a distribution over the moves from
//      n, as in PUCT. Unnormalized, every child that widening adds would bring a full-size
//      exploration bonus, and the wider a node the more it would be explored (on the synthetic
//      landscape of tests/daemon/search_test.cc that turned a third of the budget into unrefined
//      starting points);
//   3. a pending c is the candidate; an evaluated c is descended into; no such c: n is dead for the
//      rest of this call (nothing below it can be evaluated now) and selection restarts at the root.
//      A dead root ends the call. Handing out a candidate adds 1 to V of every node of its lineage,
//      so the next selection of the same batch sees that subtree's Q lowered (and N' raised) and
//      spreads over other subtrees: a batch of k candidates comes out of one call, or k calls,
//      without any result in between.
// Within one call a dead node stays dead: only widening could revive it, and its limit grows only
// with candidates handed out below it, of which there are none.
//
// Progressive widening: the root and evaluated nodes (failed ones included: a proposer may repair
// a compile error) may gain a child only while  children(n) < widening_c * max(1, N'(n))^widening_alpha,
// so children(n) <= ceil(widening_c * max(1, N'(n))^widening_alpha) at all times (N' never
// decreases: an outcome turns a virtual visit into a real one). Pending and in-flight nodes are not
// expanded (there is nothing to refine yet). New children come from a per-node reserve of moves,
// best prior first; when the reserve is empty the proposers are asked (ProposalRequest with
// parent = n, max_moves = moves_per_expansion each, seed = a function of the strategy's seed, n and
// how many requests n has had). Moves whose spec is already in the tree, anywhere, are dropped
// (the tree dedupes; a spec is evaluated at most once). A request that yields nothing new, with the
// reserve empty, marks n exhausted: it is never asked again (unless a proposer asked to be asked
// again: Note [Retried proposals] in strategy_base.cc). The reserve is not journaled: after a
// restart its moves are asked for again.
//
// Parallelism: before any result only the root can be widened, and all its children are in flight,
// so a fresh search has at most the largest k with k - 1 < widening_c * max(1, k - 1)^widening_alpha
// in flight: 4 with the defaults (2, 0.5), 9 with widening_c 3. Every evaluated node opens room for
// more (its own N' >= 1 lets it gain children).
//
// Backup: when an outcome arrives, every node of its lineage gets N += 1, W += reward, V -= 1.
//
// done(): max_evaluations outcomes notified, or nothing in flight and no node can produce anything:
// no pending node under the root or an evaluated node, and no such node that is not exhausted and
// below its widening limit. (With nothing in flight the statistics cannot change, so this is final.)
//
// Restore (a journaled tree after kill -9): N and W recomputed from the outcomes, V = 0, and the
// nodes without an outcome handed out first, before any selection: those in flight when the daemon
// died (marked by V > 0 on the node itself), then those widening had admitted but selection had
// not yet picked, each in id order. Evaluated nodes are never handed out again.
//
// Determinism: no clocks, no unordered containers, seeds derived as above: the same seed, options,
// proposers (if deterministic) and outcomes in the same order give the same candidates.
//
// What it buys, measured only on the synthetic landscapes of tests/daemon/search_test.cc (tag
// [benchmark]; 4 knobs of 8 values, one-step refinements, uniform priors, 20 seeds, budget 40):
// one smooth basin: MCTS 2.81x (2.77x before Note [First play at the root]), greedy 3.00x (the
// optimum), random 2.63x; two basins that one-step refinements do not cross: MCTS 2.13x (2.04x),
// greedy 1.94x, random 2.35x. Neither c_puct (0.1 to 4), the
// widening options, a max backup nor a first-play reduction made it beat both baselines on both;
// the defaults are the plain algorithm.
//
// Note [First play at the root]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On real spaces (bench_search replaying the H100's whole spaces of six signatures,
// bench/results/2026-12-07-h100-search-replay-fpu-*.log) the root's first-play value above changed
// MCTS's mean best speedup at 16 evaluations: softmax over dim 1 14.6x (was 12.1x, with the priors
// then ranking the cluster family first), cumsum over dim 1 7.75x (6.88x), the 262k-vocabulary
// softmax 5.995x (6.027x), the rest unchanged. Its cost is an evaluation spent on the next root child
// where the first family was the right one.
class Mcts final : public StrategyBase {
 public:
  Mcts(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored);
  std::string_view name() const override { return "mcts"; }

  // The terms of Note [MCTS] for the node as it stands (for tests, the GUI and the journal's
  // readers): Q(id) with the first-play value, and the score of `id` as a child of its parent.
  double q(uint64_t id) const;
  double score(uint64_t id) const;
  // P(id): its move's prior over the sum of its siblings' (itself included).
  double prior(uint64_t id) const;
  // The widening limit of `id`: widening_c * max(1, N')^widening_alpha.
  double widening_limit(uint64_t id) const;
  // Each node's reserve: the moves next in line to be admitted when it widens.
  std::vector<const Move*> upcoming() const override;

 protected:
  std::optional<uint64_t> select() override;
  bool can_produce() const override;

 private:
  bool may_widen(uint64_t id) const;
  void widen(uint64_t id);
  // Note [Repairs first] in mcts.cc.
  static constexpr uint32_t kMaxRepairChain = 3;
  bool wants_repair(uint64_t id) const;

  std::map<uint64_t, std::vector<Move>> reserve_;   // per node: proposed, not yet admitted (best first)
};

}  // namespace kforge::search

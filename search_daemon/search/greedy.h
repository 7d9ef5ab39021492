// Greedy: greedy linear refinement, the first baseline MCTS is measured against at equal budget.
// Reached through make_strategy("greedy", ...).
//
// Rule: the focus is the best node so far: the root or an evaluated node, highest reward() first
// (Note [Reward]; the root counts 0; ties to the lower id), skipping nodes with nothing left. From
// the focus, its pending children are handed out in prior order (highest first, ties to the lower
// id); when it has none, the proposers are asked for more from it (all moves admitted: no
// widening); when they have nothing new it is marked exhausted and the next best node becomes the
// focus. So: try PyTorch's neighbours, jump to the first that beats the focus, refine that, and fall
// back to the next best when a line runs dry. A failed node can be a focus (its proposers may
// repair it) once every better node is used up. With several candidates per call the focus's
// siblings run in parallel; with one at a time (results in between) it is the textbook rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "search_daemon/search/strategy_base.h"

namespace kforge::search {

class Greedy final : public StrategyBase {
 public:
  Greedy(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored);
  std::string_view name() const override { return "greedy"; }

 protected:
  std::optional<uint64_t> select() override;
  bool can_produce() const override;

 private:
  // The root and evaluated nodes, best first (the focus order).
  std::vector<uint64_t> ranking() const;
  std::optional<uint64_t> best_pending_child(uint64_t id) const;
};

}  // namespace kforge::search

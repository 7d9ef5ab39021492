#include "search_daemon/search/greedy.h"

#include <algorithm>
#include <utility>

namespace kforge::search {

Greedy::Greedy(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored)
    : StrategyBase(std::move(task), std::move(proposers), options, std::move(restored)) {}

std::vector<uint64_t> Greedy::ranking() const {
  std::vector<std::pair<double, uint64_t>> ranked;
  for (uint64_t id = 0; id < tree_.size(); ++id) {
    if (!expandable(id)) continue;
    const Node& n = tree_.node(id);
    ranked.emplace_back(n.outcome ? reward(*n.outcome) : 0.0, id);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint64_t> ids;
  ids.reserve(ranked.size());
  for (const auto& r : ranked) ids.push_back(r.second);
  return ids;
}

std::optional<uint64_t> Greedy::best_pending_child(uint64_t id) const {
  std::optional<uint64_t> best;
  for (uint64_t c : tree_.node(id).children) {
    if (!pending(c)) continue;
    if (!best || usable_prior(tree_.node(c).move.prior) > usable_prior(tree_.node(*best).move.prior)) best = c;
  }
  return best;
}

std::optional<uint64_t> Greedy::select() {
  for (uint64_t focus : ranking()) {
    if (auto c = best_pending_child(focus)) return c;
    if (tree_.node(focus).exhausted) continue;
    std::vector<Move> moves = propose(focus, options_.moves_per_expansion);
    if (moves.empty()) {
      if (exhausted_after_empty_proposal(focus)) tree_.node(focus).exhausted = true;
      continue;
    }
    for (Move& m : moves) tree_.add(focus, std::move(m));
    if (auto c = best_pending_child(focus)) return c;
  }
  return std::nullopt;
}

bool Greedy::can_produce() const {
  for (uint64_t id = 0; id < tree_.size(); ++id) {
    if (!expandable(id)) continue;
    if ((!tree_.node(id).exhausted && !proposers_.empty()) || best_pending_child(id)) return true;
  }
  return false;
}

}  // namespace kforge::search

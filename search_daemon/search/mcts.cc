#include "search_daemon/search/mcts.h"

#include <cmath>
#include <utility>

namespace kforge::search {

Mcts::Mcts(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored)
    : StrategyBase(std::move(task), std::move(proposers), options, std::move(restored)) {}

namespace {

double effective_visits(const Node& n) { return static_cast<double>(n.visits) + static_cast<double>(n.virtual_loss); }

}  // namespace

double Mcts::q(uint64_t id) const {
  const Node& n = tree_.node(id);
  const double visits = effective_visits(n);
  if (visits > 0) return (n.value_sum - options_.virtual_loss * static_cast<double>(n.virtual_loss)) / visits;
  if (id == 0) return 0;
  // First-play value (Note [MCTS]): the parent's reward; the root's children, the mean of theirs
  // measured so far.
  const Node& parent = tree_.node(n.parent);
  if (parent.outcome) return reward(*parent.outcome);
  return n.parent == 0 && parent.visits > 0 ? parent.value_sum / static_cast<double>(parent.visits) : 0;
}

double Mcts::prior(uint64_t id) const {
  const Node& n = tree_.node(id);
  double sum = 0;
  for (uint64_t s : tree_.node(n.parent).children) sum += usable_prior(tree_.node(s).move.prior);
  return usable_prior(n.move.prior) / sum;
}

double Mcts::score(uint64_t id) const {
  const Node& n = tree_.node(id);
  const Node& parent = tree_.node(n.parent);
  return q(id) + options_.c_puct * prior(id) * std::sqrt(effective_visits(parent)) / (1 + effective_visits(n));
}

double Mcts::widening_limit(uint64_t id) const {
  const double visits = std::max(1.0, effective_visits(tree_.node(id)));
  return options_.widening_c * std::pow(visits, options_.widening_alpha);
}

bool Mcts::may_widen(uint64_t id) const {
  const Node& n = tree_.node(id);
  return !proposers_.empty() && expandable(id) && !n.exhausted &&
         static_cast<double>(n.children.size()) < widening_limit(id);
}

void Mcts::widen(uint64_t id) {
  std::vector<Move>& reserve = reserve_[id];
  while (may_widen(id)) {
    if (reserve.empty()) {
      reserve = propose(id, options_.moves_per_expansion);
      if (reserve.empty()) {
        if (exhausted_after_empty_proposal(id)) tree_.node(id).exhausted = true;
        break;
      }
    }
    Move m = std::move(reserve.front());
    reserve.erase(reserve.begin());
    // Another node may have admitted the same spec since it was proposed here.
    if (tree_.find(m.spec.id())) continue;
    tree_.add(id, std::move(m));
  }
}

std::vector<const Move*> Mcts::upcoming() const {
  std::vector<const Move*> out;
  for (const auto& [id, moves] : reserve_) {
    for (const Move& m : moves) out.push_back(&m);
  }
  return out;
}

// Note [Repairs first]
// A language model's candidate that failed (did not compile, was rejected, failed a check,
// faulted, timed out) is repaired at once: its compile log or failed check goes back to the model
// while it is fresh, before any other node is selected. Left to PUCT, a failed node's reward keeps
// it from being selected: a real model's first repair prompt came only after every child of the
// root had failed. Up to kMaxRepairChain failed LLM candidates in a row (a repair of a repair);
// past that, and for template candidates (a template's failure is its configuration's, not
// something a repair fixes), the node is left to PUCT like any other.
bool Mcts::wants_repair(uint64_t id) const {
  const Node& n = tree_.node(id);
  if (!n.children.empty() || n.exhausted || !n.outcome || n.move.proposer != "llm") return false;
  switch (n.outcome->status) {
    case eval::EvalStatus::kCompileError:
    case eval::EvalStatus::kRejected:
    case eval::EvalStatus::kVerifyFailed:
    case eval::EvalStatus::kFault:
    case eval::EvalStatus::kTimeout:
      break;
    default:
      return false;
  }
  uint32_t chain = 0;
  for (uint64_t a = id; a != 0; a = tree_.node(a).parent) {
    const Node& x = tree_.node(a);
    if (x.move.proposer != "llm" || !x.outcome || x.outcome->measured() || x.outcome->status == eval::EvalStatus::kVerified) break;
    ++chain;
  }
  return chain <= kMaxRepairChain;
}

std::optional<uint64_t> Mcts::select() {
  for (uint64_t id = 1; id < tree_.size(); ++id) {   // Note [Repairs first]
    if (!wants_repair(id)) continue;
    if (may_widen(id)) widen(id);
    for (uint64_t c : tree_.node(id).children) {
      if (pending(c)) return c;
    }
  }
  std::set<uint64_t> dead;
  while (dead.count(0) == 0) {
    uint64_t at = 0;
    for (;;) {
      if (may_widen(at)) widen(at);
      std::optional<uint64_t> best;
      double best_score = 0;
      for (uint64_t c : tree_.node(at).children) {
        if (!pending(c) && !(expandable(c) && dead.count(c) == 0)) continue;
        const double s = score(c);
        if (!best || s > best_score ||
            (s == best_score && usable_prior(tree_.node(c).move.prior) > usable_prior(tree_.node(*best).move.prior))) {
          best = c;
          best_score = s;
        }
      }
      if (!best) {
        dead.insert(at);
        break;
      }
      if (pending(*best)) return best;
      at = *best;
    }
  }
  return std::nullopt;
}

bool Mcts::can_produce() const {
  // reachable[id]: every proper ancestor is the root or evaluated, so selection can get to id.
  std::vector<bool> reachable(tree_.size(), false);
  reachable[0] = true;
  for (uint64_t id = 0; id < tree_.size(); ++id) {
    const Node& n = tree_.node(id);
    if (id != 0) reachable[id] = reachable[n.parent] && expandable(n.parent);
    if (!reachable[id]) continue;
    if (pending(id) || may_widen(id)) return true;
  }
  return false;
}

}  // namespace kforge::search

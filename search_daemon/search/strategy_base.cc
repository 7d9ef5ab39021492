#include "search_daemon/search/strategy_base.h"

#include <algorithm>
#include <cmath>
#include <exception>

namespace kforge::search {

uint64_t mix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

bool supports(Proposer* p, const OpSignature& sig) {
  if (p == nullptr) return false;
  try {
    return p->supports(sig);
  } catch (...) {
    return false;
  }
}

}  // namespace

StrategyBase::StrategyBase(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options,
                           SearchTree restored)
    : task_(std::move(task)), options_(options), tree_(std::move(restored)) {
  for (Proposer* p : proposers) {
    if (supports(p, task_.signature)) proposers_.push_back(p);
  }
  // Nodes without an outcome come back first: those that were in flight (their own virtual_loss
  // says so, where the tree records it), then those admitted but not yet handed out.
  std::vector<uint64_t> waiting;
  for (uint64_t id = 1; id < tree_.size(); ++id) {
    const Node& n = tree_.node(id);
    if (n.outcome) continue;
    if (n.virtual_loss > 0) {
      resume_.push_back(id);
    } else {
      waiting.push_back(id);
    }
  }
  resume_.insert(resume_.end(), waiting.begin(), waiting.end());
  // A journaled tree carries statistics of a search that no longer runs (and in-flight counts of
  // evaluations that died with it): only the outcomes are facts.
  for (uint64_t id = 0; id < tree_.size(); ++id) {
    Node& n = tree_.node(id);
    n.visits = 0;
    n.value_sum = 0;
    n.virtual_loss = 0;
  }
  for (uint64_t id = 1; id < tree_.size(); ++id) {
    const Node& n = tree_.node(id);
    if (!n.outcome) continue;
    const double r = reward(*n.outcome);
    for (uint64_t a : tree_.lineage(id)) {
      tree_.node(a).visits += 1;
      tree_.node(a).value_sum += r;
    }
  }
}

StrategyBase::~StrategyBase() {
  for (Proposer* p : proposers_) {
    try {
      p->release(task_.signature);
    } catch (...) {
      // proposer.h: release() never throws; if it does, there is nothing more to do for it here
    }
  }
}

bool StrategyBase::pending(uint64_t id) const {
  return id != 0 && tree_.contains(id) && !tree_.node(id).outcome && !in_flight(id);
}

bool StrategyBase::expandable(uint64_t id) const {
  return id == 0 || (tree_.contains(id) && tree_.node(id).outcome.has_value());
}

size_t StrategyBase::budget_left() const {
  const size_t used = tree_.evaluated() + in_flight_.size();
  return used >= options_.max_evaluations ? 0 : options_.max_evaluations - used;
}

void StrategyBase::hand_out(uint64_t id) {
  in_flight_.insert(id);
  for (uint64_t a : tree_.lineage(id)) tree_.node(a).virtual_loss += 1;
}

std::vector<Candidate> StrategyBase::next_candidates(size_t max) {
  std::vector<Candidate> out;
  size_t budget = budget_left();
  if (budget > 0) collect_ready();
  auto first_pending = [this](std::deque<uint64_t>& q) -> std::optional<uint64_t> {
    while (!q.empty()) {
      const uint64_t r = q.front();
      q.pop_front();
      if (pending(r)) return r;
    }
    return std::nullopt;
  };
  while (out.size() < max && budget > 0) {
    std::optional<uint64_t> id = first_pending(resume_);
    if (!id) id = first_pending(collected_);
    if (!id) id = select();
    if (!id || !pending(*id)) break;
    hand_out(*id);
    out.push_back(Candidate{*id, tree_.node(*id).move});
    --budget;
  }
  return out;
}

void StrategyBase::notify_results(const std::vector<std::pair<uint64_t, Outcome>>& results) {
  for (const auto& [id, outcome] : results) {
    if (in_flight_.erase(id) == 0) continue;
    tree_.set_outcome(id, outcome);
    const double r = reward(outcome);
    for (uint64_t a : tree_.lineage(id)) {
      Node& n = tree_.node(a);
      n.visits += 1;
      n.value_sum += r;
      if (n.virtual_loss > 0) n.virtual_loss -= 1;
    }
  }
}

bool StrategyBase::done() const {
  if (tree_.evaluated() >= options_.max_evaluations) return true;
  if (!in_flight_.empty() || !awaiting_.empty()) return false;
  for (uint64_t r : resume_) {
    if (pending(r)) return false;
  }
  for (uint64_t r : collected_) {
    if (pending(r)) return false;
  }
  return !can_produce();
}

uint64_t StrategyBase::request_seed(uint64_t node) {
  const uint32_t n = requests_[node]++;
  return mix64(options_.seed ^ mix64(node ^ mix64(n)));
}

double StrategyBase::usable_prior(double p) noexcept { return std::isnan(p) ? kMinPrior : std::clamp(p, kMinPrior, 1.0); }

bool StrategyBase::acceptable(const Move& m) const {
  return m.spec.backend == task_.signature.target.backend && m.spec.validate().ok();
}

ProposalRequest StrategyBase::request_for(uint64_t parent, size_t max_moves) {
  ProposalRequest req;
  req.signature = &task_.signature;
  req.tree = &tree_;
  req.parent = parent;
  req.max_moves = max_moves;
  req.roofline = task_.roofline;
  req.on_ready = task_.wake;
  return req;
}

std::vector<Move> StrategyBase::propose(uint64_t parent, size_t max_moves) {
  std::vector<Move> moves;
  last_retry_later_ = false;
  if (!expandable(parent)) return moves;
  auto busy = awaiting_.find(parent);
  // The proposers that answer at once had nothing the last time; the others are still working.
  if (busy != awaiting_.end() && quiet_.count(parent) != 0) return moves;
  ProposalRequest req = request_for(parent, max_moves);
  req.seed = request_seed(parent);
  bool retry_later = false;
  req.retry_later = &retry_later;
  std::set<KernelId> seen;
  for (Proposer* p : proposers_) {
    if (busy != awaiting_.end() && busy->second.count(p) != 0) continue;   // already working for this node
    if (auto g = given_up_.find(parent); g != given_up_.end() && g->second.count(p) != 0) continue;
    bool pending = false;
    req.pending = &pending;
    std::vector<Move> got;
    try {
      got = p->propose(req);
    } catch (...) {
      continue;   // the promise is that it does not throw; if it does, it had nothing to offer
    }
    if (pending) {
      awaiting_[parent].insert(p);
      busy = awaiting_.find(parent);
    }
    if (got.size() > max_moves) got.resize(max_moves);
    for (Move& m : got) {
      if (!acceptable(m)) continue;
      const KernelId id = m.spec.id();
      if (tree_.find(id) || !seen.insert(id).second) continue;
      m.prior = usable_prior(m.prior);
      moves.push_back(std::move(m));
    }
  }
  std::stable_sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.prior > b.prior; });
  last_retry_later_ = retry_later;
  if (moves.empty() && busy != awaiting_.end()) quiet_.insert(parent);
  return moves;
}

// Note [Collected moves first]
// Moves that a proposer delivers after propose() returned (Note [Asynchronous proposals] in
// proposer.h) join the tree as children of the node they were asked from, whatever its widening
// limit, and are handed out before anything the strategy's rule picks: each is a language model's
// answer, paid for and minutes old, and its evaluation (or its failure, which Note [Repairs first]
// in mcts.cc sends straight back to the model) is what that part of the tree waits on. The budget
// still bounds them like any candidate. A proposer whose background work for a node came back
// empty and asked to be asked again counts as a retried proposal there (Note [Retried
// proposals]); after kMaxRetriedProposals it is not asked from that node any more.
void StrategyBase::collect_ready() {
  if (awaiting_.empty()) return;
  std::vector<uint64_t> parents;
  for (const auto& [parent, ps] : awaiting_) parents.push_back(parent);
  for (uint64_t parent : parents) {
    const std::set<Proposer*> working = awaiting_[parent];
    for (Proposer* p : working) {
      ProposalRequest req = request_for(parent, options_.moves_per_expansion);
      bool pending = false;
      bool retry_later = false;
      req.pending = &pending;
      req.retry_later = &retry_later;
      std::vector<Move> got;
      try {
        got = p->collect(req);
      } catch (...) {
        got.clear();
        pending = false;
      }
      size_t added = 0;
      for (Move& m : got) {
        if (!acceptable(m) || tree_.find(m.spec.id())) continue;
        m.prior = usable_prior(m.prior);
        collected_.push_back(tree_.add(parent, std::move(m)));
        ++added;
      }
      if (pending) continue;
      awaiting_[parent].erase(p);
      quiet_.erase(parent);
      if (added == 0 && retry_later && ++retried_[parent] >= kMaxRetriedProposals) given_up_[parent].insert(p);
    }
    if (awaiting_[parent].empty()) awaiting_.erase(parent);
  }
}

// Note [Retried proposals]
// A node whose proposers offer nothing new is exhausted: never asked again, and a search whose
// nodes are all exhausted is done. A language model's empty answer is not that: the server failed
// or timed out, or its answers could not be used even after format repairs (Note [Format repairs]
// in llm_proposer.cc). Then the proposer sets ProposalRequest::retry_later, and the node stays
// open for kMaxRetriedProposals such requests: a search ended once "after 0 evaluations: done: the
// search space is exhausted" on one malformed answer. The bound keeps a server that never answers
// from holding a search open forever: each retry is one more request, and the session ends the
// search after a few rounds with nothing to evaluate (search_session.cc).
bool StrategyBase::exhausted_after_empty_proposal(uint64_t parent) {
  if (awaiting_.count(parent) != 0) return false;   // Note [Asynchronous proposals]
  if (!last_retry_later_) return true;
  return ++retried_[parent] >= kMaxRetriedProposals;
}

}  // namespace kforge::search

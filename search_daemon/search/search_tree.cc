#include "search_daemon/search/search_tree.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kforge::search {

namespace {

// At most `max` bytes of `s`, cut before a UTF-8 continuation byte so the text stays valid where
// it was. The head is kept: a compiler's first error is the one that explains the rest.
std::string head(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace

Outcome outcome_of(const eval::EvalResult& r) {
  Outcome o;
  o.status = r.status;
  o.speedup = r.timing.speedup;
  o.noise_band = r.timing.noise_band;
  o.significant = r.timing.significant;
  o.baseline_ns = r.timing.baseline_median_ns;
  o.candidate_ns = r.timing.candidate_median_ns;
  o.baseline_spread = r.timing.baseline_spread;
  o.candidate_spread = r.timing.candidate_spread;
  o.torch_max_abs_error = r.verify.torch_max_abs_error;
  o.torch_rel_error = r.verify.torch_rel_error;
  o.failed_check = r.verify.failed_check;
  o.message = head(r.message, kMaxOutcomeLog);
  o.build_log = head(r.build_log, kMaxOutcomeLog);
  o.implausible = head(r.timing.implausible, kMaxOutcomeLog);
  return o;
}

double reward(const Outcome& o) {
  switch (o.status) {
    case eval::EvalStatus::kMeasured:
      if (!(o.speedup > 0) || !std::isfinite(o.speedup) || !o.significant || !o.implausible.empty()) return 0;
      return std::max(std::log(o.speedup), kRewardFault);
    case eval::EvalStatus::kVerified: return 0;
    case eval::EvalStatus::kCompileError: return kRewardCompileError;
    case eval::EvalStatus::kRejected: return kRewardRejected;
    case eval::EvalStatus::kVerifyFailed: return kRewardVerifyFailed;
    case eval::EvalStatus::kFault:
    case eval::EvalStatus::kTimeout: return kRewardFault;
    case eval::EvalStatus::kWorkerError: return 0;
  }
  return 0;   // a status from a newer protocol: no evidence either way
}

SearchTree::SearchTree() {
  Node root;
  root.id = 0;
  root.parent = 0;
  nodes_.push_back(std::move(root));
}

uint64_t SearchTree::add(uint64_t parent, Move move) {
  const KernelId spec_id = move.spec.id();
  if (auto it = by_spec_.find(spec_id); it != by_spec_.end()) return it->second;
  if (!contains(parent)) parent = 0;
  Node n;
  n.id = nodes_.size();
  n.parent = parent;
  n.move = std::move(move);
  n.spec_id = spec_id;
  nodes_.push_back(std::move(n));
  nodes_[parent].children.push_back(nodes_.back().id);
  by_spec_.emplace(spec_id, nodes_.back().id);
  return nodes_.back().id;
}

bool SearchTree::set_outcome(uint64_t id, Outcome outcome) {
  if (id == 0 || !contains(id)) return false;
  Node& n = nodes_[id];
  if (!n.outcome) ++evaluated_;
  n.outcome = std::move(outcome);
  return true;
}

std::optional<uint64_t> SearchTree::find(const KernelId& spec_id) const {
  if (auto it = by_spec_.find(spec_id); it != by_spec_.end()) return it->second;
  return std::nullopt;
}

const Node* SearchTree::best() const {
  const Node* best = nullptr;
  for (const Node& n : nodes_) {
    if (!n.outcome || !n.outcome->improves()) continue;
    if (best == nullptr || n.outcome->speedup > best->outcome->speedup) best = &n;
  }
  return best;
}

std::vector<uint64_t> SearchTree::lineage(uint64_t id) const {
  std::vector<uint64_t> path;
  if (!contains(id)) return path;
  // Parents always have smaller ids (a node is added under an existing one), so this ends.
  for (uint64_t at = id;; at = nodes_[at].parent) {
    path.push_back(at);
    if (at == 0) break;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace kforge::search

// The vocabulary of one kernel search: the moves proposers make, the outcomes evaluations give, and
// the tree of candidates that every strategy (MCTS, greedy, random) grows and the journal stores.
// Torch-free.
//
//   SearchTree tree;                                   // node 0: PyTorch's own kernel, the root
//   uint64_t id = tree.add(0, Move{spec, "template", "softmax block=256", 0.5});
//   tree.set_outcome(id, outcome_of(eval_result));     // once the worker has judged it
//   if (const Node* b = tree.best()) publish(b->move.spec);
//
// Promises:
// - Node ids are dense and stable (0, 1, 2, ... in creation order), so a journal replay that adds
//   the same nodes in the same order rebuilds the same ids.
// - A kernel spec appears at most once: add() of a spec already in the tree (same KernelSpec::id())
//   returns the existing node, so nothing is ever evaluated twice in one search.
// - best() is the evaluated node with the highest speedup among those whose speedup is significant
//   (outside the timing's noise band) and > 1; nullptr when there is none.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernel_spec.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::search {

// One proposal: a complete candidate and where it came from.
struct Move {
  KernelSpec spec;
  std::string proposer;     // "template", "llm"
  std::string label;        // one line for people: "softmax.rows block=256 vec=4", "llm: warp shuffles"
  double prior = 1.0;       // the proposer's belief that this move is good, in (0, 1] (PUCT prior)
};

// What an evaluation told the search about one candidate: the parts of an EvalResult that steer
// the search (the whole result goes to the journal and the cache).
struct Outcome {
  eval::EvalStatus status = eval::EvalStatus::kWorkerError;
  double speedup = 0;          // measured: PyTorch's time over the candidate's (TimingOutcome::speedup)
  double noise_band = 0;
  bool significant = false;
  double baseline_ns = 0;
  double candidate_ns = 0;
  std::string failed_check;    // kVerifyFailed: which check
  std::string message;         // one line: why it failed (compile error, check detail, fault)
  std::string build_log;       // kCompileError: the compiler's log, at most kMaxOutcomeLog bytes

  bool measured() const noexcept { return status == eval::EvalStatus::kMeasured; }
  // Faster than PyTorch's kernel beyond the noise: a candidate worth publishing.
  bool improves() const noexcept { return measured() && significant && speedup > 1; }
};

inline constexpr size_t kMaxOutcomeLog = 4096;

Outcome outcome_of(const eval::EvalResult& r);

// Note [Reward]
// The value a search backs up from an evaluated node: ln(speedup) for a measured candidate (0 when
// the speedup is inside the noise band: no better, no worse than PyTorch's), and fixed penalties
// for failures, harsher for what is more likely to waste later evaluations: a compile error -0.5
// (a repair may fix it), a rejection -0.7, a failed check -1.0 (a wrong kernel), a timeout or a
// fault -1.5. A worker error (not the candidate's fault) gives 0.
double reward(const Outcome& o);

struct Node {
  uint64_t id = 0;
  uint64_t parent = 0;               // the root's parent is itself (0)
  Move move;                         // empty spec for the root
  KernelId spec_id;
  std::optional<Outcome> outcome;    // set once evaluated
  std::vector<uint64_t> children;
  // Search statistics (Note [MCTS] in mcts.h). Derivable from outcomes: restore() recomputes them.
  uint32_t visits = 0;
  double value_sum = 0;
  uint32_t virtual_loss = 0;         // evaluations in flight below this node
  bool exhausted = false;            // its proposers have nothing more to offer from here
};

class SearchTree {
 public:
  SearchTree();

  // Adds a child of `parent` (which must exist), or returns the node that already holds this spec.
  uint64_t add(uint64_t parent, Move move);
  void set_outcome(uint64_t id, Outcome outcome);

  const Node& node(uint64_t id) const { return nodes_.at(id); }
  Node& node(uint64_t id) { return nodes_.at(id); }
  size_t size() const noexcept { return nodes_.size(); }
  const std::vector<Node>& nodes() const noexcept { return nodes_; }
  // The node holding this spec, if any.
  std::optional<uint64_t> find(const KernelId& spec_id) const;
  // Evaluated nodes (outcome set).
  size_t evaluated() const noexcept { return evaluated_; }
  const Node* best() const;
  // Root to `id`, inclusive.
  std::vector<uint64_t> lineage(uint64_t id) const;

 private:
  std::vector<Node> nodes_;
  std::map<KernelId, uint64_t> by_spec_;
  size_t evaluated_ = 0;
};

}  // namespace kforge::search

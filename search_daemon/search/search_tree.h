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
//   (outside the timing's noise band) and > 1 (the earliest on a tie); nullptr when there is none.
// - The structure (parent, move, spec_id, children, outcome) changes only through add() and
//   set_outcome(), so any SearchTree is consistent; node(id) for writing is for the search
//   statistics (visits, value_sum, virtual_loss, exhausted) alone, which strategies own.
// - Nothing throws on any id: add() under a parent that does not exist adds under the root,
//   set_outcome() of the root or of an unknown id is refused (false), lineage() of an unknown id
//   is empty. node(id) requires id < size().
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
  // Where the move came from, for the cache entry it may become (Note [LLM provenance] in
  // llm_proposer.cc: the conversation that wrote an LLM move, as JSON); empty for templates.
  std::string origin{};
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
  double baseline_spread = 0;  // (p90 - p10) / median of the timing runs (TimingOutcome)
  double candidate_spread = 0;
  // PyTorch's own error against the float64 reference, worst over the verification's trials
  // (VerifyOutcome): what the accuracy bound is made of. 0: not verified.
  double torch_max_abs_error = 0;
  double torch_rel_error = 0;
  std::string failed_check;    // kVerifyFailed: which check
  std::string message;         // one line: why it failed (compile error, check detail, fault)
  std::string build_log;       // kCompileError: the compiler's log, at most kMaxOutcomeLog bytes
  // It was timed on a GPU these serving processes were using (eval::JobPlacement, sorted): its
  // times may be noisier. Empty when timed alone, on a CPU, or not timed. Set by the daemon's
  // session (outcome_of() cannot know where the job ran); it does not change reward().
  std::vector<int32_t> shared_gpu_pids;
  // Non-empty: its timing cannot be believed (Note [Plausible timing] in worker/measurer.h: the
  // worker's cost-model check, or the session's against what serving processes observe). Such a
  // candidate is correct, but its speed is unknown: reward 0, never published.
  std::string implausible;
  // When the daemon received it (Unix ms; journaled): the GUI's best-speedup-over-time chart. 0:
  // unknown (an outcome journaled before it was kept, or one made outside a daemon's session).
  uint64_t finished_unix_ms = 0;

  bool measured() const noexcept { return status == eval::EvalStatus::kMeasured; }
  // Faster than PyTorch's kernel beyond the noise, by a timing that can be believed: a candidate
  // worth publishing.
  bool improves() const noexcept { return measured() && significant && speedup > 1 && implausible.empty(); }
};

inline constexpr size_t kMaxOutcomeLog = 4096;

Outcome outcome_of(const eval::EvalResult& r);

// Note [Reward]
// The value a search backs up from an evaluated node: ln(speedup) for a measured candidate (0 when
// the speedup is inside the noise band: no better, no worse than PyTorch's), and fixed penalties
// for failures, harsher for what is more likely to waste later evaluations: a compile error -0.5
// (a repair may fix it), a rejection -0.7, a failed check -1.0 (a wrong kernel), a timeout or a
// fault -1.5. A worker error (not the candidate's fault) gives 0.
// Two edges: a measured slowdown is floored at -1.5 (a correct kernel, however slow, is never worth
// less than one that crashes; without the floor one 100x-slower candidate would outweigh many
// good siblings in a mean), and a measured speedup that is not a positive finite number gives 0.
// A candidate verified but not timed (kVerified) gives 0: correct, speed unknown; so does a
// measured one whose timing is implausible (Outcome::implausible).
inline constexpr double kRewardCompileError = -0.5;
inline constexpr double kRewardRejected = -0.7;
inline constexpr double kRewardVerifyFailed = -1.0;
inline constexpr double kRewardFault = -1.5;   // also a timeout, and the floor of a slowdown
double reward(const Outcome& o);

struct Node {
  uint64_t id = 0;
  uint64_t parent = 0;               // the root's parent is itself (0)
  Move move;                         // empty spec for the root
  KernelId spec_id;
  std::optional<Outcome> outcome;    // set once evaluated
  std::vector<uint64_t> children;
  // Search statistics (Note [MCTS] in mcts.h), kept by every strategy. visits and value_sum are
  // derivable from the outcomes: a strategy made from a restored tree recomputes them.
  uint32_t visits = 0;               // outcomes in this node's subtree, itself included
  double value_sum = 0;              // sum of their reward()s
  uint32_t virtual_loss = 0;         // evaluations in flight in this subtree, itself included
  bool exhausted = false;            // its proposers have nothing more to offer from here
};

class SearchTree {
 public:
  SearchTree();

  // Adds a child of `parent`, or returns the node that already holds this spec (wherever it is; it
  // does not become a child of `parent` too).
  uint64_t add(uint64_t parent, Move move);
  // Records (or replaces) a node's outcome; false for the root or an unknown id.
  bool set_outcome(uint64_t id, Outcome outcome);

  const Node& node(uint64_t id) const { return nodes_[id]; }
  // For the search statistics only (see Promises).
  Node& node(uint64_t id) { return nodes_[id]; }
  bool contains(uint64_t id) const noexcept { return id < nodes_.size(); }
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

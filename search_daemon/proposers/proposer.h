// Proposer: a move generator of the search. Given a signature and a node of the search tree (with
// everything evaluated so far), it proposes complete candidates: a KernelSpec each (source plus a
// declarative launch plan; never host code). Implementations live beside this header:
// template_proposer.h (parameterized kernels per operator family: useful with no LLM at all) and
// llm_proposer.h (rewrites and repairs written by a language model).
//
//   std::vector<std::unique_ptr<Proposer>> ps = ...;
//   ProposalRequest req{&sig, &tree, parent_id, /*max_moves=*/4, seed, roofline};
//   for (auto& p : ps) if (p->supports(sig)) for (Move& m : p->propose(req)) tree.add(parent_id, std::move(m));
//
// A proposer may answer later (Note [Asynchronous proposals]): given req.pending it may start work
// and return nothing now, setting *req.pending; req.on_ready is called when that work is done, and
// collect() with the same signature and parent returns its moves.
//
// Promises of every implementation:
// - propose() never throws and never crashes on any tree: a proposer that has nothing (more) to
//   offer from a node returns an empty vector. It may block (an LLM proposer without concurrent
//   requests): strategies call it from the search's own thread, never from the daemon's I/O
//   thread.
// - Every returned Move has a spec that passes KernelSpec::validate(), a backend equal to the
//   signature's target backend, a proposer name, a one-line label and a prior in (0, 1].
// - Deterministic for a given request (seed included) where the proposer can be (templates); an
//   LLM proposer is not, which is why the journal stores moves, not requests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "runtime/op_signature.h"
#include "search_daemon/search/search_tree.h"

namespace kforge::search {

// What the search knows of the operator's cost on this device, for proposers that reason about it
// (the LLM prompt carries it). Zero where unknown.
struct Roofline {
  double baseline_ns = 0;             // PyTorch's kernel, as measured or observed
  double bytes = 0;                   // fewest bytes the op must move (catalog::op_cost)
  double flops = 0;
  double bandwidth_bytes_per_s = 0;   // the device's measured copy bandwidth
  std::string device_facts;           // EvaluatorPool::device_facts_for: model, ISA, threads, caches
  double floor_ns() const { return bandwidth_bytes_per_s > 0 ? bytes / bandwidth_bytes_per_s * 1e9 : 0; }
};

struct ProposalRequest {
  const OpSignature* signature = nullptr;
  const SearchTree* tree = nullptr;
  uint64_t parent = 0;                // the node to expand; 0: the root (first candidates)
  size_t max_moves = 4;
  uint64_t seed = 0;
  Roofline roofline;
  // Set to true by a proposer that offered fewer moves than it may offer to the same request later
  // (a server error or timeout, answers it could not use): the node is not exhausted yet (Note
  // [Retried proposals] in search/strategy_base.cc). May be null.
  bool* retry_later = nullptr;
  // Note [Asynchronous proposals]. Non-null: the caller collects later moves. A proposer that
  // starts work for this node (or has some outstanding for it, or has more work than it may run
  // at once) sets it to true: the node is not exhausted, and asking again costs nothing.
  bool* pending = nullptr;
  // Called once, from any thread, when work this request started has finished (its moves are
  // ready for collect()). Cheap and thread-safe; it may outlive the search (it must check).
  std::function<void()> on_ready{};
};

// Note [Asynchronous proposals]
// A language model takes minutes to answer; a search that waited on each answer left the worker
// idle (a real model's first answer took 173 s, and the worker evaluated nothing meanwhile). So a
// proposer may answer asynchronously: propose() with a non-null `pending` starts the work (an HTTP
// request on the proposer's own threads), sets *pending, and returns at once, with whatever moves it
// has ready. The strategy remembers the node as awaiting that proposer, never marks it exhausted
// for it, and asks the other proposers as usual (templates fill the gaps). When the work is done the
// proposer calls on_ready (the session wakes), and the strategy's next call collect()s the moves:
// they join the tree under the node they were asked from and are handed out before anything else
// (Note [Collected moves first] in strategy_base.cc). A proposer that may not start more work now
// (its limit of requests in flight) sets *pending too, without starting anything: the node is asked
// again once something finishes. release() says the search is over: what the proposer holds for it
// is dropped, and answers that arrive later are discarded.

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Whether it can propose anything for this operator, dtype and backend.
  virtual bool supports(const OpSignature& sig) const = 0;
  virtual std::vector<Move> propose(const ProposalRequest& request) = 0;
  // Note [Asynchronous proposals]: the moves that work started by an earlier propose() (same
  // signature, same parent) has produced since; sets *request.pending while some of that work is
  // still outstanding, and *request.retry_later as propose() would have. Never starts new work.
  virtual std::vector<Move> collect(const ProposalRequest& request) {
    (void)request;
    return {};
  }
  // The search of `sig` is over: drop whatever is kept for it. Never throws.
  virtual void release(const OpSignature& sig) { (void)sig; }
  // A uniformly random candidate of this proposer's space (the random-search baseline); nullopt
  // when the proposer has no enumerable space (an LLM) or none for this signature.
  virtual std::optional<Move> sample(const OpSignature& sig, std::mt19937_64& rng) {
    (void)sig;
    (void)rng;
    return std::nullopt;
  }
};

}  // namespace kforge::search

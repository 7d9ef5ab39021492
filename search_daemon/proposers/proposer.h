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
// Promises of every implementation:
// - propose() never throws and never crashes on any tree: a proposer that has nothing (more) to
//   offer from a node returns an empty vector. It may block (an LLM call): strategies call it from
//   the search's own thread, never from the daemon's I/O thread.
// - Every returned Move has a spec that passes KernelSpec::validate(), a backend equal to the
//   signature's target backend, a proposer name, a one-line label and a prior in (0, 1].
// - Deterministic for a given request (seed included) where the proposer can be (templates); an
//   LLM proposer is not, which is why the journal stores moves, not requests.
#pragma once

#include <cstdint>
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
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Whether it can propose anything for this operator, dtype and backend.
  virtual bool supports(const OpSignature& sig) const = 0;
  virtual std::vector<Move> propose(const ProposalRequest& request) = 0;
  // A uniformly random candidate of this proposer's space (the random-search baseline); nullopt
  // when the proposer has no enumerable space (an LLM) or none for this signature.
  virtual std::optional<Move> sample(const OpSignature& sig, std::mt19937_64& rng) {
    (void)sig;
    (void)rng;
    return std::nullopt;
  }
};

}  // namespace kforge::search

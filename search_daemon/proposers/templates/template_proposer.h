// TemplateProposer: the proposer behind the kernel template library (kernel_template.h). It makes
// kforge useful with no LLM at all: for a signature some family handles, it walks that family's
// knob space.
//
//   TemplateProposer p;
//   if (p.supports(sig)) {
//     ProposalRequest req{&sig, &tree, /*parent=*/0, /*max_moves=*/4, seed, roofline};
//     for (Move& m : p.propose(req)) tree.add(0, std::move(m));      // good defaults, with priors
//     req.parent = id;                                                // a template node
//     std::vector<Move> next = p.propose(req);                        // its neighbours in knob space
//   }
//   std::mt19937_64 rng(seed);
//   std::optional<Move> any = p.sample(sig, rng);                      // uniform over the valid space
//
// Promises (beyond proposer.h's):
// - supports(sig) is true exactly when some family applies to sig and has at least one valid
//   configuration for it.
// - propose() from the root gives the configurations with the highest prior, the best of each
//   variant (value of the categorical knobs) first, then the rest by prior; from a node made by
//   this proposer it gives that node's neighbours (one knob changed), by prior; from any other
//   node, nothing. Never a spec already in the tree, no spec twice, at most max_moves.
// - A move's label is label(family, config) and parses back (config_of); its proposer is
//   "template"; its prior is the family's heuristic, in (0, 1].
// - Deterministic: the same request gives the same moves (the seed is not needed); sample() draws
//   one 64-bit value at a time from rng and maps it to the space without std distributions, so a
//   seeded rng gives the same configuration on every platform.
// - Constructed with a set of family names, it walks those families only (supports, propose,
//   sample): a replay of a space measured before a family existed (Note [Landscape files] in
//   bench/search_bench.cc) stays a replay of that space. Empty (the default): every family.
#pragma once

#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"
#include "search_daemon/proposers/proposer.h"
#include "search_daemon/proposers/templates/kernel_template.h"

namespace kforge::search {

class TemplateProposer final : public Proposer {
 public:
  static constexpr std::string_view kName = "template";

  TemplateProposer() = default;
  explicit TemplateProposer(std::set<std::string> families) : families_(std::move(families)) {}

  std::string_view name() const override { return kName; }
  bool supports(const OpSignature& sig) const override;
  std::vector<Move> propose(const ProposalRequest& request) override;
  std::optional<Move> sample(const OpSignature& sig, std::mt19937_64& rng) override;

  // The move of one configuration: its spec, label and prior. Fails when the configuration is not
  // valid for the signature.
  static StatusOr<Move> move_for(const OpSignature& sig, const templates::TemplateConfig& config);
  // The configuration a move of this proposer holds, checked against its spec; nullopt for moves
  // of other proposers, or a label whose configuration does not give the move's spec for sig.
  static std::optional<templates::TemplateConfig> config_of(const OpSignature& sig, const Move& move);

  // The families of these labels (label()'s form; a label that does not parse names none).
  static std::set<std::string> families_of(const std::vector<std::string>& labels);
  // The valid configurations of the families this proposer walks.
  std::vector<templates::TemplateConfig> space(const OpSignature& sig) const;

 private:
  std::set<std::string> families_;   // empty: all
};

}  // namespace kforge::search

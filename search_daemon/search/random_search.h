// RandomSearch: uniform samples of the proposers' spaces, the second baseline MCTS is measured
// against at equal budget. Reached through make_strategy("random", ...).
//
// Rule: each candidate is Proposer::sample() of a proposer chosen uniformly among those that
// support the signature, added as a child of the root. A proposer whose sample() is nullopt has no
// enumerable space (an LLM) and is not asked again. A sample already in the tree, or one that is
// not a valid spec for the signature's backend, is a duplicate; after max_duplicate_samples
// duplicates in a row the spaces count as used up and the search is done once nothing is in
// flight. The proposers' propose() is never called. Deterministic for a given seed: one
// std::mt19937_64 seeded with it drives both the choice of proposer and the samples.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "search_daemon/search/strategy_base.h"

namespace kforge::search {

class RandomSearch final : public StrategyBase {
 public:
  RandomSearch(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options, SearchTree restored);
  std::string_view name() const override { return "random"; }

 protected:
  std::optional<uint64_t> select() override;
  bool can_produce() const override;

 private:
  std::mt19937_64 rng_;
  std::vector<Proposer*> samplers_;   // proposers whose sample() has not yet said nullopt
  uint32_t duplicates_in_a_row_ = 0;
  bool used_up_ = false;
};

}  // namespace kforge::search

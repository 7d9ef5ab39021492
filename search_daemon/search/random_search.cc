#include "search_daemon/search/random_search.h"

#include <utility>

namespace kforge::search {

RandomSearch::RandomSearch(SearchTask task, std::vector<Proposer*> proposers, StrategyOptions options,
                           SearchTree restored)
    : StrategyBase(std::move(task), std::move(proposers), options, std::move(restored)),
      rng_(options.seed),
      samplers_(proposers_) {}

std::optional<uint64_t> RandomSearch::select() {
  while (!used_up_ && !samplers_.empty()) {
    // rng() % k rather than uniform_int_distribution: the same sequence with every standard
    // library (the distribution's algorithm is unspecified); the bias is below 2^-60 for small k.
    const size_t k = static_cast<size_t>(rng_() % samplers_.size());
    std::optional<Move> m;
    try {
      m = samplers_[k]->sample(task_.signature, rng_);
    } catch (...) {
      m.reset();
    }
    if (!m) {
      samplers_.erase(samplers_.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    if (!acceptable(*m) || tree_.find(m->spec.id())) {
      if (++duplicates_in_a_row_ >= options_.max_duplicate_samples) used_up_ = true;
      continue;
    }
    duplicates_in_a_row_ = 0;
    return tree_.add(0, std::move(*m));
  }
  return std::nullopt;
}

bool RandomSearch::can_produce() const { return !used_up_ && !samplers_.empty(); }

}  // namespace kforge::search

#include "search_daemon/search/search_strategy.h"

#include "search_daemon/search/greedy.h"
#include "search_daemon/search/mcts.h"
#include "search_daemon/search/random_search.h"

namespace kforge::search {

std::unique_ptr<SearchStrategy> make_strategy(std::string_view name, SearchTask task, std::vector<Proposer*> proposers,
                                              StrategyOptions options, SearchTree restored) {
  if (name == "mcts") {
    return std::make_unique<Mcts>(std::move(task), std::move(proposers), options, std::move(restored));
  }
  if (name == "greedy") {
    return std::make_unique<Greedy>(std::move(task), std::move(proposers), options, std::move(restored));
  }
  if (name == "random") {
    return std::make_unique<RandomSearch>(std::move(task), std::move(proposers), options, std::move(restored));
  }
  return nullptr;
}

}  // namespace kforge::search

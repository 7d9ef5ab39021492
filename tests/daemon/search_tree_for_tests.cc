// A test-only copy of the SearchTree members the template tests call (constructor, add, find),
// linked only while kforge_search does not exist yet (search_daemon/proposers/templates/
// CMakeLists.txt). The promises are search_tree.h's: dense ids, one node per spec.
#include "search_daemon/search/search_tree.h"

namespace kforge::search {

SearchTree::SearchTree() { nodes_.push_back(Node{}); }

uint64_t SearchTree::add(uint64_t parent, Move move) {
  const KernelId id = move.spec.id();
  if (auto it = by_spec_.find(id); it != by_spec_.end()) return it->second;
  Node n;
  n.id = nodes_.size();
  n.parent = parent;
  n.move = std::move(move);
  n.spec_id = id;
  nodes_.push_back(std::move(n));
  nodes_.at(parent).children.push_back(nodes_.back().id);
  by_spec_.emplace(id, nodes_.back().id);
  return nodes_.back().id;
}

std::optional<uint64_t> SearchTree::find(const KernelId& spec_id) const {
  auto it = by_spec_.find(spec_id);
  if (it == by_spec_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kforge::search

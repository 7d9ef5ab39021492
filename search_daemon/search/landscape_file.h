// Recorded landscapes: the outcomes a worker measured for every configuration of a template space,
// as bench_search --landscape-out writes them (Note [Landscape files] in bench/search_bench.cc), read
// back to replay a search without a worker: bench_search --landscape-in, and the search-quality
// tests on a GPU's real measurements.
#pragma once

#include <map>
#include <string>
#include <vector>
#include <utility>

#include "runtime/status.h"
#include "search_daemon/search/search_tree.h"

namespace kforge::search {

struct LandscapeFile {
  std::string arch;     // "# arch\t..." header: the device's architecture when recorded
  std::string device;   // "# device\t..." header
  std::map<std::pair<std::string, std::string>, Outcome> outcomes;   // (signature name, move label)

  // Lines of 8 tab-separated fields: signature name, label, status (EvalStatus's number), status
  // name, speedup, noise band, significant (0/1), implausible (may be empty); '#' lines are
  // comments. A malformed line is an error naming the file and line.
  static StatusOr<LandscapeFile> load(const std::string& path);
  // The labels the recording has for `signature` (TemplateProposer::families_of gives their
  // families: a replay walks those only, so a family added since does not change its space).
  std::vector<std::string> labels(const std::string& signature) const;
  // One line for `o` (tabs and newlines in the label or reason become spaces).
  static std::string line(const std::string& signature, const std::string& label, const Outcome& o);
};

}  // namespace kforge::search

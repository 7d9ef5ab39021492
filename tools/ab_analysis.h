// The end-to-end A/B windows of `kforge warm`'s last run, paired and summarized (Note [End-to-end
// A/B] in interposer/hook/ab_driver.h): what warm reports and what it leaves out by.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge {

struct AbResult {
  struct Ratio {
    double median = 0, low = 0, high = 0;   // the median and the quartiles of the ratios
    size_t pairs = 0;
  };
  std::map<std::string, Ratio> by_label;         // "none", or a signature id (hex)
  std::map<std::string, std::string> entry_of;   // signature id -> entry key
  double seconds = 0;                            // the windows' time, all of them
  size_t idle_windows = 0;                       // windows without a catalog call, not paired
};

// Each window that is not "all" is paired with the "all" window next to it (the one before, else
// the one after); its ratio rate(all) / rate(this) is how much faster the step is with every
// entry than with this table. Per label: the median of those ratios and their quartiles.
// `per_process`: each hooked process's AbDriver::to_json(), parsed.
AbResult analyse_ab(const std::vector<nlohmann::json>& per_process);

}  // namespace kforge

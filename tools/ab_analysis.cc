#include "tools/ab_analysis.h"

#include <algorithm>
#include <tuple>

namespace kforge {

// Note [Idle windows]
// ~~~~~~~~~~~~~~~~~~~
// A window in which the program made no catalog call says nothing about any table: the program was
// not stepping (starting, compiling, loading, or tearing down after its loop; a GPU host's model
// of a billion parameters takes seconds to free). Paired as it was, an "all" window of this kind
// gave a ratio of 0: on an H100 the model suite's GPT-2 warm reported quartiles of 0.000-1.053
// over 3 pairs. Such windows are counted, and dropped before pairing; the windows on either side
// of one are not adjacent for pairing (a gap in the stepping lies between them).
AbResult analyse_ab(const std::vector<nlohmann::json>& per_process) {
  AbResult out;
  std::map<std::string, std::vector<double>> ratios;
  for (const nlohmann::json& ab : per_process) {
    for (const nlohmann::json& e : ab.value("entries", nlohmann::json::array())) {
      out.entry_of[e.value("signature_id", "")] = e.value("entry", "");
    }
    // label, rate; an idle window leaves a gap (rate 0) so that no pair spans it.
    std::vector<std::tuple<std::string, double>> w;
    for (const nlohmann::json& x : ab.value("windows", nlohmann::json::array())) {
      if (!x.is_array() || x.size() != 3 || !x[0].is_string() || !x[1].is_number() || !x[2].is_number()) continue;
      const double calls = x[1].get<double>(), ns = x[2].get<double>();
      if (ns <= 0) continue;
      out.seconds += ns / 1e9;
      if (calls <= 0) ++out.idle_windows;
      w.emplace_back(x[0].get<std::string>(), calls > 0 ? calls / ns : 0.0);
    }
    const auto all = [&](size_t j) { return std::get<0>(w[j]) == "all" && std::get<1>(w[j]) > 0; };
    for (size_t i = 0; i < w.size(); ++i) {
      if (std::get<0>(w[i]) == "all" || std::get<1>(w[i]) <= 0) continue;
      const size_t j = i > 0 && all(i - 1) ? i - 1 : i + 1;
      if (j >= w.size() || !all(j)) continue;
      ratios[std::get<0>(w[i])].push_back(std::get<1>(w[j]) / std::get<1>(w[i]));
    }
  }
  for (auto& [label, r] : ratios) {
    std::sort(r.begin(), r.end());
    AbResult::Ratio& q = out.by_label[label];
    q.pairs = r.size();
    q.median = r.size() % 2 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
    q.low = r[r.size() / 4];
    q.high = r[(3 * r.size()) / 4];
  }
  return out;
}

}  // namespace kforge

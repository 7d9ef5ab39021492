#include "interposer/hook/ab_driver.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "interposer/hook/swapper.h"

namespace kforge::hook {

void AbDriver::tick(uint64_t total_calls, Swapper& swapper) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<SignatureId, std::string>> active;
    const bool ready = swapper.ab_ready(&active);
    if (!ready || active != entries_) {
      // An entry on trial, or the set changed (an entry failed, an upgrade): start over with every
      // active entry in, recording nothing until the set is settled.
      if (in_window_ || label_ != "all") swapper.set_ab_table(Swapper::AbTable::kAll, SignatureId{});
      in_window_ = false;
      label_ = "all";
      entries_ = std::move(active);
      sequence_.clear();
      next_ = 0;
      state_ = entries_.empty() ? "waiting" : state_;
      if (!ready) return;
    }
    if (entries_.empty()) return;   // nothing to compare
    if (windows_.size() >= kMaxWindows) {
      if (state_ != "stopped") swapper.set_ab_table(Swapper::AbTable::kAll, SignatureId{});
      state_ = "stopped";
      return;
    }
    if (in_window_) {
      windows_.push_back({label_, total_calls - calls_at_start_,
                          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count())});
    }
    if (next_ >= sequence_.size()) {
      // Every other table right after an "all" window, so each has an "all" neighbour to be
      // compared with; the others' order reversed every other round.
      std::vector<std::string> others{"none"};
      for (const auto& [id, key] : entries_) others.push_back(id.hex());
      if (round_++ % 2 == 1) std::reverse(others.begin(), others.end());
      sequence_.clear();
      for (const std::string& o : others) {
        sequence_.push_back("all");
        sequence_.push_back(o);
      }
      next_ = 0;
    }
    label_ = sequence_[next_++];
    if (label_ == "all") {
      swapper.set_ab_table(Swapper::AbTable::kAll, SignatureId{});
    } else if (label_ == "none") {
      swapper.set_ab_table(Swapper::AbTable::kNone, SignatureId{});
    } else {
      for (const auto& [id, key] : entries_) {
        if (id.hex() == label_) swapper.set_ab_table(Swapper::AbTable::kWithout, id);
      }
    }
    // The first window after the set settled is recorded too: the table switch is immediate.
    in_window_ = true;
    state_ = "running";
    calls_at_start_ = total_calls;
    start_ = std::chrono::steady_clock::now();
    (void)window_ms_;
  } catch (...) {
    // Out of memory recording a window: the comparison just has fewer windows.
  }
}

std::string AbDriver::to_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [id, key] : entries_) entries.push_back({{"signature_id", id.hex()}, {"entry", key}});
  nlohmann::json windows = nlohmann::json::array();
  for (const Window& w : windows_) windows.push_back({w.label, w.calls, w.ns});
  return nlohmann::json{{"window_ms", window_ms_}, {"state", state_}, {"entries", entries}, {"windows", windows}}.dump();
}

}  // namespace kforge::hook

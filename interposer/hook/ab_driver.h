// AbDriver: `kforge warm`'s end-to-end check, inside one serving process (KFORGE_AB_WINDOW_MS).
//
//   AbDriver ab(250);                                   // windows of 250 ms
//   // reporter thread, each round (KFORGE_REPORT_INTERVAL_MS = the window):
//   ab.tick(total_calls_so_far, *swapper);
//   ab.to_json()                                        // into the stats and the exit summary
//
// Note [End-to-end A/B]
// Per-operator timings do not show what a swapped kernel costs the whole step: dispatch through
// the interceptor, a boxed call, a launch that does not overlap as PyTorch's did. Others who
// overrode many ATen operators saw a model fall to 22-69% of its native throughput that way. So
// the last run of `kforge warm` measures the program itself: once every entry the process loaded
// has finished its trial, the reporter thread switches, window by window, among the replacement
// tables "all" (every active entry), "none" (PyTorch's kernels everywhere) and, for each active
// entry e, "without e", and counts the catalog operators' calls in each window (the run observes
// every call: KFORGE_OBSERVE_EVERY=1 in every window alike). A program that repeats the same step
// makes calls at a rate proportional to its step rate, so rate(all) / rate(none) is the
// end-to-end speedup and rate(all) / rate(without e) what e adds. A round visits every other
// table once, each right after an "all" window (its pair), in an order reversed every other
// round, so drift falls on all alike; windows while some entry is still on trial are not
// recorded. The windows are
// reported as they are (label, calls, nanoseconds); `kforge warm` computes the ratios (medians
// over rounds) and disables in the cache the entries that do not pay. For a program that is not
// a loop of like steps the rates mean nothing, and warm says so when the rounds disagree.
// Switching publishes a new table each time (tables are never freed: about 1 KiB a window); it
// is for a bounded staging run, never for production.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/op_signature.h"

namespace kforge::hook {

class Swapper;

class AbDriver {
 public:
  explicit AbDriver(uint32_t window_ms) : window_ms_(window_ms) {}

  // Reporter thread, once per round. total_calls: the catalog operators' calls so far.
  void tick(uint64_t total_calls, Swapper& swapper) noexcept;

  // {"window_ms", "entries": [{"signature_id", "entry"}], "windows": [[label, calls, ns], ...],
  //  "state": "waiting" | "running" | "stopped"}; label "all", "none" or the signature id of the
  //  entry left out.
  std::string to_json() const;

 private:
  struct Window {
    std::string label;
    uint64_t calls;
    uint64_t ns;
  };
  static constexpr size_t kMaxWindows = 20000;
  uint32_t window_ms_;
  mutable std::mutex mu_;                       // tick vs to_json (stats from any thread)
  std::vector<std::pair<SignatureId, std::string>> entries_;   // (signature, entry key hex)
  std::vector<std::string> sequence_;           // this round's labels
  size_t next_ = 0;
  uint64_t round_ = 0;
  bool in_window_ = false;
  std::string label_;
  uint64_t calls_at_start_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::vector<Window> windows_;
  std::string state_ = "waiting";
};

}  // namespace kforge::hook

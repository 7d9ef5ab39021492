// LogLimiter: keeps a flood of similar events (a hostile or broken client's thousands of Hellos,
// malformed messages, quota refusals) from flooding the daemon's log, without hiding that it
// happened. Lines share a budget per key ("attach", "malformed"): at most `burst` lines per key in
// any window of `window`; the rest are counted, and the next line of that key that is let through
// says how many were suppressed.
//
//   LogLimiter limits({.burst = 10, .window = std::chrono::seconds(10)});
//   if (std::optional<std::string> line = limits.admit("attach", "process 123 attached", now)) log(*line);
//
// Not thread-safe: the daemon's I/O thread owns it (under the daemon's mutex). Memory is bounded:
// at most kMaxKeys keys (callers use a fixed set of keys, never a peer's name).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kforge::daemon {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    uint32_t burst = 10;
    Clock::duration window = std::chrono::seconds(10);
  };
  static constexpr size_t kMaxKeys = 64;

  explicit LogLimiter(Options options) : options_(options) {}

  // The line to write now (with a note of what was suppressed since the last one of this key), or
  // nullopt when the key's budget is spent (the line is counted).
  std::optional<std::string> admit(const std::string& key, const std::string& line, Clock::time_point now);
  // One line per key whose window has ended with suppressed lines not yet reported ("12 lines like
  // 'process 123 attached' suppressed"): call it now and then, so the count of a flood that
  // stopped is still told. Each suppressed line is reported once.
  std::vector<std::string> flush(Clock::time_point now);
  // Lines of `key` suppressed and not yet reported.
  uint64_t pending(const std::string& key) const;
  // Every suppressed line so far, all keys.
  uint64_t suppressed_total() const noexcept { return suppressed_total_; }

 private:
  struct Budget {
    Clock::time_point window_start{};
    uint32_t used = 0;
    uint64_t suppressed = 0;
    std::string last;   // the latest suppressed line, as an example in flush()
  };
  Options options_;
  std::map<std::string, Budget> keys_;
  uint64_t suppressed_total_ = 0;
};

}  // namespace kforge::daemon

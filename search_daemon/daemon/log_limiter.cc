#include "search_daemon/daemon/log_limiter.h"

namespace kforge::daemon {

std::optional<std::string> LogLimiter::admit(const std::string& key, const std::string& line, Clock::time_point now) {
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    // A fixed set of keys in practice; past the bound every new key shares one budget.
    it = keys_.size() < kMaxKeys ? keys_.emplace(key, Budget{}).first : keys_.emplace("(other)", Budget{}).first;
  }
  Budget& b = it->second;
  if (b.used == 0 || now - b.window_start >= options_.window) {
    b.window_start = now;
    b.used = 0;
  }
  if (b.used >= options_.burst) {
    ++b.suppressed;
    ++suppressed_total_;
    b.last = line.substr(0, 200);
    return std::nullopt;
  }
  ++b.used;
  if (b.suppressed == 0) return line;
  const uint64_t n = b.suppressed;
  b.suppressed = 0;
  return line + " (" + std::to_string(n) + " similar line" + (n == 1 ? "" : "s") + " suppressed before this one)";
}

std::vector<std::string> LogLimiter::flush(Clock::time_point now) {
  std::vector<std::string> out;
  for (auto& [key, b] : keys_) {
    if (b.suppressed == 0 || now - b.window_start < options_.window) continue;
    out.push_back(std::to_string(b.suppressed) + " line" + (b.suppressed == 1 ? "" : "s") + " like '" + b.last +
                  "' suppressed");
    b.suppressed = 0;
    b.used = 0;
  }
  return out;
}

uint64_t LogLimiter::pending(const std::string& key) const {
  const auto it = keys_.find(key);
  return it == keys_.end() ? 0 : it->second.suppressed;
}

}  // namespace kforge::daemon

#include "search_daemon/worker/timing_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/human_units.h"

namespace kforge::eval {

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

namespace {

double spread_of(const std::vector<double>& v, double median) {
  return median > 0 ? (quantile(v, 0.9) - quantile(v, 0.1)) / median : 0;
}

}  // namespace

// Note [Paired timing] in timing_stats.h.
StatusOr<PairedTiming> summarize_pairs(const std::vector<TimedPair>& pairs) {
  if (pairs.size() < 3) return invalid_argument("need at least 3 timed pairs, got " + std::to_string(pairs.size()));
  std::vector<double> base, cand, logs;
  base.reserve(pairs.size());
  cand.reserve(pairs.size());
  logs.reserve(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const TimedPair& p = pairs[i];
    if (!(std::isfinite(p.baseline_ns) && p.baseline_ns > 0 && std::isfinite(p.candidate_ns) && p.candidate_ns > 0)) {
      return invalid_argument("timed pair " + std::to_string(i) + " is not two positive finite times (" +
                              std::to_string(p.baseline_ns) + " ns, " + std::to_string(p.candidate_ns) + " ns)");
    }
    base.push_back(p.baseline_ns);
    cand.push_back(p.candidate_ns);
    logs.push_back(std::log(p.baseline_ns / p.candidate_ns));
  }
  PairedTiming t;
  t.runs = static_cast<uint32_t>(pairs.size());
  t.baseline_median_ns = quantile(base, 0.5);
  t.candidate_median_ns = quantile(cand, 0.5);
  t.baseline_spread = spread_of(base, t.baseline_median_ns);
  t.candidate_spread = spread_of(cand, t.candidate_median_ns);
  const double median_log = quantile(logs, 0.5);
  t.speedup = std::exp(median_log);

  std::sort(logs.begin(), logs.end());
  const double n = static_cast<double>(logs.size());
  // 1-based ranks of the sign-test interval, clamped to the sample.
  const double k = std::floor(n / 2 - 1.96 * std::sqrt(n) / 2);
  const size_t lo = static_cast<size_t>(std::max(1.0, k)) - 1;
  const size_t hi = logs.size() - 1 - lo;
  t.log_ci_low = logs[lo];
  t.log_ci_high = logs[hi];
  t.noise_band = std::max(kMinNoiseBand, (t.log_ci_high - t.log_ci_low) / 2);
  const bool excludes_zero = t.log_ci_low > 0 || t.log_ci_high < 0;
  t.significant = excludes_zero && std::abs(median_log) > t.noise_band;
  return t;
}

double expected_op_ns(double bytes, double ceiling_bytes_per_s, double call_floor_ns) {
  const double memory_ns = ceiling_bytes_per_s > 0 ? bytes / ceiling_bytes_per_s * 1e9 : 0;
  return memory_ns + std::max(call_floor_ns, 0.0);
}

std::string implausibility(double baseline_median_ns, double candidate_median_ns, double bytes,
                           double ceiling_bytes_per_s, double call_floor_ns, double max_baseline_ratio) {
  if (ceiling_bytes_per_s <= 0) return "";
  const double expected = expected_op_ns(bytes, ceiling_bytes_per_s, call_floor_ns);
  if (max_baseline_ratio > 0 && expected > 0 && baseline_median_ns > max_baseline_ratio * expected) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.0f", baseline_median_ns / expected);
    return "PyTorch's kernel measured " + human_duration_ns(baseline_median_ns) + ", " + ratio + "x the cost model's " +
           human_duration_ns(expected) + " (" + human_duration_ns(bytes / ceiling_bytes_per_s * 1e9) + " to move its bytes + a " +
           human_duration_ns(call_floor_ns) + " call): a broken measurement (a contended host?)";
  }
  const double memory_floor = bytes / ceiling_bytes_per_s * 1e9;
  if (candidate_median_ns < 0.25 * memory_floor) {
    return "the candidate measured " + human_duration_ns(candidate_median_ns) + ", under a quarter of the " + human_duration_ns(memory_floor) +
           " its bytes take at the device's copy bandwidth";
  }
  return "";
}

}  // namespace kforge::eval

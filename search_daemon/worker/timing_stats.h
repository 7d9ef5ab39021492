// Statistics of one timing run: baseline (PyTorch's kernel) and candidate timed in interleaved
// pairs, reduced to the speedup and whether it is real. Torch-free, so the rule is unit-tested on
// fixed numbers and the daemon could reuse it.
//
//   std::vector<TimedPair> pairs = ...;          // one (baseline_ns, candidate_ns) per round
//   StatusOr<PairedTiming> t = summarize_pairs(pairs);
//   if (t->significant && t->speedup > 1) ...    // faster, outside the noise
//
// Note [Paired timing]
// Each round times the baseline and the candidate back to back (their order alternates), so slow
// drifts of the machine (clocks, other load) hit both alike. The speedup is exp(median over rounds
// of ln(baseline_i / candidate_i)): the median of paired log ratios, robust to the odd interrupted
// run. Its distribution-free 95% confidence interval comes from order statistics of the sorted log
// ratios (ranks n/2 -+ 1.96 sqrt(n)/2, the sign-test interval for a median). The noise band is that
// interval's half-width, at least kMinNoiseBand (1%): a speedup counts (significant) only when the
// interval excludes 0 and |ln speedup| exceeds the band. A candidate timed against itself must come
// out not significant, with a speedup within the band of 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace kforge::eval {

inline constexpr double kMinNoiseBand = 0.01;

struct TimedPair {
  double baseline_ns = 0;
  double candidate_ns = 0;
};

struct PairedTiming {
  uint32_t runs = 0;
  double baseline_median_ns = 0;
  double candidate_median_ns = 0;
  double baseline_spread = 0;     // (p90 - p10) / median
  double candidate_spread = 0;
  double speedup = 0;             // exp(median ln(baseline_i / candidate_i))
  double log_ci_low = 0;          // 95% interval of that median log ratio
  double log_ci_high = 0;
  double noise_band = 0;          // max(kMinNoiseBand, half-width of the interval)
  bool significant = false;
};

// At least 3 pairs, every time finite and > 0; else an error naming the bad pair.
StatusOr<PairedTiming> summarize_pairs(const std::vector<TimedPair>& pairs);

// Note [Plausible timing] in measurer.h: the cost model's time for an op that moves `bytes` on a
// device with copy bandwidth `ceiling_bytes_per_s` and a smallest call of `call_floor_ns`.
double expected_op_ns(double bytes, double ceiling_bytes_per_s, double call_floor_ns);

// Why a timing cannot be believed (Note [Plausible timing]), or "" when it can: PyTorch's median
// over `max_baseline_ratio` x the expected time (0: no such check), or the candidate's under a quarter
// of the memory floor. Unknown ceilings (0) check nothing.
std::string implausibility(double baseline_median_ns, double candidate_median_ns, double bytes,
                           double ceiling_bytes_per_s, double call_floor_ns, double max_baseline_ratio);

// The q-quantile (0..1, linear interpolation) of unsorted values; 0 for none.
double quantile(std::vector<double> values, double q);

}  // namespace kforge::eval

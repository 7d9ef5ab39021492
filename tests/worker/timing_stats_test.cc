// The paired-timing rule (Note [Paired timing]): what counts as a speedup and what is noise.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "search_daemon/worker/timing_stats.h"

using namespace kforge;
using namespace kforge::eval;

TEST_CASE("timing: a candidate twice as fast on every pair is a significant 2x speedup") {
  std::vector<TimedPair> pairs;
  for (int i = 0; i < 30; ++i) pairs.push_back({1000.0 + i, (1000.0 + i) / 2});
  StatusOr<PairedTiming> t = summarize_pairs(pairs);
  REQUIRE(t.ok());
  CHECK(t->runs == 30);
  CHECK(t->speedup == Approx(2.0));
  CHECK(t->significant);
  CHECK(t->noise_band == Approx(kMinNoiseBand));   // no spread in the ratios: the floor
  CHECK(t->baseline_median_ns == Approx(1014.5));
  CHECK(t->candidate_median_ns == Approx(507.25));
}

TEST_CASE("timing: the same kernel timed against itself is noise, with a speedup within the band of 1") {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> jitter(0.0, 0.05);
  std::vector<TimedPair> pairs;
  for (int i = 0; i < 40; ++i) pairs.push_back({5000 * jitter(rng), 5000 * jitter(rng)});
  StatusOr<PairedTiming> t = summarize_pairs(pairs);
  REQUIRE(t.ok());
  CHECK_FALSE(t->significant);
  CHECK(std::abs(std::log(t->speedup)) <= t->noise_band);
  CHECK(t->log_ci_low < 0);
  CHECK(t->log_ci_high > 0);
  CHECK(t->baseline_spread > 0);
}

TEST_CASE("timing: a 0.5% difference is inside the 1% floor of the noise band, however steady") {
  std::vector<TimedPair> pairs;
  for (int i = 0; i < 30; ++i) pairs.push_back({1005, 1000});
  StatusOr<PairedTiming> t = summarize_pairs(pairs);
  REQUIRE(t.ok());
  CHECK(t->speedup == Approx(1.005));
  CHECK_FALSE(t->significant);
}

TEST_CASE("timing: one interrupted run does not move the median of paired ratios") {
  std::vector<TimedPair> pairs;
  for (int i = 0; i < 31; ++i) pairs.push_back({1000, 800});
  pairs[5].baseline_ns = 90000;   // a preempted baseline run
  StatusOr<PairedTiming> t = summarize_pairs(pairs);
  REQUIRE(t.ok());
  CHECK(t->speedup == Approx(1.25));
  CHECK(t->significant);
}

TEST_CASE("timing: too few pairs and bad times are errors naming the pair") {
  CHECK_FALSE(summarize_pairs({{1, 1}, {1, 1}}).ok());
  std::vector<TimedPair> pairs(5, TimedPair{100, 100});
  pairs[3].candidate_ns = std::nan("");
  StatusOr<PairedTiming> t = summarize_pairs(pairs);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Catch::Contains("timed pair 3"));
  pairs[3].candidate_ns = 0;
  CHECK_FALSE(summarize_pairs(pairs).ok());
}

TEST_CASE("timing: quantile interpolates between order statistics") {
  CHECK(quantile({}, 0.5) == 0);
  CHECK(quantile({3, 1, 2}, 0.5) == 2);
  CHECK(quantile({1, 2, 3, 4}, 0.5) == Approx(2.5));
  CHECK(quantile({1, 2, 3, 4}, 0.0) == 1);
  CHECK(quantile({1, 2, 3, 4}, 1.0) == 4);
}

TEST_CASE("plausible timing: a baseline far over the cost model, or a candidate faster than memory allows, is flagged") {
  // layer_norm float32 [64,128] on a 2-core VM (issue 19): 32 KiB in, 32 KiB out and 512 B of
  // mean/rstd at a measured 10 GB/s is 6.6 us, plus a 1 us smallest call: 7.6 us expected.
  const double bytes = 64 * 128 * 4 * 2 + 512;
  const double bw = 10e9;
  CHECK(expected_op_ns(bytes, bw, 1000) == Approx(bytes / bw * 1e9 + 1000));
  // PyTorch measured 15,986,840 ns against 62,548 ns for the candidate: 239x, and 2100x the model.
  const std::string why = implausibility(15986840, 62548, bytes, bw, 1000, 50);
  CHECK_THAT(why, Catch::Contains("PyTorch's kernel measured 16.0 ms"));
  CHECK_THAT(why, Catch::Contains("2102x the cost model's 7.60 us (6.60 us to move its bytes + a 1.00 us call)"));
  // A slow but believable baseline (20x the model) and a candidate near the roofline pass.
  CHECK(implausibility(20 * 7620, 8000, bytes, bw, 1000, 50).empty());
  // No ratio given: only the candidate's floor is checked.
  CHECK(implausibility(15986840, 62548, bytes, bw, 1000, 0).empty());
  // A candidate at a fifth of the time its bytes take at the copy bandwidth is not a kernel that
  // works; at a third it may be one whose writes are still in the cache when it ends.
  CHECK_THAT(implausibility(20000, 1300, bytes, bw, 1000, 50), Catch::Contains("under a quarter of the 6.60 us"));
  CHECK(implausibility(20000, 2200, bytes, bw, 1000, 50).empty());
  // An unknown ceiling checks nothing.
  CHECK(implausibility(1e9, 1, bytes, 0, 1000, 50).empty());
}

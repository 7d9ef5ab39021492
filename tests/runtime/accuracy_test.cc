// Note [Accuracy criterion]: as accurate as PyTorch's kernel, within a factor 2 and a floor.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "runtime/accuracy.h"

using namespace kforge;

TEST_CASE("accuracy: within twice PyTorch's error passes, beyond it fails naming the measure") {
  const ErrorMeasures torch{1e-6, 1e-7, 1.0};
  const AccuracyVerdict ok = judge_accuracy({1.9e-6, 1.5e-7, 1.0}, torch, DType::kFloat32);
  CHECK(ok.passed);
  CHECK(ok.detail.empty());
  const AccuracyVerdict bad_abs = judge_accuracy({4e-6, 1e-7, 1.0}, torch, DType::kFloat32);
  CHECK_FALSE(bad_abs.passed);
  CHECK_THAT(bad_abs.detail, Catch::StartsWith("max abs error 4e-06 > bound"));
  const AccuracyVerdict bad_rel = judge_accuracy({1e-6, 2e-6, 1.0}, torch, DType::kFloat32);   // bound 2e-7 + 9.5e-7
  CHECK_FALSE(bad_rel.passed);
  CHECK_THAT(bad_rel.detail, Catch::StartsWith("relative L2 error"));
}

TEST_CASE("accuracy: the floor admits a few ulps where PyTorch happens to be exact") {
  const ErrorMeasures exact{0, 0, 2.0};
  // 8 eps * max|ref| = 8 * 1.19e-7 * 2
  CHECK(judge_accuracy({1.5e-6, 5e-7, 2.0}, exact, DType::kFloat32).passed);
  CHECK_FALSE(judge_accuracy({2.5e-6, 5e-7, 2.0}, exact, DType::kFloat32).passed);
  // bfloat16's epsilon is far larger.
  CHECK(judge_accuracy({0.1, 0.05, 2.0}, exact, DType::kBFloat16).passed);
}

TEST_CASE("accuracy: a NaN measure never passes") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(judge_accuracy({nan, 0, 1}, {1e-6, 1e-7, 1}, DType::kFloat32).passed);
  CHECK_FALSE(judge_accuracy({0, nan, 1}, {1e-6, 1e-7, 1}, DType::kFloat32).passed);
}

TEST_CASE("accuracy: epsilons of the floating dtypes") {
  CHECK(dtype_epsilon(DType::kFloat32) == std::ldexp(1.0, -23));
  CHECK(dtype_epsilon(DType::kFloat64) == std::ldexp(1.0, -52));
  CHECK(dtype_epsilon(DType::kFloat16) == std::ldexp(1.0, -10));
  CHECK(dtype_epsilon(DType::kBFloat16) == std::ldexp(1.0, -7));
}

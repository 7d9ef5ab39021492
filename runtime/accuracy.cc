#include "runtime/accuracy.h"

#include <cmath>
#include <cstdio>

namespace kforge {

namespace {

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

}  // namespace

double dtype_epsilon(DType t) noexcept {
  switch (t) {
    case DType::kFloat64:
    case DType::kComplex128: return 2.220446049250313e-16;
    case DType::kFloat32:
    case DType::kComplex64: return 1.1920928955078125e-07;
    case DType::kFloat16: return 9.765625e-04;
    case DType::kBFloat16: return 7.8125e-03;
    default: return 0.125;
  }
}

// Note [Accuracy criterion] in accuracy.h.
AccuracyVerdict judge_accuracy(const ErrorMeasures& candidate, const ErrorMeasures& torch, DType dtype) {
  AccuracyVerdict v;
  const double eps = dtype_epsilon(dtype);
  const double abs_floor = 8 * eps * torch.ref_max;
  const double rel_floor = 8 * eps;
  v.max_abs_bound = 2 * torch.max_abs + abs_floor;
  v.rel_bound = 2 * torch.rel_l2 + rel_floor;
  // Written so that a NaN in any measure fails (every comparison with NaN is false).
  if (!(candidate.max_abs <= v.max_abs_bound)) {
    v.detail = "max abs error " + fmt(candidate.max_abs) + " > bound " + fmt(v.max_abs_bound) + " (2 x PyTorch's " +
               fmt(torch.max_abs) + " + floor " + fmt(abs_floor) + ")";
    return v;
  }
  if (!(candidate.rel_l2 <= v.rel_bound)) {
    v.detail = "relative L2 error " + fmt(candidate.rel_l2) + " > bound " + fmt(v.rel_bound) + " (2 x PyTorch's " +
               fmt(torch.rel_l2) + " + floor " + fmt(rel_floor) + ")";
    return v;
  }
  v.passed = true;
  return v;
}

}  // namespace kforge

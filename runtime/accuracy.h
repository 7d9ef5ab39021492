// The accuracy criterion: when a candidate's output is as accurate as PyTorch's own kernel.
// One definition for both places that judge it: the worker's verification and the hook's shadow
// calls. Torch-free: callers reduce their tensors to the numbers below (in float64, over the
// elements finite in both PyTorch's output and the float64 reference) and ask here.
//
//   ErrorMeasures cand{max_abs(c - ref), l2(c - ref) / l2(ref), max_abs(ref)};
//   ErrorMeasures torch{max_abs(o - ref), l2(o - ref) / l2(ref), max_abs(ref)};
//   AccuracyVerdict v = judge_accuracy(cand, torch, DType::kFloat32);
//   if (!v.passed) log(v.detail);   // "max abs error 3.1e-05 > bound 2.4e-07 (2 x PyTorch's 1.2e-07 + floor 0)"
//
// Note [Accuracy criterion]
// A candidate passes iff, in both measures,
//   max|cand - ref|            <= 2 * max|torch - ref|            + 8 * eps(dtype) * max|ref|
//   ||cand - ref|| / ||ref||   <= 2 * ||torch - ref|| / ||ref||   + 8 * eps(dtype)
// where ref is PyTorch's kernel run on the inputs converted to float64, torch is PyTorch's kernel on
// the real inputs, and eps is the output dtype's machine epsilon (float32 1.19e-7, float16 9.8e-4,
// bfloat16 7.8e-3, float64 2.2e-16). The factor 2 admits a different but equally good rounding
// order; the floor lets a candidate that is exact to a few ulps pass where PyTorch's error happens
// to be 0 (inputs of all zeros, an exactly representable result). A NaN anywhere in the measures
// fails. DESIGN.md: "a kernel that is faster but less accurate is a bug".
#pragma once

#include <string>

#include "runtime/op_signature.h"

namespace kforge {

struct ErrorMeasures {
  double max_abs = 0;   // max |x - ref| over the compared elements
  double rel_l2 = 0;    // ||x - ref||_2 / ||ref||_2 (||ref|| taken as 1 when it is 0)
  double ref_max = 0;   // max |ref| over the same elements
};

struct AccuracyVerdict {
  bool passed = false;
  double max_abs_bound = 0;   // what cand.max_abs had to stay within
  double rel_bound = 0;       // what cand.rel_l2 had to stay within
  std::string detail;         // empty when passed; else which measure failed and by how much
};

// Machine epsilon of a floating dtype (2^-mantissa bits); 0.125 for float8 and non-floating types.
double dtype_epsilon(DType t) noexcept;

AccuracyVerdict judge_accuracy(const ErrorMeasures& candidate, const ErrorMeasures& torch, DType dtype);

}  // namespace kforge

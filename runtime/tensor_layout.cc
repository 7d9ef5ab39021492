#include "runtime/tensor_layout.h"

#include <algorithm>
#include <numeric>

namespace kforge {

// Note [empty_like strides]
// torch.empty_like(x) with memory_format=preserve (the default) keeps x's strides when x is
// non-overlapping and dense, and otherwise builds dense strides in x's stride order
// (at::infer_dense_strides, the TensorIterator rule). The worker compares a candidate's output
// strides with PyTorch's exactly, so these two functions follow ATen's rules step for step,
// including how they treat dimensions of size 0 or 1 and stride 0.

bool is_non_overlapping_and_dense(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const size_t n = sizes.size();
  if (n == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  // Dimensions of size < 2 go last; the rest by increasing stride.
  std::stable_sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    const bool a_small = sizes[a] < 2, b_small = sizes[b] < 2;
    if (a_small != b_small) return b_small;
    if (a_small) return false;
    return strides[a] < strides[b];
  });
  int64_t required = 1;
  for (size_t d : perm) {
    if (sizes[d] < 2) return true;
    if (strides[d] != required) return false;
    if (__builtin_mul_overflow(required, sizes[d], &required)) return false;
  }
  return true;
}

StatusOr<std::vector<int64_t>> infer_dense_strides(const std::vector<int64_t>& sizes,
                                                   const std::vector<int64_t>& strides) {
  const size_t n = sizes.size();
  if (n == 0) return std::vector<int64_t>{};
  if (n == 1) return std::vector<int64_t>{1};
  std::vector<size_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = n - 1 - i;   // innermost dimension first
  // -1: d0 goes before d1; 1: after; 0: ambiguous (zero strides never move).
  auto order = [&](size_t d0, size_t d1) {
    if (strides[d0] == 0 || strides[d1] == 0) return 0;
    if (strides[d0] < strides[d1]) return -1;
    if (strides[d0] > strides[d1]) return 1;
    return sizes[d0] > sizes[d1] ? 1 : 0;
  };
  // The same stable insertion sort as ATen: with a non-transitive order, another sort would give
  // another permutation.
  for (size_t i = 1; i < n; ++i) {
    size_t d1 = i;
    for (size_t j = 1; j <= i; ++j) {
      const size_t d0 = i - j;
      const int c = order(perm[d0], perm[d1]);
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      } else if (c < 0) {
        break;
      }
    }
  }
  std::vector<int64_t> out(n);
  int64_t stride = 1;
  for (size_t d : perm) {
    out[d] = stride;
    if (sizes[d] > 1 && __builtin_mul_overflow(stride, sizes[d], &stride)) {
      return out_of_range("dense strides overflow int64");
    }
  }
  return out;
}

StatusOr<int64_t> storage_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                                DType dtype) {
  int64_t last = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return int64_t{0};
    int64_t step = 0;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) || __builtin_add_overflow(last, step, &last)) {
      return out_of_range("storage size overflows int64");
    }
  }
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, int64_t{1}, &last) ||
      __builtin_mul_overflow(last, int64_t{dtype_size_bytes(dtype)}, &bytes)) {
    return out_of_range("storage size overflows int64");
  }
  return bytes;
}

}  // namespace kforge

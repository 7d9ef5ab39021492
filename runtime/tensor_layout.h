// Tensor layouts as ATen computes them: whether strides are non-overlapping and dense, the dense
// strides torch.empty_like gives a tensor that is not (Note [empty_like strides]), and the bytes
// at::empty_strided allocates. Output plans (kernel_spec.h) use them to allocate exactly what
// PyTorch's own kernel returns.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge {

bool is_non_overlapping_and_dense(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
StatusOr<std::vector<int64_t>> infer_dense_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
// Bytes from the first to one past the last element, as at::empty_strided allocates them.
StatusOr<int64_t> storage_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, DType dtype);

}  // namespace kforge

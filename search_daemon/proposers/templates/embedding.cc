// aten::embedding: out[i..., :] = weight[indices[i...], :]. weight a contiguous [V, D] table,
// indices a contiguous int64 or int32 tensor of any shape on the same device, the output
// contiguous [indices' sizes..., D]. The kernels are specialized to V and D.
//
// A row is copied as it is stored (raw elements, never through float), so NaN payloads and -0.0
// survive as they do in PyTorch's index_select. An index outside [0, V) is an error in PyTorch
// (an IndexError on CPU, a device-side assert on CUDA); a kernel can raise neither, and reading
// outside the table is never an option, so such a row comes out as NaN: wrong values a check can
// see, not a read of someone else's memory.
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaEmbedding = R"kf(
// Output vector i (KF_VEC elements, KF_D % KF_VEC == 0) is vector i % (KF_D / KF_VEC) of the row
// indices[i / (KF_D / KF_VEC)]. Each thread copies KF_ITEMS vectors, KF_BLOCK apart, as raw
// words of KF_VEC * sizeof(kf_t) bytes (kf_word).
typedef KF_INDEX_T kf_index;

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_embedding(const kf_t* __restrict__ w, const kf_index* __restrict__ idx, kf_t* __restrict__ y, kf_i64 nvec) {
  const kf_i64 per_row = KF_D / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= nvec) continue;
    const kf_i64 row = i / per_row;
    const kf_i64 col = i - row * per_row;
    const kf_i64 j = (kf_i64)idx[row];
    if (j >= 0 && j < KF_V) {
      reinterpret_cast<kf_word*>(y)[i] = reinterpret_cast<const kf_word*>(w + j * KF_D)[col];
    } else {
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) y[i * KF_VEC + k] = kf_from_float(__int_as_float(0x7fc00000));
    }
  }
}
)kf";

const char* const kCpuEmbedding = R"kf(
#include <string.h>
// KF_ROWS output rows per block, each a copy of the row of weight its index names (KF_D float32).
typedef KF_INDEX_T kf_index;
extern "C" void kf_embedding(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ w = KF_PTR(const float, 0);
  const kf_index* __restrict__ idx = KF_PTR(const kf_index, 1);
  float* __restrict__ y = KF_PTR(float, 2);
  const int64_t rows = KF_I64(3);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = (int64_t)idx[r];
    float* __restrict__ out = y + r * KF_D;
    if (j >= 0 && j < KF_V) {
      memcpy(out, w + j * KF_D, sizeof(float) * KF_D);
    } else {
      for (int64_t k = 0; k < KF_D; ++k) out[k] = NAN;
    }
  }
}
)kf";

struct EmbeddingArgs {
  const TensorMeta* weight = nullptr;
  const TensorMeta* indices = nullptr;
  int64_t rows = 0;   // indices' element count
};

std::optional<EmbeddingArgs> embedding_args(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::embedding" || !sig.overload.empty() || sig.args.size() != 5) return std::nullopt;
  EmbeddingArgs a;
  a.weight = tensor_arg(sig, 0);
  a.indices = tensor_arg(sig, 1);
  if (!template_tensor(a.weight, backend) || a.weight->sizes.size() != 2 || a.indices == nullptr) return std::nullopt;
  const TensorMeta& ix = *a.indices;
  // Any shape (0-dimensional included), at least one index, contiguous, on the table's device.
  if ((ix.dtype != DType::kInt64 && ix.dtype != DType::kInt32) || ix.device != a.weight->device ||
      !ix.is_contiguous() || ix.numel() <= 0) {
    return std::nullopt;
  }
  a.rows = ix.numel();
  return a;
}

std::vector<std::string> embedding_defines(const EmbeddingArgs& a) {
  return {define("KF_V", a.weight->sizes[0]), define("KF_D", a.weight->sizes[1]),
          std::string("-DKF_INDEX_T=") + (a.indices->dtype == DType::kInt64 ? "long long" : "int")};
}

// [indices' sizes..., D], contiguous.
OutputSpec embedding_output(const EmbeddingArgs& a) {
  const size_t rank = a.indices->sizes.size();
  std::vector<std::string> sizes, strides(rank + 1);
  for (size_t d = 0; d < rank; ++d) sizes.push_back(size_name(1, d));
  sizes.push_back(size_name(0, 1));
  std::string step = "1";
  for (size_t d = rank + 1; d-- > 0;) {
    strides[d] = step;
    step = step == "1" ? sizes[d] : step + " * " + sizes[d];
  }
  return OutputSpec::explicit_layout(a.weight->dtype, std::move(sizes), std::move(strides));
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum EmbeddingCudaKnob : size_t { kBlock, kVec, kItems };

class EmbeddingCuda final : public FamilyBase {
 public:
  EmbeddingCuda()
      : FamilyBase("embedding", Backend::kCuda,
                   flat_cuda_knobs()) {}

  bool applies(const OpSignature& sig) const override { return embedding_args(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const EmbeddingArgs a = *embedding_args(sig, Backend::kCuda);
    const int64_t d = a.weight->sizes[1];
    const int64_t bytes = v[kVec] * dtype_size_bytes(a.weight->dtype);
    // A vector is one aligned word of the table and of the output (a fresh allocation): D a
    // multiple of it and the table's pointer aligned to it.
    if (d % v[kVec] != 0 || bytes > 16 || static_cast<int64_t>(a.weight->alignment) % bytes != 0) return false;
    return flat_cuda_fits(a.rows * d, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const EmbeddingArgs a = *embedding_args(sig, Backend::kCuda);
    return flat_cuda_prior(dtype_size_bytes(a.weight->dtype), a.rows * a.weight->sizes[1], v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const EmbeddingArgs a = *embedding_args(sig, Backend::kCuda);
    std::vector<std::string> options = {dtype_define(a.weight->dtype)};
    for (std::string& d : embedding_defines(a)) options.push_back(std::move(d));
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems]),
                          define("KF_WORD_BYTES", v[kVec] * dtype_size_bytes(a.weight->dtype))}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaRawWord + kCudaEmbedding, "kf_embedding", options);
    s.plan.outputs = {embedding_output(a)};
    const std::string nvec = "numel1 * " + size_name(0, 1) + " / " + std::to_string(v[kVec]);
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + nvec + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = {ArgBinding::input(0), ArgBinding::input(1), ArgBinding::output(0), ArgBinding::size(nvec)};
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

class EmbeddingCpu final : public FamilyBase {
 public:
  EmbeddingCpu() : FamilyBase("cpu.embedding", Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256, 1024}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return embedding_args(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return v[0] <= std::max<int64_t>(1, pow2_ceil(embedding_args(sig, Backend::kCpu)->rows));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const EmbeddingArgs a = *embedding_args(sig, Backend::kCpu);
    // About 16K elements per block.
    const double ideal = std::clamp(16384.0 / static_cast<double>(a.weight->sizes[1]), 1.0, 1024.0);
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const EmbeddingArgs a = *embedding_args(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string& d : embedding_defines(a)) options.push_back(std::move(d));
    options.push_back(define("KF_ROWS", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuEmbedding, "kf_embedding", options);
    s.plan.outputs = {embedding_output(a)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel1, " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::input(1), ArgBinding::output(0), ArgBinding::size("numel1")};
    return s;
  }
};

}  // namespace

// "embedding" (CUDA) and "cpu.embedding".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<EmbeddingCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<EmbeddingCpu>(); },
};

}  // namespace kforge::search::templates

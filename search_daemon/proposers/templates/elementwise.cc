// The pointwise operators: aten::gelu (approximate 'none' or 'tanh'), aten::silu, aten::add.Tensor
// (two contiguous inputs of the same sizes and dtype, alpha a scalar) and aten::relu. Each element
// is computed in float with PyTorch's own formula and constants, so the result rounds as
// PyTorch's does (relu rounds nothing: x < 0 ? 0 : x keeps NaN and -0.0, as clamp_min does).
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

enum class Pointwise : uint8_t { kGelu, kSilu, kAdd, kRelu };

const char* const kCudaPointwise = R"kf(
// KF_OP: 0 gelu (KF_GELU_TANH 0: erf form, 1: tanh form), 1 silu, 2 add (a + alpha * b), 3 relu.
// Each thread handles KF_ITEMS vectors of KF_VEC elements, KF_BLOCK apart (coalesced); the
// n % KF_VEC elements after the last whole vector go to the first threads of block 0.
#if KF_OP == 0
__device__ __forceinline__ float kf_op(float x) {
#if KF_GELU_TANH
  const float kBeta = 0.7978845608028654f;   // sqrt(2) * (2 / sqrt(pi)) * 0.5
  const float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.0f + tanhf(inner));
#else
  return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
#endif
}
#elif KF_OP == 1
__device__ __forceinline__ float kf_op(float x) { return x / (1.0f + expf(-x)); }
#elif KF_OP == 3
__device__ __forceinline__ float kf_op(float x) { return x < 0.0f ? 0.0f : x; }
#endif

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_pointwise(const kf_t* __restrict__ a,
#if KF_OP == 2
             const kf_t* __restrict__ b, float alpha,
#endif
             kf_t* __restrict__ y, kf_i64 n) {
  const kf_i64 nvec = n / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
  float va[KF_ITEMS][KF_VEC];
#if KF_OP == 2
  float vb[KF_ITEMS][KF_VEC];
#endif
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      kf_load<KF_VEC>(a, i, va[it]);
#if KF_OP == 2
      kf_load<KF_VEC>(b, i, vb[it]);
#endif
    }
  }
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      float o[KF_VEC];
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
#if KF_OP == 2
        o[k] = va[it][k] + alpha * vb[it][k];
#else
        o[k] = kf_op(va[it][k]);
#endif
      }
      kf_store<KF_VEC>(y, i, o);
    }
  }
#if KF_VEC > 1
  if (blockIdx.x == 0 && (kf_i64)threadIdx.x < n - nvec * KF_VEC) {
    const kf_i64 j = nvec * KF_VEC + threadIdx.x;
#if KF_OP == 2
    y[j] = kf_from_float(kf_to_float(a[j]) + alpha * kf_to_float(b[j]));
#else
    y[j] = kf_from_float(kf_op(kf_to_float(a[j])));
#endif
  }
#endif
}
)kf";

const char* const kCpuPointwise = R"kf(
// KF_OP as in the CUDA template; KF_CHUNK elements per block.
#if KF_OP == 0
static inline float kf_op(float x) {
#if KF_GELU_TANH
  const float kBeta = 0.7978845608028654f;
  const float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.0f + tanhf(inner));
#else
  return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
#endif
}
#elif KF_OP == 1
static inline float kf_op(float x) { return x / (1.0f + expf(-x)); }
#elif KF_OP == 3
static inline float kf_op(float x) { return x < 0.0f ? 0.0f : x; }
#endif

extern "C" void kf_pointwise(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ a = KF_PTR(const float, 0);
#if KF_OP == 2
  const float* __restrict__ b = KF_PTR(const float, 1);
  const float alpha = KF_F32(2);
  float* __restrict__ y = KF_PTR(float, 3);
  const int64_t n = KF_I64(4);
#else
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t n = KF_I64(2);
#endif
  const int64_t i0 = (int64_t)blk->block_idx[0] * KF_CHUNK;
  const int64_t i1 = i0 + KF_CHUNK < n ? i0 + KF_CHUNK : n;
  for (int64_t i = i0; i < i1; ++i) {
#if KF_OP == 2
    y[i] = a[i] + alpha * b[i];
#else
    y[i] = kf_op(a[i]);
#endif
  }
}
)kf";

// -DKF_OP and -DKF_GELU_TANH for the signature, or nothing when the templates do not handle it.
std::optional<std::vector<std::string>> pointwise_defines(const OpSignature& sig, Pointwise op, Backend backend) {
  const TensorMeta* a = tensor_arg(sig, 0);
  if (!template_tensor(a, backend)) return std::nullopt;
  switch (op) {
    case Pointwise::kGelu: {
      if (sig.op != "aten::gelu" || !sig.overload.empty() || sig.args.empty() || sig.args.size() > 2) {
        return std::nullopt;
      }
      bool tanh = false;
      if (sig.args.size() == 2) {
        const auto* mode = std::get_if<std::string>(&sig.args[1].value);
        if (mode == nullptr || (*mode != "none" && *mode != "tanh")) return std::nullopt;
        tanh = *mode == "tanh";
      }
      return std::vector<std::string>{define("KF_OP", 0), define("KF_GELU_TANH", tanh ? 1 : 0)};
    }
    case Pointwise::kSilu:
      if (sig.op != "aten::silu" || !sig.overload.empty() || sig.args.size() != 1) return std::nullopt;
      return std::vector<std::string>{define("KF_OP", 1)};
    case Pointwise::kRelu:
      if (sig.op != "aten::relu" || !sig.overload.empty() || sig.args.size() != 1) return std::nullopt;
      return std::vector<std::string>{define("KF_OP", 3)};
    case Pointwise::kAdd: {
      if (sig.op != "aten::add" || sig.overload != "Tensor" || sig.args.size() != 3) return std::nullopt;
      const TensorMeta* b = tensor_arg(sig, 1);
      const bool alpha = std::holds_alternative<int64_t>(sig.args[2].value) ||
                         std::holds_alternative<double>(sig.args[2].value);
      if (!template_tensor(b, backend) || b->dtype != a->dtype || b->sizes != a->sizes || !alpha) return std::nullopt;
      return std::vector<std::string>{define("KF_OP", 2)};
    }
  }
  return std::nullopt;
}

std::string_view pointwise_family(Pointwise op, Backend backend) {
  const bool cpu = backend == Backend::kCpu;
  switch (op) {
    case Pointwise::kGelu: return cpu ? "cpu.gelu" : "gelu";
    case Pointwise::kSilu: return cpu ? "cpu.silu" : "silu";
    case Pointwise::kAdd: return cpu ? "cpu.add" : "add";
    case Pointwise::kRelu: return cpu ? "cpu.relu" : "relu";
  }
  return "";
}

std::vector<ArgBinding> pointwise_bindings(Pointwise op) {
  if (op == Pointwise::kAdd) {
    return {ArgBinding::input(0), ArgBinding::input(1), ArgBinding::scalar(2, ValueType::kFloat32),
            ArgBinding::output(0), ArgBinding::size("numel0")};
  }
  return {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("numel0")};
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum PointwiseCudaKnob : size_t { kBlock, kVec, kItems };

class PointwiseCuda final : public FamilyBase {
 public:
  explicit PointwiseCuda(Pointwise op)
      : FamilyBase(std::string(pointwise_family(op, Backend::kCuda)), Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512, 1024}, {}}, Knob{"vec", {1, 2, 4, 8}, {}},
                    Knob{"items", {1, 2, 4, 8}, {}}}),
        op_(op) {}

  bool applies(const OpSignature& sig) const override {
    return pointwise_defines(sig, op_, Backend::kCuda).has_value();
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t numel = tensor_arg(sig, 0)->numel();
    // No block whose work would be mostly missing; the smallest configuration always fits.
    return vector_fits(sig, v[kVec]) && v[kBlock] * v[kVec] * v[kItems] <= std::max<int64_t>(64, 2 * numel);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t numel = x.numel();
    // Measured on an H200: two vectors per thread were as fast as any on large tensors; more
    // cost registers and occupancy (eight: up to 2x slower).
    const double ideal_items = numel >= (int64_t{1} << 18) ? 2 : 1;
    return closeness(static_cast<double>(v[kVec] * dtype_size_bytes(x.dtype)), 16, 0.5) *
           closeness(static_cast<double>(v[kBlock]), 256, 0.3) *
           closeness(static_cast<double>(v[kItems]), ideal_items, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = {dtype_define(x.dtype)};
    const std::vector<std::string> op_defines = pointwise_defines(sig, op_, Backend::kCuda).value_or(std::vector<std::string>());
    options.insert(options.end(), op_defines.begin(), op_defines.end());
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems])}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaPointwise, "kf_pointwise", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[kBlock] * v[kVec] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = pointwise_bindings(op_);
    return s;
  }

 private:
  Pointwise op_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class PointwiseCpu final : public FamilyBase {
 public:
  explicit PointwiseCpu(Pointwise op)
      : FamilyBase(std::string(pointwise_family(op, Backend::kCpu)), Backend::kCpu,
                   {Knob{"chunk", {1024, 4096, 16384, 65536, 262144}, {}}}),
        op_(op) {}

  bool applies(const OpSignature& sig) const override { return pointwise_defines(sig, op_, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return v[0] <= std::max<int64_t>(1024, pow2_ceil(tensor_arg(sig, 0)->numel()));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const double numel = static_cast<double>(tensor_arg(sig, 0)->numel());
    return closeness(static_cast<double>(v[0]), std::clamp(numel / 16, 1024.0, 65536.0), 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    std::vector<std::string> options = cpu_base_options(sig);
    const std::vector<std::string> op_defines = pointwise_defines(sig, op_, Backend::kCpu).value_or(std::vector<std::string>());
    options.insert(options.end(), op_defines.begin(), op_defines.end());
    options.push_back(define("KF_CHUNK", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuPointwise, "kf_pointwise", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[0]) + ")";
    l.args = pointwise_bindings(op_);
    return s;
  }

 private:
  Pointwise op_;
};

}  // namespace

// aten::gelu, aten::silu, aten::add.Tensor, aten::relu ("gelu", "silu", "add", "relu" and their
// "cpu." twins).
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCuda>(Pointwise::kGelu); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCuda>(Pointwise::kSilu); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCuda>(Pointwise::kAdd); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCuda>(Pointwise::kRelu); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCpu>(Pointwise::kGelu); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCpu>(Pointwise::kSilu); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCpu>(Pointwise::kAdd); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PointwiseCpu>(Pointwise::kRelu); },
};

}  // namespace kforge::search::templates

// aten::native_batch_norm, and on CUDA aten::cudnn_batch_norm (what F.batch_norm reaches there for
// float32, and float16 with float32 parameters), in inference (training false): out[n, c, ...] = (x - running_mean[c]) /
// sqrt(running_var[c] + eps) * weight[c] + bias[c] over a contiguous [N, C, *] input, weight and
// bias optional. save_mean and save_invstd are what PyTorch returns in inference: empty ([0]) on
// CPU; on CUDA [C] float32 tensors PyTorch leaves uninitialized (catalog::output_values_unspecified:
// only their layout is compared), which these kernels fill with running_mean and the invstd they
// use, so that every element is written. cudnn_batch_norm's save_mean, save_var and reserve space
// are empty in inference (float32, float32, uint8). The kernels are specialized to C and the plane size (the
// product of the dimensions after C).
//
// Each backend computes as PyTorch's kernel there does, in float: the CPU kernel folds the
// statistics into alpha = weight / sqrt(var + eps) and beta = bias - mean * alpha per channel and
// writes x * alpha + beta (batch_norm_cpu_transform_input_template); the CUDA kernel writes
// ((x - mean) * invstd) * weight + bias (batch_norm_elementwise), whose error does not grow with
// |mean| / std the way the folded form's does, so the criterion (2x PyTorch's error) is met by
// each against its own backend's PyTorch.
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaBatchNorm = R"kf(
// KF_C channels of KF_PLANE elements each (x contiguous [N, KF_C, KF_PLANE]); parameters of type
// kf_p (KF_PARAM_SAME 0: float, 1: the input's type). Each thread handles KF_ITEMS vectors of
// KF_VEC elements, KF_BLOCK apart; KF_VEC divides n, so there is no tail.
#if KF_PARAM_SAME
typedef kf_t kf_p;
__device__ __forceinline__ float kf_param(kf_p v) { return kf_to_float(v); }
#else
typedef float kf_p;
__device__ __forceinline__ float kf_param(float v) { return v; }
#endif

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_batch_norm(const kf_t* __restrict__ x,
#if KF_HAS_WEIGHT
              const kf_p* __restrict__ w,
#endif
#if KF_HAS_BIAS
              const kf_p* __restrict__ b,
#endif
              const kf_p* __restrict__ mean, const kf_p* __restrict__ var, float eps, kf_t* __restrict__ y,
#if KF_SAVE
              float* __restrict__ save_mean, float* __restrict__ save_invstd,
#endif
              kf_i64 n) {
  const kf_i64 nvec = n / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#if KF_SAVE
  for (kf_i64 c = (kf_i64)blockIdx.x * KF_BLOCK + threadIdx.x; c < KF_C; c += (kf_i64)gridDim.x * KF_BLOCK) {
    save_mean[c] = kf_param(mean[c]);
    save_invstd[c] = 1.0f / sqrtf(kf_param(var[c]) + eps);
  }
#endif
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= nvec) continue;
    float v[KF_VEC];
    kf_load<KF_VEC>(x, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
#if KF_CL
      const int c = (int)((i * KF_VEC + k) % KF_C);   // channels-last: the channel is innermost
#else
      const int c = (int)(((i * KF_VEC + k) / KF_PLANE) % KF_C);
#endif
      const float invstd = 1.0f / sqrtf(kf_param(var[c]) + eps);
      float o = (v[k] - kf_param(mean[c])) * invstd;
#if KF_HAS_WEIGHT
      o = o * kf_param(w[c]);
#endif
#if KF_HAS_BIAS
      o = o + kf_param(b[c]);
#endif
      v[k] = o;
    }
    kf_store<KF_VEC>(y, i, v);
  }
}
)kf";

const char* const kCpuBatchNorm = R"kf(
// KF_PLANES planes (one channel of one sample: KF_PLANE contiguous elements) per block; x
// contiguous [N, KF_C, KF_PLANE] (or channels-last, KF_CL), float32, parameters float32.
extern "C" void kf_batch_norm(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  int slot = 1;
#if KF_HAS_WEIGHT
  const float* __restrict__ w = KF_PTR(const float, slot++);
#endif
#if KF_HAS_BIAS
  const float* __restrict__ b = KF_PTR(const float, slot++);
#endif
  const float* __restrict__ mean = KF_PTR(const float, slot++);
  const float* __restrict__ var = KF_PTR(const float, slot++);
  const float eps = KF_F32(slot++);
  float* __restrict__ y = KF_PTR(float, slot++);
#if KF_CL
  // Channels-last: KF_PLANES pixels (KF_C contiguous elements each) per block, the channels'
  // scale and shift computed once per block.
  const int64_t pixels = KF_I64(slot) / KF_C;
  const int64_t q0 = (int64_t)blk->block_idx[0] * KF_PLANES;
  const int64_t q1 = q0 + KF_PLANES < pixels ? q0 + KF_PLANES : pixels;
  float alpha[KF_C], beta[KF_C];
  for (int64_t c = 0; c < KF_C; ++c) {
    const float invstd = 1.0f / sqrtf(var[c] + eps);
#if KF_HAS_WEIGHT
    alpha[c] = invstd * w[c];
#else
    alpha[c] = invstd;
#endif
#if KF_HAS_BIAS
    beta[c] = b[c] - mean[c] * alpha[c];
#else
    beta[c] = -mean[c] * alpha[c];
#endif
  }
  for (int64_t q = q0; q < q1; ++q) {
    const float* __restrict__ xp = x + q * KF_C;
    float* __restrict__ yp = y + q * KF_C;
    for (int64_t c = 0; c < KF_C; ++c) yp[c] = xp[c] * alpha[c] + beta[c];
  }
#else
  const int64_t planes = KF_I64(slot) / KF_PLANE;
  const int64_t p0 = (int64_t)blk->block_idx[0] * KF_PLANES;
  const int64_t p1 = p0 + KF_PLANES < planes ? p0 + KF_PLANES : planes;
  for (int64_t pl = p0; pl < p1; ++pl) {
    const int64_t c = pl % KF_C;
    const float invstd = 1.0f / sqrtf(var[c] + eps);
#if KF_HAS_WEIGHT
    const float alpha = invstd * w[c];
#else
    const float alpha = invstd;
#endif
#if KF_HAS_BIAS
    const float beta = b[c] - mean[c] * alpha;
#else
    const float beta = -mean[c] * alpha;
#endif
    const float* __restrict__ xp = x + pl * KF_PLANE;
    float* __restrict__ yp = y + pl * KF_PLANE;
    for (int64_t i = 0; i < KF_PLANE; ++i) yp[i] = xp[i] * alpha + beta;
  }
#endif
}
)kf";

// The arguments: input, weight?, bias?, running_mean, running_var, training, momentum, eps.
struct BatchNormArgs {
  const TensorMeta* x = nullptr;
  const TensorMeta* weight = nullptr;
  const TensorMeta* bias = nullptr;
  const TensorMeta* mean = nullptr;
  const TensorMeta* var = nullptr;
  int64_t channels = 0;
  int64_t plane = 0;   // elements per (sample, channel)
  bool channels_last = false;   // 4 dimensions, channels-last strides (the output too: like(0))
  bool param_same = false;   // parameters in the input's dtype (else float32)
  bool cudnn = false;        // aten::cudnn_batch_norm (else native_batch_norm)
};

// `op`: "aten::native_batch_norm" or "aten::cudnn_batch_norm" (CUDA only), the family's.
std::optional<BatchNormArgs> batch_norm_args(const OpSignature& sig, Backend backend, std::string_view op) {
  if (sig.op != op || !sig.overload.empty() || sig.args.size() != 8) return std::nullopt;
  BatchNormArgs a;
  a.cudnn = op == "aten::cudnn_batch_norm";
  a.x = tensor_arg(sig, 0);
  const std::optional<bool> cl = contiguous_or_channels_last(a.x, backend);
  if (!cl || a.x->sizes.size() < 2) return std::nullopt;
  a.channels_last = *cl;
  // The CPU kernel keeps two floats per channel on its stack.
  if (a.channels_last && backend == Backend::kCpu && a.x->sizes[1] > kMaxCpuChannelsOnStack) return std::nullopt;
  // cuDNN takes float32 and float16 input (bfloat16 fails there), float32 parameters, a weight
  // and a bias (PyTorch's cudnn_batch_norm fails on a None bias, seen on an H100: F.batch_norm
  // without affine parameters goes to native_batch_norm instead).
  if (a.cudnn && (backend != Backend::kCuda || a.x->dtype == DType::kBFloat16 || tensor_arg(sig, 1) == nullptr ||
                  tensor_arg(sig, 2) == nullptr)) {
    return std::nullopt;
  }
  const auto* training = std::get_if<bool>(&sig.args[5].value);
  if (training == nullptr || *training) return std::nullopt;   // inference only
  if (!std::holds_alternative<double>(sig.args[7].value)) return std::nullopt;
  a.channels = a.x->sizes[1];
  a.plane = a.x->numel() / (a.x->sizes[0] * a.channels);
  a.weight = tensor_arg(sig, 1);
  a.bias = tensor_arg(sig, 2);
  a.mean = tensor_arg(sig, 3);
  a.var = tensor_arg(sig, 4);
  if ((a.weight == nullptr && !is_none(sig, 1)) || (a.bias == nullptr && !is_none(sig, 2))) return std::nullopt;
  if (a.mean == nullptr || a.var == nullptr) return std::nullopt;   // inference reads the running statistics
  // Every parameter: [C], contiguous, on the input's device, all of one dtype: float32, or the input's.
  const DType pd = a.mean->dtype;
  if (pd != DType::kFloat32 && (pd != a.x->dtype || a.cudnn)) return std::nullopt;
  for (const TensorMeta* t : {a.weight, a.bias, a.mean, a.var}) {
    if (t == nullptr) continue;
    if (t->sizes != std::vector<int64_t>{a.channels} || !t->is_contiguous() || t->device != a.x->device ||
        t->dtype != pd) {
      return std::nullopt;
    }
  }
  a.param_same = pd == a.x->dtype && pd != DType::kFloat32;
  return a;
}

std::vector<std::string> batch_norm_defines(const BatchNormArgs& a) {
  return {define("KF_C", a.channels), define("KF_PLANE", a.plane), define("KF_HAS_WEIGHT", a.weight ? 1 : 0),
          define("KF_HAS_BIAS", a.bias ? 1 : 0), define("KF_PARAM_SAME", a.param_same ? 1 : 0),
          define("KF_CL", a.channels_last ? 1 : 0)};
}

// What the CPU kernel's blocks count: planes of one channel, or channels-last pixels of every channel.
int64_t cpu_unit(const BatchNormArgs& a) { return a.channels_last ? a.channels : a.plane; }

// Whether the kernel writes save_mean and save_invstd: native_batch_norm on CUDA.
bool writes_saved(const BatchNormArgs& a, Backend backend) { return backend == Backend::kCuda && !a.cudnn; }

std::vector<ArgBinding> batch_norm_bindings(const BatchNormArgs& a, Backend backend) {
  std::vector<ArgBinding> b = {ArgBinding::input(0)};
  if (a.weight) b.push_back(ArgBinding::input(1));
  if (a.bias) b.push_back(ArgBinding::input(2));
  b.push_back(ArgBinding::input(3));
  b.push_back(ArgBinding::input(4));
  b.push_back(ArgBinding::scalar(7, ValueType::kFloat32));
  b.push_back(ArgBinding::output(0));
  if (writes_saved(a, backend)) {
    b.push_back(ArgBinding::output(1));
    b.push_back(ArgBinding::output(2));
  }
  b.push_back(ArgBinding::size("numel0"));
  return b;
}

// out like the input; save_mean and save_invstd as PyTorch makes them in inference: on CPU empty,
// of the running statistics' dtype; on CUDA [C] float32. cudnn_batch_norm: three empty outputs.
std::vector<OutputSpec> batch_norm_outputs(const BatchNormArgs& a, Backend backend) {
  if (a.cudnn) {
    const OutputSpec empty = OutputSpec::explicit_layout(DType::kFloat32, {"0"}, {"1"});
    return {OutputSpec::like(0), empty, empty, OutputSpec::explicit_layout(DType::kUInt8, {"0"}, {"1"})};
  }
  const OutputSpec saved = backend == Backend::kCuda ? OutputSpec::explicit_layout(DType::kFloat32, {size_name(0, 1)}, {"1"})
                                                     : OutputSpec::explicit_layout(a.mean->dtype, {"0"}, {"1"});
  return {OutputSpec::like(0), saved, saved};
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum BatchNormCudaKnob : size_t { kBlock, kVec, kItems };

// "batch_norm" serves aten::native_batch_norm, "cudnn_batch_norm" aten::cudnn_batch_norm.
class BatchNormCuda final : public FamilyBase {
 public:
  BatchNormCuda(std::string family, std::string_view op)
      : FamilyBase(std::move(family), Backend::kCuda,
                   flat_cuda_knobs()),
        op_(op) {}

  bool applies(const OpSignature& sig) const override { return batch_norm_args(sig, Backend::kCuda, op_).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t numel = tensor_arg(sig, 0)->numel();
    return numel % v[kVec] == 0 && vector_fits(sig, v[kVec]) &&
           flat_cuda_fits(numel, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    return flat_cuda_prior(dtype_size_bytes(x.dtype), x.numel(), v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const BatchNormArgs a = *batch_norm_args(sig, Backend::kCuda, op_);
    std::vector<std::string> options = {dtype_define(a.x->dtype)};
    for (std::string& d : batch_norm_defines(a)) options.push_back(std::move(d));
    options.push_back(define("KF_SAVE", writes_saved(a, Backend::kCuda) ? 1 : 0));
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems])}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaBatchNorm, "kf_batch_norm", options);
    s.plan.outputs = batch_norm_outputs(a, Backend::kCuda);
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[kBlock] * v[kVec] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = batch_norm_bindings(a, Backend::kCuda);
    return s;
  }

 private:
  std::string_view op_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class BatchNormCpu final : public FamilyBase {
 public:
  BatchNormCpu() : FamilyBase("cpu.batch_norm", Backend::kCpu, {Knob{"planes", {1, 4, 16, 64, 256, 1024}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    return batch_norm_args(sig, Backend::kCpu, "aten::native_batch_norm").has_value();
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const BatchNormArgs a = *batch_norm_args(sig, Backend::kCpu, "aten::native_batch_norm");
    return v[0] <= std::max<int64_t>(1, pow2_ceil(a.x->numel() / cpu_unit(a)));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const BatchNormArgs a = *batch_norm_args(sig, Backend::kCpu, "aten::native_batch_norm");
    // About 16K elements per block.
    const double ideal = std::clamp(16384.0 / static_cast<double>(cpu_unit(a)), 1.0, 1024.0);
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const BatchNormArgs a = *batch_norm_args(sig, Backend::kCpu, "aten::native_batch_norm");
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string& d : batch_norm_defines(a)) options.push_back(std::move(d));
    options.push_back(define("KF_PLANES", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuBatchNorm, "kf_batch_norm", options);
    s.plan.outputs = batch_norm_outputs(a, Backend::kCpu);
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0 / " + std::to_string(cpu_unit(a)) + ", " + std::to_string(v[0]) + ")";
    l.args = batch_norm_bindings(a, Backend::kCpu);
    return s;
  }
};

}  // namespace

// "batch_norm" (CUDA) and "cpu.batch_norm": aten::native_batch_norm in inference;
// "cudnn_batch_norm" (CUDA): aten::cudnn_batch_norm in inference.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<BatchNormCuda>("batch_norm", "aten::native_batch_norm"); },
    []() -> std::unique_ptr<KernelTemplate> {
      return std::make_unique<BatchNormCuda>("cudnn_batch_norm", "aten::cudnn_batch_norm");
    },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<BatchNormCpu>(); },
};

}  // namespace kforge::search::templates

// aten::_to_copy as a dtype conversion on the same device: what Tensor.to(dtype), .float() and
// .half() call (a Llama-style RMSNorm in bfloat16 casts to float32 and back around every norm).
// Families "to_copy" (CUDA: float32, float16, bfloat16 in and out) and "cpu.to_copy" (CPU:
// float32, float64, bfloat16 in and out), for a contiguous self with layout, device and pin_memory
// None and memory_format None, preserve or contiguous (all the same for a contiguous self): the
// output is contiguous in the new dtype. Elements convert as PyTorch's copy kernels convert them:
// through float32, rounding to nearest even into a narrower type (NaN stays NaN; its payload is
// not part of the comparison), widening exactly; float64 to bfloat16 goes through float32, as
// c10::BFloat16's constructor from double does.
#include <algorithm>
#include <optional>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

// KF_IN and KF_OUT: 0 float32, 1 float16, 2 bfloat16. KF_VEC elements per access of both sides
// (the caller checks the alignment), KF_ITEMS vectors per thread, KF_BLOCK apart; the elements
// after the last whole vector go to the first threads of block 0.
const char* const kCudaConvert = R"kf(// kforge kernel template (NVRTC: no headers; knobs arrive as -D options).
typedef long long kf_i64;
#if KF_IN == 0
typedef float kf_in;
__device__ __forceinline__ float kf_in_float(float v) { return v; }
#else
typedef unsigned short kf_in;
__device__ __forceinline__ float kf_in_float(unsigned short h) {
#if KF_IN == 1
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return __uint_as_float(((unsigned)h) << 16);
#endif
}
#endif
#if KF_OUT == 0
typedef float kf_out;
__device__ __forceinline__ float kf_out_of(float f) { return f; }
#else
typedef unsigned short kf_out;
__device__ __forceinline__ unsigned short kf_out_of(float f) {
  unsigned short h;
#if KF_OUT == 1
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#elif __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  h = (unsigned short)(u >> 16);
#endif
  return h;
}
#endif
template <typename T, int N>
struct alignas(sizeof(T) * N) kf_vec {
  T v[N];
};

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_convert(const kf_in* __restrict__ x, kf_out* __restrict__ y, kf_i64 n) {
  const kf_i64 nvec = n / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
  kf_vec<kf_in, KF_VEC> r[KF_ITEMS];
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) r[it] = reinterpret_cast<const kf_vec<kf_in, KF_VEC>*>(x)[i];
  }
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      kf_vec<kf_out, KF_VEC> w;
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) w.v[k] = kf_out_of(kf_in_float(r[it].v[k]));
      reinterpret_cast<kf_vec<kf_out, KF_VEC>*>(y)[i] = w;
    }
  }
#if KF_VEC > 1
  if (blockIdx.x == 0 && (kf_i64)threadIdx.x < n - nvec * KF_VEC) {
    const kf_i64 j = nvec * KF_VEC + threadIdx.x;
    y[j] = kf_out_of(kf_in_float(x[j]));
  }
#endif
}
)kf";

// KF_IN and KF_OUT: 0 float32, 2 bfloat16, 3 float64; KF_CHUNK elements per block.
const char* const kCpuConvert = R"kf(
#include <string.h>
#if KF_IN == 0
typedef float kf_in;
static inline double kf_in_value(float v) { return v; }
#elif KF_IN == 2
typedef uint16_t kf_in;
static inline double kf_in_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
#else
typedef double kf_in;
static inline double kf_in_value(double v) { return v; }
#endif
#if KF_OUT == 0
typedef float kf_out;
static inline float kf_out_of(double v) { return (float)v; }
#elif KF_OUT == 2
typedef uint16_t kf_out;
// c10::BFloat16 from float: round to nearest even; a double goes through float first.
static inline uint16_t kf_out_of(double v) {
  const float f = (float)v;
  if (f != f) return 0x7fc0;
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
#else
typedef double kf_out;
static inline double kf_out_of(double v) { return v; }
#endif

extern "C" void kf_convert(const kforge_cpu_block* blk, void* const* p) {
  const kf_in* __restrict__ x = KF_PTR(const kf_in, 0);
  kf_out* __restrict__ y = KF_PTR(kf_out, 1);
  const int64_t n = KF_I64(2);
  const int64_t i0 = (int64_t)blk->block_idx[0] * KF_CHUNK;
  const int64_t i1 = i0 + KF_CHUNK < n ? i0 + KF_CHUNK : n;
  for (int64_t i = i0; i < i1; ++i) y[i] = kf_out_of(kf_in_value(x[i]));
}
)kf";

// The dtype code of the kernels above, or -1.
int convert_code(DType t, Backend b) {
  if (t == DType::kFloat32) return 0;
  if (t == DType::kBFloat16) return 2;
  if (b == Backend::kCuda && t == DType::kFloat16) return 1;
  if (b == Backend::kCpu && t == DType::kFloat64) return 3;
  return -1;
}

// The output dtype of a _to_copy the families serve, or nullopt.
std::optional<DType> converted_dtype(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::_to_copy" || !sig.overload.empty() || sig.args.size() != 7) return std::nullopt;
  const TensorMeta* x = tensor_arg(sig, 0);
  const DeviceType dev = backend == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu;
  if (x == nullptr || x->device != dev || x->sizes.empty() || x->numel() <= 0 || !x->is_contiguous()) {
    return std::nullopt;
  }
  if (convert_code(x->dtype, backend) < 0) return std::nullopt;
  // layout, device and pin_memory None; memory_format None, contiguous (0) or preserve (1).
  if (!is_none(sig, 2) || !is_none(sig, 3) || !is_none(sig, 4)) return std::nullopt;
  if (!std::holds_alternative<bool>(sig.args[5].value)) return std::nullopt;
  if (!is_none(sig, 6)) {
    const int64_t* mf = int_arg(sig, 6);
    if (mf == nullptr || (*mf != 0 && *mf != 1)) return std::nullopt;
  }
  DType out = x->dtype;
  if (!is_none(sig, 1)) {
    const int64_t* code = int_arg(sig, 1);
    if (code == nullptr) return std::nullopt;
    const std::optional<DType> t = catalog::dtype_of_scalar_type(*code);
    if (!t) return std::nullopt;
    out = *t;
  }
  if (convert_code(out, backend) < 0) return std::nullopt;
  return out;
}

class ToCopyCuda final : public FamilyBase {
 public:
  ToCopyCuda() : FamilyBase("to_copy", Backend::kCuda, flat_cuda_knobs()) {}

  bool applies(const OpSignature& sig) const override { return converted_dtype(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DType out = *converted_dtype(sig, Backend::kCuda);
    // Both sides in accesses of at most 16 bytes; the output comes from torch's allocator (aligned).
    const int64_t widest = std::max(dtype_size_bytes(x.dtype), dtype_size_bytes(out));
    return vector_fits(sig, v[1]) && v[1] * widest <= 16 && flat_cuda_fits(x.numel(), v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    return flat_cuda_prior(dtype_size_bytes(x.dtype), x.numel(), v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DType out = *converted_dtype(sig, Backend::kCuda);
    std::vector<std::string> options = {define("KF_IN", convert_code(x.dtype, Backend::kCuda)),
                                        define("KF_OUT", convert_code(out, Backend::kCuda)),
                                        define("KF_BLOCK", v[0]), define("KF_VEC", v[1]), define("KF_ITEMS", v[2])};
    KernelSpec s = one_launch_spec(Backend::kCuda, kCudaConvert, "kf_convert", options);
    s.plan.outputs = {OutputSpec::like(0, out)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[0] * v[1] * v[2]) + ")";
    l.block[0] = std::to_string(v[0]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("numel0")};
    return s;
  }
};

class ToCopyCpu final : public FamilyBase {
 public:
  ToCopyCpu() : FamilyBase("cpu.to_copy", Backend::kCpu, flat_cpu_knobs()) {}

  bool applies(const OpSignature& sig) const override { return converted_dtype(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_fits(tensor_arg(sig, 0)->numel(), v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_prior(tensor_arg(sig, 0)->numel(), v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DType out = *converted_dtype(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string d : {define("KF_IN", convert_code(x.dtype, Backend::kCpu)),
                          define("KF_OUT", convert_code(out, Backend::kCpu)), define("KF_CHUNK", v[0])}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuConvert, "kf_convert", options);
    s.plan.outputs = {OutputSpec::like(0, out)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("numel0")};
    return s;
  }
};

}  // namespace

// "to_copy" (CUDA) and "cpu.to_copy".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ToCopyCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ToCopyCpu>(); },
};

}  // namespace kforge::search::templates

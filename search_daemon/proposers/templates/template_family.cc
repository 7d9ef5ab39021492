#include "search_daemon/proposers/templates/template_family.h"

#include <cmath>
#include <utility>

namespace kforge::search::templates {

const TensorMeta* tensor_arg(const OpSignature& sig, size_t i) {
  if (i >= sig.args.size()) return nullptr;
  return std::get_if<TensorMeta>(&sig.args[i].value);
}

bool template_tensor(const TensorMeta* t, Backend backend) {
  if (t == nullptr || t->sizes.empty() || t->numel() <= 0 || !t->is_contiguous()) return false;
  if (backend == Backend::kCpu) return t->device == DeviceType::kCpu && t->dtype == DType::kFloat32;
  return t->device == DeviceType::kCuda &&
         (t->dtype == DType::kFloat32 || t->dtype == DType::kFloat16 || t->dtype == DType::kBFloat16);
}

bool is_none(const OpSignature& sig, size_t i) {
  return i < sig.args.size() && std::holds_alternative<std::monostate>(sig.args[i].value);
}

const int64_t* int_arg(const OpSignature& sig, size_t i) {
  if (i >= sig.args.size()) return nullptr;
  return std::get_if<int64_t>(&sig.args[i].value);
}

int64_t cols_of(const TensorMeta& t) { return t.sizes.back(); }
int64_t rows_of(const TensorMeta& t) {
  const int64_t c = cols_of(t);
  return c > 0 ? t.numel() / c : 0;
}

std::string size_name(size_t arg, size_t dim) { return "size" + std::to_string(arg) + "_" + std::to_string(dim); }
std::string cols_expr(const TensorMeta& t) { return size_name(0, t.sizes.size() - 1); }
std::string rows_expr(const TensorMeta& t) { return "numel0 / " + cols_expr(t); }

bool vector_fits(const OpSignature& sig, int64_t vec) {
  for (const Arg& a : sig.args) {
    const auto* t = std::get_if<TensorMeta>(&a.value);
    if (t == nullptr) continue;
    const int64_t bytes = vec * dtype_size_bytes(t->dtype);
    if (bytes > 16 || static_cast<int64_t>(t->alignment) % bytes != 0) return false;
  }
  return true;
}

std::string define(std::string_view name, int64_t value) {
  return "-D" + std::string(name) + "=" + std::to_string(value);
}

std::string dtype_define(DType t) {
  return define("KF_DTYPE", t == DType::kFloat16 ? 1 : t == DType::kBFloat16 ? 2 : 0);
}

KernelSpec one_launch_spec(Backend backend, std::string source, std::string entry, std::vector<std::string> options) {
  KernelSpec s;
  s.backend = backend;
  s.language = backend == Backend::kCuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  s.source = std::move(source);
  s.entry_points = {entry};
  s.compile_options = std::move(options);
  Launch l;
  l.entry = std::move(entry);
  s.plan.launches = {std::move(l)};
  return s;
}

std::vector<std::string> cpu_base_options(const OpSignature& sig) {
  std::vector<std::string> o = {"-O3", "-fno-math-errno"};
  // The ISA level the target names (cpu_host_environment() appends it to the arch, so it is part
  // of the cache key); -march=native is refused by the builder for that reason.
  const std::string& arch = sig.target.arch;
  if (arch.starts_with("x86_64")) {
    if (arch.ends_with("-avx512f")) {
      o.push_back("-march=x86-64-v4");
    } else if (arch.ends_with("-avx2")) {
      o.push_back("-march=x86-64-v3");
    } else if (arch.ends_with("-sse4.2")) {
      o.push_back("-march=x86-64-v2");
    }
  }
  return o;
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v && p < (int64_t{1} << 62)) p *= 2;
  return p;
}

double closeness(double a, double b, double weight) {
  if (a <= 0 || b <= 0) return 1.0 / (1.0 + 8 * weight);
  return 1.0 / (1.0 + std::fabs(std::log2(a / b)) * weight);
}

// Note [Template arithmetic]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Inputs and outputs of 16-bit types are converted to float for every operation, as PyTorch's
// opmath does. Reductions that decide accuracy accumulate in kf_acc: double for float32 rows,
// because PyTorch's float sums have an error that depends on its reduction order and ours must
// stay within 2x of it whatever our order (runtime/accuracy.h); float for 16-bit rows, whose
// outputs round far more coarsely than a float sum errs. The layer and group norm statistics are
// always double: their mean and rstd outputs are float32 for every input dtype on CUDA.
// NaN and infinity propagate as in PyTorch's kernels: a NaN in a row makes its sum NaN, a +inf
// makes exp(inf - inf) NaN, a row of -inf has max -inf and gives NaN.
const char* const kCudaPrelude = R"kf(// kforge kernel template (NVRTC: no headers; knobs arrive as -D options).
typedef long long kf_i64;
#define KF_NEG_INF (-__int_as_float(0x7f800000))

#if KF_DTYPE == 0
typedef float kf_t;
typedef double kf_acc;
__device__ __forceinline__ float kf_to_float(float v) { return v; }
__device__ __forceinline__ float kf_from_float(float v) { return v; }
#elif KF_DTYPE == 1
typedef unsigned short kf_t;
typedef float kf_acc;
__device__ __forceinline__ float kf_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short kf_from_float(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#elif KF_DTYPE == 2
typedef unsigned short kf_t;
typedef float kf_acc;
__device__ __forceinline__ float kf_to_float(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
// Round to nearest even; NaN becomes the canonical quiet NaN, as c10::BFloat16 rounds.
__device__ __forceinline__ unsigned short kf_from_float(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
#endif

__device__ __forceinline__ float kf_log(float v) { return logf(v); }
__device__ __forceinline__ double kf_log(double v) { return log(v); }

// N elements in one access; the caller guarantees the alignment.
template <int N>
struct alignas(sizeof(kf_t) * N) kf_vec {
  kf_t v[N];
};
template <int N>
__device__ __forceinline__ void kf_load(const kf_t* __restrict__ p, kf_i64 i, float (&out)[N]) {
  const kf_vec<N> r = reinterpret_cast<const kf_vec<N>*>(p)[i];
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = kf_to_float(r.v[k]);
}
template <int N>
__device__ __forceinline__ void kf_store(kf_t* __restrict__ p, kf_i64 i, const float (&in)[N]) {
  kf_vec<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.v[k] = kf_from_float(in[k]);
  reinterpret_cast<kf_vec<N>*>(p)[i] = r;
}

// Butterfly reductions: every lane ends with the same value (each step adds the same two
// operands, in either order), so every thread of a row agrees bit for bit.
__device__ __forceinline__ float kf_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T kf_warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Over the KF_BLOCK threads of a block; `red` is __shared__ [32]. The first barrier lets an
// earlier reduction finish reading `red`.
__device__ __forceinline__ float kf_block_max(float v, float* red) {
  v = kf_warp_max(v);
  if (KF_BLOCK == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return kf_warp_max(lane < KF_BLOCK / 32 ? red[lane] : KF_NEG_INF);
}
template <typename T>
__device__ __forceinline__ T kf_block_sum(T v, T* red) {
  v = kf_warp_sum(v);
  if (KF_BLOCK == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return kf_warp_sum(lane < KF_BLOCK / 32 ? red[lane] : (T)0);
}
)kf";

const char* const kCpuPrelude = R"kf(// kforge kernel template (CPU): one call per block, blocks in parallel in any order.
#include <math.h>
#include <stdint.h>
#include "runtime/cpu_kernel_abi.h"
#define KF_PTR(T, i) (*(T* const*)p[i])
#define KF_I64(i) (*(const int64_t*)p[i])
#define KF_F32(i) (*(const float*)p[i])
#define KF_F64(i) (*(const double*)p[i])
)kf";

}  // namespace kforge::search::templates

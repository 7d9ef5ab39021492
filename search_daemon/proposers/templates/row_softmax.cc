// aten::_softmax, aten::_log_softmax and aten::_safe_softmax over the last dimension of a
// contiguous tensor (half_to_float false, dtype None): the row reductions of the library. One
// source per backend; KF_LOG picks log_softmax, KF_SAFE _safe_softmax (Note [Safe softmax]).
#include <algorithm>

#include "search_daemon/proposers/templates/softmax_call.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

// Note [Online softmax]
// ~~~~~~~~~~~~~~~~~~~~~
// The online variant keeps a running (max m, sum s of exp(x - m)) and rescales s when the max
// grows, so the row is read once before the write pass instead of twice (Milakov and Gimelshein,
// "Online normalizer calculation for softmax", 2018). Partial states merge as
// (m, s) + (m', s') = (M, s exp(m - M) + s' exp(m' - M)), M = max(m, m'). The special cases keep
// PyTorch's results for non-finite inputs: a -inf element adds nothing until some element is
// finite (exp(-inf - -inf) would be NaN), a NaN makes s NaN, a +inf makes s NaN through
// exp(inf - inf), exactly where the two-pass algorithm gets NaN.
// Note [Safe softmax]
// ~~~~~~~~~~~~~~~~~~~
// _safe_softmax (scaled_dot_product_attention's math path) is softmax, except that a row whose
// elements are all -inf gives 0 everywhere instead of NaN (PyTorch: where(all(x == -inf), 0,
// softmax(x))). A row of -inf and NaN is not such a row: its softmax is NaN. With KF_SAFE the
// two-pass sum skips -inf elements (exp(-inf - m) is 0 for a finite m anyway), and the online sum
// never adds one while the max is -inf, so in both the row sum is 0 exactly when every element is
// -inf (any other row has its max's exp(0) = 1 in the sum, or a NaN), and such a row is written as 0.

// The element functions of the CUDA softmax kernels (here and split_softmax.cc): the shifted exp,
// the online state's steps and merges, the row's online reduction, the written value.
const char* const kCudaSoftmaxMath = R"kf(
// Rows mapped as kCudaRowMapping says; KF_ONLINE: Note [Online softmax]; KF_VEC elements per
// access (cols % KF_VEC == 0); KF_ITEMS vectors per thread kept in registers when the row fits (0:
// always stream from memory); KF_LOG: log_softmax; KF_SAFE: _safe_softmax (Note [Safe softmax]).
__device__ __forceinline__ float kf_exp_shifted(float x, float m) {
#if KF_SAFE
  return x == KF_NEG_INF ? 0.0f : expf(x - m);
#else
  return expf(x - m);
#endif
}
__device__ __forceinline__ void kf_online_add(float& m, kf_acc& s, float v) {
  if (v > m) {
    s = s * (kf_acc)expf(m - v) + (kf_acc)expf(v - v);   // expf(v - v): NaN for v = +inf
    m = v;
  } else if (m != KF_NEG_INF) {
    s += (kf_acc)expf(v - m);
  } else if (v != v) {
    s = (kf_acc)v;
  }
}
__device__ __forceinline__ void kf_online_merge(float& m, kf_acc& s, float m2, kf_acc s2) {
  const float mn = fmaxf(m, m2);
  if (mn == KF_NEG_INF) {
    s += s2;
    return;
  }
  s = s * (kf_acc)expf(m - mn) + s2 * (kf_acc)expf(m2 - mn);
  m = mn;
}
__device__ __forceinline__ void kf_online_warp(float& m, kf_acc& s, int width) {
  for (int o = width / 2; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const kf_acc s2 = __shfl_xor_sync(0xffffffffu, s, o);
    kf_online_merge(m, s, m2, s2);
  }
}
__device__ __forceinline__ void kf_row_online(float& m, kf_acc& s, float* red_m, kf_acc* red_s) {
#if KF_WARP_ROW
  (void)red_m;
  (void)red_s;
  kf_online_warp(m, s, KF_ROW_LANES);
#else
  kf_online_warp(m, s, 32);
  if (KF_BLOCK == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    red_m[warp] = m;
    red_s[warp] = s;
  }
  __syncthreads();
  m = lane < KF_BLOCK / 32 ? red_m[lane] : KF_NEG_INF;
  s = lane < KF_BLOCK / 32 ? red_s[lane] : (kf_acc)0;
  kf_online_warp(m, s, 32);
#endif
}

// The output of one element from the row's statistics: log_softmax from x, softmax from x or
// from exp(x - m) already computed (e).
__device__ __forceinline__ float kf_out(float x, float m, float ls_or_r) {
#if KF_LOG
  return (x - m) - ls_or_r;
#else
  return expf(x - m) * ls_or_r;
#endif
}
__device__ __forceinline__ float kf_finish(kf_acc s) {
#if KF_LOG
  return (float)kf_log(s);
#else
  return (float)((kf_acc)1 / s);
#endif
}
)kf";

namespace {

const char* const kCudaSoftmax = R"kf(
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_softmax(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 rows, kf_i64 cols) {
  __shared__ float red_m[32];
  __shared__ kf_acc red_s[32];
  kf_i64 row;
  int tid;
  bool live;
  if (!kf_map_row(rows, row, tid, live)) return;
  const kf_t* __restrict__ xr = x + (live ? row : 0) * cols;
  kf_t* __restrict__ yr = y + (live ? row : 0) * cols;
  const kf_i64 nvec = live ? cols / KF_VEC : 0;
  float m = KF_NEG_INF;
  kf_acc s = 0;

#if KF_ITEMS > 0
  if (nvec <= (kf_i64)KF_ITEMS * KF_NT) {
    float v[KF_ITEMS][KF_VEC];
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      const kf_i64 i = (kf_i64)it * KF_NT + tid;
      if (i < nvec) kf_load<KF_VEC>(xr, i, v[it]);
    }
#if KF_ONLINE
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) kf_online_add(m, s, v[it][k]);
      }
    }
    kf_row_online(m, s, red_m, red_s);
#else
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) m = fmaxf(m, v[it][k]);
      }
    }
    m = kf_row_max(m, red_m);
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) {
          const float e = kf_exp_shifted(v[it][k], m);
          s += (kf_acc)e;
#if !KF_LOG
          v[it][k] = e;   // softmax writes e * (1 / s): exp once per element
#endif
        }
      }
    }
    s = kf_row_sum(s, red_s);
#endif
    const float f = kf_finish(s);
    const bool dead = KF_SAFE && s == (kf_acc)0;   // every element -inf
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      const kf_i64 i = (kf_i64)it * KF_NT + tid;
      if (i < nvec) {
        float o[KF_VEC];
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) {
#if !KF_LOG && !KF_ONLINE
          o[k] = dead ? 0.0f : v[it][k] * f;
#else
          o[k] = dead ? 0.0f : kf_out(v[it][k], m, f);
#endif
        }
        kf_store<KF_VEC>(yr, i, o);
      }
    }
    return;
  }
#endif

#if KF_ONLINE
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) kf_online_add(m, s, v[k]);
  }
  kf_row_online(m, s, red_m, red_s);
#else
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) m = fmaxf(m, v[k]);
  }
  m = kf_row_max(m, red_m);
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) s += (kf_acc)kf_exp_shifted(v[k], m);
  }
  s = kf_row_sum(s, red_s);
#endif
  const float f = kf_finish(s);
  const bool dead = KF_SAFE && s == (kf_acc)0;
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
    float o[KF_VEC];
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) o[k] = dead ? 0.0f : kf_out(v[k], m, f);
    kf_store<KF_VEC>(yr, i, o);
  }
}
)kf";

// The CPU kernel: KF_ROWS rows per block, KF_LANES independent accumulators per reduction (so the
// compiler can vectorize them), sums in double.
const char* const kCpuSoftmax = R"kf(
static inline void kf_online_add(float& m, double& s, float v) {
  if (v > m) {
    s = s * (double)expf(m - v) + (double)expf(v - v);
    m = v;
  } else if (m != -INFINITY) {
    s += (double)expf(v - m);
  } else if (v != v) {
    s = (double)v;
  }
}
static inline void kf_online_merge(float& m, double& s, float m2, double s2) {
  const float mn = m > m2 ? m : m2;
  if (mn == -INFINITY) {
    s += s2;
    return;
  }
  s = s * (double)expf(m - mn) + s2 * (double)expf(m2 - mn);
  m = mn;
}

static inline float kf_exp_shifted(float x, float m) {
#if KF_SAFE
  return x == -INFINITY ? 0.0f : expf(x - m);
#else
  return expf(x - m);
#endif
}

static void kf_row(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  float m = -INFINITY;
  double s = 0;
  const int64_t body = cols - cols % KF_LANES;
#if KF_ONLINE
  float ml[KF_LANES];
  double sl[KF_LANES];
  for (int l = 0; l < KF_LANES; ++l) ml[l] = -INFINITY, sl[l] = 0;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) kf_online_add(ml[l], sl[l], x[c + l]);
  }
  for (int64_t c = body; c < cols; ++c) kf_online_add(ml[0], sl[0], x[c]);
  for (int l = 0; l < KF_LANES; ++l) kf_online_merge(m, s, ml[l], sl[l]);
#else
  float ml[KF_LANES];
  for (int l = 0; l < KF_LANES; ++l) ml[l] = -INFINITY;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) ml[l] = x[c + l] > ml[l] ? x[c + l] : ml[l];
  }
  for (int64_t c = body; c < cols; ++c) ml[0] = x[c] > ml[0] ? x[c] : ml[0];
  for (int l = 0; l < KF_LANES; ++l) m = ml[l] > m ? ml[l] : m;
  double sl[KF_LANES];
  for (int l = 0; l < KF_LANES; ++l) sl[l] = 0;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) {
      const float e = kf_exp_shifted(x[c + l], m);
#if !KF_LOG
      y[c + l] = e;
#endif
      sl[l] += e;
    }
  }
  for (int64_t c = body; c < cols; ++c) {
    const float e = kf_exp_shifted(x[c], m);
#if !KF_LOG
    y[c] = e;
#endif
    sl[0] += e;
  }
  for (int l = 0; l < KF_LANES; ++l) s += sl[l];
#endif
#if KF_SAFE
  if (s == 0) {   // every element -inf (Note [Safe softmax])
    for (int64_t c = 0; c < cols; ++c) y[c] = 0.0f;
    return;
  }
#endif
#if KF_LOG
  const double ls = log(s);
  for (int64_t c = 0; c < cols; ++c) y[c] = (float)(((double)x[c] - m) - ls);
#elif KF_ONLINE
  const double r = 1.0 / s;
  for (int64_t c = 0; c < cols; ++c) y[c] = (float)((double)expf(x[c] - m) * r);
#else
  const double r = 1.0 / s;
  for (int64_t c = 0; c < cols; ++c) y[c] = (float)((double)y[c] * r);
#endif
}

extern "C" void kf_softmax(const kforge_cpu_block* b, void* const* p) {
  const float* x = KF_PTR(const float, 0);
  float* y = KF_PTR(float, 1);
  const int64_t rows = KF_I64(2);
  const int64_t cols = KF_I64(3);
  const int64_t r0 = (int64_t)b->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) kf_row(x + r * cols, y + r * cols, cols);
}
)kf";

bool softmax_signature(const OpSignature& sig, Softmax kind, Backend backend) {
  const int64_t d = softmax_call_dim(sig, kind, backend);
  return d >= 0 && d == static_cast<int64_t>(tensor_arg(sig, 0)->sizes.size()) - 1;
}

// ---- CUDA ------------------------------------------------------------------------------------------

class SoftmaxCuda final : public CudaRowFamily {
 public:
  explicit SoftmaxCuda(Softmax kind)
      : CudaRowFamily(softmax_family_name(kind, Backend::kCuda), {"two_pass", "online"}), kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_signature(sig, kind_, Backend::kCuda); }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = {dtype_define(x.dtype)};
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    options.push_back(define("KF_ONLINE", v[kAlgo]));
    KernelSpec s = one_launch_spec(Backend::kCuda, "", "kf_softmax", {});
    Launch& l = s.plan.launches[0];
    map_rows(x, v, options, l);
    s.source = std::string(kCudaPrelude) + kCudaRowMapping + kCudaSoftmaxMath + kCudaSoftmax;
    s.compile_options = std::move(options);
    s.plan.outputs = {OutputSpec::like(0)};
    const std::string rows = rows_expr(x);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows), ArgBinding::size(cols_expr(x))};
    return s;
  }

 private:
  // Measured on an H200: online pays a second exp per element in the write pass and a branch per
  // element, and lost to two_pass on every shape tried, cached or not.
  double algo_prior(bool cached, int64_t algo) const override {
    (void)cached;
    return algo == 0 ? 1.0 : 0.6;
  }
  Softmax kind_;
};

// ---- CPU -------------------------------------------------------------------------------------------

enum SoftmaxCpuKnob : size_t { kCpuAlgo, kCpuRows, kCpuLanes };

class SoftmaxCpu final : public FamilyBase {
 public:
  explicit SoftmaxCpu(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCpu), Backend::kCpu,
                   {Knob{"algo", {0, 1}, {"two_pass", "online"}},
                    Knob{"rows", {1, 2, 4, 8, 16, 32, 64}, {}},
                    Knob{"lanes", {1, 4, 8, 16}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_signature(sig, kind_, Backend::kCpu); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    return v[kCpuRows] <= pow2_ceil(rows_of(x)) && (v[kCpuLanes] == 1 || v[kCpuLanes] <= cols_of(x));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const double ideal_rows = std::clamp(16384.0 / static_cast<double>(cols_of(x)), 1.0, 64.0);
    return closeness(static_cast<double>(v[kCpuRows]), ideal_rows, 0.3) *
           closeness(static_cast<double>(v[kCpuLanes]), 8, 0.3) * (v[kCpuAlgo] == 0 ? 1.0 : 0.8);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    for (std::string o : {define("KF_ONLINE", v[kCpuAlgo]),
                          define("KF_ROWS", v[kCpuRows]), define("KF_LANES", v[kCpuLanes])}) {
      options.push_back(std::move(o));
    }
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuSoftmax, "kf_softmax", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    const std::string rows = rows_expr(x);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[kCpuRows]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows), ArgBinding::size(cols_expr(x))};
    return s;
  }

 private:
  Softmax kind_;
};

}  // namespace

std::string softmax_family_name(Softmax kind, Backend backend, std::string_view suffix) {
  const std::string base =
      std::string(kind == Softmax::kLog ? "log_softmax" : kind == Softmax::kSafe ? "safe_softmax" : "softmax") +
      std::string(suffix);
  return backend == Backend::kCpu ? "cpu." + base : base;
}

int64_t softmax_call_dim(const OpSignature& sig, Softmax kind, Backend backend) {
  const char* op =
      kind == Softmax::kLog ? "aten::_log_softmax" : kind == Softmax::kSafe ? "aten::_safe_softmax" : "aten::_softmax";
  if (sig.op != op || !sig.overload.empty() || sig.args.size() != 3) return -1;
  const TensorMeta* x = tensor_arg(sig, 0);
  const int64_t* dim = int_arg(sig, 1);
  if (!template_tensor(x, backend) || dim == nullptr) return -1;
  if (kind == Softmax::kSafe) {
    if (!std::holds_alternative<std::monostate>(sig.args[2].value)) return -1;   // dtype None only
  } else {
    const bool* half_to_float = std::get_if<bool>(&sig.args[2].value);
    if (half_to_float == nullptr || *half_to_float) return -1;
  }
  const auto rank = static_cast<int64_t>(x->sizes.size());
  if (*dim < -rank || *dim >= rank) return -1;
  return *dim < 0 ? *dim + rank : *dim;
}

std::vector<std::string> softmax_kind_defines(Softmax kind) {
  return {define("KF_LOG", kind == Softmax::kLog ? 1 : 0), define("KF_SAFE", kind == Softmax::kSafe ? 1 : 0)};
}

// aten::_softmax, aten::_log_softmax and aten::_safe_softmax over the last dimension (catalog
// families "softmax", "log_softmax", "safe_softmax" and their "cpu." twins).
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCuda>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCuda>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCuda>(Softmax::kSafe); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCpu>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCpu>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SoftmaxCpu>(Softmax::kSafe); },
};

}  // namespace kforge::search::templates

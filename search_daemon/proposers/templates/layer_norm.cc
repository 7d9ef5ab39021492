// aten::native_layer_norm over the last dimension: (out, mean, rstd), with weight and bias each a
// tensor of the input's dtype or None. The input's last dimension is contiguous, the others may
// have any strides (Note [Strided rows] in template_family.cc: the QK-norm over attention heads);
// out is contiguous, as PyTorch's (it normalizes a contiguous copy). mean and rstd are float32 of sizes
// [d0, ..., d(n-2), 1] and contiguous strides, as PyTorch returns them on both devices for the
// dtypes here (CUDA keeps float32 statistics for 16-bit inputs too).
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

// Note [Norm statistics]
// ~~~~~~~~~~~~~~~~~~~~~~
// The mean and the variance accumulate in double (Note [Template arithmetic]). two_pass sums x,
// then (x - mean)^2; welford folds each vector of KF_VEC elements into a running (count, mean,
// M2) with Chan's merge, one division per vector, so the row is read once before the write pass.
// After a butterfly of Welford merges the lanes may differ in the last bit (the merge is not
// symmetric), so the row's result is taken from lane 0 and broadcast.
const char* const kCudaNormStatistics = R"kf(
struct kf_welford {
  double n, mean, m2;
};
__device__ __forceinline__ void kf_welford_merge(kf_welford& a, double bn, double bmean, double bm2) {
  const double n = a.n + bn;
  if (n == 0) return;
  const double d = bmean - a.mean;
  const double fb = bn / n;
  a.mean += d * fb;
  a.m2 += bm2 + d * d * a.n * fb;
  a.n = n;
}
template <int W>
__device__ __forceinline__ void kf_welford_warp(kf_welford& a) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    const double bn = __shfl_xor_sync(0xffffffffu, a.n, o);
    const double bmean = __shfl_xor_sync(0xffffffffu, a.mean, o);
    const double bm2 = __shfl_xor_sync(0xffffffffu, a.m2, o);
    kf_welford_merge(a, bn, bmean, bm2);
  }
  a.n = __shfl_sync(0xffffffffu, a.n, 0, W);
  a.mean = __shfl_sync(0xffffffffu, a.mean, 0, W);
  a.m2 = __shfl_sync(0xffffffffu, a.m2, 0, W);
}
// Over the KF_NT threads of a row; `red` is __shared__ [96] (block mode only).
__device__ __forceinline__ void kf_welford_row(kf_welford& a, double* red) {
#if KF_WARP_ROW
  (void)red;
  kf_welford_warp<KF_ROW_LANES>(a);
#else
  kf_welford_warp<32>(a);
  if (KF_BLOCK == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    red[warp] = a.n;
    red[32 + warp] = a.mean;
    red[64 + warp] = a.m2;
  }
  __syncthreads();
  const bool have = lane < KF_BLOCK / 32;
  a.n = have ? red[lane] : 0.0;
  a.mean = have ? red[32 + lane] : 0.0;
  a.m2 = have ? red[64 + lane] : 0.0;
  kf_welford_warp<32>(a);
#endif
}
// Folds one vector of KF_VEC elements into a running state.
__device__ __forceinline__ void kf_welford_vec(kf_welford& a, const float (&v)[KF_VEC]) {
  double s = 0;
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) s += (double)v[k];
  const double mean = s * (1.0 / KF_VEC);
  double q = 0;
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    const double d = (double)v[k] - mean;
    q += d * d;
  }
  kf_welford_merge(a, (double)KF_VEC, mean, q);
}
)kf";

namespace {

const char* const kCudaLayerNorm = R"kf(
// Rows mapped as kCudaRowMapping says; KF_WELFORD: Note [Norm statistics]; KF_VEC elements per access; KF_ITEMS vectors per thread kept in registers when the
// row fits (0: always stream). KF_HAS_WEIGHT, KF_HAS_BIAS: whether those arguments are tensors.
__device__ __forceinline__ void kf_ln_out(const float (&v)[KF_VEC], double mean, float rstd,
#if KF_HAS_WEIGHT
                                          const kf_t* __restrict__ w,
#endif
#if KF_HAS_BIAS
                                          const kf_t* __restrict__ b,
#endif
                                          kf_t* __restrict__ yr, kf_i64 i) {
  float o[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) o[k] = (float)((double)v[k] - mean) * rstd;
#if KF_HAS_WEIGHT
  float wv[KF_VEC];
  kf_load<KF_VEC>(w, i, wv);
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) o[k] *= wv[k];
#endif
#if KF_HAS_BIAS
  float bv[KF_VEC];
  kf_load<KF_VEC>(b, i, bv);
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) o[k] += bv[k];
#endif
  kf_store<KF_VEC>(yr, i, o);
}
#if KF_HAS_WEIGHT
#define KF_W_ARG w,
#else
#define KF_W_ARG
#endif
#if KF_HAS_BIAS
#define KF_B_ARG b,
#else
#define KF_B_ARG
#endif

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_layer_norm(const kf_t* __restrict__ x,
#if KF_HAS_WEIGHT
              const kf_t* __restrict__ w,
#endif
#if KF_HAS_BIAS
              const kf_t* __restrict__ b,
#endif
              kf_t* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out, kf_i64 rows,
              kf_i64 cols, double eps) {
  __shared__ double red[96];
  kf_i64 row;
  int tid;
  bool live;
  if (!kf_map_row(rows, row, tid, live)) return;
  const kf_t* __restrict__ xr = x + KF_X_ROW(live ? row : 0);
  kf_t* __restrict__ yr = y + (live ? row : 0) * cols;
  const kf_i64 nvec = live ? cols / KF_VEC : 0;
  double mean, var;

#if KF_ITEMS > 0
  if (nvec <= (kf_i64)KF_ITEMS * KF_NT) {
    float v[KF_ITEMS][KF_VEC];
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      const kf_i64 i = (kf_i64)it * KF_NT + tid;
      if (i < nvec) kf_load<KF_VEC>(xr, i, v[it]);
    }
#if KF_WELFORD
    kf_welford st = {0.0, 0.0, 0.0};
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) kf_welford_vec(st, v[it]);
    }
    kf_welford_row(st, red);
    mean = st.mean;
    var = st.m2 / (double)cols;
#else
    double s = 0;
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) s += (double)v[it][k];
      }
    }
    mean = kf_row_sum<double>(s, red) / (double)cols;
    double q = 0;
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      if ((kf_i64)it * KF_NT + tid < nvec) {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) {
          const double d = (double)v[it][k] - mean;
          q += d * d;
        }
      }
    }
    var = kf_row_sum<double>(q, red) / (double)cols;
#endif
    const double rstd = 1.0 / sqrt(var + eps);
#pragma unroll
    for (int it = 0; it < KF_ITEMS; ++it) {
      const kf_i64 i = (kf_i64)it * KF_NT + tid;
      if (i < nvec) kf_ln_out(v[it], mean, (float)rstd, KF_W_ARG KF_B_ARG yr, i);
    }
    if (tid == 0 && live) {
      mean_out[row] = (float)mean;
      rstd_out[row] = (float)rstd;
    }
    return;
  }
#endif

#if KF_WELFORD
  kf_welford st = {0.0, 0.0, 0.0};
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
    kf_welford_vec(st, v);
  }
  kf_welford_row(st, red);
  mean = st.mean;
  var = st.m2 / (double)cols;
#else
  double s = 0;
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) s += (double)v[k];
  }
  mean = kf_row_sum<double>(s, red) / (double)cols;
  double q = 0;
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const double d = (double)v[k] - mean;
      q += d * d;
    }
  }
  var = kf_row_sum<double>(q, red) / (double)cols;
#endif
  const double rstd = 1.0 / sqrt(var + eps);
  for (kf_i64 i = tid; i < nvec; i += KF_NT) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
    kf_ln_out(v, mean, (float)rstd, KF_W_ARG KF_B_ARG yr, i);
  }
  if (tid == 0 && live) {
    mean_out[row] = (float)mean;
    rstd_out[row] = (float)rstd;
  }
}
)kf";

const char* const kCpuLayerNorm = R"kf(
// KF_ROWS rows per block, KF_LANES independent accumulators; statistics in double (kf_row_stats).
static void kf_row(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                   float* __restrict__ y, float* mean_out, float* rstd_out, int64_t cols, double eps) {
  double mean, var;
  kf_row_stats(x, cols, &mean, &var);
  const double rstd = 1.0 / sqrt(var + eps);
  for (int64_t c = 0; c < cols; ++c) {
    double o = ((double)x[c] - mean) * rstd;
#if KF_HAS_WEIGHT
    o *= (double)w[c];
#endif
#if KF_HAS_BIAS
    o += (double)b[c];
#endif
    y[c] = (float)o;
  }
  *mean_out = (float)mean;
  *rstd_out = (float)rstd;
  (void)w;
  (void)b;
}

extern "C" void kf_layer_norm(const kforge_cpu_block* blk, void* const* p) {
  int a = 0;
  const float* x = KF_PTR(const float, a++);
#if KF_HAS_WEIGHT
  const float* w = KF_PTR(const float, a++);
#else
  const float* w = 0;
#endif
#if KF_HAS_BIAS
  const float* b = KF_PTR(const float, a++);
#else
  const float* b = 0;
#endif
  float* y = KF_PTR(float, a++);
  float* mean_out = KF_PTR(float, a++);
  float* rstd_out = KF_PTR(float, a++);
  const int64_t rows = KF_I64(a++);
  const int64_t cols = KF_I64(a++);
  const double eps = KF_F64(a++);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    kf_row(x + KF_X_ROW(r), w, b, y + r * cols, mean_out + r, rstd_out + r, cols, eps);
  }
}
)kf";

struct LayerNormArgs {
  const TensorMeta* x = nullptr;
  bool weight = false;
  bool bias = false;
};

// The signature as the templates handle it; x == nullptr when they do not.
LayerNormArgs layer_norm_args(const OpSignature& sig, Backend backend) {
  LayerNormArgs a;
  if (sig.op != "aten::native_layer_norm" || !sig.overload.empty() || sig.args.size() != 5) return a;
  const TensorMeta* x = tensor_arg(sig, 0);
  const auto* shape = std::get_if<std::vector<int64_t>>(&sig.args[1].value);
  const bool eps_scalar = std::holds_alternative<double>(sig.args[4].value) ||
                          std::holds_alternative<int64_t>(sig.args[4].value);
  if (!strided_rows_tensor(x, backend) || shape == nullptr || shape->size() != 1 || shape->front() != cols_of(*x) ||
      !eps_scalar) {
    return a;
  }
  for (size_t i : {size_t{2}, size_t{3}}) {
    if (is_none(sig, i)) continue;
    const TensorMeta* p = tensor_arg(sig, i);
    if (!template_tensor(p, backend) || p->dtype != x->dtype || p->sizes != std::vector<int64_t>{cols_of(*x)}) {
      return a;
    }
    (i == 2 ? a.weight : a.bias) = true;
  }
  a.x = x;
  return a;
}

// A contiguous output of dtype t and these sizes (launch-plan expressions): each stride the product
// of the sizes after it.
OutputSpec contiguous_output(DType t, std::vector<std::string> sizes) {
  std::vector<std::string> strides(sizes.size(), "1");
  for (size_t d = sizes.size() - 1; d-- > 0;) {
    strides[d] = strides[d + 1] == "1" ? sizes[d + 1] : sizes[d + 1] + " * " + strides[d + 1];
  }
  return OutputSpec::explicit_layout(t, std::move(sizes), std::move(strides));
}

// out: x's sizes and dtype, contiguous (whatever x's strides).
OutputSpec normalized_output(const TensorMeta& x) {
  std::vector<std::string> sizes(x.sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) sizes[d] = size_name(0, d);
  return contiguous_output(x.dtype, std::move(sizes));
}

// mean and rstd: [d0, ..., d(n-2), 1], contiguous, float32.
OutputSpec stats_output(const TensorMeta& x) {
  std::vector<std::string> sizes(x.sizes.size(), "1");
  for (size_t d = 0; d + 1 < sizes.size(); ++d) sizes[d] = size_name(0, d);
  return contiguous_output(DType::kFloat32, std::move(sizes));
}

// The launch's arguments: x, [weight], [bias], out, mean, rstd, rows, cols, eps.
std::vector<ArgBinding> layer_norm_bindings(const LayerNormArgs& a) {
  std::vector<ArgBinding> args = {ArgBinding::input(0)};
  if (a.weight) args.push_back(ArgBinding::input(2));
  if (a.bias) args.push_back(ArgBinding::input(3));
  for (ArgBinding b : {ArgBinding::output(0), ArgBinding::output(1), ArgBinding::output(2),
                       ArgBinding::size(rows_expr(*a.x)), ArgBinding::size(cols_expr(*a.x)),
                       ArgBinding::scalar(4, ValueType::kFloat64)}) {
    args.push_back(std::move(b));
  }
  return args;
}

// ---- CUDA ------------------------------------------------------------------------------------------

class LayerNormCuda final : public CudaRowFamily {
 public:
  LayerNormCuda() : CudaRowFamily("layer_norm", {"two_pass", "welford"}) {}

  bool applies(const OpSignature& sig) const override { return layer_norm_args(sig, Backend::kCuda).x != nullptr; }

  // Vector accesses also need every row start on a vector boundary (strided rows).
  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return CudaRowFamily::valid(sig, v) && row_offset_granule(*tensor_arg(sig, 0)) % v[kVec] == 0;
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const LayerNormArgs a = layer_norm_args(sig, Backend::kCuda);
    const TensorMeta& x = *a.x;
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_HAS_WEIGHT", a.weight ? 1 : 0),
                                        define("KF_HAS_BIAS", a.bias ? 1 : 0), define("KF_WELFORD", v[kAlgo])};
    KernelSpec s = one_launch_spec(Backend::kCuda, "", "kf_layer_norm", {});
    Launch& l = s.plan.launches[0];
    map_rows(x, v, options, l);
    s.source = std::string(kCudaPrelude) + kCudaRowMapping + kCudaNormStatistics + row_offset_define(x, "cols") +
               kCudaLayerNorm;
    s.compile_options = std::move(options);
    s.plan.outputs = {normalized_output(x), stats_output(x), stats_output(x)};
    l.args = layer_norm_bindings(a);
    return s;
  }

 private:
  // Measured on an H200: with the row in registers two_pass wins (Welford's double division per
  // vector costs more than a second pass over registers); streamed, Welford's single read wins.
  double algo_prior(bool cached, int64_t algo) const override {
    if (cached) return algo == 0 ? 1.0 : 0.7;
    return algo == 1 ? 1.0 : 0.85;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

enum LayerNormCpuKnob : size_t { kCpuAlgo, kCpuRows, kCpuLanes };

class LayerNormCpu final : public FamilyBase {
 public:
  LayerNormCpu()
      : FamilyBase("cpu.layer_norm", Backend::kCpu,
                   {Knob{"algo", {0, 1}, {"two_pass", "welford"}},
                    Knob{"rows", {1, 2, 4, 8, 16, 32, 64}, {}},
                    Knob{"lanes", {1, 4, 8, 16}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return layer_norm_args(sig, Backend::kCpu).x != nullptr; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    return v[kCpuRows] <= pow2_ceil(rows_of(x)) && (v[kCpuLanes] == 1 || v[kCpuLanes] <= cols_of(x));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const double ideal_rows = std::clamp(16384.0 / static_cast<double>(cols_of(x)), 1.0, 64.0);
    return closeness(static_cast<double>(v[kCpuRows]), ideal_rows, 0.3) *
           closeness(static_cast<double>(v[kCpuLanes]), 8, 0.3) * (v[kCpuAlgo] == 0 ? 1.0 : 0.7);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const LayerNormArgs a = layer_norm_args(sig, Backend::kCpu);
    const TensorMeta& x = *a.x;
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string o : {define("KF_HAS_WEIGHT", a.weight ? 1 : 0), define("KF_HAS_BIAS", a.bias ? 1 : 0),
                          define("KF_WELFORD", v[kCpuAlgo]), define("KF_ROWS", v[kCpuRows]),
                          define("KF_LANES", v[kCpuLanes])}) {
      options.push_back(std::move(o));
    }
    KernelSpec s = one_launch_spec(Backend::kCpu,
                                   std::string(kCpuPrelude) + kCpuNormStatistics + row_offset_define(x, "cols") +
                                       kCpuLayerNorm,
                                   "kf_layer_norm", options);
    s.plan.outputs = {normalized_output(x), stats_output(x), stats_output(x)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + rows_expr(x) + ", " + std::to_string(v[kCpuRows]) + ")";
    l.args = layer_norm_bindings(a);
    return s;
  }
};

}  // namespace

// aten::native_layer_norm over the last dimension ("layer_norm", "cpu.layer_norm").
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<LayerNormCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<LayerNormCpu>(); },
};

}  // namespace kforge::search::templates

// aten::native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) on a contiguous input of
// N x C x HxW elements: (out, mean, rstd) with mean and rstd [N, group], contiguous, of the input's
// dtype (PyTorch's param_scalar_type: the input's dtype unless weight and input dtypes are mixed,
// which the templates refuse). One row of the kernels is one (n, g) pair: C / group channels of
// HxW elements, contiguous.
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaGroupNorm = R"kf(
// One (n, g) row per block of KF_BLOCK threads; KF_WELFORD: Note [Norm statistics]; KF_VEC
// elements per access (HxW % KF_VEC == 0, so a vector never straddles two channels).
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_group_norm(const kf_t* __restrict__ x,
#if KF_HAS_WEIGHT
              const kf_t* __restrict__ w,
#endif
#if KF_HAS_BIAS
              const kf_t* __restrict__ b,
#endif
              kf_t* __restrict__ y, kf_t* __restrict__ mean_out, kf_t* __restrict__ rstd_out, kf_i64 groups,
              kf_i64 d, kf_i64 hxw, kf_i64 cpg, double eps) {
  __shared__ double red[96];
  const kf_i64 row = blockIdx.x;
  const kf_i64 c0 = (row % groups) * cpg;
  const kf_t* __restrict__ xr = x + row * d;
  kf_t* __restrict__ yr = y + row * d;
  const kf_i64 nvec = d / KF_VEC;
  double mean, var;
#if KF_WELFORD
  kf_welford st = {0.0, 0.0, 0.0};
  for (kf_i64 i = threadIdx.x; i < nvec; i += KF_BLOCK) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
    kf_welford_vec(st, v);
  }
  kf_welford_row(st, red);
  mean = st.mean;
  var = st.m2 / (double)d;
#else
  double s = 0;
  for (kf_i64 i = threadIdx.x; i < nvec; i += KF_BLOCK) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) s += (double)v[k];
  }
  mean = kf_row_sum<double>(s, red) / (double)d;
  double q = 0;
  for (kf_i64 i = threadIdx.x; i < nvec; i += KF_BLOCK) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const double e = (double)v[k] - mean;
      q += e * e;
    }
  }
  var = kf_row_sum<double>(q, red) / (double)d;
#endif
  const double rstd = 1.0 / sqrt(var + eps);
  const float rstd_f = (float)rstd;
  for (kf_i64 i = threadIdx.x; i < nvec; i += KF_BLOCK) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xr, i, v);
    const kf_i64 c = c0 + (i * KF_VEC) / hxw;
    float o[KF_VEC];
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) o[k] = (float)((double)v[k] - mean) * rstd_f;
#if KF_HAS_WEIGHT
    const float wc = kf_to_float(w[c]);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) o[k] *= wc;
#endif
#if KF_HAS_BIAS
    const float bc = kf_to_float(b[c]);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) o[k] += bc;
#endif
    (void)c;
    kf_store<KF_VEC>(yr, i, o);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = kf_from_float((float)mean);
    rstd_out[row] = kf_from_float((float)rstd);
  }
}
)kf";

const char* const kCpuGroupNorm = R"kf(
// KF_ROWS (n, g) rows per block, KF_LANES independent accumulators; statistics in double (kf_row_stats).
extern "C" void kf_group_norm(const kforge_cpu_block* blk, void* const* p) {
  int a = 0;
  const float* __restrict__ x = KF_PTR(const float, a++);
#if KF_HAS_WEIGHT
  const float* __restrict__ w = KF_PTR(const float, a++);
#endif
#if KF_HAS_BIAS
  const float* __restrict__ b = KF_PTR(const float, a++);
#endif
  float* __restrict__ y = KF_PTR(float, a++);
  float* mean_out = KF_PTR(float, a++);
  float* rstd_out = KF_PTR(float, a++);
  const int64_t rows = KF_I64(a++);
  const int64_t groups = KF_I64(a++);
  const int64_t d = KF_I64(a++);
  const int64_t hxw = KF_I64(a++);
  const int64_t cpg = KF_I64(a++);
  const double eps = KF_F64(a++);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double mean, var;
    kf_row_stats(xr, d, &mean, &var);
    const double rstd = 1.0 / sqrt(var + eps);
    const int64_t c0 = (r % groups) * cpg;
    for (int64_t k = 0; k < cpg; ++k) {
      const float* xc = xr + k * hxw;
      float* yc = yr + k * hxw;
      double scale = rstd;
#if KF_HAS_WEIGHT
      scale *= (double)w[c0 + k];
#endif
      double shift = 0;
#if KF_HAS_BIAS
      shift = (double)b[c0 + k];
#endif
      for (int64_t i = 0; i < hxw; ++i) yc[i] = (float)(((double)xc[i] - mean) * scale + shift);
    }
    mean_out[r] = (float)mean;
    rstd_out[r] = (float)rstd;
    (void)c0;
  }
}
)kf";

struct GroupNormArgs {
  const TensorMeta* x = nullptr;
  int64_t n = 0, c = 0, hxw = 0, group = 0;
  bool weight = false;
  bool bias = false;
};

GroupNormArgs group_norm_args(const OpSignature& sig, Backend backend) {
  GroupNormArgs a;
  if (sig.op != "aten::native_group_norm" || !sig.overload.empty() || sig.args.size() != 8) return a;
  const TensorMeta* x = tensor_arg(sig, 0);
  const int64_t *n = int_arg(sig, 3), *c = int_arg(sig, 4), *hxw = int_arg(sig, 5), *group = int_arg(sig, 6);
  const bool eps_scalar = std::holds_alternative<double>(sig.args[7].value) ||
                          std::holds_alternative<int64_t>(sig.args[7].value);
  if (!template_tensor(x, backend) || x->sizes.size() < 2 || n == nullptr || c == nullptr || hxw == nullptr ||
      group == nullptr || !eps_scalar) {
    return a;
  }
  if (*n != x->sizes[0] || *c != x->sizes[1] || *group <= 0 || *c % *group != 0 || *hxw <= 0 ||
      *n * *c * *hxw != x->numel()) {
    return a;
  }
  for (size_t i : {size_t{1}, size_t{2}}) {
    if (is_none(sig, i)) continue;
    const TensorMeta* p = tensor_arg(sig, i);
    if (!template_tensor(p, backend) || p->dtype != x->dtype || p->sizes != std::vector<int64_t>{*c}) return a;
    (i == 1 ? a.weight : a.bias) = true;
  }
  a.x = x;
  a.n = *n;
  a.c = *c;
  a.hxw = *hxw;
  a.group = *group;
  return a;
}

// mean and rstd: [N, group], contiguous, the input's dtype.
OutputSpec group_stats_output(DType dtype) { return OutputSpec::explicit_layout(dtype, {"arg3", "arg6"}, {"arg6", "1"}); }

// x, [weight], [bias], out, mean, rstd, then the sizes (CPU: rows first), eps.
std::vector<ArgBinding> group_norm_bindings(const GroupNormArgs& a, bool cpu) {
  std::vector<ArgBinding> args = {ArgBinding::input(0)};
  if (a.weight) args.push_back(ArgBinding::input(1));
  if (a.bias) args.push_back(ArgBinding::input(2));
  args.push_back(ArgBinding::output(0));
  args.push_back(ArgBinding::output(1));
  args.push_back(ArgBinding::output(2));
  if (cpu) args.push_back(ArgBinding::size("arg3 * arg6"));
  for (const char* e : {"arg6", "numel0 / (arg3 * arg6)", "arg5", "arg4 / arg6"}) args.push_back(ArgBinding::size(e));
  args.push_back(ArgBinding::scalar(7, ValueType::kFloat64));
  return args;
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum GroupNormCudaKnob : size_t { kAlgo, kBlock, kVec };

class GroupNormCuda final : public FamilyBase {
 public:
  GroupNormCuda()
      : FamilyBase("group_norm", Backend::kCuda,
                   {Knob{"algo", {0, 1}, {"two_pass", "welford"}}, Knob{"block", {64, 128, 256, 512, 1024}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return group_norm_args(sig, Backend::kCuda).x != nullptr; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    const int64_t bytes = v[kVec] * dtype_size_bytes(a.x->dtype);
    if (a.hxw % v[kVec] != 0 || bytes > 16 || a.x->alignment % bytes != 0) return false;   // w, b: scalar loads
    const int64_t nvec = a.x->numel() / (a.n * a.group) / v[kVec];
    return v[kBlock] <= std::max<int64_t>(64, (nvec + 31) / 32 * 32);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    const double nvec = static_cast<double>(a.x->numel() / (a.n * a.group) / v[kVec]);
    return closeness(static_cast<double>(v[kVec] * dtype_size_bytes(a.x->dtype)), 16, 0.5) *
           closeness(nvec / static_cast<double>(v[kBlock]), 8, 0.3) * (v[kAlgo] == 0 ? 1.0 : 0.8);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    KernelSpec s = one_launch_spec(
        Backend::kCuda, std::string(kCudaPrelude) + kCudaRowMapping + kCudaNormStatistics + kCudaGroupNorm, "kf_group_norm",
        {dtype_define(a.x->dtype), define("KF_HAS_WEIGHT", a.weight ? 1 : 0), define("KF_HAS_BIAS", a.bias ? 1 : 0),
         define("KF_WARP_ROW", 0), define("KF_ROW_LANES", 32), define("KF_WELFORD", v[kAlgo]),
         define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec])});
    s.plan.outputs = {OutputSpec::like(0), group_stats_output(a.x->dtype), group_stats_output(a.x->dtype)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "arg3 * arg6";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = group_norm_bindings(a, false);
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

enum GroupNormCpuKnob : size_t { kCpuAlgo, kCpuRows, kCpuLanes };

class GroupNormCpu final : public FamilyBase {
 public:
  GroupNormCpu()
      : FamilyBase("cpu.group_norm", Backend::kCpu,
                   {Knob{"algo", {0, 1}, {"two_pass", "welford"}}, Knob{"rows", {1, 2, 4, 8}, {}},
                    Knob{"lanes", {1, 4, 8, 16}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return group_norm_args(sig, Backend::kCpu).x != nullptr; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCpu);
    const int64_t d = a.x->numel() / (a.n * a.group);
    return v[kCpuRows] <= pow2_ceil(a.n * a.group) && (v[kCpuLanes] == 1 || v[kCpuLanes] <= d);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCpu);
    const double d = static_cast<double>(a.x->numel() / (a.n * a.group));
    return closeness(static_cast<double>(v[kCpuRows]), std::clamp(16384.0 / d, 1.0, 8.0), 0.3) *
           closeness(static_cast<double>(v[kCpuLanes]), 8, 0.3) * (v[kCpuAlgo] == 0 ? 1.0 : 0.7);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string o : {define("KF_HAS_WEIGHT", a.weight ? 1 : 0), define("KF_HAS_BIAS", a.bias ? 1 : 0),
                          define("KF_WELFORD", v[kCpuAlgo]), define("KF_ROWS", v[kCpuRows]),
                          define("KF_LANES", v[kCpuLanes])}) {
      options.push_back(std::move(o));
    }
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuNormStatistics + kCpuGroupNorm, "kf_group_norm", options);
    s.plan.outputs = {OutputSpec::like(0), group_stats_output(DType::kFloat32), group_stats_output(DType::kFloat32)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(arg3 * arg6, " + std::to_string(v[kCpuRows]) + ")";
    l.args = group_norm_bindings(a, true);
    return s;
  }
};

}  // namespace

// aten::native_group_norm ("group_norm", "cpu.group_norm").
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<GroupNormCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<GroupNormCpu>(); },
};

}  // namespace kforge::search::templates

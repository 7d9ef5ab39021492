// aten::native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) on a contiguous input of
// N x C x HxW elements: (out, mean, rstd) with mean and rstd [N, group], contiguous, of the input's
// dtype (PyTorch's param_scalar_type: the input's dtype unless weight and input dtypes are mixed,
// which the templates refuse). One row of the kernels is one (n, g) pair: C / group channels of
// HxW elements, contiguous.
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

// Note [Cached group rows]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A row (C / group channels of HxW elements) is read from memory three times by two_pass and
// twice by welford: the statistics' passes, then the write's. For a UNet's groups (10 channels of
// 64x64 bf16, 80 KiB) the later reads miss L2 once the rows in flight outgrow it, and PyTorch's
// kernel and ours stayed far from the copy bandwidth (ours 59% on the H100, [16,320,64,64]).
// With `cache` the block copies its row into shared memory as it reads it (KF_UNROLL accesses in
// flight per thread), and the variance and the write read that copy: one read of memory and one
// write, the copy bandwidth's traffic. A row too long for shared memory (the `cached` argument is
// 0) takes the uncached path.
// With `split` > 1 (sm_90) a row is `split` chunks, one block each, the blocks of a row one thread
// block cluster: each block copies its chunk, the row's sum and then its sum of squared deviations
// are the blocks' partial sums read through distributed shared memory and added in rank order (so
// every block of the row gets the same bits), and each block writes its chunk. Few rows (a UNet's
// group_norm at batch 1 or 2: 32 to 64 rows, or the demo's 16 rows of 128 KiB) otherwise leave most
// SMs idle with a block per row.
// The arithmetic stays as exact as the double path's at float cost: the mean is kept as two floats
// (hi + lo, the double mean to about 48 bits), x - mean as (x - hi) - lo (x - hi is exact where x
// is within a factor of two of the mean, as in an offset row of small variance, where a float
// mean alone loses the variance), the sums of a vector in float and of the row in double.
const char* const kCudaGroupNorm = R"kf(
#if KF_HAS_WEIGHT
#define KF_GN_W w
#else
#define KF_GN_W nullptr
#endif
#if KF_HAS_BIAS
#define KF_GN_B b
#else
#define KF_GN_B nullptr
#endif
// o times channel c's weight, plus its bias (w, b: null where the call has none).
__device__ __forceinline__ void kf_group_affine(float (&o)[KF_VEC], kf_i64 c, const kf_t* __restrict__ w,
                                                const kf_t* __restrict__ b) {
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
  (void)w;
  (void)b;
}
#if KF_CACHE
extern __shared__ __align__(16) unsigned char kf_smem[];
// This thread's part of the sum of xv[0, nvec), each vector copied to sv as it is read, KF_UNROLL
// accesses in flight (Note [Cached group rows]).
__device__ __forceinline__ double kf_copy_sum(const kf_vec<KF_VEC>* __restrict__ xv, kf_vec<KF_VEC>* sv, int nvec) {
  double s = 0;
  int i = threadIdx.x;
  for (; i + (KF_UNROLL - 1) * KF_BLOCK < nvec; i += KF_UNROLL * KF_BLOCK) {
    kf_vec<KF_VEC> r[KF_UNROLL];
#pragma unroll
    for (int u = 0; u < KF_UNROLL; ++u) r[u] = xv[i + u * KF_BLOCK];
#pragma unroll
    for (int u = 0; u < KF_UNROLL; ++u) {
      sv[i + u * KF_BLOCK] = r[u];
      float t = 0;
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) t += kf_to_float(r[u].v[k]);
      s += (double)t;
    }
  }
  for (; i < nvec; i += KF_BLOCK) {
    const kf_vec<KF_VEC> r = xv[i];
    sv[i] = r;
    float t = 0;
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) t += kf_to_float(r.v[k]);
    s += (double)t;
  }
  return s;
}
// This thread's part of the sum of (x - mean)^2 over the copy, the mean as hi + lo.
__device__ __forceinline__ double kf_copy_sq_dev(const kf_vec<KF_VEC>* sv, int nvec, float mhi, float mlo) {
  double q = 0;
  for (int j = threadIdx.x; j < nvec; j += KF_BLOCK) {
    const kf_vec<KF_VEC> r = sv[j];
    float t = 0;
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const float e = (kf_to_float(r.v[k]) - mhi) - mlo;
      t += e * e;
    }
    q += (double)t;
  }
  return q;
}
// The row's mean (hi + lo) and variance from one read of memory, the row copied to sv as it is
// read; on every thread of the block.
__device__ __forceinline__ void kf_group_stats_cached(const kf_t* __restrict__ xr, kf_vec<KF_VEC>* sv, int nvec, int d,
                                                      double* red, float& mhi, float& mlo, double& var) {
  const double mean =
      kf_row_sum<double>(kf_copy_sum(reinterpret_cast<const kf_vec<KF_VEC>*>(xr), sv, nvec), red) / (double)d;
  mhi = (float)mean;
  mlo = (float)(mean - (double)mhi);
  __syncthreads();   // the copy is whole
  var = kf_row_sum<double>(kf_copy_sq_dev(sv, nvec, mhi, mlo), red) / (double)d;
}
// The write pass over the copy: (x - mean) * rstd, times its channel's weight, plus its bias.
// Vector j of the copy starts at element cq + j * KF_VEC of channel c0 (w, b: null where absent).
__device__ __forceinline__ void kf_group_write(const kf_vec<KF_VEC>* sv, kf_t* __restrict__ yr, int nvec, int c0, int cq,
                                               int hxw, float mhi, float mlo, float rstd, const kf_t* __restrict__ w,
                                               const kf_t* __restrict__ b) {
  for (int j = threadIdx.x; j < nvec; j += KF_BLOCK) {
    const kf_vec<KF_VEC> r = sv[j];
    const int c = c0 + (cq + j * KF_VEC) / hxw;
    float o[KF_VEC];
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) o[k] = ((kf_to_float(r.v[k]) - mhi) - mlo) * rstd;
    kf_group_affine(o, c, w, b);
    kf_store<KF_VEC>(yr, j, o);
  }
}
#endif

// One (n, g) row per block of KF_BLOCK threads; KF_WELFORD: Note [Norm statistics]; KF_VEC
// elements per access (HxW % KF_VEC == 0, so a vector never straddles two channels); KF_CACHE:
// Note [Cached group rows], where `cached` is 1.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_group_norm(const kf_t* __restrict__ x,
#if KF_HAS_WEIGHT
              const kf_t* __restrict__ w,
#endif
#if KF_HAS_BIAS
              const kf_t* __restrict__ b,
#endif
              kf_t* __restrict__ y, kf_t* __restrict__ mean_out, kf_t* __restrict__ rstd_out, kf_i64 groups,
              kf_i64 d, kf_i64 hxw, kf_i64 cpg, double eps
#if KF_CACHE
              , kf_i64 cached
#endif
              ) {
  __shared__ double red[96];
  const kf_i64 row = blockIdx.x;
  const kf_i64 c0 = (row % groups) * cpg;
  const kf_t* __restrict__ xr = x + row * d;
  kf_t* __restrict__ yr = y + row * d;
  const kf_i64 nvec = d / KF_VEC;
#if KF_CACHE
  if (cached != 0) {   // the row fits shared memory, so every index below fits an int
    kf_vec<KF_VEC>* sv = reinterpret_cast<kf_vec<KF_VEC>*>(kf_smem);
    float mhi, mlo;
    double cvar;
    kf_group_stats_cached(xr, sv, (int)nvec, (int)d, red, mhi, mlo, cvar);
    const double crstd = 1.0 / sqrt(cvar + eps);
    const float crstd_f = (float)crstd;
    kf_group_write(sv, yr, (int)nvec, (int)c0, 0, (int)hxw, mhi, mlo, crstd_f, KF_GN_W, KF_GN_B);
    if (threadIdx.x == 0) {
      mean_out[row] = kf_from_float((float)((double)mhi + (double)mlo));
      rstd_out[row] = kf_from_float((float)crstd);
    }
    return;
  }
#endif
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
    kf_group_affine(o, c, KF_GN_W, KF_GN_B);
    kf_store<KF_VEC>(yr, i, o);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = kf_from_float((float)mean);
    rstd_out[row] = kf_from_float((float)rstd);
  }
}

#if KF_SPLIT > 1
// Note [Cached group rows]: row blockIdx.x / KF_SPLIT, its chunk q = blockIdx.x % KF_SPLIT (the
// block's rank in its 1-D cluster) of `chunk` elements (a multiple of KF_VEC; the last may be
// short).
extern "C" __global__ void __cluster_dims__(KF_SPLIT, 1, 1) __launch_bounds__(KF_BLOCK)
kf_group_norm_cluster(const kf_t* __restrict__ x,
#if KF_HAS_WEIGHT
                      const kf_t* __restrict__ w,
#endif
#if KF_HAS_BIAS
                      const kf_t* __restrict__ b,
#endif
                      kf_t* __restrict__ y, kf_t* __restrict__ mean_out, kf_t* __restrict__ rstd_out, kf_i64 groups,
                      kf_i64 d, kf_i64 hxw, kf_i64 cpg, double eps, kf_i64 chunk) {
  __shared__ double red[96];
  __shared__ double part_s, part_q, all[KF_SPLIT];
  const int q = (int)(blockIdx.x % KF_SPLIT);
  const kf_i64 row = blockIdx.x / KF_SPLIT;
  const kf_i64 start = q * chunk;
  const int n = (int)(start < d ? (d - start < chunk ? d - start : chunk) : 0);
  const int nvec = n / KF_VEC;
  const kf_vec<KF_VEC>* __restrict__ xv = reinterpret_cast<const kf_vec<KF_VEC>*>(x + row * d + start);
  kf_vec<KF_VEC>* sv = reinterpret_cast<kf_vec<KF_VEC>*>(kf_smem);
  const double s = kf_row_sum<double>(kf_copy_sum(xv, sv, nvec), red);
  if (threadIdx.x == 0) part_s = s;
  // Every block's partial sum is written before any block reads one.
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x < KF_SPLIT) all[threadIdx.x] = kf_cluster_ld(&part_s, threadIdx.x);
  __syncthreads();
  double total = 0;
  for (int k = 0; k < KF_SPLIT; ++k) total += all[k];
  const double mean = total / (double)d;
  const float mhi = (float)mean, mlo = (float)(mean - (double)mhi);
  __syncthreads();   // the copy is whole (the cluster barrier above also ordered it)
  const double qs = kf_row_sum<double>(kf_copy_sq_dev(sv, nvec, mhi, mlo), red);
  if (threadIdx.x == 0) part_q = qs;
  // The second exchange; its barrier also orders every block's reads of all[] above before the
  // writes below.
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x < KF_SPLIT) all[threadIdx.x] = kf_cluster_ld(&part_q, threadIdx.x);
  // This block is done reading the others' shared memory; it waits for them to be done with its
  // own before it exits (the wait at the end).
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  __syncthreads();
  double m2 = 0;
  for (int k = 0; k < KF_SPLIT; ++k) m2 += all[k];
  const double rstd = 1.0 / sqrt(m2 / (double)d + eps);
  const float rstd_f = (float)rstd;
  kf_t* __restrict__ yr = y + row * d + start;
  const int cq = (int)(start % hxw);   // the chunk's first element within its channel
  const kf_i64 c0 = (row % groups) * cpg + start / hxw;
  kf_group_write(sv, yr, nvec, (int)c0, cq, (int)hxw, mhi, mlo, rstd_f, KF_GN_W, KF_GN_B);
  if (q == 0 && threadIdx.x == 0) {
    mean_out[row] = kf_from_float((float)mean);
    rstd_out[row] = kf_from_float(rstd_f);
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif
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

enum GroupNormCudaKnob : size_t { kAlgo, kBlock, kVec, kCache, kUnroll, kSplit };

// Note [Cached group rows]: clusters (sm_90 on) of at most 8 blocks, the portable size.
constexpr int64_t kMaxGroupSplit = 8;
// At least a block for every SM of a 132-SM Hopper.
constexpr int64_t kGroupTargetBlocks = 132;

class GroupNormCuda final : public FamilyBase {
 public:
  GroupNormCuda()
      : FamilyBase("group_norm", Backend::kCuda,
                   {Knob{"algo", {0, 1}, {"two_pass", "welford"}}, Knob{"block", {64, 128, 256, 512, 1024}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cache", {0, 1}, {}}, Knob{"unroll", {1, 2, 4}, {}},
                    Knob{"split", {1, 2, 4, 8}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return group_norm_args(sig, Backend::kCuda).x != nullptr; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    const int64_t bytes = v[kVec] * dtype_size_bytes(a.x->dtype);
    if (a.hxw % v[kVec] != 0 || bytes > 16 || a.x->alignment % bytes != 0) return false;   // w, b: scalar loads
    const int64_t nvec = a.x->numel() / (a.n * a.group) / v[kVec];
    if (v[kBlock] > std::max<int64_t>(64, (nvec + 31) / 32 * 32)) return false;
    // Note [Cached group rows]: a row that fits shared memory, its statistics in two passes over
    // the copy (welford has nothing to add there); unrolled loads on that path only.
    if (v[kCache] == 0) return v[kUnroll] == 1 && v[kSplit] == 1;
    if (v[kAlgo] != 0) return false;
    const int64_t split = v[kSplit];
    if (split == 1) return row_bytes(a) <= kCudaSharedBudget && nvec >= v[kBlock] * v[kUnroll];
    // A cluster of `split` blocks, each a chunk of whole vectors that fits shared memory, with at
    // least a round of the block's unrolled accesses, and none empty.
    if (split > kMaxGroupSplit || !has_clusters(sig)) return false;
    const int64_t d = a.x->numel() / (a.n * a.group), chunk = chunk_of(d, split, v[kVec]);
    return chunk * dtype_size_bytes(a.x->dtype) <= kCudaSharedBudget && chunk / v[kVec] >= v[kBlock] * v[kUnroll] &&
           (split - 1) * chunk < d;
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    const double nvec = static_cast<double>(a.x->numel() / (a.n * a.group) / v[kVec]);
    const double access = static_cast<double>(v[kVec] * dtype_size_bytes(a.x->dtype));
    if (v[kCache] == 0) {
      return 0.6 * closeness(access, 16, 0.5) * closeness(nvec / static_cast<double>(v[kBlock]), 8, 0.3) *
             (v[kAlgo] == 0 ? 1.0 : 0.8);
    }
    // Threads resident per SM, the copies limiting the blocks; 32-64 bytes of loads in flight per
    // thread.
    const int64_t copy_bytes =
        v[kSplit] == 1 ? row_bytes(a) : chunk_of(row_bytes(a) / dtype_size_bytes(a.x->dtype), v[kSplit], v[kVec]) * dtype_size_bytes(a.x->dtype);
    const int64_t per_sm = std::min<int64_t>(2048 / v[kBlock], (228 * 1024) / (copy_bytes + 1024));
    const double resident = static_cast<double>(std::min<int64_t>(2048, std::max<int64_t>(1, per_sm) * v[kBlock]));
    // Enough blocks for every SM: a row's split multiplies them (Note [Cached group rows]).
    const int64_t rows = a.n * a.group;
    const int64_t ideal_split = std::clamp<int64_t>(pow2_ceil((kGroupTargetBlocks + rows - 1) / rows), 1, kMaxGroupSplit);
    return closeness(access, 16, 0.5) * closeness(resident, 2048, 0.5) *
           closeness(access * static_cast<double>(v[kUnroll]), 48, 0.3) *
           closeness(static_cast<double>(v[kSplit]), static_cast<double>(ideal_split), 0.4);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const GroupNormArgs a = group_norm_args(sig, Backend::kCuda);
    const int64_t split = v[kSplit];
    KernelSpec s = one_launch_spec(
        Backend::kCuda,
        std::string(kCudaPrelude) + kCudaRowMapping + kCudaNormStatistics + (split > 1 ? kCudaClusterShared : "") +
            kCudaGroupNorm,
        split > 1 ? "kf_group_norm_cluster" : "kf_group_norm",
        {dtype_define(a.x->dtype), define("KF_HAS_WEIGHT", a.weight ? 1 : 0), define("KF_HAS_BIAS", a.bias ? 1 : 0),
         define("KF_WARP_ROW", 0), define("KF_ROW_LANES", 32), define("KF_WELFORD", v[kAlgo]),
         define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_CACHE", v[kCache]),
         define("KF_UNROLL", v[kUnroll]), define("KF_SPLIT", split)});
    s.plan.outputs = {OutputSpec::like(0), group_stats_output(a.x->dtype), group_stats_output(a.x->dtype)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "arg3 * arg6";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = group_norm_bindings(a, false);
    if (split > 1) {
      const std::string d = "numel0 / (arg3 * arg6)";
      const std::string chunk = "round_up(ceil_div(" + d + ", " + std::to_string(split) + "), " + std::to_string(v[kVec]) + ")";
      l.grid[0] = "arg3 * arg6 * " + std::to_string(split);
      l.shared_mem_bytes = chunk + " * " + std::to_string(dtype_size_bytes(a.x->dtype));
      l.args.push_back(ArgBinding::size(chunk));
    } else if (v[kCache] == 1) {
      // The row's bytes, and whether they fit (for any signature the spec is resolved for: the
      // kernel takes the uncached path where they do not).
      const std::string bytes = "numel0 / (arg3 * arg6) * " + std::to_string(dtype_size_bytes(a.x->dtype));
      const std::string fits = "min(1, " + std::to_string(kCudaSharedBudget) + " / (" + bytes + "))";
      l.shared_mem_bytes = "(" + fits + ") * (" + bytes + ")";
      l.args.push_back(ArgBinding::size(fits));
    }
    return s;
  }

 private:
  // A row's chunk for `split` blocks: whole vectors, the plan's expression.
  static int64_t chunk_of(int64_t d, int64_t split, int64_t vec) { return ((d + split - 1) / split + vec - 1) / vec * vec; }
  static int64_t row_bytes(const GroupNormArgs& a) { return a.x->numel() / (a.n * a.group) * dtype_size_bytes(a.x->dtype); }
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

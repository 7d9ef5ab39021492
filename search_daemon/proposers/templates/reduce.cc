// Reductions over trailing dimensions: aten::sum.dim_IntList, aten::mean.dim (dtype None),
// aten::amax and aten::argmax over a contiguous input whose reduced dimensions are its last k (in
// any order; an empty or None dim list reduces every dimension; argmax's dim is one dimension, the
// last, or None: the flattened tensor): the input is [rows, cols] and each row gives one output
// element. That is RMSNorm's mean over the last dimension, global average pooling's mean over
// [-2, -1] of an NCHW tensor, a row max, greedy decoding's argmax over the vocabulary. The output
// is contiguous, with the reduced dimensions kept as 1 (keepdim) or dropped, as PyTorch returns it.
//
// argmax returns int64 indices, checked exactly: the first maximum of a row (each thread scans its
// elements in increasing order and keeps a strict win; threads and warps combine by value, then by
// the lower index), and a NaN counts as above every number, so a row with NaNs gives its first NaN,
// as PyTorch's kernels do on CPU and CUDA.
//
// Sums accumulate in kf_acc (Note [Template arithmetic] in template_family.cc: double for float32
// rows, float for 16-bit ones) and the mean divides the total once. amax is exact and propagates
// NaN as PyTorch's does (a row with a NaN gives NaN: fmaxf alone would drop it), so each thread
// also counts the NaNs it saw.
#include <algorithm>
#include <set>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

enum class Reduction : uint8_t { kSum, kMean, kAmax, kArgmax };

const char* const kCudaReduce = R"kf(
// KF_RED: 0 sum, 1 mean, 2 amax, 3 argmax. One output element per row of a contiguous [rows, cols]
// input; the row's KF_NT threads read it in vectors of KF_VEC (KF_VEC divides cols).
#if KF_RED == 3
typedef long long kf_out_t;
// Whether (a, ia) wins over (b, ib) in argmax: a NaN over any number (the first NaN of a row
// wins), then the larger value, then the lower index (PyTorch's first maximum).
__device__ __forceinline__ bool kf_arg_better(float a, kf_i64 ia, float b, kf_i64 ib) {
  const bool an = a != a, bn = b != b;
  if (an || bn) return an && bn ? ia < ib : an;
  return a != b ? a > b : ia < ib;
}
// Over the W lanes of a row that shuffle together: every lane ends with the winner.
template <int W>
__device__ __forceinline__ void kf_arg_warp(float& m, kf_i64& mi) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const kf_i64 oi = __shfl_xor_sync(0xffffffffu, mi, o);
    if (kf_arg_better(om, oi, m, mi)) {
      m = om;
      mi = oi;
    }
  }
}
#else
typedef kf_t kf_out_t;
#endif
#if !KF_STAGED
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_reduce_rows(const kf_t* __restrict__ x, kf_out_t* __restrict__ y, kf_i64 rows, kf_i64 cols) {
  __shared__ kf_acc red_acc[32];
  __shared__ float red_f[32];
  (void)red_acc;
  (void)red_f;
  kf_i64 row;
  int tid;
  bool live;
  if (!kf_map_row(rows, row, tid, live)) return;
  const kf_t* __restrict__ xr = x + (live ? row : 0) * cols;
  const kf_i64 nvec = cols / KF_VEC;
#if KF_RED == 3
  // This thread's elements in increasing index order: a strict win keeps the first of equals.
  float m = KF_NEG_INF;
  kf_i64 mi = 0x7fffffffffffffffLL;   // no element yet: loses to any element, -inf included
  if (live) {
    for (kf_i64 i = tid; i < nvec; i += KF_NT) {
      float v[KF_VEC];
      kf_load<KF_VEC>(xr, i, v);
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
        if (kf_arg_better(v[k], i * KF_VEC + k, m, mi)) {
          m = v[k];
          mi = i * KF_VEC + k;
        }
      }
    }
  }
#if KF_WARP_ROW
  kf_arg_warp<KF_ROW_LANES>(m, mi);
#else
  __shared__ kf_i64 red_i[32];
  kf_arg_warp<32>(m, mi);
  if (KF_BLOCK > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
      red_f[warp] = m;
      red_i[warp] = mi;
    }
    __syncthreads();
    m = lane < KF_BLOCK / 32 ? red_f[lane] : KF_NEG_INF;
    mi = lane < KF_BLOCK / 32 ? red_i[lane] : 0x7fffffffffffffffLL;
    kf_arg_warp<32>(m, mi);
  }
#endif
  if (live && tid == 0) y[row] = mi;
#elif KF_RED == 2
  float m = KF_NEG_INF, nans = 0.0f;
  if (live) {
    for (kf_i64 i = tid; i < nvec; i += KF_NT) {
      float v[KF_VEC];
      kf_load<KF_VEC>(xr, i, v);
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
        if (v[k] != v[k]) nans += 1.0f;
        else m = fmaxf(m, v[k]);
      }
    }
  }
  m = kf_row_max(m, red_f);
  nans = kf_row_sum(nans, red_f);
  if (live && tid == 0) y[row] = kf_from_float(nans > 0.0f ? __int_as_float(0x7fc00000) : m);
#else
  kf_acc s = 0;
  if (live) {
    for (kf_i64 i = tid; i < nvec; i += KF_NT) {
      float v[KF_VEC];
      kf_load<KF_VEC>(xr, i, v);
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) s += (kf_acc)v[k];
    }
  }
  s = kf_row_sum(s, red_acc);
#if KF_RED == 1
  s = s / (kf_acc)cols;
#endif
  if (live && tid == 0) y[row] = kf_from_float((float)s);
#endif
}
#else
// Note [Staged rows]: KF_BLOCK rows per block, one per thread, copied to shared memory in KF_VEC
// accesses (four in flight per thread) at any alignment, then summed (or maxed) by their threads.
extern __shared__ __align__(16) unsigned char kf_smem[];
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_reduce_staged(const kf_t* __restrict__ x, kf_out_t* __restrict__ y, kf_i64 rows, kf_i64 cols) {
  const kf_i64 r0 = (kf_i64)blockIdx.x * KF_BLOCK;
  const int nr = (int)(rows - r0 < KF_BLOCK ? rows - r0 : KF_BLOCK);
  const int len = (int)cols;
  const int n = nr * len;
  const kf_t* __restrict__ p = x + r0 * cols;
  // The elements before p's first KF_VEC-aligned address (at most n); the copy keeps p's alignment,
  // its first aligned element at byte 16 of the shared memory.
  const int mis = (int)((unsigned long long)p % (unsigned long long)(KF_VEC * sizeof(kf_t)));
  int h = mis == 0 ? 0 : (KF_VEC * (int)sizeof(kf_t) - mis) / (int)sizeof(kf_t);
  if (h > n) h = n;
  kf_t* sm = reinterpret_cast<kf_t*>(kf_smem + 16) - h;
  const int nv = (n - h) / KF_VEC;
  const int t = h + nv * KF_VEC;   // the tail's first element
  const int tid = threadIdx.x;
  if (tid < h) sm[tid] = p[tid];
  if (tid < n - t) sm[t + tid] = p[t + tid];
  const kf_vec<KF_VEC>* __restrict__ pv = reinterpret_cast<const kf_vec<KF_VEC>*>(p + h);
  kf_vec<KF_VEC>* sv = reinterpret_cast<kf_vec<KF_VEC>*>(sm + h);
  int i = tid;
  for (; i + 3 * KF_BLOCK < nv; i += 4 * KF_BLOCK) {
    kf_vec<KF_VEC> r[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) r[u] = pv[i + u * KF_BLOCK];
#pragma unroll
    for (int u = 0; u < 4; ++u) sv[i + u * KF_BLOCK] = r[u];
  }
  for (; i < nv; i += KF_BLOCK) sv[i] = pv[i];
  __syncthreads();
  if (tid >= nr) return;
  const kf_t* row = sm + tid * len;
#if KF_RED == 2
  float m = KF_NEG_INF;
  bool nan = false;
  for (int k = 0; k < len; ++k) {
    const float v = kf_to_float(row[k]);
    if (v != v) nan = true;
    else m = fmaxf(m, v);
  }
  y[r0 + tid] = kf_from_float(nan ? __int_as_float(0x7fc00000) : m);
#else
  kf_acc s = 0;
  for (int k = 0; k < len; ++k) s += (kf_acc)kf_to_float(row[k]);
#if KF_RED == 1
  s = s / (kf_acc)cols;
#endif
  y[r0 + tid] = kf_from_float((float)s);
#endif
}
#endif
)kf";

// Note [Staged rows]
// ~~~~~~~~~~~~~~~~~~
// Global average pooling of a ResNet's last features ([N, 2048, 7, 7] over the last two
// dimensions) reduces rows of 49 elements: 98 bytes in bf16, so no row starts 16-byte aligned and
// the row maps read them in 2-byte accesses (69% of the copy bandwidth on the H100, where issue 23
// asks 9x PyTorch's kernel: about 81% on the H200). With map=staged a block's KF_BLOCK rows are one
// contiguous span of memory: it is copied to shared memory in KF_VEC-element accesses (a scalar
// head up to the first aligned address and a scalar tail), and then each thread reduces its own row
// from the copy, in order. Short rows only: the block's rows must fit shared memory. Not argmax.

const char* const kCpuReduce = R"kf(
// KF_RED: 0 sum, 1 mean, 2 amax, 3 argmax. KF_ROWS rows per block, KF_LANES independent
// accumulators.
#if KF_RED == 3
typedef int64_t kf_out_t;
#else
typedef float kf_out_t;
#endif
extern "C" void kf_reduce_rows(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  kf_out_t* __restrict__ y = KF_PTR(kf_out_t, 1);
  const int64_t rows = KF_I64(2), cols = KF_I64(3);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  const int64_t body = cols - cols % KF_LANES;
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict__ xr = x + r * cols;
#if KF_RED == 3
    // KF_LANES running maxima over interleaved columns, each keeping its first maximum; the
    // lanes' winners are then compared by value and index. The first NaN ends the row.
    float m[KF_LANES];
    int64_t mi[KF_LANES];
    int64_t first_nan = -1;
    for (int l = 0; l < KF_LANES; ++l) {
      m[l] = -INFINITY;
      mi[l] = INT64_MAX;
    }
    for (int64_t c = 0; c < body && first_nan < 0; c += KF_LANES) {
      for (int l = 0; l < KF_LANES; ++l) {
        const float v = xr[c + l];
        if (v != v) {
          if (first_nan < 0) first_nan = c + l;
        } else if (v > m[l] || (v == m[l] && mi[l] == INT64_MAX)) {
          m[l] = v;
          mi[l] = c + l;
        }
      }
    }
    for (int64_t c = body; c < cols && first_nan < 0; ++c) {
      const float v = xr[c];
      if (v != v) {
        first_nan = c;
      } else if (v > m[0] || (v == m[0] && mi[0] == INT64_MAX)) {
        m[0] = v;
        mi[0] = c;
      }
    }
    float best = m[0];
    int64_t at = mi[0];
    for (int l = 1; l < KF_LANES; ++l) {
      if (m[l] > best || (m[l] == best && mi[l] < at)) {
        best = m[l];
        at = mi[l];
      }
    }
    y[r] = first_nan >= 0 ? first_nan : at;
#elif KF_RED == 2
    float m[KF_LANES];
    int nan = 0;
    for (int l = 0; l < KF_LANES; ++l) m[l] = -INFINITY;
    for (int64_t c = 0; c < body; c += KF_LANES) {
      for (int l = 0; l < KF_LANES; ++l) {
        const float v = xr[c + l];
        nan |= v != v;
        m[l] = v > m[l] ? v : m[l];
      }
    }
    for (int64_t c = body; c < cols; ++c) {
      const float v = xr[c];
      nan |= v != v;
      m[0] = v > m[0] ? v : m[0];
    }
    float best = m[0];
    for (int l = 1; l < KF_LANES; ++l) best = m[l] > best ? m[l] : best;
    y[r] = nan ? NAN : best;
#else
    double s[KF_LANES];
    for (int l = 0; l < KF_LANES; ++l) s[l] = 0;
    for (int64_t c = 0; c < body; c += KF_LANES) {
      for (int l = 0; l < KF_LANES; ++l) s[l] += (double)xr[c + l];
    }
    for (int64_t c = body; c < cols; ++c) s[0] += (double)xr[c];
    double total = 0;
    for (int l = 0; l < KF_LANES; ++l) total += s[l];
#if KF_RED == 1
    total /= (double)cols;
#endif
    y[r] = (float)total;
#endif
  }
}
)kf";

// What a signature reduces: the input, how many trailing dimensions, and whether they are kept.
struct ReduceArgs {
  const TensorMeta* x = nullptr;
  size_t reduced = 0;   // the last `reduced` dimensions
  bool keepdim = false;
  int64_t rows = 1, cols = 1;
};

std::optional<ReduceArgs> reduce_args(const OpSignature& sig, Reduction r, Backend backend) {
  switch (r) {
    case Reduction::kSum:
      if (sig.op != "aten::sum" || sig.overload != "dim_IntList" || sig.args.size() != 4) return std::nullopt;
      break;
    case Reduction::kMean:
      if (sig.op != "aten::mean" || sig.overload != "dim" || sig.args.size() != 4) return std::nullopt;
      break;
    case Reduction::kAmax:
      if (sig.op != "aten::amax" || !sig.overload.empty() || sig.args.size() != 3) return std::nullopt;
      break;
    case Reduction::kArgmax:
      if (sig.op != "aten::argmax" || !sig.overload.empty() || sig.args.size() != 3) return std::nullopt;
      break;
  }
  ReduceArgs a;
  a.x = tensor_arg(sig, 0);
  if (!template_tensor(a.x, backend)) return std::nullopt;
  if (sig.args.size() > 3 && !is_none(sig, 3)) return std::nullopt;   // dtype= changes the result type
  const auto* keep = std::get_if<bool>(&sig.args[2].value);
  if (keep == nullptr) return std::nullopt;
  a.keepdim = *keep;
  const auto rank = static_cast<int64_t>(a.x->sizes.size());
  if (rank == 0) return std::nullopt;
  std::set<int64_t> dims;
  if (const auto* one = std::get_if<int64_t>(&sig.args[1].value); one != nullptr && r == Reduction::kArgmax) {
    if (*one < -rank || *one >= rank) return std::nullopt;
    dims.insert(*one < 0 ? *one + rank : *one);
  } else if (const auto* list = std::get_if<std::vector<int64_t>>(&sig.args[1].value); list != nullptr && r != Reduction::kArgmax) {
    for (int64_t d : *list) {
      if (d < -rank || d >= rank) return std::nullopt;
      if (!dims.insert(d < 0 ? d + rank : d).second) return std::nullopt;   // PyTorch refuses repeats
    }
  } else if (!is_none(sig, 1)) {
    return std::nullopt;
  }
  if (dims.empty()) {   // None or []: every dimension
    for (int64_t d = 0; d < rank; ++d) dims.insert(d);
  }
  // The reduced dimensions must be the last ones.
  if (*dims.begin() != rank - static_cast<int64_t>(dims.size())) return std::nullopt;
  a.reduced = dims.size();
  for (int64_t d = 0; d < rank; ++d) (d < rank - static_cast<int64_t>(a.reduced) ? a.rows : a.cols) *= a.x->sizes[d];
  // PyTorch refuses argmax over an empty group; an empty output has nothing to index.
  if (r == Reduction::kArgmax && (a.cols == 0 || a.rows == 0)) return std::nullopt;
  return a;
}

// The row length and count as launch-plan expressions.
std::string cols_of_expr(const ReduceArgs& a) {
  std::string e;
  for (size_t d = a.x->sizes.size() - a.reduced; d < a.x->sizes.size(); ++d) e += (e.empty() ? "" : " * ") + size_name(0, d);
  return e;
}
std::string rows_of_expr(const ReduceArgs& a) { return "numel0 / (" + cols_of_expr(a) + ")"; }

OutputSpec reduce_output(const ReduceArgs& a, Reduction r) {
  const size_t kept = a.x->sizes.size() - a.reduced;
  std::vector<std::string> sizes;
  for (size_t d = 0; d < kept; ++d) sizes.push_back(size_name(0, d));
  if (a.keepdim) sizes.insert(sizes.end(), a.reduced, "1");
  std::vector<std::string> strides(sizes.size());
  std::string step = "1";
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = step;
    if (sizes[d] != "1") step = step == "1" ? sizes[d] : step + " * " + sizes[d];
  }
  return OutputSpec::explicit_layout(r == Reduction::kArgmax ? DType::kInt64 : a.x->dtype, sizes, strides);
}

std::string_view family_name(Reduction r, Backend b) {
  const bool cpu = b == Backend::kCpu;
  switch (r) {
    case Reduction::kSum: return cpu ? "cpu.sum" : "sum";
    case Reduction::kMean: return cpu ? "cpu.mean" : "mean";
    case Reduction::kAmax: return cpu ? "cpu.amax" : "amax";
    case Reduction::kArgmax: return cpu ? "cpu.argmax" : "argmax";
  }
  return "";
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum ReduceCudaKnob : size_t { kMap, kBlock, kRowLanes, kVec };

// Note [Staged rows]: rows up to this many elements.
constexpr int64_t kMaxStagedCols = 1024;

class ReduceCuda final : public FamilyBase {
 public:
  explicit ReduceCuda(Reduction r)
      : FamilyBase(std::string(family_name(r, Backend::kCuda)), Backend::kCuda,
                   {Knob{"map", {0, 1, 2}, {"block_row", "warp_row", "staged"}}, Knob{"block", {32, 64, 128, 256, 512, 1024}, {}},
                    Knob{"row_lanes", {4, 8, 16, 32}, {}}, Knob{"vec", {1, 2, 4, 8}, {}}}),
        r_(r) {}

  bool applies(const OpSignature& sig) const override { return reduce_args(sig, r_, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCuda);
    if (v[kMap] == 2) {   // Note [Staged rows]: any alignment, the lane count unused
      const int64_t esz = dtype_size_bytes(a.x->dtype);
      return r_ != Reduction::kArgmax && v[kRowLanes] == 4 && v[kVec] * esz <= 16 && v[kBlock] >= 64 &&
             v[kBlock] <= 512 && a.rows >= 1 && a.cols >= 1 && a.cols <= kMaxStagedCols &&
             v[kBlock] <= std::max<int64_t>(64, pow2_ceil(a.rows)) && staged_bytes(a, v[kBlock]) <= kCudaSharedBudget;
    }
    if (a.cols % v[kVec] != 0 || !vector_fits(sig, v[kVec])) return false;
    const int64_t nvec = a.cols / v[kVec];
    if (v[kMap] == 0) {
      // One row per block: the lane count has no meaning (one value), and no idle warps.
      return v[kRowLanes] == 32 && v[kBlock] <= std::max<int64_t>(32, (nvec + 31) / 32 * 32);
    }
    return v[kRowLanes] <= std::max<int64_t>(4, pow2_ceil(nvec)) &&   // idle lanes
           v[kBlock] / v[kRowLanes] <= pow2_ceil(a.rows);             // idle rows
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCuda);
    const int64_t nvec = a.cols / v[kVec];
    double p = closeness(static_cast<double>(v[kVec] * dtype_size_bytes(a.x->dtype)), 16, 0.5);
    if (v[kMap] == 2) {
      // Rows the row maps cannot read in wide accesses are what it is for; otherwise it adds a
      // pass over shared memory.
      const bool aligned_rows = (a.cols * dtype_size_bytes(a.x->dtype)) % 16 == 0;
      return p * (aligned_rows ? 0.7 : 1.0) * closeness(static_cast<double>(v[kBlock]), 256, 0.3);
    }
    if (v[kMap] == 1) {
      p *= nvec <= 256 ? 1.0 : 0.4;   // short rows: a few vectors per lane, several rows per block
      p *= closeness(static_cast<double>(v[kRowLanes]), std::clamp(static_cast<double>(pow2_ceil(nvec)) / 4, 4.0, 32.0), 0.5);
      p *= closeness(static_cast<double>(v[kBlock]), 128, 0.3);
    } else {
      p *= nvec <= 64 ? 0.5 : 1.0;
      p *= closeness(static_cast<double>(nvec) / static_cast<double>(v[kBlock]), 8, 0.3);
      // Few long rows (a global pooling of a batch): not enough blocks for the device either way.
    }
    return p;
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCuda);
    const bool staged = v[kMap] == 2;
    std::vector<std::string> options = {dtype_define(a.x->dtype), define("KF_RED", static_cast<int64_t>(r_)),
                                        define("KF_WARP_ROW", staged ? 0 : v[kMap]), define("KF_ROW_LANES", v[kRowLanes]),
                                        define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]),
                                        define("KF_STAGED", staged ? 1 : 0)};
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaRowMapping + kCudaReduce,
                                   staged ? "kf_reduce_staged" : "kf_reduce_rows", options);
    s.plan.outputs = {reduce_output(a, r_)};
    Launch& l = s.plan.launches[0];
    const std::string rows = rows_of_expr(a);
    if (staged) {
      l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[kBlock]) + ")";
      l.shared_mem_bytes = "32 + " + std::to_string(v[kBlock] * dtype_size_bytes(a.x->dtype)) + " * (" + cols_of_expr(a) + ")";
    } else {
      l.grid[0] = v[kMap] == 1 ? "ceil_div(" + rows + ", " + std::to_string(v[kBlock] / v[kRowLanes]) + ")" : rows;
    }
    l.block[0] = std::to_string(v[kBlock]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows), ArgBinding::size(cols_of_expr(a))};
    return s;
  }

 private:
  // The shared copy of a block's rows (Note [Staged rows]).
  static int64_t staged_bytes(const ReduceArgs& a, int64_t block) { return 32 + block * a.cols * dtype_size_bytes(a.x->dtype); }

  Reduction r_;
};

// ---- CPU -------------------------------------------------------------------------------------------

enum ReduceCpuKnob : size_t { kCpuRows, kCpuLanes };

class ReduceCpu final : public FamilyBase {
 public:
  explicit ReduceCpu(Reduction r)
      : FamilyBase(std::string(family_name(r, Backend::kCpu)), Backend::kCpu,
                   {Knob{"rows", {1, 2, 4, 8, 16, 32, 64, 256}, {}}, Knob{"lanes", {1, 4, 8, 16}, {}}}),
        r_(r) {}

  bool applies(const OpSignature& sig) const override { return reduce_args(sig, r_, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCpu);
    return v[kCpuRows] <= pow2_ceil(a.rows) && (v[kCpuLanes] == 1 || v[kCpuLanes] <= a.cols);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCpu);
    const double ideal_rows = std::clamp(16384.0 / static_cast<double>(a.cols), 1.0, 256.0);
    return closeness(static_cast<double>(v[kCpuRows]), ideal_rows, 0.3) *
           closeness(static_cast<double>(v[kCpuLanes]), 8, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ReduceArgs a = *reduce_args(sig, r_, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string o : {define("KF_RED", static_cast<int64_t>(r_)), define("KF_ROWS", v[kCpuRows]),
                          define("KF_LANES", v[kCpuLanes])}) {
      options.push_back(std::move(o));
    }
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuReduce, "kf_reduce_rows", options);
    s.plan.outputs = {reduce_output(a, r_)};
    Launch& l = s.plan.launches[0];
    const std::string rows = rows_of_expr(a);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[kCpuRows]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows), ArgBinding::size(cols_of_expr(a))};
    return s;
  }

 private:
  Reduction r_;
};

}  // namespace

// "sum", "mean", "amax", "argmax" and their "cpu." twins.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCuda>(Reduction::kSum); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCuda>(Reduction::kMean); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCuda>(Reduction::kAmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCpu>(Reduction::kSum); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCpu>(Reduction::kMean); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCpu>(Reduction::kAmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCuda>(Reduction::kArgmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<ReduceCpu>(Reduction::kArgmax); },
};

}  // namespace kforge::search::templates

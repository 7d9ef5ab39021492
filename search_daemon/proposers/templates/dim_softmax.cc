// aten::_softmax, aten::_log_softmax and aten::_safe_softmax over a dimension that is not the last
// (the last is row_softmax.cc's): a contiguous input seen as [outer, len, inner], inner > 1 (the
// product of the sizes after dim), each of the outer * inner columns normalized over its len
// elements, inner apart in memory. That is a softmax over channels of an NCHW map, over the
// heads or the sequence of a [B, S, H] tensor, a log_softmax over dim 0 of a [classes, batch]
// matrix. CUDA: neighbouring threads take neighbouring columns, so each of the len steps is one
// coalesced row of the [len, inner] slice, several threads may share a column (Note [Split
// columns]), and a block's columns may be kept in shared memory (Note [Cached columns]); CPU: a chunk of KF_CHUNK neighbouring columns per pass, so the inner loops vectorize.
//
// Sums of exp(x - max) are accumulated in double for float32 and float for 16-bit data (kf_acc;
// Note [Template arithmetic] in template_family.cc). CUDA reads each element twice (a running max
// and sum, then the pass that writes; the second from shared memory when cached), the CPU three times (max, sum, write). The non-finite
// cases and KF_SAFE behave as in row_softmax.cc's two-pass kernel (Note [Online softmax], Note
// [Safe softmax] there): a NaN or +inf in the column makes it NaN, a column of -inf is NaN
// (softmax) or 0 (KF_SAFE).
#include <algorithm>

#include "search_daemon/proposers/templates/softmax_call.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaDimSoftmax = R"kf(
// KF_LOG: log_softmax; KF_SAFE: _safe_softmax. Note [Split columns]: a block takes a tile of
// KF_TX * KF_VEC neighbouring columns of one outer index (thread x: KF_VEC of them, in one
// access), and KF_SPLIT threads share each column's len elements (thread y takes every
// KF_SPLIT-th). One pass reads each element once into a running max and sum (Note [Online
// softmax] in row_softmax.cc), the block merges its KF_SPLIT partials per column (Note [Column
// merge]), and a second pass writes: from a copy of the tile in shared memory with KF_CACHE when
// it fits (`cached`; Note [Cached columns]), else reading the elements again.
#define KF_TX (KF_BLOCK / KF_SPLIT)
#define KF_TILE (KF_TX * KF_VEC)
// A warp's threads of one column (lanes KF_TX apart), merged by shuffles; then KF_PARTS
// partials per column in shared memory.
#define KF_W (KF_TX >= 32 ? 1 : 32 / KF_TX)
#define KF_PARTS (KF_SPLIT / KF_W)
#if KF_CACHE
extern __shared__ __align__(16) unsigned char kf_smem[];
#endif
__device__ __forceinline__ float kf_exp_shifted(float x, float m) {
#if KF_SAFE
  return x == KF_NEG_INF ? 0.0f : expf(x - m);
#else
  return expf(x - m);
#endif
}
#define KF_U (16 / KF_VEC)   // accesses in flight per thread: 16 elements (more spill at 8 x 4)
// One element of each of the thread's columns into its running max and sum. A NaN or +inf makes
// the column NaN (as the two-pass softmax does: inf - inf), flagged by a max of NaN; a -inf adds
// nothing.
__device__ __forceinline__ void kf_online(float (&m)[KF_VEC], kf_acc (&s)[KF_VEC], const float (&v)[KF_VEC]) {
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    if (!(v[k] < __int_as_float(0x7f800000))) {   // NaN or +inf
      m[k] = __int_as_float(0x7fffffff);
    } else if (v[k] > m[k]) {   // never true once m is NaN
      s[k] = s[k] * (kf_acc)expf(m[k] - v[k]) + (kf_acc)1;
      m[k] = v[k];
    } else if (v[k] != KF_NEG_INF) {
      s[k] += (kf_acc)expf(v[k] - m[k]);
    }
  }
}
// Two partials (max, sum of exp(v - max)) of one column as one: NaN stays NaN, a partial of -inf
// only (sum 0) adds nothing. Symmetric, so both lanes of a shuffle get the same bits.
__device__ __forceinline__ void kf_merge(float& m, kf_acc& s, float om, kf_acc os) {
  if (m != m || om != om) {
    m = __int_as_float(0x7fffffff);
    return;
  }
  const float mm = fmaxf(m, om);
  if (mm == KF_NEG_INF) return;   // both empty: (-inf, 0)
  s = (m == KF_NEG_INF ? (kf_acc)0 : s * (kf_acc)expf(m - mm)) + (om == KF_NEG_INF ? (kf_acc)0 : os * (kf_acc)expf(om - mm));
  m = mm;
}
// The tile's element l of the thread's columns: from memory, kept in the shared copy `c` when
// it is not null (the raw bits: the copy is exact).
__device__ __forceinline__ void kf_read(const kf_t* __restrict__ p, kf_t* c, float (&v)[KF_VEC]) {
  const kf_vec<KF_VEC> r = *reinterpret_cast<const kf_vec<KF_VEC>*>(p);
  if (c != nullptr) *reinterpret_cast<kf_vec<KF_VEC>*>(c) = r;
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) v[k] = kf_to_float(r.v[k]);
}
// The written values, in place: r is 1 / sum (softmax; 0 for a column _safe_softmax zeroes) or
// log(sum) (log_softmax), NaN for a NaN column.
__device__ __forceinline__ void kf_normalize(float (&v)[KF_VEC], const float (&m)[KF_VEC], const float (&r)[KF_VEC]) {
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
#if KF_LOG
    v[k] = (v[k] - m[k]) - r[k];
#else
    v[k] = r[k] != r[k] ? r[k] : (r[k] == 0.0f ? 0.0f : kf_exp_shifted(v[k], m[k]) * r[k]);
#endif
  }
}
// The second pass: the thread's columns [lb, le) written, normalized by (m, s) (Note [Column
// merge]), read back from the copy kc when there is one, else from x.
__device__ __forceinline__ void kf_dim_write(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 base, kf_i64 inner,
                                             kf_i64 lb, kf_i64 le, int ty, const kf_t* kc, const float (&m)[KF_VEC],
                                             const kf_acc (&s)[KF_VEC]) {
  // A column of -inf only: softmax and log_softmax give NaN (-inf - -inf), _safe_softmax 0.
  float r[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    const bool nan = m[k] != m[k] || (!KF_SAFE && m[k] == KF_NEG_INF);
#if KF_LOG
    r[k] = nan ? __int_as_float(0x7fffffff) : (float)kf_log(s[k]);
#else
    r[k] = nan ? __int_as_float(0x7fffffff) : (m[k] == KF_NEG_INF ? 0.0f : (float)((kf_acc)1 / s[k]));
#endif
  }
  // The thread reads back only what it copied itself: no barrier is needed for the copy.
  kf_i64 l = lb + ty;
  for (; l + (KF_U - 1) * KF_SPLIT < le; l += KF_U * KF_SPLIT) {
    float v[KF_U][KF_VEC];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
      if (kc != nullptr) kf_load<KF_VEC>(kc + (l + u * KF_SPLIT) * KF_TILE, 0, v[u]);
      else kf_load<KF_VEC>(x + base + (l + u * KF_SPLIT) * inner, 0, v[u]);
    }
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
      kf_normalize(v[u], m, r);
      kf_store<KF_VEC>(y + base + (l + u * KF_SPLIT) * inner, 0, v[u]);
    }
  }
  for (; l < le; l += KF_SPLIT) {
    float v[KF_VEC];
    if (kc != nullptr) kf_load<KF_VEC>(kc + l * KF_TILE, 0, v);
    else kf_load<KF_VEC>(x + base + l * inner, 0, v);
    kf_normalize(v, m, r);
    kf_store<KF_VEC>(y + base + l * inner, 0, v);
  }
}
// Note [Clustered columns]: with KF_CLUSTER > 1 a tile's len rows are KF_CLUSTER chunks, one block
// each, the blocks of a tile one cluster (rank = blockIdx.x % KF_CLUSTER); each block handles rows
// [lb, le) of its columns.
#if KF_CLUSTER > 1
#define KF_CLUSTER_DIMS __cluster_dims__(KF_CLUSTER, 1, 1)
#else
#define KF_CLUSTER_DIMS
#endif
extern "C" __global__ void KF_CLUSTER_DIMS __launch_bounds__(KF_BLOCK)
kf_dim_softmax(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 len, kf_i64 inner, kf_i64 tiles, kf_i64 cached) {
  __shared__ float sm_max[KF_PARTS][KF_TILE];
  __shared__ kf_acc sm_sum[KF_PARTS][KF_TILE];
  const int tx = threadIdx.x % KF_TX, ty = threadIdx.x / KF_TX;
#if KF_CLUSTER > 1
  const kf_i64 tile_id = blockIdx.x / KF_CLUSTER;
  const kf_i64 chunk = (len + KF_CLUSTER - 1) / KF_CLUSTER;
  const kf_i64 rank = blockIdx.x % KF_CLUSTER;
  const kf_i64 lb = rank * chunk < len ? rank * chunk : len;
  const kf_i64 le = lb + chunk < len ? lb + chunk : len;
#else
  const kf_i64 tile_id = blockIdx.x, lb = 0, le = len;
#endif
  const kf_i64 o = tile_id / tiles;
  const kf_i64 c0 = (tile_id - o * tiles) * KF_TILE + (kf_i64)tx * KF_VEC;   // inner % KF_VEC == 0
  const bool live = c0 < inner;
  const kf_i64 base = o * len * inner + c0;   // element (o, 0, c0); a multiple of KF_VEC
#if KF_CACHE
  // Element l of the thread's columns in the copy: a row of KF_TILE per l, from lb.
  kf_t* const kc = cached != 0 ? reinterpret_cast<kf_t*>(kf_smem) + tx * KF_VEC - lb * KF_TILE : nullptr;
#else
  kf_t* const kc = nullptr;
#endif
  // Running max and sum of exp(v - max) per column (kf_online).
  float m[KF_VEC];
  kf_acc s[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) m[k] = KF_NEG_INF, s[k] = 0;
  if (live) {
    // KF_U accesses issued before any is used: enough bytes in flight per thread to cover the
    // memory latency with the few threads a column split leaves.
    kf_i64 l = lb + ty;
    for (; l + (KF_U - 1) * KF_SPLIT < le; l += KF_U * KF_SPLIT) {
      float v[KF_U][KF_VEC];
#pragma unroll
      for (int u = 0; u < KF_U; ++u) {
        kf_read(x + base + (l + u * KF_SPLIT) * inner, kc != nullptr ? kc + (l + u * KF_SPLIT) * KF_TILE : nullptr, v[u]);
      }
#pragma unroll
      for (int u = 0; u < KF_U; ++u) kf_online(m, s, v[u]);
    }
    for (; l < le; l += KF_SPLIT) {
      float v[KF_VEC];
      kf_read(x + base + l * inner, kc != nullptr ? kc + l * KF_TILE : nullptr, v);
      kf_online(m, s, v);
    }
  }
  // Note [Column merge]: the lanes of a warp that share a column merge by shuffles (in a fixed
  // tree, so every run gives the same bits), each warp's first writes its partial, and the
  // partials merge in a tree over shared memory into row 0, which every thread of the column reads.
#pragma unroll
  for (int w = 16; w >= KF_TX; w >>= 1) {
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const float om = __shfl_xor_sync(0xffffffffu, m[k], w);
      const kf_acc os = __shfl_xor_sync(0xffffffffu, s[k], w);
      kf_merge(m[k], s[k], om, os);
    }
  }
  const int part = ty / KF_W;
  const bool lead = ty % KF_W == 0;
  if (lead) {
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      sm_max[part][tx * KF_VEC + k] = m[k];
      sm_sum[part][tx * KF_VEC + k] = s[k];
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int st = KF_PARTS / 2; st > 0; st >>= 1) {
    if (lead && part < st) {
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
        const int c = tx * KF_VEC + k;
        kf_merge(m[k], s[k], sm_max[part + st][c], sm_sum[part + st][c]);
        sm_max[part][c] = m[k];
        sm_sum[part][c] = s[k];
      }
    }
    __syncthreads();
  }
#if KF_CLUSTER > 1
  // Note [Clustered columns]: every block's column partials (row 0 of its tree) merged in rank
  // order, so every block of the tile gets the same bits.
  __shared__ float cl_max[KF_TILE];
  __shared__ kf_acc cl_sum[KF_TILE];
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  for (int c = threadIdx.x; c < KF_TILE; c += KF_BLOCK) {
    float mm = KF_NEG_INF;
    kf_acc ss = 0;
    for (int q = 0; q < KF_CLUSTER; ++q) kf_merge(mm, ss, kf_cluster_ld(&sm_max[0][c], q), kf_cluster_ld(&sm_sum[0][c], q));
    cl_max[c] = mm;
    cl_sum[c] = ss;
  }
  // Done reading the others' shared memory; the wait at the end keeps this block's until they are.
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  __syncthreads();
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    m[k] = cl_max[tx * KF_VEC + k];
    s[k] = cl_sum[tx * KF_VEC + k];
  }
#else
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    m[k] = sm_max[0][tx * KF_VEC + k];
    s[k] = sm_sum[0][tx * KF_VEC + k];
  }
#endif
  if (live) kf_dim_write(x, y, base, inner, lb, le, ty, kc, m, s);
#if KF_CLUSTER > 1
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
)kf";


const char* const kCpuDimSoftmax = R"kf(
// KF_LOG, KF_SAFE as the CUDA kernel's. One block per outer index; its inner columns in chunks
// of KF_CHUNK, each pass over len running across the chunk's columns.
static inline float kf_exp_shifted(float x, float m) {
#if KF_SAFE
  return x == -INFINITY ? 0.0f : expf(x - m);
#else
  return expf(x - m);
#endif
}
extern "C" void kf_dim_softmax(const kforge_cpu_block* b, void* const* p) {
  const float* x = KF_PTR(const float, 0);
  float* y = KF_PTR(float, 1);
  const int64_t len = KF_I64(2), inner = KF_I64(3);
  const int64_t o = (int64_t)b->block_idx[0];
  for (int64_t c0 = 0; c0 < inner; c0 += KF_CHUNK) {
    const int64_t n = inner - c0 < KF_CHUNK ? inner - c0 : KF_CHUNK;
    const float* __restrict__ xs = x + o * len * inner + c0;
    float* __restrict__ ys = y + o * len * inner + c0;
    float m[KF_CHUNK];
    double s[KF_CHUNK];
    for (int64_t k = 0; k < n; ++k) m[k] = -INFINITY, s[k] = 0;
    for (int64_t l = 0; l < len; ++l) {
      for (int64_t k = 0; k < n; ++k) {
        const float v = xs[l * inner + k];
        m[k] = (v != v || m[k] != m[k]) ? (m[k] != m[k] ? m[k] : v) : (v > m[k] ? v : m[k]);
      }
    }
    for (int64_t l = 0; l < len; ++l) {
      for (int64_t k = 0; k < n; ++k) s[k] += (double)kf_exp_shifted(xs[l * inner + k], m[k]);
    }
    for (int64_t k = 0; k < n; ++k) {
#if KF_LOG
      s[k] = log(s[k]);
#else
      s[k] = 1.0 / s[k];
#endif
    }
    for (int64_t l = 0; l < len; ++l) {
      for (int64_t k = 0; k < n; ++k) {
        const float v = xs[l * inner + k];
#if KF_SAFE
        if (m[k] == -INFINITY) {   // every element -inf (Note [Safe softmax] in row_softmax.cc)
          ys[l * inner + k] = 0.0f;
          continue;
        }
#endif
#if KF_LOG
        ys[l * inner + k] = (float)(((double)v - m[k]) - s[k]);
#else
        ys[l * inner + k] = (float)((double)kf_exp_shifted(v, m[k]) * s[k]);
#endif
      }
    }
  }
}
)kf";

// The normalized dimension of a signature these families take, or -1: inner 1 is a last-dimension
// softmax in all but name (row_softmax.cc's).
int64_t softmax_dim(const OpSignature& sig, Softmax kind, Backend backend) {
  const int64_t d = softmax_call_dim(sig, kind, backend);
  return d >= 0 && split_at_dim(*tensor_arg(sig, 0), d).inner_size > 1 ? d : -1;
}

// ---- CUDA ------------------------------------------------------------------------------------------

// Note [Split columns]: the knobs are the block, how many threads share a column (split), how
// many neighbouring columns a thread takes in one access (vec), and whether the second pass reads
// a shared-memory copy (cache). Few columns and long ones (a softmax over the channels of a small
// batch, over 4096 positions of 64 x 512) leave one thread per column with too little parallelism
// to cover the memory latency: splitting each column over threads brings the whole GPU in, at the
// price of one merge per block (Note [Column merge]).
//
// Note [Cached columns]
// ~~~~~~~~~~~~~~~~~~~~~
// Without `cache` every element is read twice: from L2 when the tensor fits there, else from
// memory, a third more traffic than the read and the write a softmax needs (softmax over dim 1 of
// [64, 4096, 512] bf16 moves 805 MB instead of 537). With `cache` the first pass also copies the
// block's tile, len x tile elements, into dynamic shared memory, and the second reads the copy.
// Tiles of 8 bf16 columns (16 bytes a row) and 4096 rows take 64 KiB: three blocks of 512 threads
// per SM. A spec resolved for a longer len than the copy can hold streams instead (its `cached`
// argument is 0, and it asks for no shared memory).
//
// Note [Dim softmax priors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// What the prior knows, from the H100's whole space for softmax over dim 1 of bf16 [64, 4096, 512]
// (182 configurations, bench/results/2026-12-07-h100-landscape-softmax-5936214.tsv):
// - Each of a thread's `vec` columns keeps a running max and sum in registers, beside the 16
//   elements in flight. 8 bf16 columns (a 16-byte access) take 56-59 registers on sm_90, about half
//   an SM's 2048 threads; 4 take 40 (1536), 2 take 32 (all). With two exponentials an element the
//   kernel needs those warps: the widest access the prior aims at is 8 bytes (kStateVecBytes). Streamed, at every tile
//   row width from 32 bytes up the best vec 8 configuration was the slowest width's best (overall
//   13.5x PyTorch's kernel; vec 2 15.75x, vec 4 14.7x).
// - A tile row under a 32-byte sector wastes the rest of it, as in cumsum_split (sector weight
//   1.5): streamed, 16-byte rows reached 7.1x, 32-byte ones 14.4x.
// - The copy holds len elements of each tile column: for 4096 of them a sector-wide tile row takes
//   128 KiB, one block (at most 512 threads) per SM, and a 16-byte row half a sector. It saves one
//   pass of the three a streamed kernel makes over memory (2/3 for streaming past L2, not 1/2), and
//   costs the resident threads or the sectors: the cached configurations reached 10.0x, the
//   streamed 15.75x; with block 512, 32-byte tile rows and vec 1 to 4, 9.0-9.6x cached against
//   13.4-14.4x streamed (cumsum_split's lighter scan, at one block per SM, gains from its copy).
// - Clusters (softmax_dim_cluster, Note [Clustered columns]) read the tensor from memory once too,
//   with sector-wide tile rows, and still lose to streaming: on the same shape the whole space
//   (380 configurations, bench/results/2026-12-07-h100-landscape-d1-5ffbe2e.tsv) gave clusters
//   12.85x at best, streamed kernels 15.7x (block 512, split 16, vec 2: 320 us, 56% of the copy
//   bandwidth for the 537 MB a softmax must move). Why the clusters lose is not profiled: part of
//   the streamed kernel's second read may come from L2, and a cluster's blocks wait at its barrier
//   and exchange. Their prior is weighted below the streamed kernels' (kClusterWeight), which the
//   search still tries: ranked above them, MCTS and greedy spent 16 evaluations among the clusters
//   and stayed at 12.1x.
class DimSoftmaxCuda final : public FamilyBase {
 public:
  enum : size_t { kBlock, kSplit, kVec, kCache };
  // The widest access the prior aims at (Note [Dim softmax priors]).
  static constexpr int64_t kStateVecBytes = 8;

  explicit DimSoftmaxCuda(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCuda, "_dim"), Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"split", {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cache", {0, 1}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_dim(sig, kind_, Backend::kCuda) >= 0; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    const int64_t block = v[kBlock], split = v[kSplit], vec = v[kVec];
    if (split > block) return false;
    if (e.inner_size % vec != 0 || !vector_fits(sig, vec)) return false;
    if (split > std::max<int64_t>(1, pow2_ceil(e.len_size))) return false;   // threads with no element
    const int64_t tile = block / split * vec;
    if (tile > std::max(vec, pow2_ceil(e.inner_size))) return false;   // no tile mostly past the last column
    if (static_bytes(sig, v) > 48 * 1024) return false;
    return v[kCache] == 0 || column_copy_bytes(sig, e, v) + static_bytes(sig, v) <= kCudaSharedBudget;
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    const bool large = columns_past_l2(sig, e);
    // Note [Dim softmax priors]
    if (v[kCache] == 0) {
      // Columns of at least 8 elements per thread; the copy, where it fits, saves a large tensor's
      // second read from memory: one pass of three.
      const bool copy_fits = e.len_size * 16 + 1024 <= kCudaSharedBudget / 2;
      return split_columns_prior(sig, e, v, 1, 32, 8, kStateVecBytes) * (large && copy_fits ? 2.0 / 3.0 : 1.0);
    }
    return cached_columns_prior(sig, e, v, static_bytes(sig, v), 16, 1.5, kStateVecBytes) * (large ? 1.0 : 0.6);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = shape(sig);
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_SPLIT", v[kSplit]),
                                        define("KF_VEC", v[kVec]), define("KF_CACHE", v[kCache])};
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaDimSoftmax, "kf_dim_softmax", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    split_columns_launch(e, v, l);
    cached_columns_launch(sig, e, v, static_bytes(sig, v), l);
    return s;
  }

 private:
  DimSplit shape(const OpSignature& sig) const { return split_at_dim(*tensor_arg(sig, 0), softmax_dim(sig, kind_, Backend::kCuda)); }

  // The kernel's static shared memory: KF_PARTS x KF_TILE maxima (float) and sums (kf_acc).
  static int64_t static_bytes(const OpSignature& sig, std::span<const int64_t> v) {
    return column_parts_bytes(v, 4 + (dtype_size_bytes(tensor_arg(sig, 0)->dtype) == 4 ? 8 : 4));
  }

  Softmax kind_;
};

// Note [Clustered columns]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The one-block families read a tile either twice from memory (streamed: 805 MB moved for 537 over
// dim 1 of bf16 [64, 4096, 512], 50% of the H100's copy bandwidth at best) or once into a copy that
// holds all len rows of the tile, which for 4096 rows leaves a 32-byte tile row one block per SM or
// a 16-byte row half a sector (Note [Dim softmax priors]). softmax_dim_cluster splits a tile's len
// rows over a cluster of `cluster` blocks (sm_90, at most 8): each block copies only its chunk of
// rows (4096 / 8 rows of 64 columns is 64 KiB in bf16), so tile rows can span whole sectors (128
// bytes) and the tensor is read from memory once. The blocks' column partials (max, sum) are merged
// through distributed shared memory in rank order, so every block of a tile normalizes by the same
// bits, and each writes its chunk from its copy.
class DimSoftmaxClusterCuda final : public FamilyBase {
 public:
  enum : size_t { kBlock, kSplit, kVec, kCluster };
  explicit DimSoftmaxClusterCuda(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCuda, "_dim_cluster"), Backend::kCuda,
                   {Knob{"block", {128, 256, 512}, {}}, Knob{"split", {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cluster", {2, 4, 8}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_dim(sig, kind_, Backend::kCuda) >= 0 && has_clusters(sig); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    // Threads with no element: a split past the chunk's power of two.
    return clustered_columns_valid(sig, e, v, entry_bytes(sig), std::max<int64_t>(1, pow2_ceil(clustered_chunk(e, v))));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    // The widest access up to kStateVecBytes; below the streamed kernels (Note [Dim softmax priors]).
    return clustered_columns_prior(sig, shape(sig), v, static_bytes(sig, v), 8, DimSoftmaxCuda::kStateVecBytes) *
           kClusterWeight;
  }

  // Measured on the H100 (Note [Dim softmax priors]): the best cluster 0.82x the best streamed kernel.
  static constexpr double kClusterWeight = 0.5;

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = shape(sig);
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_SPLIT", v[kSplit]),
                                        define("KF_VEC", v[kVec]), define("KF_CACHE", 1), define("KF_CLUSTER", v[kCluster])};
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaClusterShared + kCudaDimSoftmax,
                                   "kf_dim_softmax", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    split_columns_launch(e, v, l);
    clustered_columns_launch(sig, e, v, l);
    return s;
  }

 private:
  DimSplit shape(const OpSignature& sig) const { return split_at_dim(*tensor_arg(sig, 0), softmax_dim(sig, kind_, Backend::kCuda)); }
  // A column's (max, sum): float and kf_acc.
  static int64_t entry_bytes(const OpSignature& sig) { return 4 + (dtype_size_bytes(tensor_arg(sig, 0)->dtype) == 4 ? 8 : 4); }
  static int64_t static_bytes(const OpSignature& sig, std::span<const int64_t> v) {
    return clustered_static_bytes(v, entry_bytes(sig));
  }

  Softmax kind_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class DimSoftmaxCpu final : public FamilyBase {
 public:
  explicit DimSoftmaxCpu(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCpu, "_dim"), Backend::kCpu, {Knob{"chunk", {8, 16, 32, 64, 128}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_dim(sig, kind_, Backend::kCpu) >= 0; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t inner = split_at_dim(*tensor_arg(sig, 0), softmax_dim(sig, kind_, Backend::kCpu)).inner_size;
    return v[0] <= std::max<int64_t>(8, pow2_ceil(inner));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[0]), 32, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, softmax_dim(sig, kind_, Backend::kCpu));
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_CHUNK", v[0]));
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuDimSoftmax, "kf_dim_softmax", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = e.outer;
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(e.len), ArgBinding::size(e.inner)};
    return s;
  }

 private:
  Softmax kind_;
};

}  // namespace

// "softmax_dim", "log_softmax_dim", "safe_softmax_dim", their "_cluster" variants (sm_90) and their
// "cpu." twins.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kSafe); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxClusterCuda>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxClusterCuda>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxClusterCuda>(Softmax::kSafe); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kSafe); },
};

}  // namespace kforge::search::templates

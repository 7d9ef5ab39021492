// aten::cumsum (dtype None) of a contiguous input along any dimension: the input seen as
// [outer, len, inner] (inner = the product of the sizes after dim, 1 for the last dimension), each
// of the outer * inner columns summed cumulatively over its len elements, inner apart.
//
// One column per CUDA thread (neighbouring threads on neighbouring columns, so for inner > 1 each
// step reads one coalesced row of the [len, inner] slice; for the last dimension each thread walks
// its own row), a column cut into segments over a block's threads (cumsum_split, inner > 1: Note
// [Split scan]), or per CPU inner loop, the running sum in kf_acc (double for float32, float for
// 16-bit data) and each prefix rounded to the dtype on its own: never a sum of rounded prefixes.
// PyTorch's CPU kernel accumulates float32 in double too, so these prefixes are at least as close
// to the float64 reference as PyTorch's.
//
// Note [float16 cumsum on CUDA]
// PyTorch's CUDA scan keeps partial sums in the data type, so float16 partial sums of large
// values overflow to inf where the prefix itself is finite: on an H100, cumsum of float16 [7, 1001]
// from the worker's "large" trial, PyTorch gave inf at [0, 603] where the float64 prefix (and
// this kernel's float one) is 6.39e4 (bundle 61f8b86, the CUDA template run). The worker requires
// PyTorch's Inf positions, and where those come from depends on PyTorch's scan order, so the CUDA
// family refuses float16 (bfloat16's range does not overflow so; float32 partial sums are kept in
// float32 by PyTorch).
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaCumsum = R"kf(
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_cumsum(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 columns, kf_i64 len, kf_i64 inner) {
  const kf_i64 t = (kf_i64)blockIdx.x * KF_BLOCK + threadIdx.x;
  if (t >= columns) return;
  const kf_i64 o = t / inner;
  const kf_i64 base = o * len * inner + (t - o * inner);
  kf_acc s = 0;
  for (kf_i64 l = 0; l < len; ++l) {
    s += (kf_acc)kf_to_float(x[base + l * inner]);
    y[base + l * inner] = kf_from_float((float)s);
  }
}
)kf";

// Note [Split scan]
// ~~~~~~~~~~~~~~~~~
// One thread per column leaves a cumsum over dimension 1 of [64, 4096, 512] with 32,768 threads,
// each waiting on 4096 dependent loads: a quarter of what the GPU needs in flight. cumsum_split
// gives a block a tile of KF_TX * KF_VEC neighbouring columns (thread x: KF_VEC of them, one
// access) and cuts each column's len elements into KF_SPLIT segments (thread y: segment y). A
// thread sums its segment; the segment sums before each one are added up by a scan (shuffles
// between a warp's threads of a column, then the warps' totals in shared memory); the thread walks
// its segment again from that offset, writing each prefix rounded on its own. Every load of a
// segment is independent of the sums, so KF_U of them go out together. Without `cache` that is two
// reads and one write of memory; with it (Note [Cached columns] in dim_softmax.cc) the first walk
// copies the tile into shared memory and the second reads the copy: one read and one write. The
// prefixes are sums in kf_acc in another order than the one-thread walk (segment sums, then the
// running sum), as accurate.
const char* const kCudaCumsumSplit = R"kf(
#define KF_TX (KF_BLOCK / KF_SPLIT)
#define KF_TILE (KF_TX * KF_VEC)
#define KF_U (16 / KF_VEC > 2 ? 16 / KF_VEC : 2)   // accesses in flight per thread
// A warp's threads of one column (lanes KF_TX apart) scan by shuffles; KF_PARTS warp totals per
// column then go through shared memory.
#define KF_W (KF_TX >= 32 ? 1 : 32 / KF_TX)
#define KF_PARTS (KF_SPLIT / KF_W)
#if KF_CACHE
extern __shared__ __align__(16) unsigned char kf_smem[];
#endif
// One vector of the thread's columns, element i (in vectors) of xs, its raw bits also put at
// element ci of cs when cs is not null.
__device__ __forceinline__ void kf_take(const kf_t* __restrict__ xs, kf_i64 i, kf_t* cs, kf_i64 ci, float (&v)[KF_VEC]) {
  const kf_vec<KF_VEC> r = reinterpret_cast<const kf_vec<KF_VEC>*>(xs)[i];
  if (cs != nullptr) reinterpret_cast<kf_vec<KF_VEC>*>(cs)[ci] = r;
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) v[k] = kf_to_float(r.v[k]);
}
// Adds the elements l0..l1-1 of the thread's KF_VEC columns (xs, xstep vectors apart) to s,
// KF_U accesses at a time. With WRITE, stores each prefix (rounded on its own) at its element of
// ys (ystep apart); without, ys is the copy the elements go to, or null.
template <bool WRITE>
__device__ __forceinline__ void kf_walk(const kf_t* __restrict__ xs, kf_i64 xstep, kf_t* ys, kf_i64 ystep, kf_i64 l0,
                                        kf_i64 l1, kf_acc (&s)[KF_VEC]) {
  kf_t* const copy = WRITE ? nullptr : ys;
  kf_i64 l = l0;
  for (; l + KF_U <= l1; l += KF_U) {
    float v[KF_U][KF_VEC];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) kf_take(xs, (l + u) * xstep, copy, (l + u) * ystep, v[u]);
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
        s[k] += (kf_acc)v[u][k];
        v[u][k] = (float)s[k];
      }
      if constexpr (WRITE) kf_store<KF_VEC>(ys, (l + u) * ystep, v[u]);
    }
  }
  for (; l < l1; ++l) {
    float v[KF_VEC];
    kf_take(xs, l * xstep, copy, l * ystep, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      s[k] += (kf_acc)v[k];
      v[k] = (float)s[k];
    }
    if constexpr (WRITE) kf_store<KF_VEC>(ys, l * ystep, v);
  }
}
// Note [Clustered scan]: with KF_CLUSTER > 1 a tile's len rows are KF_CLUSTER chunks, one block
// each, the blocks of a tile one cluster (rank = blockIdx.x % KF_CLUSTER); block rank r scans rows
// [lb, le) and adds the totals of the chunks before it.
#if KF_CLUSTER > 1
#define KF_CLUSTER_DIMS __cluster_dims__(KF_CLUSTER, 1, 1)
#else
#define KF_CLUSTER_DIMS
#endif
extern "C" __global__ void KF_CLUSTER_DIMS __launch_bounds__(KF_BLOCK)
kf_cumsum_split(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 len, kf_i64 inner, kf_i64 tiles, kf_i64 cached) {
  __shared__ kf_acc part[KF_PARTS][KF_TILE];
  const int tx = threadIdx.x % KF_TX, ty = threadIdx.x / KF_TX, lane = threadIdx.x % 32;
#if KF_CLUSTER > 1
  const kf_i64 tile_id = blockIdx.x / KF_CLUSTER;
  const kf_i64 chunk = (len + KF_CLUSTER - 1) / KF_CLUSTER;
  const int rank = (int)(blockIdx.x % KF_CLUSTER);
  const kf_i64 lb = rank * chunk < len ? rank * chunk : len;
  const kf_i64 le = lb + chunk < len ? lb + chunk : len;
#else
  const kf_i64 tile_id = blockIdx.x, lb = 0, le = len;
#endif
  const kf_i64 o = tile_id / tiles;
  const kf_i64 c0 = (tile_id - o * tiles) * KF_TILE + (kf_i64)tx * KF_VEC;   // inner % KF_VEC == 0
  const bool live = c0 < inner;
  const kf_i64 seg = (le - lb + KF_SPLIT - 1) / KF_SPLIT;
  const kf_i64 l0 = lb + ty * seg < le ? lb + ty * seg : le;
  const kf_i64 l1 = l0 + seg < le ? l0 + seg : le;
  const kf_i64 base = o * len * inner + c0;   // a multiple of KF_VEC
  const kf_t* __restrict__ xs = x + base;
  kf_t* __restrict__ ys = y + base;
  const kf_i64 step = inner / KF_VEC;   // vectors from one element of the column to the next
#if KF_CACHE
  // The copy: a row of KF_TILE elements per element of the columns (KF_TX vectors apart), from lb.
  kf_t* const kc = cached != 0 ? reinterpret_cast<kf_t*>(kf_smem) + tx * KF_VEC - lb * KF_TILE : nullptr;
#else
  kf_t* const kc = nullptr;
#endif
  kf_acc s[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) s[k] = 0;
  if (live) kf_walk<false>(xs, step, kc, KF_TX, l0, l1, s);   // the segment's sum (and the copy)
  // The sums of the segments before the thread's: an inclusive scan over the warp's threads of the
  // column, the warp totals of the warps before, and the inclusive scan one thread back.
  kf_acc incl[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) incl[k] = s[k];
#pragma unroll
  for (int w = KF_TX; w < 32; w <<= 1) {
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const kf_acc up = __shfl_up_sync(0xffffffffu, incl[k], w);
      if (lane >= w) incl[k] += up;
    }
  }
  const int wpart = ty / KF_W;
  if (ty % KF_W == KF_W - 1) {
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) part[wpart][tx * KF_VEC + k] = incl[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    kf_acc before = 0;
    for (int q = 0; q < wpart; ++q) before += part[q][tx * KF_VEC + k];
    kf_acc excl = KF_TX < 32 ? __shfl_up_sync(0xffffffffu, incl[k], KF_TX < 32 ? KF_TX : 1) : (kf_acc)0;
    if (ty % KF_W == 0) excl = 0;
    s[k] = before + excl;
  }
#if KF_CLUSTER > 1
  // Note [Clustered scan]: the block's column totals (every warp part), then the totals of the
  // blocks before this one, added in rank order (every block of a tile adds the same bits for a
  // rank), read through distributed shared memory.
  __shared__ kf_acc total[KF_TILE];
  for (int c = threadIdx.x; c < KF_TILE; c += KF_BLOCK) {
    kf_acc t = 0;
    for (int q = 0; q < KF_PARTS; ++q) t += part[q][c];
    total[c] = t;
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) {
    kf_acc before = 0;
    for (int r = 0; r < rank; ++r) before += kf_cluster_ld(&total[tx * KF_VEC + k], r);
    s[k] += before;
  }
  // Done reading the others' shared memory; the wait at the end keeps this block's until they are.
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
  if (live) {
    if (kc != nullptr) kf_walk<true>(kc, KF_TX, ys, step, l0, l1, s);   // from the copy, the prefixes
    else kf_walk<true>(xs, step, ys, step, l0, l1, s);
  }
#if KF_CLUSTER > 1
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
)kf";

const char* const kCpuCumsum = R"kf(
// One block per outer index; its inner columns in chunks of KF_CHUNK, each step over len running
// across the chunk (for the last dimension, inner = 1: one row per block).
extern "C" void kf_cumsum(const kforge_cpu_block* b, void* const* p) {
  const float* x = KF_PTR(const float, 0);
  float* y = KF_PTR(float, 1);
  const int64_t len = KF_I64(2), inner = KF_I64(3);
  const int64_t o = (int64_t)b->block_idx[0];
  for (int64_t c0 = 0; c0 < inner; c0 += KF_CHUNK) {
    const int64_t n = inner - c0 < KF_CHUNK ? inner - c0 : KF_CHUNK;
    const float* __restrict__ xs = x + o * len * inner + c0;
    float* __restrict__ ys = y + o * len * inner + c0;
    double s[KF_CHUNK];
    for (int64_t k = 0; k < n; ++k) s[k] = 0;
    for (int64_t l = 0; l < len; ++l) {
      for (int64_t k = 0; k < n; ++k) {
        s[k] += (double)xs[l * inner + k];
        ys[l * inner + k] = (float)s[k];
      }
    }
  }
}
)kf";

// The summed dimension of a signature these families take, or -1.
int64_t cumsum_dim(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::cumsum" || !sig.overload.empty() || sig.args.size() != 3) return -1;
  const TensorMeta* x = tensor_arg(sig, 0);
  const int64_t* dim = int_arg(sig, 1);
  if (!template_tensor(x, backend) || dim == nullptr || !is_none(sig, 2)) return -1;   // dtype= changes the result type
  const auto rank = static_cast<int64_t>(x->sizes.size());
  if (rank == 0 || *dim < -rank || *dim >= rank) return -1;
  return *dim < 0 ? *dim + rank : *dim;
}

// ---- CUDA ------------------------------------------------------------------------------------------

class CumsumCuda final : public FamilyBase {
 public:
  CumsumCuda() : FamilyBase("cumsum", Backend::kCuda, {Knob{"block", {32, 64, 128, 256, 512}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    // Note [float16 cumsum on CUDA]
    return cumsum_dim(sig, Backend::kCuda) >= 0 && tensor_arg(sig, 0)->dtype != DType::kFloat16;
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return v[0] <= std::max<int64_t>(32, pow2_ceil(columns(sig)));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    // A thread per column: too few columns leave the GPU without the threads that cover its
    // latency (kCudaLatencyThreads), where cumsum_split cuts columns into segments (H100, bf16
    // [64,4096,512] over dim 1, 32,768 columns: 2.87x PyTorch's kernel here, 6.0-6.5x split;
    // bench/results/2026-12-07-h100-landscape-81bc259.tsv).
    return closeness(static_cast<double>(v[0]), 128, 0.3) *
           closeness(static_cast<double>(std::min(columns(sig), kCudaLatencyThreads)), static_cast<double>(kCudaLatencyThreads), 1.0);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, cumsum_dim(sig, Backend::kCuda));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaCumsum, "kf_cumsum",
                                   {dtype_define(x.dtype), define("KF_BLOCK", v[0])});
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    const std::string columns = "(" + e.outer + ") * (" + e.inner + ")";
    l.grid[0] = "ceil_div(" + columns + ", " + std::to_string(v[0]) + ")";
    l.block[0] = std::to_string(v[0]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(columns), ArgBinding::size(e.len),
              ArgBinding::size(e.inner)};
    return s;
  }

 private:
  // The columns scanned, one per thread (a dimension of size 0 counted as 1).
  static int64_t columns(const OpSignature& sig) {
    const TensorMeta& x = *tensor_arg(sig, 0);
    return x.numel() / std::max<int64_t>(1, x.sizes[static_cast<size_t>(cumsum_dim(sig, Backend::kCuda))]);
  }
};

// Note [Split scan]: columns (inner > 1) in tiles, each column in segments, the tile copied to
// shared memory or not.
class CumsumSplitCuda final : public FamilyBase {
 public:
  enum : size_t { kBlock, kSplit, kVec, kCache };

  CumsumSplitCuda()
      : FamilyBase("cumsum_split", Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"split", {2, 4, 8, 16, 32, 64, 128, 256, 512}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cache", {0, 1}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    // Note [float16 cumsum on CUDA]
    const int64_t d = cumsum_dim(sig, Backend::kCuda);
    return d >= 0 && tensor_arg(sig, 0)->dtype != DType::kFloat16 && split_at_dim(*tensor_arg(sig, 0), d).inner_size > 1;
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    const int64_t block = v[kBlock], split = v[kSplit], vec = v[kVec];
    if (split > block) return false;
    if (e.inner_size % vec != 0 || !vector_fits(sig, vec)) return false;
    if (split > e.len_size) return false;                                          // threads with no segment
    if (block / split * vec > std::max(vec, pow2_ceil(e.inner_size))) return false;   // no tile mostly past the last column
    if (static_bytes(sig, v) > 48 * 1024) return false;
    return v[kCache] == 0 || column_copy_bytes(sig, e, v) + static_bytes(sig, v) <= kCudaSharedBudget;
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    const bool large = columns_past_l2(sig, e);
    if (v[kCache] == 0) {
      // At least two segments, of at least 16 elements; the copy, where it fits, saves a large
      // tensor's second read from memory.
      const bool copy_fits = e.len_size * 16 + 1024 <= kCudaSharedBudget / 2;
      return split_columns_prior(sig, e, v, 2, 64, 16) * (large && copy_fits ? 0.5 : 1.0);
    }
    // A tile row under a sector is costly here (H100, bf16 [64,4096,512] over dim 1: the copy with
    // 8-column tiles 1.9-2.5x PyTorch's kernel, with 16 columns 6.0-6.5x; the landscape file).
    return cached_columns_prior(sig, e, v, static_bytes(sig, v), 16, 1.5) * (large ? 1.0 : 0.6);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = shape(sig);
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaCumsumSplit, "kf_cumsum_split",
                                   {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_SPLIT", v[kSplit]),
                                    define("KF_VEC", v[kVec]), define("KF_CACHE", v[kCache])});
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    split_columns_launch(e, v, l);
    cached_columns_launch(sig, e, v, static_bytes(sig, v), l);
    return s;
  }

 private:
  static DimSplit shape(const OpSignature& sig) { return split_at_dim(*tensor_arg(sig, 0), cumsum_dim(sig, Backend::kCuda)); }
  // The kernel's static shared memory: KF_PARTS x KF_TILE warp totals (kf_acc).
  static int64_t static_bytes(const OpSignature& sig, std::span<const int64_t> v) {
    return column_parts_bytes(v, dtype_size_bytes(tensor_arg(sig, 0)->dtype) == 4 ? 8 : 4);
  }
};

// Note [Clustered scan]
// ~~~~~~~~~~~~~~~~~~~~~
// cumsum_split with the copy holds all len rows of its tile: for 4096 rows a 32-byte tile row is
// 128 KiB, one block per SM; a 16-byte row wastes half a sector (H100, bf16 [64,4096,512] over dim
// 1: 6.49x PyTorch at best, about 65% of the copy bandwidth, where issue 23 asks 10x, about 77% of
// the H200's). cumsum_cluster (sm_90) splits a tile's rows over a cluster of `cluster` blocks: each
// copies and scans only its chunk, the chunks' column totals are read through distributed shared
// memory and the totals of the chunks before a block's are added to its prefixes, in rank order.
// The tensor is read once and written once, with tile rows as wide as whole lines.
//
// Measured on the H100, the same shape's whole space (374 configurations, bench/results/
// 2026-12-07-h100-landscape-d1-5ffbe2e.tsv): the best is a cluster of 8, block 512, split 32 and
// 4-byte accesses (vec 2): 7.75x PyTorch, 82% of the speedup the copy bandwidth allows. At every
// tile width from 32 bytes up 4-byte accesses led (64-byte rows: vec 1 6.74x, 2 7.75x, 4 6.88x,
// 8 6.21x), so the prior aims at 4 bytes, not 16; ranked at 16 bytes, the prior's first
// configuration ran 3.72x and MCTS and greedy reached 5.9-6.0x in 8 evaluations.
class CumsumClusterCuda final : public FamilyBase {
 public:
  enum : size_t { kBlock, kSplit, kVec, kCluster };
  // The access width the prior aims at (Note [Clustered scan]).
  static constexpr int64_t kAccessBytes = 4;

  CumsumClusterCuda()
      : FamilyBase("cumsum_cluster", Backend::kCuda,
                   {Knob{"block", {128, 256, 512}, {}}, Knob{"split", {2, 4, 8, 16, 32, 64, 128, 256, 512}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cluster", {2, 4, 8}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    // Note [float16 cumsum on CUDA]
    const int64_t d = cumsum_dim(sig, Backend::kCuda);
    return d >= 0 && tensor_arg(sig, 0)->dtype != DType::kFloat16 && split_at_dim(*tensor_arg(sig, 0), d).inner_size > 1 &&
           has_clusters(sig);
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    return clustered_columns_valid(sig, e, v, entry_bytes(sig), clustered_chunk(e, v));   // no thread without a segment
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    return clustered_columns_prior(sig, shape(sig), v, static_bytes(sig, v), 16, kAccessBytes);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = shape(sig);
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaClusterShared + kCudaCumsumSplit,
                                   "kf_cumsum_split",
                                   {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_SPLIT", v[kSplit]),
                                    define("KF_VEC", v[kVec]), define("KF_CACHE", 1), define("KF_CLUSTER", v[kCluster])});
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    split_columns_launch(e, v, l);
    clustered_columns_launch(sig, e, v, l);
    return s;
  }

 private:
  static DimSplit shape(const OpSignature& sig) { return split_at_dim(*tensor_arg(sig, 0), cumsum_dim(sig, Backend::kCuda)); }
  // A column's total: kf_acc.
  static int64_t entry_bytes(const OpSignature& sig) { return dtype_size_bytes(tensor_arg(sig, 0)->dtype) == 4 ? 8 : 4; }
  static int64_t static_bytes(const OpSignature& sig, std::span<const int64_t> v) {
    return clustered_static_bytes(v, entry_bytes(sig));
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

class CumsumCpu final : public FamilyBase {
 public:
  CumsumCpu() : FamilyBase("cpu.cumsum", Backend::kCpu, {Knob{"chunk", {1, 8, 16, 32, 64, 128}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return cumsum_dim(sig, Backend::kCpu) >= 0; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t inner = split_at_dim(*tensor_arg(sig, 0), cumsum_dim(sig, Backend::kCpu)).inner_size;
    return inner == 1 ? v[0] == 1 : v[0] > 1 && v[0] <= std::max<int64_t>(8, pow2_ceil(inner));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return v[0] == 1 ? 1.0 : closeness(static_cast<double>(v[0]), 32, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, cumsum_dim(sig, Backend::kCpu));
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_CHUNK", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuCumsum, "kf_cumsum", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = e.outer;
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(e.len), ArgBinding::size(e.inner)};
    return s;
  }
};

}  // namespace

// "cumsum", "cumsum_split" and "cumsum_cluster" (CUDA) and "cpu.cumsum".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumSplitCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumClusterCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCpu>(); },
};

}  // namespace kforge::search::templates

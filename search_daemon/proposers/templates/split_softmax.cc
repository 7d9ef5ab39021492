// aten::_softmax, aten::_log_softmax and aten::_safe_softmax over a long last dimension (2048
// elements or more) on CUDA: a row over one block or several (Note [Split rows]), each block's part
// of the row read in 16-byte accesses whatever the row's alignment, and held in shared memory
// when it fits, so that a row is read from memory once. row_softmax.cc's families take the same
// signatures with a row per block or per warp, rows of a multiple of the vector width, and a
// register cache for short rows.
#include <algorithm>

#include "search_daemon/proposers/templates/softmax_call.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

// Note [Split rows]
// ~~~~~~~~~~~~~~~~~
// A row is split into `split` chunks of `chunk` elements (the row's length over split, rounded up
// to a multiple of 8; the last chunks may be short or empty), one block each. Few long rows (a
// 262,144-entry vocabulary for 8 sequences) leave most of the GPU idle with a block per row;
// splitting brings every SM in.
//   - split 1: one launch. The block finds the row's max and sum of exp(x - max), then writes.
//   - split > 1: two launches. The first writes each chunk's (max, sum) to a scratch buffer of
//     rows * split pairs; the second merges a row's pairs, every block in the same order (so every
//     chunk of a row is normalized by the same bits), and writes its chunk. The second reads the
//     chunk again: from L2 when the tensor fits there, else from memory.
//   - split > 1 with `cluster` (sm_90): one launch. A row's chunks are one thread block cluster;
//     each block puts its chunk's (max, sum) in its shared memory, reads every block's pair
//     through distributed shared memory after a cluster barrier, merges them in chunk order, and
//     writes its chunk (from its shared copy: the row is read from memory once). A second barrier,
//     waited on at the end, keeps every block's pair alive until the others have read it. Clusters
//     of up to 16 blocks, so a row has at most 16 chunks: 8 rows can then cover 128 SMs, where
//     the portable size (8) leaves 64 idle. Sizes over 8 are allowed when the kernel is loaded
//     (Note [Non-portable clusters] in cuda_launcher.cc); a device that cannot place them fails
//     the launch, and the candidate with it. Measured on an H100, the idle SMs were not what
//     limited 8 rows of 262,144 bf16: clusters of 16 ran 5.86-5.92x PyTorch's time, clusters of 8
//     up to 6.11x (bench/results/2026-12-07-h100-landscape-fd79d86.tsv), so the prior prefers 8.
// A configuration's source compiles only the entries its plan launches (#if on KF_SPLIT and
// KF_CLUSTER): the build is most of an evaluation's time, and emitting all four cost 2.5-3 times
// as long.
// With `cache` the chunk is copied into shared memory as it is read, and its max and sum come in
// two passes over that copy (the write of split 1 reads it too): one read of memory per chunk and
// exact two-pass arithmetic. Without it, or when the chunk does not fit, one online pass over
// memory (Note [Online softmax] in row_softmax.cc). A chunk all of whose elements are -inf has max
// -inf and sum 0 (or NaN if one is NaN), so it adds nothing when merged, and a row all -inf ends
// with sum 0: NaN for softmax, 0 for _safe_softmax (Note [Safe softmax]).
// Alignment: accesses are KF_VEC elements (up to 16 bytes) at addresses that are multiples of
// their size; the elements before the chunk's first such address and after its last whole vector
// go one per thread. A row of any length (50,257) at any storage offset gets the wide accesses. The
// shared copy keeps the chunk's alignment (its element 0 sits as far below a 16-byte boundary as
// in memory), and the output takes vectors where its chunk is aligned as the input's (always, for
// an aligned input and the fresh output), else single elements.
const char* const kCudaSplitSoftmax = R"kf(
#define KF_ESZ ((int)sizeof(kf_t))
#define KF_A (KF_VEC * KF_ESZ)
#define KF_U (KF_INFLIGHT / KF_A > 1 ? KF_INFLIGHT / KF_A : 1)   // accesses in flight per thread: KF_INFLIGHT bytes
extern __shared__ __align__(16) unsigned char kf_smem[];

// Elements before p's first KF_A-aligned address, at most n.
__device__ __forceinline__ kf_i64 kf_head(const void* p, kf_i64 n) {
  const int mis = (int)((unsigned long long)p % (unsigned long long)KF_A);
  const kf_i64 h = mis == 0 ? 0 : (KF_A - mis) / KF_ESZ;
  return h < n ? h : n;
}

// f(v) for every element of p[0, n) (in no particular order). With COPY, each element also lands
// at the same index of c, whose alignment is p's.
template <bool COPY, typename F>
__device__ __forceinline__ void kf_visit(const kf_t* p, kf_t* c, kf_i64 n, F f) {
  const kf_i64 h = kf_head(p, n);
  const kf_i64 nv = (n - h) / KF_VEC;
  const kf_i64 t = h + nv * KF_VEC;   // the tail's first element
  const int tid = threadIdx.x;
  if (tid < h) {
    const kf_t e = p[tid];
    if constexpr (COPY) c[tid] = e;
    f(kf_to_float(e));
  }
  if (tid < n - t) {
    const kf_t e = p[t + tid];
    if constexpr (COPY) c[t + tid] = e;
    f(kf_to_float(e));
  }
  const kf_vec<KF_VEC>* b = reinterpret_cast<const kf_vec<KF_VEC>*>(p + h);
  kf_i64 i = tid;
  for (; i + (KF_U - 1) * KF_BLOCK < nv; i += KF_U * KF_BLOCK) {
    kf_vec<KF_VEC> r[KF_U];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) r[u] = b[i + u * KF_BLOCK];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
      if constexpr (COPY) reinterpret_cast<kf_vec<KF_VEC>*>(c + h)[i + u * KF_BLOCK] = r[u];
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) f(kf_to_float(r[u].v[k]));
    }
  }
  for (; i < nv; i += KF_BLOCK) {
    const kf_vec<KF_VEC> r = b[i];
    if constexpr (COPY) reinterpret_cast<kf_vec<KF_VEC>*>(c + h)[i] = r;
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) f(kf_to_float(r.v[k]));
  }
}

// y[i] = g(p[i]) for i in [0, n).
template <typename G>
__device__ __forceinline__ void kf_write(const kf_t* p, kf_t* __restrict__ y, kf_i64 n, G g) {
  const kf_i64 h = kf_head(p, n);
  const int tid = threadIdx.x;
  if (kf_head(y, n) != h) {   // aligned differently: one element per access
    for (kf_i64 i = tid; i < n; i += KF_BLOCK) y[i] = kf_from_float(g(kf_to_float(p[i])));
    return;
  }
  const kf_i64 nv = (n - h) / KF_VEC;
  const kf_i64 t = h + nv * KF_VEC;
  if (tid < h) y[tid] = kf_from_float(g(kf_to_float(p[tid])));
  if (tid < n - t) y[t + tid] = kf_from_float(g(kf_to_float(p[t + tid])));
  kf_i64 i = tid;
  for (; i + (KF_U - 1) * KF_BLOCK < nv; i += KF_U * KF_BLOCK) {
    float v[KF_U][KF_VEC];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) kf_load<KF_VEC>(p + h, i + u * KF_BLOCK, v[u]);
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) v[u][k] = g(v[u][k]);
      kf_store<KF_VEC>(y + h, i + u * KF_BLOCK, v[u]);
    }
  }
  for (; i < nv; i += KF_BLOCK) {
    float v[KF_VEC];
    kf_load<KF_VEC>(p + h, i, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) v[k] = g(v[k]);
    kf_store<KF_VEC>(y + h, i, v);
  }
}

// Where the shared copy of a chunk starting at p goes: its first aligned element at byte 16.
__device__ __forceinline__ kf_t* kf_cache_for(const kf_t* p, kf_i64 n) {
  return reinterpret_cast<kf_t*>(kf_smem + 16) - kf_head(p, n);
}

// The max and sum of exp(x - max) of xc[0, n), on every thread of the block (Note [Split rows]).
__device__ __forceinline__ void kf_chunk_stats(const kf_t* xc, kf_i64 n, bool cached, float& m, kf_acc& s,
                                               float* red_m, kf_acc* red_s) {
  m = KF_NEG_INF;
  s = 0;
  if (cached) {
    kf_t* sm = kf_cache_for(xc, n);
    kf_visit<true>(xc, sm, n, [&](float v) { m = fmaxf(m, v); });
    m = kf_block_max(m, red_m);
    __syncthreads();   // the copy is whole
    const float mm = m;
    if (mm == KF_NEG_INF) {   // nothing to add; a NaN (which fmaxf skips) makes the sum NaN
      kf_visit<false>(sm, nullptr, n, [&](float v) { if (v != v) s = (kf_acc)v; });
    } else {
      kf_visit<false>(sm, nullptr, n, [&](float v) { s += (kf_acc)kf_exp_shifted(v, mm); });
    }
    s = kf_block_sum(s, red_s);
  } else {
    kf_visit<false>(xc, nullptr, n, [&](float v) { kf_online_add(m, s, v); });
    kf_row_online(m, s, red_m, red_s);
  }
}

// Writes yc[0, n) from the source p (the chunk in memory or its shared copy) and the row's (m, s).
__device__ __forceinline__ void kf_emit(const kf_t* p, kf_t* __restrict__ yc, kf_i64 n, float m, kf_acc s) {
  const float f = kf_finish(s);
  const bool dead = KF_SAFE && s == (kf_acc)0;   // every element -inf
  kf_write(p, yc, n, [&](float v) { return dead ? 0.0f : kf_out(v, m, f); });
}

// Note [Split rows]: only the entries this configuration launches are compiled.
#if KF_SPLIT == 1
// split 1: a row per block.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_split_whole(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 cols, kf_i64 cached) {
  __shared__ float red_m[32];
  __shared__ kf_acc red_s[32];
  const kf_t* xr = x + (kf_i64)blockIdx.x * cols;
  float m;
  kf_acc s;
  kf_chunk_stats(xr, cols, cached != 0, m, s, red_m, red_s);
  kf_emit(cached != 0 ? kf_cache_for(xr, cols) : xr, y + (kf_i64)blockIdx.x * cols, cols, m, s);
}
#endif

// Block b takes chunk b % KF_SPLIT of row b / KF_SPLIT: its first element and length.
__device__ __forceinline__ kf_i64 kf_chunk_of(kf_i64 cols, kf_i64 chunk, kf_i64& n) {
  const kf_i64 row = (kf_i64)blockIdx.x / KF_SPLIT;
  const kf_i64 c0 = ((kf_i64)blockIdx.x % KF_SPLIT) * chunk;
  n = cols - c0 < chunk ? cols - c0 : chunk;
  if (n < 0) n = 0;
  return row * cols + (n > 0 ? c0 : 0);
}

#if KF_SPLIT > 1 && !KF_CLUSTER
// split > 1, first launch: each chunk's (max, sum) into part[2 * block], part[2 * block + 1].
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_split_stats(const kf_t* __restrict__ x, double* __restrict__ part, kf_i64 cols, kf_i64 chunk, kf_i64 cached) {
  __shared__ float red_m[32];
  __shared__ kf_acc red_s[32];
  kf_i64 n;
  const kf_i64 at = kf_chunk_of(cols, chunk, n);
  float m;
  kf_acc s;
  kf_chunk_stats(x + at, n, cached != 0, m, s, red_m, red_s);
  if (threadIdx.x == 0) {
    part[2 * (kf_i64)blockIdx.x] = (double)m;
    part[2 * (kf_i64)blockIdx.x + 1] = (double)s;
  }
}

// split > 1, second launch: the row's pairs merged in chunk order, then the chunk written.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_split_write(const kf_t* __restrict__ x, kf_t* __restrict__ y, const double* __restrict__ part, kf_i64 cols,
               kf_i64 chunk) {
  kf_i64 n;
  const kf_i64 at = kf_chunk_of(cols, chunk, n);
  const double* rp = part + 2 * ((kf_i64)blockIdx.x / KF_SPLIT) * KF_SPLIT;
  float m = KF_NEG_INF;
  kf_acc s = 0;
  for (int q = 0; q < KF_SPLIT; ++q) kf_online_merge(m, s, (float)rp[2 * q], (kf_acc)rp[2 * q + 1]);
  kf_emit(x + at, y + at, n, m, s);
}
#endif

#if KF_CLUSTER
// Note [Split rows]: a row's KF_SPLIT chunks as one cluster; block rank q (blockIdx.x % KF_SPLIT,
// the cluster's ranks in a 1-D cluster) holds chunk q.
extern "C" __global__ void __cluster_dims__(KF_SPLIT, 1, 1) __launch_bounds__(KF_BLOCK)
kf_split_cluster(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 cols, kf_i64 chunk, kf_i64 cached) {
  __shared__ float red_m[32];
  __shared__ kf_acc red_s[32];
  __shared__ float part_m, all_m[KF_SPLIT];
  __shared__ kf_acc part_s, all_s[KF_SPLIT];
  kf_i64 n;
  const kf_i64 at = kf_chunk_of(cols, chunk, n);
  float m;
  kf_acc s;
  kf_chunk_stats(x + at, n, cached != 0, m, s, red_m, red_s);
  if (threadIdx.x == 0) {
    part_m = m;
    part_s = s;
  }
  // Every block's pair is written before any block reads one.
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x < KF_SPLIT) {
    all_m[threadIdx.x] = kf_cluster_ld(&part_m, threadIdx.x);
    all_s[threadIdx.x] = kf_cluster_ld(&part_s, threadIdx.x);
  }
  // This block is done reading the others' shared memory; it waits for them to be done with its
  // own before it exits (the wait below).
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  __syncthreads();
  float rm = KF_NEG_INF;
  kf_acc rs = 0;
  for (int q = 0; q < KF_SPLIT; ++q) kf_online_merge(rm, rs, all_m[q], all_s[q]);
  kf_emit(cached != 0 ? kf_cache_for(x + at, n) : x + at, y + at, n, rm, rs);
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif
)kf";

constexpr int64_t kSharedBudget = kCudaSharedBudget;
// At least a block for every SM of a 132-SM Hopper (H100, H200).
constexpr int64_t kTargetBlocks = 132;
// Shorter rows are row_softmax.cc's.
constexpr int64_t kMinCols = 2048;

enum SplitKnob : size_t { kSplit, kBlock, kVec, kCache, kCluster, kInflight };

// Clusters of thread blocks (Note [Split rows]) from sm_90 on, of at most 16 blocks (the most an
// sm_90 part takes, opted in where the kernel is loaded); the prior's ideal is at most 8.
constexpr int64_t kMaxCluster = 16;
constexpr int64_t kIdealCluster = 8;

class SplitSoftmaxCuda final : public FamilyBase {
 public:
  explicit SplitSoftmaxCuda(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCuda, "_split"), Backend::kCuda,
                   {Knob{"split", {1, 2, 4, 8, 16, 32, 64}, {}}, Knob{"block", {128, 256, 512, 1024}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"cache", {0, 1}, {}}, Knob{"cluster", {0, 1}, {}},
                    Knob{"inflight", {32, 64, 128}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override {
    const int64_t d = softmax_call_dim(sig, kind_, Backend::kCuda);
    if (d < 0) return false;
    const TensorMeta& x = *tensor_arg(sig, 0);
    return d == static_cast<int64_t>(x.sizes.size()) - 1 && cols_of(x) >= kMinCols;
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t cols = cols_of(x), esz = dtype_size_bytes(x.dtype);
    const int64_t split = v[kSplit], block = v[kBlock], vec = v[kVec];
    if (vec * esz > 16) return false;
    if (v[kInflight] / (vec * esz) > 16) return false;   // at most 16 accesses in flight per thread
    if (v[kCluster] == 1 && (split == 1 || split > kMaxCluster || !has_clusters(sig))) return false;
    const int64_t chunk = chunk_of(cols, split);
    if (split > 1 && chunk < block * vec) return false;                                // a block with under one access per thread
    if (block > std::max<int64_t>(128, pow2_ceil((chunk + vec - 1) / vec))) return false;   // idle warps
    if (split > 1 && (split - 1) * chunk >= cols) return false;                        // an empty chunk
    return v[kCache] == 0 || chunk * esz + 32 <= kSharedBudget;
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t cols = cols_of(x), rows = std::max<int64_t>(1, rows_of(x)), esz = dtype_size_bytes(x.dtype);
    const int64_t split = v[kSplit], block = v[kBlock], vec = v[kVec];
    const bool cached = v[kCache] == 1;
    // Enough blocks for the whole GPU, chunks of at least 4096 elements.
    const bool cluster = v[kCluster] == 1;
    int64_t ideal_split = std::clamp<int64_t>(pow2_ceil((kTargetBlocks + rows - 1) / rows), 1, cluster ? kIdealCluster : 64);
    while (ideal_split > 1 && cols / ideal_split < 4096) ideal_split /= 2;
    const int64_t chunk = chunk_of(cols, split);
    // Resident threads per SM: the shared copy limits the blocks an SM holds.
    const int64_t blocks_per_sm =
        std::min<int64_t>(2048 / block, cached ? std::max<int64_t>(1, (228 * 1024) / (chunk * esz + 32 + 1024)) : 32);
    const double resident = static_cast<double>(std::min<int64_t>(2048, blocks_per_sm * block));
    const double rounds = static_cast<double>(std::max<int64_t>(1, chunk / (block * vec)));
    // The copy saves split 1 and a cluster a read of memory; for split > 1 in two launches it only
    // trades the online pass's rescaling for a second pass over shared memory. (An H100's worker,
    // clusters of 8 over 8 rows of 262,144 bf16: 5.4-6.0x PyTorch's time with the copy, 2.4-3.7x
    // without.)
    const double cache_weight = cached ? 1.0 : (split == 1 || cluster ? 0.6 : 0.85);
    // A cluster saves split > 1 its second launch and, streaming, its second read; capped at 16
    // chunks a row, it may leave SMs idle that two launches would fill, which costs it less than
    // the second launch does (an H100's worker over 8 rows of 262,144 bf16: 5.99x PyTorch's time
    // at split 8 as a cluster against 5.21x at split 8 and 4.76-4.94x at split 32 in two launches;
    // split 16 as a cluster, which fills the SMs that split 8 leaves idle, at most 5.92x).
    const double blocks = static_cast<double>(std::min<int64_t>(rows * split, kTargetBlocks));
    const double launch_weight =
        split == 1 ? closeness(blocks, kTargetBlocks, 0.3) : cluster ? closeness(blocks, kTargetBlocks, 0.15) : 0.8;
    // Bytes in flight per thread: more where few blocks share an SM.
    const double inflight = closeness(static_cast<double>(v[kInflight]), resident < 1024 ? 128 : 64, 0.15);
    return launch_weight * inflight * closeness(static_cast<double>(vec * esz), 16, 0.5) *
           closeness(static_cast<double>(split), static_cast<double>(ideal_split), 0.4) * closeness(resident, 2048, 0.5) *
           closeness(std::min(rounds, 8.0), 8, 0.2) * cache_weight;
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t split = v[kSplit], esz = dtype_size_bytes(x.dtype);
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]),
                                        define("KF_SPLIT", split), define("KF_CLUSTER", v[kCluster]),
                                        define("KF_INFLIGHT", v[kInflight]), define("KF_WARP_ROW", 0),
                                        define("KF_ROW_LANES", 32)};
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    const std::string rows = rows_expr(x), cols = cols_expr(x);
    const std::string chunk = "round_up(ceil_div(" + cols + ", " + std::to_string(split) + "), 8)";
    // The copy's bytes, and whether it fits (for any signature the spec is resolved for: the
    // kernel streams when it does not).
    const std::string bytes = chunk + " * " + std::to_string(esz) + " + 32";
    const std::string fits = v[kCache] == 1 ? "min(1, " + std::to_string(kSharedBudget) + " / (" + bytes + "))" : "0";
    const std::string smem = v[kCache] == 1 ? "(" + fits + ") * (" + bytes + ")" : "0";
    const std::string source = std::string(kCudaPrelude) + kCudaRowMapping + kCudaSoftmaxMath +
                               (v[kCluster] == 1 ? kCudaClusterShared : "") + kCudaSplitSoftmax;
    const std::string block = std::to_string(v[kBlock]);
    const std::string grid = "(" + rows + ") * " + std::to_string(split);   // a block per chunk
    KernelSpec s;
    if (v[kCluster] == 1) {
      s = one_launch_spec(Backend::kCuda, source, "kf_split_cluster", std::move(options));
      Launch& l = s.plan.launches[0];
      l.grid[0] = grid;
      l.block[0] = block;
      l.shared_mem_bytes = smem;
      l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(cols), ArgBinding::size(chunk),
                ArgBinding::size(fits)};
    } else if (split == 1) {
      s = one_launch_spec(Backend::kCuda, source, "kf_split_whole", std::move(options));
      Launch& l = s.plan.launches[0];
      l.grid[0] = rows;
      l.block[0] = block;
      l.shared_mem_bytes = smem;
      l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(cols), ArgBinding::size(fits)};
    } else {
      s = one_launch_spec(Backend::kCuda, source, "kf_split_stats", std::move(options));
      s.entry_points.push_back("kf_split_write");
      s.plan.scratch = {ScratchBuffer{"part", "(" + rows + ") * " + std::to_string(split * 16)}};
      Launch& stats = s.plan.launches[0];
      stats.grid[0] = grid;
      stats.block[0] = block;
      stats.shared_mem_bytes = smem;
      stats.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::size(cols), ArgBinding::size(chunk),
                    ArgBinding::size(fits)};
      Launch write;
      write.entry = "kf_split_write";
      write.grid[0] = grid;
      write.block[0] = block;
      write.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::scratch(0), ArgBinding::size(cols),
                    ArgBinding::size(chunk)};
      s.plan.launches.push_back(std::move(write));
    }
    s.plan.outputs = {OutputSpec::like(0)};
    return s;
  }

 private:
  // The chunk length the plan's expression gives.
  static int64_t chunk_of(int64_t cols, int64_t split) { return ((cols + split - 1) / split + 7) / 8 * 8; }

  Softmax kind_;
};

}  // namespace

// "softmax_split", "log_softmax_split", "safe_softmax_split" (CUDA only: the CPU's row families
// already use every core on rows of any length).
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SplitSoftmaxCuda>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SplitSoftmaxCuda>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<SplitSoftmaxCuda>(Softmax::kSafe); },
};

}  // namespace kforge::search::templates

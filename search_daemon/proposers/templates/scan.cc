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
// thread sums its segment, the block adds up the segments before each one in shared memory, and
// the thread walks its segment again from that offset, writing each prefix rounded on its own:
// two reads and one write of memory, every load of a segment independent of the sums, so KF_U of
// them go out together. The prefixes are sums in kf_acc in another order than the one-thread
// walk (segment sums, then the running sum), as accurate.
const char* const kCudaCumsumSplit = R"kf(
#define KF_TX (KF_BLOCK / KF_SPLIT)
#define KF_TILE (KF_TX * KF_VEC)
#define KF_U (16 / KF_VEC > 2 ? 16 / KF_VEC : 2)   // accesses in flight per thread
// Adds the elements l0..l1-1 of the thread's KF_VEC columns to s, KF_U accesses at a time; with
// WRITE, stores each prefix (rounded on its own) at its element in y.
template <bool WRITE>
__device__ __forceinline__ void kf_walk(const kf_t* __restrict__ xs, kf_t* __restrict__ ys, kf_i64 l0, kf_i64 l1,
                                        kf_i64 step, kf_acc (&s)[KF_VEC]) {
  kf_i64 l = l0;
  for (; l + KF_U <= l1; l += KF_U) {
    float v[KF_U][KF_VEC];
#pragma unroll
    for (int u = 0; u < KF_U; ++u) kf_load<KF_VEC>(xs, (l + u) * step, v[u]);
#pragma unroll
    for (int u = 0; u < KF_U; ++u) {
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) {
        s[k] += (kf_acc)v[u][k];
        v[u][k] = (float)s[k];
      }
      if constexpr (WRITE) kf_store<KF_VEC>(ys, (l + u) * step, v[u]);
    }
  }
  for (; l < l1; ++l) {
    float v[KF_VEC];
    kf_load<KF_VEC>(xs, l * step, v);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      s[k] += (kf_acc)v[k];
      v[k] = (float)s[k];
    }
    if constexpr (WRITE) kf_store<KF_VEC>(ys, l * step, v);
  }
}
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_cumsum_split(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 len, kf_i64 inner, kf_i64 tiles) {
  __shared__ kf_acc part[KF_SPLIT][KF_TILE];
  const int tx = threadIdx.x % KF_TX, ty = threadIdx.x / KF_TX;
  const kf_i64 o = blockIdx.x / tiles;
  const kf_i64 c0 = (blockIdx.x - o * tiles) * KF_TILE + (kf_i64)tx * KF_VEC;   // inner % KF_VEC == 0
  const bool live = c0 < inner;
  const kf_i64 seg = (len + KF_SPLIT - 1) / KF_SPLIT;
  const kf_i64 l0 = ty * seg < len ? ty * seg : len;
  const kf_i64 l1 = l0 + seg < len ? l0 + seg : len;
  const kf_i64 base = o * len * inner + c0;   // a multiple of KF_VEC
  const kf_t* __restrict__ xs = x + base;
  kf_t* __restrict__ ys = y + base;
  const kf_i64 step = inner / KF_VEC;   // vectors from one element of the column to the next
  kf_acc s[KF_VEC];
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) s[k] = 0;
  if (live) kf_walk<false>(xs, ys, l0, l1, step, s);   // the segment's sum
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) part[ty][tx * KF_VEC + k] = s[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < KF_VEC; ++k) s[k] = 0;
  for (int q = 0; q < ty; ++q) {
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) s[k] += part[q][tx * KF_VEC + k];
  }
  if (live) kf_walk<true>(xs, ys, l0, l1, step, s);   // from the segments before it, the prefixes
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
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t columns = x.numel() / x.sizes[static_cast<size_t>(cumsum_dim(sig, Backend::kCuda))];
    return v[0] <= std::max<int64_t>(32, pow2_ceil(columns));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[0]), 128, 0.3);
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
};

// Note [Split scan]: columns (inner > 1) in tiles, each column in segments.
class CumsumSplitCuda final : public FamilyBase {
 public:
  CumsumSplitCuda()
      : FamilyBase("cumsum_split", Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"split", {2, 4, 8, 16, 32, 64}, {}},
                    Knob{"vec", {1, 2, 4, 8}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    // Note [float16 cumsum on CUDA]
    const int64_t d = cumsum_dim(sig, Backend::kCuda);
    return d >= 0 && tensor_arg(sig, 0)->dtype != DType::kFloat16 && split_at_dim(*tensor_arg(sig, 0), d).inner_size > 1;
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const DimSplit e = shape(sig);
    const int64_t block = v[0], split = v[1], vec = v[2];
    if (e.inner_size % vec != 0 || !vector_fits(sig, vec)) return false;
    if (split > e.len_size) return false;                                     // threads with no segment
    return block / split * vec <= std::max(vec, pow2_ceil(e.inner_size));     // no tile mostly past the last column
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    // At least two segments, of at least 16 elements.
    return split_columns_prior(sig, shape(sig), v, 2, 64, 16);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, cumsum_dim(sig, Backend::kCuda));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaCumsumSplit, "kf_cumsum_split",
                                   {dtype_define(x.dtype), define("KF_BLOCK", v[0]), define("KF_SPLIT", v[1]),
                                    define("KF_VEC", v[2])});
    s.plan.outputs = {OutputSpec::like(0)};
    split_columns_launch(e, v, s.plan.launches[0]);
    return s;
  }

 private:
  static DimSplit shape(const OpSignature& sig) { return split_at_dim(*tensor_arg(sig, 0), cumsum_dim(sig, Backend::kCuda)); }
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

// "cumsum" and "cumsum_split" (CUDA) and "cpu.cumsum".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumSplitCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCpu>(); },
};

}  // namespace kforge::search::templates

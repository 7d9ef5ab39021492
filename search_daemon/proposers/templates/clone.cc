// aten::clone: a copy of self, element for element (raw words, never through float). Handled:
//   memory_format=contiguous (what Tensor.contiguous() calls on a transposed or sliced tensor):
//     any strides, the output contiguous; the kernel walks the output in order and gathers each
//     element from self's strides (Note [Clone plan]), or, on CUDA, transposes tiles through
//     shared memory when self's innermost dimension is not the output's (Note [Transposing clone]);
//   memory_format=None or preserve with self non-overlapping and dense (contiguous, or permuted
//     without gaps): the output has self's strides, so the copy is the linear one of self's
//     numel elements from its first.
// Preserve with a self that has gaps or overlaps (PyTorch then picks a memory format), channels
// last, and self tensors of more than kMaxDims dimensions after merging are refused.
#include <algorithm>
#include <numeric>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

constexpr size_t kMaxDims = 6;
constexpr int64_t kContiguousFormat = 0;   // c10::MemoryFormat::Contiguous
constexpr int64_t kPreserveFormat = 1;     // c10::MemoryFormat::Preserve

// Note [Clone plan]
// ~~~~~~~~~~~~~~~~~
// The output is contiguous in self's sizes. Dimensions of size 1 are dropped, and a dimension is
// merged into the next-inner one when self steps through the pair as through one (stride = inner
// stride x inner size), so a contiguous self is one dimension and a transposed [B, H, S, D] ->
// [B, S, H, D] view three or four. Output element o is then self's element
// sum_d (o's index in d) x stride_d. Dimensions innermost first.
struct ClonePlan {
  bool gather = false;           // contiguous output from any strides; else a linear copy
  std::vector<int64_t> dims, strides;
  int64_t numel = 0;
};

bool dense(const TensorMeta& t) {
  std::vector<size_t> order(t.sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  int64_t expected = 1;
  for (size_t d : order) {
    if (t.sizes[d] == 1) continue;
    if (t.strides[d] != expected) return false;
    expected *= t.sizes[d];
  }
  return true;
}

std::optional<ClonePlan> clone_plan(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::clone" || !sig.overload.empty() || sig.args.size() != 2) return std::nullopt;
  const TensorMeta* x = tensor_arg(sig, 0);
  if (x == nullptr || x->sizes.empty() || x->numel() <= 0) return std::nullopt;
  // The dtypes and device of template_tensor, any strides.
  TensorMeta as_contiguous = *x;
  as_contiguous.strides = contiguous_strides(x->sizes);
  if (!template_tensor(&as_contiguous, backend)) return std::nullopt;
  int64_t format = kPreserveFormat;
  if (const int64_t* f = int_arg(sig, 1)) {
    format = *f;
  } else if (!is_none(sig, 1)) {
    return std::nullopt;
  }
  ClonePlan p;
  p.numel = x->numel();
  if (format == kPreserveFormat) {
    if (!dense(*x)) return std::nullopt;   // PyTorch would pick a format: not handled
    p.dims = {p.numel};
    p.strides = {1};
    return p;
  }
  if (format != kContiguousFormat) return std::nullopt;
  p.gather = true;
  for (size_t k = x->sizes.size(); k-- > 0;) {   // innermost first
    if (x->sizes[k] == 1) continue;
    if (!p.dims.empty() && x->strides[k] == p.strides.back() * p.dims.back()) {
      p.dims.back() *= x->sizes[k];
    } else {
      p.dims.push_back(x->sizes[k]);
      p.strides.push_back(x->strides[k]);
    }
  }
  if (p.dims.empty()) {   // one element
    p.dims = {1};
    p.strides = {1};
  }
  if (p.dims.size() > kMaxDims) return std::nullopt;
  if (p.dims.size() == 1 && p.strides[0] == 1) p.gather = false;   // already contiguous: a linear copy
  return p;
}

std::vector<std::string> plan_defines(const ClonePlan& p) {
  std::vector<std::string> o = {define("KF_GATHER", p.gather ? 1 : 0), define("KF_NDIM", static_cast<int64_t>(p.dims.size()))};
  for (size_t d = 0; d < p.dims.size(); ++d) {
    o.push_back(define("KF_D" + std::to_string(d), p.dims[d]));
    o.push_back(define("KF_S" + std::to_string(d), p.strides[d]));
  }
  return o;
}

// The output: contiguous for a gather, self's layout for a linear copy ({"like": 0}: empty_like
// keeps a dense tensor's strides).
OutputSpec clone_output(const OpSignature& sig, const ClonePlan& p) {
  const TensorMeta& x = *tensor_arg(sig, 0);
  if (!p.gather && !x.is_contiguous()) return OutputSpec::like(0);
  std::vector<std::string> sizes, strides(x.sizes.size());
  std::string step = "1";
  for (size_t d = x.sizes.size(); d-- > 0;) {
    strides[d] = step;
    step = step == "1" ? size_name(0, d) : step + " * " + size_name(0, d);
  }
  for (size_t d = 0; d < x.sizes.size(); ++d) sizes.push_back(size_name(0, d));
  return OutputSpec::explicit_layout(x.dtype, std::move(sizes), std::move(strides));
}

// Self's offset of output element o (innermost dimension first; the outermost takes the rest).
const char* const kCloneOffset = R"kf(
static KF_DEVICE inline kf_i64 kf_src(kf_i64 o) {
#if !KF_GATHER
  return o;
#else
  kf_i64 off = 0, i = 0;
  (void)off;
  (void)i;
#if KF_NDIM > 1
  i = o % KF_D0; o /= KF_D0; off += i * KF_S0;
#else
  return o * KF_S0;
#endif
#if KF_NDIM > 2
  i = o % KF_D1; o /= KF_D1; off += i * KF_S1;
#elif KF_NDIM == 2
  return off + o * KF_S1;
#endif
#if KF_NDIM > 3
  i = o % KF_D2; o /= KF_D2; off += i * KF_S2;
#elif KF_NDIM == 3
  return off + o * KF_S2;
#endif
#if KF_NDIM > 4
  i = o % KF_D3; o /= KF_D3; off += i * KF_S3;
#elif KF_NDIM == 4
  return off + o * KF_S3;
#endif
#if KF_NDIM > 5
  i = o % KF_D4; o /= KF_D4; off += i * KF_S4;
  return off + o * KF_S5;
#elif KF_NDIM == 5
  return off + o * KF_S4;
#endif
#endif
}
)kf";

// ---- CUDA ------------------------------------------------------------------------------------------

// Each thread copies KF_ITEMS vectors of KF_VEC elements, KF_BLOCK apart, as raw words: a vector
// is KF_VEC consecutive elements of self too (KF_VEC > 1 only when self's innermost merged stride
// is 1 and KF_VEC divides its length), read from its first element's offset.
const char* const kCudaClone = R"kf(
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_clone(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 nvec) {
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= nvec) continue;
    reinterpret_cast<kf_word*>(y)[i] = *reinterpret_cast<const kf_word*>(x + kf_src(i * KF_VEC));
  }
}
)kf";

// Note [Transposing clone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A gather whose merged dimension 1 has stride 1 in self and dimension 0 (the output's innermost)
// does not, reads self KF_S0 elements apart in each warp: a channels-last [N, C, H, W] made
// contiguous (group_norm's input.contiguous() on CUDA, plan [H*W, C, N]) or a transposed matrix.
// With `tile` on, a block moves one tile of KF_T x KF_T elements (dimension 0 by dimension 1) of
// one outer index (blockIdx.y): it reads rows along dimension 1, where self is contiguous, a word of
// KF_VEC elements per thread, into shared memory, and writes rows along dimension 0, where the
// output is contiguous, a word of KF_VEC elements gathered from a tile column per thread. The
// outer index's offset in self is kf_src of its first output element.
const char* const kCudaCloneTiles = R"kf(
#define KF_T (32 * KF_VEC)
#define KF_ROWS (KF_BLOCK / 32)
#define KF_TILES0 ((KF_D0 + KF_T - 1) / KF_T)
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_clone(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 nvec) {
  (void)nvec;
  __shared__ kf_t tile[KF_T][KF_T + 1];   // [dimension 0][dimension 1]
  const kf_i64 i0 = (kf_i64)(blockIdx.x % KF_TILES0) * KF_T, j0 = (kf_i64)(blockIdx.x / KF_TILES0) * KF_T;
  const kf_i64 dst = (kf_i64)blockIdx.y * ((kf_i64)KF_D0 * KF_D1);
  const kf_i64 src = kf_src(dst);
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
#pragma unroll 4
  for (int a = ty; a < KF_T; a += KF_ROWS) {
    const kf_i64 i = i0 + a, j = j0 + tx * KF_VEC;
    if (i < KF_D0 && j < KF_D1) {
      const kf_word w = *reinterpret_cast<const kf_word*>(x + src + i * KF_S0 + j);
      const kf_t* e = reinterpret_cast<const kf_t*>(&w);
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) tile[a][tx * KF_VEC + k] = e[k];
    }
  }
  __syncthreads();
#pragma unroll 4
  for (int b = ty; b < KF_T; b += KF_ROWS) {
    const kf_i64 j = j0 + b, i = i0 + tx * KF_VEC;
    if (j < KF_D1 && i < KF_D0) {
      kf_word w;
      kf_t* e = reinterpret_cast<kf_t*>(&w);
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) e[k] = tile[tx * KF_VEC + k][b];
      *reinterpret_cast<kf_word*>(y + dst + j * KF_D0 + i) = w;
    }
  }
}
)kf";

// Whether a plan transposes: Note [Transposing clone].
bool transposes(const ClonePlan& p) { return p.gather && p.dims.size() >= 2 && p.strides[1] == 1 && p.strides[0] != 1; }

enum CloneCudaKnob : size_t { kBlock, kVec, kItems, kTile };

std::vector<Knob> clone_cuda_knobs() {
  std::vector<Knob> k = flat_cuda_knobs();
  k.push_back(Knob{"tile", {0, 1}, {"gather", "transpose"}});   // Note [Transposing clone]
  return k;
}

class CloneCuda final : public FamilyBase {
 public:
  CloneCuda()
      : FamilyBase("clone", Backend::kCuda, clone_cuda_knobs()) {}

  bool applies(const OpSignature& sig) const override { return clone_plan(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ClonePlan p = *clone_plan(sig, Backend::kCuda);
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t bytes = v[kVec] * dtype_size_bytes(x.dtype);
    if (bytes > 16 || static_cast<int64_t>(x.alignment) % bytes != 0) return false;
    if (v[kTile] == 1) {
      // Note [Transposing clone]: words of KF_VEC elements along dimension 1 of self and along
      // dimension 0 of the output start aligned; the tile fits in 40 KB of shared memory; one
      // block per tile (items 1, whole warps); the outer indices fit the grid's y.
      if (!transposes(p) || v[kItems] != 1 || v[kBlock] < 64 || v[kBlock] > 256) return false;
      if (p.dims[0] % v[kVec] != 0 || p.dims[1] % v[kVec] != 0 || p.strides[0] % v[kVec] != 0) return false;
      for (size_t d = 2; d < p.strides.size(); ++d) {
        if (p.strides[d] % v[kVec] != 0) return false;
      }
      const int64_t t = 32 * v[kVec];
      return t * (t + 1) * dtype_size_bytes(x.dtype) <= 40 * 1024 && p.numel / (p.dims[0] * p.dims[1]) <= 65535;
    }
    if (v[kVec] > 1) {
      // A vector is consecutive in self and starts aligned: innermost stride 1, its length and
      // every outer stride multiples of the width.
      if (p.strides[0] != 1 || p.dims[0] % v[kVec] != 0) return false;
      for (size_t d = 1; d < p.strides.size(); ++d) {
        if (p.strides[d] % v[kVec] != 0) return false;
      }
    }
    return flat_cuda_fits(p.numel, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ClonePlan p = *clone_plan(sig, Backend::kCuda);
    const int64_t es = dtype_size_bytes(tensor_arg(sig, 0)->dtype);
    if (v[kTile] == 1) {
      // Whole rows of 32-byte sectors or more on both sides, 256 threads.
      return closeness(static_cast<double>(v[kVec] * es), 8, 0.3) * closeness(static_cast<double>(v[kBlock]), 256, 0.3);
    }
    // A transposing gather reads a sector per element: the tiles first.
    return flat_cuda_prior(es, p.numel, v) * (transposes(p) ? 0.5 : 1.0);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ClonePlan p = *clone_plan(sig, Backend::kCuda);
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = {dtype_define(x.dtype)};
    for (std::string& d : plan_defines(p)) options.push_back(std::move(d));
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems]),
                          define("KF_WORD_BYTES", v[kVec] * dtype_size_bytes(x.dtype))}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCuda,
                                   std::string(kCudaPrelude) + kCudaRawWord + "#define KF_DEVICE __device__\n" +
                                       kCloneOffset + (v[kTile] == 1 ? kCudaCloneTiles : kCudaClone),
                                   "kf_clone", options);
    s.plan.outputs = {clone_output(sig, p)};
    const std::string nvec = "numel0 / " + std::to_string(v[kVec]);
    Launch& l = s.plan.launches[0];
    l.block[0] = std::to_string(v[kBlock]);
    if (v[kTile] == 1) {   // Note [Transposing clone]: tiles of dimensions 0 and 1 by the outer indices
      const int64_t t = 32 * v[kVec];
      l.grid[0] = std::to_string(((p.dims[0] + t - 1) / t) * ((p.dims[1] + t - 1) / t));
      l.grid[1] = std::to_string(p.numel / (p.dims[0] * p.dims[1]));
    } else {
      l.grid[0] = "ceil_div(" + nvec + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    }
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(nvec)};
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

const char* const kCpuClone = R"kf(
// KF_CHUNK output elements per block (float32).
extern "C" void kf_clone(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t n = KF_I64(2);
  const int64_t i0 = (int64_t)blk->block_idx[0] * KF_CHUNK;
  const int64_t i1 = i0 + KF_CHUNK < n ? i0 + KF_CHUNK : n;
  for (int64_t i = i0; i < i1; ++i) y[i] = x[kf_src(i)];
}
)kf";

class CloneCpu final : public FamilyBase {
 public:
  CloneCpu() : FamilyBase("cpu.clone", Backend::kCpu, flat_cpu_knobs()) {}

  bool applies(const OpSignature& sig) const override { return clone_plan(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_fits(clone_plan(sig, Backend::kCpu)->numel, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_prior(clone_plan(sig, Backend::kCpu)->numel, v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const ClonePlan p = *clone_plan(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string& d : plan_defines(p)) options.push_back(std::move(d));
    options.push_back(define("KF_CHUNK", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu,
                                   std::string(kCpuPrelude) + "#define KF_DEVICE\ntypedef int64_t kf_i64;\n" +
                                       kCloneOffset + kCpuClone,
                                   "kf_clone", options);
    s.plan.outputs = {clone_output(sig, p)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(numel0, " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("numel0")};
    return s;
  }
};

}  // namespace

// "clone" (CUDA) and "cpu.clone".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CloneCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CloneCpu>(); },
};

}  // namespace kforge::search::templates

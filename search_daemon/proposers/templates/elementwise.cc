// The pointwise operators, in two kernels per backend:
//   unary     aten::gelu ('none' or 'tanh'), silu, relu, sigmoid, tanh, hardswish, neg, rsqrt, exp,
//             pow.Tensor_Scalar (the exponent compiled in): one contiguous input, the output like
//             it, the tail after the last whole vector handled apart.
//   binary    the Tensor overloads of add, sub, mul, div with broadcasting (Note [Broadcast
//             plan]): two contiguous inputs of one dtype, the output contiguous in the broadcast
//             shape. When `other` is a Python number (a 0-dimensional CPU tensor: `x * 0.5`), the
//             unary kernel instead, with the number read at each call (a value binding: Note
//             [Tensor values] in runtime/kernel_spec.cc), so one kernel serves every value.
//             mul.Scalar (a Scalar `other`, as the math attention path scales by) and clamp_min
//             (a Scalar `min`) take the same unary kernel with the number as a scalar argument.
// In-place variants (relu_, add_.Tensor, mul_.Tensor, clamp_min_: Note [In-place outputs] in
// runtime/kernel_spec.cc) take the same kernels with the output bound to `self` (OutputSpec::
// in_place(0)): each thread reads its elements before it writes them, and the pointers lose
// __restrict__ (KF_RESTRICT), since `self` is read and written through two of them. They claim a
// contiguous `self` whose shape is the broadcast's (PyTorch refuses to broadcast into `self`).
// Each element is computed in float with PyTorch's own formula and constants, so the result rounds
// as PyTorch's does (relu rounds nothing: x < 0 ? 0 : x keeps NaN and -0.0, as clamp_min does;
// hardswish clamps with comparisons, which keep NaN, as std::min/std::max do in PyTorch's kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

enum class Pointwise : uint8_t {
  kGelu, kSilu, kRelu, kSigmoid, kTanh, kHardswish,   // unary
  kNeg, kRsqrt, kExp, kPow,
  kAdd, kSub, kMul, kDiv,                             // two tensors, broadcast
  kMulScalar, kClampMin,                              // a tensor and a Scalar
};

struct PointwiseInfo {
  Pointwise op;
  std::string_view aten;       // "aten::add"
  std::string_view overload;   // "Tensor"
  std::string_view family;     // the CUDA family; the CPU one is "cpu." + this
  int code;                    // KF_OP (unary kernel) or KF_BIN (binary kernel)
  std::string_view in_place;   // the in-place variant in the catalog ("aten::relu_"; same overload), or ""
};

constexpr PointwiseInfo kInfo[] = {
    {Pointwise::kGelu, "aten::gelu", "", "gelu", 0, ""},
    {Pointwise::kSilu, "aten::silu", "", "silu", 1, ""},
    {Pointwise::kRelu, "aten::relu", "", "relu", 3, "aten::relu_"},
    {Pointwise::kSigmoid, "aten::sigmoid", "", "sigmoid", 4, ""},
    {Pointwise::kTanh, "aten::tanh", "", "tanh", 5, ""},
    {Pointwise::kHardswish, "aten::hardswish", "", "hardswish", 6, ""},
    {Pointwise::kNeg, "aten::neg", "", "neg", 8, ""},
    {Pointwise::kRsqrt, "aten::rsqrt", "", "rsqrt", 9, ""},
    {Pointwise::kExp, "aten::exp", "", "exp", 10, ""},
    {Pointwise::kPow, "aten::pow", "Tensor_Scalar", "pow", 11, ""},
    {Pointwise::kAdd, "aten::add", "Tensor", "add", 0, "aten::add_"},
    {Pointwise::kSub, "aten::sub", "Tensor", "sub", 1, ""},
    {Pointwise::kMul, "aten::mul", "Tensor", "mul", 2, "aten::mul_"},
    {Pointwise::kDiv, "aten::div", "Tensor", "div", 3, ""},
    {Pointwise::kMulScalar, "aten::mul", "Scalar", "mul_scalar", 2, ""},
    {Pointwise::kClampMin, "aten::clamp_min", "", "clamp_min", 4, "aten::clamp_min_"},
};

const PointwiseInfo& info(Pointwise op) { return kInfo[static_cast<size_t>(op)]; }
bool is_binary(Pointwise op) { return op >= Pointwise::kAdd; }
bool has_alpha(Pointwise op) { return op == Pointwise::kAdd || op == Pointwise::kSub; }
// The other operand is a Scalar argument (mul.Scalar, clamp_min's min), not a tensor.
bool scalar_other(Pointwise op) { return op == Pointwise::kMulScalar || op == Pointwise::kClampMin; }

// The element formulas, shared by the CUDA and CPU sources (KF_DEVICE is __device__ or empty).
const char* const kPointwiseFormulas = R"kf(
// KF_OP: 0 gelu (KF_GELU_TANH 0: erf form, 1: tanh form), 1 silu, 3 relu, 4 sigmoid, 5 tanh,
// 6 hardswish; 7 kf_bin(x, s, alpha) with a number s (the other operand; kBinaryOp first); 8 neg,
// 9 rsqrt, 10 exp, 11 pow with the exponent KF_POW_EXP (a float literal), special-cased as
// PyTorch's kernels do (2: x * x, 3: x * x * x, 0.5: sqrt, -0.5: rsqrt, -1: 1 / x, -2: 1 / (x * x)).
#define KF_SCALAR (KF_OP == 7)
#ifndef KF_ALPHA
#define KF_ALPHA 0
#endif
static KF_DEVICE inline float kf_op(float x, float s, float alpha) {
  (void)s;
  (void)alpha;
#if KF_OP == 0
#if KF_GELU_TANH
  const float kBeta = 0.7978845608028654f;   // sqrt(2) * (2 / sqrt(pi)) * 0.5
  const float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.0f + tanhf(inner));
#else
  return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
#endif
#elif KF_OP == 1
  return x / (1.0f + expf(-x));
#elif KF_OP == 3
  return x < 0.0f ? 0.0f : x;
#elif KF_OP == 4
  return 1.0f / (1.0f + expf(-x));
#elif KF_OP == 5
  return tanhf(x);
#elif KF_OP == 6
  float t = x + 3.0f;
  t = t < 0.0f ? 0.0f : t;
  t = t > 6.0f ? 6.0f : t;
  return x * t * KF_SIXTH;
#elif KF_OP == 7
  return kf_bin(x, s, alpha);
#elif KF_OP == 8
  return -x;
#elif KF_OP == 9
  return 1.0f / sqrtf(x);
#elif KF_OP == 10
  return expf(x);
#elif KF_OP == 11
#if KF_POW_CASE == 0
  return x * x;
#elif KF_POW_CASE == 1
  return x * x * x;
#elif KF_POW_CASE == 2
  return sqrtf(x);
#elif KF_POW_CASE == 3
  return 1.0f / sqrtf(x);
#elif KF_POW_CASE == 4
  return 1.0f / x;
#elif KF_POW_CASE == 5
  return 1.0f / (x * x);
#elif KF_POW_CASE == 6
  return x;
#elif KF_POW_CASE == 7
  return 1.0f;
#else
  return powf(x, KF_POW_EXP);
#endif
#endif
}
)kf";

// The binary formula, shared by the broadcasting kernel and the unary one with a number.
const char* const kBinaryOp = R"kf(
// KF_BIN: 0 a + alpha * b, 1 a - alpha * b, 2 a * b, 3 a / b, 4 clamp_min(a, b): a NaN either
// side gives NaN (PyTorch fills the result with a NaN min; a NaN element stays), and -0.0 stays.
#if KF_BIN <= 1
#define KF_ALPHA 1
#else
#define KF_ALPHA 0
#endif
static KF_DEVICE inline float kf_bin(float a, float b, float alpha) {
  (void)alpha;
#if KF_BIN == 0
  return a + alpha * b;
#elif KF_BIN == 1
  return a - alpha * b;
#elif KF_BIN == 2
  return a * b;
#elif KF_BIN == 3
  return a / b;
#else
  return a != a ? a : b != b ? b : a < b ? b : a;
#endif
}
)kf";

const char* const kBroadcastOffsets = R"kf(
// Note [Broadcast plan] (elementwise.cc): the output's KF_NDIM (1 to 4) collapsed dimensions,
// innermost first: sizes KF_D0.., and each input's strides in elements KF_SA<d>, KF_SB<d> (0 where
// it is broadcast). Output element o is at offset oa of a and ob of b.
static KF_DEVICE inline void kf_offsets(kf_i64 o, kf_i64* oa, kf_i64* ob) {
  kf_i64 i = o % KF_D0;
  o /= KF_D0;
  *oa = i * KF_SA0;
  *ob = i * KF_SB0;
#if KF_NDIM > 1
  i = o % KF_D1;
  o /= KF_D1;
  *oa += i * KF_SA1;
  *ob += i * KF_SB1;
#endif
#if KF_NDIM > 2
  i = o % KF_D2;
  o /= KF_D2;
  *oa += i * KF_SA2;
  *ob += i * KF_SB2;
#endif
#if KF_NDIM > 3
  *oa += o * KF_SA3;
  *ob += o * KF_SB3;
#endif
}
)kf";

const char* const kCudaPointwise = R"kf(
// Each thread handles KF_ITEMS vectors of KF_VEC elements, KF_BLOCK apart (coalesced); the
// n % KF_VEC elements after the last whole vector go to the first threads of block 0.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_pointwise(const kf_t* KF_RESTRICT a,
#if KF_SCALAR
             float s,
#endif
#if KF_ALPHA
             float alpha,
#endif
             kf_t* KF_RESTRICT y, kf_i64 n) {
#if !KF_SCALAR
  const float s = 0.0f;
#endif
#if !KF_ALPHA
  const float alpha = 1.0f;
#endif
  const kf_i64 nvec = n / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
  float va[KF_ITEMS][KF_VEC];
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) kf_load<KF_VEC>(a, i, va[it]);
  }
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      float o[KF_VEC];
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) o[k] = kf_op(va[it][k], s, alpha);
      kf_store<KF_VEC>(y, i, o);
    }
  }
#if KF_VEC > 1
  if (blockIdx.x == 0 && (kf_i64)threadIdx.x < n - nvec * KF_VEC) {
    const kf_i64 j = nvec * KF_VEC + threadIdx.x;
    y[j] = kf_from_float(kf_op(kf_to_float(a[j]), s, alpha));
  }
#endif
}
)kf";

const char* const kCudaBinary = R"kf(
// An input whose innermost stride is 1 is read in vectors of KF_VEC elements (KF_VEC divides
// KF_D0, so a vector never crosses a row of the innermost dimension); one whose innermost stride
// is 0 once per vector. Each thread handles KF_ITEMS vectors, KF_BLOCK apart.
template <int S>
__device__ __forceinline__ void kf_read(const kf_t* __restrict__ p, float (&out)[KF_VEC]) {
  if (S == 1) {
    kf_load<KF_VEC>(p, 0, out);
  } else if (S == 0) {
    const float v = kf_to_float(p[0]);
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) out[k] = v;
  } else {   // an input read across its rows (a view in another order): one element at a time
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) out[k] = kf_to_float(p[(kf_i64)k * S]);
  }
}

extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_binary(const kf_t* KF_RESTRICT a, const kf_t* KF_RESTRICT b,
#if KF_ALPHA
          float alpha,
#endif
          kf_t* KF_RESTRICT y, kf_i64 n) {
#if !KF_ALPHA
  const float alpha = 1.0f;
#endif
  const kf_i64 nvec = n / KF_VEC;
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
  float va[KF_ITEMS][KF_VEC], vb[KF_ITEMS][KF_VEC];
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      kf_i64 oa, ob;
      kf_offsets(i * KF_VEC, &oa, &ob);
      kf_read<KF_SA0>(a + oa, va[it]);
      kf_read<KF_SB0>(b + ob, vb[it]);
    }
  }
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i < nvec) {
      float o[KF_VEC];
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) o[k] = kf_bin(va[it][k], vb[it][k], alpha);
      kf_store<KF_VEC>(y, i, o);
    }
  }
}
)kf";

const char* const kCpuPointwise = R"kf(
// KF_CHUNK elements per block.
extern "C" void kf_pointwise(const kforge_cpu_block* blk, void* const* p) {
  const float* KF_RESTRICT a = KF_PTR(const float, 0);
  int slot = 1;
#if KF_SCALAR
  const float s = KF_F32(slot++);
#else
  const float s = 0.0f;
#endif
#if KF_ALPHA
  const float alpha = KF_F32(slot++);
#else
  const float alpha = 1.0f;
#endif
  float* KF_RESTRICT y = KF_PTR(float, slot);
  const int64_t n = KF_I64(slot + 1);
  const int64_t i0 = (int64_t)blk->block_idx[0] * KF_CHUNK;
  const int64_t i1 = i0 + KF_CHUNK < n ? i0 + KF_CHUNK : n;
  for (int64_t i = i0; i < i1; ++i) y[i] = kf_op(a[i], s, alpha);
}
)kf";

const char* const kCpuBinary = R"kf(
// KF_CHUNK output elements per block, walked a run of the innermost dimension at a time: within a
// run both inputs advance by a constant stride (1 or 0), a loop the compiler vectorizes.
extern "C" void kf_binary(const kforge_cpu_block* blk, void* const* p) {
  const float* KF_RESTRICT a = KF_PTR(const float, 0);
  const float* KF_RESTRICT b = KF_PTR(const float, 1);
#if KF_ALPHA
  const float alpha = KF_F32(2);
  float* KF_RESTRICT y = KF_PTR(float, 3);
  const int64_t n = KF_I64(4);
#else
  const float alpha = 1.0f;
  float* KF_RESTRICT y = KF_PTR(float, 2);
  const int64_t n = KF_I64(3);
#endif
  const int64_t i0 = (int64_t)blk->block_idx[0] * KF_CHUNK;
  const int64_t i1 = i0 + KF_CHUNK < n ? i0 + KF_CHUNK : n;
  for (int64_t o = i0; o < i1;) {
    kf_i64 oa, ob;
    kf_offsets(o, &oa, &ob);
    const int64_t left_in_row = KF_D0 - o % KF_D0;
    const int64_t len = left_in_row < i1 - o ? left_in_row : i1 - o;
    const float* KF_RESTRICT pa = a + oa;
    const float* KF_RESTRICT pb = b + ob;
    float* KF_RESTRICT py = y + o;
    for (int64_t k = 0; k < len; ++k) py[k] = kf_bin(pa[k * KF_SA0], pb[k * KF_SB0], alpha);
    o += len;
  }
}
)kf";

// Note [Broadcast plan]
// ~~~~~~~~~~~~~~~~~~~~~
// The binary kernels are specialized to the signature's shapes: the output is the broadcast of
// the two inputs' sizes (aligned from the last dimension; a size-1 or missing dimension repeats),
// and each input, contiguous in its own sizes, is read with stride 0 along the dimensions where
// it repeats. Output dimensions of size 1 are dropped, and neighbouring dimensions merged while
// both inputs step through them as through one (outer stride = inner stride x inner size, 0 = 0),
// so a bias add [N, C] + [C] is two dimensions, a same-size add one, a per-channel scale
// [N, C, H, W] * [1, C, 1, 1] three. More than four after merging: not handled. Each input is read
// through its own strides. The output's layout is PyTorch's (TensorIterator lets the first input
// order the dimensions wherever its strides differ, which a dense input's always do): with both
// inputs contiguous it is contiguous; when the output has self's sizes and self is dense (any
// order: channels-last, a transposed view, RoPE's q * cos), it is self's layout (like self, or
// self itself in place), the plan's dimensions taken in self's storage order so that output
// element o is storage element o; anything else is refused.
struct BroadcastPlan {
  std::vector<int64_t> out_sizes;             // the broadcast shape, full rank
  std::vector<std::string> out_size_exprs;    // each as a launch-plan name of an input's size
  std::vector<int64_t> dims, sa, sb;          // collapsed, innermost first
};

constexpr size_t kMaxBroadcastDims = 4;

std::optional<BroadcastPlan> broadcast_plan(const TensorMeta& a, const TensorMeta& b) {
  const size_t rank = std::max(a.sizes.size(), b.sizes.size());
  if (a.strides.size() != a.sizes.size() || b.strides.size() != b.sizes.size()) return std::nullopt;
  BroadcastPlan p;
  p.out_sizes.assign(rank, 1);
  p.out_size_exprs.assign(rank, "1");
  // Per output dimension: its size and each input's stride (0 where it repeats).
  std::vector<int64_t> size(rank), stride_a(rank), stride_b(rank);
  std::vector<size_t> order;   // the dimensions of more than one element, innermost first
  for (size_t k = 0; k < rank; ++k) {   // k: position from the end
    const size_t d = rank - 1 - k;
    const bool in_a = k < a.sizes.size(), in_b = k < b.sizes.size();
    const size_t da = in_a ? a.sizes.size() - 1 - k : 0, db = in_b ? b.sizes.size() - 1 - k : 0;
    const int64_t na = in_a ? a.sizes[da] : 1, nb = in_b ? b.sizes[db] : 1;
    if (na != nb && na != 1 && nb != 1) return std::nullopt;
    const int64_t n = std::max(na, nb);
    p.out_sizes[d] = n;
    if (n != 1) p.out_size_exprs[d] = na == n ? size_name(0, da) : size_name(1, db);
    size[d] = n;
    stride_a[d] = na == n && n != 1 ? a.strides[da] : 0;
    stride_b[d] = nb == n && n != 1 ? b.strides[db] : 0;
    if (n != 1) order.push_back(d);
  }
  // Innermost first: the output's own order, or a's storage order when the output takes a's
  // layout and a is not contiguous (Note [Broadcast plan]).
  if (!a.is_contiguous() && p.out_sizes == a.sizes) {
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return stride_a[x] < stride_a[y]; });
  }
  if (order.empty()) {   // one element
    p.dims = {1};
    p.sa = {1};
    p.sb = {1};
    return p;
  }
  p.dims = {size[order[0]]};
  p.sa = {stride_a[order[0]]};
  p.sb = {stride_b[order[0]]};
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t d = order[k];
    const int64_t n = p.dims.back();
    if (stride_a[d] == p.sa.back() * n && stride_b[d] == p.sb.back() * n) {
      p.dims.back() *= size[d];
    } else {
      p.dims.push_back(size[d]);
      p.sa.push_back(stride_a[d]);
      p.sb.push_back(stride_b[d]);
    }
  }
  if (p.dims.size() > kMaxBroadcastDims) return std::nullopt;
  // The innermost strides are template arguments of the CUDA kernel (kf_read<S>).
  if (p.sa[0] < 0 || p.sb[0] < 0 || p.sa[0] > INT32_MAX || p.sb[0] > INT32_MAX) return std::nullopt;
  return p;
}

int64_t out_numel(const BroadcastPlan& p) {
  int64_t n = 1;
  for (int64_t d : p.dims) n *= d;
  return n;
}

// The output numel as a launch-plan expression.
std::string out_numel_expr(const BroadcastPlan& p) {
  std::string e;
  for (const std::string& s : p.out_size_exprs) {
    if (s == "1") continue;
    e += (e.empty() ? "" : " * ") + s;
  }
  return e.empty() ? "1" : e;
}

std::vector<std::string> broadcast_defines(const BroadcastPlan& p) {
  std::vector<std::string> o = {define("KF_NDIM", static_cast<int64_t>(p.dims.size()))};
  for (size_t d = 0; d < p.dims.size(); ++d) {
    o.push_back(define("KF_D" + std::to_string(d), p.dims[d]));
    o.push_back(define("KF_SA" + std::to_string(d), p.sa[d]));
    o.push_back(define("KF_SB" + std::to_string(d), p.sb[d]));
  }
  return o;
}

OutputSpec broadcast_output(const BroadcastPlan& p, DType dtype) {
  const size_t rank = p.out_sizes.size();
  std::vector<std::string> strides(rank);
  std::string step = "1";
  for (size_t d = rank; d-- > 0;) {
    strides[d] = step;
    if (p.out_size_exprs[d] != "1") step = step == "1" ? p.out_size_exprs[d] : step + " * " + p.out_size_exprs[d];
  }
  return OutputSpec::explicit_layout(dtype, p.out_size_exprs, strides);
}

bool is_number(const Arg& a) {
  return std::holds_alternative<int64_t>(a.value) || std::holds_alternative<double>(a.value);
}

// pow.Tensor_Scalar's exponent (argument 1) when it is a finite int or float.
std::optional<double> pow_exponent(const OpSignature& sig) {
  if (sig.args.size() < 2) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&sig.args[1].value)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&sig.args[1].value); d != nullptr && std::isfinite(*d)) return *d;
  return std::nullopt;
}

// `v` rounded to `bits` significant bits, to nearest even (a float16 exponent: 11, bfloat16: 8).
double round_to_bits(double v, int bits) {
  if (v == 0 || !std::isfinite(v)) return v;
  int ex = 0;
  const double m = std::frexp(v, &ex);   // v = m * 2^ex, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), ex - bits);
}

// KF_POW_CASE: which of PyTorch's special cases the exponent takes (kf_op's KF_OP 11), 8 = powf.
int pow_case(double e) {
  constexpr double kCases[] = {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0};
  for (int i = 0; i < 8; ++i) {
    if (e == kCases[i]) return i;
  }
  return 8;
}

// Whether `other` (argument 1) is a Python number: a 0-dimensional CPU tensor of a dtype a value
// binding reads. With a floating `self` the result keeps self's dtype (a 0-dimensional operand
// counts only by category in type promotion), so float64 0.5 times a bfloat16 tensor is bfloat16.
bool value_other(const OpSignature& sig) {
  const TensorMeta* b = tensor_arg(sig, 1);
  return b != nullptr && b->sizes.empty() && b->device == DeviceType::kCpu &&
         (b->dtype == DType::kFloat64 || b->dtype == DType::kFloat32 || b->dtype == DType::kInt64 ||
          b->dtype == DType::kInt32 || b->dtype == DType::kBool);
}

// The binary operators with two tensors use the broadcasting kernel; everything else, the unary one.
bool broadcasting(const OpSignature& sig, Pointwise op) {
  return is_binary(op) && !scalar_other(op) && !value_other(sig);
}

bool matches_op(const OpSignature& sig, Pointwise op, Backend backend);

// The signature's op and argument checks for `op` (its in-place variant when `in_place`), or false
// when the templates do not handle it.
bool matches(const OpSignature& sig, Pointwise op, Backend backend, bool in_place) {
  const PointwiseInfo& in = info(op);
  if (sig.op != (in_place ? in.in_place : in.aten) || sig.overload != in.overload) return false;
  if (!matches_op(sig, op, backend)) return false;
  if (!in_place || !broadcasting(sig, op)) return true;
  // The result is written into self: the broadcast shape must be self's.
  return broadcast_plan(*tensor_arg(sig, 0), *tensor_arg(sig, 1))->out_sizes == tensor_arg(sig, 0)->sizes;
}

// Note [Dense layouts]
// A pointwise result of one input is PyTorch's element for element in storage order whenever the
// input is dense in any order of its dimensions (channels-last, a transposed contiguous tensor),
// and PyTorch's output takes the input's strides then (empty_like, preserve_format). So those take
// the flat kernel with OutputSpec::like or in place. Two inputs: Note [Broadcast plan].

bool matches_op(const OpSignature& sig, Pointwise op, Backend backend) {
  const TensorMeta* a = tensor_arg(sig, 0);
  if (!template_dense_tensor(a, backend)) return false;
  switch (op) {
    case Pointwise::kGelu: {
      if (sig.args.empty() || sig.args.size() > 2) return false;
      if (sig.args.size() == 2) {
        const auto* mode = std::get_if<std::string>(&sig.args[1].value);
        return mode != nullptr && (*mode == "none" || *mode == "tanh");
      }
      return true;
    }
    case Pointwise::kSilu:
    case Pointwise::kRelu:
    case Pointwise::kSigmoid:
    case Pointwise::kTanh:
    case Pointwise::kHardswish:
    case Pointwise::kNeg:
    case Pointwise::kRsqrt:
    case Pointwise::kExp:
      return sig.args.size() == 1;
    case Pointwise::kPow:
      return sig.args.size() == 2 && pow_exponent(sig).has_value();
    case Pointwise::kMulScalar:
    case Pointwise::kClampMin:
      return sig.args.size() == 2 && is_number(sig.args[1]);
    case Pointwise::kAdd:
    case Pointwise::kSub:
    case Pointwise::kMul:
    case Pointwise::kDiv: {
      if (sig.args.size() != (has_alpha(op) ? 3u : 2u)) return false;
      if (has_alpha(op) && !is_number(sig.args[2])) return false;
      if (value_other(sig)) return true;
      const TensorMeta* b = tensor_arg(sig, 1);
      // One dtype (no type promotion) on one device; the output's layout (Note [Broadcast plan]).
      if (b == nullptr || b->dtype != a->dtype || !template_strided_tensor(b, backend)) return false;
      const std::optional<BroadcastPlan> plan = broadcast_plan(*a, *b);
      if (!plan) return false;
      return (a->is_contiguous() && b->is_contiguous()) || plan->out_sizes == a->sizes;
    }
  }
  return false;
}

std::vector<std::string> op_defines(const OpSignature& sig, Pointwise op) {
  const PointwiseInfo& in = info(op);
  if (broadcasting(sig, op)) {
    std::vector<std::string> o = {define("KF_BIN", in.code)};
    const BroadcastPlan p = *broadcast_plan(*tensor_arg(sig, 0), *tensor_arg(sig, 1));
    for (std::string& d : broadcast_defines(p)) o.push_back(std::move(d));
    return o;
  }
  // A binary operator with a number: the unary kernel's KF_OP 7, its formula KF_BIN's.
  if (is_binary(op)) return {define("KF_OP", 7), define("KF_BIN", in.code)};
  std::vector<std::string> o = {define("KF_OP", in.code)};
  if (op == Pointwise::kGelu) {
    const auto* mode = sig.args.size() == 2 ? std::get_if<std::string>(&sig.args[1].value) : nullptr;
    o.push_back(define("KF_GELU_TANH", mode != nullptr && *mode == "tanh" ? 1 : 0));
  }
  if (op == Pointwise::kPow) {
    const double e = *pow_exponent(sig);
    o.push_back(define("KF_POW_CASE", pow_case(e)));
    // The exponent as a float literal (only the powf case reads it). PyTorch's CUDA kernel
    // converts it to the tensor's dtype first (Scalar::to<scalar_t>: 1.7 is 1.7001953 in float16,
    // 1.703125 in bfloat16), then computes powf in float; float32 and the CPU kernel use float.
    const DType t = tensor_arg(sig, 0)->dtype;
    const int bits = t == DType::kFloat16 ? 11 : t == DType::kBFloat16 ? 8 : 24;   // significant bits
    char lit[64];
    std::snprintf(lit, sizeof lit, "%.9ef", round_to_bits(static_cast<double>(static_cast<float>(e)), bits));
    o.push_back("-DKF_POW_EXP=" + std::string(lit));
  }
  return o;
}

std::vector<ArgBinding> bindings(const OpSignature& sig, Pointwise op, const std::string& numel) {
  std::vector<ArgBinding> b = {ArgBinding::input(0)};
  if (broadcasting(sig, op)) {
    b.push_back(ArgBinding::input(1));
  } else if (scalar_other(op)) {
    b.push_back(ArgBinding::scalar(1, ValueType::kFloat32));
  } else if (is_binary(op)) {
    b.push_back(ArgBinding::tensor_value(1, ValueType::kFloat32));
  }
  if (has_alpha(op)) b.push_back(ArgBinding::scalar(2, ValueType::kFloat32));
  b.push_back(ArgBinding::output(0));
  b.push_back(ArgBinding::size(numel));
  return b;
}

// The output's element count, the plan's output and its expression for the kernel's `n`.
struct OutputShape {
  int64_t numel;
  std::string numel_expr;
  OutputSpec spec;
};

OutputShape output_shape(const OpSignature& sig, Pointwise op, bool in_place) {
  const TensorMeta& a = *tensor_arg(sig, 0);
  OutputSpec self = in_place ? OutputSpec::in_place(0) : OutputSpec::like(0);
  // Note [Broadcast plan]: a non-contiguous self gives the output self's layout.
  if (!broadcasting(sig, op) || !a.is_contiguous()) return {a.numel(), "numel0", std::move(self)};
  const BroadcastPlan p = *broadcast_plan(a, *tensor_arg(sig, 1));
  return {out_numel(p), out_numel_expr(p), in_place ? std::move(self) : broadcast_output(p, a.dtype)};
}

// Whether vectors of `vec` elements suit the signature: aligned inputs, and for the broadcasting
// kernel a vector that stays within a row of the innermost dimension and, for an input read in
// vectors (innermost stride 1), starts at an aligned element: each of its outer strides a multiple
// of `vec`. A view with gapped rows (a row stride of 11 elements) is read one element at a time
// (vec 1); its vector loads faulted on an H100 (CUDA_ERROR_MISALIGNED_ADDRESS, the CUDA property
// sweep of 61f8b86), where the CPU's unaligned loads had passed.
bool vec_fits(const OpSignature& sig, Pointwise op, int64_t vec) {
  if (!vector_fits(sig, vec)) return false;
  if (!broadcasting(sig, op)) return true;
  const BroadcastPlan p = *broadcast_plan(*tensor_arg(sig, 0), *tensor_arg(sig, 1));
  if (p.dims[0] % vec != 0) return false;
  for (const std::vector<int64_t>* strides : {&p.sa, &p.sb}) {
    if ((*strides)[0] != 1) continue;
    for (size_t d = 1; d < strides->size(); ++d) {
      if ((*strides)[d] % vec != 0) return false;
    }
  }
  return true;
}

// The formulas' source for a backend.
std::string formulas(const OpSignature& sig, Pointwise op, Backend backend, bool in_place) {
  std::string s = backend == Backend::kCuda ? "#define KF_DEVICE __device__\n" : "#define KF_DEVICE\n";
  s += in_place ? "#define KF_RESTRICT\n" : "#define KF_RESTRICT __restrict__\n";
  // hardswish's 1/6: PyTorch's CUDA kernel multiplies by it, its CPU kernel divides by 6.
  if (op == Pointwise::kHardswish) {
    s += backend == Backend::kCuda ? "#define KF_SIXTH 0.16666666666666666f\n" : "#define KF_SIXTH (1.0f / 6.0f)\n";
  }
  if (backend == Backend::kCpu) s += "typedef int64_t kf_i64;\n";
  if (is_binary(op)) s += kBinaryOp;
  s += broadcasting(sig, op) ? kBroadcastOffsets : kPointwiseFormulas;
  return s;
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum PointwiseCudaKnob : size_t { kBlock, kVec, kItems };

// The family's name: "relu", its in-place variant's "relu_".
std::string family_name(Pointwise op, bool in_place) { return std::string(info(op).family) + (in_place ? "_" : ""); }

class PointwiseCuda final : public FamilyBase {
 public:
  PointwiseCuda(Pointwise op, bool in_place)
      : FamilyBase(family_name(op, in_place), Backend::kCuda, flat_cuda_knobs()), op_(op), in_place_(in_place) {}

  bool applies(const OpSignature& sig) const override { return matches(sig, op_, Backend::kCuda, in_place_); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t numel = output_shape(sig, op_, in_place_).numel;
    // No block whose work would be mostly missing; the smallest configuration always fits.
    return vec_fits(sig, op_, v[kVec]) && flat_cuda_fits(numel, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cuda_prior(dtype_size_bytes(tensor_arg(sig, 0)->dtype), output_shape(sig, op_, in_place_).numel, v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = {dtype_define(x.dtype)};
    for (std::string& d : op_defines(sig, op_)) options.push_back(std::move(d));
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems])}) {
      options.push_back(std::move(d));
    }
    const bool binary = broadcasting(sig, op_);
    const std::string entry = binary ? "kf_binary" : "kf_pointwise";
    KernelSpec s = one_launch_spec(Backend::kCuda,
                                   std::string(kCudaPrelude) + formulas(sig, op_, Backend::kCuda, in_place_) +
                                       (binary ? kCudaBinary : kCudaPointwise),
                                   entry, options);
    OutputShape out = output_shape(sig, op_, in_place_);
    s.plan.outputs = {std::move(out.spec)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + out.numel_expr + ", " + std::to_string(v[kBlock] * v[kVec] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = bindings(sig, op_, out.numel_expr);
    return s;
  }

 private:
  Pointwise op_;
  bool in_place_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class PointwiseCpu final : public FamilyBase {
 public:
  PointwiseCpu(Pointwise op, bool in_place)
      : FamilyBase("cpu." + family_name(op, in_place), Backend::kCpu, flat_cpu_knobs()), op_(op), in_place_(in_place) {}

  bool applies(const OpSignature& sig) const override { return matches(sig, op_, Backend::kCpu, in_place_); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_fits(output_shape(sig, op_, in_place_).numel, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    return flat_cpu_prior(output_shape(sig, op_, in_place_).numel, v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    std::vector<std::string> options = cpu_base_options(sig);
    for (std::string& d : op_defines(sig, op_)) options.push_back(std::move(d));
    options.push_back(define("KF_CHUNK", v[0]));
    const bool binary = broadcasting(sig, op_);
    KernelSpec s = one_launch_spec(Backend::kCpu,
                                   std::string(kCpuPrelude) + formulas(sig, op_, Backend::kCpu, in_place_) +
                                       (binary ? kCpuBinary : kCpuPointwise),
                                   binary ? "kf_binary" : "kf_pointwise", options);
    OutputShape out = output_shape(sig, op_, in_place_);
    s.plan.outputs = {std::move(out.spec)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + out.numel_expr + ", " + std::to_string(v[0]) + ")";
    l.args = bindings(sig, op_, out.numel_expr);
    return s;
  }

 private:
  Pointwise op_;
  bool in_place_;
};

template <Pointwise Op, bool InPlace = false>
std::unique_ptr<KernelTemplate> make_cuda() {
  return std::make_unique<PointwiseCuda>(Op, InPlace);
}
template <Pointwise Op, bool InPlace = false>
std::unique_ptr<KernelTemplate> make_cpu() {
  return std::make_unique<PointwiseCpu>(Op, InPlace);
}

}  // namespace

// One CUDA family ("gelu", "mul", ...) and its "cpu." twin per operator of kInfo.
const FamilyRegistration kRegistered{
    make_cuda<Pointwise::kGelu>, make_cuda<Pointwise::kSilu>, make_cuda<Pointwise::kRelu>,
    make_cuda<Pointwise::kSigmoid>, make_cuda<Pointwise::kTanh>, make_cuda<Pointwise::kHardswish>,
    make_cuda<Pointwise::kNeg>, make_cuda<Pointwise::kRsqrt>, make_cuda<Pointwise::kExp>, make_cuda<Pointwise::kPow>,
    make_cuda<Pointwise::kAdd>, make_cuda<Pointwise::kSub>,
    make_cuda<Pointwise::kMul>, make_cuda<Pointwise::kDiv>, make_cuda<Pointwise::kMulScalar>,
    make_cuda<Pointwise::kClampMin>,
    make_cpu<Pointwise::kGelu>, make_cpu<Pointwise::kSilu>, make_cpu<Pointwise::kRelu>,
    make_cpu<Pointwise::kSigmoid>, make_cpu<Pointwise::kTanh>, make_cpu<Pointwise::kHardswish>,
    make_cpu<Pointwise::kNeg>, make_cpu<Pointwise::kRsqrt>, make_cpu<Pointwise::kExp>, make_cpu<Pointwise::kPow>,
    make_cpu<Pointwise::kAdd>, make_cpu<Pointwise::kSub>,
    make_cpu<Pointwise::kMul>, make_cpu<Pointwise::kDiv>, make_cpu<Pointwise::kMulScalar>,
    make_cpu<Pointwise::kClampMin>,
    // The in-place variants (PointwiseInfo::in_place): "relu_", "cpu.relu_", ...
    make_cuda<Pointwise::kRelu, true>, make_cuda<Pointwise::kAdd, true>, make_cuda<Pointwise::kMul, true>,
    make_cpu<Pointwise::kRelu, true>, make_cpu<Pointwise::kAdd, true>, make_cpu<Pointwise::kMul, true>,
    make_cuda<Pointwise::kClampMin, true>, make_cpu<Pointwise::kClampMin, true>,
};

}  // namespace kforge::search::templates

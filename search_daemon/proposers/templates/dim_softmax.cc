// aten::_softmax, aten::_log_softmax and aten::_safe_softmax over a dimension that is not the last
// (the last is row_softmax.cc's): a contiguous input seen as [outer, len, inner], inner > 1 (the
// product of the sizes after dim), each of the outer * inner columns normalized over its len
// elements, inner apart in memory. That is a softmax over channels of an NCHW map, over the
// heads or the sequence of a [B, S, H] tensor, a log_softmax over dim 0 of a [classes, batch]
// matrix. A column's elements are read by one thread (CUDA: neighbouring threads take
// neighbouring columns, so each of the len steps is one coalesced row of the [len, inner] slice;
// CPU: a chunk of KF_CHUNK neighbouring columns per pass, so the inner loops vectorize).
//
// Two passes over the column for the max and the sum of exp(x - max), accumulated in double for
// float32 and float for 16-bit data (kf_acc; Note [Template arithmetic] in template_family.cc),
// then a pass that writes; the non-finite cases and KF_SAFE behave as in row_softmax.cc's two-pass
// kernel (Note [Online softmax], Note [Safe softmax] there): a NaN or +inf in the column makes it
// NaN, a column of -inf is NaN (softmax) or 0 (KF_SAFE).
#include <algorithm>

#include "search_daemon/proposers/templates/softmax_call.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaDimSoftmax = R"kf(
// KF_LOG: log_softmax; KF_SAFE: _safe_softmax. Thread t takes column t: outer index t / inner,
// inner index t % inner.
__device__ __forceinline__ float kf_exp_shifted(float x, float m) {
#if KF_SAFE
  return x == KF_NEG_INF ? 0.0f : expf(x - m);
#else
  return expf(x - m);
#endif
}
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_dim_softmax(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 columns, kf_i64 len, kf_i64 inner) {
  const kf_i64 t = (kf_i64)blockIdx.x * KF_BLOCK + threadIdx.x;
  if (t >= columns) return;
  const kf_i64 o = t / inner;
  const kf_i64 base = o * len * inner + (t - o * inner);
  const kf_t* __restrict__ xc = x + base;
  kf_t* __restrict__ yc = y + base;
  float m = KF_NEG_INF;
  for (kf_i64 l = 0; l < len; ++l) {
    const float v = kf_to_float(xc[l * inner]);
    m = v != v ? v : fmaxf(m, v);   // fmaxf alone would drop a NaN
    if (m != m) break;
  }
  kf_acc s = 0;
  for (kf_i64 l = 0; l < len; ++l) s += (kf_acc)kf_exp_shifted(kf_to_float(xc[l * inner]), m);
  const bool dead = KF_SAFE && s == (kf_acc)0;   // every element -inf
#if KF_LOG
  const float ls = (float)kf_log(s);
  for (kf_i64 l = 0; l < len; ++l) {
    const float v = kf_to_float(xc[l * inner]);
    yc[l * inner] = kf_from_float(dead ? 0.0f : (v - m) - ls);
  }
#else
  const float r = (float)((kf_acc)1 / s);
  for (kf_i64 l = 0; l < len; ++l) {
    yc[l * inner] = kf_from_float(dead ? 0.0f : kf_exp_shifted(kf_to_float(xc[l * inner]), m) * r);
  }
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

class DimSoftmaxCuda final : public FamilyBase {
 public:
  explicit DimSoftmaxCuda(Softmax kind)
      : FamilyBase(softmax_family_name(kind, Backend::kCuda, "_dim"), Backend::kCuda, {Knob{"block", {64, 128, 256, 512}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return softmax_dim(sig, kind_, Backend::kCuda) >= 0; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t columns = x.numel() / x.sizes[static_cast<size_t>(softmax_dim(sig, kind_, Backend::kCuda))];
    return v[0] <= std::max<int64_t>(64, pow2_ceil(columns));   // no block mostly idle
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[0]), 256, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, softmax_dim(sig, kind_, Backend::kCuda));
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_BLOCK", v[0])};
    for (std::string& d : softmax_kind_defines(kind_)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaDimSoftmax, "kf_dim_softmax", options);
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

// "softmax_dim", "log_softmax_dim", "safe_softmax_dim" and their "cpu." twins.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCuda>(Softmax::kSafe); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kSoftmax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kLog); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<DimSoftmaxCpu>(Softmax::kSafe); },
};

}  // namespace kforge::search::templates

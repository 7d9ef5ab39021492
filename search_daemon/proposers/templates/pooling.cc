// aten::max_pool2d_with_indices (resnet's stem; F.max_pool2d) of a contiguous [N, C, H, W] input:
// the window geometry and output size are the catalog's (catalog::pool2d_geometry), compiled in.
// Each output element walks its window as PyTorch's kernels do, row by row, each row left to
// right, from maxval = -inf and maxidx = the first in-bounds element, taking an element when
// val > maxval or val is NaN: ties keep the first maximum, a window with NaNs gives its last NaN
// (both backends of torch 2.11 behave so). The values are input values, exact; the indices
// (h * W + w within the plane, int64) are checked exactly by the worker.
#include <algorithm>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

// KF_KH..KF_OW: catalog::Pool2d. The window of output (oh, ow) as PyTorch computes it.
const char* const kPoolWindow = R"kf(
#define KF_WINDOW(oh, ow, hs, he, ws, we)                                     \
  kf_i64 hs = (oh) * KF_SH - KF_PH;                                          \
  kf_i64 ws = (ow) * KF_SW - KF_PW;                                          \
  const kf_i64 he = hs + (KF_KH - 1) * KF_DH + 1 < KF_H ? hs + (KF_KH - 1) * KF_DH + 1 : KF_H; \
  const kf_i64 we = ws + (KF_KW - 1) * KF_DW + 1 < KF_W ? ws + (KF_KW - 1) * KF_DW + 1 : KF_W; \
  while (hs < 0) hs += KF_DH;                                                \
  while (ws < 0) ws += KF_DW;
)kf";

const char* const kCudaMaxPool = R"kf(
// One output element per thread (KF_ITEMS per thread, KF_BLOCK apart) of [planes = N*C, OH, OW].
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_max_pool2d(const kf_t* __restrict__ x, kf_t* __restrict__ y, long long* __restrict__ idx, kf_i64 n) {
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= n) continue;
    const kf_i64 ow = i % KF_OW;
    const kf_i64 oh = (i / KF_OW) % KF_OH;
    const kf_i64 plane = i / (KF_OW * KF_OH);
    const kf_t* __restrict__ xp = x + plane * (KF_H * KF_W);
    KF_WINDOW(oh, ow, hs, he, ws, we)
    kf_i64 best = hs * KF_W + ws;
    float m = KF_NEG_INF;
    for (kf_i64 h = hs; h < he; h += KF_DH) {
      for (kf_i64 w = ws; w < we; w += KF_DW) {
        const float v = kf_to_float(xp[h * KF_W + w]);
        if (v > m || v != v) {
          m = v;
          best = h * KF_W + w;
        }
      }
    }
    y[i] = kf_from_float(m);
    idx[i] = best;
  }
}
)kf";

const char* const kCpuMaxPool = R"kf(
// KF_ROWS output rows (of OW elements) per block, rows numbered over [planes = N*C, OH].
extern "C" void kf_max_pool2d(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  int64_t* __restrict__ idx = KF_PTR(int64_t, 2);
  const int64_t rows = KF_I64(3);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH, plane = r / KF_OH;
    const float* __restrict__ xp = x + plane * (KF_H * KF_W);
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      KF_WINDOW(oh, ow, hs, he, ws, we)
      int64_t best = hs * KF_W + ws;
      float m = -INFINITY;
      for (int64_t h = hs; h < he; h += KF_DH) {
        for (int64_t w = ws; w < we; w += KF_DW) {
          const float v = xp[h * KF_W + w];
          if (v > m || v != v) {
            m = v;
            best = h * KF_W + w;
          }
        }
      }
      y[r * KF_OW + ow] = m;
      idx[r * KF_OW + ow] = best;
    }
  }
}
)kf";

std::optional<catalog::Pool2d> max_pool_args(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::max_pool2d_with_indices" || !sig.overload.empty() || sig.args.size() != 6) return std::nullopt;
  const TensorMeta* x = tensor_arg(sig, 0);
  if (!template_tensor(x, backend) || x->sizes.size() != 4) return std::nullopt;
  return catalog::pool2d_geometry(sig);
}

std::vector<std::string> pool_defines(const catalog::Pool2d& g) {
  return {define("KF_KH", g.kh), define("KF_KW", g.kw), define("KF_SH", g.sh), define("KF_SW", g.sw),
          define("KF_PH", g.ph), define("KF_PW", g.pw), define("KF_DH", g.dh), define("KF_DW", g.dw),
          define("KF_H", g.h),   define("KF_W", g.w),   define("KF_OH", g.oh), define("KF_OW", g.ow)};
}

// [N, C, OH, OW] contiguous: the values in self's dtype, the indices int64.
std::vector<OutputSpec> pool_outputs(DType t, const catalog::Pool2d& g) {
  const std::string plane = std::to_string(g.oh * g.ow);
  std::vector<std::string> sizes = {size_name(0, 0), size_name(0, 1), std::to_string(g.oh), std::to_string(g.ow)};
  std::vector<std::string> strides = {size_name(0, 1) + " * " + plane, plane, std::to_string(g.ow), "1"};
  return {OutputSpec::explicit_layout(t, sizes, strides), OutputSpec::explicit_layout(DType::kInt64, sizes, strides)};
}

std::string planes_expr() { return size_name(0, 0) + " * " + size_name(0, 1); }

// ---- CUDA ------------------------------------------------------------------------------------------

enum MaxPoolCudaKnob : size_t { kBlock, kItems };

class MaxPoolCuda final : public FamilyBase {
 public:
  MaxPoolCuda()
      : FamilyBase("max_pool2d", Backend::kCuda, {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"items", {1, 2, 4}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return max_pool_args(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const catalog::Pool2d g = *max_pool_args(sig, Backend::kCuda);
    const TensorMeta& x = *tensor_arg(sig, 0);
    return v[kBlock] * v[kItems] <= std::max<int64_t>(64, pow2_ceil(x.sizes[0] * x.sizes[1] * g.oh * g.ow));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[kBlock]), 256, 0.3) * closeness(static_cast<double>(v[kItems]), 1, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const catalog::Pool2d g = *max_pool_args(sig, Backend::kCuda);
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = {dtype_define(x.dtype), define("KF_BLOCK", v[kBlock]), define("KF_ITEMS", v[kItems])};
    for (std::string& d : pool_defines(g)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kPoolWindow + kCudaMaxPool,
                                   "kf_max_pool2d", options);
    s.plan.outputs = pool_outputs(x.dtype, g);
    Launch& l = s.plan.launches[0];
    const std::string n = planes_expr() + " * " + std::to_string(g.oh * g.ow);
    l.grid[0] = "ceil_div(" + n + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::output(1), ArgBinding::size(n)};
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

class MaxPoolCpu final : public FamilyBase {
 public:
  MaxPoolCpu() : FamilyBase("cpu.max_pool2d", Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return max_pool_args(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const catalog::Pool2d g = *max_pool_args(sig, Backend::kCpu);
    const TensorMeta& x = *tensor_arg(sig, 0);
    return v[0] <= std::max<int64_t>(1, pow2_ceil(x.sizes[0] * x.sizes[1] * g.oh));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const catalog::Pool2d g = *max_pool_args(sig, Backend::kCpu);
    const double ideal = std::clamp(4096.0 / static_cast<double>(g.ow * g.kh * g.kw), 1.0, 256.0);
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const catalog::Pool2d g = *max_pool_args(sig, Backend::kCpu);
    const TensorMeta& x = *tensor_arg(sig, 0);
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_ROWS", v[0]));
    for (std::string& d : pool_defines(g)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + "typedef int64_t kf_i64;\n" + kPoolWindow +
                                                      kCpuMaxPool,
                                   "kf_max_pool2d", options);
    s.plan.outputs = pool_outputs(x.dtype, g);
    Launch& l = s.plan.launches[0];
    const std::string rows = planes_expr() + " * " + std::to_string(g.oh);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::output(1), ArgBinding::size(rows)};
    return s;
  }
};

}  // namespace

// "max_pool2d" (CUDA) and "cpu.max_pool2d".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<MaxPoolCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<MaxPoolCpu>(); },
};

}  // namespace kforge::search::templates

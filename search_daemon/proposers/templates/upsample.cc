// aten::upsample_nearest2d (what F.interpolate(mode="nearest") calls: a UNet decoder's 2x
// upsampling) of a contiguous [N, C, H, W] input to [N, C, OH, OW]: every output element a copy
// of one input element, so the result is exact and is checked bit for bit in effect.
//
// Note [Nearest source index]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch (UpSample.h, both backends) takes source row ih = min(floor(oh * sh), H - 1), the
// product and the floor in float32, with sh = (float)(1.0 / scales_h) when scales_h is given and
// positive, else (float)H / OH. The family computes sh on the host exactly so, in float, and
// compiles it in as a hexadecimal float literal (bit-exact), and the kernels compute
// floorf((float)oh * sh) as PyTorch does: one rounding of the product, then the floor (the
// kernels are compiled without contraction into anything else: there is only the multiply).
// OH == 2H then gives oh / 2 and OH == H the identity, PyTorch's special cases, with no branch.
#include <algorithm>
#include <cstdio>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaUpsampleNearest = R"kf(
// Output element i (KF_ITEMS per thread, KF_BLOCK apart) of [rows = N*C*OH, OW]; KF_SH and KF_SW
// the float scales (Note [Nearest source index]).
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_upsample_nearest(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 n) {
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= n) continue;
    const kf_i64 ow = i % KF_OW;
    const kf_i64 r = i / KF_OW;        // n * C * OH + oh
    const kf_i64 oh = r % KF_OH;
    const kf_i64 plane = r / KF_OH;    // n * C + c
    const kf_i64 ih = min((kf_i64)floorf((float)oh * KF_SH), (kf_i64)KF_H - 1);
    const kf_i64 iw = min((kf_i64)floorf((float)ow * KF_SW), (kf_i64)KF_W - 1);
    y[i] = x[(plane * KF_H + ih) * KF_W + iw];
  }
}
)kf";

const char* const kCpuUpsampleNearest = R"kf(
// KF_ROWS output rows (of OW elements) per block; the source column of each output column
// computed once per block.
extern "C" void kf_upsample_nearest(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t rows = KF_I64(2);
  int64_t src_w[KF_OW];
  for (int64_t ow = 0; ow < KF_OW; ++ow) {
    const int64_t iw = (int64_t)floorf((float)ow * KF_SW);
    src_w[ow] = iw < KF_W - 1 ? iw : KF_W - 1;
  }
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH, plane = r / KF_OH;
    int64_t ih = (int64_t)floorf((float)oh * KF_SH);
    ih = ih < KF_H - 1 ? ih : KF_H - 1;
    const float* __restrict__ src = x + (plane * KF_H + ih) * KF_W;
    float* __restrict__ dst = y + r * KF_OW;
    for (int64_t ow = 0; ow < KF_OW; ++ow) dst[ow] = src[src_w[ow]];
  }
}
)kf";

struct UpsampleArgs {
  const TensorMeta* x = nullptr;
  int64_t h = 0, w = 0, oh = 0, ow = 0;
  float sh = 0, sw = 0;   // Note [Nearest source index]
};

// PyTorch's compute_scales_value<float>.
float source_scale(const Arg& scale, int64_t in, int64_t out) {
  if (const auto* s = std::get_if<double>(&scale.value); s != nullptr && *s > 0) {
    return static_cast<float>(1.0 / *s);
  }
  return static_cast<float>(in) / static_cast<float>(out);
}

std::optional<UpsampleArgs> upsample_args(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::upsample_nearest2d" || !sig.overload.empty() || sig.args.size() != 4) return std::nullopt;
  UpsampleArgs a;
  a.x = tensor_arg(sig, 0);
  if (!template_tensor(a.x, backend) || a.x->sizes.size() != 4) return std::nullopt;
  const auto* out = std::get_if<std::vector<int64_t>>(&sig.args[1].value);
  if (out == nullptr || out->size() != 2 || (*out)[0] <= 0 || (*out)[1] <= 0) return std::nullopt;
  for (size_t i : {2u, 3u}) {   // None or a float
    if (!is_none(sig, i) && !std::holds_alternative<double>(sig.args[i].value)) return std::nullopt;
  }
  a.h = a.x->sizes[2];
  a.w = a.x->sizes[3];
  a.oh = (*out)[0];
  a.ow = (*out)[1];
  // Sizes the CPU kernel keeps on its stack (a column table of OW entries), and no empty input.
  if (a.h <= 0 || a.w <= 0 || a.ow > 16384) return std::nullopt;
  a.sh = source_scale(sig.args[2], a.h, a.oh);
  a.sw = source_scale(sig.args[3], a.w, a.ow);
  return a;
}

// A float as a C hexadecimal literal: the exact value, whatever the compiler's decimal parsing.
std::string float_literal(float f) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%af", static_cast<double>(f));
  return buf;
}

std::vector<std::string> upsample_defines(const UpsampleArgs& a) {
  return {define("KF_H", a.h), define("KF_W", a.w), define("KF_OH", a.oh), define("KF_OW", a.ow),
          "-DKF_SH=" + float_literal(a.sh), "-DKF_SW=" + float_literal(a.sw)};
}

// [N, C, OH, OW] contiguous, of self's dtype.
OutputSpec upsample_output(const UpsampleArgs& a) {
  return OutputSpec::explicit_layout(
      a.x->dtype, {size_name(0, 0), size_name(0, 1), std::to_string(a.oh), std::to_string(a.ow)},
      {size_name(0, 1) + " * " + std::to_string(a.oh * a.ow), std::to_string(a.oh * a.ow), std::to_string(a.ow), "1"});
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum UpsampleCudaKnob : size_t { kBlock, kItems };

class UpsampleNearestCuda final : public FamilyBase {
 public:
  UpsampleNearestCuda()
      : FamilyBase("upsample_nearest2d", Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"items", {1, 2, 4, 8}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return upsample_args(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCuda);
    const int64_t n = a.x->sizes[0] * a.x->sizes[1] * a.oh * a.ow;
    return v[kBlock] * v[kItems] <= std::max<int64_t>(64, pow2_ceil(n));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[kBlock]), 256, 0.3) * closeness(static_cast<double>(v[kItems]), 4, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCuda);
    std::vector<std::string> options = {dtype_define(a.x->dtype), define("KF_BLOCK", v[kBlock]),
                                        define("KF_ITEMS", v[kItems])};
    for (std::string& d : upsample_defines(a)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaUpsampleNearest,
                                   "kf_upsample_nearest", options);
    s.plan.outputs = {upsample_output(a)};
    Launch& l = s.plan.launches[0];
    const std::string n = size_name(0, 0) + " * " + size_name(0, 1) + " * " + std::to_string(a.oh * a.ow);
    l.grid[0] = "ceil_div(" + n + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(n)};
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

class UpsampleNearestCpu final : public FamilyBase {
 public:
  UpsampleNearestCpu()
      : FamilyBase("cpu.upsample_nearest2d", Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return upsample_args(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu);
    return v[0] <= std::max<int64_t>(1, pow2_ceil(a.x->sizes[0] * a.x->sizes[1] * a.oh));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu);
    const double ideal = std::clamp(16384.0 / static_cast<double>(a.ow), 1.0, 256.0);   // about 16K elements a block
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_ROWS", v[0]));
    for (std::string& d : upsample_defines(a)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuUpsampleNearest, "kf_upsample_nearest",
                                   options);
    s.plan.outputs = {upsample_output(a)};
    Launch& l = s.plan.launches[0];
    const std::string rows = size_name(0, 0) + " * " + size_name(0, 1) + " * " + std::to_string(a.oh);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows)};
    return s;
  }
};

}  // namespace

// "upsample_nearest2d" (CUDA) and "cpu.upsample_nearest2d".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleNearestCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleNearestCpu>(); },
};

}  // namespace kforge::search::templates

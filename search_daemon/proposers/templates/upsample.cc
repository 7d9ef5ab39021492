// aten::upsample_nearest2d and aten::upsample_bilinear2d (what F.interpolate(mode="nearest") and
// mode="bilinear" call: a UNet decoder's 2x upsampling, a segmentation head's resize) of a
// contiguous or channels-last [N, C, H, W] input to [N, C, OH, OW] of the same layout. Nearest: every output element a copy of one
// input element, so the result is exact and is checked bit for bit in effect. Bilinear: PyTorch's
// float32 source coordinates and weights (Note [Bilinear source coordinate]).
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
//
// Note [Bilinear source coordinate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch (UpSample.h: area_pixel_compute_scale, area_pixel_compute_source_index) computes, in
// float32 for every floating dtype, the scale rh = (float)(H - 1) / (OH - 1) with align_corners
// (0 for OH == 1), else as the nearest scale above; and the source row r = rh * oh with
// align_corners, else max(rh * (oh + 0.5) - 0.5, 0). Row h0 = (int)r, h1 = h0 + 1 inside the
// input (else h0), weight lh = r - h0. The host computes rh as PyTorch does and compiles it in
// exactly (a hex float). The result is the two lerps nested as PyTorch nests them, so a zero weight
// on an Inf neighbour gives NaN where PyTorch's does. The CPU kernel's guard (h0 at most H - 1, the
// weight in [0, 1]) is kept on both backends; the family refuses scales that would take the last
// source row or column past the input, where PyTorch's CUDA kernel would read outside it.
#include <algorithm>
#include <cstdio>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaUpsampleNearest = R"kf(
// Output group g (KF_ITEMS per thread, KF_BLOCK apart) of KF_VEC neighbouring output elements in
// the output's storage order, written in one access: KF_VEC columns of one output row (OW a
// multiple of KF_VEC), or KF_VEC channels of one pixel when channels-last (C a multiple, and then
// one access reads them too). KF_SH and KF_SW the float scales (Note [Nearest source index]).
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_upsample_nearest(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 n) {
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 g = first + (kf_i64)it * KF_BLOCK;
    const kf_i64 i = g * KF_VEC;
    if (i >= n) continue;
    KF_POSITION(i, oh, ow, base)
    const kf_i64 ih = min((kf_i64)floorf((float)oh * KF_SH), (kf_i64)KF_H - 1);
#if KF_CL
    const kf_i64 iw = min((kf_i64)floorf((float)ow * KF_SW), (kf_i64)KF_W - 1);
    reinterpret_cast<kf_vec<KF_VEC>*>(y)[g] = *reinterpret_cast<const kf_vec<KF_VEC>*>(x + base + KF_AT(ih, iw));
#else
    kf_vec<KF_VEC> r;
#pragma unroll
    for (int k = 0; k < KF_VEC; ++k) {
      const kf_i64 iw = min((kf_i64)floorf((float)(ow + k) * KF_SW), (kf_i64)KF_W - 1);
      r.v[k] = x[base + KF_AT(ih, iw)];
    }
    reinterpret_cast<kf_vec<KF_VEC>*>(y)[g] = r;
#endif
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
  for (int64_t r = r0; r < r1; ++r) {   // rows of [N*C, OH], or of [N, OH] channels-last
    const int64_t oh = r % KF_OH, plane = r / KF_OH;
    int64_t ih = (int64_t)floorf((float)oh * KF_SH);
    ih = ih < KF_H - 1 ? ih : KF_H - 1;
#if KF_CL
    const float* __restrict__ src = x + (plane * KF_H + ih) * KF_W * KF_C;
    float* __restrict__ dst = y + r * KF_OW * KF_C;
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      for (int64_t c = 0; c < KF_C; ++c) dst[ow * KF_C + c] = src[src_w[ow] * KF_C + c];
    }
#else
    const float* __restrict__ src = x + (plane * KF_H + ih) * KF_W;
    float* __restrict__ dst = y + r * KF_OW;
    for (int64_t ow = 0; ow < KF_OW; ++ow) dst[ow] = src[src_w[ow]];
#endif
  }
}
)kf";

const char* const kBilinearSource = R"kf(
// Note [Bilinear source coordinate]: the source index and weight of output index d along one axis.
#define KF_BILINEAR_SOURCE(d, scale, in, i0, i1, l1)                                   \
  const float i0##_r = KF_ALIGN ? (scale) * (float)(d)                                 \
                                : fmaxf((scale) * ((float)(d) + 0.5f) - 0.5f, 0.0f);   \
  const kf_i64 i0 = (kf_i64)i0##_r < (in) - 1 ? (kf_i64)i0##_r : (in) - 1;             \
  const kf_i64 i1 = i0 + (i0 < (in) - 1 ? 1 : 0);                                      \
  const float l1 = fminf(fmaxf(i0##_r - (float)i0, 0.0f), 1.0f);
)kf";

const char* const kCudaUpsampleBilinear = R"kf(
// Output element i (KF_ITEMS per thread, KF_BLOCK apart, in the output's storage order).
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_upsample_bilinear(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 n) {
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;
#pragma unroll
  for (int it = 0; it < KF_ITEMS; ++it) {
    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;
    if (i >= n) continue;
    KF_POSITION(i, oh, ow, base)
    const kf_t* __restrict__ xp = x + base;
    KF_BILINEAR_SOURCE(oh, KF_SH, KF_H, h0, h1, lh1)
    KF_BILINEAR_SOURCE(ow, KF_SW, KF_W, w0, w1, lw1)
    const float lh0 = 1.0f - lh1, lw0 = 1.0f - lw1;
    const float v = lh0 * (lw0 * kf_to_float(xp[KF_AT(h0, w0)]) + lw1 * kf_to_float(xp[KF_AT(h0, w1)])) +
                    lh1 * (lw0 * kf_to_float(xp[KF_AT(h1, w0)]) + lw1 * kf_to_float(xp[KF_AT(h1, w1)]));
    y[i] = kf_from_float(v);
  }
}
)kf";

const char* const kCpuUpsampleBilinear = R"kf(
// KF_ROWS output rows (of OW elements) per block; each output column's source and weight
// computed once per block.
extern "C" void kf_upsample_bilinear(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t rows = KF_I64(2);
  int32_t col0[KF_OW];
  float col_l1[KF_OW];
  for (int64_t ow = 0; ow < KF_OW; ++ow) {
    KF_BILINEAR_SOURCE(ow, KF_SW, KF_W, w0, w1, lw1)
    (void)w1;
    col0[ow] = (int32_t)w0;
    col_l1[ow] = lw1;
  }
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {   // rows of [N*C, OH], or of [N, OH] channels-last (KF_C each)
    const int64_t oh = r % KF_OH;
    const int64_t ch = KF_CL ? KF_C : 1;
    const float* __restrict__ xp = x + (r / KF_OH) * (KF_H * KF_W * ch);
    KF_BILINEAR_SOURCE(oh, KF_SH, KF_H, h0, h1, lh1)
    const float lh0 = 1.0f - lh1;
    const float* __restrict__ a = xp + h0 * KF_W * ch;
    const float* __restrict__ b = xp + h1 * KF_W * ch;
    float* __restrict__ dst = y + r * KF_OW * ch;
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      const int64_t w0 = col0[ow] * ch;
      const int64_t w1 = w0 + (col0[ow] < KF_W - 1 ? ch : 0);
      const float lw1 = col_l1[ow], lw0 = 1.0f - lw1;
      for (int64_t c = 0; c < ch; ++c) {
        dst[ow * ch + c] = lh0 * (lw0 * a[w0 + c] + lw1 * a[w1 + c]) + lh1 * (lw0 * b[w0 + c] + lw1 * b[w1 + c]);
      }
    }
  }
}
)kf";

struct UpsampleArgs {
  bool bilinear = false;
  bool channels_last = false;
  bool align_corners = false;   // bilinear
  const TensorMeta* x = nullptr;
  int64_t h = 0, w = 0, oh = 0, ow = 0;
  float sh = 0, sw = 0;   // Notes [Nearest source index], [Bilinear source coordinate]
};

// PyTorch's compute_scales_value<float>.
float source_scale(const Arg& scale, int64_t in, int64_t out) {
  if (const auto* s = std::get_if<double>(&scale.value); s != nullptr && *s > 0) {
    return static_cast<float>(1.0 / *s);
  }
  return static_cast<float>(in) / static_cast<float>(out);
}

// PyTorch's area_pixel_compute_scale<float>.
float bilinear_scale(bool align_corners, const Arg& scale, int64_t in, int64_t out) {
  if (align_corners) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  return source_scale(scale, in, out);
}

// The last source coordinate lies inside the input (Note [Bilinear source coordinate]).
bool bilinear_inside(bool align_corners, float scale, int64_t in, int64_t out) {
  const float d = static_cast<float>(out - 1);
  const float r = align_corners ? scale * d : std::max(scale * (d + 0.5f) - 0.5f, 0.0f);
  return r < static_cast<float>(in);
}

std::optional<UpsampleArgs> upsample_args(const OpSignature& sig, Backend backend, bool bilinear) {
  const std::string_view op = bilinear ? "aten::upsample_bilinear2d" : "aten::upsample_nearest2d";
  if (sig.op != op || !sig.overload.empty() || sig.args.size() != (bilinear ? 5u : 4u)) return std::nullopt;
  UpsampleArgs a;
  a.bilinear = bilinear;
  a.x = tensor_arg(sig, 0);
  const std::optional<bool> cl = contiguous_or_channels_last(a.x, backend);
  if (!cl || a.x->sizes.size() != 4) return std::nullopt;
  a.channels_last = *cl;
  const auto* out = std::get_if<std::vector<int64_t>>(&sig.args[1].value);
  if (out == nullptr || out->size() != 2 || (*out)[0] <= 0 || (*out)[1] <= 0) return std::nullopt;
  const size_t scales = bilinear ? 3 : 2;
  if (bilinear) {
    const auto* align = std::get_if<bool>(&sig.args[2].value);
    if (align == nullptr) return std::nullopt;
    a.align_corners = *align;
  }
  for (size_t i : {scales, scales + 1}) {   // None or a float
    if (!is_none(sig, i) && !std::holds_alternative<double>(sig.args[i].value)) return std::nullopt;
  }
  a.h = a.x->sizes[2];
  a.w = a.x->sizes[3];
  a.oh = (*out)[0];
  a.ow = (*out)[1];
  // Sizes the CPU kernel keeps on its stack (a column table of OW entries), and no empty input.
  if (a.h <= 0 || a.w <= 0 || a.ow > 16384) return std::nullopt;
  if (bilinear) {
    a.sh = bilinear_scale(a.align_corners, sig.args[scales], a.h, a.oh);
    a.sw = bilinear_scale(a.align_corners, sig.args[scales + 1], a.w, a.ow);
    if (!bilinear_inside(a.align_corners, a.sh, a.h, a.oh) || !bilinear_inside(a.align_corners, a.sw, a.w, a.ow)) {
      return std::nullopt;
    }
  } else {
    a.sh = source_scale(sig.args[scales], a.h, a.oh);
    a.sw = source_scale(sig.args[scales + 1], a.w, a.ow);
  }
  return a;
}

// A float as a C hexadecimal literal: the exact value, whatever the compiler's decimal parsing.
std::string float_literal(float f) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%af", static_cast<double>(f));
  return buf;
}

std::vector<std::string> upsample_defines(const UpsampleArgs& a) {
  std::vector<std::string> d = {define("KF_H", a.h),
                                define("KF_W", a.w),
                                define("KF_OH", a.oh),
                                define("KF_OW", a.ow),
                                define("KF_C", a.x->sizes[1]),
                                define("KF_CL", a.channels_last ? 1 : 0),
                                "-DKF_SH=" + float_literal(a.sh),
                                "-DKF_SW=" + float_literal(a.sw)};
  if (a.bilinear) d.push_back(define("KF_ALIGN", a.align_corners ? 1 : 0));
  return d;
}

std::string upsample_source(Backend backend, bool bilinear) {
  if (backend == Backend::kCuda) {
    return std::string(kCudaPrelude) + kCudaImagePosition +
           (bilinear ? std::string(kBilinearSource) + kCudaUpsampleBilinear : kCudaUpsampleNearest);
  }
  return std::string(kCpuPrelude) +
         (bilinear ? std::string("typedef int64_t kf_i64;\n") + kBilinearSource + kCpuUpsampleBilinear : kCpuUpsampleNearest);
}

const char* upsample_entry(bool bilinear) { return bilinear ? "kf_upsample_bilinear" : "kf_upsample_nearest"; }

std::string upsample_family(Backend backend, bool bilinear) {
  return std::string(backend == Backend::kCpu ? "cpu." : "") + (bilinear ? "upsample_bilinear2d" : "upsample_nearest2d");
}


// ---- CUDA ------------------------------------------------------------------------------------------

enum UpsampleCudaKnob : size_t { kBlock, kItems, kVec };

class UpsampleCuda final : public FamilyBase {
 public:
  explicit UpsampleCuda(bool bilinear)
      : FamilyBase(upsample_family(Backend::kCuda, bilinear), Backend::kCuda,
                   {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"items", {1, 2, 4, 8}, {}}, Knob{"vec", {1, 2, 4, 8}, {}}}),
        bilinear_(bilinear) {}

  bool applies(const OpSignature& sig) const override {
    return upsample_args(sig, Backend::kCuda, bilinear_).has_value();
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCuda, bilinear_);
    const int64_t n = a.x->sizes[0] * a.x->sizes[1] * a.oh * a.ow;
    if (v[kVec] > 1) {
      // Nearest only: groups of whole vectors within an output row (or a pixel's channels).
      if (bilinear_ || (a.channels_last ? a.x->sizes[1] : a.ow) % v[kVec] != 0 || !vector_fits(sig, v[kVec])) return false;
    }
    return v[kBlock] * v[kItems] * v[kVec] <= std::max<int64_t>(64, pow2_ceil(n));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    // 16-byte stores where they fit (the output is most of the traffic: 4x the input at 2x), and
    // about 4 elements' work per thread.
    const UpsampleArgs a = *upsample_args(sig, Backend::kCuda, bilinear_);
    const int64_t bytes = dtype_size_bytes(a.x->dtype);
    int64_t best_vec = 1;
    for (int64_t w : {2, 4, 8}) {
      if (!bilinear_ && (a.channels_last ? a.x->sizes[1] : a.ow) % w == 0 && vector_fits(sig, w) && w * bytes <= 16) best_vec = w;
    }
    return closeness(static_cast<double>(v[kBlock]), 256, 0.3) *
           closeness(static_cast<double>(v[kItems] * v[kVec]), static_cast<double>(std::max<int64_t>(4, best_vec)), 0.3) *
           closeness(static_cast<double>(v[kVec]), static_cast<double>(best_vec), 0.5);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCuda, bilinear_);
    std::vector<std::string> options = {dtype_define(a.x->dtype), define("KF_BLOCK", v[kBlock]),
                                        define("KF_ITEMS", v[kItems])};
    if (!bilinear_) options.push_back(define("KF_VEC", v[kVec]));
    for (std::string& d : upsample_defines(a)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, upsample_source(Backend::kCuda, bilinear_), upsample_entry(bilinear_),
                                   options);
    s.plan.outputs = {image_output(a.x->dtype, a.oh, a.ow, a.channels_last)};
    Launch& l = s.plan.launches[0];
    const std::string n = size_name(0, 0) + " * " + size_name(0, 1) + " * " + std::to_string(a.oh * a.ow);
    l.grid[0] = "ceil_div(" + n + ", " + std::to_string(v[kBlock] * v[kItems] * v[kVec]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(n)};
    return s;
  }

 private:
  bool bilinear_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class UpsampleCpu final : public FamilyBase {
 public:
  explicit UpsampleCpu(bool bilinear)
      : FamilyBase(upsample_family(Backend::kCpu, bilinear), Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256}, {}}}),
        bilinear_(bilinear) {}

  bool applies(const OpSignature& sig) const override {
    return upsample_args(sig, Backend::kCpu, bilinear_).has_value();
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu, bilinear_);
    return v[0] <= std::max<int64_t>(1, pow2_ceil(image_rows(*a.x, a.channels_last, a.oh)));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu, bilinear_);
    const double row = static_cast<double>(a.ow * (a.channels_last ? a.x->sizes[1] : 1));
    const double ideal = std::clamp(16384.0 / row, 1.0, 256.0);   // about 16K elements a block
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const UpsampleArgs a = *upsample_args(sig, Backend::kCpu, bilinear_);
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_ROWS", v[0]));
    for (std::string& d : upsample_defines(a)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCpu, upsample_source(Backend::kCpu, bilinear_), upsample_entry(bilinear_),
                                   options);
    s.plan.outputs = {image_output(a.x->dtype, a.oh, a.ow, a.channels_last)};
    Launch& l = s.plan.launches[0];
    const std::string rows = image_rows_expr(a.channels_last, a.oh);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[0]) + ")";
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(rows)};
    return s;
  }

 private:
  bool bilinear_;
};

}  // namespace

// "upsample_nearest2d", "upsample_bilinear2d" (CUDA) and their "cpu." twins.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleCuda>(false); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleCpu>(false); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleCuda>(true); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<UpsampleCpu>(true); },
};

}  // namespace kforge::search::templates

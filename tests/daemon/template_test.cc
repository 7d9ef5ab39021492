// The kernel template library and TemplateProposer (search_daemon/proposers/templates/).
//
// [templates] (ctest label 'unit'): what supports() accepts, what propose() and sample() give, that
//   every configuration of every family validates and resolves for several signatures, and that
//   every CUDA family compiles with NVRTC for sm_90 (no GPU needed; skipped without NVRTC).
// [cpu] (label 'integration'): CPU instances of every family, at default and sampled knobs, on
//   shapes whose rows and lengths are not multiples of the rows per block or the lanes, verified by
//   a real kforge-worker exactly as a search would (six trials with adversarial inputs): each must
//   come back verified. A failure here is a wrong kernel.
// [gpu] (label 'gpu'): the same for the CUDA families on cuda:0, every dtype.
// The worker is named by the environment, as in tests/worker/worker_eval_test.cc: KFORGE_WORKER,
// KFORGE_PYTHON, KFORGE_WORKER_LIB_DIR (ctest sets them).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/environment.h"
#include "runtime/nvrtc.h"
#include "runtime/op_catalog.h"
#include "search_daemon/evaluator/worker_process.h"
#include "search_daemon/proposers/templates/kernel_template.h"
#include "search_daemon/proposers/templates/template_family.h"
#include "search_daemon/proposers/templates/template_proposer.h"
#include "search_daemon/worker/builder.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::search;
using namespace kforge::search::templates;
using kforge::test_support::TempDir;

namespace {

// ---- signatures -----------------------------------------------------------------------------------

TensorMeta tensor(Backend b, DType dtype, std::vector<int64_t> sizes, uint32_t alignment = kMaxAlignment) {
  TensorMeta m = contiguous_tensor(dtype, b == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu, std::move(sizes));
  m.alignment = alignment;
  return m;
}

Target target(Backend b) { return b == Backend::kCuda ? Target{b, "sm_90"} : Target{b, "x86_64-avx2"}; }

OpSignature softmax(Backend b, DType t, std::vector<int64_t> sizes, bool log = false, int64_t dim = -1,
                    uint32_t alignment = kMaxAlignment) {
  return OpSignature{log ? "aten::_log_softmax" : "aten::_softmax",
                     "",
                     {Arg::tensor(tensor(b, t, sizes, alignment)), Arg::integer(dim), Arg::boolean(false)},
                     target(b)};
}

OpSignature layer_norm(Backend b, DType t, std::vector<int64_t> sizes, bool weight = true, bool bias = true) {
  const int64_t c = sizes.back();
  return OpSignature{"aten::native_layer_norm",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), Arg::int_list({c}),
                      weight ? Arg::tensor(tensor(b, t, {c})) : Arg::none(),
                      bias ? Arg::tensor(tensor(b, t, {c})) : Arg::none(), Arg::real(1e-5)},
                     target(b)};
}

OpSignature group_norm(Backend b, DType t, std::vector<int64_t> sizes, int64_t groups, bool affine = true) {
  int64_t hxw = 1;
  for (size_t d = 2; d < sizes.size(); ++d) hxw *= sizes[d];
  const int64_t c = sizes[1];
  return OpSignature{"aten::native_group_norm",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), affine ? Arg::tensor(tensor(b, t, {c})) : Arg::none(),
                      affine ? Arg::tensor(tensor(b, t, {c})) : Arg::none(), Arg::integer(sizes[0]), Arg::integer(c),
                      Arg::integer(hxw), Arg::integer(groups), Arg::real(1e-5)},
                     target(b)};
}

OpSignature gelu(Backend b, DType t, std::vector<int64_t> sizes, const std::string& approximate = "none",
                 uint32_t alignment = kMaxAlignment) {
  return OpSignature{"aten::gelu", "", {Arg::tensor(tensor(b, t, sizes, alignment)), Arg::string(approximate)},
                     target(b)};
}

OpSignature silu(Backend b, DType t, std::vector<int64_t> sizes) {
  return OpSignature{"aten::silu", "", {Arg::tensor(tensor(b, t, sizes))}, target(b)};
}

OpSignature relu(Backend b, DType t, std::vector<int64_t> sizes) {
  return OpSignature{"aten::relu", "", {Arg::tensor(tensor(b, t, sizes))}, target(b)};
}

OpSignature add(Backend b, DType t, std::vector<int64_t> sizes, Arg alpha = Arg::integer(1)) {
  return OpSignature{"aten::add", "Tensor",
                     {Arg::tensor(tensor(b, t, sizes)), Arg::tensor(tensor(b, t, sizes)), std::move(alpha)}, target(b)};
}

// native_batch_norm in inference over [N, C, *]; parameters of dtype `pd` (the input's by default).
OpSignature batch_norm(Backend b, DType t, std::vector<int64_t> sizes, bool affine = true,
                       std::optional<DType> pd = std::nullopt, bool training = false) {
  const int64_t c = sizes[1];
  const DType p = pd.value_or(t);
  return OpSignature{"aten::native_batch_norm",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), affine ? Arg::tensor(tensor(b, p, {c})) : Arg::none(),
                      affine ? Arg::tensor(tensor(b, p, {c})) : Arg::none(), Arg::tensor(tensor(b, p, {c})),
                      Arg::tensor(tensor(b, p, {c})), Arg::boolean(training), Arg::real(0.1), Arg::real(1e-5)},
                     target(b)};
}

// cudnn_batch_norm in inference over [N, C, *] (CUDA; float32 parameters, weight required).
OpSignature cudnn_batch_norm(DType t, std::vector<int64_t> sizes, bool bias = true) {
  const int64_t c = sizes[1];
  const Backend b = Backend::kCuda;
  const DType p = DType::kFloat32;
  return OpSignature{"aten::cudnn_batch_norm",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), Arg::tensor(tensor(b, p, {c})),
                      bias ? Arg::tensor(tensor(b, p, {c})) : Arg::none(), Arg::tensor(tensor(b, p, {c})),
                      Arg::tensor(tensor(b, p, {c})), Arg::boolean(false), Arg::real(0.1), Arg::real(1e-5)},
                     target(b)};
}

// sum.dim_IntList, mean.dim (dtype None) and amax over `dims` (nullopt: None).
OpSignature reduce(const std::string& op, Backend b, DType t, std::vector<int64_t> sizes,
                   std::optional<std::vector<int64_t>> dims, bool keepdim = false) {
  OpSignature s{"aten::" + op, op == "sum" ? "dim_IntList" : op == "mean" ? "dim" : "",
                {Arg::tensor(tensor(b, t, sizes)), dims ? Arg::int_list(*dims) : Arg::none(), Arg::boolean(keepdim)},
                target(b)};
  if (op != "amax") s.args.push_back(Arg::none());
  return s;
}

// argmax over `dim` (nullopt: None, the flattened tensor).
OpSignature argmax(Backend b, DType t, std::vector<int64_t> sizes, std::optional<int64_t> dim, bool keepdim = false) {
  return OpSignature{"aten::argmax",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), dim ? Arg::integer(*dim) : Arg::none(), Arg::boolean(keepdim)},
                     target(b)};
}

// sigmoid, tanh, hardswish, neg, rsqrt, exp.
OpSignature unary(const std::string& op, Backend b, DType t, std::vector<int64_t> sizes) {
  return OpSignature{"aten::" + op, "", {Arg::tensor(tensor(b, t, sizes))}, target(b)};
}

// pow.Tensor_Scalar with `exponent` (an int or float Arg).
OpSignature pow_scalar(Backend b, DType t, std::vector<int64_t> sizes, Arg exponent) {
  return OpSignature{"aten::pow", "Tensor_Scalar", {Arg::tensor(tensor(b, t, sizes)), std::move(exponent)}, target(b)};
}

// mul.Scalar: self times a number given as a Scalar.
OpSignature mul_scalar(Backend b, DType t, std::vector<int64_t> sizes, Arg other) {
  return OpSignature{"aten::mul", "Scalar", {Arg::tensor(tensor(b, t, std::move(sizes))), std::move(other)}, target(b)};
}

// clamp_min(self, min) with `min` an int or float Arg.
OpSignature clamp_min(Backend b, DType t, std::vector<int64_t> sizes, Arg min) {
  return OpSignature{"aten::clamp_min", "", {Arg::tensor(tensor(b, t, std::move(sizes))), std::move(min)}, target(b)};
}

// upsample_nearest2d of [N, C, H, W] `sizes` to `out` [OH, OW], with scales_h/scales_w when given.
OpSignature upsample_nearest(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> out,
                             std::optional<double> scale_h = std::nullopt, std::optional<double> scale_w = std::nullopt) {
  return OpSignature{"aten::upsample_nearest2d",
                     "",
                     {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::int_list(std::move(out)),
                      scale_h ? Arg::real(*scale_h) : Arg::none(), scale_w ? Arg::real(*scale_w) : Arg::none()},
                     target(b)};
}

// max_pool2d_with_indices with kernel `k`, stride `st` ({} : the kernel's), padding `pad`, dilation `dil`.
OpSignature max_pool(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> k, std::vector<int64_t> st,
                     std::vector<int64_t> pad, std::vector<int64_t> dil = {1, 1}, bool ceil_mode = false) {
  return OpSignature{"aten::max_pool2d_with_indices",
                     "",
                     {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::int_list(std::move(k)), Arg::int_list(std::move(st)),
                      Arg::int_list(std::move(pad)), Arg::int_list(std::move(dil)), Arg::boolean(ceil_mode)},
                     target(b)};
}

// cumsum along `dim`, dtype None.
OpSignature cumsum(Backend b, DType t, std::vector<int64_t> sizes, int64_t dim) {
  return OpSignature{"aten::cumsum", "", {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::integer(dim), Arg::none()},
                     target(b)};
}

// avg_pool2d with kernel `k`, stride `st` ({} : the kernel's), padding `pad`.
OpSignature avg_pool(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> k, std::vector<int64_t> st,
                     std::vector<int64_t> pad, bool ceil_mode = false, bool count_include_pad = true,
                     std::optional<int64_t> divisor = std::nullopt) {
  return OpSignature{"aten::avg_pool2d",
                     "",
                     {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::int_list(std::move(k)), Arg::int_list(std::move(st)),
                      Arg::int_list(std::move(pad)), Arg::boolean(ceil_mode), Arg::boolean(count_include_pad),
                      divisor ? Arg::integer(*divisor) : Arg::none()},
                     target(b)};
}

// _adaptive_avg_pool2d of [N, C, H, W] `sizes` to `out` [OH, OW].
OpSignature adaptive_avg_pool(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> out) {
  return OpSignature{"aten::_adaptive_avg_pool2d",
                     "",
                     {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::int_list(std::move(out))},
                     target(b)};
}

// upsample_bilinear2d of [N, C, H, W] `sizes` to `out` [OH, OW], with scales_h/scales_w when given.
OpSignature upsample_bilinear(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> out,
                              bool align_corners, std::optional<double> scale_h = std::nullopt,
                              std::optional<double> scale_w = std::nullopt) {
  return OpSignature{"aten::upsample_bilinear2d",
                     "",
                     {Arg::tensor(tensor(b, t, std::move(sizes))), Arg::int_list(std::move(out)),
                      Arg::boolean(align_corners), scale_h ? Arg::real(*scale_h) : Arg::none(),
                      scale_w ? Arg::real(*scale_w) : Arg::none()},
                     target(b)};
}

// cat of tensors of `sizes` (one per element) along `dim`.
OpSignature cat(Backend b, DType t, const std::vector<std::vector<int64_t>>& sizes, int64_t dim) {
  std::vector<TensorMeta> list;
  for (const std::vector<int64_t>& s : sizes) list.push_back(tensor(b, t, s));
  return OpSignature{"aten::cat", "", {Arg::tensor_list(std::move(list)), Arg::integer(dim)}, target(b)};
}

// cat with list element k a view of strides `strides` (Note [Cat rows] in cat.cc).
OpSignature with_element_strides(OpSignature s, size_t k, std::vector<int64_t> strides) {
  std::get<std::vector<TensorMeta>>(s.args[0].value).at(k).strides = std::move(strides);
  return s;
}

// rotate_half's cat((-x2, x1), -1): x1 the first half of the last dimension of q [B, H, S, D], q a
// view(B, S, H, D).transpose(1, 2); -x2 is contiguous.
OpSignature rotate_half_cat(Backend b, DType t, int64_t B, int64_t H, int64_t S, int64_t D) {
  return with_element_strides(cat(b, t, {{B, H, S, D / 2}, {B, H, S, D / 2}}, -1), 1, {S * H * D, D, H * D, 1});
}

// A KV cache cropped to S positions of S + 1 (a view along the sequence) and the step's new one.
OpSignature cropped_kv_cat(Backend b, DType t, int64_t B, int64_t H, int64_t S, int64_t D) {
  return with_element_strides(cat(b, t, {{B, H, S, D}, {B, H, 1, D}}, -2), 0, {H * (S + 1) * D, (S + 1) * D, D, 1});
}

// clone of a tensor of `sizes` and `strides` (empty: contiguous), memory_format `format` (an int
// of c10::MemoryFormat, or None).
OpSignature clone(Backend b, DType t, std::vector<int64_t> sizes, std::vector<int64_t> strides, Arg format) {
  TensorMeta m = tensor(b, t, sizes);
  if (!strides.empty()) m.strides = std::move(strides);
  return OpSignature{"aten::clone", "", {Arg::tensor(std::move(m)), std::move(format)}, target(b)};
}

// embedding of a [v, d] table with indices of `idx` sizes and dtype `it`.
OpSignature embedding(Backend b, DType t, int64_t v, int64_t d, std::vector<int64_t> idx, DType it = DType::kInt64) {
  return OpSignature{"aten::embedding",
                     "",
                     {Arg::tensor(tensor(b, t, {v, d})), Arg::tensor(tensor(b, it, std::move(idx))), Arg::integer(-1),
                      Arg::boolean(false), Arg::boolean(false)},
                     target(b)};
}

// add, sub (with alpha), mul, div .Tensor, with broadcasting.
OpSignature binary(const std::string& op, Backend b, DType t, std::vector<int64_t> a, std::vector<int64_t> other,
                   Arg alpha = Arg::integer(1)) {
  OpSignature s{"aten::" + op, "Tensor", {Arg::tensor(tensor(b, t, a)), Arg::tensor(tensor(b, t, other))}, target(b)};
  if (op == "add" || op == "sub") s.args.push_back(std::move(alpha));
  return s;
}

// _safe_softmax over the last dimension, dtype None.
OpSignature safe_softmax(Backend b, DType t, std::vector<int64_t> sizes, int64_t dim = -1) {
  return OpSignature{"aten::_safe_softmax", "", {Arg::tensor(tensor(b, t, sizes)), Arg::integer(dim), Arg::none()}, target(b)};
}

// _to_copy of `t` to the dtype of ScalarType code `code` (6 float32, 5 float16, 15 bfloat16, 7
// float64), everything else at its default.
OpSignature to_copy(Backend b, DType t, std::vector<int64_t> sizes, int64_t code) {
  return OpSignature{"aten::_to_copy",
                     "",
                     {Arg::tensor(tensor(b, t, sizes)), Arg::integer(code), Arg::none(), Arg::none(), Arg::none(),
                      Arg::boolean(false), Arg::none()},
                     target(b)};
}

// The in-place variant of `s` (relu_, add_.Tensor, mul_.Tensor): the same arguments, self written.
// Every 4-dimensional tensor argument of `s` made channels-last (same sizes; strides [H*W*C, 1, W*C, C]).
OpSignature channels_last(OpSignature s) {
  for (Arg& a : s.args) {
    auto* t = std::get_if<TensorMeta>(&a.value);
    if (t == nullptr || t->sizes.size() != 4) continue;
    const int64_t c = t->sizes[1], h = t->sizes[2], w = t->sizes[3];
    t->strides = {h * w * c, 1, w * c, c};
  }
  return s;
}

// Tensor argument i of `s` given `strides` (same sizes): a view in another order, or a slice.
OpSignature with_strides(OpSignature s, size_t i, std::vector<int64_t> strides) {
  std::get<TensorMeta>(s.args[i].value).strides = std::move(strides);
  return s;
}

// RoPE's q * cos: q [B, H, S, D] as view(B, S, H, D).transpose(1, 2) (dense, not contiguous), cos [1, 1, S, D].
OpSignature rope_mul(Backend b, DType t) {
  return with_strides(binary("mul", b, t, {2, 4, 6, 8}, {1, 1, 6, 8}), 0, {192, 8, 32, 1});
}

OpSignature in_place(OpSignature s) {
  s.op += "_";
  return s;
}

// add, sub, mul, div .Tensor with a Python number: `other` a 0-dimensional CPU tensor.
OpSignature with_number(const std::string& op, Backend b, DType t, std::vector<int64_t> a,
                        DType number = DType::kFloat64, Arg alpha = Arg::integer(1)) {
  TensorMeta n = tensor(Backend::kCpu, number, {});
  OpSignature s{"aten::" + op, "Tensor", {Arg::tensor(tensor(b, t, a)), Arg::tensor(n)}, target(b)};
  if (op == "add" || op == "sub") s.args.push_back(std::move(alpha));
  return s;
}

// Signatures of every family on one backend, in several shapes (ranks 1 to 4, odd lengths, one row,
// rows that no block size divides).
std::vector<OpSignature> signatures(Backend b) {
  std::vector<DType> dtypes = {DType::kFloat32};
  if (b == Backend::kCuda) dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  std::vector<OpSignature> out;
  for (DType t : dtypes) {
    for (bool log : {false, true}) {
      out.push_back(softmax(b, t, {37, 1000}, log));
      out.push_back(softmax(b, t, {2, 3, 5, 33}, log, 3));
      out.push_back(softmax(b, t, {50257}, log));
      out.push_back(softmax(b, t, {2, 3, 77}, log, 1));                      // not the last dimension
      out.push_back(softmax(b, t, {4, 8, 5, 5}, log, -3));                   // over the channels of NCHW
      out.push_back(softmax(b, t, {33, 7}, log, 0));
    }
    out.push_back(layer_norm(b, t, {3, 7, 768}));
    out.push_back(layer_norm(b, t, {5, 37}, false, true));
    out.push_back(layer_norm(b, t, {4096}, true, false));
    out.push_back(group_norm(b, t, {2, 32, 9, 9}, 8));
    out.push_back(group_norm(b, t, {3, 6, 16}, 3, false));
    out.push_back(gelu(b, t, {1000, 77}));
    out.push_back(gelu(b, t, {13}, "tanh"));
    out.push_back(silu(b, t, {4, 1 << 16}));
    out.push_back(add(b, t, {2, 3, 1001}, Arg::real(0.5)));
    out.push_back(add(b, t, {1 << 20}));
    out.push_back(relu(b, t, {3, 5, 7, 11}));
    out.push_back(unary("sigmoid", b, t, {7, 1003}));
    out.push_back(unary("tanh", b, t, {1 << 16}));
    out.push_back(unary("hardswish", b, t, {2, 16, 9, 9}));
    out.push_back(unary("neg", b, t, {5, 77}));
    out.push_back(unary("rsqrt", b, t, {2, 7, 1}));                          // RMSNorm's rsqrt(var + eps)
    out.push_back(unary("exp", b, t, {1003}));
    out.push_back(pow_scalar(b, t, {2, 7, 64}, Arg::integer(2)));            // RMSNorm's x.pow(2)
    out.push_back(pow_scalar(b, t, {4, 3072}, Arg::real(3.0)));              // GPT-2's gelu_new
    out.push_back(pow_scalar(b, t, {33}, Arg::real(1.7)));
    out.push_back(embedding(b, t, 50257, 768, {2, 16}));                     // GPT-2's token embedding
    out.push_back(embedding(b, t, 1000, 33, {7}, DType::kInt32));
    out.push_back(embedding(b, t, 9, 5, {}));                                // one index: out [5]
    if (b == Backend::kCuda && t != DType::kBFloat16) {
      out.push_back(cudnn_batch_norm(t, {2, 16, 7, 7}));
    }
    out.push_back(binary("add", b, t, {256, 3, 49, 49}, {1, 3, 49, 49}));   // swin's attention bias
    out.push_back(binary("sub", b, t, {4, 77}, {77}, Arg::real(2.0)));
    out.push_back(binary("mul", b, t, {2, 5, 64}, {2, 5, 1}));             // RMSNorm's x * rstd
    out.push_back(binary("mul", b, t, {3, 8, 6, 6}, {1, 8, 1, 1}));         // a per-channel scale
    out.push_back(binary("mul", b, t, {1}, {4, 1, 33}));                     // self broadcast
    out.push_back(binary("div", b, t, {1000, 3}, {1000, 3}));
    out.push_back(with_number("mul", b, t, {4, 1001}));                      // x * 0.5
    out.push_back(mul_scalar(b, t, {2, 4, 77, 77}, Arg::real(0.125)));       // math attention's scale
    out.push_back(mul_scalar(b, t, {33}, Arg::integer(3)));
    out.push_back(clamp_min(b, t, {4, 1001}, Arg::real(1e-6)));            // a norm's clamp_min(eps)
    out.push_back(clamp_min(b, t, {33}, Arg::integer(0)));
    out.push_back(in_place(clamp_min(b, t, {2, 3, 77}, Arg::real(-0.5))));
    out.push_back(upsample_nearest(b, t, {2, 8, 7, 9}, {14, 18}, 2.0, 2.0));   // a UNet's 2x upsampling
    out.push_back(upsample_nearest(b, t, {1, 3, 5, 11}, {7, 4}));                // down and up, no scales
    out.push_back(upsample_nearest(b, t, {2, 4, 8, 6}, {12, 9}, 1.5, 1.5));
    out.push_back(max_pool(b, t, {2, 16, 28, 28}, {3, 3}, {2, 2}, {1, 1}));          // resnet's stem
    out.push_back(max_pool(b, t, {1, 3, 11, 9}, {2}, {}, {0}, {1}, true));         // ceil_mode, stride []
    out.push_back(max_pool(b, t, {1, 2, 10, 13}, {3, 2}, {1, 2}, {1, 1}, {2, 1}));  // dilated, uneven
    out.push_back(avg_pool(b, t, {2, 16, 14, 14}, {2, 2}, {2, 2}, {0, 0}));          // densenet's transition
    out.push_back(avg_pool(b, t, {1, 3, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false));  // ceil_mode, padding uncounted
    out.push_back(avg_pool(b, t, {1, 2, 7, 10}, {3}, {}, {1}, false, true, 5));      // divisor_override
    out.push_back(adaptive_avg_pool(b, t, {2, 8, 14, 14}, {7, 7}));                   // vgg's classifier input
    out.push_back(adaptive_avg_pool(b, t, {1, 3, 10, 13}, {3, 4}));                   // overlapping windows
    out.push_back(adaptive_avg_pool(b, t, {1, 2, 5, 6}, {8, 9}));                     // more outputs than inputs
    out.push_back(upsample_bilinear(b, t, {2, 8, 7, 9}, {14, 18}, false, 2.0, 2.0));  // F.interpolate(scale_factor=2)
    out.push_back(upsample_bilinear(b, t, {1, 3, 5, 11}, {7, 4}, true));              // align_corners, down and up
    out.push_back(upsample_bilinear(b, t, {2, 4, 9, 6}, {5, 13}, false));             // sizes only
    out.push_back(upsample_bilinear(b, t, {1, 2, 1, 6}, {4, 1}, true));               // one row in, one column out
    // Channels-last (Note [Dense layouts] in elementwise.cc; the image kernels' KF_CL).
    out.push_back(channels_last(max_pool(b, t, {2, 16, 28, 28}, {3, 3}, {2, 2}, {1, 1})));
    out.push_back(channels_last(avg_pool(b, t, {1, 3, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false)));
    out.push_back(channels_last(adaptive_avg_pool(b, t, {2, 8, 14, 14}, {7, 7})));
    out.push_back(channels_last(upsample_nearest(b, t, {2, 8, 7, 9}, {14, 18}, 2.0, 2.0)));
    out.push_back(channels_last(upsample_bilinear(b, t, {1, 3, 5, 11}, {7, 4}, true)));
    out.push_back(channels_last(unary("relu", b, t, {2, 24, 7, 9})));
    out.push_back(channels_last(in_place(unary("relu", b, t, {2, 24, 7, 9}))));
    out.push_back(channels_last(binary("add", b, t, {2, 24, 7, 9}, {2, 24, 7, 9})));
    out.push_back(channels_last(batch_norm(b, t, {2, 16, 7, 9})));
    // Views (Note [Broadcast plan]): self in another order with a broadcast operand, a sliced operand.
    out.push_back(rope_mul(b, t));
    out.push_back(with_strides(binary("add", b, t, {6, 7}, {6, 7}), 1, {10, 1}));
    out.push_back(in_place(with_strides(binary("add", b, t, {3, 5, 4}, {5, 1}), 0, {5, 1, 15})));
    if (b == Backend::kCpu || t != DType::kFloat16) {   // Note [float16 cumsum on CUDA] in scan.cc
      out.push_back(cumsum(b, t, {4, 1001}, -1));
      out.push_back(cumsum(b, t, {2, 77, 33}, 1));
      out.push_back(cumsum(b, t, {129}, 0));
    }
    out.push_back(cat(b, t, {{8, 12, 512, 64}, {8, 12, 1, 64}}, -2));      // a KV cache step
    out.push_back(cat(b, t, {{2, 320, 8, 8}, {2, 640, 8, 8}}, 1));          // a UNet skip
    out.push_back(cat(b, t, {{3}, {5}, {1}}, 0));
    // .contiguous() of attention's output transposed back ([B, H, S, D] -> [B, S, H, D]).
    out.push_back(clone(b, t, {2, 16, 12, 64}, {12288, 64, 1024, 1}, Arg::integer(0)));
    out.push_back(clone(b, t, {4, 6}, {1, 4}, Arg::none()));          // preserve a dense transpose
    out.push_back(clone(b, t, {3, 5}, {0, 1}, Arg::integer(0)));      // an expanded row
    out.push_back(clone(b, t, {7, 33}, {}, Arg::none()));
    // Note [Transposing clone]: a channels-last image made contiguous (group_norm's input on CUDA),
    // odd sizes; transposed matrices, their tiles partial.
    out.push_back(clone(b, t, {2, 24, 5, 7}, {840, 1, 168, 24}, Arg::integer(0)));
    out.push_back(clone(b, t, {3, 64, 96}, {6144, 1, 64}, Arg::integer(0)));
    out.push_back(clone(b, t, {2, 40, 70}, {2800, 1, 40}, Arg::integer(0)));
    out.push_back(with_number("add", b, t, {77}, DType::kInt64));            // x + 1
    out.push_back(with_number("sub", b, t, {3, 64}, DType::kFloat64, Arg::real(0.5)));
    out.push_back(with_number("div", b, t, {1 << 12}));
    out.push_back(batch_norm(b, t, {2, 16, 7, 7}));
    out.push_back(batch_norm(b, t, {5, 24}, false));
    if (t != DType::kFloat32) out.push_back(batch_norm(b, t, {2, 8, 33}, true, DType::kFloat32));
    out.push_back(reduce("mean", b, t, {2, 7, 64}, std::vector<int64_t>{-1}, true));    // RMSNorm's mean
    out.push_back(reduce("mean", b, t, {4, 32, 7, 7}, std::vector<int64_t>{-1, -2}));   // global pooling
    out.push_back(reduce("sum", b, t, {3, 1000}, std::nullopt));                        // everything: 0-dim
    out.push_back(reduce("amax", b, t, {5, 77}, std::vector<int64_t>{1}, true));
    out.push_back(argmax(b, t, {1, 1, 50257}, -1));                         // greedy decoding's next token
    out.push_back(argmax(b, t, {5, 77}, 1, true));
    out.push_back(argmax(b, t, {3, 7, 11}, std::nullopt));                   // the flattened tensor: 0-dim
    // In place (Note [In-place outputs] in runtime/kernel_spec.cc): resnet's relu_ and residual add_.
    out.push_back(safe_softmax(b, t, {2, 4, 77, 77}));                       // math attention's probabilities
    out.push_back(safe_softmax(b, t, {5, 1001}));
    // The casts around a bfloat16 RMSNorm; float32 <-> float64 on the CPU.
    if (b == Backend::kCuda) {
      out.push_back(to_copy(b, t, {2, 7, 2048}, t == DType::kFloat32 ? 15 : 6));
      out.push_back(to_copy(b, t, {1001}, t == DType::kFloat16 ? 15 : 5));
    } else {
      out.push_back(to_copy(b, t, {2, 7, 2048}, 7));
      out.push_back(to_copy(b, t, {1001}, 15));
      out.push_back(to_copy(b, DType::kBFloat16, {3, 77}, 6));
      out.push_back(to_copy(b, DType::kFloat64, {33}, 6));
    }
    out.push_back(in_place(relu(b, t, {2, 64, 28, 28})));
    out.push_back(in_place(relu(b, t, {1001})));
    out.push_back(in_place(add(b, t, {2, 3, 1001}, Arg::real(0.5))));
    out.push_back(in_place(binary("add", b, t, {4, 3, 49, 49}, {1, 3, 49, 49})));   // a bias added in place
    out.push_back(in_place(with_number("add", b, t, {77}, DType::kInt64)));          // x += 1
    out.push_back(in_place(binary("mul", b, t, {2, 5, 64}, {2, 5, 1})));
    out.push_back(in_place(with_number("mul", b, t, {3, 33})));                       // x *= 0.5
  }
  return out;
}

std::string name_of(const OpSignature& s) { return s.to_string(); }

const KernelTemplate& family_of(const TemplateConfig& c) {
  const KernelTemplate* t = find_template(c.family);
  REQUIRE(t != nullptr);
  return *t;
}

int64_t knob(const TemplateConfig& c, std::string_view name) {
  const std::vector<Knob>& knobs = family_of(c).knobs();
  for (size_t k = 0; k < knobs.size(); ++k) {
    if (knobs[k].name == name) return c.values[k];
  }
  FAIL("no knob " << name << " in " << c.family);
  return 0;
}

size_t knobs_changed(const TemplateConfig& a, const TemplateConfig& b) {
  size_t n = 0;
  for (size_t k = 0; k < a.values.size(); ++k) n += a.values[k] != b.values[k] ? 1 : 0;
  return n;
}

}  // namespace

// ---- the library -------------------------------------------------------------------------------------

TEST_CASE("templates: family names are unique, every knob has a domain, labels parse back", "[templates]") {
  std::set<std::string> names;
  for (const KernelTemplate* t : template_library()) {
    INFO(t->family());
    CHECK(names.insert(std::string(t->family())).second);
    CHECK((t->backend() == Backend::kCpu) == t->family().starts_with("cpu."));
    for (const Knob& k : t->knobs()) {
      CHECK(!k.values.empty());
      CHECK((k.names.empty() || k.names.size() == k.values.size()));
    }
    CHECK(find_template(t->family()) == t);
  }
  size_t named = 0;   // the catalog's count, not a number to update with each operator
  for (const catalog::OpEntry& e : catalog::operators()) named += e.template_families.size();
  CHECK(names.size() == named);
  CHECK(find_template("nonexistent") == nullptr);

  const TemplateConfig c{"softmax", {0, 1, 256, 32, 4, 1}};
  CHECK(label(*find_template("softmax"), c) == "softmax.block_row algo=online block=256 row_lanes=32 vec=4 cache=1");
  CHECK(parse_label("softmax.block_row algo=online block=256 row_lanes=32 vec=4 cache=1") == c);
  CHECK(parse_label("cpu.add chunk=4096") == TemplateConfig{"cpu.add", {4096}});
  CHECK(parse_label("add block=256 vec=4 items=2") == TemplateConfig{"add", {256, 4, 2}});
  // Not labels of this library: unknown family or knob, a value outside the domain, a knob
  // missing or repeated, stray spaces.
  for (const char* bad : {"", "softmax", "softmax.block_row", "softmax.sideways algo=online block=256 row_lanes=32 vec=4 cache=1",
                          "softmax.block_row algo=online block=257 row_lanes=32 vec=4 cache=1",
                          "softmax.block_row algo=online block=256 row_lanes=32 vec=4",
                          "softmax.block_row algo=online block=256 row_lanes=32 vec=4 cache=1 cache=1",
                          "softmax.block_row algo=online block=256 vec=4 row_lanes=32 cache=1",
                          "softmax.block_row  algo=online block=256 row_lanes=32 vec=4 cache=1", "cpu.add chunk=4096 ",
                          "cpu.add chunk=", "cpu.add chunk=4k", "cpu.add size=4096", "llm: warp shuffles"}) {
    INFO(bad);
    CHECK(!parse_label(bad).has_value());
  }
}

TEST_CASE("templates: the catalog names every family, each once, and the library orders them as it does", "[templates]") {
  // runtime/op_catalog.h is the one place a family is tied to its operator.
  std::vector<std::string> named_cuda, named_cpu;
  for (const catalog::OpEntry& e : catalog::operators()) {
    INFO(e.qualified());
    CHECK((!e.template_families.empty() || !e.no_templates_reason.empty()));
    for (std::string_view f : e.template_families) {
      const KernelTemplate* t = find_template(f);
      REQUIRE(t != nullptr);
      (t->backend() == Backend::kCuda ? named_cuda : named_cpu).emplace_back(f);
    }
  }
  std::vector<std::string> library;
  for (const KernelTemplate* t : template_library()) library.emplace_back(t->family());
  std::vector<std::string> expected = named_cuda;
  expected.insert(expected.end(), named_cpu.begin(), named_cpu.end());
  CHECK(library == expected);   // every family named exactly once; CUDA first, then catalog order
}

TEST_CASE("templates: supports() accepts exactly the signatures some family handles", "[templates]") {
  TemplateProposer p;
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (const OpSignature& s : signatures(b)) {
      INFO(name_of(s));
      CHECK(p.supports(s));
      // One family, and for a long softmax row also its split family (Note [Split rows]), for a
      // softmax or cumsum over another dimension on sm_90 also its cluster family (Notes [Clustered
      // columns], [Clustered scan]).
      size_t general = 0;
      for (const KernelTemplate* t : templates_for(s)) {
        general += t->family().ends_with("_split") || t->family().ends_with("_cluster") ? 0 : 1;
      }
      CHECK(general == 1);
    }
  }
  const Backend G = Backend::kCuda, C = Backend::kCpu;
  const DType F = DType::kFloat32;
  std::vector<OpSignature> refused = {
      softmax(G, F, {8, 64}, false, 2),                          // no dimension 2
      softmax(C, F, {8, 64, 1}, false, 1),                       // inner 1: the last dimension in all but name
      softmax(C, DType::kFloat16, {8, 64}),                      // 16-bit types only on CUDA
      softmax(G, DType::kFloat64, {8, 64}),
      softmax(G, F, {0, 64}),                                    // empty
      gelu(G, F, {8}, "sigmoid"),
      gelu(G, DType::kInt32, {8}),
      relu(G, DType::kFloat64, {8}),
      relu(C, DType::kInt64, {8}),
      add(G, F, {8, 64}, Arg::string("1")),
  };
  {
    OpSignature s = softmax(G, F, {8, 64});
    s.args[2] = Arg::boolean(true);   // half_to_float
    refused.push_back(s);
    s = softmax(G, F, {8, 64});
    std::get<TensorMeta>(s.args[0].value).strides = {1, 8};   // transposed
    refused.push_back(s);
    s = softmax(G, F, {8, 64});
    std::get<TensorMeta>(s.args[0].value).device = DeviceType::kCpu;   // tensor and target disagree
    refused.push_back(s);
    s = softmax(G, F, {8, 64});
    s.op = "aten::softmax";
    refused.push_back(s);
  }
  {
    OpSignature s = layer_norm(G, F, {4, 8, 64});
    s.args[1] = Arg::int_list({8, 64});   // normalized over two dimensions
    refused.push_back(s);
    s = layer_norm(G, DType::kFloat16, {4, 64});
    s.args[2] = Arg::tensor(tensor(G, F, {64}));   // float32 weight for a float16 input (mixed)
    refused.push_back(s);
    s = group_norm(G, F, {2, 6, 4}, 4);           // 6 channels in 4 groups
    refused.push_back(s);
  }
  {
    refused.push_back(binary("mul", G, F, {8, 64}, {8, 63}));                    // sizes that do not broadcast
    refused.push_back(binary("mul", G, F, {2, 3, 4, 5, 6}, {1, 3, 1, 5, 1}));    // five dimensions after merging
    refused.push_back(binary("div", G, F, {8, 64}, {}));                         // a 0-dim CUDA tensor: not a number
    refused.push_back(with_number("mul", G, F, {8, 64}, DType::kComplex64));     // a complex number promotes
    refused.push_back(batch_norm(G, F, {2, 16, 7, 7}, true, std::nullopt, true));  // training
    refused.push_back(reduce("mean", G, F, {4, 8, 16}, std::vector<int64_t>{0}));   // not the trailing dimensions
    refused.push_back(reduce("sum", G, F, {4, 8, 16}, std::vector<int64_t>{0, 2}));
    {
      OpSignature r = reduce("sum", G, F, {4, 8}, std::vector<int64_t>{-1});
      r.args[3] = Arg::integer(6);   // dtype=float32 given: a result type of its own
      refused.push_back(r);
    }
    refused.push_back(batch_norm(G, DType::kFloat16, {2, 16, 7}, true, DType::kBFloat16));   // mixed parameters
    refused.push_back(unary("sigmoid", C, DType::kBFloat16, {8}));
    refused.push_back(pow_scalar(G, F, {8}, Arg::real(std::numeric_limits<double>::quiet_NaN())));   // not finite
    refused.push_back(pow_scalar(G, F, {8}, Arg::boolean(true)));                                    // not a number
    refused.push_back(mul_scalar(G, F, {8}, Arg::boolean(true)));                                    // not a number
    refused.push_back(in_place(binary("mul", G, F, {1}, {4, 1, 33})));   // self would be broadcast
    {
      OpSignature ss = safe_softmax(G, DType::kFloat16, {4, 8});
      ss.args[2] = Arg::integer(6);   // dtype=float32: a result type of its own
      refused.push_back(ss);
    }
    refused.push_back(in_place(binary("add", G, F, {5, 1}, {5, 7})));
    {
      OpSignature c = cat(G, F, {{2, 3}, {2, 4}}, 1);
      std::get<std::vector<TensorMeta>>(c.args[0].value)[1].dtype = DType::kFloat16;   // two dtypes
      refused.push_back(c);
      refused.push_back(cat(G, F, {{2, 3}, {3, 3}}, 1));                  // other sizes differ
      refused.push_back(cat(G, F, {{2, 3}, {0}}, 0));                     // an empty (legacy) element
      refused.push_back(cat(G, F, {{2, 3}, {2, 3}}, 2));                  // dim out of range
      refused.push_back(cat(G, F, std::vector<std::vector<int64_t>>(17, {2, 3}), 0));   // more than 16
      refused.push_back(with_element_strides(cat(G, F, {{4, 6}, {4, 6}}, 1), 1, {1, 4}));   // a row not in a row
      refused.push_back(with_element_strides(cat(G, F, {{2, 3, 4}, {2, 3, 4}}, 1), 0, {12, 8, 1}));   // gaps inside a row
      refused.push_back(clone(G, F, {4, 5}, {8, 1}, Arg::none()));                      // preserve with gaps
      refused.push_back(clone(G, F, {2, 3, 4, 5}, {}, Arg::integer(2)));                // channels_last
      refused.push_back(clone(G, F, {2, 2, 2, 2, 2, 2, 2}, {1, 2, 4, 8, 16, 32, 64}, Arg::integer(0)));   // 7 dims
    }
    {
      OpSignature e = embedding(G, F, 10, 4, {3});
      e.args[1] = Arg::tensor(tensor(G, F, {3}));   // float indices
      refused.push_back(e);
      e = embedding(G, F, 10, 4, {3});
      e.args[1] = Arg::tensor(tensor(C, DType::kInt64, {3}));   // indices on another device
      refused.push_back(e);
      e = embedding(G, F, 10, 4, {0});                           // no index
      refused.push_back(e);
      refused.push_back(cudnn_batch_norm(DType::kBFloat16, {2, 8, 5}));   // cuDNN refuses bfloat16
      OpSignature c = cudnn_batch_norm(F, {2, 8, 5});
      c.args[1] = Arg::none();                                      // no weight: not cuDNN's call
      refused.push_back(c);
      refused.push_back(cudnn_batch_norm(F, {2, 8, 5}, false));     // no bias: PyTorch's cuDNN call fails
      c = cudnn_batch_norm(F, {2, 8, 5});
      c.args[0] = Arg::tensor(tensor(C, F, {2, 8, 5}));             // a CPU input
      refused.push_back(c);
    }
    OpSignature s = add(G, F, {8, 64});
    s.args[1] = Arg::tensor(tensor(G, DType::kFloat16, {8, 64}));   // type promotion
    refused.push_back(s);
    s = add(G, F, {8, 64});
    s.overload = "Scalar";
    refused.push_back(s);
  }
  for (const OpSignature& s : refused) {
    INFO(name_of(s));
    CHECK(!p.supports(s));
    CHECK(enumerate_space(s).empty());
    ProposalRequest req;
    req.signature = &s;
    CHECK(p.propose(req).empty());
    std::mt19937_64 rng(1);
    CHECK(!p.sample(s, rng).has_value());
  }
}

TEST_CASE("templates: the CUDA cumsum family refuses float16 and takes the other float types", "[templates]") {
  // Note [float16 cumsum on CUDA] in scan.cc: PyTorch's CUDA scan overflows float16 partial sums.
  const auto families = [](const OpSignature& s) {
    std::set<std::string> f;
    for (const KernelTemplate* t : templates_for(s)) f.emplace(t->family());
    return f;
  };
  CHECK(families(cumsum(Backend::kCuda, DType::kFloat16, {4, 1001}, -1)).empty());
  CHECK(families(cumsum(Backend::kCuda, DType::kBFloat16, {4, 1001}, -1)) == std::set<std::string>{"cumsum"});
  CHECK(families(cumsum(Backend::kCuda, DType::kFloat32, {4, 1001}, -1)) == std::set<std::string>{"cumsum"});
  CHECK(families(cumsum(Backend::kCpu, DType::kFloat32, {4, 1001}, -1)) == std::set<std::string>{"cpu.cumsum"});
  CHECK(families(cumsum(Backend::kCuda, DType::kFloat16, {4, 9, 8}, 1)).empty());
  CHECK(families(cumsum(Backend::kCuda, DType::kBFloat16, {4, 9, 8}, 1)) ==
        std::set<std::string>{"cumsum", "cumsum_split", "cumsum_cluster"});   // sm_90: clusters
}

TEST_CASE("templates: every configuration of every family validates and resolves, once", "[templates]") {
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (const OpSignature& s : signatures(b)) {
      INFO(name_of(s));
      const std::vector<TemplateConfig> space = enumerate_space(s);
      REQUIRE(!space.empty());
      std::set<KernelId> ids;
      std::set<std::string> labels;
      for (const TemplateConfig& c : space) {
        const KernelTemplate& t = family_of(c);
        const KernelSpec spec = t.instantiate(s, c.values);
        INFO(label(t, c));
        CHECK(spec.backend == s.target.backend);
        const Status v = spec.validate();
        CHECK(v.ok());
        const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
        REQUIRE(r.ok());
        CHECK(ids.insert(spec.id()).second);
        CHECK(labels.insert(label(t, c)).second);
        CHECK(parse_label(label(t, c)) == c);
        const double prior = t.prior(s, c.values);
        CHECK(prior > 0);
        CHECK(prior <= 1);
        // The first output is shaped as the catalog says (like the input, or the broadcast shape).
        REQUIRE(!r->outputs.empty());
        CHECK(r->outputs[0].sizes == catalog::expected_outputs(s).at(0).sizes);
        // Enough blocks (CUDA) or tasks (CPU) for every row or element.
        const ResolvedLaunch& l = r->launches.at(0);
        CHECK(l.grid[0] >= 1);
        if (b == Backend::kCpu) CHECK(l.block == std::array<uint32_t, 3>{1, 1, 1});
      }
    }
  }
}

namespace {
std::vector<Move> instances(const OpSignature& s, size_t defaults, size_t samples, uint64_t seed);
}  // namespace

TEST_CASE("templates: layer_norm takes rows whose last dimension is contiguous, at offsets from the signature's strides",
          "[templates]") {
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    const DType t = DType::kFloat32;
    // The QK-norm of attention heads: q = qkv(x).chunk(3, -1)[0] viewed [B, T, H, D] = [2, 5, 3, 8].
    const OpSignature qk = with_strides(layer_norm(b, t, {2, 5, 3, 8}), 0, {360, 72, 8, 1});
    REQUIRE(templates_for(qk).size() == 1);
    const TensorMeta& x = std::get<TensorMeta>(qk.args[0].value);
    CHECK(row_offset_define(x, "cols") ==
          "#define KF_X_ROW(r) (((long long)(r) % 3LL) * 8LL + ((long long)(r) / 3LL) * 72LL)\n");
    CHECK(row_offset_granule(x) == 8);
    // Heads first (transposed): not monotone, nothing merges.
    const OpSignature heads_first = with_strides(layer_norm(b, t, {2, 3, 5, 8}), 0, {120, 8, 24, 1});
    const TensorMeta& xt = std::get<TensorMeta>(heads_first.args[0].value);
    CHECK(row_offset_define(xt, "cols") == "#define KF_X_ROW(r) (((long long)(r) % 5LL) * 24LL + "
                                           "(((long long)(r) / 5LL) % 3LL) * 8LL + ((long long)(r) / 15LL) * 120LL)\n");
    // Contiguous: the row length the kernel is given.
    const OpSignature contiguous = layer_norm(b, t, {2, 5, 8});
    CHECK(row_offset_define(std::get<TensorMeta>(contiguous.args[0].value), "cols") ==
          "#define KF_X_ROW(r) ((long long)(r) * cols)\n");
    // The output is contiguous whatever the input's layout, as PyTorch's.
    for (const Move& m : instances(qk, 1, 0, 3)) {
      const OutputSpec& out = m.spec.plan.outputs.at(0);
      CHECK(out.strides == std::vector<std::string>{"size0_1 * size0_2 * size0_3", "size0_2 * size0_3", "size0_3", "1"});
    }
    // The last dimension strided: refused.
    CHECK(templates_for(with_strides(layer_norm(b, t, {4, 8}), 0, {1, 4})).empty());
  }
}

TEST_CASE("templates: vector widths only where alignment and sizes allow them", "[templates]") {
  auto vecs = [](const OpSignature& s) {
    std::set<int64_t> v;
    for (const TemplateConfig& c : enumerate_space(s)) v.insert(knob(c, "vec"));
    return v;
  };
  const Backend G = Backend::kCuda;
  CHECK(vecs(softmax(G, DType::kFloat32, {8, 1024})) == std::set<int64_t>{1, 2, 4});   // 16 bytes at most
  CHECK(vecs(softmax(G, DType::kFloat16, {8, 1024})) == std::set<int64_t>{1, 2, 4, 8});
  CHECK(vecs(softmax(G, DType::kFloat16, {8, 1022})) == std::set<int64_t>{1, 2});      // rows of 1022
  CHECK(vecs(softmax(G, DType::kFloat32, {8, 1023})) == std::set<int64_t>{1});
  CHECK(vecs(softmax(G, DType::kFloat32, {8, 1024}, false, -1, 8)) == std::set<int64_t>{1, 2});   // 8-byte aligned
  CHECK(vecs(softmax(G, DType::kBFloat16, {8, 1024}, false, -1, 2)) == std::set<int64_t>{1});
  // Pointwise kernels finish the odd elements one at a time: only the alignment limits them.
  CHECK(vecs(gelu(G, DType::kFloat16, {1001})) == std::set<int64_t>{1, 2, 4, 8});
  CHECK(vecs(gelu(G, DType::kFloat16, {1001}, "none", 4)) == std::set<int64_t>{1, 2});
  {
    OpSignature s = layer_norm(G, DType::kFloat32, {8, 1024});
    std::get<TensorMeta>(s.args[3].value).alignment = 4;   // the bias is read with the same vectors
    CHECK(vecs(s) == std::set<int64_t>{1});
  }
  // A binary op reads an input of innermost stride 1 in vectors only where every vector starts
  // aligned: its outer strides multiples of the width. cos [1, 1, 6, 8] viewed with rows 11
  // elements apart (the CUDA sweep's "gaps" case) is read one element at a time; the same
  // operand packed takes 16-byte vectors.
  for (DType d : {DType::kFloat32, DType::kFloat16}) {
    CHECK(vecs(with_strides(rope_mul(G, d), 1, {66, 66, 11, 1})) == std::set<int64_t>{1});
    CHECK(vecs(rope_mul(G, d)).count(d == DType::kFloat32 ? 4 : 8) == 1);
    CHECK(vecs(with_strides(rope_mul(G, d), 1, {96, 96, 16, 1})).count(d == DType::kFloat32 ? 4 : 8) == 1);
  }
  // Strided rows (Note [Strided rows]): every row start must be a vector boundary. Rows of 8
  // float16 sliced from rows of 20 start 20 elements apart: 4-wide vectors, not 8.
  {
    const OpSignature qk = with_strides(layer_norm(G, DType::kFloat16, {4, 6, 8}), 0, {120, 20, 1});
    CHECK(vecs(qk) == std::set<int64_t>{1, 2, 4});
    CHECK(vecs(layer_norm(G, DType::kFloat16, {4, 6, 8})) == std::set<int64_t>{1, 2, 4, 8});
  }
  // The register cache only where the row fits in at most 32 values per thread.
  for (const OpSignature& s : {softmax(G, DType::kFloat32, {4, 50257}), softmax(G, DType::kFloat16, {512, 1000})}) {
    const int64_t cols = std::get<TensorMeta>(s.args[0].value).sizes.back();
    for (const TemplateConfig& c : enumerate_space(s)) {
      if (c.family != "softmax") continue;   // softmax_split holds no row in registers
      const int64_t threads = knob(c, "map") == 1 ? knob(c, "row_lanes") : knob(c, "block");
      if (knob(c, "cache") == 1) CHECK(threads * 32 >= cols);
      if (knob(c, "map") == 0) CHECK(knob(c, "row_lanes") == 32);   // one value where it means nothing
    }
  }
}

TEST_CASE("templates: long rows split over blocks, read once into shared memory, at any alignment", "[templates]") {
  const Backend G = Backend::kCuda;
  const KernelTemplate& t = *find_template("softmax_split");
  CHECK(find_template("log_softmax_split") != nullptr);
  CHECK(find_template("safe_softmax_split") != nullptr);
  CHECK(find_template("cpu.softmax_split") == nullptr);
  // Long last dimensions only: short rows and other dimensions are the row and dim families'.
  CHECK(t.applies(softmax(G, DType::kBFloat16, {8, 262144})));
  CHECK(t.applies(softmax(G, DType::kBFloat16, {4096, 50257})));
  CHECK_FALSE(t.applies(softmax(G, DType::kBFloat16, {4096, 1024})));
  CHECK_FALSE(t.applies(softmax(G, DType::kBFloat16, {4, 4096, 8}, false, 1)));
  CHECK_FALSE(t.applies(softmax(Backend::kCpu, DType::kFloat32, {8, 262144})));
  // Odd rows and a 2-byte-aligned input still take 16-byte accesses (a scalar head and tail).
  for (const OpSignature& s : {softmax(G, DType::kBFloat16, {4096, 50257}), softmax(G, DType::kBFloat16, {8, 4099}, false, -1, 2)}) {
    std::set<int64_t> vecs;
    for (const TemplateConfig& c : enumerate_space(s, t)) vecs.insert(knob(c, "vec"));
    CHECK(vecs == std::set<int64_t>{1, 2, 4, 8});
  }
  auto best = [&](const OpSignature& s) {
    std::vector<TemplateConfig> space = enumerate_space(s, t);
    REQUIRE(!space.empty());
    return *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
      return t.prior(s, a.values) < t.prior(s, b.values);
    });
  };
  // 8 rows of 262,144: split, each chunk copied to shared memory, as a cluster (one launch; the
  // cluster's own checks below). Two launches: split so that every SM has blocks.
  {
    const OpSignature s = softmax(G, DType::kBFloat16, {8, 262144});
    const TemplateConfig top = best(s);
    CHECK(knob(top, "cluster") == 1);
    CHECK(knob(top, "split") == 8);
    CHECK(knob(top, "cache") == 1);
    std::vector<TemplateConfig> space = enumerate_space(s, t);
    std::erase_if(space, [&](const TemplateConfig& c) { return knob(c, "cluster") == 1; });
    const TemplateConfig c = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
      return t.prior(s, a.values) < t.prior(s, b.values);
    });
    CHECK(knob(c, "split") == 32);
    CHECK(knob(c, "cache") == 1);
    CHECK(knob(c, "vec") == 8);
    const KernelSpec spec = t.instantiate(s, c.values);
    REQUIRE(spec.plan.launches.size() == 2);
    CHECK(spec.entry_points == std::vector<std::string>{"kf_split_stats", "kf_split_write"});
    const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
    REQUIRE(r.ok());
    CHECK(r->launches[0].grid[0] == 8 * 32);
    CHECK(r->launches[1].grid[0] == 8 * 32);
    CHECK(r->launches[0].shared_mem_bytes == 8192 * 2 + 32);   // the chunk's copy
    CHECK(r->launches[1].shared_mem_bytes == 0);
    REQUIRE(r->scratch.size() == 1);
    CHECK(r->scratch[0].bytes == 8 * 32 * 16);   // a (max, sum) pair of doubles per chunk
  }
  // Note [Split rows]: as a cluster (sm_90 on), a row's chunks merge through distributed shared
  // memory in one launch, with no scratch buffer; at most 16 chunks a row (Note [Non-portable
  // clusters] in cuda_launcher.cc).
  {
    const OpSignature s = softmax(G, DType::kBFloat16, {8, 262144});
    std::set<int64_t> splits;
    std::optional<TemplateConfig> top;
    for (const TemplateConfig& c : enumerate_space(s, t)) {
      if (knob(c, "cluster") != 1) continue;
      splits.insert(knob(c, "split"));
      if (knob(c, "cache") == 1 && (!top || t.prior(s, c.values) > t.prior(s, top->values))) top = c;
    }
    CHECK(splits == std::set<int64_t>{2, 4, 8, 16});
    REQUIRE(top.has_value());
    CHECK(knob(*top, "split") == 8);   // 16 measured no faster
    const KernelSpec spec = t.instantiate(s, top->values);
    CHECK(spec.entry_points == std::vector<std::string>{"kf_split_cluster"});
    const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
    REQUIRE(r.ok());
    REQUIRE(r->launches.size() == 1);
    CHECK(r->launches[0].grid[0] == 8 * 8);
    CHECK(r->launches[0].shared_mem_bytes == 32768 * 2 + 32);   // the chunk's copy
    CHECK(r->scratch.empty());
    // Before sm_90 there are no clusters.
    OpSignature ampere = s;
    ampere.target.arch = "sm_80";
    for (const TemplateConfig& c : enumerate_space(ampere, t)) CHECK(knob(c, "cluster") == 0);
  }
  // GPT-2's logits: a row per block, the whole row in shared memory, one launch.
  {
    const OpSignature s = softmax(G, DType::kBFloat16, {4096, 50257});
    const TemplateConfig c = best(s);
    CHECK(knob(c, "split") == 1);
    CHECK(knob(c, "cache") == 1);
    const StatusOr<ResolvedLaunchPlan> r = t.instantiate(s, c.values).resolve(s);
    REQUIRE(r.ok());
    REQUIRE(r->launches.size() == 1);
    CHECK(r->launches[0].grid[0] == 4096);
    CHECK(r->launches[0].shared_mem_bytes == 50264 * 2 + 32);
    CHECK(r->scratch.empty());
  }
  // A row too long for shared memory is cached only in chunks that fit; a spec resolved for a
  // longer row than the one it was made for streams (no shared memory, told so by its argument).
  {
    const OpSignature s = softmax(G, DType::kFloat32, {2, 1 << 17});
    for (const TemplateConfig& c : enumerate_space(s, t)) {
      if (knob(c, "cache") == 1) CHECK(knob(c, "split") >= 2);
    }
    const OpSignature shorter = softmax(G, DType::kFloat32, {2, 16384});
    const std::vector<int64_t> v = {1, 1024, 4, 1, 0, 64};
    REQUIRE(is_valid(t, shorter, v));
    const KernelSpec spec = t.instantiate(shorter, v);
    const StatusOr<ResolvedLaunchPlan> fits = spec.resolve(shorter);
    REQUIRE(fits.ok());
    CHECK(fits->launches[0].shared_mem_bytes == 16384 * 4 + 32);
    CHECK(fits->launches[0].args.back().int_value == 1);
    const StatusOr<ResolvedLaunchPlan> streams = spec.resolve(s);
    REQUIRE(streams.ok());
    CHECK(streams->launches[0].shared_mem_bytes == 0);
    CHECK(streams->launches[0].args.back().int_value == 0);
  }
}

TEST_CASE("templates: group_norm copies a row into shared memory, over a cluster of blocks where rows are few", "[templates]") {
  // Note [Cached group rows].
  const KernelTemplate& t = *find_template("group_norm");
  auto best = [&](const OpSignature& s) {
    std::vector<TemplateConfig> space = enumerate_space(s, t);
    REQUIRE(!space.empty());
    return *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
      return t.prior(s, a.values) < t.prior(s, b.values);
    });
  };
  // 512 rows of 10 channels of 64x64: a row per block, its 80 KiB copied.
  {
    const OpSignature s = group_norm(Backend::kCuda, DType::kBFloat16, {16, 320, 64, 64}, 32);
    const TemplateConfig c = best(s);
    CHECK(knob(c, "cache") == 1);
    CHECK(knob(c, "split") == 1);
    CHECK(knob(c, "vec") == 8);
    const KernelSpec spec = t.instantiate(s, c.values);
    CHECK(spec.entry_points == std::vector<std::string>{"kf_group_norm"});
    const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
    REQUIRE(r.ok());
    CHECK(r->launches[0].grid[0] == 512);
    CHECK(r->launches[0].shared_mem_bytes == 40960 * 2);
  }
  // The same layer at batch 2: 64 rows, each over a cluster of 4 blocks of 10,240 elements.
  {
    const OpSignature s = group_norm(Backend::kCuda, DType::kBFloat16, {2, 320, 64, 64}, 32);
    const TemplateConfig c = best(s);
    CHECK(knob(c, "cache") == 1);
    CHECK(knob(c, "split") == 4);
    const KernelSpec spec = t.instantiate(s, c.values);
    CHECK(spec.entry_points == std::vector<std::string>{"kf_group_norm_cluster"});
    const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
    REQUIRE(r.ok());
    CHECK(r->launches[0].grid[0] == 64 * 4);
    CHECK(r->launches[0].shared_mem_bytes == 10240 * 2);
    // Before sm_90 there are no clusters.
    OpSignature ampere = s;
    ampere.target.arch = "sm_80";
    for (const TemplateConfig& k : enumerate_space(ampere, t)) CHECK(knob(k, "split") == 1);
  }
  // A 256 KiB row (the demo's group_norm: 8 channels of 128x128 fp16) does not fit one block's
  // shared memory: only a cluster copies it.
  {
    const OpSignature s = group_norm(Backend::kCuda, DType::kFloat16, {2, 64, 128, 128}, 8);
    std::set<int64_t> cached_splits;
    for (const TemplateConfig& k : enumerate_space(s, t)) {
      if (knob(k, "cache") == 1) cached_splits.insert(knob(k, "split"));
    }
    CHECK(cached_splits == std::set<int64_t>{2, 4, 8});
    CHECK(knob(best(s), "split") == 8);
  }
}

TEST_CASE("templates: short unaligned rows are reduced from a shared copy of a block's rows", "[templates]") {
  // Note [Staged rows]: a ResNet's global average pooling, rows of 49 bf16.
  const KernelTemplate& t = *find_template("mean");
  const OpSignature s = reduce("mean", Backend::kCuda, DType::kBFloat16, {256, 2048, 7, 7}, std::vector<int64_t>{-1, -2}, true);
  std::vector<TemplateConfig> space = enumerate_space(s, t);
  REQUIRE(!space.empty());
  const TemplateConfig top = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
    return t.prior(s, a.values) < t.prior(s, b.values);
  });
  CHECK(knob(top, "map") == 2);
  CHECK(knob(top, "vec") == 8);
  CHECK(knob(top, "block") == 256);
  const KernelSpec spec = t.instantiate(s, top.values);
  CHECK(spec.entry_points == std::vector<std::string>{"kf_reduce_staged"});
  const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
  REQUIRE(r.ok());
  CHECK(r->launches[0].grid[0] == 256 * 2048 / 256);
  CHECK(r->launches[0].shared_mem_bytes == 32 + 256 * 49 * 2);
  // Not argmax, not rows too long for a block's copy.
  for (const TemplateConfig& c : enumerate_space(argmax(Backend::kCuda, DType::kBFloat16, {64, 49}, -1), *find_template("argmax"))) {
    CHECK(knob(c, "map") != 2);
  }
  for (const TemplateConfig& c : enumerate_space(reduce("mean", Backend::kCuda, DType::kFloat32, {64, 4096}, std::vector<int64_t>{-1}), t)) {
    CHECK(knob(c, "map") != 2);
  }
}

namespace {

// The column families over a cluster (Notes [Clustered columns], [Clustered scan]) on dim 1 of
// bf16 [64, 4096, 512] (264 MiB, past L2): the prior's first configuration has tile rows of whole
// sectors, a cluster of blocks per tile, each with its chunk's copy; no clusters before sm_90.
void check_clustered_columns(const KernelTemplate& t, const OpSignature& s) {
  std::vector<TemplateConfig> space = enumerate_space(s, t);
  REQUIRE(!space.empty());
  const TemplateConfig top = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
    return t.prior(s, a.values) < t.prior(s, b.values);
  });
  const int64_t tile = knob(top, "block") / knob(top, "split") * knob(top, "vec");
  CHECK(tile * 2 >= 64);   // tile rows of whole sectors
  const int64_t cluster = knob(top, "cluster");
  const StatusOr<ResolvedLaunchPlan> r = t.instantiate(s, top.values).resolve(s);
  REQUIRE(r.ok());
  CHECK(r->launches[0].grid[0] == 64 * (512 / tile) * cluster);
  CHECK(r->launches[0].shared_mem_bytes == (4096 / cluster) * tile * 2);
  CHECK(r->launches[0].shared_mem_bytes <= 224 * 1024);
  OpSignature ampere = s;
  ampere.target.arch = "sm_80";
  CHECK_FALSE(t.applies(ampere));
}

}  // namespace

TEST_CASE("templates: softmax over a middle dimension splits a tile's rows over a cluster of blocks", "[templates]") {
  const KernelTemplate& t = *find_template("softmax_dim_cluster");
  check_clustered_columns(t, softmax(Backend::kCuda, DType::kBFloat16, {64, 4096, 512}, false, 1));
  CHECK_FALSE(t.applies(softmax(Backend::kCuda, DType::kBFloat16, {64, 512}, false, -1)));   // the last dimension
}

TEST_CASE("templates: cumsum over a middle dimension splits a tile's rows over a cluster of blocks", "[templates]") {
  const KernelTemplate& t = *find_template("cumsum_cluster");
  check_clustered_columns(t, cumsum(Backend::kCuda, DType::kBFloat16, {64, 4096, 512}, 1));
  CHECK_FALSE(t.applies(cumsum(Backend::kCuda, DType::kFloat16, {64, 4096, 512}, 1)));   // Note [float16 cumsum on CUDA]
}

TEST_CASE("templates: softmax over a middle dimension keeps a block's columns in shared memory where the copy leaves the SM its threads", "[templates]") {
  const Backend G = Backend::kCuda;
  const KernelTemplate& t = *find_template("softmax_dim");
  auto best_of = [&](const OpSignature& sig, int64_t cache) {
    const std::vector<TemplateConfig> space = enumerate_space(sig, t);
    REQUIRE(!space.empty());
    return *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
      const double pa = cache < 0 || knob(a, "cache") == cache ? t.prior(sig, a.values) : 0;
      const double pb = cache < 0 || knob(b, "cache") == cache ? t.prior(sig, b.values) : 0;
      return pa < pb;
    });
  };
  // The issue's shape, 537 MB (Note [Dim softmax priors]): a copy of 4096 rows holds a sector-wide
  // tile row only in 128 KiB, one block per SM, and the exponentials need the SM's threads; so
  // streamed, in 8-byte accesses (a running max and sum per column in registers), tile rows of a
  // sector at least. On an H100 the cached configurations reached 10.0x PyTorch's kernel, the
  // streamed 15.75x, and vec 8 13.5x at best (bench/results/2026-12-07-h100-landscape-softmax-5936214.tsv).
  const OpSignature s = softmax(G, DType::kBFloat16, {64, 4096, 512}, false, 1);
  const std::vector<TemplateConfig> space = enumerate_space(s, t);
  const TemplateConfig best = best_of(s, -1);
  CHECK(knob(best, "cache") == 0);
  CHECK(knob(best, "vec") == 4);
  CHECK(knob(best, "block") / knob(best, "split") * knob(best, "vec") * 2 >= 32);
  // The best with the copy: 16-column tiles (a sector a row), 128 KiB for 4096 rows.
  const TemplateConfig cached_best = best_of(s, 1);
  REQUIRE(knob(cached_best, "cache") == 1);
  const int64_t tile = knob(cached_best, "block") / knob(cached_best, "split") * knob(cached_best, "vec");
  CHECK(tile == 16);
  const KernelSpec spec = t.instantiate(s, cached_best.values);
  const StatusOr<ResolvedLaunchPlan> r = spec.resolve(s);
  REQUIRE(r.ok());
  CHECK(r->launches[0].grid[0] == 64 * 512 / tile);
  CHECK(r->launches[0].shared_mem_bytes == 4096 * tile * 2);
  CHECK(r->launches[0].args.back().int_value == 1);
  // Short columns (256 rows, 268 MB): a copy of 128-byte tile rows takes 32 KiB, and the SM still
  // holds its 2048 threads; the copy saves a third of the traffic, and the prior takes it.
  CHECK(knob(best_of(softmax(G, DType::kBFloat16, {64, 256, 8192}, false, 1), -1), "cache") == 1);
  // Every cached configuration's copy and static merge arrays fit a block's shared memory, and no
  // configuration has a thread without a column.
  size_t cached = 0;
  for (const TemplateConfig& c : space) {
    CHECK(knob(c, "split") <= knob(c, "block"));
    if (knob(c, "cache") == 0) continue;
    ++cached;
    const StatusOr<ResolvedLaunchPlan> p = t.instantiate(s, c.values).resolve(s);
    REQUIRE(p.ok());
    CHECK(p->launches[0].shared_mem_bytes == 4096 * knob(c, "block") / knob(c, "split") * knob(c, "vec") * 2);
    CHECK(p->launches[0].shared_mem_bytes <= 224 * 1024);
  }
  CHECK(cached > 10);
  // A spec resolved for longer columns than its copy holds streams: no shared memory, `cached` 0.
  const StatusOr<ResolvedLaunchPlan> longer = spec.resolve(softmax(G, DType::kBFloat16, {64, 65536, 512}, false, 1));
  REQUIRE(longer.ok());
  CHECK(longer->launches[0].shared_mem_bytes == 0);
  CHECK(longer->launches[0].args.back().int_value == 0);
  // A tensor that stays in L2 is read again from there: the prior prefers no copy.
  CHECK(knob(best_of(softmax(G, DType::kFloat32, {4, 64, 32, 32}, false, 1), -1), "cache") == 0);
}

TEST_CASE("templates: cumsum over a column cuts it into segments over a block's threads", "[templates]") {
  const Backend G = Backend::kCuda;
  const KernelTemplate& t = *find_template("cumsum_split");
  CHECK(t.applies(cumsum(G, DType::kBFloat16, {64, 4096, 512}, 1)));
  CHECK_FALSE(t.applies(cumsum(G, DType::kBFloat16, {64, 4096}, -1)));      // rows: one thread each
  CHECK_FALSE(t.applies(cumsum(G, DType::kFloat16, {64, 4096, 512}, 1)));   // Note [float16 cumsum on CUDA]
  CHECK_FALSE(t.applies(cumsum(Backend::kCpu, DType::kFloat32, {64, 4096, 512}, 1)));
  // The issue's shape: 32,768 columns in 16-byte accesses, each cut in 32 segments of 128.
  const OpSignature s = cumsum(G, DType::kBFloat16, {64, 4096, 512}, 1);
  const std::vector<TemplateConfig> space = enumerate_space(s, t);
  REQUIRE(!space.empty());
  const TemplateConfig best = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
    return t.prior(s, a.values) < t.prior(s, b.values);
  });
  // 16-byte accesses, and a tile row of a whole 32-byte sector at least: on an H100 the copy's
  // 8-column tiles (16 bytes) ran at 1.9-2.5x PyTorch's kernel, 16-column ones at 6.0-6.5x
  // (bench/results/2026-12-07-h100-landscape-81bc259.tsv).
  CHECK(knob(best, "vec") == 8);
  CHECK(knob(best, "block") / knob(best, "split") * knob(best, "vec") * 2 >= 32);
  // 537 MB: the best with the tile copied to shared memory (Note [Cached columns]) holds 16
  // columns of 4096 in 128 KiB, each column in 256 segments of 16.
  const TemplateConfig cached = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
    const double pa = knob(a, "cache") == 1 ? t.prior(s, a.values) : 0, pb = knob(b, "cache") == 1 ? t.prior(s, b.values) : 0;
    return pa < pb;
  });
  CHECK(knob(cached, "cache") == 1);
  CHECK(knob(cached, "vec") == 8);
  CHECK(knob(cached, "split") == 256);
  CHECK(knob(cached, "block") == 512);
  const StatusOr<ResolvedLaunchPlan> r = t.instantiate(s, cached.values).resolve(s);
  REQUIRE(r.ok());
  CHECK(r->launches.at(0).grid[0] == 64 * (512 / 16));
  CHECK(r->launches.at(0).shared_mem_bytes == 4096 * 16 * 2);
  CHECK(r->launches.at(0).args.back().int_value == 1);
  // Without the copy: 16-byte accesses, 32 segments of 128.
  const TemplateConfig streamed = *std::max_element(space.begin(), space.end(), [&](const TemplateConfig& a, const TemplateConfig& b) {
    const double pa = knob(a, "cache") == 0 ? t.prior(s, a.values) : 0, pb = knob(b, "cache") == 0 ? t.prior(s, b.values) : 0;
    return pa < pb;
  });
  CHECK(knob(streamed, "vec") == 8);
  CHECK(knob(streamed, "split") == 32);
  const StatusOr<ResolvedLaunchPlan> rs = t.instantiate(s, streamed.values).resolve(s);
  REQUIRE(rs.ok());
  CHECK(rs->launches.at(0).shared_mem_bytes == 0);
  CHECK(rs->launches.at(0).args.back().int_value == 0);
  // Every configuration's copy and warp totals fit a block's shared memory.
  for (const TemplateConfig& c : space) {
    CHECK(knob(c, "split") <= knob(c, "block"));
    const StatusOr<ResolvedLaunchPlan> p = t.instantiate(s, c.values).resolve(s);
    REQUIRE(p.ok());
    CHECK(p->launches.at(0).shared_mem_bytes <= 224 * 1024);
  }
  // Segments only where every thread has one; vectors only where the columns allow them.
  for (const TemplateConfig& c : enumerate_space(cumsum(G, DType::kFloat32, {2, 5, 33}, 1), t)) {
    CHECK(knob(c, "split") <= 5);
    CHECK(knob(c, "vec") == 1);
  }
}

namespace {

// The values of a configuration's categorical knobs: which variant of its family it is.
std::vector<int64_t> variant_of(const TemplateConfig& c) {
  std::vector<int64_t> v;
  const std::vector<Knob>& knobs = family_of(c).knobs();
  for (size_t k = 0; k < knobs.size(); ++k) {
    if (knobs[k].categorical()) v.push_back(c.values[k]);
  }
  return v;
}

}  // namespace

TEST_CASE("templates: propose() from the root gives distinct defaults across variants, with priors", "[templates]") {
  TemplateProposer p;
  CHECK(p.name() == "template");
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (const OpSignature& s : signatures(b)) {
      INFO(name_of(s));
      SearchTree tree;
      ProposalRequest req{&s, &tree, 0, 4, 7, {}};
      const std::vector<Move> moves = p.propose(req);
      const std::vector<TemplateConfig> space = enumerate_space(s);
      CHECK(moves.size() == std::min<size_t>(4, space.size()));
      std::set<std::vector<int64_t>> all_variants;
      for (const TemplateConfig& c : space) all_variants.insert(variant_of(c));
      std::set<KernelId> ids;
      std::set<std::vector<int64_t>> variants;
      for (const Move& m : moves) {
        INFO(m.label);
        CHECK(m.proposer == "template");
        CHECK(m.prior > 0);
        CHECK(m.prior <= 1);
        CHECK(m.spec.validate().ok());
        CHECK(m.spec.resolve(s).ok());
        CHECK(m.spec.backend == s.target.backend);
        CHECK(ids.insert(m.spec.id()).second);
        const std::optional<TemplateConfig> c = TemplateProposer::config_of(s, m);
        REQUIRE(c.has_value());
        variants.insert(variant_of(*c));
      }
      // The first expansion spans the variants, as far as max_moves allows.
      CHECK(variants.size() == std::min<size_t>(moves.size(), all_variants.size()));
      // Deterministic: the same request, the same moves.
      const std::vector<Move> again = p.propose(req);
      REQUIRE(again.size() == moves.size());
      for (size_t i = 0; i < moves.size(); ++i) {
        CHECK(again[i].spec == moves[i].spec);
        CHECK(again[i].label == moves[i].label);
        CHECK(again[i].prior == moves[i].prior);
      }
    }
  }
}

TEST_CASE("templates: expanding the root again never repeats a spec and ends with the whole space", "[templates]") {
  TemplateProposer p;
  for (const OpSignature& s : {add(Backend::kCpu, DType::kFloat32, {1 << 20}),
                               softmax(Backend::kCpu, DType::kFloat32, {3, 5}),
                               gelu(Backend::kCuda, DType::kFloat16, {3000}, "tanh")}) {
    INFO(name_of(s));
    SearchTree tree;
    ProposalRequest req{&s, &tree, 0, 3, 0, {}};
    size_t added = 0;
    for (int round = 0; round < 1000; ++round) {
      const std::vector<Move> moves = p.propose(req);
      if (moves.empty()) break;
      CHECK(moves.size() <= 3);
      for (const Move& m : moves) {
        CHECK(!tree.find(m.spec.id()).has_value());
        tree.add(0, m);
        ++added;
      }
    }
    CHECK(added == enumerate_space(s).size());
    CHECK(tree.size() == added + 1);
  }
}

TEST_CASE("templates: propose() from a node gives its neighbours, one knob changed, never one in the tree",
          "[templates]") {
  TemplateProposer p;
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (const OpSignature& s : signatures(b)) {
      INFO(name_of(s));
      SearchTree tree;
      const std::vector<Move> roots = p.propose(ProposalRequest{&s, &tree, 0, 2, 0, {}});
      REQUIRE(!roots.empty());
      const uint64_t parent = tree.add(0, roots[0]);
      const TemplateConfig here = *TemplateProposer::config_of(s, roots[0]);
      const std::vector<TemplateConfig> near = neighbours(s, here);
      const std::vector<Move> moves = p.propose(ProposalRequest{&s, &tree, parent, 64, 0, {}});
      CHECK(moves.size() == near.size());
      std::set<KernelId> ids;
      double last_prior = 2;
      for (const Move& m : moves) {
        INFO(m.label);
        const std::optional<TemplateConfig> c = TemplateProposer::config_of(s, m);
        REQUIRE(c.has_value());
        CHECK(c->family == here.family);
        CHECK(knobs_changed(*c, here) == 1);
        CHECK(std::find(near.begin(), near.end(), *c) != near.end());
        CHECK(ids.insert(m.spec.id()).second);
        CHECK(m.prior <= last_prior);   // best first
        last_prior = m.prior;
      }
      // Add two neighbours: the next proposal from the same node skips them, and max_moves holds.
      if (moves.size() >= 4) {
        tree.add(parent, moves[0]);
        tree.add(parent, moves[2]);
        const std::vector<Move> rest = p.propose(ProposalRequest{&s, &tree, parent, 64, 0, {}});
        CHECK(rest.size() == moves.size() - 2);
        for (const Move& m : rest) CHECK(!tree.find(m.spec.id()).has_value());
        const std::vector<Move> two = p.propose(ProposalRequest{&s, &tree, parent, 2, 0, {}});
        REQUIRE(two.size() == 2);
        CHECK(two[0].spec == moves[1].spec);
        CHECK(two[1].spec == moves[3].spec);
      }
    }
  }
}

TEST_CASE("templates: a node it did not make, or a move that lies about its config, gives nothing", "[templates]") {
  TemplateProposer p;
  const OpSignature s = softmax(Backend::kCuda, DType::kFloat16, {64, 4096});
  SearchTree tree;
  const std::vector<Move> roots = p.propose(ProposalRequest{&s, &tree, 0, 2, 0, {}});
  REQUIRE(roots.size() == 2);

  Move llm = roots[0];
  llm.proposer = "llm";
  llm.label = "llm: warp shuffles";
  llm.spec.source += "\n// rewritten";
  const uint64_t from_llm = tree.add(0, llm);
  CHECK(p.propose(ProposalRequest{&s, &tree, from_llm, 4, 0, {}}).empty());

  Move liar = roots[1];
  liar.label = label(*find_template("softmax"), TemplateConfig{"softmax", {0, 0, 32, 32, 1, 0}});   // not its spec
  const uint64_t from_liar = tree.add(0, liar);
  CHECK(!TemplateProposer::config_of(s, liar).has_value());
  CHECK(p.propose(ProposalRequest{&s, &tree, from_liar, 4, 0, {}}).empty());

  // A template node of another signature's space (same family, another row length).
  const OpSignature other = softmax(Backend::kCuda, DType::kFloat16, {64, 100});
  CHECK(!TemplateProposer::config_of(other, roots[0]).has_value());
  // Requests without a tree or a parent that does not exist.
  CHECK(p.propose(ProposalRequest{&s, nullptr, 1, 4, 0, {}}).empty());
  CHECK(p.propose(ProposalRequest{&s, &tree, 999, 4, 0, {}}).empty());
  CHECK(p.propose(ProposalRequest{&s, &tree, 0, 0, 0, {}}).empty());
  CHECK(p.propose(ProposalRequest{nullptr, &tree, 0, 4, 0, {}}).empty());
}

TEST_CASE("templates: sample() is uniform over the valid space and deterministic for a seed", "[templates]") {
  TemplateProposer p;
  const OpSignature s = softmax(Backend::kCpu, DType::kFloat32, {256, 512});
  const std::vector<TemplateConfig> space = enumerate_space(s);
  REQUIRE(space.size() > 10);
  std::map<std::string, int> counts;
  std::mt19937_64 rng(1234);
  const int draws = static_cast<int>(space.size()) * 60;
  for (int i = 0; i < draws; ++i) {
    const std::optional<Move> m = p.sample(s, rng);
    REQUIRE(m.has_value());
    ++counts[m->label];
  }
  CHECK(counts.size() == space.size());   // every configuration drawn
  // Chi-square against uniform, with a bound far in the tail for this many degrees of freedom.
  double chi2 = 0;
  for (const auto& [l, n] : counts) chi2 += (n - 60.0) * (n - 60.0) / 60.0;
  const double dof = static_cast<double>(space.size() - 1);
  CHECK(chi2 < dof + 6 * std::sqrt(2 * dof));

  std::mt19937_64 a(99), b(99);
  for (int i = 0; i < 20; ++i) CHECK(p.sample(s, a)->label == p.sample(s, b)->label);
  const std::optional<Move> m = p.sample(s, a);
  REQUIRE(m.has_value());
  CHECK(m->spec.resolve(s).ok());
  CHECK(TemplateProposer::move_for(s, *TemplateProposer::config_of(s, *m))->spec == m->spec);
  CHECK(!TemplateProposer::move_for(s, TemplateConfig{"cpu.softmax", {0, 128, 8}}).ok());   // rows=128: not a knob value
  CHECK(!TemplateProposer::move_for(s, TemplateConfig{"softmax", {0, 0, 256, 32, 4, 0}}).ok());   // a CUDA family
}

TEST_CASE("templates: the space is closed under neighbours and covers what is valid", "[templates]") {
  for (const OpSignature& s : {softmax(Backend::kCuda, DType::kBFloat16, {100, 4096}),
                               layer_norm(Backend::kCuda, DType::kFloat32, {8, 96}),
                               layer_norm(Backend::kCpu, DType::kFloat32, {3, 10}, false, false),
                               group_norm(Backend::kCuda, DType::kFloat16, {2, 8, 5, 5}, 4),
                               add(Backend::kCuda, DType::kFloat32, {7})}) {
    INFO(name_of(s));
    const std::vector<TemplateConfig> space = enumerate_space(s);
    REQUIRE(!space.empty());
    const std::set<TemplateConfig> in_space(space.begin(), space.end());
    CHECK(in_space.size() == space.size());
    for (const TemplateConfig& c : space) {
      for (const TemplateConfig& n : neighbours(s, c)) {
        CHECK(in_space.count(n) == 1);
        CHECK(knobs_changed(n, c) == 1);
      }
    }
    // Brute force over every family's whole knob domain: exactly the valid points are listed.
    size_t valid = 0;
    for (const KernelTemplate* t : templates_for(s)) {
      std::vector<size_t> idx(t->knobs().size(), 0);
      for (bool more = true; more;) {
        std::vector<int64_t> v;
        for (size_t k = 0; k < idx.size(); ++k) v.push_back(t->knobs()[k].values[idx[k]]);
        if (is_valid(*t, s, v)) {
          ++valid;
          CHECK(in_space.count(TemplateConfig{std::string(t->family()), v}) == 1);
        }
        more = false;
        for (size_t k = idx.size(); k-- > 0;) {
          if (++idx[k] < t->knobs()[k].values.size()) {
            more = true;
            break;
          }
          idx[k] = 0;
        }
      }
    }
    CHECK(valid == space.size());
  }
}

// ---- CUDA: every family compiles -----------------------------------------------------------------------

namespace {

// A deterministic sample of a space: every configuration when it is small, else evenly spaced
// ones plus the first of each variant.
std::vector<TemplateConfig> sample_of(const std::vector<TemplateConfig>& space, size_t n) {
  if (space.size() <= n) return space;
  std::vector<TemplateConfig> out;
  std::set<std::vector<int64_t>> variants;
  for (const TemplateConfig& c : space) {
    if (variants.insert(variant_of(c)).second) out.push_back(c);
  }
  for (size_t i = 0; i < n; ++i) {
    const TemplateConfig& c = space[i * space.size() / n];
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

}  // namespace

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// KFORGE_TEST_OPS: a comma-separated list of operators ("aten::_softmax,aten::cumsum") whose
// signatures alone the NVRTC compile test and verify_all take (on a GPU host, to check one family in
// minutes rather than all of them in five); unset or empty: every signature.
bool op_selected(const OpSignature& sig) {
  const std::string ops = env_or_empty("KFORGE_TEST_OPS");
  if (ops.empty()) return true;
  size_t at = 0;
  while (at <= ops.size()) {
    const size_t end = std::min(ops.find(',', at), ops.size());
    if (ops.compare(at, end - at, sig.op) == 0) return true;
    at = end + 1;
  }
  return false;
}

// A sampling knob from the environment (KFORGE_NVRTC_EVERY, KFORGE_SWEEP_EVERY): n keeps one case
// in n; unset, 1: every case.
size_t every_from_env(const char* name) {
  const char* text = std::getenv(name);
  return text == nullptr || *text == '\0' ? 1 : std::max<size_t>(1, std::stoul(text));
}

}  // namespace

TEST_CASE("templates: the CUDA families compile with NVRTC for sm_90 over their knob spaces", "[templates]") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) {
    WARN("no NVRTC on this host: " << nvrtc.status().to_string());
    return;
  }
  TempDir t("kforge-template-test");
  StatusOr<CandidateBuilder> builder = CandidateBuilder::for_cuda((t.path / "builds").string(), *nvrtc, 9, 0);
  REQUIRE(builder.ok());
  // Every macro combination a family has: each dtype, each variant and vector width, the register
  // cache on and off, weight and bias present or not; block sizes sampled (they only size loops).
  std::vector<OpSignature> sigs;
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (bool log : {false, true}) {
      sigs.push_back(softmax(Backend::kCuda, d, {512, 1024}, log));
      sigs.push_back(softmax(Backend::kCuda, d, {512, 1000}, log));
      sigs.push_back(softmax(Backend::kCuda, d, {8, 64, 32, 32}, log, 1));
      sigs.push_back(softmax(Backend::kCuda, d, {8, 65536}, log));   // softmax_split, split and whole
    }
    sigs.push_back(layer_norm(Backend::kCuda, d, {512, 1024}));
    sigs.push_back(layer_norm(Backend::kCuda, d, {512, 1000}, false, false));
    sigs.push_back(layer_norm(Backend::kCuda, d, {512, 1000}, true, false));
    sigs.push_back(with_strides(layer_norm(Backend::kCuda, d, {32, 1024, 8, 8}), 0, {196608, 192, 8, 1}));   // QK-norm
    sigs.push_back(group_norm(Backend::kCuda, d, {4, 32, 8, 8}, 8));
    sigs.push_back(group_norm(Backend::kCuda, d, {4, 32, 8, 8}, 8, false));
    sigs.push_back(group_norm(Backend::kCuda, d, {2, 64, 64, 64}, 32));   // rows over clusters
    sigs.push_back(gelu(Backend::kCuda, d, {1 << 20}));
    sigs.push_back(gelu(Backend::kCuda, d, {1 << 20}, "tanh"));
    sigs.push_back(silu(Backend::kCuda, d, {1 << 20}));
    sigs.push_back(add(Backend::kCuda, d, {1 << 20}, Arg::real(-0.5)));
    sigs.push_back(relu(Backend::kCuda, d, {1 << 20}));
    for (const char* op : {"sigmoid", "tanh", "hardswish", "neg", "rsqrt", "exp"}) {
      sigs.push_back(unary(op, Backend::kCuda, d, {1 << 20}));
    }
    for (double e : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0, 1.7}) {
      sigs.push_back(pow_scalar(Backend::kCuda, d, {1 << 20}, Arg::real(e)));
    }
    sigs.push_back(embedding(Backend::kCuda, d, 32000, 2048, {8, 512}));
    sigs.push_back(mul_scalar(Backend::kCuda, d, {1 << 20}, Arg::real(0.125)));
    sigs.push_back(clamp_min(Backend::kCuda, d, {1 << 20}, Arg::real(1e-6)));
    sigs.push_back(in_place(clamp_min(Backend::kCuda, d, {1 << 20}, Arg::integer(0))));
    sigs.push_back(upsample_nearest(Backend::kCuda, d, {2, 320, 32, 32}, {64, 64}, 2.0, 2.0));
    sigs.push_back(max_pool(Backend::kCuda, d, {8, 64, 112, 112}, {3, 3}, {2, 2}, {1, 1}));
    sigs.push_back(avg_pool(Backend::kCuda, d, {8, 256, 56, 56}, {2, 2}, {2, 2}, {0, 0}));
    sigs.push_back(avg_pool(Backend::kCuda, d, {8, 64, 31, 31}, {3, 3}, {2, 2}, {1, 1}, true, false, 4));
    sigs.push_back(adaptive_avg_pool(Backend::kCuda, d, {8, 512, 14, 14}, {7, 7}));
    sigs.push_back(upsample_bilinear(Backend::kCuda, d, {2, 320, 32, 32}, {64, 64}, false, 2.0, 2.0));
    sigs.push_back(upsample_bilinear(Backend::kCuda, d, {2, 19, 64, 64}, {512, 512}, true));
    sigs.push_back(channels_last(max_pool(Backend::kCuda, d, {8, 64, 112, 112}, {3, 3}, {2, 2}, {1, 1})));
    sigs.push_back(channels_last(avg_pool(Backend::kCuda, d, {8, 256, 56, 56}, {2, 2}, {2, 2}, {0, 0})));
    sigs.push_back(channels_last(adaptive_avg_pool(Backend::kCuda, d, {8, 512, 14, 14}, {7, 7})));
    sigs.push_back(channels_last(upsample_nearest(Backend::kCuda, d, {2, 320, 32, 32}, {64, 64}, 2.0, 2.0)));
    sigs.push_back(channels_last(upsample_bilinear(Backend::kCuda, d, {2, 320, 32, 32}, {64, 64}, false, 2.0, 2.0)));
    sigs.push_back(channels_last(binary("add", Backend::kCuda, d, {8, 256, 56, 56}, {8, 256, 56, 56})));
    sigs.push_back(channels_last(batch_norm(Backend::kCuda, d, {8, 64, 56, 56})));
    sigs.push_back(rope_mul(Backend::kCuda, d));
    sigs.push_back(with_strides(binary("sub", Backend::kCuda, d, {9, 33}, {9, 33}), 1, {1, 9}));
    if (d != DType::kFloat16) {   // Note [float16 cumsum on CUDA]
      sigs.push_back(cumsum(Backend::kCuda, d, {64, 4096}, -1));
      sigs.push_back(cumsum(Backend::kCuda, d, {8, 512, 64}, 1));   // cumsum_split
    }
    sigs.push_back(cat(Backend::kCuda, d, {{8, 12, 512, 64}, {8, 12, 1, 64}}, 2));
    sigs.push_back(cat(Backend::kCuda, d, {{4, 7}, {4, 9}, {4, 1}}, 1));
    sigs.push_back(rotate_half_cat(Backend::kCuda, d, 8, 32, 512, 64));
    sigs.push_back(cropped_kv_cat(Backend::kCuda, d, 32, 4, 512, 64));
    sigs.push_back(rotate_half_cat(Backend::kCuda, d, 2, 3, 5, 6));   // rows of 3: vectors of one
    for (int64_t n : {1, 2, 3, 4, 5, 6}) {   // every KF_NDIM: dimensions that do not merge
      std::vector<int64_t> sizes(static_cast<size_t>(n), 3), strides(static_cast<size_t>(n));
      int64_t step = 2;
      for (size_t k = sizes.size(); k-- > 0;) {
        strides[k] = step;
        step *= 4;
      }
      sigs.push_back(clone(Backend::kCuda, d, sizes, strides, Arg::integer(0)));
    }
    sigs.push_back(clone(Backend::kCuda, d, {8, 512, 12, 64}, {393216, 64, 32768, 1}, Arg::integer(0)));
    sigs.push_back(clone(Backend::kCuda, d, {16, 320, 64, 64}, {1310720, 1, 20480, 320}, Arg::integer(0)));
    if (d != DType::kBFloat16) sigs.push_back(cudnn_batch_norm(d, {8, 64, 28, 28}));
    sigs.push_back(embedding(Backend::kCuda, d, 1000, 8, {64}, DType::kInt32));
    sigs.push_back(binary("sub", Backend::kCuda, d, {512, 1024}, {1024}, Arg::real(0.5)));
    sigs.push_back(binary("mul", Backend::kCuda, d, {64, 8, 1024}, {64, 8, 1}));
    sigs.push_back(binary("mul", Backend::kCuda, d, {8, 64, 16, 16}, {1, 64, 1, 1}));
    sigs.push_back(binary("div", Backend::kCuda, d, {1 << 20}, {1 << 20}));
    for (const char* op : {"add", "sub", "mul", "div"}) sigs.push_back(with_number(op, Backend::kCuda, d, {1 << 20}));
    sigs.push_back(batch_norm(Backend::kCuda, d, {8, 64, 28, 28}));
    sigs.push_back(batch_norm(Backend::kCuda, d, {8, 64, 28, 28}, false));
    if (d != DType::kFloat32) sigs.push_back(batch_norm(Backend::kCuda, d, {8, 64, 28, 28}, true, DType::kFloat32));
    for (const char* op : {"sum", "mean", "amax"}) {
      sigs.push_back(reduce(op, Backend::kCuda, d, {512, 1024}, std::vector<int64_t>{-1}));
      sigs.push_back(reduce(op, Backend::kCuda, d, {64, 8, 56, 56}, std::vector<int64_t>{2, 3}, true));
    }
    sigs.push_back(argmax(Backend::kCuda, d, {512, 1024}, -1));
    sigs.push_back(argmax(Backend::kCuda, d, {4, 50257}, 1, true));
  }
  // KFORGE_NVRTC_EVERY=n compiles the first picked configuration of every signature and one in n
  // of the rest (the sanitizer run samples: NVRTC under ASan is slow, and it checks our code around
  // NVRTC, not NVRTC; the plain run compiles them all). KFORGE_TEST_OPS keeps those operators'
  // signatures only (a family's knobs compiled in a minute while it is written).
  const size_t every = every_from_env("KFORGE_NVRTC_EVERY");
  const bool filtered = !env_or_empty("KFORGE_TEST_OPS").empty();
  std::erase_if(sigs, [](const OpSignature& s) { return !op_selected(s); });
  size_t position = 0;
  std::set<std::string> built;   // the build cache key: each distinct source and options once
  size_t compiled = 0;
  for (const OpSignature& s : sigs) {
    const std::vector<TemplateConfig> space = enumerate_space(s);
    REQUIRE(!space.empty());
    std::vector<TemplateConfig> picked = sample_of(space, 6);
    // The first configuration with each value of each knob, and with each combination of the knobs
    // that select code paths (the row mapping, its lanes and the register cache).
    std::set<std::vector<int64_t>> seen;
    for (const TemplateConfig& c : space) {
      const std::vector<Knob>& knobs = family_of(c).knobs();
      std::vector<std::vector<int64_t>> keys;
      std::vector<int64_t> paths = {-1};
      for (size_t k = 0; k < knobs.size(); ++k) {
        keys.push_back({static_cast<int64_t>(k), c.values[k]});
        if (knobs[k].name == "map" || knobs[k].name == "row_lanes" || knobs[k].name == "cache" || knobs[k].name == "cluster" ||
            (knobs[k].name == "split" && c.values[k] <= 2)) {
          paths.push_back(c.values[k]);
        }
      }
      keys.push_back(paths);
      bool fresh = false;
      for (const std::vector<int64_t>& key : keys) fresh = seen.insert(key).second || fresh;
      if (fresh && std::find(picked.begin(), picked.end(), c) == picked.end()) picked.push_back(c);
    }
    for (size_t i = 0; i < picked.size(); ++i) {
      if (i > 0 && position++ % every != 0) continue;
      const TemplateConfig& c = picked[i];
      const KernelSpec spec = family_of(c).instantiate(s, c.values);
      StatusOr<BuildOutput> out = builder->build(spec, 120000);
      REQUIRE(out.ok());
      INFO(name_of(s) << "\n" << label(family_of(c), c) << "\n" << out->log.substr(0, 4000));
      CHECK(out->compiled);
      // Every entry the plan launches is in the image (a family compiles only those: Note [Split
      // rows]); the symbol's name is in the cubin's string table, or the PTX's .entry line.
      for (const std::string& entry : spec.entry_points) {
        INFO("entry " << entry);
        CHECK(out->artifact.find(entry) != std::string::npos);
      }
      if (built.insert(out->key).second) ++compiled;
    }
  }
  INFO("compiled " << compiled << " distinct CUDA instances, one picked configuration in " << every);
  CHECK(compiled > (filtered ? 0 : every == 1 ? 100 : sigs.size() / 2));
}

// ---- instances verified by the worker --------------------------------------------------------------------

namespace {

// The instances to verify for one signature: the root's defaults (one per variant first), then
// `samples` uniform draws, without repeats.
std::vector<Move> instances(const OpSignature& s, size_t defaults, size_t samples, uint64_t seed) {
  TemplateProposer p;
  SearchTree tree;
  std::vector<Move> out = p.propose(ProposalRequest{&s, &tree, 0, defaults, seed, {}});
  for (const Move& m : out) tree.add(0, m);
  std::mt19937_64 rng(seed);
  for (size_t tries = 0; tries < 8 * samples && out.size() < defaults + samples; ++tries) {
    std::optional<Move> m = p.sample(s, rng);
    REQUIRE(m.has_value());
    if (tree.find(m->spec.id())) continue;
    tree.add(0, *m);
    out.push_back(std::move(*m));
  }
  return out;
}

// Every configuration whose rows-per-block does not divide the rows: lanes of a warp whose row is
// past the end must take part in the shuffles and write nothing.
std::vector<Move> partial_blocks(const OpSignature& s) {
  std::vector<Move> out;
  std::set<int64_t> lanes_seen;
  const int64_t rows = std::get<TensorMeta>(s.args[0].value).numel() / std::get<TensorMeta>(s.args[0].value).sizes.back();
  for (const TemplateConfig& c : enumerate_space(s)) {
    if (knob(c, "map") != 1) continue;
    const int64_t per_block = knob(c, "block") / knob(c, "row_lanes");
    if (rows % per_block == 0 || !lanes_seen.insert(knob(c, "row_lanes") * 8 + knob(c, "cache")).second) continue;
    out.push_back(*TemplateProposer::move_for(s, c));
  }
  return out;
}

// A worker on `device` (the kforge-worker launcher ctest names in KFORGE_WORKER), its build cache
// in `dir`.
eval::WorkerOptions worker_options(const std::string& device, const TempDir& dir) {
  eval::WorkerOptions o;
  o.program = env_or_empty("KFORGE_WORKER");
  if (o.program.empty()) FAIL("KFORGE_WORKER must name the kforge-worker launcher (ctest sets it)");
  o.device = device;
  o.build_cache_dir = (dir.path / "builds").string();
  return o;
}

// Every instance must come back verified: built, six trials (normal, uniform, large, offset,
// zeros, normal) passed with every check. `every_family`: and every family of the device's backend
// has verified instances among them.
void verify_all(const std::string& device, const std::vector<std::pair<OpSignature, std::vector<Move>>>& work,
                bool every_family = true) {
  if (!env_or_empty("KFORGE_TEST_OPS").empty()) every_family = false;
  TempDir t("kforge-template-worker-test");
  eval::WorkerProcess w(worker_options(device, t));
  uint64_t id = 1;
  size_t verified = 0;
  std::set<std::string> families;
  for (const auto& [sig, moves] : work) {
    if (!op_selected(sig)) continue;
    for (const Move& m : moves) {
      eval::EvalJob j;
      j.job_id = id++;
      j.signature = sig;
      j.spec = m.spec;
      j.policy.seed = 42;
      j.policy.measure = false;
      const eval::EvalResult r = w.evaluate(j);
      INFO(name_of(sig) << "\n" << m.label);
      INFO("status " << eval::eval_status_name(r.status) << " in " << r.phase << ": " << r.message);
      INFO("verify: " << r.verify.failed_check << " / " << r.verify.trial << " / " << r.verify.detail);
      INFO("errors: max abs " << r.verify.max_abs_error << " (PyTorch's " << r.verify.torch_max_abs_error
                              << "), relative " << r.verify.rel_error << " (PyTorch's " << r.verify.torch_rel_error
                              << ")");
      INFO("build log: " << r.build_log.substr(0, 3000));
      CHECK(r.status == eval::EvalStatus::kVerified);
      if (r.status == eval::EvalStatus::kVerified) {
        ++verified;
        CHECK(r.verify.trials_passed == r.verify.trials_run);
        CHECK(r.verify.trials_run >= eval::kMinTrials);
        families.insert(TemplateProposer::config_of(sig, m)->family);
      }
    }
  }
  // Every family of the device's backend has instances here: a new family comes with its cases.
  const Backend backend = device == "cpu" ? Backend::kCpu : Backend::kCuda;
  std::set<std::string> all;
  for (const KernelTemplate* k : template_library()) {
    if (k->backend() == backend) all.emplace(k->family());
  }
  if (every_family) CHECK(families == all);
  WARN(device << ": " << verified << " template instances verified by the worker, families: "
               << [&] {
                    std::string f;
                    for (const std::string& n : families) f += n + " ";
                    return f;
                  }());
}

// _safe_softmax over [6, 33] on `device`, with one captured call whose rows are all -inf (0 out),
// -inf and NaN (NaN out), mostly -inf, one finite, and normal: every instance of the family must
// pass; the same kernels without KF_SAFE (plain softmax: NaN for the -inf rows) must fail there
// with nan_inf_positions, so the captured trial is what decides (Note [Safe softmax]).
// With `columns`, the same values as the columns of a [33, 6] tensor normalized over dim 0
// (dim_softmax.cc's families).
// Rows of -inf, of -inf and a NaN, and mostly -inf, through safe_softmax's instances (with
// `columns` over dimension 0; with `long_rows` 4099 elements long, through softmax_split's paths:
// split 1 and 4, cached and streamed, 4 also as a cluster, so that whole chunks are -inf, Note [Split rows]).
void check_safe_softmax_rows(const std::string& device, Backend b, const std::string& arch, bool columns = false,
                             bool long_rows = false) {
  const int cols = long_rows ? 4099 : 33;
  OpSignature sig = columns ? safe_softmax(b, DType::kFloat32, {cols, 6}, 0) : safe_softmax(b, DType::kFloat32, {6, cols});
  sig.target.arch = arch;
  std::vector<float> x(static_cast<size_t>(6 * cols));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  const float inf = std::numeric_limits<float>::infinity();
  for (int c = 0; c < cols; ++c) x[c] = -inf;                                        // row 0: all -inf
  for (int c = 0; c < cols; ++c) x[cols + c] = c == 5 ? std::nanf("") : -inf;        // row 1: -inf and a NaN
  for (int c = 0; c < cols - 3; ++c) x[2 * cols + c] = -inf;                         // row 2: three finite
  for (int c = 0; c < cols; ++c) x[3 * cols + c] = c == cols - 1 ? 1.5f : -inf;      // row 3: one finite
  wire::CapturedInputs cap;
  cap.pid = 1;
  cap.signature_id = sig.id();
  wire::CapturedTensor t;
  t.arg_index = 0;
  t.dtype = DType::kFloat32;
  t.sizes = {6, cols};
  t.strides = {cols, 1};
  if (columns) {
    std::vector<float> xt(x.size());
    for (int r = 0; r < 6; ++r) {
      for (int c = 0; c < cols; ++c) xt[static_cast<size_t>(c * 6 + r)] = x[static_cast<size_t>(r * cols + c)];
    }
    x = std::move(xt);
    t.sizes = {cols, 6};
    t.strides = {6, 1};
  }
  t.bytes.assign(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  cap.tensors = {t};

  TempDir dir("kforge-safe-softmax-test");
  eval::WorkerProcess w(worker_options(device, dir));
  uint64_t id = 1;
  auto evaluate = [&](const KernelSpec& spec) {
    eval::EvalJob j;
    j.job_id = id++;
    j.signature = sig;
    j.spec = spec;
    j.policy.seed = 42;
    j.policy.measure = false;
    j.captured = {cap};
    return w.evaluate(j);
  };
  std::vector<Move> moves;
  if (long_rows) {
    const KernelTemplate& split = *find_template("safe_softmax_split");
    for (int64_t n : {1, 4}) {
      for (int64_t cache : {0, 1}) {
        for (int64_t cluster : {0, 1}) {
          if (cluster == 1 && n == 1) continue;   // a cluster is a row's chunks
          std::optional<TemplateConfig> best;
          for (const TemplateConfig& c : enumerate_space(sig, split)) {
            if (knob(c, "split") != n || knob(c, "cache") != cache || knob(c, "cluster") != cluster) continue;
            if (!best || split.prior(sig, c.values) > split.prior(sig, best->values)) best = c;
          }
          REQUIRE(best.has_value());
          moves.push_back(*TemplateProposer::move_for(sig, *best));
        }
      }
    }
  } else {
    moves = instances(sig, 2, 2, 31);
  }
  REQUIRE(!moves.empty());
  for (const Move& m : moves) {
    INFO(m.label);
    const eval::EvalResult r = evaluate(m.spec);
    INFO("status " << eval::eval_status_name(r.status) << ": " << r.message << " / " << r.verify.failed_check << " / "
                   << r.verify.trial << " / " << r.verify.detail);
    CHECK(r.status == eval::EvalStatus::kVerified);
    KernelSpec plain = m.spec;
    for (std::string& opt : plain.compile_options) {
      if (opt == "-DKF_SAFE=1") opt = "-DKF_SAFE=0";
    }
    REQUIRE(plain.compile_options != m.spec.compile_options);
    const eval::EvalResult p = evaluate(plain);
    INFO("without KF_SAFE: " << eval::eval_status_name(p.status) << " / " << p.verify.failed_check << " / "
                             << p.verify.trial << " / " << p.verify.detail);
    CHECK(p.status == eval::EvalStatus::kVerifyFailed);
    CHECK(p.verify.failed_check == "nan_inf_positions");
    CHECK(p.verify.trial == "captured#1");
  }
}

// Note [Property sweep]
// Each signature of signatures(b), with one tensor argument changed in one of these ways, keeping
// its sizes (so the other arguments still fit): a data pointer only as aligned as its dtype; the
// last two dimensions transposed (a non-contiguous view); rows with gaps (a slice of wider rows);
// channels-last (4 dimensions); no elements (the first dimension 0). A family must either refuse
// the result (no moves: never an exception) or have its instances verified by the worker.
enum class Mutation { kMisaligned, kTransposed, kGaps, kChannelsLast, kEmpty };
const char* mutation_name(Mutation m) {
  switch (m) {
    case Mutation::kMisaligned: return "misaligned";
    case Mutation::kTransposed: return "transposed";
    case Mutation::kGaps: return "gaps";
    case Mutation::kChannelsLast: return "channels_last";
    case Mutation::kEmpty: return "empty";
  }
  return "?";
}

bool mutate(TensorMeta& t, Mutation m) {
  const size_t r = t.sizes.size();
  switch (m) {
    case Mutation::kMisaligned: {
      const auto elem = static_cast<uint32_t>(dtype_size_bytes(t.dtype));
      if (t.alignment <= elem) return false;
      t.alignment = elem;
      return true;
    }
    case Mutation::kTransposed: {
      if (r < 2 || t.sizes[r - 1] < 2 || t.sizes[r - 2] < 2) return false;
      std::vector<int64_t> sizes = t.sizes;
      std::swap(sizes[r - 1], sizes[r - 2]);
      std::vector<int64_t> st(r, 1);
      for (size_t d = r - 1; d-- > 0;) st[d] = st[d + 1] * sizes[d + 1];
      std::swap(st[r - 1], st[r - 2]);
      t.strides = st;
      return true;
    }
    case Mutation::kGaps: {
      if (r < 2 || t.sizes[r - 1] < 1) return false;
      std::vector<int64_t> st(r, 1);
      st[r - 2] = t.sizes[r - 1] + 3;
      for (size_t d = r - 2; d-- > 0;) st[d] = st[d + 1] * t.sizes[d + 1];
      t.strides = st;
      return true;
    }
    case Mutation::kChannelsLast: {
      if (r != 4 || t.sizes[1] < 2) return false;
      const int64_t c = t.sizes[1], h = t.sizes[2], w = t.sizes[3];
      t.strides = {h * w * c, 1, w * c, c};
      return true;
    }
    case Mutation::kEmpty:
      if (r < 1) return false;
      t.sizes[0] = 0;
      return true;
  }
  return false;
}

// `defaults` proposals and up to `samples` sampled instances of every family that applies; none
// when no family does.
std::vector<Move> instances_if_any(const OpSignature& s, size_t defaults, size_t samples, uint64_t seed) {
  TemplateProposer p;
  SearchTree tree;
  std::vector<Move> out = p.propose(ProposalRequest{&s, &tree, 0, defaults, seed, {}});
  if (out.empty()) return out;
  for (const Move& m : out) tree.add(0, m);
  std::mt19937_64 rng(seed);
  for (size_t tries = 0; tries < 8 * samples && out.size() < defaults + samples; ++tries) {
    std::optional<Move> m = p.sample(s, rng);
    if (!m || tree.find(m->spec.id())) continue;
    tree.add(0, *m);
    out.push_back(std::move(*m));
  }
  return out;
}

}  // namespace

namespace {

// Note [Property sweep] over signatures(backend) on `device`.
void property_sweep(const std::string& device, Backend backend, const std::string& arch) {
  // KFORGE_SWEEP_EVERY=n keeps one case in n (CI samples; bench runs take 1: every case).
  const size_t every = every_from_env("KFORGE_SWEEP_EVERY");
  std::vector<std::pair<OpSignature, std::vector<Move>>> work;
  std::map<std::string, std::pair<size_t, size_t>> by_mutation;   // served, refused
  size_t index = 0;
  for (OpSignature base : signatures(backend)) {
    base.target.arch = arch;
    for (size_t i = 0; i < base.args.size(); ++i) {
      if (!std::holds_alternative<TensorMeta>(base.args[i].value)) continue;
      if (std::get<TensorMeta>(base.args[i].value).sizes.empty()) continue;   // a Python number
      for (Mutation m : {Mutation::kMisaligned, Mutation::kTransposed, Mutation::kGaps, Mutation::kChannelsLast,
                         Mutation::kEmpty}) {
        OpSignature s = base;
        if (!mutate(std::get<TensorMeta>(s.args[i].value), m)) continue;
        if (index++ % every != 0) continue;
        INFO(name_of(s) << " (argument " << i << " " << mutation_name(m) << ")");
        std::vector<Move> moves;
        REQUIRE_NOTHROW(moves = instances_if_any(s, 1, 1, 29 + index));
        auto& count = by_mutation[mutation_name(m)];
        if (moves.empty()) {
          ++count.second;
          continue;
        }
        ++count.first;
        work.emplace_back(s, std::move(moves));
      }
    }
  }
  verify_all(device, work, /*every_family=*/false);
  std::string summary;
  for (const auto& [name, c] : by_mutation) {
    summary += name + ": " + std::to_string(c.first) + " served, " + std::to_string(c.second) + " refused; ";
  }
  WARN(device << " property sweep (one case in " << every << "): " << summary);
}

}  // namespace

// Run apart from "[cpu]" (ctest templates.sweep_cpu, sampled there by KFORGE_SWEEP_EVERY).
TEST_CASE("templates: CPU property sweep: odd layouts are served correctly or refused cleanly", "[sweep]") {
  property_sweep("cpu", Backend::kCpu, cpu_host_environment("").arch);
}

// From the bundle on a GPU host: kforge_template_tests "[gpu-sweep]" (not part of "[gpu]").
TEST_CASE("templates: CUDA property sweep: odd layouts are served correctly or refused cleanly", "[gpu-sweep]") {
  const std::string arch = env_or_empty("KFORGE_TEST_CUDA_ARCH").empty() ? "sm_90" : env_or_empty("KFORGE_TEST_CUDA_ARCH");
  property_sweep("cuda:0", Backend::kCuda, arch);
}

TEST_CASE("templates: safe_softmax writes 0 for rows of -inf and NaN for rows with a NaN, on the CPU", "[cpu]") {
  check_safe_softmax_rows("cpu", Backend::kCpu, cpu_host_environment("").arch);
  check_safe_softmax_rows("cpu", Backend::kCpu, cpu_host_environment("").arch, true);
}

TEST_CASE("templates: safe_softmax writes 0 for rows of -inf and NaN for rows with a NaN, on CUDA", "[gpu]") {
  const std::string arch = env_or_empty("KFORGE_TEST_CUDA_ARCH").empty() ? "sm_90" : env_or_empty("KFORGE_TEST_CUDA_ARCH");
  check_safe_softmax_rows("cuda:0", Backend::kCuda, arch);
  check_safe_softmax_rows("cuda:0", Backend::kCuda, arch, true);
  check_safe_softmax_rows("cuda:0", Backend::kCuda, arch, false, true);
}

namespace {

// One default instance per operator named (the first of signatures(backend) for it), evaluated with
// measure on: the worker must time PyTorch's kernel for the backend's key, for the composite
// operators too (clone, _to_copy, embedding, mul.Scalar: no kernel at CPU or CUDA of their own;
// Note [PyTorch's kernel for a key] in worker/measurer.cc: their measure killed the worker) and for
// one with a kernel at the key (_softmax). Every instance takes a compile: a few operators, not all.
void measure_operators(const std::string& device, Backend backend, const std::string& arch) {
  const std::set<std::string> ops = {"aten::clone.", "aten::_to_copy.", "aten::embedding.", "aten::mul.Scalar",
                                     "aten::_softmax."};
  TempDir t("kforge-template-measure-test");
  eval::WorkerProcess w(worker_options(device, t));
  std::set<std::string> seen;
  uint64_t id = 1;
  for (OpSignature sig : signatures(backend)) {
    const std::string op = sig.op + "." + sig.overload;
    if (!ops.count(op) || !seen.insert(op).second) continue;
    sig.target.arch = arch;
    const std::vector<Move> moves = instances(sig, 1, 0, 5);
    REQUIRE(!moves.empty());
    eval::EvalJob j;
    j.job_id = id++;
    j.signature = sig;
    j.spec = moves.front().spec;
    j.policy.seed = 42;
    j.policy.measure = true;
    const eval::EvalResult r = w.evaluate(j);
    INFO(name_of(sig) << "\n" << moves.front().label);
    INFO("status " << eval::eval_status_name(r.status) << " in " << r.phase << ": " << r.message);
    CHECK(r.status == eval::EvalStatus::kMeasured);
    CHECK(r.timing.baseline_median_ns > 0);
    CHECK(r.timing.candidate_median_ns > 0);
  }
  CHECK(seen == ops);
}

}  // namespace

TEST_CASE("templates: the worker times PyTorch's kernel on the CPU, for composite operators too",
          "[cpu]") {
  measure_operators("cpu", Backend::kCpu, cpu_host_environment("").arch);
}

TEST_CASE("templates: the worker times PyTorch's kernel on CUDA, for composite operators too",
          "[gpu]") {
  const std::string arch = env_or_empty("KFORGE_TEST_CUDA_ARCH").empty() ? "sm_90" : env_or_empty("KFORGE_TEST_CUDA_ARCH");
  measure_operators("cuda:0", Backend::kCuda, arch);
}

TEST_CASE("templates: CPU instances of every family pass the worker's verification", "[cpu]") {
  const Backend B = Backend::kCpu;
  const DType F = DType::kFloat32;
  const std::string arch = cpu_host_environment("").arch;
  auto on_host = [&](OpSignature s) {
    s.target.arch = arch;
    return s;
  };
  // Rows that no rows-per-block value divides, lengths that no lane count divides, rank 1 to 4.
  std::vector<std::pair<OpSignature, std::vector<Move>>> work;
  auto plan = [&](OpSignature s, size_t defaults, size_t samples) {
    s = on_host(std::move(s));
    std::vector<Move> m = instances(s, defaults, samples, 17);
    work.emplace_back(s, std::move(m));
  };
  for (bool log : {false, true}) {
    plan(softmax(B, F, {37, 1001}, log), 2, 5);
    plan(softmax(B, F, {2, 3, 77}, log, 2), 2, 2);
    plan(softmax(B, F, {2, 77, 3}, log, 1), 2, 2);         // not the last dimension (dim_softmax.cc)
    plan(softmax(B, F, {2, 8, 13, 11}, log, 1), 1, 2);
    plan(softmax(B, F, {1, 5}, log), 1, 1);
  }
  plan(layer_norm(B, F, {19, 769}), 2, 5);
  plan(layer_norm(B, F, {2, 3, 5, 33}, false, false), 2, 2);
  plan(layer_norm(B, F, {7, 64}, true, false), 1, 1);
  plan(layer_norm(B, F, {4097}, false, true), 1, 1);
  plan(with_strides(layer_norm(B, F, {2, 5, 3, 8}), 0, {360, 72, 8, 1}), 2, 2);      // QK-norm rows
  plan(with_strides(layer_norm(B, F, {2, 3, 5, 8}, true, false), 0, {120, 8, 24, 1}), 1, 1);   // heads first
  plan(group_norm(B, F, {3, 12, 5, 7}, 4), 2, 4);
  plan(group_norm(B, F, {2, 6, 9}, 3, false), 1, 1);
  plan(gelu(B, F, {5, 1001}), 1, 2);
  plan(gelu(B, F, {70001}, "tanh"), 1, 2);
  plan(silu(B, F, {3, 4099}), 1, 2);
  plan(add(B, F, {100003}, Arg::real(-0.75)), 1, 2);
  plan(add(B, F, {4, 129}), 1, 0);
  plan(relu(B, F, {7, 1031}), 1, 2);
  plan(unary("sigmoid", B, F, {3, 5003}), 1, 1);
  plan(unary("tanh", B, F, {70001}), 1, 1);
  plan(unary("hardswish", B, F, {2, 8, 13, 13}), 1, 1);
  plan(unary("neg", B, F, {7, 1001}), 1, 0);
  plan(unary("rsqrt", B, F, {3, 5, 1}), 1, 0);
  plan(unary("exp", B, F, {4099}), 1, 1);
  for (double e : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0, 1.7}) plan(pow_scalar(B, F, {5, 129}, Arg::real(e)), 1, 0);
  plan(pow_scalar(B, F, {3, 77}, Arg::integer(2)), 1, 0);
  plan(embedding(B, F, 1000, 129, {3, 17}), 1, 1);
  plan(embedding(B, F, 7, 4, {5}, DType::kInt32), 1, 0);
  plan(embedding(B, F, 9, 33, {}), 1, 0);
  plan(binary("add", B, F, {16, 3, 49, 49}, {1, 3, 49, 49}), 1, 1);
  plan(binary("sub", B, F, {7, 1001}, {1001}, Arg::real(-0.5)), 1, 1);
  plan(binary("mul", B, F, {3, 5, 257}, {3, 5, 1}), 1, 1);
  plan(binary("mul", B, F, {1, 9, 1}, {4, 9, 33}), 1, 1);
  plan(binary("div", B, F, {2, 6, 7, 7}, {1, 6, 1, 1}), 1, 1);
  plan(with_number("mul", B, F, {5, 1001}), 1, 1);
  plan(mul_scalar(B, F, {3, 1001}, Arg::real(0.125)), 1, 1);
  plan(mul_scalar(B, F, {77}, Arg::integer(-2)), 1, 0);
  plan(clamp_min(B, F, {3, 1001}, Arg::real(1e-6)), 1, 1);
  plan(in_place(clamp_min(B, F, {77}, Arg::integer(0))), 1, 0);
  plan(upsample_nearest(B, F, {2, 8, 13, 7}, {26, 14}, 2.0, 2.0), 1, 1);
  plan(upsample_nearest(B, F, {1, 3, 10, 11}, {7, 23}), 1, 1);
  plan(upsample_nearest(B, F, {2, 2, 8, 6}, {12, 9}, 1.5, 1.5), 1, 0);
  plan(max_pool(B, F, {2, 8, 28, 28}, {3, 3}, {2, 2}, {1, 1}), 1, 1);
  plan(max_pool(B, F, {1, 3, 11, 9}, {2}, {}, {0}, {1}, true), 1, 0);
  plan(max_pool(B, F, {1, 2, 10, 13}, {3, 2}, {1, 2}, {1, 1}, {2, 1}), 1, 0);
  plan(avg_pool(B, F, {2, 8, 28, 28}, {2, 2}, {2, 2}, {0, 0}), 1, 1);
  plan(avg_pool(B, F, {1, 3, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false), 1, 1);
  plan(avg_pool(B, F, {1, 2, 7, 10}, {3}, {}, {1}, false, true, 5), 1, 0);
  plan(adaptive_avg_pool(B, F, {2, 8, 14, 14}, {7, 7}), 1, 1);
  plan(adaptive_avg_pool(B, F, {1, 3, 10, 13}, {3, 4}), 1, 0);
  plan(upsample_bilinear(B, F, {2, 8, 13, 7}, {26, 14}, false, 2.0, 2.0), 1, 1);
  plan(upsample_bilinear(B, F, {1, 3, 10, 11}, {7, 23}, true), 1, 1);
  plan(upsample_bilinear(B, F, {2, 2, 8, 6}, {12, 9}, false), 1, 0);
  plan(channels_last(max_pool(B, F, {2, 16, 28, 28}, {3, 3}, {2, 2}, {1, 1})), 1, 1);
  plan(channels_last(avg_pool(B, F, {1, 5, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false)), 1, 0);
  plan(channels_last(adaptive_avg_pool(B, F, {2, 8, 14, 14}, {5, 3})), 1, 0);
  plan(channels_last(upsample_nearest(B, F, {2, 8, 7, 9}, {14, 18}, 2.0, 2.0)), 1, 0);
  plan(channels_last(upsample_bilinear(B, F, {1, 3, 5, 11}, {7, 4}, true)), 1, 1);
  plan(channels_last(unary("silu", B, F, {2, 24, 7, 9})), 1, 0);
  plan(channels_last(in_place(unary("relu", B, F, {2, 24, 7, 9}))), 1, 0);
  plan(channels_last(binary("add", B, F, {2, 24, 7, 9}, {2, 24, 7, 9})), 1, 0);
  plan(cumsum(B, F, {7, 1001}, -1), 1, 0);
  plan(cumsum(B, F, {2, 300, 33}, 1), 1, 1);
  plan(cat(B, F, {{2, 3, 33, 16}, {2, 3, 1, 16}}, -2), 1, 1);
  plan(cat(B, F, {{3, 5}, {3, 7}, {3, 1}}, 1), 1, 0);
  plan(cat(B, F, {{2, 5}, {4, 5}}, 0), 1, 0);
  plan(rotate_half_cat(B, F, 2, 3, 5, 8), 1, 1);
  plan(cropped_kv_cat(B, F, 2, 3, 6, 4), 1, 1);
  plan(with_element_strides(cat(B, F, {{3, 2, 5}, {3, 4, 5}}, 1), 0, {0, 5, 1}), 1, 0);   // expanded rows
  plan(clone(B, F, {2, 5, 3, 16}, {240, 16, 80, 1}, Arg::integer(0)), 1, 1);
  plan(clone(B, F, {4, 6}, {1, 4}, Arg::none()), 1, 0);
  plan(clone(B, F, {4, 5}, {8, 1}, Arg::integer(0)), 1, 0);              // a slice
  plan(clone(B, F, {3, 5}, {0, 1}, Arg::integer(0)), 1, 0);
  plan(clone(B, F, {2, 3, 4, 5, 6, 7}, {2520, 1, 3, 12, 60, 360}, Arg::integer(0)), 1, 0);   // reversed: 6 dims
  plan(clone(B, F, {9, 33}, {}, Arg::integer(1)), 1, 0);
  plan(with_number("add", B, F, {4099}, DType::kInt64), 1, 0);
  plan(with_number("sub", B, F, {3, 77}, DType::kFloat64, Arg::real(-2.0)), 1, 0);
  plan(with_number("div", B, F, {7, 33}), 1, 0);
  plan(batch_norm(B, F, {3, 12, 5, 7}), 1, 2);
  plan(channels_last(batch_norm(B, F, {3, 12, 5, 7})), 1, 1);
  plan(rope_mul(B, F), 1, 1);
  plan(with_strides(binary("add", B, F, {6, 7}, {6, 7}), 1, {10, 1}), 1, 0);
  plan(in_place(with_strides(binary("add", B, F, {3, 5, 4}, {5, 1}), 0, {5, 1, 15})), 1, 0);
  plan(with_strides(binary("sub", B, F, {9, 33}, {9, 33}), 1, {1, 9}), 1, 0);   // other transposed
  plan(batch_norm(B, F, {7, 33}, false), 1, 1);
  plan(reduce("mean", B, F, {3, 5, 257}, std::vector<int64_t>{-1}, true), 1, 2);
  plan(reduce("mean", B, F, {2, 12, 7, 9}, std::vector<int64_t>{-2, -1}), 1, 1);
  plan(reduce("sum", B, F, {9, 1001}, std::nullopt), 1, 1);
  plan(reduce("sum", B, F, {37, 130}, std::vector<int64_t>{1}, true), 1, 1);
  plan(reduce("amax", B, F, {33, 1003}, std::vector<int64_t>{-1}), 1, 2);
  plan(argmax(B, F, {33, 1003}, -1), 1, 2);
  plan(argmax(B, F, {5, 7, 9}, std::nullopt, true), 1, 1);
  // In place: the result is read through self (Note [Verifying in place] in worker/verifier.cc).
  plan(safe_softmax(B, F, {37, 1001}), 2, 2);
  plan(safe_softmax(B, F, {3, 5, 1}), 1, 0);
  plan(safe_softmax(B, F, {3, 77, 5}, 1), 1, 1);
  plan(to_copy(B, F, {3, 4099}, 15), 1, 1);
  plan(to_copy(B, DType::kBFloat16, {3, 4099}, 6), 1, 1);
  plan(to_copy(B, F, {7, 33}, 7), 1, 0);
  plan(to_copy(B, DType::kFloat64, {1001}, 6), 1, 0);
  plan(to_copy(B, DType::kFloat64, {77}, 15), 1, 0);
  plan(in_place(relu(B, F, {7, 1031})), 1, 1);
  plan(in_place(binary("add", B, F, {16, 3, 49, 49}, {1, 3, 49, 49})), 1, 1);
  plan(in_place(add(B, F, {4099}, Arg::real(-0.75))), 1, 0);
  plan(in_place(with_number("add", B, F, {77}, DType::kInt64)), 1, 0);
  plan(in_place(binary("mul", B, F, {3, 5, 257}, {3, 5, 1})), 1, 1);
  plan(in_place(with_number("mul", B, F, {5, 1001})), 1, 0);
  verify_all("cpu", work);
}

TEST_CASE("templates: CUDA instances of every family pass the worker's verification", "[gpu]") {
  const Backend B = Backend::kCuda;
  const std::string arch = env_or_empty("KFORGE_TEST_CUDA_ARCH").empty() ? "sm_90" : env_or_empty("KFORGE_TEST_CUDA_ARCH");
  std::vector<std::pair<OpSignature, std::vector<Move>>> work;
  auto plan = [&](OpSignature s, size_t defaults, size_t samples) {
    s.target.arch = arch;
    std::vector<Move> m = instances(s, defaults, samples, 23);
    work.emplace_back(s, std::move(m));
  };
  // Each value of each named knob of `family`, at its best configuration by prior.
  auto plan_knobs = [&](OpSignature s, const char* family, std::initializer_list<const char*> knobs) {
    s.target.arch = arch;
    const KernelTemplate& t = *find_template(family);
    std::map<std::pair<std::string, int64_t>, TemplateConfig> best;
    for (const TemplateConfig& c : enumerate_space(s, t)) {
      for (const char* k : knobs) {
        auto [it, fresh] = best.emplace(std::pair<std::string, int64_t>{k, knob(c, k)}, c);
        if (!fresh && t.prior(s, c.values) > t.prior(s, it->second.values)) it->second = c;
      }
    }
    REQUIRE(!best.empty());
    std::set<TemplateConfig> picked;
    for (const auto& [key, c] : best) picked.insert(c);
    std::vector<Move> moves;
    for (const TemplateConfig& c : picked) moves.push_back(*TemplateProposer::move_for(s, c));
    work.emplace_back(s, std::move(moves));
  };
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (bool log : {false, true}) {
      plan(softmax(B, d, {37, 1000}, log), 4, 3);
      plan(softmax(B, d, {3, 4099}, log), 2, 2);
      plan(softmax(B, d, {2, 3, 40}, log, 2), 2, 2);
      plan(softmax(B, d, {2, 1000, 7}, log, 1), 2, 1);
      // Note [Clustered columns]: every cluster size, access width and split, a last chunk short
      // of the others (301 rows), columns not a multiple of the tile.
      plan_knobs(softmax(B, d, {2, 301, 72}, log, 1), log ? "log_softmax_dim_cluster" : "softmax_dim_cluster",
                 {"cluster", "vec", "split"});
      plan(softmax(B, d, {4, 64, 9, 9}, log, 1), 1, 1);
      plan(softmax(B, d, {3, 300, 64}, log, 1), 2, 3);    // Note [Split columns]: vectors, split columns
      plan(softmax(B, d, {2, 4099, 24}, log, 1), 2, 2);   // long columns, a partial tile
      // Note [Cached columns]: the copy, with the widest and narrowest split and access, on long
      // columns with a partial tile, and a column merge over warps and over shared memory.
      for (OpSignature s : {softmax(B, d, {2, 4099, 24}, log, 1), softmax(B, d, {3, 1000, 64}, log, 1)}) {
        s.target.arch = arch;
        const KernelTemplate& t = *find_template(log ? "log_softmax_dim" : "softmax_dim");
        std::map<std::vector<int64_t>, TemplateConfig> best;
        for (const TemplateConfig& c : enumerate_space(s, t)) {
          if (knob(c, "cache") != 1) continue;
          const std::vector<int64_t> key = {knob(c, "split") >= 64 ? 64 : knob(c, "split") >= 8 ? 8 : 1, knob(c, "vec") == 1};
          auto [it, fresh] = best.emplace(key, c);
          if (!fresh && t.prior(s, c.values) > t.prior(s, it->second.values)) it->second = c;
        }
        std::vector<Move> moves;
        for (const auto& [key, c] : best) moves.push_back(*TemplateProposer::move_for(s, c));
        work.emplace_back(s, std::move(moves));
      }
      // Note [Split rows]: split 1 and more, cached and streamed, as a cluster and not (of 16
      // blocks too: Note [Non-portable clusters]), the widest and the narrowest access, on odd
      // rows, an input aligned only to its element, and a row in 64 chunks.
      for (OpSignature s : {softmax(B, d, {3, 4099}, log), softmax(B, d, {3, 4099}, log, -1, static_cast<uint32_t>(dtype_size_bytes(d))),
                            softmax(B, d, {2, 65537}, log)}) {
        s.target.arch = arch;
        const KernelTemplate& t = *find_template(log ? "log_softmax_split" : "softmax_split");
        std::map<std::vector<int64_t>, TemplateConfig> best;
        for (const TemplateConfig& c : enumerate_space(s, t)) {
          const int64_t vec = knob(c, "vec");
          if (vec != 1 && vec * dtype_size_bytes(d) != 16) continue;
          const int64_t split = knob(c, "split"), cluster = knob(c, "cluster");
          const int64_t kind = split == 1 ? 1 : split == 64 ? 64 : split == 16 && cluster == 1 ? 16 : 2;
          const std::vector<int64_t> key = {kind, knob(c, "cache"), vec, cluster};
          auto [it, fresh] = best.emplace(key, c);
          if (!fresh && t.prior(s, c.values) > t.prior(s, it->second.values)) it->second = c;
        }
        std::vector<Move> moves;
        for (const auto& [key, c] : best) moves.push_back(*TemplateProposer::move_for(s, c));
        work.emplace_back(s, std::move(moves));
      }
    }
    for (const OpSignature& s : {softmax(B, d, {37, 40}, false), layer_norm(B, d, {37, 72}, true, false)}) {
      OpSignature t = s;
      t.target.arch = arch;
      work.emplace_back(t, partial_blocks(t));
    }
    plan(layer_norm(B, d, {37, 768}), 4, 3);
    plan(layer_norm(B, d, {2, 3, 4097}, false, false), 2, 2);
    plan(layer_norm(B, d, {33, 40}, true, false), 2, 2);
    plan(with_strides(layer_norm(B, d, {2, 5, 3, 8}), 0, {360, 72, 8, 1}), 2, 2);   // QK-norm rows
    plan(with_strides(layer_norm(B, d, {2, 3, 5, 8}, true, false), 0, {120, 8, 24, 1}), 1, 1);
    plan(with_strides(layer_norm(B, d, {4, 6, 8}), 0, {120, 20, 1}), 1, 1);          // rows 20 apart
    plan(group_norm(B, d, {3, 32, 7, 7}, 8), 2, 2);
    plan(group_norm(B, d, {2, 6, 16}, 3, false), 1, 1);
    // Note [Cached group rows]: the row in shared memory and not, every access width and unroll,
    // rows of several channels with a tail of vectors that is not a whole round of the block.
    plan_knobs(group_norm(B, d, {2, 24, 24, 28}, 8), "group_norm", {"cache", "unroll", "vec", "block"});
    // Rows over clusters of 2 to 8 blocks, chunks that end inside a channel, a short last chunk.
    plan_knobs(group_norm(B, d, {2, 40, 36, 36}, 4), "group_norm", {"split", "vec"});
    plan_knobs(group_norm(B, d, {1, 6, 40, 52}, 2, false), "group_norm", {"split"});
    plan(gelu(B, d, {5, 1001}), 2, 2);
    plan(gelu(B, d, {70001}, "tanh"), 2, 2);
    plan(silu(B, d, {3, 4099}), 2, 2);
    plan(add(B, d, {100003}, Arg::real(-0.75)), 2, 2);
    plan(relu(B, d, {3, 4099}), 2, 2);
    for (const char* op : {"sigmoid", "tanh", "hardswish", "neg", "rsqrt", "exp"}) plan(unary(op, B, d, {3, 4099}), 2, 1);
    for (double e : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0, 1.7}) plan(pow_scalar(B, d, {37, 129}, Arg::real(e)), 1, 0);
    plan(embedding(B, d, 32000, 2048, {4, 33}), 2, 2);
    plan(embedding(B, d, 1000, 6, {129}, DType::kInt32), 1, 1);
    plan(embedding(B, d, 9, 40, {}), 1, 0);
    plan(mul_scalar(B, d, {37, 1001}, Arg::real(0.125)), 2, 1);
    plan(clamp_min(B, d, {37, 1001}, Arg::real(1e-6)), 2, 1);
    plan(in_place(clamp_min(B, d, {2, 3, 1001}, Arg::real(-0.5))), 1, 1);
    plan(upsample_nearest(B, d, {2, 64, 16, 16}, {32, 32}, 2.0, 2.0), 2, 1);
    plan(upsample_nearest(B, d, {1, 3, 10, 11}, {7, 23}), 1, 1);
    plan(max_pool(B, d, {2, 64, 56, 56}, {3, 3}, {2, 2}, {1, 1}), 2, 1);
    plan(max_pool(B, d, {1, 3, 11, 9}, {2}, {}, {0}, {1}, true), 1, 1);
    plan(avg_pool(B, d, {2, 64, 28, 28}, {2, 2}, {2, 2}, {0, 0}), 2, 1);
    plan(avg_pool(B, d, {1, 3, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false), 1, 1);
    plan(avg_pool(B, d, {1, 2, 7, 10}, {3}, {}, {1}, false, true, 5), 1, 0);
    plan(adaptive_avg_pool(B, d, {2, 64, 14, 14}, {7, 7}), 1, 1);
    plan(adaptive_avg_pool(B, d, {1, 3, 10, 13}, {3, 4}), 1, 0);
    plan(upsample_bilinear(B, d, {2, 64, 16, 16}, {32, 32}, false, 2.0, 2.0), 2, 1);
    plan(upsample_bilinear(B, d, {1, 3, 10, 11}, {7, 23}, true), 1, 1);
    plan(upsample_bilinear(B, d, {2, 2, 8, 6}, {12, 9}, false), 1, 0);
    plan(channels_last(max_pool(B, d, {2, 64, 28, 28}, {3, 3}, {2, 2}, {1, 1})), 1, 1);
    plan(channels_last(avg_pool(B, d, {1, 5, 11, 9}, {3, 2}, {2, 1}, {1, 1}, true, false)), 1, 0);
    plan(channels_last(adaptive_avg_pool(B, d, {2, 64, 14, 14}, {5, 3})), 1, 0);
    plan(channels_last(upsample_nearest(B, d, {2, 8, 7, 9}, {14, 18}, 2.0, 2.0)), 1, 0);
    plan(channels_last(upsample_bilinear(B, d, {2, 32, 16, 16}, {32, 32}, false, 2.0, 2.0)), 1, 1);
    plan(channels_last(unary("silu", B, d, {2, 24, 7, 9})), 1, 0);
    plan(channels_last(in_place(unary("relu", B, d, {2, 24, 7, 9}))), 1, 0);
    plan(channels_last(binary("add", B, d, {2, 24, 7, 9}, {2, 24, 7, 9})), 1, 0);
    if (d != DType::kFloat16 || B == Backend::kCpu) {   // Note [float16 cumsum on CUDA] in scan.cc
      plan(cumsum(B, d, {7, 1001}, -1), 1, 1);
      plan(cumsum(B, d, {2, 300, 33}, 1), 1, 1);
      if (B == Backend::kCuda) {
        // Note [Clustered scan]: every cluster size, split and width; chunks that do not divide
        // len (301 rows), a partial tile (72 columns).
        plan_knobs(cumsum(B, d, {2, 301, 72}, 1), "cumsum_cluster", {"cluster", "split", "vec"});
      }
      // Note [Split scan]: each split and each vector width at its best block, with and without
      // the copy, on columns of odd and even counts, a partial tile, segments that do not divide len.
      for (OpSignature s : {cumsum(B, d, {2, 1001, 64}, 1), cumsum(B, d, {3, 77, 5, 24}, 1), cumsum(B, d, {2, 100, 33}, 1)}) {
        s.target.arch = arch;
        const KernelTemplate& t = *find_template("cumsum_split");
        std::map<std::pair<std::string, int64_t>, TemplateConfig> best;
        for (const TemplateConfig& c : enumerate_space(s, t)) {
          for (const char* k : {"split", "vec"}) {
            auto [it, fresh] = best.emplace(std::pair<std::string, int64_t>{k, knob(c, k)}, c);
            if (!fresh && t.prior(s, c.values) > t.prior(s, it->second.values)) it->second = c;
          }
          // The copy (Note [Cached columns]) with segments merged within a warp only, over warps,
          // and over shared memory.
          if (knob(c, "cache") == 1) {
            const int64_t split = knob(c, "split"), cls = split >= 64 ? 64 : split >= 8 ? 8 : 2;
            auto [it, fresh] = best.emplace(std::pair<std::string, int64_t>{"cached split", cls}, c);
            if (!fresh && t.prior(s, c.values) > t.prior(s, it->second.values)) it->second = c;
          }
        }
        std::set<TemplateConfig> picked;
        for (const auto& [key, c] : best) picked.insert(c);
        std::vector<Move> moves;
        for (const TemplateConfig& c : picked) moves.push_back(*TemplateProposer::move_for(s, c));
        work.emplace_back(s, std::move(moves));
      }
    }
    plan(cat(B, d, {{4, 6, 129, 64}, {4, 6, 1, 64}}, 2), 2, 2);
    plan(cat(B, d, {{2, 24, 9, 9}, {2, 40, 9, 9}}, 1), 2, 1);
    plan(cat(B, d, {{3, 5}, {3, 7}, {3, 1}}, -1), 1, 1);
    plan(clone(B, d, {2, 33, 12, 64}, {25344, 64, 2112, 1}, Arg::integer(0)), 2, 2);
    plan(clone(B, d, {4, 6}, {1, 4}, Arg::none()), 1, 0);
    plan(clone(B, d, {5, 40}, {64, 1}, Arg::integer(0)), 1, 1);
    plan(clone(B, d, {2, 3, 4, 5, 6, 7}, {2520, 1, 3, 12, 60, 360}, Arg::integer(0)), 1, 0);
    // Note [Outputs per thread] and masked edges (padded and dilated windows); Note [Transposing
    // clone] (a channels-last image with odd sizes, transposed matrices with partial tiles).
    plan_knobs(max_pool(B, d, {2, 16, 32, 32}, {3, 3}, {2, 2}, {1, 1}), "max_pool2d", {"ov", "edges", "span"});
    plan_knobs(max_pool(B, d, {1, 2, 10, 14}, {3, 2}, {1, 2}, {1, 1}, {2, 1}), "max_pool2d", {"ov", "edges"});
    // Note [Window spans]: stride 1 with a 5-wide window padded by 2 (a vector wholly outside the
    // row at both edges), and a dilated one (spans for float32 only: the halves' 36 outputs a row
    // are no multiple of the 8 a stride-1 span needs).
    plan_knobs(max_pool(B, d, {1, 3, 16, 40}, {5, 5}, {1, 1}, {2, 2}), "max_pool2d", {"span", "ov"});
    plan_knobs(max_pool(B, d, {1, 2, 12, 40}, {5, 5}, {1, 1}, {2, 2}, {2, 2}), "max_pool2d", {"span", "ov"});
    plan_knobs(avg_pool(B, d, {2, 16, 32, 32}, {3, 3}, {2, 2}, {1, 1}, false, false), "avg_pool2d", {"ov"});
    plan_knobs(clone(B, d, {2, 24, 5, 7}, {840, 1, 168, 24}, Arg::integer(0)), "clone", {"vec", "tile", "block"});
    plan_knobs(clone(B, d, {3, 64, 96}, {6144, 1, 64}, Arg::integer(0)), "clone", {"vec", "tile"});
    plan_knobs(clone(B, d, {2, 40, 70}, {2800, 1, 40}, Arg::integer(0)), "clone", {"vec", "tile"});
    if (d != DType::kBFloat16) {
      plan(cudnn_batch_norm(d, {4, 24, 9, 9}), 2, 2);
      plan(channels_last(cudnn_batch_norm(d, {4, 24, 9, 9})), 1, 1);
      plan(cudnn_batch_norm(d, {37, 40}), 1, 1);
    }
    plan(binary("add", B, d, {64, 3, 49, 49}, {1, 3, 49, 49}), 2, 2);
    plan(binary("sub", B, d, {37, 1001}, {1001}, Arg::real(-0.5)), 2, 1);
    plan(binary("mul", B, d, {5, 7, 256}, {5, 7, 1}), 2, 2);
    plan(binary("mul", B, d, {1, 9, 1}, {4, 9, 40}), 2, 1);
    plan(binary("div", B, d, {4, 24, 9, 9}, {1, 24, 1, 1}), 2, 1);
    plan(with_number("mul", B, d, {3, 4099}), 2, 1);
    plan(with_number("add", B, d, {37, 1001}, DType::kInt64), 1, 1);
    plan(with_number("sub", B, d, {5, 77}, DType::kFloat64, Arg::real(0.5)), 1, 0);
    plan(with_number("div", B, d, {7, 1003}), 1, 1);
    plan(batch_norm(B, d, {4, 24, 9, 9}), 2, 2);
    plan(channels_last(batch_norm(B, d, {4, 24, 9, 9})), 1, 1);
    plan(rope_mul(B, d), 1, 1);
    plan(with_strides(binary("add", B, d, {6, 7}, {6, 7}), 1, {10, 1}), 1, 0);
    plan(in_place(with_strides(binary("add", B, d, {3, 5, 4}, {5, 1}), 0, {5, 1, 15})), 1, 0);
    plan(with_strides(binary("sub", B, d, {9, 33}, {9, 33}), 1, {1, 9}), 1, 0);
    plan(batch_norm(B, d, {37, 40}, false), 1, 1);
    if (d != DType::kFloat32) plan(batch_norm(B, d, {2, 8, 33}, true, DType::kFloat32), 1, 1);
    plan(reduce("mean", B, d, {37, 4096}, std::vector<int64_t>{-1}, true), 2, 2);
    plan(reduce("mean", B, d, {8, 64, 7, 7}, std::vector<int64_t>{-1, -2}), 2, 1);
    // Note [Staged rows]: a partial last block, every access width and block, rows at every
    // alignment, amax's NaNs and sum.
    plan_knobs(reduce("mean", B, d, {3, 100, 7, 7}, std::vector<int64_t>{-1, -2}), "mean", {"map", "vec", "block"});
    plan_knobs(reduce("amax", B, d, {70, 33}, std::vector<int64_t>{-1}), "amax", {"map", "vec"});
    plan_knobs(reduce("sum", B, d, {5, 9, 3}, std::vector<int64_t>{-1, -2}, true), "sum", {"map"});
    plan(reduce("sum", B, d, {3, 50257}, std::nullopt), 1, 1);
    plan(reduce("amax", B, d, {37, 1003}, std::vector<int64_t>{1}, true), 2, 2);
    plan(argmax(B, d, {37, 1003}, 1, true), 2, 2);
    plan(argmax(B, d, {2, 50257}, -1), 2, 1);
    plan(argmax(B, d, {3, 5, 77}, std::nullopt), 1, 1);
    plan(safe_softmax(B, d, {37, 1000}), 2, 2);
    plan(safe_softmax(B, d, {2, 77, 33}, -2), 1, 1);
    for (int64_t code : {6, 5, 15}) plan(to_copy(B, d, {37, 4099}, code), 2, 1);
    plan(safe_softmax(B, d, {2, 8, 33, 4099}), 2, 1);
    plan(in_place(relu(B, d, {2, 64, 28, 28})), 2, 1);
    plan(in_place(binary("add", B, d, {8, 64, 28, 28}, {8, 64, 28, 28})), 2, 1);   // resnet's residual
    plan(in_place(binary("add", B, d, {64, 3, 49, 49}, {1, 3, 49, 49})), 1, 1);
    plan(in_place(with_number("add", B, d, {37, 1001}, DType::kInt64)), 1, 0);
    plan(in_place(binary("mul", B, d, {5, 7, 256}, {5, 7, 1})), 2, 1);
    plan(in_place(with_number("mul", B, d, {3, 4099})), 1, 0);
  }
  verify_all("cuda:0", work);
}

// ---- timing (manual) ------------------------------------------------------------------------------------

namespace {

// The root's defaults for each signature, verified and timed against PyTorch's kernel by the worker,
// one line each. Not a test of speed (nothing is asserted about it): a look at where the priors put
// the search's first moves, for whoever tunes them.
void time_defaults(const std::string& device, const std::vector<OpSignature>& sigs, size_t defaults) {
  TempDir t("kforge-template-timing");
  eval::WorkerProcess w(worker_options(device, t));
  uint64_t id = 1;
  for (const OpSignature& s : sigs) {
    for (const Move& m : instances(s, defaults, 0, 0)) {
      eval::EvalJob j;
      j.job_id = id++;
      j.signature = s;
      j.spec = m.spec;
      j.policy.seed = 42;
      const eval::EvalResult r = w.evaluate(j);
      INFO(name_of(s) << " | " << m.label << " | " << eval::eval_status_name(r.status) << " " << r.message << " "
                      << r.verify.failed_check << " " << r.verify.detail);
      CHECK(r.status == eval::EvalStatus::kMeasured);
      char line[512];
      std::snprintf(line, sizeof line, "%-62s %-58s prior %.2f  torch %9.1f us  template %9.1f us  speedup %.2f%s",
                    name_of(s).c_str(), m.label.c_str(), m.prior, r.timing.baseline_median_ns / 1e3,
                    r.timing.candidate_median_ns / 1e3, r.timing.speedup, r.timing.significant ? "" : " (noise)");
      WARN(line);
    }
  }
}

}  // namespace

TEST_CASE("templates: timing of the root's defaults on CUDA (manual)", "[.timing-gpu]") {
  const Backend B = Backend::kCuda;
  const DType F = DType::kFloat32, H = DType::kFloat16, BF = DType::kBFloat16;
  time_defaults("cuda:0",
                {softmax(B, F, {8192, 4096}), softmax(B, H, {8192, 4096}), softmax(B, BF, {32, 12, 128, 128}),
                 softmax(B, F, {64, 50257}), softmax(B, H, {64, 50257}, true), layer_norm(B, BF, {8192, 4096}),
                 layer_norm(B, F, {16384, 768}), layer_norm(B, H, {4, 1024, 1280}), group_norm(B, H, {8, 512, 32, 32}, 32),
                 gelu(B, BF, {8192, 16384}), gelu(B, F, {4096, 3072}, "tanh"), silu(B, H, {8192, 11008}),
                 add(B, BF, {8192, 4096}), add(B, F, {1 << 24}), relu(B, H, {8192, 11008})},
                4);
}

TEST_CASE("templates: timing of the root's defaults on the CPU (manual)", "[.timing-cpu]") {
  const Backend B = Backend::kCpu;
  const DType F = DType::kFloat32;
  const std::string arch = cpu_host_environment("").arch;
  std::vector<OpSignature> sigs = {softmax(B, F, {512, 1024}),  layer_norm(B, F, {1024, 768}),
                                   group_norm(B, F, {2, 64, 32, 32}, 32), gelu(B, F, {1 << 20}),
                                   silu(B, F, {1 << 20}),       add(B, F, {1 << 20}),
                                   relu(B, F, {1 << 20})};
  for (OpSignature& s : sigs) s.target.arch = arch;
  time_defaults("cpu", sigs, 2);
}

TEST_CASE("templates: pow's exponent is the tensor dtype's, as PyTorch's CUDA kernel converts it", "[templates]") {
  // Scalar::to<scalar_t>: 1.7 is 1.7001953 in float16 and 1.703125 in bfloat16; the H100 showed a
  // float16 result 6.55e+04 where PyTorch's, with the rounded exponent, was inf.
  const std::pair<DType, std::string> cases[] = {{DType::kFloat32, "-DKF_POW_EXP=1.700000048e+00f"},
                                                  {DType::kFloat16, "-DKF_POW_EXP=1.700195312e+00f"},
                                                  {DType::kBFloat16, "-DKF_POW_EXP=1.703125000e+00f"}};
  for (const auto& [dtype, want] : cases) {
    const OpSignature s = pow_scalar(Backend::kCuda, dtype, {64}, Arg::real(1.7));
    const std::vector<TemplateConfig> space = enumerate_space(s);
    REQUIRE(!space.empty());
    const KernelSpec k = find_template(space[0].family)->instantiate(s, space[0].values);
    INFO(dtype_name(dtype));
    CHECK(std::find(k.compile_options.begin(), k.compile_options.end(), want) != k.compile_options.end());
  }
}

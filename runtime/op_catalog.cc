#include "runtime/op_catalog.h"

#include <algorithm>
#include <array>

namespace kforge::catalog {

namespace {

using R = ArgRole;

// Note [Operator semantics]
// What the worker checks a candidate against is PyTorch's own kernel on the same device, so these
// texts say what that kernel returns, read off torch 2.11 on CPU and on an H200 (CUDA 13), not
// what the documentation promises: _softmax's output is contiguous even for a strided input;
// native_layer_norm's mean and rstd are float32 for float16/bfloat16 input on CUDA but keep the
// input's dtype on CPU; native_group_norm's keep the input's dtype on both; the pointwise
// operators follow TensorIterator's layout rule; relu keeps NaN and -0.0 (it is x < 0 ? 0 : x),
// hardswish keeps NaN. A wrong sentence here costs failed "output_layout" checks, so change them
// only against a torch run.
//
// Note [Op cost model]
// FLOPs per element of the op's largest tensor argument, counting exp/erf/rsqrt as one operation
// each (the roofline here is about memory, and every catalog op is far below the FLOP ceiling):
//   add.Tensor           2 (multiply by alpha, add)
//   silu                 4 (negate, exp, add, divide)
//   gelu                 8 (erf form: scale, erf, add, two multiplies; tanh form about the same)
//   _softmax, _log_softmax, _safe_softmax   5 (max, subtract, exp, sum, divide or log)
//   native_layer_norm    8 (mean, centre, square, sum, rsqrt, scale, weight, bias)
//   native_group_norm    8
//   relu                 1 (compare and select)
//   sigmoid              3 (negate, exp, add and divide as one)
//   tanh                 1
//   hardswish            5 (add, two clamps, two multiplies)
//   sub.Tensor           2, mul.Tensor 1, div.Tensor 1
//   native_batch_norm    4 (subtract the mean, scale by invstd, weight, bias)
//   sum, mean, amax      1 (an add or a compare per element)
//   neg, rsqrt, exp      1
//   mul.Scalar           1
//   pow.Tensor_Scalar    2 (x * x for 2, a pow call otherwise: counted as 2)
//   cudnn_batch_norm     4, as native_batch_norm
//   cat, clone, _to_copy 1 (a copy: counted as one operation per element)
//   relu_, add_, mul_    as relu, add, mul; self is read once and written once (its bytes count
//                        as an input and as the output)
//   avg_pool2d, _adaptive_avg_pool2d   1 (an add per element read; windows may overlap)
//   upsample_bilinear2d  8 (weights and three lerps per output element, counted per input element)
//   embedding            1 per index (a copy: an address computation per row); bytes: indices, and
//                        the rows gathered (as many as the output) read, not the whole table
//                        (ArgDecl::gathered, which also leaves the table out of "largest")
// Bytes: every tensor argument's elements read once and every output's written once.

constexpr std::string_view kOneOut = "out";

// ---- _softmax, _log_softmax ----------------------------------------------------------------------

constexpr std::array<ArgDecl, 3> kSoftmaxArgs = {{
    {"self", R::kData},
    {"dim", R::kDim},
    {"half_to_float", R::kResultType},
}};
constexpr std::array<OutputDecl, 1> kOneLikeInput = {{{kOneOut, OutputRule::kLikeInput0}}};
// The last dimension (row_softmax.cc; split_softmax.cc for long rows), any other (dim_softmax.cc).
constexpr std::array<std::string_view, 6> kSoftmaxFamilies = {"softmax",     "softmax_split",  "softmax_dim", "softmax_dim_cluster",
                                                              "cpu.softmax", "cpu.softmax_dim"};
constexpr std::array<std::string_view, 6> kLogSoftmaxFamilies = {"log_softmax", "log_softmax_split", "log_softmax_dim",
                                                                 "log_softmax_dim_cluster", "cpu.log_softmax",
                                                                 "cpu.log_softmax_dim"};
constexpr std::array<ArgDecl, 3> kSafeSoftmaxArgs = {{
    {"self", R::kData},
    {"dim", R::kDim},
    {"dtype", R::kResultType},
}};
constexpr std::array<std::string_view, 6> kSafeSoftmaxFamilies = {"safe_softmax", "safe_softmax_split", "safe_softmax_dim",
                                                                  "safe_softmax_dim_cluster", "cpu.safe_softmax",
                                                                  "cpu.safe_softmax_dim"};

// ---- _to_copy ------------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 7> kToCopyArgs = {{
    {"self", R::kData},
    {"dtype", R::kResultType},
    {"layout", R::kMode},
    {"device", R::kMode},
    {"pin_memory", R::kUnused},
    {"non_blocking", R::kUnused},
    {"memory_format", R::kMode},
}};
constexpr std::array<OutputDecl, 1> kConvertedOut = {{{kOneOut, OutputRule::kConverted}}};
constexpr std::array<std::string_view, 2> kToCopyFamilies = {"to_copy", "cpu.to_copy"};

// ---- native_layer_norm ---------------------------------------------------------------------------

constexpr std::array<ArgDecl, 5> kLayerNormArgs = {{
    {"input", R::kData},
    {"normalized_shape", R::kShape},
    {"weight", R::kParameter},
    {"bias", R::kParameter},
    {"eps", R::kEpsilon},
}};
constexpr std::array<OutputDecl, 3> kLayerNormOutputs = {{
    {"out", OutputRule::kLikeInput0},
    {"mean", OutputRule::kNormRowStats},
    {"rstd", OutputRule::kNormRowStats},
}};
constexpr std::array<std::string_view, 2> kLayerNormFamilies = {"layer_norm", "cpu.layer_norm"};

// ---- native_group_norm ---------------------------------------------------------------------------

constexpr std::array<ArgDecl, 8> kGroupNormArgs = {{
    {"input", R::kData},
    {"weight", R::kParameter},
    {"bias", R::kParameter},
    {"N", R::kCount},
    {"C", R::kCount},
    {"HxW", R::kCount},
    {"group", R::kCount},
    {"eps", R::kEpsilon},
}};
constexpr std::array<OutputDecl, 3> kGroupNormOutputs = {{
    {"out", OutputRule::kLikeInput0},
    {"mean", OutputRule::kGroupStats},
    {"rstd", OutputRule::kGroupStats},
}};
constexpr std::array<std::string_view, 2> kGroupNormFamilies = {"group_norm", "cpu.group_norm"};

// ---- native_batch_norm ---------------------------------------------------------------------------

constexpr std::array<ArgDecl, 8> kBatchNormArgs = {{
    {"input", R::kData},
    {"weight", R::kParameter},
    {"bias", R::kParameter},
    {"running_mean", R::kParameter},
    {"running_var", R::kParameter, InputRange::kPositive},
    {"training", R::kMode},
    {"momentum", R::kScalar},
    {"eps", R::kEpsilon},
}};
constexpr std::array<OutputDecl, 3> kBatchNormOutputs = {{
    {"out", OutputRule::kLikeInput0},
    {"save_mean", OutputRule::kBatchNormSaved},
    {"save_invstd", OutputRule::kBatchNormSaved},
}};
constexpr std::array<std::string_view, 2> kBatchNormFamilies = {"batch_norm", "cpu.batch_norm"};

// ---- reductions ----------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 4> kSumMeanArgs = {{
    {"self", R::kData},
    {"dim", R::kDim},
    {"keepdim", R::kMode},
    {"dtype", R::kResultType},
}};
constexpr std::array<ArgDecl, 3> kAmaxArgs = {{{"self", R::kData}, {"dim", R::kDim}, {"keepdim", R::kMode}}};
constexpr std::array<OutputDecl, 1> kOneReduced = {{{kOneOut, OutputRule::kReduced}}};
constexpr std::array<std::string_view, 2> kSumFamilies = {"sum", "cpu.sum"};
constexpr std::array<std::string_view, 2> kMeanFamilies = {"mean", "cpu.mean"};
constexpr std::array<std::string_view, 2> kAmaxFamilies = {"amax", "cpu.amax"};
constexpr std::array<OutputDecl, 1> kOneIndexReduced = {{{kOneOut, OutputRule::kIndexReduced}}};
constexpr std::array<std::string_view, 2> kArgmaxFamilies = {"argmax", "cpu.argmax"};

#define KFORGE_REDUCED_OUTPUT                                                                                 \
  "Output 0: self's sizes without the reduced dimensions, or with each of them as 1 when keepdim (argument " \
  "2) is true (self [4, 6, 5] over [-1] gives [4, 6], keepdim [4, 6, 1]; over every dimension without "       \
  "keepdim a 0-dimensional tensor); contiguous strides."

// ---- pointwise -----------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 2> kGeluArgs = {{{"self", R::kData}, {"approximate", R::kMode}}};
constexpr std::array<std::string_view, 2> kGeluFamilies = {"gelu", "cpu.gelu"};
constexpr std::array<ArgDecl, 1> kSiluArgs = {{{"self", R::kData}}};
constexpr std::array<std::string_view, 2> kSiluFamilies = {"silu", "cpu.silu"};
constexpr std::array<ArgDecl, 3> kAddArgs = {{{"self", R::kData}, {"other", R::kData}, {"alpha", R::kScalar}}};
constexpr std::array<OutputDecl, 1> kOneBroadcast = {{{kOneOut, OutputRule::kBroadcast}}};
constexpr std::array<std::string_view, 2> kAddFamilies = {"add", "cpu.add"};
constexpr std::array<ArgDecl, 1> kReluArgs = {{{"self", R::kData}}};
constexpr std::array<std::string_view, 2> kReluFamilies = {"relu", "cpu.relu"};
constexpr std::array<ArgDecl, 1> kUnaryArgs = {{{"self", R::kData}}};
constexpr std::array<std::string_view, 2> kSigmoidFamilies = {"sigmoid", "cpu.sigmoid"};
constexpr std::array<std::string_view, 2> kTanhFamilies = {"tanh", "cpu.tanh"};
constexpr std::array<std::string_view, 2> kHardswishFamilies = {"hardswish", "cpu.hardswish"};
constexpr std::array<ArgDecl, 2> kBinaryArgs = {{{"self", R::kData}, {"other", R::kData}}};
constexpr std::array<std::string_view, 2> kSubFamilies = {"sub", "cpu.sub"};
constexpr std::array<std::string_view, 2> kMulFamilies = {"mul", "cpu.mul"};
constexpr std::array<std::string_view, 2> kDivFamilies = {"div", "cpu.div"};
constexpr std::array<std::string_view, 2> kNegFamilies = {"neg", "cpu.neg"};
constexpr std::array<std::string_view, 2> kRsqrtFamilies = {"rsqrt", "cpu.rsqrt"};
constexpr std::array<std::string_view, 2> kExpFamilies = {"exp", "cpu.exp"};
constexpr std::array<ArgDecl, 2> kPowScalarArgs = {{{"self", R::kData}, {"exponent", R::kScalar}}};
constexpr std::array<std::string_view, 2> kPowFamilies = {"pow", "cpu.pow"};
constexpr std::array<ArgDecl, 2> kMulScalarArgs = {{{"self", R::kData}, {"other", R::kScalar}}};
constexpr std::array<std::string_view, 2> kMulScalarFamilies = {"mul_scalar", "cpu.mul_scalar"};
constexpr std::array<ArgDecl, 2> kClampMinArgs = {{{"self", R::kData}, {"min", R::kScalar}}};
constexpr std::array<std::string_view, 2> kClampMinFamilies = {"clamp_min", "cpu.clamp_min"};
constexpr std::array<std::string_view, 2> kClampMinInplaceFamilies = {"clamp_min_", "cpu.clamp_min_"};

// ---- cudnn_batch_norm ----------------------------------------------------------------------------

constexpr std::array<ArgDecl, 8> kCudnnBatchNormArgs = {{
    {"input", R::kData},
    {"weight", R::kParameter},
    {"bias", R::kParameter},
    {"running_mean", R::kParameter},
    {"running_var", R::kParameter, InputRange::kPositive},
    {"training", R::kMode},
    {"exponential_average_factor", R::kScalar},
    {"epsilon", R::kEpsilon},
}};
constexpr std::array<OutputDecl, 4> kCudnnBatchNormOutputs = {{
    {"out", OutputRule::kLikeInput0},
    {"save_mean", OutputRule::kCudnnSaved},
    {"save_var", OutputRule::kCudnnSaved},
    {"reserve", OutputRule::kCudnnReserve},
}};
constexpr std::array<std::string_view, 1> kCudnnBatchNormFamilies = {"cudnn_batch_norm"};

// ---- cat -----------------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 4> kUpsampleNearestArgs = {{
    {"self", R::kData},
    {"output_size", R::kShape},
    {"scales_h", R::kScalar},
    {"scales_w", R::kScalar},
}};
constexpr std::array<OutputDecl, 1> kOneResized2d = {{{kOneOut, OutputRule::kResized2d}}};
constexpr std::array<std::string_view, 2> kUpsampleNearestFamilies = {"upsample_nearest2d", "cpu.upsample_nearest2d"};
constexpr std::array<ArgDecl, 6> kMaxPoolArgs = {{
    {"self", R::kData},
    {"kernel_size", R::kShape},
    {"stride", R::kShape},
    {"padding", R::kShape},
    {"dilation", R::kShape},
    {"ceil_mode", R::kMode},
}};
constexpr std::array<OutputDecl, 2> kMaxPoolOutputs = {{
    {"out", OutputRule::kPooled2d},
    {"indices", OutputRule::kPooled2dIndices},
}};
constexpr std::array<std::string_view, 2> kMaxPoolFamilies = {"max_pool2d", "cpu.max_pool2d"};
constexpr std::array<ArgDecl, 7> kAvgPoolArgs = {{
    {"self", R::kData},
    {"kernel_size", R::kShape},
    {"stride", R::kShape},
    {"padding", R::kShape},
    {"ceil_mode", R::kMode},
    {"count_include_pad", R::kMode},
    {"divisor_override", R::kScalar},
}};
constexpr std::array<OutputDecl, 1> kOnePooled2d = {{{kOneOut, OutputRule::kPooled2d}}};
constexpr std::array<std::string_view, 2> kAvgPoolFamilies = {"avg_pool2d", "cpu.avg_pool2d"};
constexpr std::array<ArgDecl, 2> kAdaptiveAvgPoolArgs = {{{"self", R::kData}, {"output_size", R::kShape}}};
constexpr std::array<std::string_view, 2> kAdaptiveAvgPoolFamilies = {"adaptive_avg_pool2d", "cpu.adaptive_avg_pool2d"};
constexpr std::array<ArgDecl, 5> kUpsampleBilinearArgs = {{
    {"self", R::kData},
    {"output_size", R::kShape},
    {"align_corners", R::kMode},
    {"scales_h", R::kScalar},
    {"scales_w", R::kScalar},
}};
constexpr std::array<std::string_view, 2> kUpsampleBilinearFamilies = {"upsample_bilinear2d", "cpu.upsample_bilinear2d"};
constexpr std::array<ArgDecl, 3> kCumsumArgs = {{{"self", R::kData}, {"dim", R::kDim}, {"dtype", R::kResultType}}};
constexpr std::array<std::string_view, 4> kCumsumFamilies = {"cumsum", "cumsum_split", "cumsum_cluster", "cpu.cumsum"};
constexpr std::array<ArgDecl, 2> kCatArgs = {{{"tensors", R::kData}, {"dim", R::kDim}}};
constexpr std::array<OutputDecl, 1> kCatOutputs = {{{kOneOut, OutputRule::kConcat}}};
constexpr std::array<std::string_view, 2> kCatFamilies = {"cat", "cpu.cat"};

// ---- clone ---------------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 2> kCloneArgs = {{{"self", R::kData}, {"memory_format", R::kMode}}};
constexpr std::array<std::string_view, 2> kCloneFamilies = {"clone", "cpu.clone"};

// ---- in-place variants ---------------------------------------------------------------------------

constexpr std::array<OutputDecl, 1> kSelfOut = {{{"self", OutputRule::kSelf}}};
constexpr std::array<std::string_view, 2> kReluInplaceFamilies = {"relu_", "cpu.relu_"};
constexpr std::array<std::string_view, 2> kAddInplaceFamilies = {"add_", "cpu.add_"};
constexpr std::array<std::string_view, 2> kMulInplaceFamilies = {"mul_", "cpu.mul_"};
#define KFORGE_IN_PLACE_OUTPUT                                                                              \
  "Output 0: self itself ({\"in_place\": 0}): the result is written into self's memory, through self's "   \
  "strides, and nothing is allocated; its dtype, sizes and strides are self's. Every element of self is "   \
  "read before it is overwritten (read and write element i in the same thread)."

// ---- embedding -----------------------------------------------------------------------------------

constexpr std::array<ArgDecl, 5> kEmbeddingArgs = {{
    {"weight", R::kParameter, InputRange::kAny, -1, -1, true},
    {"indices", R::kData, InputRange::kIndex, 0, 0},
    {"padding_idx", R::kUnused},
    {"scale_grad_by_freq", R::kUnused},
    {"sparse", R::kUnused},
}};
constexpr std::array<OutputDecl, 1> kEmbeddingOutputs = {{{kOneOut, OutputRule::kGatheredRows}}};
constexpr std::array<std::string_view, 2> kEmbeddingFamilies = {"embedding", "cpu.embedding"};

// What every broadcasting binary operator's output is (torch.result_type and TensorIterator).
#define KFORGE_BROADCAST_OUTPUT                                                                              \
  "Output 0: sizes = the broadcast shape. dtype = type promotion (torch.result_type): the same dtype when " \
  "both match; bfloat16 and float32 give float32; but a 0-dimensional operand only counts by category "     \
  "(bfloat16 [4, 8] and float32 [] give bfloat16). Strides: dense (no gaps), in self's stride order (self "  \
  "contiguous: contiguous; self's strides when self has the output's sizes and is dense); dimensions where " \
  "self is broadcast take their order from other."
#define KFORGE_BROADCAST_RULE \
  "with broadcasting: sizes align from the last dimension, and a dimension of size 1 (or missing) repeats (index it with stride 0)"
#define KFORGE_LIKE_SELF_OUTPUT                                                                                \
  "Output 0: like self ({\"like\": 0}: the sizes of self; self's strides when self is non-overlapping and " \
  "dense, else dense strides in self's stride order), dtype of self."

// The entries, in KFORGE_CATALOG_OPERATORS order.
const std::array<OpEntry, kOperatorCount> kEntries = {{
    {"aten::_softmax", "", "aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", kSoftmaxArgs,
     kOneLikeInput, 5,
     R"txt(Softmax along dimension dim (argument 1; negative counts from the end): out = exp(x - m) / sum(exp(x - m)) over that dimension, with m its maximum (subtract it: inputs can be large). Accumulate in float32 for float16/bfloat16 input, in float64 for float64.
Output 0: the sizes of self with contiguous strides (even when self is not contiguous), dtype of self; with half_to_float = true (CUDA, float16 self only) dtype float32.
A row of all -inf gives NaN, as in PyTorch.)txt",
     "", "aten::_softmax.out", kSoftmaxFamilies, ""},
    {"aten::_log_softmax", "", "aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", kSoftmaxArgs,
     kOneLikeInput, 5,
     R"txt(Log-softmax along dimension dim (argument 1; negative counts from the end): out = x - m - log(sum(exp(x - m))) over that dimension, with m its maximum. Accumulate in float32 for float16/bfloat16 input, in float64 for float64.
Output 0: the sizes of self with contiguous strides (even when self is not contiguous), dtype of self; with half_to_float = true (CUDA, float16 self only) dtype float32.)txt",
     "", "aten::_log_softmax.out", kLogSoftmaxFamilies, ""},
    {"aten::native_layer_norm", "",
     "aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> "
     "(Tensor, Tensor, Tensor)",
     kLayerNormArgs, kLayerNormOutputs, 8,
     R"txt(Layer normalization over the last len(normalized_shape) dimensions of input (argument 1 is normalized_shape: len1 dimensions). With N = the product of those dimensions and M = numel0 / N rows: per row, mean = sum(x) / N, var = sum((x - mean)^2) / N (biased), rstd = 1 / sqrt(var + eps) (eps: float argument 4); out = (x - mean) * rstd * weight + bias, where weight (argument 2) and bias (argument 3) have shape normalized_shape and either may be None (then it is left out). Accumulate in float32 for float16/bfloat16 input (float64 for float64).
Output 0 (out): the sizes of input, contiguous strides, dtype of input.
Outputs 1 and 2 (mean, rstd): sizes = input's leading (non-normalized) dimensions followed by one 1 per normalized dimension (input [4, 6, 8] with normalized_shape [8] gives [4, 6, 1]), contiguous strides. Their dtype: on CUDA float32 for float16/bfloat16 input, else the input's; on CPU the input's dtype (float32 when input is float16/bfloat16 and weight or bias is float32).)txt",
     "", "aten::native_layer_norm.out", kLayerNormFamilies, ""},
    {"aten::native_group_norm", "",
     "aten::native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, "
     "float eps) -> (Tensor, Tensor, Tensor)",
     kGroupNormArgs, kGroupNormOutputs, 8,
     R"txt(Group normalization. input is [N, C, *] with N = arg3, C = arg4, HxW = arg5 (the product of the spatial dimensions) and group = arg6 groups of C / group channels each. Per (n, g): mean and biased variance over the group's C / group x HxW elements, rstd = 1 / sqrt(var + eps) (eps: float argument 7); out[n, c, ...] = (x - mean) * rstd * weight[c] + bias[c], where weight (argument 1) and bias (argument 2) have C elements and either may be None (then it is left out). Accumulate in float32 for float16/bfloat16 input (float64 for float64).
Output 0 (out): like input ({"like": 0}: its sizes, and its strides when it is dense; CUDA requires a contiguous input, CPU also takes channels_last), dtype of input.
Outputs 1 and 2 (mean, rstd): sizes [N, group], contiguous strides ([group, 1]), dtype of input on both CPU and CUDA (on CPU float32 when input is float16/bfloat16 and weight or bias is float32).)txt",
     "", "aten::native_group_norm.out", kGroupNormFamilies, ""},
    {"aten::gelu", "", "aten::gelu(Tensor self, *, str approximate=\"none\") -> Tensor", kGeluArgs, kOneLikeInput, 8,
     R"txt(GELU, elementwise. approximate (argument 1, a string) "none": out = 0.5 * x * (1 + erf(x / sqrt(2))); "tanh": out = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))). Compute in float32 for float16/bfloat16 data (float64 for float64).
Output 0: like self ({"like": 0}: the sizes of self; self's strides when self is non-overlapping and dense, else dense strides in self's stride order), dtype of self.)txt",
     "aten::gelu_", "aten::gelu.out", kGeluFamilies, ""},
    {"aten::silu", "", "aten::silu(Tensor self) -> Tensor", kSiluArgs, kOneLikeInput, 4,
     R"txt(SiLU, elementwise: out = x / (1 + exp(-x)). Compute in float32 for float16/bfloat16 data (float64 for float64).
Output 0: like self ({"like": 0}: the sizes of self; self's strides when self is non-overlapping and dense, else dense strides in self's stride order), dtype of self.)txt",
     "aten::silu_", "aten::silu.out", kSiluFamilies, ""},
    {"aten::add", "Tensor", "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", kAddArgs,
     kOneBroadcast, 2,
     R"txt(Elementwise out = self + alpha * other (alpha: argument 2, an int or float scalar), with broadcasting: sizes align from the last dimension, and a dimension of size 1 (or missing) repeats (index it with stride 0). Compute in float32 for float16/bfloat16 results (float64 for float64).
Output 0: sizes = the broadcast shape. dtype = type promotion (torch.result_type): the same dtype when both match; bfloat16 + float32 gives float32; but a 0-dimensional operand only counts by category (bfloat16 [4, 8] + float32 [] gives bfloat16). Strides: dense (no gaps), in self's stride order (self contiguous: contiguous; self's strides when self has the output's sizes and is dense); dimensions where self is broadcast take their order from other.)txt",
     "aten::add_.Tensor", "aten::add.out", kAddFamilies, ""},
    {"aten::relu", "", "aten::relu(Tensor self) -> Tensor", kReluArgs, kOneLikeInput, 1,
     R"txt(ReLU, elementwise: out = x < 0 ? 0 : x. NaN stays NaN and -0.0 stays -0.0, as in PyTorch (do not write max(x, 0): fmaxf turns NaN into 0). Exact in every dtype: no conversion rounds.
Output 0: like self ({"like": 0}: the sizes of self; self's strides when self is non-overlapping and dense, else dense strides in self's stride order), dtype of self.)txt",
     "aten::relu_", "aten::relu.out", kReluFamilies, ""},
    {"aten::sigmoid", "", "aten::sigmoid(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 3,
     "Sigmoid, elementwise: out = 1 / (1 + exp(-x)). Compute in float32 for float16/bfloat16 data (float64 for "
     "float64).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::sigmoid_", "aten::sigmoid.out", kSigmoidFamilies, ""},
    {"aten::tanh", "", "aten::tanh(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 1,
     "Hyperbolic tangent, elementwise: out = tanh(x). Compute in float32 for float16/bfloat16 data (float64 for "
     "float64).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::tanh_", "aten::tanh.out", kTanhFamilies, ""},
    {"aten::hardswish", "", "aten::hardswish(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 5,
     "Hardswish, elementwise: out = x * min(max(x + 3, 0), 6) / 6, the clamps as comparisons that keep NaN "
     "(std::min/std::max, not fminf/fmaxf, which turn NaN into the bound). Compute in float32 for "
     "float16/bfloat16 data (float64 for float64).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::hardswish_", "aten::hardswish.out", kHardswishFamilies, ""},
    {"aten::sub", "Tensor", "aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", kAddArgs,
     kOneBroadcast, 2,
     "Elementwise out = self - alpha * other (alpha: argument 2, an int or float scalar), " KFORGE_BROADCAST_RULE
     ". Compute in float32 for float16/bfloat16 results (float64 for float64).\n" KFORGE_BROADCAST_OUTPUT,
     "aten::sub_.Tensor", "aten::sub.out", kSubFamilies, ""},
    {"aten::mul", "Tensor", "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor", kBinaryArgs, kOneBroadcast, 1,
     "Elementwise out = self * other, " KFORGE_BROADCAST_RULE
     ". Compute in float32 for float16/bfloat16 results (float64 for float64).\n" KFORGE_BROADCAST_OUTPUT,
     "aten::mul_.Tensor", "aten::mul.out", kMulFamilies, ""},
    {"aten::div", "Tensor", "aten::div.Tensor(Tensor self, Tensor other) -> Tensor", kBinaryArgs, kOneBroadcast, 1,
     "Elementwise true division out = self / other, " KFORGE_BROADCAST_RULE
     ". Compute in float32 for float16/bfloat16 results (float64 for float64); x / 0 is +-inf and 0 / 0 NaN, as "
     "IEEE division gives; integer inputs give the default float dtype (float32).\n" KFORGE_BROADCAST_OUTPUT,
     "aten::div_.Tensor", "aten::div.out", kDivFamilies, ""},
    {"aten::native_batch_norm", "",
     "aten::native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
     "bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
     kBatchNormArgs, kBatchNormOutputs, 4,
     R"txt(Batch normalization of input [N, C, *] (C = its dimension 1). In inference (training, argument 5, false: what a model in eval() calls): per channel c, invstd = 1 / sqrt(running_var[c] + eps) (eps: float argument 7) and out[n, c, ...] = (x - running_mean[c]) * invstd * weight[c] + bias[c]; weight (argument 1) and bias (argument 2) have C elements and either may be None (then it is left out); running_mean and running_var (arguments 3, 4) have C elements; momentum (argument 6) is unused. Compute in float32 for float16/bfloat16 input (float64 for float64). In training the statistics come from the batch instead (mean and biased variance over every dimension but 1) and the running statistics are updated in place.
Output 0 (out): like input ({"like": 0}: its sizes, and its strides when it is dense, channels_last included), dtype of input.
Outputs 1 and 2 (save_mean, save_invstd): in training [C], the batch's mean and invstd. In inference on CPU empty, sizes [0] (strides [1]), dtype of running_mean (float32 running statistics with a bfloat16 input give float32); in inference on CUDA sizes [C] (strides [1]), dtype float32 (float64 for float64 input) whatever the parameters' dtype, their values left uninitialized by PyTorch: write anything (every element), only the layout is compared.)txt",
     "", "aten::native_batch_norm.out", kBatchNormFamilies, ""},
    {"aten::sum", "dim_IntList",
     "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
     kSumMeanArgs, kOneReduced, 1,
     "Sum over the dimensions listed in dim (argument 1, a list; negative counts from the end; None or [] "
     "reduces every dimension). Accumulate in float32 for float16/bfloat16 input; the result has self's dtype "
     "(argument 3, dtype, when given, sets it instead; integer and bool inputs give int64).\n" KFORGE_REDUCED_OUTPUT,
     "", "aten::sum.IntList_out", kSumFamilies, ""},
    {"aten::mean", "dim",
     "aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
     kSumMeanArgs, kOneReduced, 1,
     "Mean over the dimensions listed in dim (argument 1, a list; negative counts from the end; None or [] "
     "reduces every dimension): the sum divided by the number of elements reduced. Accumulate in float32 for "
     "float16/bfloat16 input; the result has self's dtype (argument 3, dtype, when given, sets it; a floating "
     "dtype only).\n" KFORGE_REDUCED_OUTPUT,
     "", "aten::mean.out", kMeanFamilies, ""},
    {"aten::amax", "", "aten::amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", kAmaxArgs,
     kOneReduced, 1,
     "Maximum over the dimensions listed in dim (argument 1; negative counts from the end; [] reduces every "
     "dimension), exact in every dtype. A NaN anywhere in a reduced group makes its result NaN (do not use "
     "fmaxf alone: it drops NaN).\n" KFORGE_REDUCED_OUTPUT,
     "", "aten::amax.out", kAmaxFamilies, ""},
    {"aten::neg", "", "aten::neg(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 1,
     "Negation, elementwise: out = -x (exact in every dtype: -0.0 for 0.0, NaN stays NaN).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::neg_", "aten::neg.out", kNegFamilies, ""},
    {"aten::rsqrt", "", "aten::rsqrt(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 1,
     "Reciprocal square root, elementwise: out = 1 / sqrt(x); +inf for 0 (-inf for -0.0), NaN for x < 0. "
     "Compute in float32 for float16/bfloat16 data (float64 for float64); integer inputs give float32.\n"
     KFORGE_LIKE_SELF_OUTPUT,
     "aten::rsqrt_", "aten::rsqrt.out", kRsqrtFamilies, ""},
    {"aten::exp", "", "aten::exp(Tensor self) -> Tensor", kUnaryArgs, kOneLikeInput, 1,
     "Exponential, elementwise: out = e^x (inf above float's range, 0 far below it). Compute in float32 for "
     "float16/bfloat16 data (float64 for float64); integer inputs give float32.\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::exp_", "aten::exp.out", kExpFamilies, ""},
    {"aten::pow", "Tensor_Scalar", "aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor", kPowScalarArgs,
     kOneLikeInput, 2,
     "Power with a number as the exponent (argument 1, an int or float scalar), elementwise: out = x^exponent. "
     "PyTorch computes exponent 2 as x * x, 3 as x * x * x, 0.5 as sqrt(x), -0.5 as 1 / sqrt(x), -1 as 1 / x, -2 "
     "as 1 / (x * x), and any other with pow (a negative x to a non-integer power is NaN). Compute in float32 "
     "for float16/bfloat16 data (float64 for float64).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::pow_.Scalar", "aten::pow.Tensor_Scalar_out", kPowFamilies, ""},
    {"aten::embedding", "",
     "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool "
     "sparse=False) -> Tensor",
     kEmbeddingArgs, kEmbeddingOutputs, 1,
     "Row lookup: weight is [num_embeddings, embedding_dim], indices an int64 or int32 tensor of any shape with "
     "values in [0, num_embeddings); out[i..., :] = weight[indices[i...], :], an exact copy (NaN payloads "
     "included). padding_idx, scale_grad_by_freq and sparse (arguments 2-4) only change the gradient. An index "
     "out of range is an error in PyTorch; a kernel must never read outside weight for one.\n"
     "Output 0: sizes = indices' sizes followed by embedding_dim, contiguous strides, dtype of weight.",
     "", "", kEmbeddingFamilies, ""},
    {"aten::cudnn_batch_norm", "",
     "aten::cudnn_batch_norm(Tensor input, Tensor weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
     "bool training, float exponential_average_factor, float epsilon) -> (Tensor, Tensor, Tensor, Tensor)",
     kCudnnBatchNormArgs, kCudnnBatchNormOutputs, 4,
     R"txt(Batch normalization through cuDNN: what F.batch_norm reaches on CUDA for float32 input, and for float16 input with float32 parameters (bfloat16, and float16 parameters, go to native_batch_norm). CUDA only: PyTorch has no CPU kernel for it. input is [N, C, *] (C = its dimension 1); weight (argument 1, required), bias, running_mean, running_var (arguments 2-4) have C float32 elements. In inference (training, argument 5, false: a model in eval()): per channel c, invstd = 1 / sqrt(running_var[c] + epsilon) (epsilon: float argument 7) and out[n, c, ...] = (x - running_mean[c]) * invstd * weight[c] + bias[c] (bias None: left out); exponential_average_factor (argument 6) is unused. Compute in float32.
Output 0 (out): like input ({"like": 0}: its sizes, and its strides when it is dense), dtype of input.
Outputs 1 and 2 (save_mean, save_var): in inference empty, sizes [0] (strides [1]), dtype float32 (weight's); in training [C].
Output 3 (reserve): cuDNN's reserve space, dtype uint8, in inference empty (sizes [0], strides [1]).)txt",
     "", "", kCudnnBatchNormFamilies,
     ""},
    {"aten::mul", "Scalar", "aten::mul.Scalar(Tensor self, Scalar other) -> Tensor", kMulScalarArgs, kOneLikeInput, 1,
     "Elementwise out = self * other, other a number (argument 1, an int or float scalar; what the math "
     "attention path scales by). Compute in float32 for float16/bfloat16 data, with other converted to "
     "float32 (float64 for float64).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::mul_.Scalar", "aten::mul.Scalar_out", kMulScalarFamilies, ""},
    {"aten::cat", "", "aten::cat(Tensor[] tensors, int dim=0) -> Tensor", kCatArgs, kCatOutputs, 1,
     "Concatenation of the tensors of the list (argument 0) along dimension dim (argument 1; negative counts "
     "from the end): all have one rank and equal sizes in every other dimension; out holds tensors[0], then "
     "tensors[1], ... along dim, each element copied exactly. (A 1-dimensional tensor of size 0 in the list is "
     "skipped, as a legacy rule.)\n"
     "Output 0: the sizes of tensors[0] with dimension dim the sum of the tensors' sizes there; dtype = type "
     "promotion over the tensors (one dtype: that one); contiguous strides when the tensors are contiguous "
     "(otherwise the memory format they share).",
     "", "aten::cat.out", kCatFamilies, ""},
    {"aten::clone", "", "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", kCloneArgs,
     kOneLikeInput, 1,
     "A copy of self, every element exact (what Tensor.contiguous() calls on a non-contiguous tensor). "
     "memory_format (argument 1) is an int of c10::MemoryFormat or None: 0 contiguous, 1 preserve (None "
     "means preserve), 2 channels_last, 3 channels_last_3d.\n"
     "Output 0: the sizes and dtype of self. Strides: contiguous for memory_format 0; for preserve, self's "
     "strides when self is non-overlapping and dense (no gaps, no repeats), else those of self's suggested "
     "memory format (contiguous, or channels_last for a 4-dimensional self laid out so); channels_last for 2.",
     "", "aten::clone.out", kCloneFamilies, ""},
    {"aten::relu_", "", "aten::relu_(Tensor(a!) self) -> Tensor(a!)", kReluArgs, kSelfOut, 1,
     "ReLU in place, elementwise: self = x < 0 ? 0 : x. NaN stays NaN and -0.0 stays -0.0, as in PyTorch (do "
     "not write max(x, 0)). Exact in every dtype.\n" KFORGE_IN_PLACE_OUTPUT,
     "", "", kReluInplaceFamilies, ""},
    {"aten::add_", "Tensor", "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
     kAddArgs, kSelfOut, 2,
     "In place, elementwise: self = self + alpha * other (alpha: argument 2, an int or float scalar), other "
     "broadcast to self's sizes (sizes align from the last dimension; a dimension of size 1 or missing in "
     "other repeats: index it with stride 0; self is never broadcast). Compute in float32 for "
     "float16/bfloat16 self (float64 for float64), round to self's dtype.\n" KFORGE_IN_PLACE_OUTPUT,
     "", "", kAddInplaceFamilies, ""},
    {"aten::mul_", "Tensor", "aten::mul_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)", kBinaryArgs,
     kSelfOut, 1,
     "In place, elementwise: self = self * other, other broadcast to self's sizes (sizes align from the "
     "last dimension; a dimension of size 1 or missing in other repeats: index it with stride 0; self is "
     "never broadcast). Compute in float32 for float16/bfloat16 self (float64 for float64), round to self's "
     "dtype.\n" KFORGE_IN_PLACE_OUTPUT,
     "", "", kMulInplaceFamilies, ""},
    {"aten::_safe_softmax", "", "aten::_safe_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
     kSafeSoftmaxArgs, kOneLikeInput, 5,
     "Softmax along dimension dim (argument 1; negative counts from the end) as aten::_softmax computes it, "
     "except that a row whose elements are all -inf gives 0 everywhere instead of NaN (what "
     "scaled_dot_product_attention's math path calls: a fully masked query attends to nothing); a row of "
     "-inf and NaN still gives NaN. Accumulate in float32 for float16/bfloat16 input, in float64 for "
     "float64. dtype (argument 2): None keeps self's dtype, else self is converted to it first.\n"
     "Output 0: the sizes of self with contiguous strides (even when self is not contiguous), dtype of self "
     "(or dtype).",
     "", "", kSafeSoftmaxFamilies, ""},
    {"aten::_to_copy", "",
     "aten::_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
     "bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
     kToCopyArgs, kConvertedOut, 1,
     "A copy of self converted to dtype (argument 1: a c10::ScalarType code, 6 float32, 5 float16, 15 "
     "bfloat16, 7 float64; None keeps self's dtype): what Tensor.to(dtype), .float(), .half() call. Each "
     "element converted as static_cast does: to a narrower float type rounded to nearest even (float32 to "
     "bfloat16: round the upper 16 bits to nearest even; NaN stays NaN), between float16 and bfloat16 "
     "through float32; widening is exact. layout (argument 2) and device (argument 3, a string such as "
     "\"cuda:0\" or \"cpu\") None: the same as self's; memory_format (argument 6) as clone's (None: "
     "preserve).\n"
     "Output 0: the sizes of self, dtype as above; strides like self's for preserve (self's when self is "
     "non-overlapping and dense, else contiguous in self's stride order), contiguous for memory_format 0.",
     "", "aten::_to_copy.out", kToCopyFamilies, ""},
    {"aten::argmax", "", "aten::argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", kAmaxArgs,
     kOneIndexReduced, 1,
     "Index of the maximum along dim (argument 1, one dimension, negative counts from the end; None: of the "
     "flattened tensor), as int64, compared exactly in every dtype. Ties give the first (lowest) index; a NaN "
     "counts as larger than every number, so a group with a NaN gives the index of its first NaN. Indices are "
     "checked exactly.\n"
     "Output 0: self's sizes without dim, or with it as 1 when keepdim (argument 2) is true (self [4, 6, 5] over "
     "-1 gives [4, 6], keepdim [4, 6, 1]; None without keepdim a 0-dimensional tensor, None with keepdim every "
     "dimension 1); contiguous strides; dtype int64.",
     "", "aten::argmax.out", kArgmaxFamilies, ""},
    {"aten::clamp_min", "", "aten::clamp_min(Tensor self, Scalar min) -> Tensor", kClampMinArgs, kOneLikeInput, 1,
     "Elementwise out = x < min ? min : x, min a number (argument 1, an int or float scalar). NaN stays NaN; a "
     "NaN min makes every element NaN; -0.0 stays -0.0 against min 0 (do not write fmaxf: it drops NaN). "
     "Exact in every dtype: the result is x or min converted to the dtype.\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::clamp_min_", "aten::clamp_min.out", kClampMinFamilies, ""},
    {"aten::clamp_min_", "", "aten::clamp_min_(Tensor(a!) self, Scalar min) -> Tensor(a!)", kClampMinArgs, kSelfOut,
     1,
     "In place, elementwise: self = x < min ? min : x, min a number (argument 1, an int or float scalar). NaN "
     "stays NaN; a NaN min makes every element NaN; -0.0 stays -0.0 against min 0. Exact in every dtype.\n"
     KFORGE_IN_PLACE_OUTPUT,
     "", "", kClampMinInplaceFamilies, ""},
    {"aten::upsample_nearest2d", "",
     "aten::upsample_nearest2d(Tensor self, SymInt[2] output_size, float? scales_h=None, float? scales_w=None) -> "
     "Tensor",
     kUpsampleNearestArgs, kOneResized2d, 1,
     "Nearest-neighbour resize of self [N, C, H, W] to [N, C, OH, OW] (output_size, argument 1): "
     "out[n, c, oh, ow] = self[n, c, ih, iw], an exact copy, with ih = min(floor(oh * sh), H - 1) computed in "
     "float32: sh = (float)(1.0 / scales_h) when scales_h (argument 2) is given and > 0, else (float)H / OH "
     "(float32 division); likewise iw with W, OW, scales_w (argument 3). (So OH == 2H gives ih = oh / 2.)\n"
     "Output 0: [N, C, OH, OW], contiguous strides (channels_last when self is channels_last), dtype of self.",
     "", "aten::upsample_nearest2d.out", kUpsampleNearestFamilies, ""},
    {"aten::max_pool2d_with_indices", "",
     "aten::max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] "
     "dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
     kMaxPoolArgs, kMaxPoolOutputs, 1,
     R"txt(2D max pooling of self [N, C, H, W] (what resnet's stem and F.max_pool2d call). kernel_size, stride, padding, dilation (arguments 1-4): one int for both dimensions or [h, w]; stride [] means kernel_size. Output size per dimension: floor((H + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s) + 1, one less with ceil_mode when that last window would start at or past H + pad. Window of output (oh, ow): rows h = oh * s - pad + i * dil (i = 0..k-1) inside [0, H), likewise columns. Walk the window row by row, each row left to right, starting from maxval = -inf and maxidx = the first in-bounds element's h * W + w; take an element when val > maxval or val is NaN (so ties keep the first maximum, and a window with NaNs gives its last NaN); compare in float32 for float16/bfloat16.
Output 0 (out): [N, C, OH, OW], contiguous strides, dtype of self: maxval, exactly an input value.
Output 1 (indices): [N, C, OH, OW], contiguous, int64: maxidx, the flat index h * W + w within the [H, W] plane; compared exactly.)txt",
     "", "aten::max_pool2d_with_indices.out", kMaxPoolFamilies, ""},
    {"aten::cumsum", "", "aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", kCumsumArgs,
     kOneLikeInput, 1,
     "Cumulative sum along dim (argument 1; negative counts from the end): out[..., i, ...] = the sum of "
     "self[..., 0..i, ...] along that dimension. Accumulate in float32 or better for float16/bfloat16 input "
     "(PyTorch's CPU kernel sums float32 in float64, its CUDA kernel in float32), and round each prefix on its "
     "own. dtype (argument 2), when given, converts self first (integer and bool inputs give int64 when it "
     "is None).\n" KFORGE_LIKE_SELF_OUTPUT,
     "aten::cumsum_", "aten::cumsum.out", kCumsumFamilies, ""},
    {"aten::avg_pool2d", "",
     "aten::avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, "
     "bool count_include_pad=True, int? divisor_override=None) -> Tensor",
     kAvgPoolArgs, kOnePooled2d, 1,
     R"txt(2D average pooling of self [N, C, H, W] (F.avg_pool2d; nn.AvgPool2d). kernel_size, stride, padding (arguments 1-3): one int for both dimensions or [h, w]; stride [] means kernel_size. Output size per dimension: floor((H + 2 * pad - k + (ceil_mode ? s - 1 : 0)) / s) + 1, one less with ceil_mode when that last window would start at or past H + pad. Window of output (oh, ow): hs = oh * s - pad, he = min(hs + k, H + pad), pool_size = (he - hs) * (we - ws) (counting padding); then hs = max(hs, 0), he = min(he, H), likewise columns. out = (the sum of self over rows [hs, he) and columns [ws, we), in float32 for float16/bfloat16) / divisor, the divisor being divisor_override (argument 6) when given, else pool_size when count_include_pad (argument 5), else (he - hs) * (we - ws).
Output 0: [N, C, OH, OW], contiguous strides (channels_last when self is channels_last), dtype of self.)txt",
     "", "aten::avg_pool2d.out", kAvgPoolFamilies, ""},
    {"aten::_adaptive_avg_pool2d", "", "aten::_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor",
     kAdaptiveAvgPoolArgs, kOneResized2d, 1,
     R"txt(Adaptive 2D average pooling of self [N, C, H, W] to [N, C, OH, OW] (output_size, argument 1; what F.adaptive_avg_pool2d calls unless the output is 1x1, which becomes mean over the last two dimensions). Window of output (oh, ow): rows [floor(oh * H / OH), ceil((oh + 1) * H / OH)), columns likewise with W, OW (integer arithmetic; windows may overlap when OH does not divide H). out = the mean of self over the window, summed in float32 for float16/bfloat16.
Output 0: [N, C, OH, OW], contiguous strides (channels_last when self is channels_last), dtype of self.)txt",
     "", "aten::_adaptive_avg_pool2d.out", kAdaptiveAvgPoolFamilies, ""},
    {"aten::upsample_bilinear2d", "",
     "aten::upsample_bilinear2d(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None, "
     "float? scales_w=None) -> Tensor",
     kUpsampleBilinearArgs, kOneResized2d, 8,
     R"txt(Bilinear resize of self [N, C, H, W] to [N, C, OH, OW] (output_size, argument 1; F.interpolate(mode="bilinear"), antialias off). In float32 (also for float16/bfloat16 input): the row scale rh = align_corners (argument 2) ? (OH > 1 ? (float)(H - 1) / (OH - 1) : 0) : (scales_h (argument 3) given and > 0 ? (float)(1.0 / scales_h) : (float)H / OH); source row r = align_corners ? rh * oh : max(rh * (oh + 0.5) - 0.5, 0); h0 = (int)r, h1 = h0 + (h0 < H - 1 ? 1 : 0), lh = r - h0. Columns likewise (scales_w, argument 4). out = (1 - lh) * ((1 - lw) * x[h0, w0] + lw * x[h0, w1]) + lh * ((1 - lw) * x[h1, w0] + lw * x[h1, w1]), in that order (a weight 0 times an Inf neighbour is NaN, as in PyTorch).
Output 0: [N, C, OH, OW], contiguous strides (channels_last when self is channels_last), dtype of self.)txt",
     "", "aten::upsample_bilinear2d.out", kUpsampleBilinearFamilies, ""},
}};

#undef KFORGE_REDUCED_OUTPUT
#undef KFORGE_BROADCAST_OUTPUT
#undef KFORGE_BROADCAST_RULE
#undef KFORGE_LIKE_SELF_OUTPUT
#undef KFORGE_IN_PLACE_OUTPUT

// The schema's argument count: the comma-separated items at depth 0 between its first '(' and the
// matching ')', less the keyword-only marker "*".
size_t schema_arguments(std::string_view schema) {
  const size_t open = schema.find('(');
  if (open == std::string_view::npos) return 0;
  size_t n = 0, depth = 0;
  std::string item;
  auto close_item = [&] {
    if (!item.empty() && item != "*") ++n;
    item.clear();
  };
  for (size_t i = open + 1; i < schema.size(); ++i) {
    const char c = schema[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ')') {
      if (depth == 0) break;
      --depth;
    }
    if (depth == 0 && c == ',') {
      close_item();
    } else if (c != ' ') {
      item += c;
    }
  }
  close_item();
  return n;
}

const TensorMeta* tensor_at(const OpSignature& sig, size_t i) {
  return i < sig.args.size() ? std::get_if<TensorMeta>(&sig.args[i].value) : nullptr;
}

const int64_t* int_at(const OpSignature& sig, size_t i) {
  return i < sig.args.size() ? std::get_if<int64_t>(&sig.args[i].value) : nullptr;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size());
  int64_t step = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    s[d] = step;
    step *= std::max<int64_t>(sizes[d], 1);
  }
  return s;
}

bool is_16bit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

}  // namespace

std::string_view arg_role_name(ArgRole r) noexcept {
  switch (r) {
    case ArgRole::kData: return "data";
    case ArgRole::kParameter: return "parameter";
    case ArgRole::kDim: return "dim";
    case ArgRole::kShape: return "shape";
    case ArgRole::kCount: return "count";
    case ArgRole::kEpsilon: return "epsilon";
    case ArgRole::kScalar: return "scalar";
    case ArgRole::kMode: return "mode";
    case ArgRole::kResultType: return "result_type";
    case ArgRole::kUnused: return "unused";
  }
  return "?";
}

std::string_view input_range_name(InputRange r) noexcept {
  switch (r) {
    case InputRange::kAny: return "any";
    case InputRange::kPositive: return "positive";
    case InputRange::kNonNegative: return "non_negative";
    case InputRange::kProbability: return "probability";
    case InputRange::kIndex: return "index";
  }
  return "?";
}

std::string OpEntry::qualified() const {
  std::string s(name);
  if (!overload.empty()) {
    s += '.';
    s += overload;
  }
  return s;
}

std::span<const OpEntry> operators() noexcept { return kEntries; }

const OpEntry* find(std::string_view name, std::string_view overload) noexcept {
  for (const OpEntry& e : kEntries) {
    if (e.name == name && e.overload == overload) return &e;
  }
  return nullptr;
}

const OpEntry* find(const OpSignature& sig) noexcept { return find(sig.op, sig.overload); }

bool out_variant_intercepted(std::string_view out_variant) noexcept {
#define KFORGE_CATALOG_OUT(base, overload) \
  if (out_variant == "aten::" #base "." #overload) return true;
  KFORGE_CATALOG_OUT_VARIANTS(KFORGE_CATALOG_OUT)
#undef KFORGE_CATALOG_OUT
  return false;
}

size_t index_of(const OpEntry& e) noexcept {
  for (size_t i = 0; i < kEntries.size(); ++i) {
    if (&kEntries[i] == &e) return i;
  }
  return kOperatorCount;
}

std::string incomplete(const OpEntry& e) {
  const std::string who = e.name.empty() ? std::string("an entry") : e.qualified();
  if (!e.name.starts_with("aten::") || e.name.size() <= 6) return who + ": the name must be aten::<op>";
  if (!e.schema.starts_with(e.qualified() + "(")) return who + ": the schema must start with " + e.qualified() + "(";
  const size_t n = schema_arguments(e.schema);
  if (e.args.size() != n) {
    return who + ": " + std::to_string(e.args.size()) + " arguments declared, the schema has " + std::to_string(n);
  }
  for (size_t i = 0; i < e.args.size(); ++i) {
    const ArgDecl& a = e.args[i];
    if (a.name.empty()) return who + ": argument " + std::to_string(i) + " has no name";
    if (e.schema.find(" " + std::string(a.name)) == std::string_view::npos) {
      return who + ": argument " + std::to_string(i) + " (" + std::string(a.name) + ") is not in the schema";
    }
    if (a.range == InputRange::kIndex &&
        (a.index_arg < 0 || static_cast<size_t>(a.index_arg) >= e.args.size() || a.index_dim < 0)) {
      return who + ": argument " + std::to_string(i) + " is an index without the dimension that bounds it";
    }
  }
  if (e.outputs.empty()) return who + ": no outputs declared";
  for (const OutputDecl& o : e.outputs) {
    if (o.name.empty()) return who + ": an output has no name";
  }
  if (!(e.flops_per_element > 0)) return who + ": no FLOPs per element (Note [Op cost model])";
  if (e.semantics.find("Output") == std::string_view::npos) {
    return who + ": the semantics text must say what each output is (\"Output 0: ...\")";
  }
  if (e.template_families.empty() && e.no_templates_reason.empty()) {
    return who + ": no template family, and no reason why there is none";
  }
  if (!e.inplace.empty() && !e.inplace.starts_with("aten::")) return who + ": the in-place variant must be aten::<op>";
  // "aten::add.out"; an overload may name it otherwise ("aten::sum.IntList_out").
  if (!e.out_variant.empty() &&
      (!e.out_variant.starts_with(std::string(e.name) + ".") || !e.out_variant.ends_with("out"))) {
    return who + ": the out= variant must be <op>.out or <op>.<overload>_out";
  }
  return "";
}

std::optional<Pool2d> pool2d_geometry(const OpSignature& sig) noexcept {
  const TensorMeta* x = tensor_at(sig, 0);
  const bool avg = sig.op == "aten::avg_pool2d";
  if (x == nullptr || x->sizes.size() < 3 || sig.args.size() != (avg ? 7u : 6u)) return std::nullopt;
  // One int or [h, w]; `empty_as` for an empty list (stride: the kernel's).
  auto pair = [&](size_t i, std::optional<std::pair<int64_t, int64_t>> empty_as) -> std::optional<std::pair<int64_t, int64_t>> {
    const auto* l = std::get_if<std::vector<int64_t>>(&sig.args[i].value);
    if (l == nullptr) return std::nullopt;
    if (l->empty()) return empty_as;
    if (l->size() == 1) return std::make_pair((*l)[0], (*l)[0]);
    if (l->size() == 2) return std::make_pair((*l)[0], (*l)[1]);
    return std::nullopt;
  };
  const auto k = pair(1, std::nullopt);
  if (!k) return std::nullopt;
  const auto st = pair(2, k);
  const auto pad = pair(3, std::nullopt);
  const auto dil = avg ? std::make_optional(std::make_pair(int64_t{1}, int64_t{1})) : pair(4, std::nullopt);
  const auto* ceil = std::get_if<bool>(&sig.args[avg ? 4 : 5].value);
  if (!st || !pad || !dil || ceil == nullptr) return std::nullopt;
  Pool2d g;
  if (avg) {
    const auto* include_pad = std::get_if<bool>(&sig.args[5].value);
    const auto* divisor = std::get_if<int64_t>(&sig.args[6].value);
    if (include_pad == nullptr || (divisor == nullptr && !std::holds_alternative<std::monostate>(sig.args[6].value))) {
      return std::nullopt;
    }
    if (divisor != nullptr && *divisor == 0) return std::nullopt;   // PyTorch: divisor must be not zero
    g.count_include_pad = *include_pad;
    g.divisor = divisor != nullptr ? *divisor : 0;
  }
  g.kh = k->first, g.kw = k->second, g.sh = st->first, g.sw = st->second;
  g.ph = pad->first, g.pw = pad->second, g.dh = dil->first, g.dw = dil->second;
  g.h = x->sizes[x->sizes.size() - 2];
  g.w = x->sizes[x->sizes.size() - 1];
  if (g.kh <= 0 || g.kw <= 0 || g.sh <= 0 || g.sw <= 0 || g.dh <= 0 || g.dw <= 0 || g.ph < 0 || g.pw < 0) return std::nullopt;
  if (g.ph > g.kh / 2 || g.pw > g.kw / 2) return std::nullopt;   // PyTorch: pad should be at most half of kernel size
  auto out = [&](int64_t in, int64_t kk, int64_t p, int64_t s, int64_t d) {
    const int64_t num = in + 2 * p - d * (kk - 1) - 1 + (*ceil ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;   // floor division
    if (*ceil && (o - 1) * s >= in + p) --o;
    return o;
  };
  g.oh = out(g.h, g.kh, g.ph, g.sh, g.dh);
  g.ow = out(g.w, g.kw, g.pw, g.sw, g.dw);
  if (g.oh <= 0 || g.ow <= 0) return std::nullopt;
  return g;
}

std::vector<TensorMeta> expected_outputs(const OpSignature& sig) {
  std::vector<TensorMeta> out;
  const OpEntry* e = find(sig);
  const TensorMeta* x = tensor_at(sig, 0);
  const auto* list = sig.args.empty() ? nullptr : std::get_if<std::vector<TensorMeta>>(&sig.args[0].value);
  if (x == nullptr && list != nullptr && !list->empty()) x = &(*list)[0];   // cat: its first tensor
  if (e == nullptr || x == nullptr) return out;
  for (const OutputDecl& o : e->outputs) {
    if (o.rule == OutputRule::kConverted) {
      TensorMeta m = *x;
      m.strides = contiguous_strides(m.sizes);
      if (const int64_t* code = int_at(sig, 1)) {
        const std::optional<DType> t = dtype_of_scalar_type(*code);
        if (!t) return {};
        m.dtype = *t;
      }
      out.push_back(std::move(m));
      continue;
    }
    if (o.rule == OutputRule::kSelf) {   // argument 0 itself, strides included
      out.push_back(*x);
      continue;
    }
    TensorMeta m;
    m.dtype = x->dtype;
    m.device = x->device;
    switch (o.rule) {
      case OutputRule::kSelf:
      case OutputRule::kConverted:
        break;
      case OutputRule::kLikeInput0:
        m.sizes = x->sizes;
        break;
      case OutputRule::kBroadcast: {
        for (size_t i = 0; i < sig.args.size(); ++i) {
          const TensorMeta* t = tensor_at(sig, i);
          if (t == nullptr) continue;
          if (t->sizes.size() > m.sizes.size()) m.sizes.insert(m.sizes.begin(), t->sizes.size() - m.sizes.size(), 1);
          for (size_t d = 0; d < t->sizes.size(); ++d) {
            int64_t& s = m.sizes[m.sizes.size() - t->sizes.size() + d];
            if (s == 1) s = t->sizes[d];
          }
        }
        break;
      }
      case OutputRule::kNormRowStats: {
        const auto* shape = sig.args.size() > 1 ? std::get_if<std::vector<int64_t>>(&sig.args[1].value) : nullptr;
        const size_t normalized = shape != nullptr ? std::min(shape->size(), x->sizes.size()) : 1;
        m.sizes.assign(x->sizes.begin(), x->sizes.end() - static_cast<std::ptrdiff_t>(normalized));
        m.sizes.insert(m.sizes.end(), normalized, 1);
        if (is_16bit(x->dtype)) m.dtype = DType::kFloat32;
        break;
      }
      case OutputRule::kBatchNormSaved: {
        const auto* training = sig.args.size() > 5 ? std::get_if<bool>(&sig.args[5].value) : nullptr;
        const TensorMeta* running_mean = tensor_at(sig, 3);
        if (running_mean != nullptr) m.dtype = running_mean->dtype;
        const bool train = training != nullptr && *training;
        if (x->device == DeviceType::kCuda || train) {   // CUDA: allocated [C] in inference too
          m.sizes = {x->sizes.size() > 1 ? x->sizes[1] : 0};
          if (x->device == DeviceType::kCuda) m.dtype = x->dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
        } else {
          m.sizes = {0};
        }
        break;
      }
      case OutputRule::kReduced:
      case OutputRule::kIndexReduced: {
        const auto rank = static_cast<int64_t>(x->sizes.size());
        std::vector<bool> reduced(x->sizes.size(), false);
        const auto* dims = sig.args.size() > 1 ? std::get_if<std::vector<int64_t>>(&sig.args[1].value) : nullptr;
        std::vector<int64_t> one_dim;
        if (o.rule == OutputRule::kIndexReduced) {
          m.dtype = DType::kInt64;
          if (const int64_t* d = int_at(sig, 1)) {
            one_dim = {*d};
            dims = &one_dim;
          }
        }
        bool any = false;
        if (dims != nullptr) {
          const int64_t wrap = std::max<int64_t>(rank, 1);   // a 0-dimensional self takes 0 or -1
          for (int64_t d : *dims) {
            if (d < -wrap || d >= wrap) return {};
            if (rank == 0) continue;   // nothing to reduce
            reduced[static_cast<size_t>(d < 0 ? d + rank : d)] = any = true;
          }
        }
        if (!any) reduced.assign(x->sizes.size(), true);   // None or []: every dimension
        const auto* keep = sig.args.size() > 2 ? std::get_if<bool>(&sig.args[2].value) : nullptr;
        for (size_t d = 0; d < x->sizes.size(); ++d) {
          if (!reduced[d]) m.sizes.push_back(x->sizes[d]);
          else if (keep != nullptr && *keep) m.sizes.push_back(1);
        }
        break;
      }
      case OutputRule::kGatheredRows: {
        const TensorMeta* indices = tensor_at(sig, 1);
        if (indices == nullptr || x->sizes.size() != 2) return {};
        m.sizes = indices->sizes;
        m.sizes.push_back(x->sizes[1]);
        break;
      }
      case OutputRule::kCudnnSaved: {
        const auto* training = sig.args.size() > 5 ? std::get_if<bool>(&sig.args[5].value) : nullptr;
        const TensorMeta* weight = tensor_at(sig, 1);
        if (weight != nullptr) m.dtype = weight->dtype;
        m.sizes = {training != nullptr && *training && x->sizes.size() > 1 ? x->sizes[1] : 0};
        break;
      }
      case OutputRule::kCudnnReserve:
        m.dtype = DType::kUInt8;
        m.sizes = {0};
        break;
      case OutputRule::kConcat: {
        const int64_t* dim = int_at(sig, 1);
        const auto rank = static_cast<int64_t>(x->sizes.size());
        if (list == nullptr || dim == nullptr || *dim < -rank || *dim >= rank) return {};
        const auto d = static_cast<size_t>(*dim < 0 ? *dim + rank : *dim);
        m.sizes = x->sizes;
        m.sizes[d] = 0;
        for (const TensorMeta& t : *list) {
          if (t.sizes.size() == x->sizes.size()) m.sizes[d] += t.sizes[d];
        }
        break;
      }
      case OutputRule::kResized2d: {
        const auto* out_hw = sig.args.size() > 1 ? std::get_if<std::vector<int64_t>>(&sig.args[1].value) : nullptr;
        if (out_hw == nullptr || out_hw->size() != 2 || x->sizes.size() < 2) return {};
        m.sizes = x->sizes;
        m.sizes[m.sizes.size() - 2] = (*out_hw)[0];
        m.sizes[m.sizes.size() - 1] = (*out_hw)[1];
        break;
      }
      case OutputRule::kPooled2d:
      case OutputRule::kPooled2dIndices: {
        const std::optional<Pool2d> g = pool2d_geometry(sig);
        if (!g) return {};
        m.sizes = x->sizes;
        m.sizes[m.sizes.size() - 2] = g->oh;
        m.sizes[m.sizes.size() - 1] = g->ow;
        if (o.rule == OutputRule::kPooled2dIndices) m.dtype = DType::kInt64;
        break;
      }
      case OutputRule::kGroupStats: {
        const int64_t* n = int_at(sig, 3);
        const int64_t* g = int_at(sig, 6);
        if (n == nullptr || g == nullptr) return {};
        m.sizes = {*n, *g};
        break;
      }
    }
    m.strides = contiguous_strides(m.sizes);
    out.push_back(std::move(m));
  }
  return out;
}

std::optional<DType> dtype_of_scalar_type(int64_t code) noexcept {
  switch (code) {   // c10/core/ScalarType.h
    case 0: return DType::kUInt8;
    case 1: return DType::kInt8;
    case 2: return DType::kInt16;
    case 3: return DType::kInt32;
    case 4: return DType::kInt64;
    case 5: return DType::kFloat16;
    case 6: return DType::kFloat32;
    case 7: return DType::kFloat64;
    case 9: return DType::kComplex64;
    case 10: return DType::kComplex128;
    case 11: return DType::kBool;
    case 15: return DType::kBFloat16;
    case 23: return DType::kFloat8E5M2;
    case 24: return DType::kFloat8E4M3FN;
    default: return std::nullopt;
  }
}

bool output_values_unspecified(const OpEntry& e, size_t k, DeviceType input_device, std::optional<bool> training) {
  if (k >= e.outputs.size() || e.outputs[k].rule != OutputRule::kBatchNormSaved) return false;
  return input_device == DeviceType::kCuda && training.has_value() && !*training;
}

bool output_values_unspecified(const OpSignature& sig, size_t k) {
  const OpEntry* e = find(sig);
  const TensorMeta* x = tensor_at(sig, 0);
  if (e == nullptr || x == nullptr) return false;
  const auto* training = sig.args.size() > 5 ? std::get_if<bool>(&sig.args[5].value) : nullptr;
  return output_values_unspecified(*e, k, x->device, training ? std::optional<bool>(*training) : std::nullopt);
}

namespace {

double tensor_bytes(const TensorMeta& t) { return static_cast<double>(t.numel()) * dtype_size_bytes(t.dtype); }

// Inputs once (a gathered one not at all: gathered_bytes), and the largest tensor argument's
// element count for the FLOPs.
OpCost input_cost(const OpSignature& sig) {
  OpCost c;
  double largest = 0;
  const OpEntry* e = find(sig);
  for (size_t i = 0; i < sig.args.size(); ++i) {
    const Arg& a = sig.args[i];
    if (e != nullptr && i < e->args.size() && e->args[i].gathered) continue;
    if (const auto* t = std::get_if<TensorMeta>(&a.value)) {
      c.bytes += tensor_bytes(*t);
      largest = std::max(largest, static_cast<double>(t->numel()));
    } else if (const auto* ts = std::get_if<std::vector<TensorMeta>>(&a.value)) {
      for (const TensorMeta& item : *ts) {
        c.bytes += tensor_bytes(item);
        largest = std::max(largest, static_cast<double>(item.numel()));
      }
    }
  }
  c.flops = e != nullptr ? e->flops_per_element * largest : 0;
  return c;
}

// A gathered argument (ArgDecl::gathered) reads as many bytes as the output: 2 when the op has one.
double output_factor(const OpSignature& sig) {
  const OpEntry* e = find(sig);
  if (e == nullptr) return 1;
  for (const ArgDecl& a : e->args) {
    if (a.gathered) return 2;
  }
  return 1;
}

}  // namespace

OpCost op_cost(const OpSignature& sig, std::span<const ResolvedOutput> outputs) {
  OpCost c = input_cost(sig);
  for (const ResolvedOutput& o : outputs) {
    double n = 1;
    for (int64_t s : o.sizes) n *= static_cast<double>(s);
    c.bytes += output_factor(sig) * n * dtype_size_bytes(o.dtype);
  }
  return c;
}

OpCost op_cost(const OpSignature& sig) {
  OpCost c = input_cost(sig);
  for (const TensorMeta& o : expected_outputs(sig)) c.bytes += output_factor(sig) * tensor_bytes(o);
  return c;
}

}  // namespace kforge::catalog

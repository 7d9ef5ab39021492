// The operator catalog: every operator kforge replaces, declared once. Torch-free, part of the
// vocabulary, so every component reads the same facts:
//
//   const catalog::OpEntry* op = catalog::find(sig);           // nullptr: not a catalog operator
//   for (const catalog::OpEntry& e : catalog::operators()) ...  // in catalog order
//   OpCost c = catalog::op_cost(sig);                          // bytes and FLOPs, for the roofline
//
// Who reads what:
//   the hook            KFORGE_CATALOG_OPERATORS (below) for its typed interceptors, and the names
//                       for registration, KFORGE_OPS and the observation slots
//   the worker          each argument's role (the float64 reference's fixes) and input range (trial
//                       data), the cost model (achieved bandwidth, Note [Plausible timing])
//   the daemon          the cost model (the roofline floor, the scheduler's headroom)
//   the LLM proposer    the schema line and the semantics text
//   the templates       which families serve the operator (template_library's order)
//   kforge ops          all of it
// Adding an operator: one KFORGE_OP line below and one entry in op_catalog.cc (the test
// tests/runtime/op_catalog_test.cc fails until both are complete), a template family (or the
// reason there is none) and its tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"

// Every catalog operator as torch's generated C++ API names it (ATen/ops/<base>_ops.h,
// at::_ops::<base> or at::_ops::<base>_<overload>): OP(base) for the default overload,
// OP_OVERLOAD(base, overload) otherwise. The hook instantiates a typed interceptor from each; the
// build generates the hook's includes from these lines (interposer/hook/CMakeLists.txt), so keep
// one per line. The order is the catalog's order.
#define KFORGE_CATALOG_OPERATORS(OP, OP_OVERLOAD) \
  OP(_softmax)                                    \
  OP(_log_softmax)                                \
  OP(native_layer_norm)                           \
  OP(native_group_norm)                           \
  OP(gelu)                                        \
  OP(silu)                                        \
  OP_OVERLOAD(add, Tensor)                        \
  OP(relu)                                        \
  OP(sigmoid)                                     \
  OP(tanh)                                        \
  OP(hardswish)                                   \
  OP_OVERLOAD(sub, Tensor)                        \
  OP_OVERLOAD(mul, Tensor)                        \
  OP_OVERLOAD(div, Tensor)                        \
  OP(native_batch_norm)                           \
  OP_OVERLOAD(sum, dim_IntList)                   \
  OP_OVERLOAD(mean, dim)                          \
  OP(amax)                                        \
  OP(neg)                                         \
  OP(rsqrt)                                       \
  OP(exp)                                         \
  OP_OVERLOAD(pow, Tensor_Scalar)                 \
  OP(embedding)                                   \
  OP(cudnn_batch_norm)                            \
  OP_OVERLOAD(mul, Scalar)                        \
  OP(cat)                                         \
  OP(clone)                                       \
  OP(relu_)                                       \
  OP_OVERLOAD(add_, Tensor)                       \
  OP_OVERLOAD(mul_, Tensor)                       \
  OP(_safe_softmax)                               \
  OP(_to_copy)                                    \
  OP(argmax)                                      \
  OP(clamp_min)                                   \
  OP(clamp_min_)                                  \
  OP(upsample_nearest2d)                          \
  OP(max_pool2d_with_indices)                     \
  OP(cumsum)                                      \
  OP(avg_pool2d)                                  \
  OP(_adaptive_avg_pool2d)                        \
  OP(upsample_bilinear2d)

// The out variants the hook intercepts (Note [Out variants] in interposer/hook/swap_call.cc), as
// torch's C++ API names them (at::_ops::<base>_<overload>): each is an OpEntry::out_variant, and
// every OpEntry::out_variant is here but aten::_to_copy.out (kOutVariantNotIntercepted), whose
// arguments are not _to_copy's (no dtype, layout or device), so no functional signature describes
// its calls. The hook instantiates a typed interceptor from each; `kforge ops` shows them.
#define KFORGE_CATALOG_OUT_VARIANTS(OUT)                                                                  \
  OUT(_softmax, out) OUT(_log_softmax, out) OUT(native_layer_norm, out) OUT(native_group_norm, out)        \
  OUT(gelu, out) OUT(silu, out) OUT(add, out) OUT(relu, out) OUT(sigmoid, out) OUT(tanh, out)              \
  OUT(hardswish, out) OUT(sub, out) OUT(mul, out) OUT(div, out) OUT(native_batch_norm, out)                \
  OUT(sum, IntList_out) OUT(mean, out) OUT(amax, out) OUT(neg, out) OUT(rsqrt, out) OUT(exp, out)          \
  OUT(pow, Tensor_Scalar_out) OUT(mul, Scalar_out) OUT(cat, out) OUT(clone, out) OUT(argmax, out)          \
  OUT(clamp_min, out) OUT(upsample_nearest2d, out) OUT(max_pool2d_with_indices, out) OUT(cumsum, out)      \
  OUT(avg_pool2d, out) OUT(_adaptive_avg_pool2d, out) OUT(upsample_bilinear2d, out)

namespace kforge::catalog {

namespace detail {
#define KFORGE_CATALOG_COUNT_OP(base) +1
#define KFORGE_CATALOG_COUNT_OP_OVERLOAD(base, overload) +1
inline constexpr size_t kCount = 0 KFORGE_CATALOG_OPERATORS(KFORGE_CATALOG_COUNT_OP, KFORGE_CATALOG_COUNT_OP_OVERLOAD);
#undef KFORGE_CATALOG_COUNT_OP
#undef KFORGE_CATALOG_COUNT_OP_OVERLOAD
}  // namespace detail

// How many operators the catalog declares (compile time: the hook sizes tables by it).
inline constexpr size_t kOperatorCount = detail::kCount;

// What an argument is to the operator.
enum class ArgRole : uint8_t {
  kData,         // a tensor the operator computes on
  kParameter,    // a tensor of learned values (weight, bias), or None
  kDim,          // a dimension index (negative counts from the end)
  kShape,        // sizes (normalized_shape)
  kCount,        // a size or count given as a number (N, C, HxW, group)
  kEpsilon,      // a small float added for stability
  kScalar,       // a number the formula uses (alpha)
  kMode,         // a string choosing the formula (gelu's approximate)
  kResultType,   // changes the result's dtype (half_to_float, dtype): the float64 reference sets it
                 // to keep float64 (false, or float64)
  kUnused,       // does not change the forward result (embedding's padding_idx, sparse: gradient options)
};
std::string_view arg_role_name(ArgRole r) noexcept;   // "data", "parameter", ...

// The values trial inputs of a tensor argument are drawn from (search_daemon/worker/trial_data.h).
enum class InputRange : uint8_t {
  kAny,           // every distribution as it is: normal, uniform, large, offset, zeros, observed
  kPositive,      // > 0: a variance, a scale (drawn as |x| + 1e-3, no NaN or Inf injected)
  kNonNegative,   // >= 0 (|x|)
  kProbability,   // in [0, 1]
  kIndex,         // integers in [0, bound), bound = the size of another argument's dimension
};
std::string_view input_range_name(InputRange r) noexcept;   // "any", "positive", ...

struct ArgDecl {
  std::string_view name;   // as in the schema
  ArgRole role = ArgRole::kData;
  InputRange range = InputRange::kAny;
  // kIndex: the bound is tensor argument index_arg's dimension index_dim.
  int index_arg = -1;
  int index_dim = -1;
  // Read only where another argument points (embedding's table, indexed by indices): the cost
  // model counts the rows read (as many bytes as the output) instead of the whole tensor.
  bool gathered = false;
};

// How an output's sizes and dtype follow from the arguments (the cost model's bytes; the exact
// strides are the semantics text's to say, and the worker checks them against PyTorch's kernel).
enum class OutputRule : uint8_t {
  kLikeInput0,      // argument 0's sizes and dtype
  kBroadcast,       // the broadcast of the tensor arguments' sizes, argument 0's dtype
  kNormRowStats,    // argument 0's leading sizes, then 1 per normalized dimension (argument 1's length)
  kGroupStats,      // [N, group]: the int arguments 3 and 6 (native_group_norm)
  kBatchNormSaved,  // native_batch_norm's save_mean/save_invstd: in training [C]; in inference
                    // (argument 5, training, false) [0] of running_mean's dtype on CPU, [C] of
                    // the input's accumulation type (float32; float64 for float64) on CUDA
  kReduced,         // argument 0's sizes without the dimensions argument 1 lists (None or []: all
                    // of them), or with them as 1 when argument 2 (keepdim) is true
  kGatheredRows,    // argument 1's sizes followed by argument 0's last dimension, argument 0's dtype
                    // (embedding: indices' sizes + [embedding_dim])
  kCudnnSaved,      // cudnn_batch_norm's save_mean/save_var: [C] in training, [0] in inference;
                    // the dtype of weight (argument 1: float32)
  kCudnnReserve,    // cudnn_batch_norm's reserve space: uint8, [0] in inference (in training its
                    // size is cuDNN's to say; the catalog answers [0])
  kConcat,          // cat: the first element of the tensor list argument 0, with dimension
                    // argument 1 the sum of all elements' (their dtype: the first's)
  kConverted,       // argument 0's sizes in the dtype argument 1 names (a c10::ScalarType code;
                    // None: argument 0's dtype): _to_copy
  kSelf,            // argument 0 itself, written in place and returned (relu_, add_): its dtype,
                    // sizes and strides (OutputSpec::in_place in a plan)
  kIndexReduced,    // as kReduced for argument 1 a single dimension (None: all of them), int64:
                    // argmax's indices
  kResized2d,       // argument 0's sizes with the last two replaced by argument 1 (an int list of 2):
                    // upsample_nearest2d, upsample_bilinear2d, _adaptive_avg_pool2d
  kPooled2d,        // argument 0's sizes with the last two the pooled ones (pool2d_geometry), its
                    // dtype: max_pool2d_with_indices' values, avg_pool2d
  kPooled2dIndices, // the same sizes, int64: max_pool2d_with_indices' indices
};

struct OutputDecl {
  std::string_view name;
  OutputRule rule = OutputRule::kLikeInput0;
};

struct OpEntry {
  std::string_view name;          // "aten::add", as OpSignature::op
  std::string_view overload;      // "Tensor"; "" for the default overload
  std::string_view schema;        // PyTorch's schema line (torch 2.11)
  std::span<const ArgDecl> args;  // one per schema argument, in order
  std::span<const OutputDecl> outputs;
  // Note [Op cost model] in op_catalog.cc: floating-point operations per element of the largest
  // tensor argument.
  double flops_per_element = 0;
  // What it computes and each output's dtype, sizes and strides as torch 2.11 returns them on CPU
  // and CUDA (Note [Operator semantics] in op_catalog.cc): what the LLM is told.
  std::string_view semantics;
  std::string_view inplace;       // its in-place variant ("aten::add_.Tensor"), or ""
  std::string_view out_variant;   // its out= variant ("aten::add.out"), or ""
  // The template families that serve it (search_daemon/proposers/templates), CUDA before CPU; or
  // none, and no_templates_reason says why.
  std::span<const std::string_view> template_families;
  std::string_view no_templates_reason;

  // "aten::add.Tensor": the dispatcher's spelling.
  std::string qualified() const;
};

// The one catalog out variant KFORGE_CATALOG_OUT_VARIANTS leaves out, and why.
inline constexpr std::string_view kOutVariantNotIntercepted = "aten::_to_copy.out";
inline constexpr std::string_view kOutVariantNotInterceptedWhy =
    "its arguments are not aten::_to_copy's followed by out tensors";
// Whether the hook intercepts `out_variant` ("aten::add.out"): it is in KFORGE_CATALOG_OUT_VARIANTS.
bool out_variant_intercepted(std::string_view out_variant) noexcept;

// Every catalog operator, in KFORGE_CATALOG_OPERATORS order.
std::span<const OpEntry> operators() noexcept;
const OpEntry* find(std::string_view name, std::string_view overload) noexcept;
const OpEntry* find(const OpSignature& sig) noexcept;
// Its position in operators(), or kOperatorCount.
size_t index_of(const OpEntry& e) noexcept;

// Why `e` is incomplete ("aten::x: argument 2 has no name"), or "" when it is complete.
std::string incomplete(const OpEntry& e);

// The DType of a c10::ScalarType code as operators take it (dtype=: 6 float32, 5 float16, 15
// bfloat16, 7 float64, ...), or nullopt for a code kforge has no DType for.
std::optional<DType> dtype_of_scalar_type(int64_t code) noexcept;

// The window geometry of max_pool2d_with_indices (arguments 1-5: kernel_size, stride, padding,
// dilation, ceil_mode) or avg_pool2d (arguments 1-6: kernel_size, stride, padding, ceil_mode,
// count_include_pad, divisor_override; dilation 1): one int or two each, stride [] meaning the
// kernel's, over argument 0's last two dimensions, with PyTorch's output size
// (pooling_output_shape: the ceil_mode result shortened when its last window would start in the
// padding). nullopt where PyTorch refuses the arguments (a padding over half the kernel, an output
// of no rows, a non-positive size, a divisor_override of 0) or they do not fit.
struct Pool2d {
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0, dh = 0, dw = 0;
  int64_t h = 0, w = 0, oh = 0, ow = 0;   // input and output height and width
  bool count_include_pad = true;          // avg_pool2d
  int64_t divisor = 0;                    // avg_pool2d's divisor_override; 0: None
};
std::optional<Pool2d> pool2d_geometry(const OpSignature& sig) noexcept;

// The sizes and dtype of each output of a call of `sig` (OutputRule); empty for an operator that
// is not in the catalog or arguments that do not fit its schema.
std::vector<TensorMeta> expected_outputs(const OpSignature& sig);

// Whether output k's values are no part of a call's result because PyTorch leaves them
// uninitialized (native_batch_norm's save_mean and save_invstd in inference on CUDA): only their
// dtype, sizes and strides are compared with PyTorch's (the worker's verification, the hook's
// shadow comparison); a candidate must still write every element.
bool output_values_unspecified(const OpSignature& sig, size_t k);
// The same from the facts it depends on (the hook has IValues, not a signature): argument 0's
// device, and argument 5 (native_batch_norm's training) when it is a bool.
bool output_values_unspecified(const OpEntry& e, size_t k, DeviceType input_device, std::optional<bool> training);

// ---- the cost model ------------------------------------------------------------------------------

struct OpCost {
  double bytes = 0;   // fewest bytes: every tensor argument read once, every output written once
  double flops = 0;   // 0: no FLOP model (not a catalog operator)
};
// With the outputs the plan makes (the worker).
OpCost op_cost(const OpSignature& sig, std::span<const ResolvedOutput> outputs);
// With the outputs the catalog expects (the daemon, before any plan exists).
OpCost op_cost(const OpSignature& sig);

}  // namespace kforge::catalog

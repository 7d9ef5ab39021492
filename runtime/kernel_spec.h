// KernelSpec: one candidate kernel, as proposers produce it and the cache stores it. It is source
// text plus a declarative LaunchPlan; proposers never supply host code. The plan says which
// scratch buffers to allocate, how to allocate each output (dtype, sizes and strides exactly as
// PyTorch's own kernel returns them, or empty_like an input), and the launches in order: entry
// point, grid, block, dynamic shared memory and the kernel's argument list. Every number in a plan
// is a LaunchExpr over the signature's named sizes (launch_expr.h).
//
//   KernelSpec spec;
//   spec.backend = Backend::kCuda;
//   spec.language = SourceLanguage::kCuda;
//   spec.source = cuda_text;
//   spec.entry_points = {"softmax_rows"};
//   spec.plan.outputs = {OutputSpec::like(0)};
//   Launch l;
//   l.entry = "softmax_rows";
//   l.grid = {"numel0 / size0_1", "1", "1"};
//   l.block = {"256", "1", "1"};
//   l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("size0_1", ValueType::kInt32)};
//   spec.plan.launches = {l};
//   KFORGE_RETURN_IF_ERROR(spec.validate());
//   std::string bytes = spec.encode();                   // canonical; spec.id() hashes it
//   StatusOr<ResolvedLaunchPlan> plan = spec.resolve(sig);   // concrete numbers for one signature
//
// Promises:
//   - encode() is canonical: equal specs give identical bytes on every host (see Note [Canonical
//     kernel spec encoding] in kernel_spec.cc), so id() is a stable content address.
//   - decode() accepts only bounded input (limits below) in canonical form (decode(b) succeeds
//     only if encode() of the result is b), never throws, and returns a spec that passed
//     validate(). Every error names the field: "launches[0].grid[1]: launch expression ...".
//   - resolve() turns a valid spec plus a signature into concrete launch numbers, or fails with a
//     message naming the field. Everything it returns is within the launch limits below, so a
//     launcher can pass the numbers straight to the driver.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge {

// Bumped whenever the encoding's layout or meaning changes (it changes every kernel id).
inline constexpr uint32_t kKernelSpecEncodingVersion = 1;

// Decode and validation limits.
inline constexpr size_t kMaxKernelSourceBytes = 1u << 20;
inline constexpr size_t kMaxEntryPoints = 16;
inline constexpr size_t kMaxEntryNameLength = 256;
inline constexpr size_t kMaxCompileOptions = 64;
inline constexpr size_t kMaxCompileOptionLength = 1024;
inline constexpr size_t kMaxScratchBuffers = 16;
inline constexpr size_t kMaxScratchNameLength = 64;
inline constexpr size_t kMaxOutputs = 16;
inline constexpr size_t kMaxLaunches = 16;
inline constexpr size_t kMaxLaunchArgs = 64;
inline constexpr uint32_t kMaxSignatureArgs = 64;   // as OpSignature::decode allows

// Launch limits resolve() enforces (CUDA's; the CPU backend uses the same so plans stay portable).
inline constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxGridYZ = 65535;
inline constexpr int64_t kMaxBlockThreads = 1024;     // x * y * z
inline constexpr int64_t kMaxBlockZ = 64;
inline constexpr int64_t kMaxSharedMemBytes = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxScratchBytes = int64_t{1} << 40;

enum class SourceLanguage : uint8_t { kCuda = 0, kCpp = 1 };
std::string_view source_language_name(SourceLanguage l) noexcept;   // "cuda", "cpp"
StatusOr<SourceLanguage> source_language_from_name(std::string_view name);

// The content address of a KernelSpec: hash128 of its canonical encoding.
using KernelId = SignatureId;

// A device buffer allocated for the duration of the launches, uninitialized.
struct ScratchBuffer {
  std::string name;    // [A-Za-z_][A-Za-z0-9_]*, unique in the plan
  std::string bytes;   // LaunchExpr
  friend bool operator==(const ScratchBuffer&, const ScratchBuffer&) = default;
};

// How one output tensor is allocated.
struct OutputSpec {
  enum class Layout : uint8_t {
    kExplicit = 0,    // dtype, sizes and strides given as expressions (empty_strided)
    kLikeInput = 1,   // torch.empty_like(args[input]) (preserve_format), optionally another dtype;
                      // strides as ATen picks them (Note [empty_like strides] in kernel_spec.cc)
    kInPlace = 2,     // tensor argument `input` itself, written in place and returned (relu_,
                      // add_): nothing is allocated; dtype, sizes and strides are the argument's
                      // (Note [In-place outputs] in kernel_spec.cc)
  };
  Layout layout = Layout::kExplicit;
  uint32_t input = 0;                 // kLikeInput, kInPlace: the signature argument; 0 otherwise
  std::optional<DType> dtype;         // kExplicit: required; kLikeInput: nullopt keeps the input's;
                                      // kInPlace: nullopt
  std::vector<std::string> sizes;     // kExplicit: LaunchExprs, one per dimension
  std::vector<std::string> strides;   // kExplicit: LaunchExprs in elements, as many as sizes

  static OutputSpec explicit_layout(DType dtype, std::vector<std::string> sizes,
                                    std::vector<std::string> strides);
  static OutputSpec like(uint32_t input, std::optional<DType> dtype = std::nullopt);
  static OutputSpec in_place(uint32_t input);
  friend bool operator==(const OutputSpec&, const OutputSpec&) = default;
};

// The C type a kernel parameter has.
enum class ValueType : uint8_t { kPointer = 0, kInt64 = 1, kInt32 = 2, kFloat64 = 3, kFloat32 = 4, kBool = 5 };
std::string_view value_type_name(ValueType t) noexcept;   // "pointer", "int64", ...

// One kernel parameter: where its value comes from.
struct ArgBinding {
  enum class Kind : uint8_t {
    // Data pointer of tensor argument `index` of the signature (type kPointer). An index at or
    // past the signature's argument count names an element of its tensor lists (cat's tensors),
    // counted from there over every list argument's elements in order: with cat(tensors[3],
    // dim), indices 2, 3, 4 are tensors[0..2] (Note [List inputs] in kernel_spec.cc).
    kInput = 0,
    kOutput = 1,    // data pointer of plan output `index` (type kPointer)
    kScratch = 2,   // pointer to scratch buffer `index` (type kPointer)
    kSize = 3,      // the value of LaunchExpr `expr` (type kInt64, or kInt32 with a range check)
    kScalar = 4,    // scalar argument `index` of the signature (int, float or bool), converted
    // The value of tensor argument `index`, a one-element CPU tensor (a Python number passed to a
    // Tensor parameter: `x * 0.5` calls mul.Tensor with 0.5 as a 0-dimensional float64 tensor),
    // read at each call and converted to `type` (int64, int32, float64, float32 or bool). Note
    // [Tensor values] in kernel_spec.cc.
    kTensorValue = 5,
  };
  Kind kind = Kind::kInput;
  uint32_t index = 0;               // 0 for kSize
  ValueType type = ValueType::kPointer;
  std::string expr;                 // kSize only; empty otherwise

  static ArgBinding input(uint32_t arg);
  static ArgBinding output(uint32_t output_index);
  static ArgBinding scratch(uint32_t scratch_index);
  static ArgBinding size(std::string expr, ValueType type = ValueType::kInt64);
  static ArgBinding scalar(uint32_t arg, ValueType type);
  static ArgBinding tensor_value(uint32_t arg, ValueType type);
  friend bool operator==(const ArgBinding&, const ArgBinding&) = default;
};

// One kernel launch. For the CPU backend the grid is the number of parallel tasks and block,
// shared memory are passed to the entry point as the CUDA launch would have them.
struct Launch {
  std::string entry;                                  // one of KernelSpec::entry_points
  std::array<std::string, 3> grid{"1", "1", "1"};     // LaunchExprs
  std::array<std::string, 3> block{"1", "1", "1"};    // LaunchExprs
  std::string shared_mem_bytes = "0";                 // LaunchExpr: dynamic shared memory
  std::vector<ArgBinding> args;                       // in parameter order
  friend bool operator==(const Launch&, const Launch&) = default;
};

struct LaunchPlan {
  std::vector<ScratchBuffer> scratch;
  std::vector<OutputSpec> outputs;     // in the order the operator returns them
  std::vector<Launch> launches;        // run in order on one stream
  friend bool operator==(const LaunchPlan&, const LaunchPlan&) = default;
};

// ---- a plan evaluated for one signature -------------------------------------------------------

struct ResolvedScratch {
  int64_t bytes = 0;
  friend bool operator==(const ResolvedScratch&, const ResolvedScratch&) = default;
};

struct ResolvedOutput {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_bytes = 0;   // the smallest allocation that holds every element
  // OutputSpec::kInPlace: the signature argument this output is (its data pointer is the
  // output's; nothing is allocated); -1 for an allocated output.
  int32_t in_place_of = -1;
  friend bool operator==(const ResolvedOutput&, const ResolvedOutput&) = default;
};

struct ResolvedArg {
  ArgBinding::Kind kind = ArgBinding::Kind::kInput;
  ValueType type = ValueType::kPointer;
  uint32_t index = 0;         // kInput, kOutput, kScratch, kTensorValue: which tensor or buffer
  int64_t int_value = 0;      // kInt64, kInt32 (in range), kBool (0 or 1); kTensorValue: the
                              // tensor's DType, for reading its element
  double real_value = 0;      // kFloat64, kFloat32 (already rounded to float)
  friend bool operator==(const ResolvedArg&, const ResolvedArg&) = default;
};

struct ResolvedLaunch {
  uint32_t entry_index = 0;                // into KernelSpec::entry_points
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_mem_bytes = 0;
  std::vector<ResolvedArg> args;
  friend bool operator==(const ResolvedLaunch&, const ResolvedLaunch&) = default;
};

struct ResolvedLaunchPlan {
  std::vector<ResolvedScratch> scratch;
  std::vector<ResolvedOutput> outputs;
  std::vector<ResolvedLaunch> launches;
  friend bool operator==(const ResolvedLaunchPlan&, const ResolvedLaunchPlan&) = default;
};

// ---- the candidate -----------------------------------------------------------------------------

struct KernelSpec {
  Backend backend = Backend::kCuda;
  SourceLanguage language = SourceLanguage::kCuda;   // kCuda for Backend::kCuda, kCpp for kCpu
  std::string source;                                // at most kMaxKernelSourceBytes, no NUL
  std::vector<std::string> entry_points;             // extern "C" names, [A-Za-z_][A-Za-z0-9_]*
  std::vector<std::string> compile_options;          // passed to NVRTC or the C++ compiler as is
  LaunchPlan plan;

  // Canonical msgpack (arrays only, the format version first).
  std::string encode() const;
  // Parses bytes produced by encode(); bounded, canonical only; the result has passed validate().
  static StatusOr<KernelSpec> decode(std::string_view bytes);
  // Structural checks that need no signature: limits, names, indices, every expression parses,
  // every launch's entry is an entry point. The first failure names its field.
  Status validate() const;
  // Evaluates the plan for `sig` (see the limits above); fails naming the field.
  StatusOr<ResolvedLaunchPlan> resolve(const OpSignature& sig) const;
  // hash128(encode()).
  KernelId id() const;

  friend bool operator==(const KernelSpec&, const KernelSpec&) = default;
};

}  // namespace kforge

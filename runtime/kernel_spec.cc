#include "runtime/kernel_spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/launch_expr.h"
#include "runtime/msgpack_codec.h"
#include "runtime/tensor_layout.h"

namespace kforge {

// Note [Canonical kernel spec encoding]
// One msgpack array, arrays only (no maps, so no key order to agree on):
//   [1 (encoding version), backend, language, source, [entry...], [option...],
//    [[name, bytes]...],                                          scratch
//    [[layout, input, dtype or nil, [size...], [stride...]]...],  outputs
//    [[entry, [gx, gy, gz], [bx, by, bz], shared_mem,
//      [[kind, index, type, expr]...]]...]]                       launches
// Every record has a fixed length whatever its kind; fields a kind does not use hold their
// defaults (0, nil, "" or []), and validate() rejects anything else, so a spec has exactly one
// encoding. msgpack-c packs integers in their smallest form; decode() accepts nothing else (an
// integer in a wider form than needed is rejected), so decoded bytes are always encode()'s. Expressions are stored as their text,
// byte for byte: "a+1" and "a + 1" are different specs with different ids, which is harmless.
// Changing any of this changes every kernel id: bump kKernelSpecEncodingVersion.

namespace {

using codec::Reader;

constexpr size_t kTopLevelFields = 9;

// The encoding is bounded by the field limits; 4 MiB is well above their sum (~3 MiB).
codec::Limits decode_limits() {
  codec::Limits l;
  l.max_bytes = 4u << 20;
  // Twice the largest field limit: a list or string somewhat over its limit reaches the field
  // checks and is named; anything far beyond stops in the parser.
  l.max_array = 2 * std::max({kMaxLaunchArgs, kMaxCompileOptions, kTopLevelFields});
  l.max_map = 0;
  l.max_str = 2 * kMaxKernelSourceBytes;
  l.max_bin = 0;
  l.max_depth = 6;   // top, launches, launch, args, binding (+1 spare)
  return l;
}

Status with_field(const std::string& field, const Status& s) {
  return Status(s.code(), field + ": " + s.message());
}

Status field_error(const std::string& field, const std::string& what) {
  return invalid_argument(field + ": " + what);
}

// The one wording for a list over its limit, shared by decode() and validate() so that both
// report the same message for the same spec.
Status too_many(const std::string& field, size_t n, size_t max) {
  return field_error(field, std::to_string(n) + " elements exceed the limit of " + std::to_string(max));
}

std::string idx(std::string_view base, size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  auto start = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!start(s[0])) return false;
  return std::all_of(s.begin() + 1, s.end(), [&](char c) { return start(c) || (c >= '0' && c <= '9'); });
}

Status check_identifier(const std::string& field, std::string_view s, size_t max_len) {
  if (s.size() > max_len) {
    return field_error(field, "name of " + std::to_string(s.size()) + " bytes exceeds " + std::to_string(max_len));
  }
  if (!is_identifier(s)) {
    return field_error(field, "'" + std::string(s.substr(0, 64)) + "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)");
  }
  return Status();
}

Status check_no_nul(const std::string& field, std::string_view s) {
  const size_t at = s.find('\0');
  if (at != std::string_view::npos) return field_error(field, "contains a NUL byte at offset " + std::to_string(at));
  return Status();
}

Status check_expr(const std::string& field, const std::string& text) {
  auto e = LaunchExpr::parse(text);
  if (!e.ok()) return with_field(field, e.status());
  return Status();
}

std::string_view arg_kind_name(const Arg& a) {
  switch (a.value.index()) {
    case 0: return "None";
    case 1: return "a tensor";
    case 2: return "a tensor list";
    case 3: return "a bool";
    case 4: return "an int";
    case 5: return "a float";
    case 6: return "a string";
    case 7: return "an int list";
  }
  return "unknown";
}

// ---- decode helpers ------------------------------------------------------------------------------

Reader child(const Reader& array, size_t i, std::string path) {
  return Reader(array.object().via.array.ptr[i], std::move(path));
}

// An array of at most `max` elements, named `path` in errors.
StatusOr<size_t> bounded_array(const Reader& r, size_t max) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n > max) return too_many(r.path(), n, max);
  return n;
}

Status read_strings(const Reader& r, size_t max_count, size_t max_len, std::vector<std::string>* out) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, bounded_array(r, max_count));
  out->clear();
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    KFORGE_ASSIGN_OR_RETURN(std::string s, child(r, i, idx(r.path(), i)).str(max_len));
    out->push_back(std::move(s));
  }
  return Status();
}

StatusOr<uint32_t> read_u32(const Reader& r, int64_t max) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, r.i64_in(0, max));
  return static_cast<uint32_t>(v);
}

Status read_expr3(const Reader& r, std::array<std::string, 3>* out) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(3));
  for (size_t i = 0; i < 3; ++i) {
    KFORGE_ASSIGN_OR_RETURN((*out)[i], child(r, i, idx(r.path(), i)).str(LaunchExpr::kMaxTextLength));
  }
  return Status();
}

StatusOr<ArgBinding> read_binding(const Reader& r) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(4));
  ArgBinding b;
  KFORGE_ASSIGN_OR_RETURN(int64_t kind, child(r, 0, r.path() + ".kind").i64_in(0, 5));
  b.kind = static_cast<ArgBinding::Kind>(kind);
  KFORGE_ASSIGN_OR_RETURN(b.index, read_u32(child(r, 1, r.path() + ".index"), std::numeric_limits<uint32_t>::max()));
  KFORGE_ASSIGN_OR_RETURN(int64_t type, child(r, 2, r.path() + ".type").i64_in(0, 5));
  b.type = static_cast<ValueType>(type);
  KFORGE_ASSIGN_OR_RETURN(b.expr, child(r, 3, r.path() + ".expr").str(LaunchExpr::kMaxTextLength));
  return b;
}

StatusOr<Launch> read_launch(const Reader& r) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(5));
  Launch l;
  KFORGE_ASSIGN_OR_RETURN(l.entry, child(r, 0, r.path() + ".entry").str(kMaxEntryNameLength));
  KFORGE_RETURN_IF_ERROR(read_expr3(child(r, 1, r.path() + ".grid"), &l.grid));
  KFORGE_RETURN_IF_ERROR(read_expr3(child(r, 2, r.path() + ".block"), &l.block));
  KFORGE_ASSIGN_OR_RETURN(l.shared_mem_bytes,
                          child(r, 3, r.path() + ".shared_mem_bytes").str(LaunchExpr::kMaxTextLength));
  const Reader args = child(r, 4, r.path() + ".args");
  KFORGE_ASSIGN_OR_RETURN(size_t n, bounded_array(args, kMaxLaunchArgs));
  l.args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    KFORGE_ASSIGN_OR_RETURN(ArgBinding b, read_binding(child(args, i, idx(args.path(), i))));
    l.args.push_back(std::move(b));
  }
  return l;
}

StatusOr<OutputSpec> read_output(const Reader& r) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(5));
  OutputSpec o;
  KFORGE_ASSIGN_OR_RETURN(int64_t layout, child(r, 0, r.path() + ".layout").i64_in(0, 2));
  o.layout = static_cast<OutputSpec::Layout>(layout);
  KFORGE_ASSIGN_OR_RETURN(o.input, read_u32(child(r, 1, r.path() + ".input"), std::numeric_limits<uint32_t>::max()));
  const Reader dt = child(r, 2, r.path() + ".dtype");
  if (!dt.is_nil()) {
    KFORGE_ASSIGN_OR_RETURN(int64_t d, dt.i64_in(0, kDTypeCount - 1));
    o.dtype = static_cast<DType>(d);
  }
  KFORGE_RETURN_IF_ERROR(read_strings(child(r, 3, r.path() + ".sizes"), kMaxTensorRank,
                                      LaunchExpr::kMaxTextLength, &o.sizes));
  KFORGE_RETURN_IF_ERROR(read_strings(child(r, 4, r.path() + ".strides"), kMaxTensorRank,
                                      LaunchExpr::kMaxTextLength, &o.strides));
  return o;
}

// ---- resolve helpers -----------------------------------------------------------------------------

StatusOr<int64_t> eval(const std::string& field, const std::string& text, const SizeMap& sizes) {
  auto e = LaunchExpr::parse(text);
  if (!e.ok()) return with_field(field, e.status());
  auto v = e->evaluate(sizes);
  if (!v.ok()) return with_field(field, v.status());
  return *v;
}

StatusOr<int64_t> eval_in(const std::string& field, const std::string& text, const SizeMap& sizes,
                          int64_t lo, int64_t hi) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, eval(field, text, sizes));
  if (v < lo || v > hi) {
    return out_of_range(field + ": \"" + text.substr(0, 64) + "\" = " + std::to_string(v) + " is outside [" +
                        std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

StatusOr<const TensorMeta*> tensor_arg(const std::string& field, const OpSignature& sig, uint32_t i) {
  if (i >= sig.args.size()) {
    return field_error(field, "argument " + std::to_string(i) + " does not exist: " + sig.op + " has " +
                                  std::to_string(sig.args.size()) + " arguments");
  }
  const auto* t = std::get_if<TensorMeta>(&sig.args[i].value);
  if (t == nullptr) {
    return field_error(field, "argument " + std::to_string(i) + " of " + sig.op + " is " +
                                  std::string(arg_kind_name(sig.args[i])) + ", not a tensor");
  }
  return t;
}

// Note [List inputs]
// ~~~~~~~~~~~~~~~~~~
// An input binding names a tensor argument by its position; the elements of tensor-list
// arguments (cat's tensors) have no position of their own, so they are numbered after the
// arguments: index args.size() + k is the k-th element over all list arguments, in argument
// order. Whoever fills a call's input pointers (the hook's swap call, the worker's candidate
// runs: TrialInputs::tensor_pointers) appends the lists' elements' data pointers after one entry
// per argument, in that order.
StatusOr<const TensorMeta*> input_tensor(const std::string& field, const OpSignature& sig, uint32_t i) {
  if (i < sig.args.size()) return tensor_arg(field, sig, i);
  size_t k = i - sig.args.size();
  for (const Arg& a : sig.args) {
    const auto* list = std::get_if<std::vector<TensorMeta>>(&a.value);
    if (list == nullptr) continue;
    if (k < list->size()) return &(*list)[k];
    k -= list->size();
  }
  return field_error(field, "input " + std::to_string(i) + " does not exist: " + sig.op + " has " +
                                std::to_string(sig.args.size()) + " arguments and " +
                                std::to_string(i - sig.args.size() - k) + " tensor-list elements");
}

// Note [In-place outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// An in-place operator (relu_, add_.Tensor) writes its result into `self` and returns `self`.
// Its plan's output is OutputSpec::in_place(0): resolving gives the argument's own dtype, sizes
// and strides and records which argument it is (ResolvedOutput::in_place_of), and whoever runs
// the plan passes that argument's data pointer as the output's, allocating nothing: the hook
// returns the caller's tensor itself (the same TensorImpl, as PyTorch's kernel does), the worker
// checks the result through the argument after each run, restoring the argument's values before
// the next. A kernel for such a plan reads and writes the same memory, so it must read each
// element before any thread writes it (a pointwise kernel that writes element i from the inputs'
// element i does). Aliasing between `self` and the other inputs is PyTorch's to refuse (a partial
// overlap raises there): the hook runs PyTorch's kernel for a call whose other inputs share
// memory with `self` other than exactly.

// Note [Tensor values]
// ~~~~~~~~~~~~~~~~~~~~
// Python numbers reach Tensor parameters as one-element CPU tensors: `x * 0.5` is mul.Tensor(x,
// tensor(0.5, dtype=float64)), on CPU even when x is on a GPU (PyTorch lets a 0-dimensional CPU
// tensor take part in a CUDA operation as a value). Its value is not in the signature, so a
// schedule that scales by a different number each step keeps one signature and one kernel. A
// kTensorValue binding passes that value: resolving checks that the argument is a one-element CPU
// tensor of a dtype the launcher can read (float64, float32, int64, int32, bool) and records the
// dtype; at each call the launcher reads the element through the host pointer the caller gives as
// the input's buffer and converts it to the binding's type, as c10::Scalar's conversion does.
bool readable_value_dtype(DType t) {
  return t == DType::kFloat64 || t == DType::kFloat32 || t == DType::kInt64 || t == DType::kInt32 ||
         t == DType::kBool;
}

Status resolve_tensor_value(const std::string& field, const OpSignature& sig, const ArgBinding& b,
                            ResolvedArg& out) {
  KFORGE_ASSIGN_OR_RETURN(const TensorMeta* t, tensor_arg(field, sig, b.index));
  const std::string what = "argument " + std::to_string(b.index) + " of " + sig.op;
  if (t->device != DeviceType::kCpu || t->numel() != 1) {
    return field_error(field, what + " is not a one-element CPU tensor (a value binding reads a Python number)");
  }
  if (!readable_value_dtype(t->dtype)) {
    return field_error(field, what + " has dtype " + std::string(dtype_name(t->dtype)) +
                                  ": a value binding reads float64, float32, int64, int32 or bool");
  }
  out.index = b.index;
  out.int_value = static_cast<int64_t>(t->dtype);
  return Status();
}

Status resolve_scalar(const std::string& field, const OpSignature& sig, const ArgBinding& b, ResolvedArg& out) {
  if (b.index >= sig.args.size()) {
    return field_error(field, "argument " + std::to_string(b.index) + " does not exist: " + sig.op + " has " +
                                  std::to_string(sig.args.size()) + " arguments");
  }
  const Arg& a = sig.args[b.index];
  const auto* as_bool = std::get_if<bool>(&a.value);
  const auto* as_int = std::get_if<int64_t>(&a.value);
  const auto* as_real = std::get_if<double>(&a.value);
  if (as_bool == nullptr && as_int == nullptr && as_real == nullptr) {
    return field_error(field, "argument " + std::to_string(b.index) + " of " + sig.op + " is " +
                                  std::string(arg_kind_name(a)) + ", not a scalar");
  }
  const std::string what = "argument " + std::to_string(b.index) + " (";
  switch (b.type) {
    case ValueType::kBool:
      out.int_value = as_bool ? *as_bool : as_int ? (*as_int != 0) : (*as_real != 0.0);
      return Status();
    case ValueType::kFloat64:
    case ValueType::kFloat32: {
      double d = as_bool ? (*as_bool ? 1.0 : 0.0) : as_int ? static_cast<double>(*as_int) : *as_real;
      if (b.type == ValueType::kFloat32) {
        const auto f = static_cast<float>(d);
        if (std::isfinite(d) && !std::isfinite(f)) {
          return out_of_range(field + ": " + what + std::to_string(d) + ") does not fit float32");
        }
        d = static_cast<double>(f);
      }
      out.real_value = d;
      return Status();
    }
    case ValueType::kInt64:
    case ValueType::kInt32: {
      int64_t v = 0;
      if (as_bool) {
        v = *as_bool ? 1 : 0;
      } else if (as_int) {
        v = *as_int;
      } else {
        // A float bound as an integer must be one exactly: silently truncating a scale factor
        // would give a kernel that is wrong only for some inputs.
        const double d = *as_real;
        if (!(d >= -0x1p63 && d < 0x1p63) || std::trunc(d) != d) {
          return out_of_range(field + ": " + what + std::to_string(d) + ") is not an integer in int64");
        }
        v = static_cast<int64_t>(d);
      }
      if (b.type == ValueType::kInt32 &&
          (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())) {
        return out_of_range(field + ": " + what + std::to_string(v) + ") does not fit int32");
      }
      out.int_value = v;
      return Status();
    }
    case ValueType::kPointer: break;
  }
  return internal_error(field + ": scalar bound as a pointer passed validate()");
}

}  // namespace

// ---- names ---------------------------------------------------------------------------------------

std::string_view source_language_name(SourceLanguage l) noexcept {
  switch (l) {
    case SourceLanguage::kCuda: return "cuda";
    case SourceLanguage::kCpp: return "cpp";
  }
  return "unknown";
}

StatusOr<SourceLanguage> source_language_from_name(std::string_view name) {
  if (name == "cuda") return SourceLanguage::kCuda;
  if (name == "cpp") return SourceLanguage::kCpp;
  return invalid_argument("unknown source language '" + std::string(name.substr(0, 64)) + "' (known: cuda, cpp)");
}

std::string_view value_type_name(ValueType t) noexcept {
  switch (t) {
    case ValueType::kPointer: return "pointer";
    case ValueType::kInt64: return "int64";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat64: return "float64";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
  }
  return "unknown";
}

OutputSpec OutputSpec::explicit_layout(DType dtype, std::vector<std::string> sizes, std::vector<std::string> strides) {
  OutputSpec o;
  o.layout = Layout::kExplicit;
  o.dtype = dtype;
  o.sizes = std::move(sizes);
  o.strides = std::move(strides);
  return o;
}

OutputSpec OutputSpec::like(uint32_t input, std::optional<DType> dtype) {
  OutputSpec o;
  o.layout = Layout::kLikeInput;
  o.input = input;
  o.dtype = dtype;
  return o;
}

OutputSpec OutputSpec::in_place(uint32_t input) {
  OutputSpec o;
  o.layout = Layout::kInPlace;
  o.input = input;
  return o;
}

ArgBinding ArgBinding::input(uint32_t arg) { return ArgBinding{Kind::kInput, arg, ValueType::kPointer, {}}; }
ArgBinding ArgBinding::output(uint32_t output_index) {
  return ArgBinding{Kind::kOutput, output_index, ValueType::kPointer, {}};
}
ArgBinding ArgBinding::scratch(uint32_t scratch_index) {
  return ArgBinding{Kind::kScratch, scratch_index, ValueType::kPointer, {}};
}
ArgBinding ArgBinding::size(std::string expr, ValueType type) {
  return ArgBinding{Kind::kSize, 0, type, std::move(expr)};
}
ArgBinding ArgBinding::scalar(uint32_t arg, ValueType type) { return ArgBinding{Kind::kScalar, arg, type, {}}; }
ArgBinding ArgBinding::tensor_value(uint32_t arg, ValueType type) {
  return ArgBinding{Kind::kTensorValue, arg, type, {}};
}

// ---- encode / decode -----------------------------------------------------------------------------

std::string KernelSpec::encode() const {
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  auto pack_strings = [&](const auto& v) {
    pk.pack_array(static_cast<uint32_t>(v.size()));
    for (const std::string& s : v) pk.pack(s);
  };
  pk.pack_array(kTopLevelFields);
  pk.pack(kKernelSpecEncodingVersion);
  pk.pack(static_cast<uint8_t>(backend));
  pk.pack(static_cast<uint8_t>(language));
  pk.pack(source);
  pack_strings(entry_points);
  pack_strings(compile_options);
  pk.pack_array(static_cast<uint32_t>(plan.scratch.size()));
  for (const ScratchBuffer& s : plan.scratch) {
    pk.pack_array(2);
    pk.pack(s.name);
    pk.pack(s.bytes);
  }
  pk.pack_array(static_cast<uint32_t>(plan.outputs.size()));
  for (const OutputSpec& o : plan.outputs) {
    pk.pack_array(5);
    pk.pack(static_cast<uint8_t>(o.layout));
    pk.pack(o.input);
    if (o.dtype) {
      pk.pack(static_cast<uint8_t>(*o.dtype));
    } else {
      pk.pack_nil();
    }
    pack_strings(o.sizes);
    pack_strings(o.strides);
  }
  pk.pack_array(static_cast<uint32_t>(plan.launches.size()));
  for (const Launch& l : plan.launches) {
    pk.pack_array(5);
    pk.pack(l.entry);
    pack_strings(l.grid);
    pack_strings(l.block);
    pk.pack(l.shared_mem_bytes);
    pk.pack_array(static_cast<uint32_t>(l.args.size()));
    for (const ArgBinding& b : l.args) {
      pk.pack_array(4);
      pk.pack(static_cast<uint8_t>(b.kind));
      pk.pack(b.index);
      pk.pack(static_cast<uint8_t>(b.type));
      pk.pack(b.expr);
    }
  }
  return std::string(buf.data(), buf.size());
}

StatusOr<KernelSpec> KernelSpec::decode(std::string_view bytes) {
  auto oh = codec::parse(bytes, decode_limits());
  if (!oh.ok()) return Status(oh.status().code(), "kernel spec: " + oh.status().message());
  const Reader top(oh->get(), "kernel spec");
  KFORGE_RETURN_IF_ERROR(top.expect_array(kTopLevelFields));
  KFORGE_ASSIGN_OR_RETURN(int64_t version, child(top, 0, "version").i64());
  if (version != kKernelSpecEncodingVersion) {
    return field_error("version", "kernel spec encoding version " + std::to_string(version) +
                                      " is not supported (expected " + std::to_string(kKernelSpecEncodingVersion) + ")");
  }
  KernelSpec s;
  KFORGE_ASSIGN_OR_RETURN(int64_t backend, child(top, 1, "backend").i64_in(0, 1));
  s.backend = static_cast<Backend>(backend);
  KFORGE_ASSIGN_OR_RETURN(int64_t language, child(top, 2, "language").i64_in(0, 1));
  s.language = static_cast<SourceLanguage>(language);
  KFORGE_ASSIGN_OR_RETURN(s.source, child(top, 3, "source").str(kMaxKernelSourceBytes));
  KFORGE_RETURN_IF_ERROR(
      read_strings(child(top, 4, "entry_points"), kMaxEntryPoints, kMaxEntryNameLength, &s.entry_points));
  KFORGE_RETURN_IF_ERROR(read_strings(child(top, 5, "compile_options"), kMaxCompileOptions,
                                      kMaxCompileOptionLength, &s.compile_options));

  const Reader scratch = child(top, 6, "scratch");
  KFORGE_ASSIGN_OR_RETURN(size_t n_scratch, bounded_array(scratch, kMaxScratchBuffers));
  for (size_t i = 0; i < n_scratch; ++i) {
    const Reader r = child(scratch, i, idx("scratch", i));
    KFORGE_RETURN_IF_ERROR(r.expect_array(2));
    ScratchBuffer b;
    KFORGE_ASSIGN_OR_RETURN(b.name, child(r, 0, r.path() + ".name").str(kMaxScratchNameLength));
    KFORGE_ASSIGN_OR_RETURN(b.bytes, child(r, 1, r.path() + ".bytes").str(LaunchExpr::kMaxTextLength));
    s.plan.scratch.push_back(std::move(b));
  }

  const Reader outputs = child(top, 7, "outputs");
  KFORGE_ASSIGN_OR_RETURN(size_t n_outputs, bounded_array(outputs, kMaxOutputs));
  for (size_t i = 0; i < n_outputs; ++i) {
    KFORGE_ASSIGN_OR_RETURN(OutputSpec o, read_output(child(outputs, i, idx("outputs", i))));
    s.plan.outputs.push_back(std::move(o));
  }

  const Reader launches = child(top, 8, "launches");
  KFORGE_ASSIGN_OR_RETURN(size_t n_launches, bounded_array(launches, kMaxLaunches));
  for (size_t i = 0; i < n_launches; ++i) {
    KFORGE_ASSIGN_OR_RETURN(Launch l, read_launch(child(launches, i, idx("launches", i))));
    s.plan.launches.push_back(std::move(l));
  }

  KFORGE_RETURN_IF_ERROR(s.validate());
  // Only the canonical form is accepted, so stored bytes always hash to the spec's id.
  if (s.encode() != bytes) return invalid_argument("kernel spec: not in canonical encoding");
  return s;
}

KernelId KernelSpec::id() const { return hash128(encode()); }

// ---- validate ------------------------------------------------------------------------------------

Status KernelSpec::validate() const {
  if (static_cast<uint8_t>(backend) > 1) return field_error("backend", "unknown backend");
  if (static_cast<uint8_t>(language) > 1) return field_error("language", "unknown source language");
  const SourceLanguage expected = backend == Backend::kCuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  if (language != expected) {
    return field_error("language", std::string(source_language_name(language)) + " source cannot target the " +
                                       std::string(backend_name(backend)) + " backend (expected " +
                                       std::string(source_language_name(expected)) + ")");
  }
  if (source.empty()) return field_error("source", "empty");
  if (source.size() > kMaxKernelSourceBytes) {
    return field_error("source", std::to_string(source.size()) + " bytes exceed the limit of " +
                                     std::to_string(kMaxKernelSourceBytes));
  }
  KFORGE_RETURN_IF_ERROR(check_no_nul("source", source));

  if (entry_points.empty()) return field_error("entry_points", "at least one entry point is required");
  if (entry_points.size() > kMaxEntryPoints) return too_many("entry_points", entry_points.size(), kMaxEntryPoints);
  for (size_t i = 0; i < entry_points.size(); ++i) {
    KFORGE_RETURN_IF_ERROR(check_identifier(idx("entry_points", i), entry_points[i], kMaxEntryNameLength));
    for (size_t j = 0; j < i; ++j) {
      if (entry_points[j] == entry_points[i]) {
        return field_error(idx("entry_points", i), "duplicate of entry_points[" + std::to_string(j) + "]");
      }
    }
  }

  if (compile_options.size() > kMaxCompileOptions) {
    return too_many("compile_options", compile_options.size(), kMaxCompileOptions);
  }
  for (size_t i = 0; i < compile_options.size(); ++i) {
    const std::string f = idx("compile_options", i);
    if (compile_options[i].size() > kMaxCompileOptionLength) {
      return field_error(f, std::to_string(compile_options[i].size()) + " bytes exceed the limit of " +
                                std::to_string(kMaxCompileOptionLength));
    }
    KFORGE_RETURN_IF_ERROR(check_no_nul(f, compile_options[i]));
  }

  if (plan.scratch.size() > kMaxScratchBuffers) return too_many("scratch", plan.scratch.size(), kMaxScratchBuffers);
  for (size_t i = 0; i < plan.scratch.size(); ++i) {
    const std::string f = idx("scratch", i);
    KFORGE_RETURN_IF_ERROR(check_identifier(f + ".name", plan.scratch[i].name, kMaxScratchNameLength));
    for (size_t j = 0; j < i; ++j) {
      if (plan.scratch[j].name == plan.scratch[i].name) {
        return field_error(f + ".name", "duplicate of scratch[" + std::to_string(j) + "].name");
      }
    }
    KFORGE_RETURN_IF_ERROR(check_expr(f + ".bytes", plan.scratch[i].bytes));
  }

  if (plan.outputs.size() > kMaxOutputs) return too_many("outputs", plan.outputs.size(), kMaxOutputs);
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    const OutputSpec& o = plan.outputs[i];
    const std::string f = idx("outputs", i);
    if (o.dtype && static_cast<uint8_t>(*o.dtype) >= kDTypeCount) return field_error(f + ".dtype", "unknown dtype");
    switch (o.layout) {
      case OutputSpec::Layout::kExplicit:
        if (!o.dtype) return field_error(f + ".dtype", "required for an explicit layout");
        if (o.input != 0) return field_error(f + ".input", "must be 0 for an explicit layout");
        if (o.sizes.size() > kMaxTensorRank) return too_many(f + ".sizes", o.sizes.size(), kMaxTensorRank);
        if (o.strides.size() != o.sizes.size()) {
          return field_error(f + ".strides", std::to_string(o.strides.size()) + " strides for " +
                                                 std::to_string(o.sizes.size()) + " sizes");
        }
        for (size_t d = 0; d < o.sizes.size(); ++d) {
          KFORGE_RETURN_IF_ERROR(check_expr(idx(f + ".sizes", d), o.sizes[d]));
          KFORGE_RETURN_IF_ERROR(check_expr(idx(f + ".strides", d), o.strides[d]));
        }
        break;
      case OutputSpec::Layout::kLikeInput:
        if (o.input >= kMaxSignatureArgs) {
          return field_error(f + ".input", "argument " + std::to_string(o.input) + " is beyond the " +
                                               std::to_string(kMaxSignatureArgs) + " a signature can have");
        }
        if (!o.sizes.empty() || !o.strides.empty()) {
          return field_error(f, "an output like an input takes no sizes or strides");
        }
        break;
      case OutputSpec::Layout::kInPlace:
        if (o.input >= kMaxSignatureArgs) {
          return field_error(f + ".input", "argument " + std::to_string(o.input) + " is beyond the " +
                                               std::to_string(kMaxSignatureArgs) + " a signature can have");
        }
        if (o.dtype) return field_error(f + ".dtype", "an output written in place has its argument's dtype");
        if (!o.sizes.empty() || !o.strides.empty()) {
          return field_error(f, "an output written in place takes no sizes or strides");
        }
        for (size_t j = 0; j < i; ++j) {
          if (plan.outputs[j].layout == OutputSpec::Layout::kInPlace && plan.outputs[j].input == o.input) {
            return field_error(f + ".input", "argument " + std::to_string(o.input) + " is already output " +
                                                 std::to_string(j));
          }
        }
        break;
      default: return field_error(f + ".layout", "unknown layout");
    }
  }

  if (plan.launches.empty()) return field_error("launches", "at least one launch is required");
  if (plan.launches.size() > kMaxLaunches) return too_many("launches", plan.launches.size(), kMaxLaunches);
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    const Launch& l = plan.launches[i];
    const std::string f = idx("launches", i);
    if (std::find(entry_points.begin(), entry_points.end(), l.entry) == entry_points.end()) {
      return field_error(f + ".entry", "'" + l.entry.substr(0, 64) + "' is not one of the entry points");
    }
    for (size_t d = 0; d < 3; ++d) {
      KFORGE_RETURN_IF_ERROR(check_expr(idx(f + ".grid", d), l.grid[d]));
      KFORGE_RETURN_IF_ERROR(check_expr(idx(f + ".block", d), l.block[d]));
    }
    KFORGE_RETURN_IF_ERROR(check_expr(f + ".shared_mem_bytes", l.shared_mem_bytes));
    if (l.args.size() > kMaxLaunchArgs) return too_many(f + ".args", l.args.size(), kMaxLaunchArgs);
    for (size_t a = 0; a < l.args.size(); ++a) {
      const ArgBinding& b = l.args[a];
      const std::string fa = idx(f + ".args", a);
      if (static_cast<uint8_t>(b.type) > static_cast<uint8_t>(ValueType::kBool)) {
        return field_error(fa + ".type", "unknown value type");
      }
      const bool pointer = b.kind == ArgBinding::Kind::kInput || b.kind == ArgBinding::Kind::kOutput ||
                           b.kind == ArgBinding::Kind::kScratch;
      if (pointer && b.type != ValueType::kPointer) {
        return field_error(fa + ".type", "a tensor or buffer is passed as a pointer, not " +
                                             std::string(value_type_name(b.type)));
      }
      if (b.kind != ArgBinding::Kind::kSize && !b.expr.empty()) {
        return field_error(fa + ".expr", "only a size binding has an expression");
      }
      switch (b.kind) {
        case ArgBinding::Kind::kInput:
        case ArgBinding::Kind::kScalar:
        case ArgBinding::Kind::kTensorValue:
          if (b.index >= kMaxSignatureArgs) {
            return field_error(fa + ".index", "argument " + std::to_string(b.index) + " is beyond the " +
                                                  std::to_string(kMaxSignatureArgs) + " a signature can have");
          }
          if (b.kind != ArgBinding::Kind::kInput && b.type == ValueType::kPointer) {
            return field_error(fa + ".type", "a scalar is passed by value, not as a pointer");
          }
          break;
        case ArgBinding::Kind::kOutput:
          if (b.index >= plan.outputs.size()) {
            return field_error(fa + ".index", "output " + std::to_string(b.index) + " does not exist (the plan has " +
                                                  std::to_string(plan.outputs.size()) + ")");
          }
          break;
        case ArgBinding::Kind::kScratch:
          if (b.index >= plan.scratch.size()) {
            return field_error(fa + ".index", "scratch buffer " + std::to_string(b.index) +
                                                  " does not exist (the plan has " +
                                                  std::to_string(plan.scratch.size()) + ")");
          }
          break;
        case ArgBinding::Kind::kSize:
          if (b.index != 0) return field_error(fa + ".index", "must be 0 for a size binding");
          if (b.type != ValueType::kInt64 && b.type != ValueType::kInt32) {
            return field_error(fa + ".type", "a size is passed as int64 or int32, not " +
                                                 std::string(value_type_name(b.type)));
          }
          KFORGE_RETURN_IF_ERROR(check_expr(fa + ".expr", b.expr));
          break;
        default: return field_error(fa + ".kind", "unknown binding kind");
      }
    }
  }
  return Status();
}

// ---- resolve -------------------------------------------------------------------------------------

StatusOr<ResolvedLaunchPlan> KernelSpec::resolve(const OpSignature& sig) const {
  KFORGE_RETURN_IF_ERROR(validate());
  if (sig.target.backend != backend) {
    return field_error("backend", "the spec is for " + std::string(backend_name(backend)) + ", the signature targets " +
                                      std::string(backend_name(sig.target.backend)));
  }
  const SizeMap sizes = sig.named_sizes();
  ResolvedLaunchPlan out;

  out.scratch.reserve(plan.scratch.size());
  for (size_t i = 0; i < plan.scratch.size(); ++i) {
    KFORGE_ASSIGN_OR_RETURN(int64_t bytes,
                            eval_in(idx("scratch", i) + ".bytes", plan.scratch[i].bytes, sizes, 0, kMaxScratchBytes));
    out.scratch.push_back(ResolvedScratch{bytes});
  }

  out.outputs.reserve(plan.outputs.size());
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    const OutputSpec& o = plan.outputs[i];
    const std::string f = idx("outputs", i);
    ResolvedOutput r;
    if (o.layout == OutputSpec::Layout::kInPlace) {
      // Note [In-place outputs]: the argument as it is, whatever its layout.
      KFORGE_ASSIGN_OR_RETURN(const TensorMeta* t, tensor_arg(f + ".input", sig, o.input));
      r.dtype = t->dtype;
      r.sizes = t->sizes;
      r.strides = t->strides;
      r.in_place_of = static_cast<int32_t>(o.input);
    } else if (o.layout == OutputSpec::Layout::kLikeInput) {
      KFORGE_ASSIGN_OR_RETURN(const TensorMeta* t, tensor_arg(f + ".input", sig, o.input));
      r.dtype = o.dtype.value_or(t->dtype);
      r.sizes = t->sizes;
      if (is_non_overlapping_and_dense(t->sizes, t->strides)) {
        r.strides = t->strides;
      } else {
        auto strides = infer_dense_strides(t->sizes, t->strides);
        if (!strides.ok()) return with_field(f, strides.status());
        r.strides = std::move(strides).value();
      }
    } else {
      r.dtype = *o.dtype;
      for (size_t d = 0; d < o.sizes.size(); ++d) {
        KFORGE_ASSIGN_OR_RETURN(int64_t size, eval_in(idx(f + ".sizes", d), o.sizes[d], sizes, 0,
                                                      std::numeric_limits<int64_t>::max()));
        KFORGE_ASSIGN_OR_RETURN(int64_t stride, eval_in(idx(f + ".strides", d), o.strides[d], sizes, 0,
                                                        std::numeric_limits<int64_t>::max()));
        r.sizes.push_back(size);
        r.strides.push_back(stride);
      }
    }
    auto bytes = storage_bytes(r.sizes, r.strides, r.dtype);
    if (!bytes.ok()) return with_field(f, bytes.status());
    r.storage_bytes = *bytes;
    out.outputs.push_back(std::move(r));
  }

  out.launches.reserve(plan.launches.size());
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    const Launch& l = plan.launches[i];
    const std::string f = idx("launches", i);
    ResolvedLaunch r;
    r.entry_index = static_cast<uint32_t>(
        std::find(entry_points.begin(), entry_points.end(), l.entry) - entry_points.begin());
    for (size_t d = 0; d < 3; ++d) {
      KFORGE_ASSIGN_OR_RETURN(int64_t g, eval_in(idx(f + ".grid", d), l.grid[d], sizes, 1,
                                                 d == 0 ? kMaxGridX : kMaxGridYZ));
      r.grid[d] = static_cast<uint32_t>(g);
      KFORGE_ASSIGN_OR_RETURN(int64_t b, eval_in(idx(f + ".block", d), l.block[d], sizes, 1,
                                                 d == 2 ? kMaxBlockZ : kMaxBlockThreads));
      r.block[d] = static_cast<uint32_t>(b);
    }
    const int64_t threads = int64_t{r.block[0]} * r.block[1] * r.block[2];   // <= 1024^2 * 64
    if (threads > kMaxBlockThreads) {
      return out_of_range(f + ".block: " + std::to_string(r.block[0]) + " x " + std::to_string(r.block[1]) + " x " +
                          std::to_string(r.block[2]) + " = " + std::to_string(threads) +
                          " threads exceed the limit of " + std::to_string(kMaxBlockThreads));
    }
    KFORGE_ASSIGN_OR_RETURN(int64_t smem,
                            eval_in(f + ".shared_mem_bytes", l.shared_mem_bytes, sizes, 0, kMaxSharedMemBytes));
    r.shared_mem_bytes = static_cast<uint32_t>(smem);

    r.args.reserve(l.args.size());
    for (size_t a = 0; a < l.args.size(); ++a) {
      const ArgBinding& b = l.args[a];
      const std::string fa = idx(f + ".args", a);
      ResolvedArg ra;
      ra.kind = b.kind;
      ra.type = b.type;
      switch (b.kind) {
        case ArgBinding::Kind::kInput: {
          KFORGE_ASSIGN_OR_RETURN(const TensorMeta* t, input_tensor(fa, sig, b.index));
          // A CUDA kernel cannot read host memory: a CPU tensor in a CUDA call (a Python
          // number) reaches it only through a value binding (Note [Tensor values]). The hook
          // lets such tensors through to the entry on the strength of this check.
          if (backend == Backend::kCuda && t->device != DeviceType::kCuda) {
            return field_error(fa, "input " + std::to_string(b.index) + " of " + sig.op +
                                       " is a CPU tensor: a CUDA kernel reads it only as a value (tensor_value binding)");
          }
          ra.index = b.index;
          break;
        }
        case ArgBinding::Kind::kOutput:
        case ArgBinding::Kind::kScratch: ra.index = b.index; break;
        case ArgBinding::Kind::kSize: {
          const bool i32 = b.type == ValueType::kInt32;
          KFORGE_ASSIGN_OR_RETURN(
              ra.int_value,
              eval_in(fa + ".expr", b.expr, sizes,
                      i32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min(),
                      i32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max()));
          break;
        }
        case ArgBinding::Kind::kScalar: KFORGE_RETURN_IF_ERROR(resolve_scalar(fa, sig, b, ra)); break;
        case ArgBinding::Kind::kTensorValue: KFORGE_RETURN_IF_ERROR(resolve_tensor_value(fa, sig, b, ra)); break;
      }
      r.args.push_back(ra);
    }
    out.launches.push_back(std::move(r));
  }
  return out;
}

}  // namespace kforge

#include "interposer/hook/stack_signature.h"

#include <c10/core/TensorImpl.h>

#include <array>
#include <cstdio>
#include <limits>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kforge::hook {

namespace {

// OpSignature::decode's limits: a signature the daemon could not decode is useless to report.
constexpr size_t kMaxListLen = 256;
constexpr size_t kMaxStringArg = 1024;

struct TensorFacts {
  DType dtype = DType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  int device_index = -1;
  const int64_t* sizes = nullptr;     // valid while the tensor lives (the call's duration)
  const int64_t* strides = nullptr;
  size_t rank = 0;
  uint32_t alignment = kMaxAlignment;
};

constexpr bool dtype_of(c10::ScalarType t, DType* out) noexcept {
  switch (t) {
    case c10::ScalarType::Float: *out = DType::kFloat32; return true;
    case c10::ScalarType::Double: *out = DType::kFloat64; return true;
    case c10::ScalarType::Half: *out = DType::kFloat16; return true;
    case c10::ScalarType::BFloat16: *out = DType::kBFloat16; return true;
    case c10::ScalarType::Char: *out = DType::kInt8; return true;
    case c10::ScalarType::Byte: *out = DType::kUInt8; return true;
    case c10::ScalarType::Short: *out = DType::kInt16; return true;
    case c10::ScalarType::Int: *out = DType::kInt32; return true;
    case c10::ScalarType::Long: *out = DType::kInt64; return true;
    case c10::ScalarType::Bool: *out = DType::kBool; return true;
    case c10::ScalarType::ComplexFloat: *out = DType::kComplex64; return true;
    case c10::ScalarType::ComplexDouble: *out = DType::kComplex128; return true;
    case c10::ScalarType::Float8_e4m3fn: *out = DType::kFloat8E4M3FN; return true;
    case c10::ScalarType::Float8_e5m2: *out = DType::kFloat8E5M2; return true;
    default: return false;
  }
}

// dtype_of as a table, so the fast path reads one byte instead of taking an indirect jump.
constexpr size_t kScalarTypes = static_cast<size_t>(c10::ScalarType::NumOptions);
constexpr int kNoDType = -1;
constexpr std::array<int8_t, kScalarTypes> kDTypeOf = [] {
  std::array<int8_t, kScalarTypes> table{};
  for (size_t i = 0; i < kScalarTypes; ++i) {
    DType d{};
    table[i] = dtype_of(static_cast<c10::ScalarType>(i), &d) ? static_cast<int8_t>(d) : int8_t{kNoDType};
  }
  return table;
}();

[[gnu::always_inline]] inline bool to_dtype(c10::ScalarType t, DType* out) noexcept {
  const auto i = static_cast<size_t>(t);
  if (i >= kScalarTypes || kDTypeOf[i] == kNoDType) return false;
  *out = static_cast<DType>(kDTypeOf[i]);
  return true;
}

// A defined tensor's metadata, read from the TensorImpl without touching its refcount. False for
// tensors a signature cannot describe. May throw (torch's checks); callers catch. Inlined, so the
// facts stay in registers on the fast path.
[[gnu::always_inline]] inline bool tensor_facts(const c10::TensorImpl& impl, TensorFacts& f) {
  // Strided dense tensors only; symbolic shapes and storage-less tensors have no concrete layout.
  if (impl.layout() != c10::kStrided || impl.has_symbolic_sizes_strides() || !impl.has_storage()) {
    return false;
  }
  if (!to_dtype(impl.dtype().toScalarType(), &f.dtype)) return false;
  const c10::Device device = impl.device();
  if (device.is_cpu()) {
    f.device = DeviceType::kCpu;
  } else if (device.is_cuda()) {
    f.device = DeviceType::kCuda;
  } else {
    return false;
  }
  f.device_index = device.index();
  const c10::IntArrayRef sizes = impl.sizes();
  const c10::IntArrayRef strides = impl.strides();
  if (sizes.size() > kMaxTensorRank || strides.size() != sizes.size()) return false;
  f.sizes = sizes.data();
  f.strides = strides.data();
  f.rank = sizes.size();
  // data() includes the storage offset, and is null for a tensor with no elements.
  f.alignment = pointer_alignment(impl.data());
  return true;
}

bool tensor_facts(const at::Tensor& t, TensorFacts& f) {
  return t.defined() && tensor_facts(*t.unsafeGetTensorImpl(), f);
}

// A device argument (_to_copy's device=) as a string: "cpu", "cuda", "cuda:1". Other device types
// give "" (the call is not described: PyTorch's kernel runs, counted as unknown).
std::string_view device_text(const c10::Device& d, char (&buf)[24]) noexcept {
  if (d.is_cpu()) return "cpu";
  if (!d.is_cuda()) return {};
  if (!d.has_index()) return "cuda";
  const int n = std::snprintf(buf, sizeof buf, "cuda:%d", static_cast<int>(d.index()));
  return n > 0 && n < static_cast<int>(sizeof buf) ? std::string_view(buf, static_cast<size_t>(n)) : std::string_view();
}

// Note [A device argument's target]
// A call whose tensors are all on the CPU can still be a CUDA call: PyTorch dispatches
// `_to_copy(cpu_tensor, device="cuda:0")` (every `.to("cuda")`, every Module.to of a CPU model) to
// the CUDA key, as the copy's destination decides. Its target is then that device: a Device
// argument naming a CUDA device with an index sets cuda_index when no CUDA tensor before it has.
// Without this such calls had no CUDA target, were counted as unknown, and (the first call of an
// operator being the one a thread always observes) used up _to_copy@CUDA's first sight on a
// model's weights moving to the GPU, so the model's own casts on the GPU went unseen.
void note_device_target(const c10::Device& d, int& cuda_index) noexcept {
  if (cuda_index < 0 && d.is_cuda() && d.has_index()) cuda_index = d.index();
}

// Note [One classification, two encoders]
// visit_args() decides what each argument is and hands it to a sink: WriterSink writes the
// canonical bytes (fast path), BuilderSink builds the OpSignature (slow path). Because the
// decisions are shared, a disagreement between the two ids can only come from the encoders,
// which the recorder checks at every first sight of a signature.
template <typename Sink>
bool visit_arg(const c10::IValue& v, Sink& sink, int& cuda_index) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      sink.none();
      return true;
    }
    TensorFacts f;
    if (!tensor_facts(t, f)) return false;
    if (cuda_index < 0 && f.device == DeviceType::kCuda) cuda_index = f.device_index;
    sink.tensor(f);
    return true;
  }
  if (v.isNone()) {
    sink.none();
    return true;
  }
  if (v.isBool()) {
    sink.boolean(v.toBool());
    return true;
  }
  if (v.isInt()) {
    sink.integer(v.toInt());
    return true;
  }
  if (v.isDouble()) {
    sink.real(v.toDouble());
    return true;
  }
  if (v.isDevice()) {
    char buf[24];
    const std::string_view s = device_text(v.toDevice(), buf);
    if (s.empty()) return false;
    note_device_target(v.toDevice(), cuda_index);
    sink.string(s);
    return true;
  }
  if (v.isString()) {
    const std::string_view s = v.toStringView();
    if (s.size() > kMaxStringArg) return false;
    sink.string(s);
    return true;
  }
  if (v.isList()) {
    const c10::ArrayRef<c10::IValue> list = v.toListRef();
    const size_t n = list.size();
    if (n > kMaxListLen) return false;
    // An empty list says what it is only through its element type (a rarer, slower check).
    const bool ints = n == 0 ? v.isIntList() : list[0].isInt();
    const bool tensors = !ints && (n == 0 ? v.isTensorList() : list[0].isTensor());
    if (ints) {
      sink.int_list(static_cast<uint32_t>(n));
      for (const c10::IValue& e : list) {
        if (!e.isInt()) return false;
        sink.int_list_item(e.toInt());
      }
      return true;
    }
    if (tensors) {
      sink.tensor_list(static_cast<uint32_t>(n));
      for (const c10::IValue& e : list) {
        TensorFacts f;
        if (!e.isTensor() || !tensor_facts(e.toTensor(), f)) return false;
        if (cuda_index < 0 && f.device == DeviceType::kCuda) cuda_index = f.device_index;
        sink.tensor_list_item(f);
      }
      return true;
    }
    return false;
  }
  return false;   // complex and symbolic scalars, dicts, objects, ...
}

// False: a value a signature cannot describe.
template <typename Sink>
bool visit_args(const OpIdentity& op, const c10::IValue* args, Sink& sink, int& cuda_index) {
  for (uint32_t i = 0; i < op.num_arguments; ++i) {
    if (!visit_arg(args[i], sink, cuda_index)) return false;
  }
  return true;
}

struct WriterSink {
  SignatureWriter& w;
  void none() { w.none(); }
  void tensor(const TensorFacts& f) { w.tensor(f.dtype, f.device, f.sizes, f.strides, f.rank, f.alignment); }
  void tensor_list(uint32_t n) { w.tensor_list(n); }
  void tensor_list_item(const TensorFacts& f) {
    w.tensor_list_item(f.dtype, f.device, f.sizes, f.strides, f.rank, f.alignment);
  }
  void boolean(bool b) { w.boolean(b); }
  void integer(int64_t i) { w.integer(i); }
  void real(double d) { w.real(d); }
  void string(std::string_view s) { w.string(s); }
  void int_list(uint32_t n) { w.int_list(n); }
  void int_list_item(int64_t i) { w.int_list_item(i); }
};

struct BuilderSink {
  std::vector<Arg>& args;

  static TensorMeta meta(const TensorFacts& f) {
    TensorMeta m;
    m.dtype = f.dtype;
    m.device = f.device;
    m.sizes.assign(f.sizes, f.sizes + f.rank);
    m.strides.assign(f.strides, f.strides + f.rank);
    m.alignment = f.alignment;
    return m;
  }
  void none() { args.push_back(Arg::none()); }
  void tensor(const TensorFacts& f) { args.push_back(Arg::tensor(meta(f))); }
  void tensor_list(uint32_t n) {
    std::vector<TensorMeta> v;
    v.reserve(n);
    args.push_back(Arg::tensor_list(std::move(v)));
  }
  void tensor_list_item(const TensorFacts& f) {
    std::get<std::vector<TensorMeta>>(args.back().value).push_back(meta(f));
  }
  void boolean(bool b) { args.push_back(Arg::boolean(b)); }
  void integer(int64_t i) { args.push_back(Arg::integer(i)); }
  void real(double d) { args.push_back(Arg::real(d)); }
  void string(std::string_view s) { args.push_back(Arg::string(std::string(s))); }
  void int_list(uint32_t n) {
    std::vector<int64_t> v;
    v.reserve(n);
    args.push_back(Arg::int_list(std::move(v)));
  }
  void int_list_item(int64_t i) { std::get<std::vector<int64_t>>(args.back().value).push_back(i); }
};

}  // namespace

bool write_stack_signature(const OpIdentity& op, const c10::IValue* args, TargetArch& arch,
                           SignatureWriter& out) noexcept {
  try {
    begin_signature(op, out);
    WriterSink sink{out};
    int cuda_index = -1;
    if (!visit_args(op, args, sink, cuda_index)) return false;
    return finish_signature(op, arch, cuda_index, out);
  } catch (...) {
    // A torch check on an exotic tensor: not a signature we can describe.
    return false;
  }
}

// ---- typed arguments (stack_signature.h) ---------------------------------------------------------

bool typed_arg(TypedVisit& v, const at::Tensor& t) noexcept {
  try {
    if (!t.defined()) {
      v.out.none();
      return true;
    }
    TensorFacts f;
    if (!tensor_facts(*t.unsafeGetTensorImpl(), f)) return false;
    if (v.cuda_index < 0 && f.device == DeviceType::kCuda) v.cuda_index = f.device_index;
    v.out.tensor(f.dtype, f.device, f.sizes, f.strides, f.rank, f.alignment);
    return true;
  } catch (...) {
    return false;
  }
}

bool typed_arg(TypedVisit& v, const at::ITensorListRef& list) noexcept {
  try {
    const size_t n = list.size();
    if (n > kMaxListLen) return false;
    v.out.tensor_list(static_cast<uint32_t>(n));
    for (const at::Tensor& t : list) {
      TensorFacts f;
      if (!t.defined() || !tensor_facts(*t.unsafeGetTensorImpl(), f)) return false;   // as the boxed path
      if (v.cuda_index < 0 && f.device == DeviceType::kCuda) v.cuda_index = f.device_index;
      v.out.tensor_list_item(f.dtype, f.device, f.sizes, f.strides, f.rank, f.alignment);
    }
    return true;
  } catch (...) {
    return false;
  }
}

bool typed_arg(TypedVisit& v, std::optional<c10::MemoryFormat> f) noexcept {
  if (!f.has_value()) {
    v.out.none();
  } else {
    v.out.integer(static_cast<int64_t>(*f));   // as its IValue: an int
  }
  return true;
}

bool typed_arg(TypedVisit& v, const std::optional<at::Tensor>& t) noexcept {
  if (!t.has_value()) {
    v.out.none();
    return true;
  }
  return typed_arg(v, *t);
}

bool typed_arg(TypedVisit& v, int64_t i) noexcept {
  v.out.integer(i);
  return true;
}

namespace {

// SymInt::maybe_as_int, without passing a std::optional through memory for the common value.
bool concrete_int(const c10::SymInt& i, int64_t& out) noexcept {
  if (!i.is_heap_allocated()) [[likely]] {
    out = i.as_int_unchecked();
    return true;
  }
  const std::optional<int64_t> value = i.maybe_as_int();
  if (!value) return false;
  out = *value;
  return true;
}

}  // namespace

bool typed_arg(TypedVisit& v, const c10::SymInt& i) noexcept {
  int64_t value = 0;
  if (!concrete_int(i, value)) return false;
  v.out.integer(value);
  return true;
}

bool typed_arg(TypedVisit& v, c10::SymIntArrayRef list) noexcept {
  if (list.size() > kMaxListLen) return false;
  v.out.int_list(static_cast<uint32_t>(list.size()));
  for (const c10::SymInt& e : list) {
    int64_t value = 0;
    if (!concrete_int(e, value)) return false;
    v.out.int_list_item(value);
  }
  return true;
}

bool typed_arg(TypedVisit& v, c10::IntArrayRef list) noexcept {
  if (list.size() > kMaxListLen) return false;
  v.out.int_list(static_cast<uint32_t>(list.size()));
  for (const int64_t e : list) v.out.int_list_item(e);
  return true;
}

bool typed_arg(TypedVisit& v, c10::OptionalArrayRef<int64_t> list) noexcept {
  if (!list.has_value()) {
    v.out.none();
    return true;
  }
  return typed_arg(v, *list);
}

// A ScalarType boxes as its integer code (IValue(ScalarType)).
bool typed_arg(TypedVisit& v, std::optional<c10::ScalarType> t) noexcept {
  if (!t.has_value()) {
    v.out.none();
    return true;
  }
  v.out.integer(static_cast<int64_t>(*t));
  return true;
}

// A Layout boxes as its integer code (IValue(Layout)).
bool typed_arg(TypedVisit& v, std::optional<c10::Layout> l) noexcept {
  if (!l.has_value()) {
    v.out.none();
  } else {
    v.out.integer(static_cast<int64_t>(*l));
  }
  return true;
}

bool typed_arg(TypedVisit& v, std::optional<c10::Device> d) noexcept {
  if (!d.has_value()) {
    v.out.none();
    return true;
  }
  char buf[24];
  const std::string_view s = device_text(*d, buf);
  if (s.empty()) return false;
  note_device_target(*d, v.cuda_index);
  v.out.string(s);
  return true;
}

bool typed_arg(TypedVisit& v, std::optional<bool> b) noexcept {
  if (!b.has_value()) {
    v.out.none();
  } else {
    v.out.boolean(*b);
  }
  return true;
}

bool typed_arg(TypedVisit& v, std::optional<int64_t> i) noexcept {
  if (!i.has_value()) {
    v.out.none();
    return true;
  }
  return typed_arg(v, *i);
}

bool typed_arg(TypedVisit& v, std::optional<double> d) noexcept {
  if (!d.has_value()) {
    v.out.none();
    return true;
  }
  return typed_arg(v, *d);
}

bool typed_arg(TypedVisit& v, double d) noexcept {
  v.out.real(d);
  return true;
}

bool typed_arg(TypedVisit& v, bool b) noexcept {
  v.out.boolean(b);
  return true;
}

bool typed_arg(TypedVisit& v, std::string_view s) noexcept {
  if (s.size() > kMaxStringArg) return false;
  v.out.string(s);
  return true;
}

// As IValue(const Scalar&) tags it (ivalue.h): symbolic first, then double, complex, bool, int.
bool typed_arg(TypedVisit& v, const c10::Scalar& s) noexcept {
  if (s.isSymbolic() || s.isComplex()) return false;
  if (s.isFloatingPoint()) {
    v.out.real(s.toDouble());
    return true;
  }
  if (s.isBoolean()) {
    v.out.boolean(s.toBool());
    return true;
  }
  if (s.isUnsigned()) {
    const uint64_t u = s.toUInt64();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    v.out.integer(static_cast<int64_t>(u));
    return true;
  }
  v.out.integer(s.toLong());
  return true;
}

std::unique_ptr<OpSignature> build_stack_signature(const OpIdentity& op, const c10::IValue* args,
                                                   TargetArch& arch) {
  auto sig = std::make_unique<OpSignature>();
  sig->op = op.name;
  sig->overload = op.overload;
  sig->args.reserve(op.num_arguments);
  BuilderSink sink{sig->args};
  int cuda_index = -1;
  try {
    if (!visit_args(op, args, sink, cuda_index)) return nullptr;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {
    return nullptr;
  }
  const std::string_view arch_name = target_arch(op, arch, cuda_index);
  if (arch_name.empty()) return nullptr;
  sig->target = Target{op.backend, std::string(arch_name)};
  return sig;
}

}  // namespace kforge::hook

// The signature of an intercepted call, read from the dispatcher's IValue stack in two forms:
//   write_stack_signature  the fast path: canonical bytes into a SignatureWriter on the caller's
//                          stack, no heap allocation; its id() is the SignatureId.
//   build_stack_signature  the slow path (once per thread and signature): the same signature as
//                          an OpSignature value, for reports. Its id() must equal the fast one;
//                          the recorder checks that on every first sight.
// Both read the arguments through one classification (stack_signature.cc), so they can only
// disagree in the encoding, which is what the recorder's check and the tests compare.
//
// What a call's signature holds (OpSignature's vocabulary): a tensor is its dtype, device type,
// sizes, strides and the alignment of its data pointer; an undefined tensor and None are None;
// int, float, bool, string and int-list scalars are their values; a list of tensors is a tensor
// list. Anything else (a dtype kforge has no name for, a device other than CPU/CUDA, a sparse or
// symbolic-shape tensor, rank above 16, lists or strings over the decoder's limits, complex or
// symbolic scalars) makes the call "unknown": it falls through to PyTorch, uncounted by signature.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "interposer/hook/signature_writer.h"
#include "interposer/hook/target_arch.h"
#include "runtime/op_signature.h"

namespace kforge::hook {

// The operator half of a signature, fixed at registration.
struct OpIdentity {
  std::string name;          // "aten::add"
  std::string overload;      // "Tensor"
  uint32_t num_arguments = 0;
  Backend backend = Backend::kCpu;
  // SignaturePiece::head(name, overload, num_arguments), set by the registration: every call's
  // first bytes, copied instead of encoded (when not valid(), they are encoded per call).
  SignaturePiece head;
};

// Begins `out` with op's head.
inline void begin_signature(const OpIdentity& op, SignatureWriter& out) noexcept {
  if (op.head.valid()) [[likely]] {
    out.begin(op.head);
  } else {
    out.begin(op.name, op.overload, op.num_arguments);
  }
}

// The target arch of a call of `op` whose first CUDA tensor is on `cuda_index`; "" when unknown.
inline std::string_view target_arch(const OpIdentity& op, TargetArch& arch, int cuda_index) noexcept {
  return op.backend == Backend::kCpu ? arch.cpu() : arch.cuda(cuda_index);
}

// Closes `out` with the call's target. False if its arch cannot be known or the signature did not
// fit (unknown).
[[gnu::always_inline]] inline bool finish_signature(const OpIdentity& op, TargetArch& arch, int cuda_index,
                                                    SignatureWriter& out) noexcept {
  const SignaturePiece* target = op.backend == Backend::kCpu ? arch.cpu_target() : arch.cuda_target(cuda_index);
  if (target == nullptr) return false;
  if (target->valid()) [[likely]] {
    out.append(*target);
  } else {
    out.target(op.backend, target_arch(op, arch, cuda_index));
  }
  return out.ok();
}

// `args` are the call's num_arguments values (the top of the stack). False: unknown signature
// (the writer's content is then meaningless). Never throws.
bool write_stack_signature(const OpIdentity& op, const c10::IValue* args, TargetArch& arch,
                           SignatureWriter& out) noexcept;

// ---- typed (unboxed) calls -----------------------------------------------------------------------
// The same classification and bytes from the C++ argument values of an unboxed call, so a typed
// interceptor never boxes on a miss. Each overload classifies one argument exactly as its boxed
// IValue would be: a concrete SymInt is an int, a SymInt list of concrete values an int list, a
// Scalar holding a double/int/bool the matching scalar; symbolic values, complex Scalars and
// unsigned values above INT64_MAX are unknown (as their IValues are). The recorder checks the id
// against build_stack_signature() of the boxed arguments at every first sight.
struct TypedVisit {
  SignatureWriter& out;
  int cuda_index = -1;   // the first CUDA tensor's device index
};
bool typed_arg(TypedVisit& v, const at::Tensor& t) noexcept;
bool typed_arg(TypedVisit& v, const std::optional<at::Tensor>& t) noexcept;
bool typed_arg(TypedVisit& v, int64_t i) noexcept;
bool typed_arg(TypedVisit& v, const c10::SymInt& i) noexcept;
bool typed_arg(TypedVisit& v, c10::SymIntArrayRef list) noexcept;
bool typed_arg(TypedVisit& v, c10::IntArrayRef list) noexcept;
bool typed_arg(TypedVisit& v, c10::OptionalArrayRef<int64_t> list) noexcept;   // int[]? (None or a list)
bool typed_arg(TypedVisit& v, std::optional<c10::ScalarType> t) noexcept;      // ScalarType? (None or an int)
bool typed_arg(TypedVisit& v, double d) noexcept;
bool typed_arg(TypedVisit& v, bool b) noexcept;
bool typed_arg(TypedVisit& v, std::string_view s) noexcept;
bool typed_arg(TypedVisit& v, const c10::Scalar& s) noexcept;
bool typed_arg(TypedVisit& v, const at::ITensorListRef& list) noexcept;   // Tensor[] (cat's tensors)
bool typed_arg(TypedVisit& v, std::optional<c10::MemoryFormat> f) noexcept;  // MemoryFormat? (None or an int)
bool typed_arg(TypedVisit& v, std::optional<c10::Layout> l) noexcept;        // Layout? (None or an int)
bool typed_arg(TypedVisit& v, std::optional<c10::Device> d) noexcept;        // Device? (None or "cpu", "cuda:0")
bool typed_arg(TypedVisit& v, std::optional<bool> b) noexcept;               // bool? (None or a bool)
bool typed_arg(TypedVisit& v, std::optional<int64_t> i) noexcept;            // int? (None or an int: argmax's dim)
bool typed_arg(TypedVisit& v, std::optional<double> d) noexcept;             // float? (None or a float: upsample's scales)
// Any other optional: a compile error, not a silent conversion to one of the above (an optional<double>
// once went to the optional<int64_t> overload, encoding 2.0 as 2).
template <class T>
bool typed_arg(TypedVisit& v, const std::optional<T>& o) noexcept = delete;

// `cuda_index` gets the first CUDA tensor's device index (-1 if none).
template <class... A>
bool write_typed_signature(const OpIdentity& op, TargetArch& arch, SignatureWriter& out, int& cuda_index,
                           const A&... args) noexcept {
  begin_signature(op, out);
  TypedVisit v{out};
  const bool ok = (typed_arg(v, args) && ...) && finish_signature(op, arch, v.cuda_index, out);
  cuda_index = v.cuda_index;
  return ok;
}

// Null when the signature is unknown. May throw std::bad_alloc.
std::unique_ptr<OpSignature> build_stack_signature(const OpIdentity& op, const c10::IValue* args,
                                                   TargetArch& arch);

}  // namespace kforge::hook

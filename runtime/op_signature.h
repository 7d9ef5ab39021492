// OpSignature: one ATen operator call shape, the key of everything kforge does.
//
// A signature is the operator name and overload, every argument (tensor metadata or scalar value)
// and the target (backend and architecture). Scalars are part of the key: softmax(dim=-1) and
// softmax(dim=0) are different signatures. The canonical encoding is msgpack with a fixed layout
// (see Note [Canonical signature encoding] in op_signature.cc); its 128-bit XXH3 hash is the
// SignatureId. Equal signatures always have equal encodings and ids, on every host.
//
//   OpSignature s{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
//                 Target{Backend::kCuda, "sm_90"}};
//   SignatureId id = s.id();              // stable across processes and hosts
//   std::string hex = id.hex();           // 32 lowercase hex digits
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/status.h"

namespace kforge {

// Element types, numbered independently of torch's ScalarType so the wire and cache formats do
// not change when torch reorders its enum. Never renumber; append only.
enum class DType : uint8_t {
  kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3,
  kInt8 = 4, kUInt8 = 5, kInt16 = 6, kInt32 = 7, kInt64 = 8, kBool = 9,
  kComplex64 = 10, kComplex128 = 11, kFloat8E4M3FN = 12, kFloat8E5M2 = 13,
};
inline constexpr uint8_t kDTypeCount = 14;
std::string_view dtype_name(DType t) noexcept;       // "float32", "bfloat16", ...
StatusOr<DType> dtype_from_name(std::string_view name);
int dtype_size_bytes(DType t) noexcept;

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };
std::string_view device_type_name(DeviceType d) noexcept;

enum class Backend : uint8_t { kCpu = 0, kCuda = 1 };
std::string_view backend_name(Backend b) noexcept;   // "cpu", "cuda"
StatusOr<Backend> backend_from_name(std::string_view name);

// Upper bound on tensor rank in a signature (torch allows 64 dims, which nothing real uses).
inline constexpr size_t kMaxTensorRank = 16;

// Cap on TensorMeta::alignment. 16 bytes is the widest access a kernel can need from a base
// pointer (16-byte vector loads, TMA's global-address rule); a larger cap would only split one
// shape into several keys by where the allocator happened to put a tensor (the CPU allocator
// returns 64-, 128- and 256-byte aligned blocks at random).
inline constexpr uint32_t kMaxAlignment = 16;

struct TensorMeta {
  DType dtype = DType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;   // in elements, as torch reports them
  // Largest power of two (bytes, capped at kMaxAlignment) that divides the data pointer: kernels
  // that use vector loads are only valid for some alignments, so it is part of the key.
  uint32_t alignment = kMaxAlignment;

  int64_t numel() const noexcept;
  bool is_contiguous() const noexcept;
  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
};

// Row-major strides for `sizes`: each the product of the later sizes, as is_contiguous() expects.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);
// A contiguous tensor's metadata (aligned to kMaxAlignment): what tests, benches and signature
// builders start from.
TensorMeta contiguous_tensor(DType dtype, DeviceType device, std::vector<int64_t> sizes);

// An argument's value: None, a tensor, a tensor list, or a scalar.
struct Arg {
  using Value = std::variant<std::monostate, TensorMeta, std::vector<TensorMeta>, bool, int64_t,
                             double, std::string, std::vector<int64_t>>;
  Value value;

  static Arg none() { return Arg{std::monostate{}}; }
  static Arg tensor(TensorMeta t) { return Arg{std::move(t)}; }
  static Arg tensor_list(std::vector<TensorMeta> ts) { return Arg{std::move(ts)}; }
  static Arg boolean(bool b) { return Arg{b}; }
  static Arg integer(int64_t i) { return Arg{i}; }
  static Arg real(double d) { return Arg{d}; }
  static Arg string(std::string s) { return Arg{std::move(s)}; }
  static Arg int_list(std::vector<int64_t> v) { return Arg{std::move(v)}; }

  // Equality is on the canonical form: NaN equals NaN (all NaNs encode alike).
  friend bool operator==(const Arg& a, const Arg& b);
};

struct Target {
  Backend backend = Backend::kCpu;
  std::string arch;   // "sm_90" for CUDA; "x86_64" (+ feature suffix) for CPU
  friend bool operator==(const Target&, const Target&) = default;
};

struct SignatureId {
  uint64_t hi = 0;
  uint64_t lo = 0;
  std::string hex() const;                            // 32 lowercase hex digits, hi first
  static StatusOr<SignatureId> from_hex(std::string_view hex);
  friend bool operator==(const SignatureId&, const SignatureId&) = default;
  friend auto operator<=>(const SignatureId&, const SignatureId&) = default;
};

struct OpSignature {
  std::string op;         // "aten::_softmax"
  std::string overload;   // "" for the default overload, else e.g. "Tensor" for add.Tensor
  std::vector<Arg> args;  // positional, in schema order
  Target target;

  // The canonical msgpack bytes (stable; see the Note in op_signature.cc).
  std::string encode() const;
  // Parses canonical bytes; rejects anything malformed or over the limits with a reason that
  // names the offending field ("args[1].sizes: rank 40 exceeds 16").
  static StatusOr<OpSignature> decode(std::string_view bytes);
  SignatureId id() const;
  // "aten::_softmax(float32[4096,50257], -1, false) cuda:sm_90": for logs and the CLI.
  std::string to_string() const;

  // The integer names a launch plan may use, from the tensor and integer arguments at position i:
  //   ndim{i}, numel{i}, size{i}_{d}, stride{i}_{d}   for tensors
  //   arg{i}                                          for int and bool scalars
  //   arg{i}_{k}, len{i}                              for int lists
  std::map<std::string, int64_t, std::less<>> named_sizes() const;

  friend bool operator==(const OpSignature&, const OpSignature&) = default;
};

// XXH3-128 of arbitrary bytes, the hash behind SignatureId (also for other canonical encodings).
SignatureId hash128(std::string_view bytes) noexcept;

}  // namespace kforge

// The tensors of one verification trial or timing run: inputs drawn from a named distribution (or
// taken from captured real calls) with exactly the signature's dtypes, sizes, strides and pointer
// alignment, and outputs and scratch as poisoned buffers between guard zones. An argument the
// catalog gives an input range (runtime/op_catalog.h: a positive variance, a probability, an index
// bounded by another argument's dimension) is drawn within it.
//
//   TrialInputs in = TrialInputs::make(sig, device, Distribution::kLarge, seed, stats, nullptr);
//   torch::jit::Stack args = in.stack();           // what the op is called with
//   GuardedBuffer out = GuardedBuffer::make(device, bytes, Poison::kNaN, DType::kFloat32);
//   std::string where = out.guard_damage();        // "" or "3 bytes written after the end ..."
//
// Note [Guarded buffers]
// Every tensor the worker hands a candidate lives inside a larger allocation: a guard zone of
// kGuardBytes on each side. Output and scratch guards hold the byte 0xCB, so any write outside
// the tensor's extent shows as changed guard bytes (out_of_bounds) instead of silently corrupting
// a neighbour. Input guards hold the dtype's NaN, so a candidate that reads past an input gets NaN
// into its result instead of plausible numbers. Output data is poisoned with a NaN of a payload no
// arithmetic produces (kNaNPoison*) before each launch: an element still holding those exact bits
// afterwards was never written. Scratch data is poisoned with one of two byte patterns: a result
// that changes with the pattern read scratch it never wrote.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace kforge::eval {

inline constexpr int64_t kGuardBytes = 64 * 1024;
inline constexpr uint8_t kGuardByte = 0xCB;

at::ScalarType to_scalar_type(DType t);
bool is_floating(DType t);
// An integer dtype of the same element size, for bitwise views (NaN-safe comparisons).
at::ScalarType bits_type(at::ScalarType t);
// The output poison of a dtype, as the integer of bits_type() (floating: a NaN with a payload that
// arithmetic never produces; other types: every byte 0xA5).
int64_t poison_bits(at::ScalarType t);

enum class Distribution : uint8_t {
  kNormal,      // N(0, 1)
  kUniform,     // U(-3, 3)
  kLarge,       // N(0, s), s large for the dtype: overflow and cancellation show
  kOffset,      // N(m, 1), m large for the dtype: one-pass variances and the like lose precision
  kZeros,       // all zeros: work skipped on zero inputs shows (never the only trial)
  kObserved,    // the serving process's input statistics (mean, stddev, range, zeros, NaN, Inf)
  kCaptured,    // real tensors captured in the serving process
};
const char* distribution_name(Distribution d);

// A device allocation with guard zones around a data region (Note [Guarded buffers]).
class GuardedBuffer {
 public:
  enum class Guard : uint8_t { kCanary, kNaN };
  // `data_bytes` of data starting `misalign` bytes past a 64-byte boundary (pointer alignment as a
  // signature records it). `nan_dtype` is the dtype whose NaN fills kNaN guards.
  static GuardedBuffer make(at::Device device, int64_t data_bytes, int64_t misalign, Guard guard,
                            at::ScalarType nan_dtype);

  void* data() const;
  int64_t data_bytes() const noexcept { return data_bytes_; }
  // The data region as a tensor of `t` with the given sizes and strides (elements, from data()).
  at::Tensor view(at::ScalarType t, at::IntArrayRef sizes, at::IntArrayRef strides) const;
  // The data region as flat bytes, and the whole allocation.
  at::Tensor data_region() const;
  const at::Tensor& whole() const noexcept { return bytes_; }
  // Fills the data region with `byte`.
  void fill_data(uint8_t byte) const;
  // Empty if both guard zones still hold the canary; else where they were written and how much.
  std::string guard_damage() const;

 private:
  at::Tensor bytes_;
  int64_t offset_ = 0;
  int64_t data_bytes_ = 0;
};

// The bytes a tensor of these sizes/strides spans from its first element (0 for no elements).
int64_t span_bytes(const TensorMeta& m);

// One argument of the op as the worker builds it.
struct TrialArg {
  c10::IValue value;                     // what the op is called with
  std::vector<GuardedBuffer> buffers;    // the tensors' allocations (one per tensor, in list order)
  std::vector<at::Tensor> tensors;       // views into them, as in `value`
};

class TrialInputs {
 public:
  // Draws every tensor argument of `sig` from `dist` (seeded by `seed`); scalars as the signature
  // has them. `stats` (by argument index) feeds kObserved; `captured` feeds kCaptured (its
  // tensors must match the signature's dtypes and sizes). Errors name the argument.
  static StatusOr<TrialInputs> make(const OpSignature& sig, at::Device device, Distribution dist, uint64_t seed,
                                    const std::vector<wire::InputStats>& stats,
                                    const wire::CapturedInputs* captured);

  torch::jit::Stack stack() const;
  // The same arguments with every floating tensor converted to float64 (the accuracy reference).
  torch::jit::Stack stack_float64() const;
  // Data pointers by signature argument (nullptr for non-tensors and lists), then the elements of
  // every tensor list in argument order (Note [List inputs] in runtime/kernel_spec.cc).
  std::vector<void*> tensor_pointers() const;
  // Copies of every input allocation (guards included), for input_modified / out_of_bounds checks.
  std::vector<at::Tensor> snapshot() const;
  // Empty if every allocation equals `before`; else which input and where it changed. The data of
  // the arguments `written_in_place` marks (by argument index) may change; their guards may not.
  std::string changes_since(const std::vector<at::Tensor>& before, bool* in_guards,
                            const std::vector<bool>* written_in_place = nullptr) const;
  // Bytes of all tensor data (for rotating timing inputs).
  int64_t data_bytes() const;

  const std::vector<TrialArg>& args() const noexcept { return args_; }

 private:
  std::vector<TrialArg> args_;
};

}  // namespace kforge::eval

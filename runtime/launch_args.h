// How a resolved launch's arguments become kernel parameters, for both backends: one slot per
// argument holding a pointer (an input, an output, a scratch buffer) or a value (a size, a scalar),
// and params[i] pointing at slot i, the cuLaunchKernel convention the CPU ABI mirrors
// (runtime/cpu_kernel_abi.h). The CUDA launcher and the CPU backend differ only in where the
// pointers come from.
//
//   ParamSlot slots[n]; void* params[n];
//   Status s = bind_launch_args(launch, slots, params, [&](ArgBinding::Kind k, uint32_t i) -> uint64_t { ... },
//                               [&] { return std::string("launch 0"); });
//
// No allocation, no lock: the hook launches from user threads (the error path alone builds strings).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge {

// One kernel parameter's value; params[i] points at it. A pointer is stored as its 64-bit value
// (a host address on the CPU, a CUdeviceptr on CUDA).
union ParamSlot {
  uint64_t ptr;
  int64_t i64;
  int32_t i32;
  double f64;
  float f32;
  bool b;
};
static_assert(sizeof(void*) == sizeof(uint64_t), "a pointer parameter is stored as 64 bits");

// Fills slots[i] and params[i] (both l.args.size() long) for launch `l`. `pointer(kind, index)`
// gives the buffer of an input, output or scratch argument, 0 when there is none; a missing
// buffer is an error naming the argument (`where()`: "launch 0 (softmax_rows)", then
// `missing(kind)`: "no tensor for input", and the index), and so is a value argument typed as a
// pointer. `missing_scratch_ok(index)`: a scratch buffer of 0 bytes may be null.
template <class PointerOf, class Where, class ScratchMayBeNull, class MissingText>
Status bind_launch_args(const ResolvedLaunch& l, std::span<ParamSlot> slots, std::span<void*> params,
                        PointerOf&& pointer, Where&& where, ScratchMayBeNull&& missing_scratch_ok,
                        MissingText&& missing_text) {
  for (size_t ai = 0; ai < l.args.size(); ++ai) {
    const ResolvedArg& a = l.args[ai];
    ParamSlot& s = slots[ai];
    s.i64 = 0;
    auto missing = [&](ArgBinding::Kind kind) {
      return invalid_argument(where() + ", arg " + std::to_string(ai) + ": " + std::string(missing_text(kind)) + " " +
                              std::to_string(a.index));
    };
    switch (a.kind) {
      case ArgBinding::Kind::kInput:
        s.ptr = pointer(a.kind, a.index);
        if (s.ptr == 0) return missing(a.kind);
        break;
      case ArgBinding::Kind::kOutput:
        s.ptr = pointer(a.kind, a.index);
        if (s.ptr == 0) return missing(a.kind);
        break;
      case ArgBinding::Kind::kScratch:
        s.ptr = pointer(a.kind, a.index);
        if (s.ptr == 0 && !missing_scratch_ok(a.index)) return missing(a.kind);
        break;
      case ArgBinding::Kind::kTensorValue: {
        // Note [Tensor values] in kernel_spec.cc: the input's buffer is a host pointer to one
        // element of the DType resolve() recorded.
        const uint64_t host = pointer(ArgBinding::Kind::kInput, a.index);
        if (host == 0) return missing(ArgBinding::Kind::kInput);
        const void* p = reinterpret_cast<const void*>(static_cast<uintptr_t>(host));
        double real = 0;
        int64_t integer = 0;
        bool is_real = false;
        switch (static_cast<DType>(a.int_value)) {
          case DType::kFloat64: real = *static_cast<const double*>(p), is_real = true; break;
          case DType::kFloat32: real = *static_cast<const float*>(p), is_real = true; break;
          case DType::kInt64: integer = *static_cast<const int64_t*>(p); break;
          case DType::kInt32: integer = *static_cast<const int32_t*>(p); break;
          case DType::kBool: integer = *static_cast<const bool*>(p) ? 1 : 0; break;
          default:
            return invalid_argument(where() + ", arg " + std::to_string(ai) + ": a value of an unreadable dtype");
        }
        const bool integer_type = a.type == ValueType::kInt64 || a.type == ValueType::kInt32;
        if (is_real && integer_type) {
          // A float value bound as an integer must be one exactly (as resolve_scalar requires).
          if (!(real == real) || real < -9.0e18 || real > 9.0e18 || static_cast<double>(static_cast<int64_t>(real)) != real) {
            return invalid_argument(where() + ", arg " + std::to_string(ai) + ": the value " + std::to_string(real) +
                                    " is not an integer");
          }
          integer = static_cast<int64_t>(real);
        }
        if (a.type == ValueType::kInt32 && (integer < INT32_MIN || integer > INT32_MAX)) {
          return invalid_argument(where() + ", arg " + std::to_string(ai) + ": the value " + std::to_string(integer) +
                                  " does not fit int32");
        }
        switch (a.type) {
          case ValueType::kInt64: s.i64 = integer; break;
          case ValueType::kInt32: s.i32 = static_cast<int32_t>(integer); break;
          case ValueType::kFloat64: s.f64 = is_real ? real : static_cast<double>(integer); break;
          case ValueType::kFloat32: s.f32 = is_real ? static_cast<float>(real) : static_cast<float>(integer); break;
          case ValueType::kBool: s.b = is_real ? real != 0 : integer != 0; break;
          case ValueType::kPointer:
            return invalid_argument(where() + ", arg " + std::to_string(ai) + ": a value argument cannot be a pointer");
        }
        break;
      }
      case ArgBinding::Kind::kSize:
      case ArgBinding::Kind::kScalar:
        switch (a.type) {
          case ValueType::kInt64: s.i64 = a.int_value; break;
          case ValueType::kInt32: s.i32 = static_cast<int32_t>(a.int_value); break;
          case ValueType::kFloat64: s.f64 = a.real_value; break;
          case ValueType::kFloat32: s.f32 = static_cast<float>(a.real_value); break;
          case ValueType::kBool: s.b = a.int_value != 0; break;
          case ValueType::kPointer:
            return invalid_argument(where() + ", arg " + std::to_string(ai) + ": a value argument cannot be a pointer");
        }
        break;
    }
    params[ai] = &s;
  }
  return Status();
}

}  // namespace kforge

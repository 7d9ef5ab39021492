#include "interposer/hook/swap_call.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "interposer/hook/hook_work.h"
#include "interposer/hook/log.h"
#include "interposer/hook/swapper.h"
#include "runtime/accuracy.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_launcher.h"
#include "runtime/kernel_spec.h"
#include "runtime/op_catalog.h"

namespace kforge::hook {

namespace {

c10::ScalarType scalar_type_of(DType t) {
  switch (t) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kBool: return c10::ScalarType::Bool;
    case DType::kComplex64: return c10::ScalarType::ComplexFloat;
    case DType::kComplex128: return c10::ScalarType::ComplexDouble;
    case DType::kFloat8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
    case DType::kFloat8E5M2: return c10::ScalarType::Float8_e5m2;
  }
  return c10::ScalarType::Undefined;
}

bool to_dtype(c10::ScalarType st, DType& out) {
  for (uint8_t i = 0; i < kDTypeCount; ++i) {
    if (scalar_type_of(static_cast<DType>(i)) == st) {
      out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

// CPU entries run on torch's thread pool, beside the user's other CPU ops (CpuParallelFor).
void torch_parallel_for(uint64_t n, void* ctx, void (*body)(void*, uint64_t, uint64_t)) {
  at::parallel_for(0, static_cast<int64_t>(n), 1, [&](int64_t begin, int64_t end) {
    body(ctx, static_cast<uint64_t>(begin), static_cast<uint64_t>(end));
  });
}

// Empty when the plan's outputs are what the operator returns, else why not.
std::string check_outputs(const InterceptedOp& op, const ResolvedLaunchPlan& plan) {
  if (!op.returns_tensors || plan.outputs.size() != op.num_returns) {
    return "the entry's plan makes " + std::to_string(plan.outputs.size()) + " tensor outputs but " + op.name +
           " returns " + std::to_string(op.num_returns) + (op.returns_tensors ? " tensors" : " values, not all tensors");
  }
  return {};
}

// Note [In-place calls]
// An entry whose plan writes an argument in place (ResolvedOutput::in_place_of: relu_, add_;
// Note [In-place outputs] in runtime/kernel_spec.cc) is handed that argument's own memory as its
// output and returns the caller's tensor itself. Its kernel assumes, as PyTorch does, that `self`
// has no internal overlap and that no other input shares memory with it except exactly (the same
// elements: x.add_(x)); where self overlaps itself or another input only partly, PyTorch's kernel
// runs (and raises the error it raises). A shadow call runs the entry on a copy of self taken
// before either kernel ran (PyTorch's writes the caller's self), compares that copy with what
// PyTorch's kernel left in self, and computes the float64 reference from the copy taken before;
// where another input is self exactly, the shadow call runs PyTorch's kernel alone (the entry,
// reading `other` from the caller's self, could see PyTorch's result), uncompared. An active call
// that fails after the kernel started may have written part of self before PyTorch's kernel runs
// on it: only a fault in the entry's own kernel does that, and it disables the entry.

// The argument the plan's output `o` is written into, checked against the plan (it matched the
// signature, so only a broken table makes these differ). Null: why is set.
const at::Tensor* in_place_arg(const InterceptedOp& op, const c10::IValue* args, const ResolvedOutput& o,
                               std::string& why) {
  const auto i = static_cast<uint32_t>(o.in_place_of);
  if (i >= op.identity.num_arguments || !args[i].isTensor() || !args[i].toTensor().defined()) {
    why = "the plan writes argument " + std::to_string(i) + " in place, which is not a tensor";
    return nullptr;
  }
  const at::Tensor& t = args[i].toTensor();
  if (t.scalar_type() != scalar_type_of(o.dtype) || t.sizes() != at::IntArrayRef(o.sizes) ||
      t.strides() != at::IntArrayRef(o.strides)) {
    why = "argument " + std::to_string(i) + " is not the tensor the plan writes in place (dtype, sizes or strides)";
    return nullptr;
  }
  return &t;
}

// Appends the plan's output `o` to `outs`: the argument it is written into (Note [In-place
// calls]), the caller's tensor for it (`given`, an out= call's: Note [Out variants]; checked by
// out_mismatch), or a fresh tensor of its dtype, sizes and strides from torch's allocator on
// `device`. Empty: appended; else why not. May throw (allocation).
std::string add_output(const InterceptedOp& op, const c10::IValue* args, const ResolvedOutput& o,
                       const at::TensorOptions& device, std::vector<at::Tensor>& outs, const at::Tensor* given) {
  if (o.in_place_of < 0) {
    if (given != nullptr) {
      outs.push_back(given[outs.size()]);
      return {};
    }
    outs.push_back(at::empty_strided(o.sizes, o.strides, device.dtype(scalar_type_of(o.dtype))));
    return {};
  }
  std::string why;
  const at::Tensor* self = in_place_arg(op, args, o, why);
  if (self != nullptr) outs.push_back(*self);
  return why;
}

// How the arguments an in-place plan writes share memory with the others (Note [In-place calls]).
enum class InPlaceAliasing { kNone, kExact, kPartial };

InPlaceAliasing in_place_aliasing(const InterceptedOp& op, const ResolvedLaunchPlan& plan, const c10::IValue* args) {
  InPlaceAliasing worst = InPlaceAliasing::kNone;
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of < 0) continue;
    const auto i = static_cast<uint32_t>(o.in_place_of);
    if (i >= op.identity.num_arguments || !args[i].isTensor()) continue;   // in_place_arg says why
    const at::Tensor& self = args[i].toTensor();
    if (!self.defined()) continue;
    if (at::has_internal_overlap(self) != at::MemOverlap::No) return InPlaceAliasing::kPartial;
    for (uint32_t j = 0; j < op.identity.num_arguments; ++j) {
      if (j == i || !args[j].isTensor() || !args[j].toTensor().defined()) continue;
      switch (at::get_overlap_status(self, args[j].toTensor())) {
        case at::MemOverlapStatus::No: break;
        case at::MemOverlapStatus::Full: worst = InPlaceAliasing::kExact; break;
        default: return InPlaceAliasing::kPartial;
      }
    }
  }
  return worst;
}

bool writes_in_place(const ResolvedLaunchPlan& plan) {
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of >= 0) return true;
  }
  return false;
}

// Note [CUDA calls]
// A CUDA hit runs on the device of its tensor inputs (the signature has no device index): all
// defined tensor inputs must be CUDA tensors on one device d. With no tensor input, or inputs on
// several devices, the call is PyTorch's business (its kernel runs and reports whatever it
// reports); a CPU tensor among the inputs is the entry's failure (its signature says where each
// input lives, so every call would fail alike). The entry's module for d (CudaModules) must be
// loaded, else PyTorch's kernel runs (counted, not a failure). Then, for the whole hit:
//   - a DeviceGuard makes d torch's current device, and d's primary context (the one the loader
//     loaded the module into, torch's) is made current with push/pop if it is not already: a
//     thread whose first CUDA work is this call may have no context current yet;
//   - the stream is torch's current stream of d, read through c10's device-generic guard interface
//     (so the hook needs no link to libc10_cuda and still loads with a CPU-only torch);
//   - cuStreamIsCapturing on that stream decides what capture allows (Note [Swap states]);
//   - outputs and scratch come from at::empty_strided / at::empty on d: torch's caching allocator,
//     stream-ordered on the current stream and legal under graph capture; scratch goes back to it
//     when the call returns, ordered after the launch on that stream;
//   - CudaKernel::launch enqueues the plan on the stream: nothing synchronizes in the active path.
// A driver error before the launch (making the context current, the capture query) is not the
// entry's fault: the call runs PyTorch's kernel and the first such error is logged. A launch
// error is: active falls back and disables the entry, shadow disables it.
struct CudaCall {
  c10::DeviceIndex device = -1;
  const CudaDeviceModule* module = nullptr;
  CUstream stream = nullptr;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  // Destroyed in reverse order: the context is popped before the device guard restores torch's
  // previous device.
  std::optional<c10::DeviceGuard> device_guard;
  std::optional<ScopedCurrentContext> context;
};

enum class CallDevice { kOne, kNone, kSeveral, kNotCuda };

// The CUDA device of the call's tensor inputs (Note [CUDA calls]). kNotCuda sets `why`. Never
// throws (out of memory for `why`: kNone, so PyTorch's kernel runs).
CallDevice call_device(const InterceptedOp& op, const c10::IValue* args, c10::DeviceIndex& device,
                       std::string& why) noexcept {
  device = -1;
  try {
    // Every defined tensor argument and every element of a tensor-list argument (cat's).
    auto visit = [&](uint32_t i, const at::Tensor& t) {
      if (!t.defined()) return CallDevice::kOne;
      if (!t.is_cuda()) {
        // A 0-dimensional CPU tensor is a value in a CUDA operation, as PyTorch allows (`x * 0.5`:
        // a Python number): the signature says it is on the CPU, and an entry can only read it
        // through a value binding (KernelSpec::resolve refuses a CUDA pointer binding of it).
        if (t.is_cpu() && t.dim() == 0) return CallDevice::kOne;
        why = "input " + std::to_string(i) + " is not a CUDA tensor";
        return CallDevice::kNotCuda;
      }
      if (device < 0) {
        device = t.get_device();
      } else if (t.get_device() != device) {
        return CallDevice::kSeveral;
      }
      return CallDevice::kOne;
    };
    for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {
      if (args[i].isTensor()) {
        if (const CallDevice d = visit(i, args[i].toTensor()); d != CallDevice::kOne) return d;
      } else if (args[i].isTensorList()) {
        for (const at::Tensor& t : args[i].toTensorList()) {
          if (const CallDevice d = visit(i, t); d != CallDevice::kOne) return d;
        }
      }
    }
  } catch (...) {
    return CallDevice::kNone;
  }
  return device < 0 ? CallDevice::kNone : CallDevice::kOne;
}

// Makes call.device and its primary context current on this thread until leave_device(call), and
// reads torch's current stream there and its capture status. Empty: done; else why not (a driver
// or torch error, none of the entry's doing). Never throws.
std::string enter_device(const CudaDriver& cu, CudaCall& call) noexcept {
  try {
    const c10::Device device(c10::DeviceType::CUDA, call.device);
    call.device_guard.emplace(device);
    StatusOr<ScopedCurrentContext> context = ScopedCurrentContext::make_current(cu, call.module->context);
    if (!context.ok()) return context.status().message();
    call.context.emplace(std::move(*context));
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    call.stream = static_cast<CUstream>(impl->getStreamNativeHandle(impl->getStream(device)));
    if (const CUresult res = cu.cuStreamIsCapturing(call.stream, &call.capture); res != CUDA_SUCCESS) {
      return cu.error(res, "cuStreamIsCapturing(torch's current stream)", __FILE__, __LINE__).message();
    }
    return {};
  } catch (const std::exception& e) {
    return std::string("cannot enter the device: ") + e.what();
  } catch (...) {
    return "cannot enter the device";
  }
}

// Restores the context and then the device enter_device found, before PyTorch's kernel runs or the
// call returns.
void leave_device(CudaCall& call) noexcept {
  call.context.reset();
  call.device_guard.reset();
}

// The first driver error that made a CUDA hit run PyTorch's kernel, once per process (stderr, one
// write: the only I/O a calling thread does, and only once).
void log_cuda_passthrough(const Replacement& r, const std::string& why) noexcept {
  static std::atomic<bool> logged{false};
  if (logged.exchange(true, std::memory_order_relaxed)) return;
  try {
    log_line("a CUDA call of entry " + r.key.hex() + " ran PyTorch's kernel: " + why +
             " (logged once; later such calls are not logged)");
  } catch (...) {
  }
}

// Runs a CUDA entry (Note [CUDA calls]) on `args` into fresh outputs on call.device, on call.stream.
// Empty: launched. May throw (torch allocation): callers catch.
std::string run_candidate_cuda(const InterceptedOp& op, const Replacement& r, const c10::IValue* args,
                               const CudaCall& call, std::vector<at::Tensor>& outs, const at::Tensor* given) {
  const ResolvedLaunchPlan& plan = *r.plan;
  if (std::string why = check_outputs(op, plan); !why.empty()) return why;
  // Reused per thread: a hit allocates nothing of its own once its thread has made one.
  thread_local CudaBuffers io;
  io.inputs.assign(op.identity.num_arguments, 0);
  io.outputs.clear();
  io.scratch.clear();
  for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined()) continue;
    if (t.is_cpu() && t.numel() == 1) {
      // A Python number (Note [Tensor values] in runtime/kernel_spec.cc): the host address, which
      // only a value binding reads; the worker verified the entry with this argument on the CPU.
      io.inputs[i] = reinterpret_cast<CUdeviceptr>(t.const_data_ptr());
      continue;
    }
    if (!t.is_cuda() || t.get_device() != call.device) {
      return "input " + std::to_string(i) + " is not on cuda:" + std::to_string(call.device);
    }
    // const_data_ptr: reading must not materialize a copy-on-write tensor.
    io.inputs[i] = reinterpret_cast<CUdeviceptr>(t.const_data_ptr());
  }
  // Tensor lists' elements after the arguments (Note [List inputs] in runtime/kernel_spec.cc).
  for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {
    if (!args[i].isTensorList()) continue;
    for (const at::Tensor& t : args[i].toTensorList()) {
      if (!t.defined() || !t.is_cuda() || t.get_device() != call.device) {
        return "an element of input " + std::to_string(i) + " is not on cuda:" + std::to_string(call.device);
      }
      io.inputs.push_back(reinterpret_cast<CUdeviceptr>(t.const_data_ptr()));
    }
  }
  const at::TensorOptions on_device = at::TensorOptions().device(c10::Device(c10::DeviceType::CUDA, call.device));
  outs.clear();
  outs.reserve(plan.outputs.size());
  for (const ResolvedOutput& o : plan.outputs) {
    if (std::string why = add_output(op, args, o, on_device, outs, given); !why.empty()) return why;
    io.outputs.push_back(reinterpret_cast<CUdeviceptr>(outs.back().mutable_data_ptr()));
  }
  c10::SmallVector<at::Tensor, 4> scratch;
  for (const ResolvedScratch& sc : plan.scratch) {
    if (sc.bytes <= 0) {
      io.scratch.push_back(0);
      continue;
    }
    scratch.push_back(at::empty({sc.bytes}, on_device.dtype(at::kByte)));
    io.scratch.push_back(reinterpret_cast<CUdeviceptr>(scratch.back().mutable_data_ptr()));
  }
  const Status s = call.module->kernel->launch(plan, io, call.stream);
  if (!s.ok()) return "launch failed on cuda:" + std::to_string(call.device) + ": " + s.message();
  return {};
}

// Runs the replacement on the arguments `args` (the op's inputs, still owned by the caller) into
// fresh outputs allocated through torch with the plan's dtype, sizes and strides, or into `given`
// (one per plan output: an out= call's tensors, Note [Out variants]). Returns an empty
// string on success, else why it failed. May throw (torch allocation): callers catch.
std::string run_candidate(const InterceptedOp& op, const Replacement& r, const c10::IValue* args,
                          std::vector<at::Tensor>& outs, const CudaCall* cuda, const at::Tensor* given = nullptr) {
  if (r.backend == Backend::kCuda) {
    if (cuda == nullptr) return "internal error: a CUDA entry without a CUDA call";
    return run_candidate_cuda(op, r, args, *cuda, outs, given);
  }
  const ResolvedLaunchPlan& plan = *r.plan;
  if (std::string why = check_outputs(op, plan); !why.empty()) return why;
  CpuBuffers io;
  io.inputs.assign(op.identity.num_arguments, nullptr);
  for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined()) continue;
    if (!t.device().is_cpu()) return "input " + std::to_string(i) + " is not a CPU tensor";
    io.inputs[i] = t.data_ptr();
  }
  for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {   // Note [List inputs] (kernel_spec.cc)
    if (!args[i].isTensorList()) continue;
    for (const at::Tensor& t : args[i].toTensorList()) {
      if (!t.defined() || !t.device().is_cpu()) return "an element of input " + std::to_string(i) + " is not a CPU tensor";
      io.inputs.push_back(t.data_ptr());
    }
  }
  outs.clear();
  outs.reserve(plan.outputs.size());
  for (const ResolvedOutput& o : plan.outputs) {
    if (std::string why = add_output(op, args, o, at::TensorOptions().device(at::kCPU), outs, given); !why.empty()) {
      return why;
    }
    io.outputs.push_back(outs.back().data_ptr());
  }
  CpuRunOptions run_options;
  run_options.parallel_for = &torch_parallel_for;
  const Status s = run_cpu_plan(*r.module, *r.spec, plan, io, run_options);
  if (!s.ok()) return "launch failed: " + s.message();
  return {};
}

// Note [Shadow comparison]
// One output of a shadow call: the candidate's (`cand`) against PyTorch's (`orig`, what the
// caller got), both against `ref`, PyTorch's own kernel run on the inputs converted to float64.
// Passes iff dtype, sizes and strides equal the original's; NaN positions match and Inf positions
// (and signs) match; and, over the elements finite in both orig and ref, the accuracy criterion the
// worker verified it with holds (Note [Accuracy criterion] in runtime/accuracy.h: within 2x
// PyTorch's error plus a floor of a few ulps, in max-abs and relative L2). Non-floating outputs
// must be equal. Empty string: passed.
std::string compare_output(size_t i, const at::Tensor& orig, const at::Tensor& cand, const at::Tensor& ref) {
  const std::string out = "output " + std::to_string(i) + ": ";
  if (cand.scalar_type() != orig.scalar_type()) {
    return out + "dtype " + std::string(c10::toString(cand.scalar_type())) + " != PyTorch's " +
           c10::toString(orig.scalar_type());
  }
  if (cand.sizes() != orig.sizes() || cand.strides() != orig.strides()) {
    return out + "sizes/strides " + c10::str(cand.sizes(), "/", cand.strides()) + " != PyTorch's " +
           c10::str(orig.sizes(), "/", orig.strides());
  }
  if (orig.numel() == 0) return {};
  if (!at::isFloatingType(orig.scalar_type())) {
    return at::equal(cand, orig) ? std::string() : out + "values differ (non-floating output)";
  }
  const at::Tensor o = orig.to(at::kDouble);
  const at::Tensor c = cand.to(at::kDouble);
  const at::Tensor f = ref.to(at::kDouble);
  if (!at::equal(at::isnan(o), at::isnan(c))) return out + "NaN positions differ";
  const at::Tensor inf = at::isinf(o);
  if (!at::equal(inf, at::isinf(c)) || !at::equal(o.masked_select(inf), c.masked_select(inf))) {
    return out + "Inf positions differ";
  }
  const at::Tensor finite = at::logical_and(at::isfinite(o), at::isfinite(f));
  const at::Tensor oz = at::where(finite, o, 0.0);
  const at::Tensor cz = at::where(finite, c, 0.0);
  const at::Tensor fz = at::where(finite, f, 0.0);
  const double ref_norm = fz.norm().item<double>();
  const double scale = ref_norm > 0 ? ref_norm : 1.0;
  const ErrorMeasures candidate{(cz - fz).abs().max().item<double>(), (cz - fz).norm().item<double>() / scale,
                                fz.abs().max().item<double>()};
  const ErrorMeasures torch{(oz - fz).abs().max().item<double>(), (oz - fz).norm().item<double>() / scale,
                            candidate.ref_max};
  DType dtype = DType::kFloat32;
  if (!to_dtype(orig.scalar_type(), dtype)) return out + "unsupported output dtype";
  const AccuracyVerdict verdict = judge_accuracy(candidate, torch, dtype);
  if (!verdict.passed) return out + verdict.detail;
  return {};
}

// After the original ran on `args` and left its outputs on top of `stack`, and the candidate left
// its outputs in `cand`: runs the float64 reference (PyTorch's kernel on double inputs, on the
// inputs' device) and compares every output. Empty string: passed. May throw. On CUDA the
// comparison synchronizes (.item()): callers never run it while the stream is capturing.
std::string compare_with_reference(const InterceptedOp& op, const c10::OperatorHandle& handle,
                                   c10::DispatchKeySet keys, const std::vector<c10::IValue>& args,
                                   const torch::jit::Stack& stack, const std::vector<at::Tensor>& cand) {
  if (stack.size() < op.num_returns) return "PyTorch's kernel left too few outputs";
  if (cand.size() < op.num_returns) return "the entry left too few outputs";
  const c10::IValue* orig = stack.data() + (stack.size() - op.num_returns);

  torch::jit::Stack ref;
  ref.reserve(args.size());
  for (const c10::IValue& a : args) {
    if (a.isTensor() && a.toTensor().defined() && at::isFloatingType(a.toTensor().scalar_type())) {
      ref.emplace_back(a.toTensor().to(at::kDouble));
    } else {
      ref.push_back(a);
    }
  }
  op.original.callBoxed(handle, keys, &ref);
  if (ref.size() != op.num_returns) return "the float64 reference returned " + std::to_string(ref.size()) + " values";
  const catalog::OpEntry* entry = catalog::find(op.identity.name, op.identity.overload);
  const DeviceType device = !args.empty() && args[0].isTensor() && args[0].toTensor().is_cuda() ? DeviceType::kCuda
                                                                                                 : DeviceType::kCpu;
  const std::optional<bool> training = args.size() > 5 && args[5].isBool() ? std::optional<bool>(args[5].toBool())
                                                                           : std::nullopt;
  for (uint32_t i = 0; i < op.num_returns; ++i) {
    if (!orig[i].isTensor() || !ref[i].isTensor()) return "output " + std::to_string(i) + " is not a tensor";
    if (entry != nullptr && catalog::output_values_unspecified(*entry, i, device, training)) {
      // PyTorch left its values uninitialized: the layout is all there is to compare.
      const at::Tensor& o = orig[i].toTensor();
      if (cand[i].scalar_type() != o.scalar_type() || cand[i].sizes() != o.sizes() || cand[i].strides() != o.strides()) {
        return "output " + std::to_string(i) + ": dtype, sizes or strides differ from PyTorch's";
      }
      continue;
    }
    if (std::string err = compare_output(i, orig[i].toTensor(), cand[i], ref[i].toTensor()); !err.empty()) return err;
  }
  return {};
}

// Note [In-process win]: the shadow call protects the caller's inputs from an entry that writes
// them. A copy of every defined tensor input, taken before either kernel runs (so that neither
// finds the inputs warmer in the caches for it). May throw: callers catch.
std::vector<at::Tensor> snapshot_inputs(const InterceptedOp& op, const std::vector<c10::IValue>& args) {
  std::vector<at::Tensor> copies(op.identity.num_arguments);
  for (uint32_t i = 0; i < op.identity.num_arguments && i < args.size(); ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined()) copies[i] = args[i].toTensor().clone();
  }
  return copies;
}

// Bit for bit, NaNs included (at::equal says NaN != NaN).
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (!at::isFloatingType(a.scalar_type()) && !at::isComplexType(a.scalar_type())) return at::equal(a, b);
  return at::equal(at::isnan(a), at::isnan(b)) && at::equal(at::nan_to_num(a, 0.0), at::nan_to_num(b, 0.0));
}

// Whether the plan writes argument i in place.
bool written_in_place(const ResolvedLaunchPlan& plan, size_t i) {
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of >= 0 && static_cast<size_t>(o.in_place_of) == i) return true;
  }
  return false;
}

// The arguments a shadow call's entry runs on (Note [In-place calls]): `args`, with each argument
// the plan writes in place replaced by a copy of its snapshot in the same layout. May throw.
std::vector<c10::IValue> entry_arguments(const ResolvedLaunchPlan& plan, const std::vector<c10::IValue>& args,
                                         const std::vector<at::Tensor>& snapshot) {
  std::vector<c10::IValue> in = args;
  for (size_t i = 0; i < in.size() && i < snapshot.size(); ++i) {
    if (!written_in_place(plan, i) || !snapshot[i].defined()) continue;
    const at::Tensor& self = args[i].toTensor();
    in[i] = at::empty_strided(self.sizes(), self.strides(), self.options()).copy_(snapshot[i]);
  }
  return in;
}

// The arguments of the float64 reference: `args`, with each argument written in place as it was
// before either kernel ran (its snapshot).
std::vector<c10::IValue> reference_arguments(const ResolvedLaunchPlan& plan, const std::vector<c10::IValue>& args,
                                             const std::vector<at::Tensor>& snapshot) {
  std::vector<c10::IValue> in = args;
  for (size_t i = 0; i < in.size() && i < snapshot.size(); ++i) {
    if (written_in_place(plan, i) && snapshot[i].defined()) in[i] = snapshot[i];
  }
  return in;
}

// After the entry ran: empty if it left every input as the snapshot has it; else the inputs are
// put back (before PyTorch's kernel or the caller reads them) and the reason is returned. The
// arguments the plan writes in place are PyTorch's kernel's to write: not looked at.
std::string restore_inputs(const ResolvedLaunchPlan& plan, const std::vector<c10::IValue>& args,
                           const std::vector<at::Tensor>& snapshot) {
  std::string why;
  for (size_t i = 0; i < snapshot.size() && i < args.size(); ++i) {
    if (!snapshot[i].defined() || written_in_place(plan, i)) continue;
    const at::Tensor& t = args[i].toTensor();
    if (same_values(t, snapshot[i])) continue;
    const_cast<at::Tensor&>(t).copy_(snapshot[i]);
    if (why.empty()) why = "the entry wrote its input " + std::to_string(i);
  }
  return why;
}

uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count();
  return ns > 0 ? static_cast<uint64_t>(ns) : 1;
}

// Four CUDA events around a shadow call's two launches (Note [In-process win]): [0, 1] the entry,
// [2, 3] PyTorch's kernel. Destroyed with the call. Not ok(): the call is compared, not timed.
class ShadowEvents {
 public:
  explicit ShadowEvents(const CudaDriver& cu) : cu_(cu) {
    for (CUevent& e : events_) {
      if (cu_.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
        e = nullptr;
        ok_ = false;
      }
    }
  }
  ShadowEvents(const ShadowEvents&) = delete;
  ShadowEvents& operator=(const ShadowEvents&) = delete;
  ~ShadowEvents() {
    for (CUevent e : events_) {
      if (e != nullptr) (void)cu_.cuEventDestroy(e);
    }
  }
  void record(int i, CUstream s) {
    if (ok_ && cu_.cuEventRecord(events_[i], s) != CUDA_SUCCESS) ok_ = false;
  }
  // The nanoseconds between events a and b; 0 if unknown. Waits for b.
  uint64_t between(int a, int b) {
    float ms = 0;
    if (!ok_ || cu_.cuEventSynchronize(events_[b]) != CUDA_SUCCESS ||
        cu_.cuEventElapsedTime(&ms, events_[a], events_[b]) != CUDA_SUCCESS || !(ms >= 0)) {
      return 0;
    }
    const double ns = static_cast<double>(ms) * 1e6;
    return ns >= 1 ? static_cast<uint64_t>(ns) : 1;
  }

 private:
  const CudaDriver& cu_;
  CUevent events_[4] = {};
  bool ok_ = true;
};

}  // namespace

// Shared by the CPU and CUDA paths below.
namespace {

// A shadow comparison's verdict: one more clean call (with its times, 0: untimed), or the entry
// disabled.
// Note [Out of memory in a shadow call]
// A shadow call allocates what PyTorch's kernel alone would not: the inputs' snapshot, the
// candidate's outputs, the comparison's temporaries. When the device (or host) has no memory
// left for them, that says nothing about the entry: its kernel did not run wrong. Such a call is
// not compared: PyTorch's result is returned as always, the call counts as memory_shadow_skips
// (neither clean nor failed), and the trial goes on with the next calls. Before this, an H200
// process whose memory a search worker had taken disabled and quarantined a correct softmax
// entry ("shadow mismatch: ... CUDA out of memory"). A launch failure of the entry itself is
// still a failure. Error texts keep their first line: c10 errors carry a C++ backtrace.
constexpr const char kOutOfMemory[] = "\x01out of memory";   // a why that is not a verdict

std::string error_text(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  const std::string w = e.what();
  return w.substr(0, w.find('\n'));
}

// Inside a catch block of a shadow call: what the exception in flight means for the verdict.
std::string shadow_exception_why() {
  try {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    return kOutOfMemory;   // Note [Out of memory in a shadow call]
  } catch (const std::exception& e) {
    return std::string("shadow call threw: ") + error_text(e);
  } catch (...) {
    return "shadow call threw";
  }
}

void shadow_verdict(const Replacement& r, const std::string& why, uint64_t pytorch_ns = 0, uint64_t entry_ns = 0) {
  if (why == kOutOfMemory) {
    r.counters->memory_shadow_skips.fetch_add(1, std::memory_order_relaxed);
  } else if (why.empty()) {
    r.owner->shadow_clean(r, pytorch_ns, entry_ns);
  } else {
    r.owner->fail(r, "shadow mismatch: " + why);
  }
}

// An active call the entry could not serve: disabled, and this call runs PyTorch's kernel.
void active_failed(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                   c10::DispatchKeySet keys, torch::jit::Stack* stack, const std::string& why) {
  r.counters->fallbacks.fetch_add(1, std::memory_order_relaxed);
  r.owner->fail(r, "active call failed: " + why);
  op.original.callBoxed(handle, keys, stack);
}

// An active call the entry served: its outputs replace the arguments, as the original's would.
// A timing-phase call counts in timing_calls, not here.
void active_done(const InterceptedOp& op, const Replacement& r, torch::jit::Stack* stack,
                 std::vector<at::Tensor>& outs) {
  torch::jit::drop(*stack, op.identity.num_arguments);
  for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  if (r.state == SwapState::kActive) r.counters->active_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// A hit in shadow state: PyTorch's kernel and the candidate run on the same inputs, each timed,
// in an order that alternates call by call (Note [In-process win]); PyTorch's outputs are what the
// caller gets, and the candidate's are compared with them (Note [Shadow comparison]).
static void run_shadow(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const uint32_t n = op.identity.num_arguments;
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> snapshot;
  try {
    args.assign(stack->end() - n, stack->end());
    HookWorkScope scope;
    snapshot = snapshot_inputs(op, args);
  } catch (...) {
    op.original.callBoxed(handle, keys, stack);   // nothing to compare with: PyTorch's kernel alone
    return;
  }
  const bool entry_first = (r.counters->shadow_calls.fetch_add(1, std::memory_order_relaxed) & 1) != 0;
  std::vector<at::Tensor> cand;
  std::string why;
  uint64_t entry_ns = 0, pytorch_ns = 0;
  const bool in_place = writes_in_place(*r.plan);
  auto run_entry = [&]() noexcept {
    try {
      HookWorkScope scope;
      std::vector<c10::IValue> copy;   // Note [In-place calls]: the entry writes a copy of self
      if (in_place) copy = entry_arguments(*r.plan, args, snapshot);
      const auto t0 = std::chrono::steady_clock::now();
      why = run_candidate(op, r, in_place ? copy.data() : args.data(), cand, nullptr);
      entry_ns = elapsed_ns(t0);
      if (std::string wrote = restore_inputs(*r.plan, args, snapshot); !wrote.empty() && why.empty()) why = wrote;
    } catch (...) {
      why = shadow_exception_why();
    }
  };
  if (entry_first) run_entry();
  // An exception from PyTorch's own kernel reaches the caller, as without kforge.
  const auto t0 = std::chrono::steady_clock::now();
  op.original.callBoxed(handle, keys, stack);
  pytorch_ns = elapsed_ns(t0);
  if (!entry_first) run_entry();
  if (why.empty()) {
    try {
      HookWorkScope scope;
      why = compare_with_reference(op, handle, keys, in_place ? reference_arguments(*r.plan, args, snapshot) : args,
                                   *stack, cand);
    } catch (...) {
      why = shadow_exception_why();
    }
  }
  shadow_verdict(r, why, pytorch_ns, entry_ns);
}

// A hit in active state: the candidate alone; its outputs replace the arguments on the stack, as
// the original's would. Any failure: this call falls back to PyTorch's kernel and the entry is
// disabled (and quarantined by the loader). False when it fell back.
static bool run_active(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                c10::DispatchKeySet keys, torch::jit::Stack* stack, const at::Tensor* given) {
  const uint32_t n = op.identity.num_arguments;
  std::vector<at::Tensor> outs;
  std::string why;
  try {
    HookWorkScope scope;
    why = run_candidate(op, r, stack->data() + (stack->size() - n), outs, nullptr, given);
  } catch (const std::exception& e) {
    why = std::string("threw: ") + error_text(e);
  } catch (...) {
    why = "threw";
  }
  if (!why.empty()) {
    active_failed(op, r, handle, keys, stack, why);
    return false;
  }
  active_done(op, r, stack, outs);
  return true;
}

// A hit in the timing phase (Note [Timing phase] in swapper.h): call k of the phase runs PyTorch's
// kernel or the entry alone, as timing_turn_is_entry(k) says, exactly as an unhooked or an active
// call would, timed with a steady clock around it. A failure of the entry is an active failure.
static void run_timing(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                       c10::DispatchKeySet keys, torch::jit::Stack* stack, const at::Tensor* given) {
  const uint64_t k = r.counters->timing_calls.fetch_add(1, std::memory_order_relaxed);
  const auto t0 = std::chrono::steady_clock::now();
  if (!timing_turn_is_entry(k)) {
    try {
      op.original.callBoxed(handle, keys, stack);
    } catch (...) {
      r.owner->timing_call(r, k, 0);   // untimed, but counted: the phase still ends
      throw;                           // PyTorch's exception reaches the caller, as without kforge
    }
    r.owner->timing_call(r, k, elapsed_ns(t0));
    return;
  }
  if (run_active(op, r, handle, keys, stack, given)) r.owner->timing_call(r, k, elapsed_ns(t0));
}

// A CUDA hit (Note [CUDA calls]). Shadow, unless the stream is capturing: PyTorch's kernel (its
// outputs are the caller's) and the entry on the same inputs and stream, each between two CUDA
// events, in an order that alternates call by call (Note [In-process win]), then the comparison;
// while capturing, PyTorch's kernel alone. Active:
// the entry alone, also while capturing. Both run PyTorch's kernel instead where the entry cannot
// run (no module on the device, inputs on no or several devices, a driver error before the
// launch) without counting it against the entry.
static void run_cuda(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                     c10::DispatchKeySet keys, torch::jit::Stack* stack, const at::Tensor* given) {
  const uint32_t n = op.identity.num_arguments;
  const bool active = r.state == SwapState::kActive;
  const CudaDriver& cu = *r.cuda->driver;
  CudaCall call;
  std::string why;
  switch (call_device(op, stack->data() + (stack->size() - n), call.device, why)) {
    case CallDevice::kOne:
      call.module = r.cuda->on_device(call.device);
      if (call.module == nullptr) {
        r.counters->unloaded_device_calls.fetch_add(1, std::memory_order_relaxed);
        op.original.callBoxed(handle, keys, stack);
        return;
      }
      break;
    case CallDevice::kNone:
    case CallDevice::kSeveral:
      op.original.callBoxed(handle, keys, stack);
      return;
    case CallDevice::kNotCuda:
      if (active) return active_failed(op, r, handle, keys, stack, why);
      op.original.callBoxed(handle, keys, stack);
      r.counters->shadow_calls.fetch_add(1, std::memory_order_relaxed);
      return shadow_verdict(r, why);
  }

  if (active) {
    std::vector<at::Tensor> outs;
    bool pytorch = false;
    try {
      HookWorkScope scope;
      std::string driver_error = enter_device(cu, call);
      if (!driver_error.empty()) {
        log_cuda_passthrough(r, driver_error);
        pytorch = true;
      } else if (call.capture != CU_STREAM_CAPTURE_STATUS_NONE && call.capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        pytorch = true;   // an invalidated capture: PyTorch's kernel reports it, as without kforge
      } else {
        why = run_candidate(op, r, stack->data() + (stack->size() - n), outs, &call, given);
      }
    } catch (const std::exception& e) {
      why = std::string("threw: ") + error_text(e);
    } catch (...) {
      why = "threw";
    }
    leave_device(call);
    if (pytorch) {
      op.original.callBoxed(handle, keys, stack);
      return;
    }
    if (!why.empty()) return active_failed(op, r, handle, keys, stack, why);
    active_done(op, r, stack, outs);
    return;
  }

  // Shadow. Where nothing can be compared (a driver error entering the device, or a capture in
  // progress), PyTorch's kernel runs alone.
  std::vector<c10::IValue> args;
  std::string driver_error;
  try {
    args.assign(stack->end() - n, stack->end());
    HookWorkScope scope;
    driver_error = enter_device(cu, call);
  } catch (const std::exception& e) {
    driver_error = std::string("cannot copy the arguments: ") + e.what();
  } catch (...) {
    driver_error = "cannot copy the arguments";
  }
  if (!driver_error.empty() || call.capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    if (!driver_error.empty()) {
      log_cuda_passthrough(r, driver_error);
    } else {
      // Note [Swap states]: the comparison would synchronize inside the capture.
      r.counters->capture_shadow_skips.fetch_add(1, std::memory_order_relaxed);
    }
    leave_device(call);
    op.original.callBoxed(handle, keys, stack);
    return;
  }
  const bool entry_first = (r.counters->shadow_calls.fetch_add(1, std::memory_order_relaxed) & 1) != 0;
  std::vector<at::Tensor> snapshot, cand;
  std::optional<ShadowEvents> events;
  uint64_t entry_ns = 0, pytorch_ns = 0;
  const bool in_place = writes_in_place(*r.plan);
  auto run_entry = [&]() noexcept {
    try {
      HookWorkScope scope;
      std::vector<c10::IValue> copy;   // Note [In-place calls]: the entry writes a copy of self
      if (in_place) copy = entry_arguments(*r.plan, args, snapshot);
      if (events) events->record(0, call.stream);
      why = run_candidate(op, r, in_place ? copy.data() : args.data(), cand, &call);
      if (events) events->record(1, call.stream);
      // Our own synchronizing work, no part of any capture: relaxed, so it does not fail for (or
      // disturb) a graph another thread captures in global mode (ScopedCaptureMode).
      const ScopedCaptureMode relaxed(cu, CU_STREAM_CAPTURE_MODE_RELAXED);
      if (std::string wrote = restore_inputs(*r.plan, args, snapshot); !wrote.empty() && why.empty()) why = wrote;
    } catch (...) {
      why = shadow_exception_why();
    }
  };
  try {
    HookWorkScope scope;
    snapshot = snapshot_inputs(op, args);   // stream-ordered on the current stream
    events.emplace(cu);
  } catch (...) {
    why = shadow_exception_why();
  }
  if (why.empty() && entry_first) run_entry();
  // PyTorch's kernel on the same stream, under the same device and context (torch's own). An
  // exception from it reaches the caller, as without kforge (the guards unwind).
  if (events) events->record(2, call.stream);
  op.original.callBoxed(handle, keys, stack);
  if (events) events->record(3, call.stream);
  if (why.empty() && !entry_first) run_entry();
  if (why.empty()) {
    try {
      HookWorkScope scope;
      const ScopedCaptureMode relaxed(cu, CU_STREAM_CAPTURE_MODE_RELAXED);
      why = compare_with_reference(op, handle, keys, in_place ? reference_arguments(*r.plan, args, snapshot) : args,
                                   *stack, cand);
      if (why.empty() && events) {
        entry_ns = events->between(0, 1);
        pytorch_ns = events->between(2, 3);
      }
    } catch (...) {
      why = shadow_exception_why();
    }
  }
  events.reset();
  leave_device(call);
  shadow_verdict(r, why, pytorch_ns, entry_ns);
}

void run_replacement(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                     c10::DispatchKeySet keys, torch::jit::Stack* stack, const at::Tensor* given) {
  if (writes_in_place(*r.plan)) {
    // Note [In-place calls]: partial overlap is PyTorch's to refuse; exact aliasing is not shadowed.
    InPlaceAliasing aliasing = InPlaceAliasing::kPartial;
    try {
      HookWorkScope scope;
      if (stack->size() >= op.identity.num_arguments) {
        aliasing = in_place_aliasing(op, *r.plan, stack->data() + (stack->size() - op.identity.num_arguments));
      }
    } catch (...) {
    }
    if (aliasing == InPlaceAliasing::kPartial ||
        (aliasing == InPlaceAliasing::kExact && r.state == SwapState::kShadow)) {
      op.original.callBoxed(handle, keys, stack);
      return;
    }
  }
  if (r.backend == Backend::kCuda) {
    run_cuda(op, r, handle, keys, stack, r.state == SwapState::kActive ? given : nullptr);
  } else if (r.state == SwapState::kActive) {
    run_active(op, r, handle, keys, stack, given);
  } else if (r.state == SwapState::kTiming) {
    run_timing(op, r, handle, keys, stack, given);
  } else {
    run_shadow(op, r, handle, keys, stack);
  }
}

// Note [Out variants]
// An out= call (aten::add.out: the functional operator's arguments, then the tensors to write) is
// the functional call's computation written into tensors the caller gave, so the functional
// signature's entry serves it. The out variant's interceptor (interceptor.cc) writes the
// signature of the functional arguments, so the call is counted, timed and reported as that
// signature, and on a hit calls run_out_replacement. The entry writes the caller's tensors only
// where each is exactly what the plan would allocate (out_mismatch): defined, of the plan
// output's dtype, sizes and strides, on the inputs' device, its data aligned as torch's
// allocators align (64 bytes on the CPU, 256 on CUDA: a kernel may store in vectors), and sharing
// no memory with any input or with another out tensor. Otherwise (an out tensor PyTorch would
// resize, a strided or offset view, an out tensor that is also an input, which some operators
// allow) PyTorch's out kernel runs, as without kforge. In active state the entry writes the out
// tensors directly (run_replacement's `given`). In shadow state the call is the functional
// operator's shadow call (PyTorch's functional kernel, whose result the caller gets, and the
// entry compared with it; Note [Shadow comparison]) and PyTorch's result is copied into the out
// tensors: PyTorch's functional and out kernels of these operators are one implementation, and a
// shadow call costs several kernels anyway. An active call the entry cannot serve (it failed, or
// a driver error) gets PyTorch's functional result copied likewise.
namespace {

// The 64 bytes of c10's CPU allocator, the 256 bytes (and more) of torch's CUDA caching allocator.
constexpr uintptr_t kCpuOutputAlignment = 64;
constexpr uintptr_t kCudaOutputAlignment = 256;

// Empty when the entry may write `outs` (Note [Out variants]); else why not.
std::string out_mismatch(const InterceptedOp& functional, const Replacement& r, const c10::IValue* args,
                         c10::ArrayRef<at::Tensor> outs) {
  const ResolvedLaunchPlan& plan = *r.plan;
  if (plan.outputs.size() != outs.size() || functional.num_returns != outs.size()) {
    return "the plan makes " + std::to_string(plan.outputs.size()) + " outputs, the call gives " +
           std::to_string(outs.size());
  }
  // The inputs, tensor-list elements included, and their device.
  std::vector<const at::Tensor*> inputs;
  for (uint32_t i = 0; i < functional.identity.num_arguments; ++i) {
    if (args[i].isTensor()) {
      if (args[i].toTensor().defined()) inputs.push_back(&args[i].toTensor());
    } else if (args[i].isTensorList()) {
      for (const at::Tensor& t : args[i].toTensorList()) {
        if (t.defined()) inputs.push_back(&t);
      }
    }
  }
  if (inputs.empty()) return "no tensor input";
  const c10::Device device = inputs.front()->device();
  const bool cuda = r.backend == Backend::kCuda;
  if (cuda ? !device.is_cuda() : !device.is_cpu()) return "the inputs are not on the entry's backend";
  for (size_t k = 0; k < outs.size(); ++k) {
    const ResolvedOutput& o = plan.outputs[k];
    const at::Tensor& t = outs[k];
    const std::string which = "out tensor " + std::to_string(k);
    if (o.in_place_of >= 0) return "the plan writes an input in place";
    if (!t.defined()) return which + " is undefined";
    if (t.device() != device) return which + " is not on the inputs' device";
    if (t.scalar_type() != scalar_type_of(o.dtype) || t.sizes() != at::IntArrayRef(o.sizes) ||
        t.strides() != at::IntArrayRef(o.strides)) {
      return which + " is not the tensor the plan makes (dtype, sizes or strides)";
    }
    const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    if (t.numel() > 0 && address % (cuda ? kCudaOutputAlignment : kCpuOutputAlignment) != 0) {
      return which + " is not aligned as torch's allocator aligns";
    }
    for (const at::Tensor* in : inputs) {
      if (at::get_overlap_status(t, *in) != at::MemOverlapStatus::No) return which + " shares memory with an input";
    }
    for (size_t j = 0; j < k; ++j) {
      if (at::get_overlap_status(t, outs[j]) != at::MemOverlapStatus::No) {
        return which + " shares memory with out tensor " + std::to_string(j);
      }
    }
  }
  return {};
}

}  // namespace

bool run_out_replacement(const InterceptedOp& functional, const Replacement& r, c10::DispatchKeySet keys,
                         torch::jit::Stack& stack, c10::ArrayRef<at::Tensor> outs) {
  const uint32_t n = functional.identity.num_arguments;
  try {
    HookWorkScope scope;
    if (stack.size() != n || !out_mismatch(functional, r, stack.data(), outs).empty()) return false;
  } catch (...) {
    return false;
  }
  run_replacement(functional, r, functional.handle, keys, &stack, outs.data());
  // The stack holds the functional operator's results: the out tensors themselves where the entry
  // wrote them, else PyTorch's, copied in. An exception from that copy reaches the caller, as one
  // from PyTorch's out kernel would.
  HookWorkScope scope;
  const size_t k = outs.size();
  for (size_t i = 0; i < k; ++i) {
    const at::Tensor& result = stack[stack.size() - k + i].toTensor();
    if (!result.is_same(outs[i])) const_cast<at::Tensor&>(outs[i]).copy_(result);
  }
  return true;
}

}  // namespace kforge::hook

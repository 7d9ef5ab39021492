#include "interposer/hook/interceptor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>

#include "interposer/hook/catalog.h"
#include "interposer/hook/log.h"
#include "interposer/hook/replacement_table.h"
#include "interposer/hook/stack_signature.h"
#include "interposer/hook/swapper.h"
#include "runtime/cpu_backend.h"
#include "runtime/kernel_spec.h"

namespace kforge::hook {

namespace {

// Everything one interceptor needs, made at registration and never freed (the dispatcher may call
// the interceptor until the process ends).
struct InterceptedOp {
  InterceptedOp(OpIdentity id, std::string label, c10::SafeKernelFunction orig, Recorder* rec,
                TargetArch* target_arch, uint32_t returns, bool tensor_returns)
      : identity(std::move(id)), name(std::move(label)), original(std::move(orig)), recorder(rec),
        arch(target_arch), num_returns(returns), returns_tensors(tensor_returns) {}

  const OpIdentity identity;
  const std::string name;                  // "aten::add.Tensor@CPU", for logs
  const c10::SafeKernelFunction original;
  Recorder* const recorder;
  TargetArch* const arch;
  const uint32_t num_returns;              // from the schema
  const bool returns_tensors;              // every return is a Tensor (what replacements can make)
  std::atomic<bool> enabled{true};         // false: kforge code failed here; pass straight through

  void disable(std::string_view why) noexcept {
    if (enabled.exchange(false, std::memory_order_relaxed)) {
      log_line(std::string(why) + "; " + name + " is no longer intercepted (PyTorch's kernel runs)");
    }
  }
};

// The slow path's view of a call in flight, for Recorder::on_call's signature factory.
struct PendingCall {
  const InterceptedOp* op;
  const c10::IValue* args;
};

std::unique_ptr<OpSignature> make_signature(void* context) {
  auto* call = static_cast<PendingCall*>(context);
  return build_stack_signature(call->op->identity, call->args, *call->op->arch);
}

// ---- replacements (swapper.h, Note [Swap states]) ------------------------------------------------

// Set while kforge's own shadow/active code runs on this thread: an intercepted call made from
// there (kforge's code avoids catalog operators, so this is a safety net) goes to PyTorch's kernel.
// Read only on a hit, never on the miss path.
thread_local bool t_in_swap = false;

struct SwapScope {
  SwapScope() { t_in_swap = true; }
  ~SwapScope() { t_in_swap = false; }
};

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

// Runs the replacement on the arguments `args` (the op's inputs, still owned by the caller) into
// fresh outputs allocated through torch with the plan's dtype, sizes and strides. Returns an empty
// string on success, else why it failed. May throw (torch allocation): callers catch.
std::string run_candidate(const InterceptedOp& op, const Replacement& r, const c10::IValue* args,
                          std::vector<at::Tensor>& outs) {
  const ResolvedLaunchPlan& plan = *r.plan;
  if (!op.returns_tensors || plan.outputs.size() != op.num_returns) {
    return "the entry's plan makes " + std::to_string(plan.outputs.size()) + " tensor outputs but " + op.name +
           " returns " + std::to_string(op.num_returns) + (op.returns_tensors ? " tensors" : " values, not all tensors");
  }
  CpuBuffers io;
  io.inputs.assign(op.identity.num_arguments, nullptr);
  for (uint32_t i = 0; i < op.identity.num_arguments; ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined()) continue;
    if (!t.device().is_cpu()) return "input " + std::to_string(i) + " is not a CPU tensor";
    io.inputs[i] = t.data_ptr();
  }
  outs.clear();
  outs.reserve(plan.outputs.size());
  for (const ResolvedOutput& o : plan.outputs) {
    outs.push_back(at::empty_strided(o.sizes, o.strides,
                                     at::TensorOptions().dtype(scalar_type_of(o.dtype)).device(at::kCPU)));
    io.outputs.push_back(outs.back().data_ptr());
  }
  const Status s = run_cpu_plan(*r.module, *r.spec, plan, io);
  if (!s.ok()) return "launch failed: " + s.message();
  return {};
}

// Machine epsilon of an output dtype, for the accuracy floor.
double epsilon_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return 2.220446049250313e-16;
    case c10::ScalarType::Float: return 1.1920928955078125e-07;
    case c10::ScalarType::Half: return 9.765625e-04;
    case c10::ScalarType::BFloat16: return 7.8125e-03;
    default: return 0.125;   // float8 and anything else floating
  }
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// Note [Shadow comparison]
// One output of a shadow call: the candidate's (`cand`) against PyTorch's (`orig`, what the
// caller got), both against `ref`, PyTorch's own kernel run on the inputs converted to float64.
// Passes iff dtype, sizes and strides equal the original's; NaN positions match and Inf positions
// (and signs) match; and, over the elements finite in both orig and ref, in both measures
//   max|cand - ref|            <= 2 * max|orig - ref|            + 8 * eps(dtype) * max|ref|
//   ||cand - ref|| / ||ref||   <= 2 * ||orig - ref|| / ||ref||   + 8 * eps(dtype)
// (eps: float32 1.19e-7, float16 9.8e-4, bfloat16 7.8e-3, float64 2.2e-16; the floor lets a
// candidate that is exact to a few ulps pass when PyTorch's error happens to be 0). Non-floating
// outputs must be equal. Empty string: passed.
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
  const double eps = epsilon_of(orig.scalar_type());
  const double ref_max = fz.abs().max().item<double>();
  const double err_cand = (cz - fz).abs().max().item<double>();
  const double err_torch = (oz - fz).abs().max().item<double>();
  const double ref_norm = fz.norm().item<double>();
  const double scale = ref_norm > 0 ? ref_norm : 1.0;
  const double rel_cand = (cz - fz).norm().item<double>() / scale;
  const double rel_torch = (oz - fz).norm().item<double>() / scale;
  if (!(err_cand <= 2 * err_torch + 8 * eps * ref_max)) {
    return out + "max abs error " + fmt(err_cand) + " > 2 x PyTorch's " + fmt(err_torch) + " + floor " +
           fmt(8 * eps * ref_max);
  }
  if (!(rel_cand <= 2 * rel_torch + 8 * eps)) {
    return out + "relative L2 error " + fmt(rel_cand) + " > 2 x PyTorch's " + fmt(rel_torch) + " + floor " +
           fmt(8 * eps);
  }
  return {};
}

// After the original ran on `args` and left its outputs on top of `stack`: runs the candidate and
// the float64 reference and compares every output. Empty string: passed. May throw.
std::string shadow_compare(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                           c10::DispatchKeySet keys, const std::vector<c10::IValue>& args,
                           const torch::jit::Stack& stack) {
  std::vector<at::Tensor> cand;
  if (std::string err = run_candidate(op, r, args.data(), cand); !err.empty()) return err;
  if (stack.size() < op.num_returns) return "PyTorch's kernel left too few outputs";
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
  for (uint32_t i = 0; i < op.num_returns; ++i) {
    if (!orig[i].isTensor() || !ref[i].isTensor()) return "output " + std::to_string(i) + " is not a tensor";
    if (std::string err = compare_output(i, orig[i].toTensor(), cand[i], ref[i].toTensor()); !err.empty()) return err;
  }
  return {};
}

// A hit in shadow state: PyTorch's kernel runs first and its outputs are what the caller gets;
// then the candidate runs on the same inputs and is compared (Note [Shadow comparison]).
void run_shadow(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const uint32_t n = op.identity.num_arguments;
  std::vector<c10::IValue> args;
  try {
    args.assign(stack->end() - n, stack->end());
  } catch (...) {
    op.original.callBoxed(handle, keys, stack);
    return;
  }
  // An exception from PyTorch's own kernel reaches the caller, as without kforge.
  op.original.callBoxed(handle, keys, stack);
  r.counters->shadow_calls.fetch_add(1, std::memory_order_relaxed);
  std::string why;
  try {
    SwapScope scope;
    why = shadow_compare(op, r, handle, keys, args, *stack);
  } catch (const std::exception& e) {
    why = std::string("shadow call threw: ") + e.what();
  } catch (...) {
    why = "shadow call threw";
  }
  if (why.empty()) {
    r.owner->shadow_clean(r);
  } else {
    r.owner->fail(r, "shadow mismatch: " + why);
  }
}

// A hit in active state: the candidate alone; its outputs replace the arguments on the stack, as
// the original's would. Any failure: this call falls back to PyTorch's kernel and the entry is
// disabled (and quarantined by the loader).
void run_active(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const uint32_t n = op.identity.num_arguments;
  std::vector<at::Tensor> outs;
  std::string why;
  try {
    SwapScope scope;
    why = run_candidate(op, r, stack->data() + (stack->size() - n), outs);
  } catch (const std::exception& e) {
    why = std::string("threw: ") + e.what();
  } catch (...) {
    why = "threw";
  }
  if (!why.empty()) {
    r.counters->fallbacks.fetch_add(1, std::memory_order_relaxed);
    r.owner->fail(r, "active call failed: " + why);
    op.original.callBoxed(handle, keys, stack);
    return;
  }
  torch::jit::drop(*stack, n);
  for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  r.counters->active_calls.fetch_add(1, std::memory_order_relaxed);
}

// Note [Interceptor fast path]
// Per call, with no heap allocation and no lock: encode the signature into a 1 KiB buffer on this
// stack frame and hash it (SignatureWriter), one acquire load and a probe of the replacement
// table, a probe of this thread's counter table, then the original kernel. The arguments stay on
// the stack untouched for the original to consume. A thread's first call of a signature also
// builds the OpSignature (allocating) and checks its id against the fast one. One CPU call in
// KFORGE_SAMPLE_RATE is timed with steady_clock around the original; CUDA calls are not timed yet
// (that needs CUDA events, and never inside stream capture).
class Interceptor final : public c10::OperatorKernel {
 public:
  explicit Interceptor(InterceptedOp* op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    InterceptedOp& op = *op_;
    const uint32_t n = op.identity.num_arguments;
    if (!op.enabled.load(std::memory_order_relaxed) || stack->size() < n) [[unlikely]] {
      op.original.callBoxed(handle, keys, stack);
      return;
    }
    const c10::IValue* args = stack->data() + (stack->size() - n);

    SignatureWriter writer;
    if (!write_stack_signature(op.identity, args, *op.arch, writer)) {
      op.recorder->on_unknown_call();
      op.original.callBoxed(handle, keys, stack);
      return;
    }
    const SignatureId id = writer.id();

    const Replacement* r = ReplacementTable::current()->find(id);

    PendingCall pending{&op, args};
    const Recorder::Call call =
        op.recorder->on_call(id, &make_signature, &pending, op.identity.backend == Backend::kCpu);
    if (call.id_mismatch) [[unlikely]] op.disable("signature encoders disagree");

    // Observe mode publishes no replacements; shadow and active modes take this branch (CPU only;
    // a shadow/active call is not timed by the recorder's sampling).
    if (r != nullptr && !t_in_swap && op.identity.backend == Backend::kCpu && !call.id_mismatch) [[unlikely]] {
      if (r->state == SwapState::kActive) {
        run_active(op, *r, handle, keys, stack);
      } else {
        run_shadow(op, *r, handle, keys, stack);
      }
      return;
    }

    if (call.sample) {
      const auto t0 = std::chrono::steady_clock::now();
      op.original.callBoxed(handle, keys, stack);
      const auto t1 = std::chrono::steady_clock::now();
      Recorder::add_sample(call.slot, static_cast<uint64_t>(
                                          std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      return;
    }
    op.original.callBoxed(handle, keys, stack);
  }

 private:
  InterceptedOp* op_;
};

const char* key_name(c10::DispatchKey key) { return key == c10::DispatchKey::CUDA ? "CUDA" : "CPU"; }

}  // namespace

RegistrationSummary register_catalog(const HookConfig& config, Recorder& recorder, TargetArch& arch) noexcept {
  RegistrationSummary summary;
  try {
    struct Key {
      c10::DispatchKey key;
      Backend backend;
      torch::Library* library;
    };
    // Never destroyed: destroying a Library deregisters its kernels, which would race with
    // threads dispatching through them.
    Key keys[] = {
        {c10::DispatchKey::CPU, Backend::kCpu, nullptr},
        {c10::DispatchKey::CUDA, Backend::kCuda, nullptr},
    };
    for (Key& k : keys) {
      try {
        k.library = new torch::Library(torch::Library::IMPL, "aten", k.key, __FILE__, __LINE__);
      } catch (const std::exception& e) {
        summary.skipped.push_back(std::string("every operator@") + key_name(k.key) +
                                  ": cannot open a library: " + e.what());
      }
    }

    for (const CatalogOp& cat : kCatalog) {
      const std::string qualified = cat.qualified();
      if (!config.op_selected(cat.name, cat.overload)) {
        summary.skipped.push_back(qualified + ": not selected (KFORGE_OPS / KFORGE_DENY_OPS)");
        continue;
      }
      std::optional<c10::OperatorHandle> handle;
      try {
        handle = c10::Dispatcher::singleton().findSchema(
            c10::OperatorName(std::string(cat.name), std::string(cat.overload)));
      } catch (const std::exception& e) {
        summary.skipped.push_back(qualified + ": lookup failed: " + e.what());
        continue;
      }
      if (!handle) {
        summary.skipped.push_back(qualified + ": not an operator of this torch");
        continue;
      }
      for (Key& k : keys) {
        const std::string label = qualified + "@" + key_name(k.key);
        if (k.library == nullptr) continue;
        try {
          if (!handle->hasKernelForDispatchKey(k.key)) {
            summary.skipped.push_back(label + ": no kernel at this key");
            continue;
          }
          OpIdentity identity{std::string(cat.name), std::string(cat.overload),
                              static_cast<uint32_t>(handle->schema().arguments().size()), k.backend};
          // The original first: once ours is registered, the computed kernel is ours.
          const auto& returns = handle->schema().returns();
          bool tensor_returns = true;
          for (const c10::Argument& ret : returns) {
            tensor_returns = tensor_returns && ret.type()->kind() == c10::TypeKind::TensorType;
          }
          auto* op = new InterceptedOp(std::move(identity), label,
                                       handle->getComputedKernelForDispatchKey(k.key), &recorder, &arch,
                                       static_cast<uint32_t>(returns.size()), tensor_returns);
          std::string impl_name(cat.name.substr(cat.name.find("::") + 2));
          if (!cat.overload.empty()) impl_name += "." + std::string(cat.overload);
          k.library->impl(impl_name.c_str(),
                          torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Interceptor>(op)));
          summary.registered.push_back(label);
        } catch (const std::exception& e) {
          summary.skipped.push_back(label + ": registration failed: " + e.what());
        }
      }
    }
  } catch (...) {
    summary.skipped.push_back("registration stopped by an unexpected error");
  }
  return summary;
}

}  // namespace kforge::hook

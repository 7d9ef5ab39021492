#include "interposer/hook/swap_call.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "interposer/hook/swapper.h"
#include "runtime/cpu_backend.h"
#include "runtime/kernel_spec.h"

namespace kforge::hook {

namespace {

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

}  // namespace

bool in_swap_call() noexcept { return t_in_swap; }

// A hit in shadow state: PyTorch's kernel runs first and its outputs are what the caller gets;
// then the candidate runs on the same inputs and is compared (Note [Shadow comparison]).
static void run_shadow(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
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
static void run_active(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
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


void run_replacement(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                     c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (r.state == SwapState::kActive) {
    run_active(op, r, handle, keys, stack);
  } else {
    run_shadow(op, r, handle, keys, stack);
  }
}

}  // namespace kforge::hook

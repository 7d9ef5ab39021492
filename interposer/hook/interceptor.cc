#include "interposer/hook/interceptor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

// #include <ATen/ops/<base>_ops.h> for every KFORGE_CATALOG_OPERATORS line (interposer/hook/CMakeLists.txt).
#include "interposer/hook/catalog_ops_includes.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "interposer/hook/cuda_timer.h"
#include "interposer/hook/hook_work.h"
#include "interposer/hook/intercepted_op.h"
#include "interposer/hook/log.h"
#include "interposer/hook/replacement_table.h"
#include "interposer/hook/stack_signature.h"
#include "interposer/hook/swap_call.h"
#include "runtime/op_catalog.h"

namespace kforge::hook {

namespace {

// The slow path's view of a call in flight, for Recorder::on_call's signature factory.
struct PendingCall {
  const InterceptedOp* op;
  const c10::IValue* args;
};

std::unique_ptr<OpSignature> make_signature(void* context) {
  auto* call = static_cast<PendingCall*>(context);
  std::unique_ptr<OpSignature> sig = build_stack_signature(call->op->identity, call->args, *call->op->arch);
  if (sig && call->op->sampler != nullptr) call->op->sampler->sample(sig->id(), call->args, call->op->identity.num_arguments);
  return sig;
}

// Note [Observed calls]
// Observing a call (its signature: read every argument, encode and hash them, probe the
// replacement table and this thread's counters) costs little in a loop that calls one operator,
// but between the hundreds of other operator calls of a model step its code and data are cold
// again each time: on a host-bound GPT-2 decode step that came to 700-950 ns per intercepted call,
// +1.22% of a step on the H200 host and +1.45% with --n-embd 64 on a CPU VM, several times what
// the same path costs in a tight loop (bench/e2e_toggle.py --continuous; about +0.5% at 16:
// bench/results/2026-12-04-*-e2e-toggle-observe.log). So while no replacement is loaded for an
// operator at a backend (the replacement table does not serve its ObserveSlots slot: observe
// mode, an empty cache, nothing hot yet, or kernels only for other operators), each thread
// observes about one call in KFORGE_OBSERVE_EVERY of it and runs the others straight through to
// PyTorch's kernel. The gaps between observed calls are drawn at random from 1..2N-1 (mean N), so
// no periodic call pattern (a model step calling one operator on two shapes alternately) can
// hide a signature, and each observed call is counted with the number of calls since the
// previous one (its weight): a thread's count of an operator is exact up to its last observed
// call, and split among signatures in proportion to what was observed. A thread's first call of
// each operator is observed (first sight, which is when the loader looks for cache entries).
// Once a replacement is loaded for an operator, every call of it is observed, as a hit must be
// found on every call; the next call then carries the calls skipped before it.
// KFORGE_OBSERVE_EVERY=1 observes every call, always.
uint32_t next_gap(HookThread& t, uint32_t every) noexcept {
  uint64_t x = t.observe_rng;
  if (x == 0) x = reinterpret_cast<uintptr_t>(&t) | 1;   // a per-thread seed
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  t.observe_rng = x;
  return 1 + static_cast<uint32_t>(x % (2 * static_cast<uint64_t>(every) - 1));
}

// 0: do not observe this call (run PyTorch's kernel and nothing else). Otherwise the number of
// calls this observed one stands for (Recorder::on_call's weight).
// Also 0 for kforge's own calls (Note [The hook's own tensor work] in hook_work.h) and where the
// interceptor is disabled.
[[gnu::always_inline]] inline uint32_t observe(const InterceptedOp& op, HookThread& t) noexcept {
  if (!op.enabled.load(std::memory_order_relaxed) || t.hook_work) [[unlikely]] return 0;
  const uint32_t slot = op.observe_slot;
  if (slot >= kObserveSlots) return 1;
  ObserveCountdown& c = t.observe[slot];
  const uint32_t left = c.left;
  const bool sampling = !ReplacementTable::serving(slot);
  if (left != 0 && sampling) [[likely]] {
    c.left = left - 1;
    return 0;
  }
  const uint32_t weight = c.gap + 1 - left;   // the calls since the last observed one, this one included
  const uint32_t gap = sampling && op.observe_every > 1 ? next_gap(t, op.observe_every) : 1;
  c.left = gap - 1;
  c.gap = gap - 1;
  return weight;
}

// Note [Interceptor fast path]
// A call that is not observed (Note [Observed calls]) costs one thread-local lookup (Note [One
// thread-local block] in hook_work.h), a countdown there, one relaxed load of the serving mask
// (ReplacementTable::serving), the first cache line of its InterceptedOp, then the original
// kernel: the typed interceptor's call() is just that, the observed path out of line. Between a
// model's other calls none of this is in cache, so what counts is how many distinct lines and
// pages a call touches, more than how many instructions it runs: on a host-bound GPT-2 decode
// step (CPU, width 64) an unobserved call cost 0.29 us when it made three __tls_get_addr calls,
// read its operator's fields from two lines and the mask through three dependent loads
// (bench/e2e_toggle.py --observe-every 1000000). Per observed call, with no
// heap allocation and no lock: encode the signature into a 1 KiB buffer on this
// stack frame and hash it (SignatureWriter; the operator's head and the target are copied, encoded
// once: SignaturePiece), one acquire load and a probe of the replacement table, a probe of this
// thread's counter table (Recorder::on_call, inlined), then the original kernel. The arguments stay on
// the stack untouched for the original to consume. A thread's first call of a signature also
// builds the OpSignature (allocating) and checks its id against the fast one. One CPU call in
// KFORGE_SAMPLE_RATE is timed with steady_clock around the original. The boxed interceptor does
// not time CUDA calls; the typed one does, with CUDA events (cuda_timer.h).
class Interceptor final : public c10::OperatorKernel {
 public:
  explicit Interceptor(InterceptedOp* op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    InterceptedOp& op = *op_;
    HookThread& t = hook_thread_at(op.thread_block_offset);
    const uint32_t n = op.identity.num_arguments;
    const uint32_t weight = stack->size() < n ? 0 : observe(op, t);
    HookWorkScope nested(t);   // Note [Nested catalog calls] in hook_work.h
    if (weight == 0) {
      op.original.callBoxed(handle, keys, stack);
      return;
    }
    const c10::IValue* args = stack->data() + (stack->size() - n);

    SignatureWriter writer;
    if (!write_stack_signature(op.identity, args, *op.arch, writer)) {
      op.recorder->on_unknown_call(weight);
      op.original.callBoxed(handle, keys, stack);
      return;
    }
    const SignatureId id = writer.id();

    const Replacement* r = ReplacementTable::current()->find(id);

    PendingCall pending{&op, args};
    const Recorder::Call call =
        op.recorder->on_call(id, &make_signature, &pending, op.identity.backend == Backend::kCpu, weight);
    if (call.id_mismatch) [[unlikely]] op.disable("signature encoders disagree");

    // Observe mode publishes no replacements; shadow and active modes take this branch (a
    // shadow/active call is not timed by the recorder's sampling).
    if (r != nullptr && !call.id_mismatch) [[unlikely]] {
      run_replacement(op, *r, handle, keys, stack);
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

// ---- typed interceptors ---------------------------------------------------------------------------

// Note [Typed interceptors]
// The boxed Interceptor above costs, on every call, what boxing costs: the dispatcher packs the
// caller's C++ arguments into a heap-allocated IValue stack for it, and the original (an unboxed
// kernel) unpacks them again, and the result the same way back. For the catalog operators whose
// C++ signature kforge knows (at::_ops::<op>::schema, the signature PyTorch's own typed calls
// use), a typed interceptor is registered instead: the dispatcher calls it with the C++ arguments,
// it writes the signature from them (write_typed_signature: same bytes as the boxed encoder), and
// calls PyTorch's kernel unboxed with the arguments untouched. Only a hit (shadow/active) boxes
// the arguments, to share the replacement path with the boxed interceptor.
//
// Calling the original unboxed needs its KernelFunction. OperatorHandle::getComputedKernelForDispatchKey
// returns it wrapped in a SafeKernelFunction that offers only callBoxed; the wrapped copy is read
// through a pointer to its private member, formed by explicit template instantiation (which C++
// exempts from access checks), so a torch whose SafeKernelFunction has no `kernel_` fails to compile
// the hook built for it rather than misbehave. SafeKernelFunction's callBoxed also checks a token
// that turns invalid if the original's registration is removed; aten's own kernels are registered
// statically for the life of the process, so the unboxed call skips that check.
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
  friend typename Tag::type private_member(Tag) { return Member; }
};
struct SafeKernelFunctionKernel {
  using type = c10::KernelFunction c10::SafeKernelFunction::*;
  friend type private_member(SafeKernelFunctionKernel);
};
template struct PrivateMember<SafeKernelFunctionKernel, &c10::SafeKernelFunction::kernel_>;

const c10::KernelFunction& unboxed_original(const InterceptedOp& op) {
  return op.original.*private_member(SafeKernelFunctionKernel{});
}

// The first of a call's arguments (an in-place operator's self).
template <class First, class... Rest>
First& first_argument(First& first, Rest&...) {
  return first;
}

// An observed call that no replacement serves: PyTorch's kernel, timed where the recorder asked
// for a sample (CPU: a steady clock around it; CUDA: events on torch's current stream, read later
// by the reporter thread, cuda_timer.h). A are the schema's C++ argument types, given explicitly.
template <class R, class... A>
R call_original(const InterceptedOp& op, const c10::KernelFunction& original, const Recorder::Call& call, bool cuda,
                int cuda_index, SignatureId id, c10::DispatchKeySet keys, A... args) {
  if (call.sample && cuda) {
    const CudaTimer::Mark mark = op.timer->begin(cuda_index);
    R result = original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    op.timer->end(mark, id);
    return result;
  }
  if (call.sample) {
    const auto t0 = std::chrono::steady_clock::now();
    R result = original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    const auto t1 = std::chrono::steady_clock::now();
    Recorder::add_sample(call.slot, static_cast<uint64_t>(
                                        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    return result;
  }
  return original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
}

template <class Sig>
struct TypedInterceptor;

template <class R, class... A>
struct TypedInterceptor<R(A...)> {
  // For Recorder::on_call's slow path: the boxed arguments, read by the boxed signature builder.
  struct Pending {
    const InterceptedOp* op;
    std::tuple<const std::remove_cv_t<std::remove_reference_t<A>>&...> args;
  };

  static std::unique_ptr<OpSignature> make_signature(void* context) {
    auto* p = static_cast<Pending*>(context);
    const torch::jit::Stack boxed =
        std::apply([](const auto&... a) { return c10::impl::boxArgs<const std::remove_cvref_t<A>&...>(a...); },
                   p->args);
    if (boxed.size() != p->op->identity.num_arguments) return nullptr;
    std::unique_ptr<OpSignature> sig = build_stack_signature(p->op->identity, boxed.data(), *p->op->arch);
    if (sig && p->op->sampler != nullptr) p->op->sampler->sample(sig->id(), boxed.data(), p->op->identity.num_arguments);
    return sig;
  }

  // Note [Interceptor fast path]: the unobserved call, all of it.
  static R call(InterceptedOp& op, c10::DispatchKeySet keys, A... args) {
    HookThread& t = hook_thread_at(op.thread_block_offset);
    const uint32_t weight = observe(op, t);
    if (weight == 0) [[likely]] {
      HookWorkScope nested(t);   // Note [Nested catalog calls] in hook_work.h
      return unboxed_original(op).call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    }
    return observed_call(op, t, weight, keys, std::forward<A>(args)...);
  }

  // An observed call: out of line, so the fast path above stays a few instructions.
  [[gnu::noinline]] static R observed_call(InterceptedOp& op, HookThread& t, uint32_t weight, c10::DispatchKeySet keys,
                                           A... args) {
    const c10::KernelFunction& original = unboxed_original(op);
    HookWorkScope nested(t);   // Note [Nested catalog calls] in hook_work.h
    SignatureWriter writer;
    int cuda_index = -1;
    if (!write_typed_signature(op.identity, *op.arch, writer, cuda_index, args...)) {
      op.recorder->on_unknown_call(weight);
      return original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    }
    const SignatureId id = writer.id();
    const Replacement* r = ReplacementTable::current()->find(id);

    Pending pending{&op, {args...}};
    const bool cuda = op.identity.backend == Backend::kCuda;
    const Recorder::Call call =
        op.recorder->on_call(id, &make_signature, &pending, !cuda || (op.timer != nullptr && cuda_index >= 0), weight);
    if (call.id_mismatch) [[unlikely]] op.disable("signature encoders disagree");

    if (r != nullptr && !call.id_mismatch) [[unlikely]] {
      std::optional<torch::jit::Stack> stack;
      try {
        stack.emplace(c10::impl::boxArgs<A...>(args...));
      } catch (...) {
        // Out of memory boxing: this call goes to PyTorch's kernel.
      }
      if (stack) {
        run_replacement(op, *r, op.handle, keys, &*stack);
        if constexpr (std::is_lvalue_reference_v<R>) {
          // An in-place operator (relu_, add_: `Tensor& (Tensor& self, ...)`) returns self, which the
          // entry or PyTorch's kernel wrote (Note [In-place calls] in swap_call.cc).
          return first_argument(args...);
        } else {
          return c10::impl::PopResult<R>::call(*stack);
        }
      }
    }

    return call_original<R, A...>(op, original, call, cuda, cuda_index, id, keys, std::forward<A>(args)...);
  }

  static torch::CppFunction function(InterceptedOp* op) {
    return torch::CppFunction(
        [op](c10::DispatchKeySet keys, A... args) -> R { return call(*op, keys, std::forward<A>(args)...); });
  }
};

// How many of a C++ signature's last arguments are `Tensor&`: an out variant's out tensors (its
// inputs are `const Tensor&`).
template <class... A>
constexpr size_t trailing_out_tensors() {
  constexpr bool is_out[] = {std::is_same_v<A, at::Tensor&>..., false};
  size_t k = 0;
  for (size_t i = sizeof...(A); i > 0 && is_out[i - 1]; --i) ++k;
  return k;
}

template <class Sig>
struct TypedOutInterceptor;

// Note [Out variants] in swap_call.cc: the interceptor of an out variant (aten::add.out). Its first
// N arguments are the functional operator's, its last K the out tensors; op.identity is the
// functional operator's (N arguments), so the signature, the counts and the entries are the
// functional signature's. The unobserved call is the typed interceptor's fast path.
template <class R, class... A>
struct TypedOutInterceptor<R(A...)> {
  static constexpr size_t K = trailing_out_tensors<A...>();
  static constexpr size_t N = sizeof...(A) - K;
  static_assert(K >= 1, "an out variant writes at least one tensor");

  using Args = std::tuple<A&...>;   // references to call()'s own parameters
  using FunctionalArgs = std::tuple<const std::remove_cv_t<std::remove_reference_t<A>>&...>;

  struct Pending {
    const InterceptedOp* op;
    const Args* args;
  };

  template <size_t... I>
  static torch::jit::Stack box_functional(const Args& args, std::index_sequence<I...>) {
    using Tuple = std::tuple<std::remove_cvref_t<A>...>;
    return c10::impl::boxArgs<const std::tuple_element_t<I, Tuple>&...>(std::get<I>(args)...);
  }

  static std::unique_ptr<OpSignature> make_signature(void* context) {
    auto* p = static_cast<Pending*>(context);
    const torch::jit::Stack boxed = box_functional(*p->args, std::make_index_sequence<N>());
    if (boxed.size() != p->op->identity.num_arguments) return nullptr;
    std::unique_ptr<OpSignature> sig = build_stack_signature(p->op->identity, boxed.data(), *p->op->arch);
    if (sig && p->op->sampler != nullptr) p->op->sampler->sample(sig->id(), boxed.data(), p->op->identity.num_arguments);
    return sig;
  }

  template <size_t... I>
  static bool write_signature(const InterceptedOp& op, SignatureWriter& writer, int& cuda_index, const Args& args,
                              std::index_sequence<I...>) {
    return write_typed_signature(op.identity, *op.arch, writer, cuda_index, std::get<I>(args)...);
  }

  // The out tensors, as the schema returns them (Tensor&, or a tuple of them).
  template <size_t... I>
  static R results(const Args& args, std::index_sequence<I...>) {
    if constexpr (K == 1) {
      return std::get<N>(args);
    } else {
      return R(std::get<N + I>(args)...);
    }
  }

  template <size_t... I>
  static std::array<at::Tensor, K> out_tensors(const Args& args, std::index_sequence<I...>) {
    return {std::get<N + I>(args)...};
  }

  static R call(InterceptedOp& op, c10::DispatchKeySet keys, A... args) {
    HookThread& t = hook_thread_at(op.thread_block_offset);
    const uint32_t weight = observe(op, t);
    if (weight == 0) [[likely]] {
      HookWorkScope nested(t);   // Note [Nested catalog calls] in hook_work.h
      return unboxed_original(op).call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    }
    return observed_call(op, t, weight, keys, std::forward<A>(args)...);
  }

  [[gnu::noinline]] static R observed_call(InterceptedOp& op, HookThread& t, uint32_t weight, c10::DispatchKeySet keys,
                                           A... args) {
    const c10::KernelFunction& original = unboxed_original(op);
    HookWorkScope nested(t);   // Note [Nested catalog calls] in hook_work.h
    const Args all(args...);
    SignatureWriter writer;
    int cuda_index = -1;
    if (!write_signature(op, writer, cuda_index, all, std::make_index_sequence<N>())) {
      op.recorder->on_unknown_call(weight);
      return original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    }
    const SignatureId id = writer.id();
    const Replacement* r = ReplacementTable::current()->find(id);
    Pending pending{&op, &all};
    const bool cuda = op.identity.backend == Backend::kCuda;
    const Recorder::Call call =
        op.recorder->on_call(id, &make_signature, &pending, !cuda || (op.timer != nullptr && cuda_index >= 0), weight);
    if (call.id_mismatch) [[unlikely]] op.disable("signature encoders disagree");

    if (r != nullptr && !call.id_mismatch && op.functional != nullptr) [[unlikely]] {
      std::optional<torch::jit::Stack> stack;
      std::array<at::Tensor, K> outs;
      try {
        stack.emplace(box_functional(all, std::make_index_sequence<N>()));
        outs = out_tensors(all, std::make_index_sequence<K>());
      } catch (...) {
        stack.reset();   // out of memory boxing: PyTorch's kernel
      }
      if (stack && run_out_replacement(*op.functional, *r, keys, *stack, outs)) {
        return results(all, std::make_index_sequence<K>());
      }
      return original.call<R, A...>(op.handle, keys, std::forward<A>(args)...);
    }

    return call_original<R, A...>(op, original, call, cuda, cuda_index, id, keys, std::forward<A>(args)...);
  }

  static torch::CppFunction function(InterceptedOp* op) {
    return torch::CppFunction(
        [op](c10::DispatchKeySet keys, A... args) -> R { return call(*op, keys, std::forward<A>(args)...); });
  }
};

struct TypedFactory {
  std::string_view name;
  std::string_view overload;
  torch::CppFunction (*make)(InterceptedOp*);
};

template <class Op>
torch::CppFunction make_typed(InterceptedOp* op) {
  return TypedInterceptor<typename Op::schema>::function(op);
}

// One per catalog operator, from the catalog's own list (runtime/op_catalog.h), so an operator
// cannot be in the catalog without one. constexpr, so it is constant-initialized: registration
// runs from the hook's start-up, which may come before this file's dynamic initializers.
#define KFORGE_TYPED_OP(base) {"aten::" #base, "", &make_typed<at::_ops::base>},
#define KFORGE_TYPED_OP_OVERLOAD(base, overload) {"aten::" #base, #overload, &make_typed<at::_ops::base##_##overload>},
constexpr TypedFactory kTypedFactories[] = {KFORGE_CATALOG_OPERATORS(KFORGE_TYPED_OP, KFORGE_TYPED_OP_OVERLOAD)};
#undef KFORGE_TYPED_OP
#undef KFORGE_TYPED_OP_OVERLOAD
static_assert(std::size(kTypedFactories) == catalog::kOperatorCount);

// Note [Out variants] in swap_call.cc: a typed interceptor for each out variant the catalog's
// KFORGE_CATALOG_OUT_VARIANTS lists (all of OpEntry::out_variant but aten::_to_copy.out).
template <class Op>
torch::CppFunction make_typed_out(InterceptedOp* op) {
  return TypedOutInterceptor<typename Op::schema>::function(op);
}
#define KFORGE_OUT(base, overload) {"aten::" #base, #overload, &make_typed_out<at::_ops::base##_##overload>},
constexpr TypedFactory kOutFactories[] = {KFORGE_CATALOG_OUT_VARIANTS(KFORGE_OUT)};
#undef KFORGE_OUT

const TypedFactory* find_out(std::string_view qualified) {
  for (const TypedFactory& f : kOutFactories) {
    if (qualified.size() == f.name.size() + 1 + f.overload.size() && qualified.starts_with(f.name) &&
        qualified[f.name.size()] == '.' && qualified.ends_with(f.overload)) {
      return &f;
    }
  }
  return nullptr;
}

// Empty when `out`'s arguments are `functional`'s (names and types) followed by as many out
// tensors as `functional` returns; else why not.
std::string out_schema_mismatch(const c10::FunctionSchema& functional, const c10::FunctionSchema& out) {
  const auto& fa = functional.arguments();
  const auto& oa = out.arguments();
  const size_t n = fa.size();
  if (oa.size() != n + functional.returns().size()) return "it does not take one out tensor per result";
  for (size_t i = 0; i < n; ++i) {
    if (oa[i].name() != fa[i].name() || *oa[i].type() != *fa[i].type()) {
      return "its argument " + std::to_string(i) + " is not the functional operator's";
    }
  }
  for (size_t i = n; i < oa.size(); ++i) {
    if (!oa[i].is_out() || oa[i].type()->kind() != c10::TypeKind::TensorType) return "its last arguments are not out tensors";
  }
  return {};
}

const TypedFactory* find_typed(const catalog::OpEntry& cat) {
  for (const TypedFactory& f : kTypedFactories) {
    if (f.name == cat.name && f.overload == cat.overload) return &f;
  }
  return nullptr;
}

std::string first_line(std::string_view s) { return std::string(s.substr(0, s.find('\n'))); }

const char* key_name(c10::DispatchKey key) { return key == c10::DispatchKey::CUDA ? "CUDA" : "CPU"; }

// Registers op's interceptor in `library` as impl_name: the typed one where the catalog operator
// has one, the boxed one otherwise or if this torch refuses the typed one (a schema that changed).
// Returns how ("typed", or "boxed" with why); throws what library.impl throws for the boxed one.
std::string register_interceptor(torch::Library& library, const std::string& impl_name, const catalog::OpEntry& cat,
                                 InterceptedOp* op) {
  std::string how = "boxed";
  if (const TypedFactory* typed = find_typed(cat)) {
    try {
      library.impl(impl_name.c_str(), typed->make(op));
      return "typed";
    } catch (const std::exception& e) {
      how = "boxed (the typed interceptor was refused: " + first_line(e.what()) + ")";
    }
  }
  library.impl(impl_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Interceptor>(op)));
  return how;
}

// Note [Quiet registration]
// Registering an interceptor at a key where aten already has a kernel makes PyTorch warn, once per
// process, "Warning only once for all operators, other operators may also be overridden.
// Overriding a previously registered kernel for the same operator and the same dispatch key ...
// registered at <file>:<line>": several lines on stderr of every hooked process (every server
// worker, every multiprocessing child), naming a path of the machine the hook was built on.
// Overriding is exactly what kforge means to do, so while (and only while) kforge registers, a
// c10 warning handler of its own is installed on the registering thread (c10's handler is
// thread-local) that drops that one warning, counts it, and passes every other warning to the
// handler that was there before; a guard restores that handler afterwards, whatever happens.
// Consequences: the warning is TORCH_WARN_ONCE, so having been raised (and dropped) here, it is
// not raised again for a later override by the program itself; KFORGE_LOG=1 says in one line that
// it was suppressed. The libraries name their source as kLibrarySource (PyTorch quotes it in
// errors about our registrations), and the hook is compiled with -ffile-prefix-map, so no path of
// the build machine can reach a user's logs.
constexpr const char* kLibrarySource = "kforge/interceptor.cc";

class RegistrationWarningFilter final : public c10::WarningHandler {
 public:
  RegistrationWarningFilter() : previous_(c10::WarningUtils::get_warning_handler()) {}

  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel for the same operator") != std::string::npos) {
      ++suppressed_;
      return;
    }
    if (previous_ != nullptr) previous_->process(warning);
  }
  uint32_t suppressed() const { return suppressed_; }

 private:
  c10::WarningHandler* previous_;
  uint32_t suppressed_ = 0;
};

// Installs a RegistrationWarningFilter on this thread for its life; the previous handler after.
class QuietRegistration {
 public:
  QuietRegistration() : guard_(&filter_) {}
  uint32_t suppressed() const { return filter_.suppressed(); }

 private:
  RegistrationWarningFilter filter_;   // constructed first: it reads the previous handler
  c10::WarningUtils::WarningHandlerGuard guard_;
};

// Note [Bench toggle]
// What a benchmark needs to measure kforge's cost inside one process: with KFORGE_BENCH_TOGGLE=1,
// register_catalog keeps its libraries and registrations here, and set_interceptors_registered()
// destroys the libraries (the dispatcher then computes PyTorch's own kernels again, exactly the
// table of a process without kforge) and makes new ones with the same InterceptedOps (counters,
// originals and replacement table kept). Comparing blocks of decode steps with and without the
// interceptors in one process removes the process-to-process speed differences of a VM, which are
// larger than the effect (bench/e2e_toggle.py). Destroying a library races with
// threads dispatching through it, the reason kforge never deregisters otherwise: the caller
// guarantees that no other thread calls the catalog's operators while it toggles. Never
// enabled without the variable; never touched by the hook itself.
struct BenchToggle {
  struct Registration {
    std::ptrdiff_t key;   // index into keys / libraries
    std::string impl_name;
    const catalog::OpEntry* cat;
    InterceptedOp* op;
    const TypedFactory* out = nullptr;   // an out variant's interceptor (Note [Out variants])
  };
  std::mutex mu;
  bool registered = true;
  c10::DispatchKey keys[2] = {c10::DispatchKey::CPU, c10::DispatchKey::CUDA};
  torch::Library* libraries[2] = {nullptr, nullptr};
  std::vector<Registration> registrations;
};
std::atomic<BenchToggle*> g_toggle{nullptr};

}  // namespace

std::string set_interceptors_registered(bool on) noexcept {
  BenchToggle* toggle = g_toggle.load(std::memory_order_acquire);
  if (toggle == nullptr) return "refused: the hook was loaded without KFORGE_BENCH_TOGGLE=1";
  try {
    std::lock_guard<std::mutex> lock(toggle->mu);
    if (on == toggle->registered) return "";
    if (!on) {
      for (torch::Library*& library : toggle->libraries) {
        delete library;   // its registration handles deregister every interceptor it holds
        library = nullptr;
      }
      toggle->registered = false;
      return "";
    }
    toggle->registered = true;   // from here on, a partial failure is still "registered": off undoes it
    QuietRegistration quiet;     // Note [Quiet registration]
    for (int i = 0; i < 2; ++i) {
      toggle->libraries[i] = new torch::Library(torch::Library::IMPL, "aten", toggle->keys[i], kLibrarySource, __LINE__);
    }
    for (const BenchToggle::Registration& r : toggle->registrations) {
      if (r.out != nullptr) {
        toggle->libraries[r.key]->impl(r.impl_name.c_str(), r.out->make(r.op));
      } else {
        register_interceptor(*toggle->libraries[r.key], r.impl_name, *r.cat, r.op);
      }
    }
    return "";
  } catch (const std::exception& e) {
    return std::string("failed: ") + first_line(e.what());
  } catch (...) {
    return "failed: an unexpected error";
  }
}

RegistrationSummary register_catalog(const HookConfig& config, Recorder& recorder, TargetArch& arch,
                                     InputSampler* sampler, CudaTimer* timer) noexcept {
  RegistrationSummary summary;
  try {
    QuietRegistration quiet;   // Note [Quiet registration]: until this function returns
    struct Key {
      c10::DispatchKey key;
      Backend backend;
      torch::Library* library;
    };
    // Never destroyed (except by a benchmark that asked to: Note [Bench toggle]): destroying a
    // Library deregisters its kernels, which would race with threads dispatching through them.
    Key keys[] = {
        {c10::DispatchKey::CPU, Backend::kCpu, nullptr},
        {c10::DispatchKey::CUDA, Backend::kCuda, nullptr},
    };
    // Note [Bench toggle]: only with KFORGE_BENCH_TOGGLE=1.
    BenchToggle* toggle = config.bench_toggle ? new BenchToggle : nullptr;
    for (Key& k : keys) {
      try {
        k.library = new torch::Library(torch::Library::IMPL, "aten", k.key, kLibrarySource, __LINE__);
      } catch (const std::exception& e) {
        summary.skipped.push_back(std::string("every operator@") + key_name(k.key) +
                                  ": cannot open a library: " + e.what());
      }
    }

    // Note [Out variants] (swap_call.cc): cat's out variant at `key`, after its functional
    // operator's interceptor `functional` there. Never throws: a failure is a skipped line.
    auto register_out_variant = [&](const catalog::OpEntry& cat, const c10::OperatorHandle& functional_handle,
                                    InterceptedOp* functional, c10::DispatchKey key, torch::Library& library,
                                    std::ptrdiff_t key_index) {
      const std::string label = std::string(cat.out_variant) + "@" + key_name(key);
      try {
        const TypedFactory* factory = find_out(cat.out_variant);
        if (factory == nullptr) {
          summary.skipped.push_back(label + ": no out-variant interceptor (" +
                                    std::string(cat.out_variant == catalog::kOutVariantNotIntercepted
                                                    ? catalog::kOutVariantNotInterceptedWhy
                                                    : "not in KFORGE_CATALOG_OUT_VARIANTS") +
                                    ")");
          return;
        }
        const std::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema(
            c10::OperatorName(std::string(factory->name), std::string(factory->overload)));
        if (!handle) {
          summary.skipped.push_back(label + ": not an operator of this torch");
          return;
        }
        if (!handle->hasKernelForDispatchKey(key) &&
            !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
          summary.skipped.push_back(label + ": no kernel at this key");
          return;
        }
        if (std::string why = out_schema_mismatch(functional_handle.schema(), handle->schema()); !why.empty()) {
          summary.skipped.push_back(label + ": " + why);
          return;
        }
        auto* op = new InterceptedOp(functional->identity, label, *handle, handle->getComputedKernelForDispatchKey(key),
                                     &recorder, &arch, functional->num_returns, functional->returns_tensors);
        op->sampler = sampler;
        op->timer = timer;
        op->observe_every = config.observe_every;
        // A slot of the functional operator's key: an entry for it makes both observed on every call.
        op->observe_slot = ObserveSlots::instance().assign(cat.name, cat.overload, functional->identity.backend);
        op->thread_block_offset = functional->thread_block_offset;
        op->functional = functional;
        const std::string impl_name = std::string(factory->name.substr(factory->name.find("::") + 2)) + "." +
                                      std::string(factory->overload);
        library.impl(impl_name.c_str(), factory->make(op));
        summary.registered.push_back(label);
        summary.how.push_back("typed");
        if (toggle != nullptr) toggle->registrations.push_back({key_index, impl_name, &cat, op, factory});
      } catch (const std::exception& e) {
        summary.skipped.push_back(label + ": registration failed: " + first_line(e.what()));
      }
    };

    for (const catalog::OpEntry& cat : catalog::operators()) {
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
          // A kernel of its own at the key, or one for every backend (CompositeExplicitAutograd:
          // aten::embedding), which is what the key computes to and what our interceptor calls.
          if (!handle->hasKernelForDispatchKey(k.key) &&
              !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
            summary.skipped.push_back(label + ": no kernel at this key");
            continue;
          }
          const auto num_arguments = static_cast<uint32_t>(handle->schema().arguments().size());
          OpIdentity identity{std::string(cat.name), std::string(cat.overload), num_arguments, k.backend,
                              SignaturePiece::head(cat.name, cat.overload, num_arguments)};
          // The original first: once ours is registered, the computed kernel is ours.
          const auto& returns = handle->schema().returns();
          bool tensor_returns = true;
          for (const c10::Argument& ret : returns) {
            tensor_returns = tensor_returns && ret.type()->kind() == c10::TypeKind::TensorType;
          }
          auto* op = new InterceptedOp(std::move(identity), label, *handle,
                                       handle->getComputedKernelForDispatchKey(k.key), &recorder, &arch,
                                       static_cast<uint32_t>(returns.size()), tensor_returns);
          op->sampler = sampler;
          op->timer = timer;
          op->observe_every = config.observe_every;
          op->observe_slot = ObserveSlots::instance().assign(cat.name, cat.overload, k.backend);
          op->thread_block_offset =
              static_cast<int32_t>(detail::thread_block_offset.load(std::memory_order_relaxed));
          std::string impl_name(cat.name.substr(cat.name.find("::") + 2));
          if (!cat.overload.empty()) impl_name += "." + std::string(cat.overload);
          std::string how = register_interceptor(*k.library, impl_name, cat, op);
          summary.registered.push_back(label);
          summary.how.push_back(how);
          if (toggle != nullptr) toggle->registrations.push_back({&k - keys, impl_name, &cat, op});
          if (!cat.out_variant.empty()) register_out_variant(cat, *handle, op, k.key, *k.library, &k - keys);
        } catch (const std::exception& e) {
          summary.skipped.push_back(label + ": registration failed: " + e.what());
        }
      }
    }
    if (toggle != nullptr) {
      for (int i = 0; i < 2; ++i) toggle->libraries[i] = keys[i].library;
      g_toggle.store(toggle, std::memory_order_release);
    }
    if (config.log) {
      std::string line = "registered " + std::to_string(summary.registered.size()) + " interceptors";
      if (quiet.suppressed() > 0) line += " (PyTorch's 'overriding a registered kernel' warning suppressed)";
      log_line(line);
    }
  } catch (...) {
    summary.skipped.push_back("registration stopped by an unexpected error");
  }
  return summary;
}

}  // namespace kforge::hook

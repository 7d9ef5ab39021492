#include "interposer/hook/interceptor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <chrono>
#include <exception>
#include <memory>

#include "interposer/hook/catalog.h"
#include "interposer/hook/intercepted_op.h"
#include "interposer/hook/log.h"
#include "interposer/hook/replacement_table.h"
#include "interposer/hook/stack_signature.h"
#include "interposer/hook/swap_call.h"

namespace kforge::hook {

namespace {

// The slow path's view of a call in flight, for Recorder::on_call's signature factory.
struct PendingCall {
  const InterceptedOp* op;
  const c10::IValue* args;
};

std::unique_ptr<OpSignature> make_signature(void* context) {
  auto* call = static_cast<PendingCall*>(context);
  return build_stack_signature(call->op->identity, call->args, *call->op->arch);
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
    if (r != nullptr && !in_swap_call() && op.identity.backend == Backend::kCpu && !call.id_mismatch) [[unlikely]] {
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

// InterceptedOp: what one interceptor (one catalog operator at one dispatch key) knows, made at
// registration (interceptor.cc) and never freed: the dispatcher may call the interceptor until the
// process ends. Shared by the fast path (interceptor.cc) and the replacement path (swap_call.cc).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "interposer/hook/cuda_timer.h"
#include "interposer/hook/input_sampler.h"
#include "interposer/hook/log.h"
#include "interposer/hook/recorder.h"
#include "interposer/hook/replacement_table.h"
#include "interposer/hook/stack_signature.h"
#include "interposer/hook/target_arch.h"

namespace kforge::hook {

// alignas(64), and the fields every call reads first: an unobserved call (Note [Interceptor fast
// path] in interceptor.cc) touches one cache line of it.
struct alignas(64) InterceptedOp {
  InterceptedOp(OpIdentity id, std::string label, c10::OperatorHandle op_handle, c10::SafeKernelFunction orig,
                Recorder* rec, TargetArch* target_arch, uint32_t returns, bool tensor_returns)
      : original(std::move(orig)), identity(std::move(id)), name(std::move(label)), handle(std::move(op_handle)),
        recorder(rec), arch(target_arch), num_returns(returns), returns_tensors(tensor_returns) {}

  // ---- read on every call
  std::atomic<bool> enabled{true};         // false: kforge code failed here; pass straight through
  // Note [Observed calls] (interceptor.cc): this operator's slot in each thread's countdowns
  // (ObserveSlots in replacement_table.h; kObserveSlots: every call observed), and
  // HookConfig::observe_every. Set at registration.
  uint32_t observe_slot = kObserveSlots;
  uint32_t observe_every = 1;
  // hook_thread_at()'s offset (hook_work.h): a copy of detail::thread_block_offset, set at
  // registration, in this line so that a call reads no other line to find its thread's block.
  int32_t thread_block_offset = 0;
  const c10::SafeKernelFunction original;  // PyTorch's kernel at this key, captured before ours

  // ---- read by observed calls and replacements
  const OpIdentity identity;
  const std::string name;                  // "aten::add.Tensor@CPU", for logs
  const c10::OperatorHandle handle;        // the operator (valid for the life of the process)
  Recorder* const recorder;
  TargetArch* const arch;
  const uint32_t num_returns;              // from the schema
  const bool returns_tensors;              // every return is a Tensor (what replacements can make)
  InputSampler* sampler = nullptr;         // set at registration, before the interceptor exists
  CudaTimer* timer = nullptr;              // likewise; null: CUDA calls are not timed
  // An out variant's interceptor (Note [Out variants] in swap_call.cc): the functional operator's
  // InterceptedOp at the same key, whose identity (this one's too), kernel and entries serve it.
  const InterceptedOp* functional = nullptr;

  void disable(std::string_view why) noexcept {
    if (enabled.exchange(false, std::memory_order_relaxed)) {
      log_line(std::string(why) + "; " + name + " is no longer intercepted (PyTorch's kernel runs)");
    }
  }
};

}  // namespace kforge::hook

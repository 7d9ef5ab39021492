// Note [The hook's own tensor work]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// kforge's own torch calls (a swap call's shadow comparison, float64 reference and PyTorch's
// kernel run beside an entry; the input sampler's statistics) go through the dispatcher like the
// program's, and for the catalog's operators (sub, mul, ...: `cz - fz` in a comparison) through
// kforge's interceptors. While a HookWorkScope lives on a thread, the interceptors pass every call
// straight to PyTorch's kernel, before the observation countdown: not observed, not counted, never
// replaced. So the counts, the hot reports and the daemon's search describe the program's calls
// alone (a mul.Tensor of float64 [60] from the sampler's sum of squares was reported as the
// program's once mul was in the catalog), and a replacement never runs inside kforge's own check
// of one. Scopes nest.
//
// Note [Nested catalog calls]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every intercepted call runs PyTorch's kernel inside a HookWorkScope too, so the catalog
// operators that kernel calls itself (mul.Scalar's composite kernel calls mul.Tensor; a CPU
// kernel given a strided input calls clone through .contiguous()) are part of the outer call:
// counted once, as it, timed within it, and never replaced inside it, as bench/op_profile.py
// attributes their time to the outermost operator. Without it, the counts test saw 34 extra
// mul.Tensor calls from mul.Scalar. The cost is two thread-local writes per call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/op_catalog.h"

namespace kforge::hook {

// Which slot of each thread's observation countdowns (Note [Observed calls] in interceptor.cc)
// belongs to which intercepted operator at which backend: ObserveSlots in replacement_table.h.
// Sized from the catalog: a slot per operator and backend, and room for at least 64 operators on
// 2 backends.
inline constexpr uint32_t kObserveSlots = static_cast<uint32_t>(
    std::max<size_t>(128, (2 * catalog::kOperatorCount + 63) / 64 * 64));   // more: always observed

// All zero is the state of a thread that never called the operator (its first call is observed):
// a thread's block starts zero-filled (Note [One thread-local block]).
struct ObserveCountdown {
  uint32_t left = 0;   // calls still to pass straight through before the next observed one
  uint32_t gap = 0;    // what `left` was set to after the last observed call
};

// Note [One thread-local block]
// Everything the interceptor keeps per thread, in one block, so a call finds it with one
// thread-local lookup: the hook is dlopen'd, so each distinct thread_local variable costs a
// __tls_get_addr call per function that reads it, and (between a model's other calls, when
// nothing of the hook is in cache) each lookup's reads are misses of their own. The interceptor
// takes hook_thread() once per call and passes the reference on. Where the hook was loaded by the
// preload shim, the block is the one the shim reserves in static TLS (Note [The hook's thread
// block] in interposer/preload_shim.c), reached from the thread pointer with no call at all;
// otherwise it is the thread_local below. Either starts zero-filled in every thread, so every
// field's zero is its initial state.
struct HookThread {
  bool hook_work = false;        // Note [The hook's own tensor work]
  uint64_t observe_rng = 0;      // Note [Observed calls]: the gaps' generator (0: not seeded yet)
  ObserveCountdown observe[kObserveSlots];
};

namespace detail {
// Constant-initialized: no guard or initialization wrapper on any access.
inline thread_local constinit HookThread t_hook_thread;
// The shim's block's offset from the thread pointer, or 0: none, t_hook_thread is the block (static
// TLS is never at offset 0: below the thread pointer on x86-64, 16 bytes or more above it on
// AArch64). Set once, by use_thread_block(), when the hook starts and before it registers any
// interceptor; never changed after.
inline constinit std::atomic<intptr_t> thread_block_offset{0};
}  // namespace detail

// This thread's block, given the offset (InterceptedOp keeps a copy in the line every call reads).
// The empty asm hides where the pointer came from, so the compiler keeps it in a register for the
// rest of the caller instead of recomputing it (a __tls_get_addr call) at every later use.
[[gnu::always_inline]] inline HookThread& hook_thread_at(intptr_t offset) noexcept {
  HookThread* t;
  if (offset != 0) [[likely]] {
    t = reinterpret_cast<HookThread*>(static_cast<char*>(__builtin_thread_pointer()) + offset);
  } else {
    t = &detail::t_hook_thread;
  }
  asm("" : "+r"(t));
  return *t;
}

[[gnu::always_inline]] inline HookThread& hook_thread() noexcept {
  return hook_thread_at(detail::thread_block_offset.load(std::memory_order_relaxed));
}

// Makes the block of `bytes` bytes aligned to `align` at `offset` from the thread pointer every
// thread's HookThread block (Note [The hook's thread block] in interposer/preload_shim.c). Returns
// "" if it is used, else why not (too small, misaligned, no offset). Call before any interceptor is
// registered: a thread keeps no state across the switch.
inline std::string use_thread_block(intptr_t offset, size_t bytes, size_t align) {
  if (offset == 0) return "the shim gave no offset";
  if (offset < INT32_MIN || offset > INT32_MAX) return "the shim's block is too far from the thread pointer";
  if (bytes < sizeof(HookThread)) {
    return "the shim's block has " + std::to_string(bytes) + " bytes, HookThread needs " +
           std::to_string(sizeof(HookThread));
  }
  if (align < alignof(HookThread) || offset % static_cast<intptr_t>(alignof(HookThread)) != 0) {
    return "the shim's block is not aligned for HookThread";
  }
  detail::thread_block_offset.store(offset, std::memory_order_relaxed);
  return {};
}

class HookWorkScope {
 public:
  HookWorkScope() noexcept : HookWorkScope(hook_thread()) {}
  explicit HookWorkScope(HookThread& t) noexcept : thread_(t), outer_(t.hook_work) { t.hook_work = true; }
  ~HookWorkScope() { thread_.hook_work = outer_; }
  HookWorkScope(const HookWorkScope&) = delete;
  HookWorkScope& operator=(const HookWorkScope&) = delete;

 private:
  HookThread& thread_;
  bool outer_;
};

// True while kforge's own code runs torch calls on this thread.
[[gnu::always_inline]] inline bool in_hook_work() noexcept { return hook_thread().hook_work; }

}  // namespace kforge::hook

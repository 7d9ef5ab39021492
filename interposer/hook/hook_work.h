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
#include <cstddef>
#include <cstdint>

#include "runtime/op_catalog.h"

namespace kforge::hook {

// Which slot of each thread's observation countdowns (Note [Observed calls] in interceptor.cc)
// belongs to which intercepted operator at which backend: ObserveSlots in replacement_table.h.
// Sized from the catalog: a slot per operator and backend, and room for at least 64 operators on
// 2 backends.
inline constexpr uint32_t kObserveSlots = static_cast<uint32_t>(
    std::max<size_t>(128, (2 * catalog::kOperatorCount + 63) / 64 * 64));   // more: always observed

struct ObserveCountdown {
  uint32_t left = 1;   // calls until the next observed one, this one included
  uint32_t gap = 1;    // what `left` was set to after the last observed call
};

// Note [One thread-local block]
// Everything the interceptor keeps per thread, in one block, so a call finds it with one
// thread-local lookup: the hook is dlopen'd, so each distinct thread_local variable costs a
// __tls_get_addr call per function that reads it, and (between a model's other calls, when
// nothing of the hook is in cache) each lookup's reads are misses of their own. The interceptor
// takes hook_thread() once per call and passes the reference on.
struct HookThread {
  bool hook_work = false;        // Note [The hook's own tensor work]
  uint64_t observe_rng = 0;      // Note [Observed calls]: the gaps' generator (0: not seeded yet)
  ObserveCountdown observe[kObserveSlots];
};

namespace detail {
// Constant-initialized: no guard or initialization wrapper on any access.
inline thread_local constinit HookThread t_hook_thread;
}  // namespace detail

// The empty asm hides where the pointer came from, so the compiler keeps it in a register for the
// rest of the caller instead of recomputing it (a __tls_get_addr call) at every later use.
[[gnu::always_inline]] inline HookThread& hook_thread() noexcept {
  HookThread* t = &detail::t_hook_thread;
  asm("" : "+r"(t));
  return *t;
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

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

namespace kforge::hook {

namespace detail {
inline thread_local bool t_hook_work = false;
}  // namespace detail

class HookWorkScope {
 public:
  HookWorkScope() noexcept : outer_(detail::t_hook_work) { detail::t_hook_work = true; }
  ~HookWorkScope() { detail::t_hook_work = outer_; }
  HookWorkScope(const HookWorkScope&) = delete;
  HookWorkScope& operator=(const HookWorkScope&) = delete;

 private:
  bool outer_;
};

// True while kforge's own code runs torch calls on this thread.
[[gnu::always_inline]] inline bool in_hook_work() noexcept { return detail::t_hook_work; }

}  // namespace kforge::hook

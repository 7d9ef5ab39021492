// CuptiKernelTimer: exact device durations of the kernels (and memsets, memcopies) a timed region
// ran, from CUPTI's activity records, for the worker's measurements (DESIGN.md: CUPTI is for the
// worker, where nothing else uses it; never in a serving process, where PyTorch's profiler owns it).
//
//   StatusOr<std::unique_ptr<CuptiKernelTimer>> t = CuptiKernelTimer::start();
//   if (t.ok()) {
//     (*t)->reset();                  // after the device is idle: forget what ran before
//     run_kernels(); synchronize();
//     CuptiKernelTimer::Sum s = (*t)->collect();   // s.ns: summed device time; s.activities
//   }
//
// Note [Kernel time]
// Event timing measures the stream between two events: the kernels plus the gaps between them and
// the events' own cost, a few microseconds that swamp a 5 us kernel and blur a ratio. CUPTI gives
// each kernel's start and end as the GPU saw them; their sum over the region is the device time of
// the work itself. Gaps between launches are excluded on both sides alike (a plan of two launches
// pays its gap in a serving process only when it is not captured in a CUDA graph).
// Promises: CUPTI is taken from the process (PyTorch's libtorch links its libcupti; RTLD_NOLOAD
// first), else loaded by name; anything missing is kUnavailable and the worker times with events.
// One instance per process (CUPTI's buffer callbacks are global). collect() and reset() must be
// called with the device idle (after a synchronize): records of running work are not yet complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace kforge::eval {

class CuptiKernelTimer {
 public:
  static StatusOr<std::unique_ptr<CuptiKernelTimer>> start();
  ~CuptiKernelTimer();
  CuptiKernelTimer(const CuptiKernelTimer&) = delete;
  CuptiKernelTimer& operator=(const CuptiKernelTimer&) = delete;

  struct Sum {
    double ns = 0;
    uint32_t activities = 0;   // kernels + memsets + memcopies recorded
    uint64_t dropped = 0;      // records CUPTI reported dropped (the sum is then not exact)
  };
  void reset();
  Sum collect();
  const std::string& library_path() const noexcept { return path_; }

  struct Api;

 private:
  CuptiKernelTimer() = default;
  std::unique_ptr<Api> api_;
  std::string path_;
};

}  // namespace kforge::eval

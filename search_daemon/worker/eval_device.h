// EvalDevice: the one device a kforge-worker evaluates on ("cpu" or "cuda:N"), as the verifier and
// the measurer need it: where tensors live, how to wait for work, how to time it, how to empty the
// caches between timed runs, and what the device's limits and ceilings are.
//
//   StatusOr<std::unique_ptr<EvalDevice>> d = EvalDevice::open("cuda:0", torch_version, /*cupti=*/true);
//   at::Tensor x = at::empty({n}, d->options(at::kFloat));
//   EvalDevice::Interval t = d->start_interval();
//   ...;                                     // enqueue work on d->cuda_stream()
//   double ns = d->finish_interval(t);       // device time (CUDA events) or host time (CPU)
//
// Promises:
// - CUDA: the device is torch's (same ordinal, CUDA_VISIBLE_DEVICES applied), made torch's current
//   device for this thread; candidate modules go into its primary context, which is torch's; work
//   is enqueued on torch's current stream of that device, read through c10's device-generic
//   interface (so the worker needs no link to libc10_cuda). Events and synchronization go through
//   the runtime's dlopen'ed driver.
// - synchronize() reports a failed earlier launch as an error; sticky() says whether that error
//   left the context unusable (illegal address, trap, ...): the worker must then report a fault
//   and exit, since nothing more can run in this process.
// - One thread: all calls come from the worker's main thread.
#pragma once

#include <ATen/ATen.h>
#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>
#include <memory>
#include <string>

#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "runtime/status.h"
#include "search_daemon/worker/cupti_timer.h"

namespace kforge {
class Nvrtc;
}

namespace kforge::eval {

class EvalDevice {
 public:
  // "cpu" or "cuda:<ordinal>". Initializes torch's CUDA state for the device.
  // `cupti`: time CUDA work with CUPTI's kernel durations where it can (WorkerConfig::cupti).
  static StatusOr<std::unique_ptr<EvalDevice>> open(const std::string& device, const std::string& torch_version,
                                                    bool cupti);
  ~EvalDevice();

  bool is_cuda() const noexcept { return cuda_; }
  const std::string& name() const noexcept { return name_; }
  at::Device device() const noexcept { return device_; }
  at::TensorOptions options(at::ScalarType t) const { return at::TensorOptions().dtype(t).device(device_); }
  // What cache entries built here are keyed by (compiler left empty for CPU: the builder's).
  const Environment& environment() const noexcept { return environment_; }
  // Per block: the CUDA opt-in maximum of dynamic shared memory, or the CPU backend's limit.
  int64_t max_shared_mem_bytes() const noexcept { return max_shared_mem_; }
  // Measured at open(): bytes read + written per second by a large device-local copy.
  double bandwidth_ceiling() const noexcept { return bandwidth_; }
  // Measured at open(): the median time of the smallest call (a one-element copy through the
  // dispatcher), timed by this device's clock (Note [Plausible timing] in measurer.h).
  double call_floor_ns() const noexcept { return call_floor_ns_; }
  // CUDA only (null / 0 on CPU).
  const CudaDriver* driver() const noexcept { return driver_; }
  CUcontext context() const noexcept { return context_; }
  int sm_major() const noexcept { return sm_major_; }
  int sm_minor() const noexcept { return sm_minor_; }
  // The GPU's UUID (gpu_uuid_string): how serving processes name it too. "" on CPU, or when the
  // driver could not say (uuid_note() says why).
  const std::string& uuid() const noexcept { return uuid_; }
  const std::string& uuid_note() const noexcept { return uuid_note_; }
  // torch's current stream on this device (CUDA), read anew each call.
  CUstream cuda_stream() const;

  // Waits for all work enqueued on the current stream (CUDA); nothing on CPU. An error is the
  // first failure of work already enqueued; if it poisoned the context (an illegal address, a
  // trap, ...) context_lost() is true from then on.
  Status synchronize();
  // Waits for the whole context (CUDA), so work on any stream has finished. Same errors.
  Status synchronize_all();
  // A CUDA error left the context unusable: the worker must report a fault and exit.
  bool context_lost() const noexcept { return lost_; }
  // Records a CUresult seen elsewhere (a launch); sets context_lost() when it is sticky.
  Status check(CUresult result, std::string_view what);

  // Evicts the device's caches (L2 on CUDA, the last-level cache on CPU) by writing a buffer twice
  // their size; enqueued on the current stream.
  void flush_caches();

  struct Interval {
    std::chrono::steady_clock::time_point host_start;
    CUevent start = nullptr;
    CUevent stop = nullptr;
  };
  // Starts a timed interval: a host clock reading (CPU) or an event on the current stream (CUDA;
  // with CUPTI, after the device is idle, so the interval's kernels are exactly those recorded).
  Interval start_interval();
  // Ends it; returns nanoseconds (CUDA: waits for the stop event): with CUPTI the summed device
  // time of the interval's kernels, memsets and copies (Note [Kernel time] in cupti_timer.h), else
  // the time between the events. NaN when the events failed.
  double finish_interval(Interval& interval);
  // "cupti", "cuda_events" or "steady_clock".
  const char* clock_name() const noexcept { return !cuda_ ? "steady_clock" : cupti_ ? "cupti" : "cuda_events"; }
  // Why CUPTI is not used (empty when it is, or on CPU).
  const std::string& cupti_note() const noexcept { return cupti_note_; }

 private:
  EvalDevice() = default;
  Status init_cuda(int ordinal, const std::string& torch_version, bool cupti);
  void measure_bandwidth();
  void measure_call_floor();
  CUevent take_event();

  bool cuda_ = false;
  std::string name_;
  at::Device device_{at::kCPU};
  Environment environment_;
  int64_t max_shared_mem_ = 0;
  double bandwidth_ = 0;
  double call_floor_ns_ = 0;
  const CudaDriver* driver_ = nullptr;
  CUdevice cu_device_ = 0;
  CUcontext context_ = nullptr;
  int sm_major_ = 0;
  int sm_minor_ = 0;
  std::string uuid_;
  std::string uuid_note_;
  bool lost_ = false;
  std::unique_ptr<CuptiKernelTimer> cupti_;
  std::string cupti_note_;
  at::Tensor flush_buffer_;
  uint64_t flushes_ = 0;
  std::vector<CUevent> free_events_;
};

}  // namespace kforge::eval

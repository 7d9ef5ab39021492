#include "search_daemon/worker/eval_device.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/cpu_backend.h"
#include "runtime/cuda_environment.h"
#include "runtime/nvrtc.h"
#include "search_daemon/worker/timing_stats.h"

namespace kforge::eval {

namespace {

// Errors after which a CUDA context cannot run anything again (the CUDA documentation calls them
// sticky: "the process must be terminated and relaunched").
bool is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return true;
    default:
      return false;
  }
}

int64_t cpu_last_level_cache_bytes() {
  long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) l3 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l3 > 0 ? l3 : int64_t{32} << 20;
}

}  // namespace

StatusOr<std::unique_ptr<EvalDevice>> EvalDevice::open(const std::string& device, const std::string& torch_version,
                                                      bool cupti) {
  std::unique_ptr<EvalDevice> d(new EvalDevice());
  d->name_ = device;
  if (device == "cpu") {
    d->environment_ = cpu_host_environment(torch_version);
    d->max_shared_mem_ = kCpuMaxSharedMemBytes;
    d->flush_buffer_ = at::empty({std::max<int64_t>(2 * cpu_last_level_cache_bytes(), int64_t{64} << 20)},
                                 at::TensorOptions().dtype(at::kByte));
  } else if (device.rfind("cuda:", 0) == 0) {
    const std::string index = device.substr(5);
    if (index.empty() || index.size() > 4 || index.find_first_not_of("0123456789") != std::string::npos) {
      return invalid_argument("--device " + device + ": expected cpu or cuda:<ordinal>");
    }
    d->cuda_ = true;
    KFORGE_RETURN_IF_ERROR(d->init_cuda(std::stoi(index), torch_version, cupti));
  } else {
    return invalid_argument("--device " + device + ": expected cpu or cuda:<ordinal>");
  }
  try {
    d->measure_bandwidth();
    d->measure_call_floor();
  } catch (const std::exception& e) {
    return unavailable(std::string("measuring the copy bandwidth failed: ") + e.what());
  }
  return d;
}

EvalDevice::~EvalDevice() {
  if (driver_ != nullptr) {
    for (CUevent e : free_events_) (void)driver_->cuEventDestroy(e);
  }
}

Status EvalDevice::init_cuda(int ordinal, const std::string& torch_version, bool use_cupti) {
  KFORGE_ASSIGN_OR_RETURN(driver_, CudaDriver::load());
  const CudaDriver& cu = *driver_;
  int count = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetCount(&count));
  if (ordinal >= count) {
    return invalid_argument("CUDA device " + std::to_string(ordinal) + " does not exist (" + std::to_string(count) +
                            " visible)");
  }
  device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ordinal));
  try {
    // torch's current device for this thread, and torch's CUDA state (its primary context) made.
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device_);
    (void)at::empty({1}, options(at::kFloat));
  } catch (const std::exception& e) {
    return unavailable("torch cannot use " + name_ + ": " + e.what());
  }
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGet(&cu_device_, ordinal));
  // Only the daemon's bookkeeping needs it (which serving processes share this GPU): no UUID is
  // no reason to refuse evaluations.
  if (StatusOr<std::string> uuid = device_uuid(cu, cu_device_); uuid.ok()) {
    uuid_ = *uuid;
  } else {
    uuid_note_ = uuid.status().message();
  }
  // One reference on torch's primary context, never released: candidate modules live in it.
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDevicePrimaryCtxRetain(&context_, cu_device_));
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuCtxSetCurrent(context_));
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuDeviceGetAttribute(&sm_major_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_device_));
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuDeviceGetAttribute(&sm_minor_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_device_));
  int smem = 0, l2 = 0;
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuDeviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, cu_device_));
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, cu_device_));
  max_shared_mem_ = smem;
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) return unavailable("no NVRTC to build CUDA candidates with: " + nvrtc.status().message());
  const NvrtcVersion v = (*nvrtc)->version();
  KFORGE_ASSIGN_OR_RETURN(environment_,
                          cuda_device_environment(cu, ordinal, torch_version, v.major * 1000 + v.minor * 10));
  flush_buffer_ = at::empty({std::max<int64_t>(2 * int64_t{l2}, int64_t{64} << 20)}, options(at::kByte));
  StatusOr<std::unique_ptr<CuptiKernelTimer>> cupti =
      use_cupti ? CuptiKernelTimer::start()
                : StatusOr<std::unique_ptr<CuptiKernelTimer>>(unavailable("CUPTI off (KFORGE_WORKER_NO_CUPTI)"));
  if (cupti.ok()) {
    cupti_ = std::move(*cupti);
  } else {
    cupti_note_ = cupti.status().message();
  }
  return Status();
}

CUstream EvalDevice::cuda_stream() const {
  if (!cuda_) return nullptr;
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<CUstream>(impl->getStreamNativeHandle(impl->getStream(device_)));
}

Status EvalDevice::check(CUresult result, std::string_view what) {
  if (result == CUDA_SUCCESS) return Status();
  if (is_sticky(result)) lost_ = true;
  return driver_->error(result, what, __FILE__, __LINE__);
}

Status EvalDevice::synchronize() {
  if (!cuda_) return Status();
  return check(driver_->cuStreamSynchronize(cuda_stream()), "cuStreamSynchronize(torch's current stream)");
}

Status EvalDevice::synchronize_all() {
  if (!cuda_) return Status();
  return check(driver_->cuCtxSynchronize(), "cuCtxSynchronize()");
}

void EvalDevice::flush_caches() {
  // Writing every byte evicts what the timed runs left in the cache (writes allocate lines in the
  // GPU's L2 and in a CPU's caches alike).
  flush_buffer_.fill_(static_cast<int64_t>(++flushes_ & 0x7f));
}

CUevent EvalDevice::take_event() {
  if (!free_events_.empty()) {
    CUevent e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (driver_->cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
  return e;
}

EvalDevice::Interval EvalDevice::start_interval() {
  Interval t;
  if (!cuda_) {
    t.host_start = std::chrono::steady_clock::now();
    return t;
  }
  if (cupti_) {
    (void)synchronize();
    cupti_->reset();
  }
  t.start = take_event();
  t.stop = take_event();
  if (t.start != nullptr) (void)driver_->cuEventRecord(t.start, cuda_stream());
  return t;
}

double EvalDevice::finish_interval(Interval& t) {
  if (!cuda_) {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t.host_start).count());
  }
  double ns = std::numeric_limits<double>::quiet_NaN();
  if (t.start != nullptr && t.stop != nullptr && driver_->cuEventRecord(t.stop, cuda_stream()) == CUDA_SUCCESS &&
      driver_->cuEventSynchronize(t.stop) == CUDA_SUCCESS) {
    float ms = 0;
    if (driver_->cuEventElapsedTime(&ms, t.start, t.stop) == CUDA_SUCCESS) ns = static_cast<double>(ms) * 1e6;
  }
  if (t.start != nullptr) free_events_.push_back(t.start);
  if (t.stop != nullptr) free_events_.push_back(t.stop);
  t.start = t.stop = nullptr;
  if (cupti_ && std::isfinite(ns)) {
    // The stop event has completed, so every kernel of the interval has too.
    const CuptiKernelTimer::Sum s = cupti_->collect();
    if (s.activities > 0 && s.dropped == 0) return s.ns;
  }
  return ns;
}

void EvalDevice::measure_bandwidth() {
  // A copy large enough to leave every cache behind; the best of a few, counting the bytes read
  // and the bytes written (the roofline's convention, and the catalog's cost model's).
  const int64_t bytes = cuda_ ? (int64_t{1} << 30) : (int64_t{256} << 20);
  at::Tensor src = at::empty({bytes}, options(at::kByte)).fill_(1);
  at::Tensor dst = at::empty({bytes}, options(at::kByte));
  double best_ns = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 4; ++i) {
    Interval t = start_interval();
    dst.copy_(src);
    const double ns = finish_interval(t);
    if (i > 0 && std::isfinite(ns) && ns > 0) best_ns = std::min(best_ns, ns);
  }
  (void)synchronize();
  bandwidth_ = std::isfinite(best_ns) ? 2.0 * static_cast<double>(bytes) / (best_ns * 1e-9) : 0;
}

void EvalDevice::measure_call_floor() {
  // The smallest call through the dispatcher, timed as the measurer times PyTorch's kernels (a
  // one-element copy: dispatch, one tiny kernel or loop): the median of many, so a preempted run
  // does not move it.
  at::Tensor src = at::ones({1}, options(at::kFloat));
  at::Tensor dst = at::empty({1}, options(at::kFloat));
  std::vector<double> ns;
  for (int i = 0; i < 64; ++i) {
    Interval t = start_interval();
    dst.copy_(src);
    const double v = finish_interval(t);
    if (i >= 8 && std::isfinite(v) && v > 0) ns.push_back(v);
  }
  (void)synchronize();
  call_floor_ns_ = quantile(ns, 0.5);
}

}  // namespace kforge::eval

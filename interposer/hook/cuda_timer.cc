#include "interposer/hook/cuda_timer.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

#include "runtime/cuda_driver.h"

namespace kforge::hook {

namespace {

// Note [CUDA timing budget]
// A timed CUDA call costs its thread far more than the interceptor's miss path: a device guard, a
// capture query and two event records through the driver. On the H200 host, GPT-2 small's decode
// step (75 intercepted calls, about 5 ms) came out +1.29% and +1.60% slower with the interceptors
// at KFORGE_SAMPLE_RATE=64 and +0.59% with timing almost off (rate 1000000), in runs on that host
// (bench/results/2026-12-04-h200-cuda-e2e-toggle-sampling.log): roughly 30 us per timed call, a
// large part of the hook's 1% budget. So each thread also has a budget of timed calls per second:
// a sampled call beyond it is not timed (its count still is). The samples that remain are still
// one in N of the calls in each window, whatever they cost, so the mean time per signature stays
// unbiased; what the daemon needs from them (a ranking and the headroom of each hot signature)
// does not need more than tens per second.
struct TimingWindow {
  std::chrono::steady_clock::time_point start{};
  uint32_t used = 0;
};
thread_local TimingWindow t_window;

bool over_budget() noexcept {
  const auto now = std::chrono::steady_clock::now();
  if (now - t_window.start >= std::chrono::seconds(1)) {
    t_window.start = now;
    t_window.used = 0;
  }
  return t_window.used >= CudaTimer::kMaxTimedPerThreadPerSecond;
}

}  // namespace

CUevent CudaTimer::take_event(int device) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CUevent>& pool = free_[device];
    if (!pool.empty()) {
      CUevent e = pool.back();
      pool.pop_back();
      return e;
    }
  }
  // A new event in the current context, which the caller made the device's (torch's primary).
  const CudaDriver* cu = CudaDriver::loaded();
  CUevent e = nullptr;
  if (cu == nullptr || cu->cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
  return e;
}

void CudaTimer::give_back(int device, CUevent e) { free_[device].push_back(e); }

CudaTimer::Mark CudaTimer::begin(int device) noexcept {
  Mark m;
  try {
    const CudaDriver* cu = CudaDriver::loaded();
    if (cu == nullptr || device < 0 || device >= kMaxDevices) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.skipped_other;
      return m;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (over_budget()) {
        ++counters_.skipped_budget;
        return m;
      }
      if (pending_.size() >= kMaxPending) {
        ++counters_.skipped_other;
        return m;
      }
    }
    const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    const c10::DeviceGuard guard(dev);   // the device's primary context is current from here
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev);
    auto* s = static_cast<CUstream>(stream.native_handle());
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cu->cuStreamIsCapturing(s, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.skipped_capturing;
      return m;
    }
    CUevent e = take_event(device);
    if (e == nullptr || cu->cuEventRecord(e, s) != CUDA_SUCCESS) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e != nullptr) give_back(device, e);
      ++counters_.skipped_other;
      return m;
    }
    m.start = e;
    m.stream = s;
    m.device = device;
    ++t_window.used;
  } catch (...) {
    m = Mark();
  }
  return m;
}

void CudaTimer::end(const Mark& m, const SignatureId& id) noexcept {
  if (m.start == nullptr) return;
  try {
    const CudaDriver* cu = CudaDriver::loaded();
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(m.device)));
    CUevent e = take_event(m.device);
    std::lock_guard<std::mutex> lock(mu_);
    if (e == nullptr || cu->cuEventRecord(e, m.stream) != CUDA_SUCCESS) {
      give_back(m.device, m.start);
      if (e != nullptr) give_back(m.device, e);
      ++counters_.skipped_other;
      return;
    }
    pending_.push_back(Pair{id, m.start, e, m.device, 0});
  } catch (...) {
    // The start event is lost to the pool; harmless.
  }
}

void CudaTimer::collect(RoundExtras& out) noexcept {
  std::vector<Pair> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return;
    work.swap(pending_);
  }
  const CudaDriver* cu = CudaDriver::loaded();
  std::vector<Pair> keep;
  std::vector<Pair> done;
  for (Pair& p : work) {
    const CUresult q = cu->cuEventQuery(p.end);
    if (q == CUDA_ERROR_NOT_READY) {
      if (++p.rounds < kMaxPendingRounds) {
        keep.push_back(p);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.dropped_stale;
      continue;   // both events stay out of the pool: they may still complete later
    }
    float ms = 0;
    if (q == CUDA_SUCCESS && cu->cuEventElapsedTime(&ms, p.start, p.end) == CUDA_SUCCESS && ms >= 0) {
      try {
        out.timed.emplace_back(p.id, static_cast<uint64_t>(static_cast<double>(ms) * 1e6));
      } catch (...) {
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.timed;
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.skipped_other;
    }
    done.push_back(p);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Pair& p : done) {
    try {
      give_back(p.device, p.start);
      give_back(p.device, p.end);
    } catch (...) {
    }
  }
  try {
    pending_.insert(pending_.end(), keep.begin(), keep.end());
  } catch (...) {
  }
}

CudaTimer::Counters CudaTimer::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace kforge::hook

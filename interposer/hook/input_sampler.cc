#include "interposer/hook/input_sampler.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "interposer/hook/hook_work.h"
#include "runtime/cuda_driver.h"

namespace kforge::hook {

namespace {

// True when `stream` is capturing a CUDA graph, or when that cannot be known (no driver): either
// way nothing may be enqueued on it for kforge's own purposes.
bool capturing(const c10::Stream& stream) {
  StatusOr<const CudaDriver*> driver = CudaDriver::load();
  if (!driver.ok()) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = (*driver)->cuStreamIsCapturing(static_cast<CUstream>(stream.native_handle()), &status);
  return r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

// Note [Sample events]
// ~~~~~~~~~~~~~~~~~~~~
// A CUDA sample's copy is awaited on an event made and destroyed through the driver API, not a
// c10::Event: c10's event destructor is noexcept and switches devices through c10::cuda::SetDevice,
// which throws when the CUDA runtime is being torn down; a throw there ends the process
// (std::terminate), which is what killed the demo model at exit on the H100 (Note [Stopping before
// CUDA's teardown] in recorder.cc). The driver's calls return error codes: a failed record skips
// the sample, a failed wait counts it as failed, a failed destroy is ignored.

void InputSampler::DoneEvent::reset() noexcept {
  if (e_ == nullptr) return;
  if (const CudaDriver* cu = CudaDriver::loaded()) (void)cu->cuEventDestroy(e_);
  e_ = nullptr;
}

void InputSampler::sample(const SignatureId& id, const c10::IValue* args, uint32_t n) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint32_t& taken = samples_[id];
      if (taken >= kMaxSamplesPerSignature) return;
      if (pending_.size() >= kMaxPendingSamples) {
        ++counters_.skipped_busy;
        return;
      }
      ++taken;   // claimed; a skip below does not give it back (the next thread's try is as likely to skip)
    }
    size_t bytes = 0;
    for (uint32_t i = 0; i < n; ++i) {
      if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
      const at::Tensor& t = args[i].toTensor();
      bytes += static_cast<size_t>(t.numel()) * t.element_size();
    }
    if (bytes > kMaxSampleBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.skipped_too_large;
      return;
    }
    Pending p;
    p.id = id;
    for (uint32_t i = 0; i < n; ++i) {
      if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
      const at::Tensor& t = args[i].toTensor();
      Pending::Tensor pt{i, at::Tensor(), t.strides().vec(), std::nullopt, DoneEvent()};
      if (t.is_cuda()) {
        const c10::Stream stream =
            c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
        if (capturing(stream)) {
          std::lock_guard<std::mutex> lock(mu_);
          ++counters_.skipped_capturing;
          return;
        }
        pt.stream = stream;
      }
      // Stream-ordered on CUDA (the current stream, before PyTorch's kernel runs); synchronous on CPU.
      pt.copy = t.clone(at::MemoryFormat::Contiguous);
      if (pt.stream) {   // Note [Samples and graph capture], Note [Sample events]
        const CudaDriver* cu = CudaDriver::loaded();
        const c10::DeviceGuard guard(t.device());   // the device's primary context is current here
        CUevent e = nullptr;
        if (cu == nullptr || cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          ++counters_.failed;
          return;
        }
        pt.done = DoneEvent(e);
        if (cu->cuEventRecord(e, static_cast<CUstream>(pt.stream->native_handle())) != CUDA_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          ++counters_.failed;
          return;
        }
      }
      p.tensors.push_back(std::move(pt));
    }
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(p));
    ++counters_.sampled;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.failed;
  }
}

// Note [Samples and graph capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// drain() runs on the reporter thread, perhaps while a thread of the program captures a CUDA graph
// (torch.cuda.graph captures in the global mode). Its own work must neither join that capture nor
// spoil it:
//   - it waits for a sample's copy on an event recorded right after the copy, never by
//     synchronizing the caller's stream (which may be capturing by now: synchronizing a capturing
//     stream is an error that invalidates its capture);
//   - it copies to the host on a stream of torch's pool (non-blocking: no implicit order with the
//     program's streams), not on the legacy default stream;
//   - the hook's reporter round runs in the relaxed capture mode (hook_main.cc), so these calls are
//     not the "potentially unsafe" calls that fail, and fail another thread's capture, in global
//     mode. per_op.py's graph timing failed so ("operation failed due to a previous error during
//     capture") when the reporter drained a sample taken just before the capture.
void InputSampler::drain(int32_t pid, RoundExtras& round) noexcept {
  HookWorkScope own_work;   // the statistics below call catalog operators (mul)
  std::vector<Pending> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work.swap(pending_);
  }
  std::map<SignatureId, bool> changed;
  for (Pending& p : work) {
    try {
      wire::CapturedInputs captured;
      captured.pid = pid;
      captured.signature_id = p.id;
      for (Pending::Tensor& t : p.tensors) {
        at::Tensor host;
        if (t.stream) {   // Note [Samples and graph capture]
          // The copy is done; blocks this thread only. Note [Sample events]
          const CudaDriver* cu = CudaDriver::loaded();
          if (cu == nullptr || t.done.get() == nullptr || cu->cuEventSynchronize(t.done.get()) != CUDA_SUCCESS) {
            throw std::runtime_error("the sample's copy could not be awaited");
          }
          const c10::Stream own =
              c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStreamFromGlobalPool(t.copy.device());
          const c10::StreamGuard on_own(own);
          host = t.copy.to(at::kCPU);
          t.done.reset();
        } else {
          host = t.copy.to(at::kCPU);
        }
        t.copy = at::Tensor();                   // the device copy goes back to torch's allocator
        // Statistics over the elements as doubles (complex: not described).
        if (!host.is_complex() && host.numel() > 0) {
          const at::Tensor d = host.to(at::kDouble);
          const at::Tensor nan = at::isnan(d);
          const at::Tensor inf = at::isinf(d);
          const at::Tensor finite_mask = at::isfinite(d);
          const at::Tensor finite = d.masked_select(finite_mask);
          Accumulator& a = accumulators_[p.id][t.arg_index];
          const uint64_t nf = static_cast<uint64_t>(finite.numel());
          if (nf > 0) {
            const double lo = finite.min().item<double>();
            const double hi = finite.max().item<double>();
            a.min = a.finite == 0 ? lo : std::min(a.min, lo);
            a.max = a.finite == 0 ? hi : std::max(a.max, hi);
            a.sum += finite.sum().item<double>();
            a.sum_sq += (finite * finite).sum().item<double>();
          }
          a.finite += nf;
          a.nan += static_cast<uint64_t>(nan.sum().item<int64_t>());
          a.inf += static_cast<uint64_t>(inf.sum().item<int64_t>());
          a.zeros += static_cast<uint64_t>((d == 0).sum().item<int64_t>());
          a.elements += static_cast<uint64_t>(d.numel());
          changed[p.id] = true;
        }
        if (capture_) {
          wire::CapturedTensor ct;
          ct.arg_index = t.arg_index;
          const std::optional<DType> dt = [&]() -> std::optional<DType> {
            switch (host.scalar_type()) {
              case at::kFloat: return DType::kFloat32;
              case at::kDouble: return DType::kFloat64;
              case at::kHalf: return DType::kFloat16;
              case at::kBFloat16: return DType::kBFloat16;
              case at::kChar: return DType::kInt8;
              case at::kByte: return DType::kUInt8;
              case at::kShort: return DType::kInt16;
              case at::kInt: return DType::kInt32;
              case at::kLong: return DType::kInt64;
              case at::kBool: return DType::kBool;
              case at::kComplexFloat: return DType::kComplex64;
              case at::kComplexDouble: return DType::kComplex128;
              case at::kFloat8_e4m3fn: return DType::kFloat8E4M3FN;
              case at::kFloat8_e5m2: return DType::kFloat8E5M2;
              default: return std::nullopt;
            }
          }();
          if (!dt) continue;   // the signature would have been unknown; cannot happen
          ct.dtype = *dt;
          ct.sizes = host.sizes().vec();
          ct.strides = std::move(t.strides);
          ct.bytes.assign(static_cast<const char*>(host.const_data_ptr()),
                          static_cast<size_t>(host.numel()) * host.element_size());
          captured.tensors.push_back(std::move(ct));
        }
      }
      if (capture_ && !captured.tensors.empty()) {
        round.messages.emplace_back(std::move(captured));
        std::lock_guard<std::mutex> lock(mu_);
        ++counters_.captured;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.failed;
    }
  }
  try {
    for (const auto& [id, unused] : changed) {
      std::vector<wire::InputStats> stats;
      for (const auto& [arg, a] : accumulators_[id]) {
        if (stats.size() >= wire::kMaxStatsPerEntry) break;
        wire::InputStats s;
        s.arg_index = arg;
        if (a.finite > 0) {
          const double n = static_cast<double>(a.finite);
          s.min = a.min;
          s.max = a.max;
          s.mean = a.sum / n;
          s.stddev = std::sqrt(std::max(0.0, a.sum_sq / n - s.mean * s.mean));
        }
        s.nan_count = a.nan;
        s.inf_count = a.inf;
        s.zero_fraction = a.elements > 0 ? static_cast<double>(a.zeros) / static_cast<double>(a.elements) : 0.0;
        stats.push_back(s);
      }
      round.stats.emplace_back(id, std::move(stats));
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.failed;
  }
}

InputSampler::Counters InputSampler::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace kforge::hook

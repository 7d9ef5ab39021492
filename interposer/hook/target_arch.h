// TargetArch: the `arch` of an intercepted call's Target ("x86_64-avx2", "sm_90"), found once per
// device and then read without locks on the fast path.
//
//   TargetArch& arch = *new TargetArch(cpu_host_environment(version).arch);
//   std::string_view a = arch.cuda(tensor_device_index);   // "sm_90"; "" if it cannot be known
//   const SignaturePiece* t = arch.cuda_target(tensor_device_index);   // its encoded [backend, arch]]
//
// The CPU arch is the runtime's cpu_host_environment() arch, fixed at load. A CUDA device's arch
// is asked of the driver (the runtime's dlopen'ed CudaDriver: no CUDA headers or libraries of
// torch's) on the first call that needs it, under a lock; every later call reads a published
// copy. By then torch has initialized CUDA, so the driver is loaded and cuInit is a no-op. The
// query is no stream operation, so it is safe while a stream is capturing.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>

#include "interposer/hook/signature_writer.h"

namespace kforge::hook {

class TargetArch {
 public:
  static constexpr int kMaxCudaDevices = 64;

  explicit TargetArch(std::string cpu_arch)
      : cpu_(std::move(cpu_arch)), cpu_target_(SignaturePiece::target(Backend::kCpu, cpu_)) {}
  TargetArch(const TargetArch&) = delete;
  TargetArch& operator=(const TargetArch&) = delete;

  std::string_view cpu() const noexcept { return cpu_; }
  // The end of a CPU call's signature, SignaturePiece::target(Backend::kCpu, cpu()); null when
  // cpu() is "".
  const SignaturePiece* cpu_target() const noexcept { return cpu_.empty() ? nullptr : &cpu_target_; }

  // "sm_XY" for CUDA device `index` (torch's index, which the driver shares: both apply
  // CUDA_VISIBLE_DEVICES). "" when it cannot be known (no driver, bad index): such calls are
  // "unknown" and fall through. The first failure per device is logged.
  std::string_view cuda(int index) noexcept {
    if (index < 0 || index >= kMaxCudaDevices) return {};
    CudaSlot& s = cuda_[index];
    const int state = s.state.load(std::memory_order_acquire);
    if (state == kReady) [[likely]] return std::string_view(s.arch, s.length);
    if (state == kFailed) return {};
    return cuda_slow(index);
  }
  // The end of a signature on CUDA device `index`, SignaturePiece::target(Backend::kCuda,
  // cuda(index)); null when cuda(index) is "".
  const SignaturePiece* cuda_target(int index) noexcept {
    if (index < 0 || index >= kMaxCudaDevices) return nullptr;
    const CudaSlot& s = cuda_[index];
    if (s.state.load(std::memory_order_acquire) == kReady) [[likely]] return &s.target;
    return cuda(index).empty() ? nullptr : &s.target;
  }

 private:
  enum : int { kUnknown = 0, kReady = 1, kFailed = -1 };
  struct CudaSlot {
    std::atomic<int> state{kUnknown};
    char arch[16] = {};
    size_t length = 0;
    SignaturePiece target;   // written with arch, before state turns kReady
  };

  std::string_view cuda_slow(int index) noexcept;

  const std::string cpu_;
  const SignaturePiece cpu_target_;
  std::mutex mu_;   // slow path only
  CudaSlot cuda_[kMaxCudaDevices];
};

}  // namespace kforge::hook

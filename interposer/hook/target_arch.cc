#include "interposer/hook/target_arch.h"

#include <cstdio>

#include "interposer/hook/log.h"
#include "runtime/cuda_driver.h"

namespace kforge::hook {

namespace {

// Capability (major, minor) of CUDA device `index`, or a reason it is not known.
StatusOr<std::pair<int, int>> compute_capability(int index) {
  KFORGE_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::load());
  const CudaDriver& cu = *driver;
  CUdevice dev = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGet(&dev, index));
  int major = 0;
  int minor = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  return std::make_pair(major, minor);
}

}  // namespace

std::string_view TargetArch::cuda_slow(int index) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    CudaSlot& s = cuda_[index];
    const int state = s.state.load(std::memory_order_acquire);
    if (state == kReady) return std::string_view(s.arch, s.length);
    if (state == kFailed) return {};
    StatusOr<std::pair<int, int>> cc = compute_capability(index);
    if (!cc.ok()) {
      log_line("cannot read the architecture of CUDA device " + std::to_string(index) + " (" +
               cc.status().message() + "); its calls are not observed");
      s.state.store(kFailed, std::memory_order_release);
      return {};
    }
    const int n = std::snprintf(s.arch, sizeof s.arch, "sm_%d%d", cc->first, cc->second);
    if (n <= 0 || static_cast<size_t>(n) >= sizeof s.arch) {
      s.state.store(kFailed, std::memory_order_release);
      return {};
    }
    s.length = static_cast<size_t>(n);
    s.target = SignaturePiece::target(Backend::kCuda, std::string_view(s.arch, s.length));
    s.state.store(kReady, std::memory_order_release);
    return std::string_view(s.arch, s.length);
  } catch (...) {
    return {};
  }
}

}  // namespace kforge::hook

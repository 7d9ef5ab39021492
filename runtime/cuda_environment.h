// The Environment of one CUDA device, as the cache keys kernels built for it (environment.h).
//
//   StatusOr<Environment> env = cuda_device_environment(driver, 0, "2.11.0+cu130", nvrtc_version);
//   // backend=cuda arch="sm_90" device_model="NVIDIA H200" driver_version=13000 nvrtc_version=13000
//
// Both the worker (which builds and publishes CUDA entries) and the hook (which loads them) call
// this, so the two agree on every field they can both know. `nvrtc_version` is the compiler's
// (major*1000 + minor*10, as Environment documents; 0 when the caller has no NVRTC): the hook only
// loads cubins, so the loader compares every field but this one (Note [Environment rule] in
// interposer/hook/swapper.h), as it ignores `compiler` for CPU entries.
#pragma once

#include <string>
#include <string_view>

#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "runtime/status.h"

namespace kforge {

// `ordinal` is the CUDA device index (after CUDA_VISIBLE_DEVICES, as torch numbers devices).
// Errors name the driver call that failed. Calls cuInit (a no-op once the process uses CUDA).
StatusOr<Environment> cuda_device_environment(const CudaDriver& driver, int ordinal, std::string torch_version,
                                              int32_t nvrtc_version);

// "sm_XY" for compute capability X.Y.
std::string cuda_arch_name(int major, int minor);
// Its inverse: "sm_90" -> (9, 0), "sm_100" -> (10, 0) (the last digit is the minor version);
// false for anything cuda_arch_name does not write ("compute_90", "sm_90a", "x86_64-avx2").
bool parse_cuda_arch(std::string_view arch, int& major, int& minor) noexcept;

}  // namespace kforge

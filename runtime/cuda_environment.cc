#include "runtime/cuda_environment.h"

#include <cstring>

namespace kforge {

std::string cuda_arch_name(int major, int minor) {
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

bool parse_cuda_arch(std::string_view arch, int& major, int& minor) noexcept {
  if (arch.size() < 5 || arch.substr(0, 3) != "sm_") return false;
  int v = 0;
  for (size_t i = 3; i < arch.size(); ++i) {
    if (arch[i] < '0' || arch[i] > '9' || v > 10000) return false;
    v = v * 10 + (arch[i] - '0');
  }
  major = v / 10;
  minor = v % 10;
  return major > 0;
}

StatusOr<Environment> cuda_device_environment(const CudaDriver& driver, int ordinal, std::string torch_version,
                                              int32_t nvrtc_version) {
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuInit(0));
  int count = 0;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    return invalid_argument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                            std::to_string(count) + " visible)");
  }
  CUdevice dev = 0;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDeviceGet(&dev, ordinal));
  int major = 0, minor = 0, version = 0;
  KFORGE_CU_RETURN_IF_ERROR(driver,
                            driver.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  KFORGE_CU_RETURN_IF_ERROR(driver,
                            driver.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDriverGetVersion(&version));
  char name[256] = {};
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDeviceGetName(name, static_cast<int>(sizeof name) - 1, dev));

  Environment env;
  env.backend = Backend::kCuda;
  env.arch = cuda_arch_name(major, minor);
  env.device_model = std::string(name, ::strnlen(name, sizeof name)).substr(0, kMaxEnvironmentString);
  env.driver_version = version;
  env.nvrtc_version = nvrtc_version;
  env.torch_version = std::move(torch_version);
  return env;
}

}  // namespace kforge

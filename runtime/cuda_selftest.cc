#include "runtime/cuda_selftest.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/nvrtc.h"

namespace kforge {
namespace {

constexpr char kKernelSource[] = R"(
extern "C" __global__ void kforge_selftest_axpb(const float* __restrict__ x, float* __restrict__ y,
                                                float a, float b, unsigned long long n) {
  const unsigned long long i =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(a, x[i], b);
}
)";

constexpr std::size_t kElements = std::size_t{1} << 20;
constexpr unsigned kBlockSize = 256;
// Neither constant is a power of two, so every product has rounding to do and a wrong operation
// order (a*x rounded, then +b) would show up as a mismatch.
constexpr float kA = -2.7182817f;
constexpr float kB = 0.57721567f;

// Mixed signs and magnitudes, and no run of equal values longer than one element.
float input_value(std::size_t i) {
  const int centered = static_cast<int>(i % 8191) - 4095;
  return static_cast<float>(centered) * 0.012345679f + static_cast<float>(i >> 13) * 0.0009765625f;
}

std::string version_text(int cuda_version) {
  return std::to_string(cuda_version / 1000) + "." + std::to_string((cuda_version % 1000) / 10);
}

class Report {
 public:
  explicit Report(std::string& text) : text_(text) {}
  void line(std::string_view key, std::string_view value) {
    text_ += key;
    text_ += ": ";
    text_ += value;
    text_ += '\n';
  }

 private:
  std::string& text_;
};

Status run(Report& report) {
  StatusOr<const CudaDriver*> loaded = CudaDriver::load();
  if (!loaded.ok()) return loaded.status();
  const CudaDriver& cu = **loaded;
  report.line("driver", "CUDA " + version_text(cu.version()) + " (" + cu.library_path() + ")");

  int device_count = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetCount(&device_count));
  if (device_count == 0) return unavailable("the CUDA driver reports no devices");

  // Follow the caller's device: in a PyTorch process that is the device torch made current.
  CUcontext previous = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuCtxGetCurrent(&previous));
  CUdevice device = 0;
  if (previous != nullptr) {
    KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuCtxGetDevice(&device));
  } else {
    KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGet(&device, 0));
  }
  char name[256] = {};
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetName(name, static_cast<int>(sizeof(name)), device));
  int major = 0;
  int minor = 0;
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));
  report.line("device",
              std::to_string(device) + " of " + std::to_string(device_count) + ": " + name);
  report.line("compute capability", std::to_string(major) + "." + std::to_string(minor));

  StatusOr<PrimaryContext> primary = PrimaryContext::retain(cu, device);
  if (!primary.ok()) return primary.status();
  report.line("context", previous == primary->get() ? "primary (already current)"
                         : previous != nullptr ? "primary (pushed over another current context)"
                                               : "primary (pushed; none was current)");
  StatusOr<ScopedCurrentContext> current = ScopedCurrentContext::make_current(cu, primary->get());
  if (!current.ok()) return current.status();

  // The synchronous copies and the legacy-stream launch below would invalidate a capture that is
  // in progress on a blocking stream, so the test refuses instead of breaking the caller's graph.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult capturing = cu.cuStreamIsCapturing(nullptr, &capture);
  if (capturing == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
      (capturing == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE)) {
    return unavailable("a CUDA graph capture is in progress; the self-test would break it");
  }
  if (capturing != CUDA_SUCCESS) {
    return cu.error(capturing, "cu.cuStreamIsCapturing(nullptr, &capture)", __FILE__, __LINE__);
  }

  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) return nvrtc.status();
  report.line("nvrtc", std::to_string((*nvrtc)->version().major) + "." +
                           std::to_string((*nvrtc)->version().minor) + " (" +
                           (*nvrtc)->library_path() + ")");
  StatusOr<CompiledKernel> kernel =
      (*nvrtc)->compile(cuda_selftest_kernel_source(), "kforge_selftest.cu", {}, major, minor);
  if (!kernel.ok()) return kernel.status();
  report.line("image", std::string(image_kind_name(kernel->kind)) + " for " + kernel->arch + ", " +
                           std::to_string(kernel->image.size()) + " bytes");

  StatusOr<CudaModule> module = CudaModule::load(cu, kernel->image.data());
  if (!module.ok()) return module.status();
  StatusOr<CUfunction> function = module->function(std::string(kCudaSelftestKernelName));
  if (!function.ok()) return function.status();

  std::vector<float> x(kElements);
  for (std::size_t i = 0; i < kElements; ++i) x[i] = input_value(i);
  // NaN in y before the launch: an element the kernel never wrote cannot pass the check.
  std::vector<float> y(kElements, std::numeric_limits<float>::quiet_NaN());
  const std::size_t bytes = kElements * sizeof(float);
  StatusOr<DeviceBuffer> dx = DeviceBuffer::allocate(cu, bytes);
  if (!dx.ok()) return dx.status();
  StatusOr<DeviceBuffer> dy = DeviceBuffer::allocate(cu, bytes);
  if (!dy.ok()) return dy.status();
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuMemcpyHtoD(dx->get(), x.data(), bytes));
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuMemcpyHtoD(dy->get(), y.data(), bytes));

  CUdeviceptr x_arg = dx->get();
  CUdeviceptr y_arg = dy->get();
  float a = kA;
  float b = kB;
  unsigned long long n = kElements;
  void* args[] = {&x_arg, &y_arg, &a, &b, &n};
  const unsigned grid = static_cast<unsigned>((kElements + kBlockSize - 1) / kBlockSize);
  KFORGE_CU_RETURN_IF_ERROR(
      cu, cu.cuLaunchKernel(*function, grid, 1, 1, kBlockSize, 1, 1, 0, nullptr, args, nullptr));
  // Separately from the copy, so a fault in the kernel is reported as the kernel's.
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuStreamSynchronize(nullptr));
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuMemcpyDtoH(y.data(), dy->get(), bytes));

  // Bitwise: fmaf is correctly rounded on both sides, so anything but identical bits is wrong.
  std::size_t mismatches = 0;
  std::size_t first_bad = kElements;
  for (std::size_t i = 0; i < kElements; ++i) {
    const float expected = std::fmaf(kA, x[i], kB);
    if (std::bit_cast<std::uint32_t>(y[i]) != std::bit_cast<std::uint32_t>(expected)) {
      if (mismatches++ == 0) first_bad = i;
    }
  }
  report.line("checked", std::to_string(kElements) + " elements, y = fmaf(a, x, b)");
  if (mismatches != 0) {
    const float expected = std::fmaf(kA, x[first_bad], kB);
    return internal_error(std::to_string(mismatches) + " of " + std::to_string(kElements) +
                          " elements wrong; first at " + std::to_string(first_bad) + ": got " +
                          std::to_string(y[first_bad]) + ", expected " + std::to_string(expected));
  }
  return Status();
}

}  // namespace

std::string_view cuda_selftest_kernel_source() noexcept { return kKernelSource; }

Status run_cuda_selftest(std::string* report) {
  std::string local;
  std::string& text = report != nullptr ? *report : local;
  text.clear();
  Report lines(text);
  Status status;
  try {
    status = run(lines);
  } catch (const std::exception& e) {
    // Only allocation can throw here; the self-test must still answer, not unwind into ctypes.
    status = internal_error(std::string("cuda self-test: ") + e.what());
  }
  lines.line("result", status.ok() ? std::string("ok") : status.to_string());
  return status;
}

}  // namespace kforge

extern "C" int kforge_cuda_selftest(char* buf, std::size_t len) noexcept {
  int code = 1;
  try {
    std::string report;
    const kforge::Status status = kforge::run_cuda_selftest(&report);
    code = status.ok() ? 0 : status.code() == kforge::StatusCode::kUnavailable ? 2 : 1;
    if (buf != nullptr && len > 0) {
      const std::size_t n = std::min(len - 1, report.size());
      std::memcpy(buf, report.data(), n);
      buf[n] = '\0';
    }
  } catch (...) {
    if (buf != nullptr && len > 0) buf[0] = '\0';
    code = 1;
  }
  return code;
}

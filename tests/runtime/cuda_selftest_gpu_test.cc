// The CUDA loader layer on a real GPU (ctest label `gpu`): a kernel compiled by NVRTC runs through
// the driver API and gives exact results, and the RAII types leave the thread's context state as
// they found it, which is what lets kforge share a process (and a primary context) with PyTorch.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/cuda_selftest.h"
#include "runtime/nvrtc.h"

namespace kforge {
namespace {

const CudaDriver& driver() {
  StatusOr<const CudaDriver*> loaded = CudaDriver::load();
  INFO(loaded.status().to_string());
  REQUIRE(loaded.ok());
  return **loaded;
}

CUcontext current_context(const CudaDriver& cu) {
  CUcontext current = nullptr;
  REQUIRE(cu.cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  return current;
}

}  // namespace

TEST_CASE("the CUDA self-test passes on a GPU and leaves no context current", "[cuda][gpu]") {
  const CudaDriver& cu = driver();
  REQUIRE(current_context(cu) == nullptr);
  std::string report;
  Status status = run_cuda_selftest(&report);
  INFO(report);
  REQUIRE(status.ok());
  CHECK(report.find("result: ok") != std::string::npos);
  CHECK(report.find("checked: 1048576 elements") != std::string::npos);
  CHECK(current_context(cu) == nullptr);
}

TEST_CASE("the self-test runs inside an already-current primary context and keeps it current",
          "[cuda][gpu]") {
  const CudaDriver& cu = driver();
  CUdevice device = 0;
  REQUIRE(cu.cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  StatusOr<PrimaryContext> primary = PrimaryContext::retain(cu, device);
  REQUIRE(primary.ok());
  {
    StatusOr<ScopedCurrentContext> scope = ScopedCurrentContext::make_current(cu, primary->get());
    REQUIRE(scope.ok());
    CHECK(scope->pushed());
    std::string report;
    Status status = run_cuda_selftest(&report);
    INFO(report);
    REQUIRE(status.ok());
    CHECK(report.find("primary (already current)") != std::string::npos);
    CHECK(current_context(cu) == primary->get());

    // Nested guard for the context that is already current: nothing to push, nothing to pop.
    StatusOr<ScopedCurrentContext> nested = ScopedCurrentContext::make_current(cu, primary->get());
    REQUIRE(nested.ok());
    CHECK_FALSE(nested->pushed());
  }
  CHECK(current_context(cu) == nullptr);
}

TEST_CASE("modules and buffers free themselves, a released module stays loaded", "[cuda][gpu]") {
  const CudaDriver& cu = driver();
  CUdevice device = 0;
  REQUIRE(cu.cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  int major = 0;
  int minor = 0;
  REQUIRE(cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) ==
          CUDA_SUCCESS);
  REQUIRE(cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) ==
          CUDA_SUCCESS);
  StatusOr<PrimaryContext> primary = PrimaryContext::retain(cu, device);
  REQUIRE(primary.ok());
  StatusOr<ScopedCurrentContext> scope = ScopedCurrentContext::make_current(cu, primary->get());
  REQUIRE(scope.ok());

  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  REQUIRE(nvrtc.ok());
  StatusOr<CompiledKernel> kernel =
      (*nvrtc)->compile(cuda_selftest_kernel_source(), "kforge_selftest.cu", {}, major, minor);
  INFO(kernel.status().to_string());
  REQUIRE(kernel.ok());

  StatusOr<CudaModule> module = CudaModule::load(cu, kernel->image.data());
  INFO(module.status().to_string());
  REQUIRE(module.ok());
  CHECK(module->function(std::string(kCudaSelftestKernelName)).ok());
  StatusOr<CUfunction> missing = module->function("no_such_kernel");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find("cuModuleGetFunction") != std::string::npos);
  CHECK(missing.status().message().find("CUDA_ERROR_NOT_FOUND") != std::string::npos);
  CHECK(missing.status().message().find("[device 0]") != std::string::npos);

  // The serving process's path: keep the module for the life of the process.
  CUmodule kept = module->release();
  CHECK(module->get() == nullptr);
  CUfunction fn = nullptr;
  CHECK(cu.cuModuleGetFunction(&fn, kept, std::string(kCudaSelftestKernelName).c_str()) ==
        CUDA_SUCCESS);
  CHECK(cu.cuModuleUnload(kept) == CUDA_SUCCESS);

  StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(cu, 1 << 20);
  REQUIRE(buffer.ok());
  CHECK(buffer->get() != 0);
  DeviceBuffer moved = std::move(*buffer);
  CHECK(buffer->get() == 0);
  CHECK(moved.size() == std::size_t{1} << 20);
  std::vector<unsigned char> bytes(16, 0xab);
  CHECK(cu.cuMemcpyHtoD(moved.get(), bytes.data(), bytes.size()) == CUDA_SUCCESS);

  // An image the driver cannot use is the candidate's fault, reported as such.
  StatusOr<CudaModule> bad = CudaModule::load(cu, "not an image");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

}  // namespace kforge

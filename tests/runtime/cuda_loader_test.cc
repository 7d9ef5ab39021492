// The CUDA loader layer on a host without a GPU: what must hold wherever kforge is installed.
// The driver must fail as a value (never a crash) and say what it tried; NVRTC must work from the
// toolkit alone, because the daemon's worker compiles candidates before any GPU is touched.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/cuda_selftest.h"
#include "runtime/nvrtc.h"

namespace kforge {
namespace {

// Sets (or unsets) an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string cuda_home() {
  const char* home = std::getenv("CUDA_HOME");
  return home != nullptr && home[0] != '\0' ? home : "/usr/local/cuda";
}

}  // namespace

TEST_CASE("a driver path that does not exist is unavailable and named", "[cuda][driver]") {
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::load_from("/nonexistent/libcuda.so");
  REQUIRE_FALSE(driver.ok());
  CHECK(driver.status().code() == StatusCode::kUnavailable);
  CHECK(contains(driver.status().message(), "/nonexistent/libcuda.so"));
}

TEST_CASE("KFORGE_LIBCUDA is the only driver tried when set", "[cuda][driver]") {
  ScopedEnv env("KFORGE_LIBCUDA", "/nonexistent/libcuda.so");
  CHECK(CudaDriver::search_paths() == std::vector<std::string>{"/nonexistent/libcuda.so"});
  // Not a fallback to libcuda.so.1: an explicit choice that fails must be reported, even on a
  // host where the default driver would load.
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::load_uncached();
  REQUIRE_FALSE(driver.ok());
  CHECK(driver.status().code() == StatusCode::kUnavailable);
  CHECK(contains(driver.status().message(), "/nonexistent/libcuda.so"));
  CHECK(contains(driver.status().message(), "KFORGE_LIBCUDA"));
}

TEST_CASE("without KFORGE_LIBCUDA the driver is found by soname", "[cuda][driver]") {
  ScopedEnv env("KFORGE_LIBCUDA", nullptr);
  CHECK(CudaDriver::search_paths() == std::vector<std::string>{"libcuda.so.1", "libcuda.so"});
  // Either outcome is legitimate here; what matters is an answer instead of a crash, and that a
  // failure is kUnavailable (a host property), never kInternal.
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::load_uncached();
  if (driver.ok()) {
    CHECK((*driver)->version() >= 11000);
    CHECK_FALSE((*driver)->library_path().empty());
  } else {
    CHECK(driver.status().code() == StatusCode::kUnavailable);
  }
}

TEST_CASE("the toolkit's libcuda link stub is reported as a stub, not used", "[cuda][driver]") {
  const std::string stub = cuda_home() + "/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) {
    WARN("no CUDA toolkit stub at " << stub << "; skipped");
    return;
  }
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::load_from(stub);
  REQUIRE_FALSE(driver.ok());
  CHECK(driver.status().code() == StatusCode::kUnavailable);
  CHECK(contains(driver.status().message(), "stub"));
}

TEST_CASE("a failed driver call names the statement, place and CUresult", "[cuda][driver]") {
  Status oom = cu_error_status(CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY",
                               "out of memory", "cu.cuMemAlloc(&ptr, bytes)", "runtime/x.cc", 42);
  CHECK(oom.code() == StatusCode::kUnavailable);
  CHECK(oom.message() ==
        "cu.cuMemAlloc(&ptr, bytes) failed at runtime/x.cc:42: CUDA_ERROR_OUT_OF_MEMORY (out of "
        "memory)");

  // A bad image is the candidate's fault, a missing kernel name a lookup miss, the rest our bug.
  CHECK(cu_error_status(CUDA_ERROR_INVALID_PTX, "n", "", "s", "f", 1).code() ==
        StatusCode::kInvalidArgument);
  CHECK(cu_error_status(CUDA_ERROR_NO_BINARY_FOR_GPU, "n", "", "s", "f", 1).code() ==
        StatusCode::kInvalidArgument);
  CHECK(cu_error_status(CUDA_ERROR_NOT_FOUND, "n", "", "s", "f", 1).code() ==
        StatusCode::kNotFound);
  CHECK(cu_error_status(CUDA_ERROR_NO_DEVICE, "n", "", "s", "f", 1).code() ==
        StatusCode::kUnavailable);
  CHECK(cu_error_status(CUDA_ERROR_INVALID_VALUE, "n", "", "s", "f", 1).code() ==
        StatusCode::kInternal);
  CHECK(cu_error_status(CUDA_SUCCESS, "n", "", "s", "f", 1).ok());
}

TEST_CASE("a GPU's UUID is written as nvidia-smi writes it", "[cuda][driver]") {
  // Processes see different ordinals (each has its own CUDA_VISIBLE_DEVICES); the hook, the worker
  // and the daemon meet on this string, so its form is fixed: "GPU-", 8-4-4-4-12 lowercase hex.
  CUuuid uuid{};
  const unsigned char bytes[16] = {0x5e, 0x2a, 0x91, 0x0c, 0xd3, 0x4f, 0x8b, 0x17,
                                   0xa0, 0xff, 0x00, 0x01, 0x7e, 0x80, 0xc9, 0x3b};
  std::memcpy(uuid.bytes, bytes, sizeof bytes);
  CHECK(gpu_uuid_string(uuid) == "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b");
  CHECK(gpu_uuid_string(CUuuid{}) == "GPU-00000000-0000-0000-0000-000000000000");
  CHECK(gpu_uuid_string(uuid).size() == 40);
}

TEST_CASE("KFORGE_LIBNVRTC is the only NVRTC tried when set", "[cuda][nvrtc]") {
  ScopedEnv env("KFORGE_LIBNVRTC", "/nonexistent/libnvrtc.so.13");
  StatusOr<std::unique_ptr<Nvrtc>> nvrtc = Nvrtc::load_uncached();
  REQUIRE_FALSE(nvrtc.ok());
  CHECK(nvrtc.status().code() == StatusCode::kUnavailable);
  CHECK(contains(nvrtc.status().message(), "/nonexistent/libnvrtc.so.13"));
}

TEST_CASE("NVRTC from the toolkit compiles the self-test kernel to a CUBIN for sm_90",
          "[cuda][nvrtc]") {
  ScopedEnv env("KFORGE_LIBNVRTC", nullptr);
  StatusOr<std::unique_ptr<Nvrtc>> loaded = Nvrtc::load_uncached();
  INFO(loaded.status().to_string());
  REQUIRE(loaded.ok());
  const Nvrtc& nvrtc = **loaded;
  CHECK(nvrtc.version().major >= 11);
  CHECK(std::filesystem::path(nvrtc.library_path()).is_absolute());
  REQUIRE(nvrtc.emits_cubin());

  StatusOr<CompiledKernel> kernel =
      nvrtc.compile(cuda_selftest_kernel_source(), "kforge_selftest.cu", {}, 9, 0);
  INFO(kernel.status().to_string());
  REQUIRE(kernel.ok());
  CHECK(kernel->kind == ImageKind::kCubin);
  CHECK(kernel->arch == "sm_90");
  // A CUBIN is an ELF object; anything else means we fetched the wrong output.
  REQUIRE(kernel->image.size() > 4);
  CHECK(std::memcmp(kernel->image.data(),
                    "\x7f"
                    "ELF",
                    4) == 0);
}

TEST_CASE("a kernel that does not compile is kInvalidArgument carrying NVRTC's log",
          "[cuda][nvrtc]") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  INFO(nvrtc.status().to_string());
  REQUIRE(nvrtc.ok());
  const char* source =
      "extern \"C\" __global__ void broken(float* y) {\n"
      "  y[0] = undeclared_value;\n"
      "}\n";
  StatusOr<CompiledKernel> kernel = (*nvrtc)->compile(source, "broken.cu", {}, 9, 0);
  REQUIRE_FALSE(kernel.ok());
  CHECK(kernel.status().code() == StatusCode::kInvalidArgument);
  // The log line a proposer needs to repair the kernel: file, line and the diagnostic.
  INFO(kernel.status().message());
  CHECK(contains(kernel.status().message(), "broken.cu(2): error"));
  CHECK(contains(kernel.status().message(), "undeclared_value"));
}

TEST_CASE("compile options pass through, but the architecture is compile()'s to choose",
          "[cuda][nvrtc]") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  REQUIRE(nvrtc.ok());
  const std::vector<std::string> good = {"--std=c++17", "-DKFORGE_TEST_VALUE=1"};
  const char* source =
      "#if KFORGE_TEST_VALUE != 1\n#error option not passed\n#endif\n"
      "extern \"C\" __global__ void k(float* y) { y[0] = 1.0f; }\n";
  StatusOr<CompiledKernel> kernel = (*nvrtc)->compile(source, "options.cu", good, 8, 0);
  INFO(kernel.status().to_string());
  CHECK(kernel.ok());

  const std::vector<std::string> arch = {"--gpu-architecture=sm_80"};
  StatusOr<CompiledKernel> rejected = (*nvrtc)->compile(source, "options.cu", arch, 9, 0);
  REQUIRE_FALSE(rejected.ok());
  CHECK(rejected.status().code() == StatusCode::kInvalidArgument);

  StatusOr<CompiledKernel> bad_cc = (*nvrtc)->compile(source, "options.cu", {}, 0, 0);
  REQUIRE_FALSE(bad_cc.ok());
  CHECK(bad_cc.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("compile() runs on several threads at once with identical results", "[cuda][nvrtc]") {
  // The worker compiles candidates in parallel; NVRTC programs are independent objects.
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  REQUIRE(nvrtc.ok());
  constexpr int kThreads = 4;
  std::vector<StatusOr<CompiledKernel>> results(
      kThreads, StatusOr<CompiledKernel>(Status(StatusCode::kInternal, "not run")));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      results[i] = (*nvrtc)->compile(cuda_selftest_kernel_source(), "parallel.cu", {}, 9, 0);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const StatusOr<CompiledKernel>& r : results) {
    INFO(r.status().to_string());
    REQUIRE(r.ok());
    CHECK(r->image == results[0]->image);
  }
}

TEST_CASE("the CUDA self-test answers on any host: ok with a GPU, kUnavailable without",
          "[cuda][selftest]") {
  std::string report;
  Status status = run_cuda_selftest(&report);
  INFO(status.to_string() << "\n" << report);
  if (CudaDriver::load().ok()) {
    CHECK(status.ok());
  } else {
    CHECK(status.code() == StatusCode::kUnavailable);
  }
  CHECK(contains(report, "result: "));
}

TEST_CASE("the C entry point truncates its report safely and returns the status class",
          "[cuda][selftest]") {
  const bool have_gpu = CudaDriver::load().ok();
  char small[8];
  std::memset(small, 'x', sizeof(small));
  const int code = kforge_cuda_selftest(small, sizeof(small));
  CHECK(code == (have_gpu ? 0 : 2));
  CHECK(std::strlen(small) == sizeof(small) - 1);

  char big[4096];
  CHECK(kforge_cuda_selftest(big, sizeof(big)) == code);
  CHECK(contains(big, "result: "));
  CHECK(kforge_cuda_selftest(nullptr, 0) == code);
}

}  // namespace kforge

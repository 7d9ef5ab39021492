// The CUDA launcher on a real GPU (ctest label `gpu`): a KernelSpec's plan (two launches, scratch,
// more than 48 KiB of dynamic shared memory, scalar parameters) compiled by NVRTC for the device's
// arch runs through CudaKernel and matches a host reference; impossible launches are errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/cuda_launcher.h"
#include "runtime/nvrtc.h"

namespace kforge {
namespace {

// Row softmax: launch 0 writes each row's max and sum into scratch (one block per row, the row
// staged through 64 KiB of dynamic shared memory), launch 1 normalizes and scales.
constexpr const char* kSource = R"(
extern "C" __global__ void row_stats(const float* x, float* stats, int cols) {
  extern __shared__ float stage[];
  const float* row = x + (long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) stage[c] = row[c];
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = __int_as_float(0xff800000), s = 0.f;   // -inf: NVRTC has no math.h
    for (int c = 0; c < cols; ++c) m = fmaxf(m, stage[c]);
    for (int c = 0; c < cols; ++c) s += expf(stage[c] - m);
    stats[2 * blockIdx.x] = m;
    stats[2 * blockIdx.x + 1] = s;
  }
}
extern "C" __global__ void normalize(const float* x, const float* stats, float* y, int cols, float scale) {
  long r = blockIdx.y;
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < cols) y[r * cols + c] = scale * expf(x[r * cols + c] - stats[2 * r]) / stats[2 * r + 1];
}
)";

TensorMeta contiguous(std::vector<int64_t> sizes) { return contiguous_tensor(DType::kFloat32, DeviceType::kCuda, std::move(sizes)); }

KernelSpec spec_with_smem(const std::string& smem_expr) {
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = kSource;
  s.entry_points = {"row_stats", "normalize"};
  s.plan.scratch = {{"stats", "size0_0 * 8"}};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch stats;
  stats.entry = "row_stats";
  stats.grid = {"size0_0", "1", "1"};
  stats.block = {"256", "1", "1"};
  stats.shared_mem_bytes = smem_expr;
  stats.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::size("size0_1", ValueType::kInt32)};
  Launch norm;
  norm.entry = "normalize";
  norm.grid = {"ceil_div(size0_1, 256)", "size0_0", "1"};
  norm.block = {"256", "1", "1"};
  norm.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::output(0),
               ArgBinding::size("size0_1", ValueType::kInt32), ArgBinding::scalar(1, ValueType::kFloat32)};
  s.plan.launches = {stats, norm};
  return s;
}

}  // namespace

TEST_CASE("CudaKernel runs a two-launch plan with 64 KiB dynamic shared memory", "[cuda][gpu]") {
  auto drv = CudaDriver::load();
  INFO(drv.status().to_string());
  REQUIRE(drv.ok());
  const CudaDriver& cu = **drv;
  CUdevice dev = 0;
  REQUIRE(cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  int major = 0, minor = 0;
  cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  auto primary = PrimaryContext::retain(cu, dev);
  REQUIRE(primary.ok());
  auto scope = ScopedCurrentContext::make_current(cu, primary->get());
  REQUIRE(scope.ok());
  auto nvrtc = Nvrtc::load();
  REQUIRE(nvrtc.ok());
  std::vector<std::string> opts;
  auto compiled = (*nvrtc)->compile(kSource, "softmax.cu", opts, major, minor);
  INFO(compiled.status().to_string());
  REQUIRE(compiled.ok());

  const int64_t rows = 300, cols = 16384;   // 16384 floats = 64 KiB staged per row
  OpSignature sig{"test::scaled_softmax", "", {Arg::tensor(contiguous({rows, cols})), Arg::real(0.25)},
                  Target{Backend::kCuda, "sm_" + std::to_string(major) + std::to_string(minor)}};
  KernelSpec spec = spec_with_smem("size0_1 * 4");
  REQUIRE(spec.validate().ok());
  auto plan = spec.resolve(sig);
  REQUIRE(plan.ok());
  CHECK(plan->launches[0].shared_mem_bytes == 65536);
  auto kernel = CudaKernel::load(cu, compiled->image.data(), spec);
  REQUIRE(kernel.ok());

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 4.f);
  std::vector<float> x(static_cast<size_t>(rows * cols)), y(x.size(), std::nanf(""));
  for (float& v : x) v = normal(rng);
  const size_t bytes = x.size() * sizeof(float);
  auto dx = DeviceBuffer::allocate(cu, bytes), dy = DeviceBuffer::allocate(cu, bytes),
       ds = DeviceBuffer::allocate(cu, static_cast<size_t>(rows) * 8);
  REQUIRE(dx.ok());
  REQUIRE(dy.ok());
  REQUIRE(ds.ok());
  REQUIRE(cu.cuMemcpyHtoD(dx->get(), x.data(), bytes) == CUDA_SUCCESS);
  REQUIRE(cu.cuMemcpyHtoD(dy->get(), y.data(), bytes) == CUDA_SUCCESS);   // NaN-poisoned output
  CudaBuffers io{{dx->get(), 0}, {dy->get()}, {ds->get()}};
  Status s = kernel->launch(*plan, io, nullptr);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(cu.cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cu.cuMemcpyDtoH(y.data(), dy->get(), bytes) == CUDA_SUCCESS);

  double max_rel = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, x[static_cast<size_t>(r * cols + c)]);
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(double(x[static_cast<size_t>(r * cols + c)]) - m);
    for (int64_t c = 0; c < cols; ++c) {
      double want = 0.25 * std::exp(double(x[static_cast<size_t>(r * cols + c)]) - m) / sum;
      double got = y[static_cast<size_t>(r * cols + c)];
      REQUIRE(std::isfinite(got));
      max_rel = std::fmax(max_rel, std::fabs(got - want) / std::fmax(want, 1e-30));
    }
  }
  INFO("max relative error " << max_rel);
  CHECK(max_rel < 1e-4);

  SECTION("more dynamic shared memory than the device has is an error, and the kernel still works") {
    KernelSpec big = spec_with_smem("1048576");   // 1 MiB: no GPU has that much per block
    auto big_plan = big.resolve(sig);
    REQUIRE(big_plan.ok());
    Status e = kernel->launch(*big_plan, io, nullptr);
    REQUIRE_FALSE(e.ok());
    CHECK_THAT(e.message(), Catch::Contains("launch 0 (row_stats)"));
    CHECK(kernel->launch(*plan, io, nullptr).ok());
    CHECK(cu.cuCtxSynchronize() == CUDA_SUCCESS);
  }
}

}  // namespace kforge

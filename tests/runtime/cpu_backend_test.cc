// The CPU backend runs a candidate's shared object per its launch plan: the same declarative
// plans as CUDA (grid of blocks, parameters by binding, scratch, shared memory), on the host.
// Kernels here are compiled by the system compiler in the test, as the worker will compile them.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "runtime/cpu_backend.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

// Row softmax in two launches: per-row max and sum into scratch, then normalize. One block per
// row; shared memory is used as the block's private accumulator to check it is provided.
constexpr const char* kSoftmaxSource = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void row_stats(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* stats = *(float* const*)p[1];
  long cols = *(const int64_t*)p[2];
  float* acc = (float*)b->shared_mem;
  long r = b->block_idx[0];
  acc[0] = -INFINITY;
  for (long c = 0; c < cols; ++c) acc[0] = fmaxf(acc[0], x[r * cols + c]);
  acc[1] = 0.f;
  for (long c = 0; c < cols; ++c) acc[1] += expf(x[r * cols + c] - acc[0]);
  stats[2 * r] = acc[0];
  stats[2 * r + 1] = acc[1];
}
extern "C" void normalize(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  const float* stats = *(const float* const*)p[1];
  float* y = *(float* const*)p[2];
  int cols = *(const int32_t*)p[3];
  float scale = *(const float*)p[4];
  long r = b->block_idx[0];
  for (int c = 0; c < cols; ++c) y[r * cols + c] = scale * expf(x[r * cols + c] - stats[2 * r]) / stats[2 * r + 1];
}
)";

using TempDir = kforge::test_support::TempDir;

std::string compile_shared_object(const TempDir& t, const std::string& source) {
  fs::path src = t.path / "k.cc", so = t.path / "k.so";
  std::ofstream(src) << source;
  std::string cmd = "c++ -std=c++17 -O2 -shared -fPIC -I" KFORGE_SOURCE_DIR " -o " + so.string() + " " +
                    src.string() + " 2>" + (t.path / "log").string();
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(so, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TensorMeta contiguous(std::vector<int64_t> sizes) { return contiguous_tensor(DType::kFloat32, DeviceType::kCpu, std::move(sizes)); }

KernelSpec softmax_spec(const std::string& source) {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = source;
  s.entry_points = {"row_stats", "normalize"};
  s.plan.scratch = {{"stats", "size0_0 * 8"}};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch stats;
  stats.entry = "row_stats";
  stats.grid = {"size0_0", "1", "1"};
  stats.shared_mem_bytes = "8";
  stats.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::size("size0_1")};
  Launch norm;
  norm.entry = "normalize";
  norm.grid = {"size0_0", "1", "1"};
  norm.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::output(0),
               ArgBinding::size("size0_1", ValueType::kInt32), ArgBinding::scalar(1, ValueType::kFloat32)};
  s.plan.launches = {stats, norm};
  return s;
}

}  // namespace

TEST_CASE("CPU backend: a two-launch softmax with scratch, shared memory and a scalar matches the host") {
  TempDir t{"kforge-cpu-backend"};
  const std::string image = compile_shared_object(t, kSoftmaxSource);
  auto module = CpuModule::load_image(image, "softmax_rows");
  REQUIRE(module.ok());

  const int64_t rows = 257, cols = 129;
  OpSignature sig{"test::scaled_softmax", "", {Arg::tensor(contiguous({rows, cols})), Arg::real(0.5)},
                  Target{Backend::kCpu, "x86_64"}};
  KernelSpec spec = softmax_spec(kSoftmaxSource);
  REQUIRE(spec.validate().ok());
  auto plan = spec.resolve(sig);
  REQUIRE(plan.ok());

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> x(static_cast<size_t>(rows * cols)), y(x.size(), std::nanf(""));
  for (float& v : x) v = normal(rng);
  CpuBuffers io{{x.data(), nullptr}, {y.data()}, {}};
  REQUIRE(run_cpu_plan(*module, spec, *plan, io).ok());

  for (int64_t r = 0; r < rows; ++r) {
    float m = -INFINITY, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, x[static_cast<size_t>(r * cols + c)]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[static_cast<size_t>(r * cols + c)] - m);
    for (int64_t c = 0; c < cols; ++c) {
      float want = 0.5f * std::exp(x[static_cast<size_t>(r * cols + c)] - m) / s;
      REQUIRE(y[static_cast<size_t>(r * cols + c)] == Approx(want).epsilon(1e-6));
    }
  }
}

TEST_CASE("CPU backend: two different images loaded one after the other are two modules") {
  // Regression: with the memfd closed after dlopen, the second image got the same fd number, and
  // glibc returned the first module for the same "/proc/self/fd/N" name.
  TempDir t{"kforge-cpu-backend"};
  auto a = CpuModule::load_image(compile_shared_object(t, "extern \"C\" int which() { return 1; }"), "a");
  REQUIRE(a.ok());
  auto b = CpuModule::load_image(compile_shared_object(t, "extern \"C\" int which() { return 2; }"), "b");
  REQUIRE(b.ok());
  auto fa = a->entry("which"), fb = b->entry("which");
  REQUIRE(fa.ok());
  REQUIRE(fb.ok());
  using Which = int (*)();
  Which wa, wb;
  std::memcpy(&wa, &*fa, sizeof wa);
  std::memcpy(&wb, &*fb, sizeof wb);
  CHECK(wa() == 1);
  CHECK(wb() == 2);
}

TEST_CASE("CPU backend: bad images, missing symbols and missing buffers are errors that say which") {
  auto not_elf = CpuModule::load_image("definitely not a shared object", "junk");
  REQUIRE_FALSE(not_elf.ok());
  CHECK_THAT(not_elf.status().message(), Catch::Contains("cpu module 'junk': image is not an ELF"));

  auto truncated = CpuModule::load_image(std::string("\x7f" "ELF\x02\x01\x01", 7), "short");
  REQUIRE_FALSE(truncated.ok());
  CHECK_THAT(truncated.status().message(), Catch::Contains("dlopen failed"));

  TempDir t{"kforge-cpu-backend"};
  auto module = CpuModule::load_image(compile_shared_object(t, kSoftmaxSource), "softmax_rows");
  REQUIRE(module.ok());
  auto missing = module->entry("no_such_kernel");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("no_such_kernel"));

  OpSignature sig{"test::scaled_softmax", "", {Arg::tensor(contiguous({4, 8})), Arg::real(1.0)},
                  Target{Backend::kCpu, "x86_64"}};
  KernelSpec spec = softmax_spec(kSoftmaxSource);
  auto plan = spec.resolve(sig);
  REQUIRE(plan.ok());
  std::vector<float> y(32);
  CpuBuffers no_input{{nullptr, nullptr}, {y.data()}, {}};
  Status s = run_cpu_plan(*module, spec, *plan, no_input);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("launch 0, arg 0: no tensor for input 0"));
  CpuBuffers no_output{{y.data(), nullptr}, {}, {}};
  CHECK_FALSE(run_cpu_plan(*module, spec, *plan, no_output).ok());
}

TEST_CASE("CPU backend: the worker's knobs: blocks in a seeded order, shared memory poisoned, modules unloaded") {
  // Each block records the order it ran in and the first byte of its shared memory.
  constexpr const char* kOrder = R"(
#include <stdint.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void order(const kforge_cpu_block* b, void* const* p) {
  int64_t* seq = *(int64_t* const*)p[0];
  int64_t* smem_byte = *(int64_t* const*)p[1];
  int64_t ticket = __atomic_fetch_add(&seq[0], 1, __ATOMIC_SEQ_CST);
  seq[1 + b->block_idx[0]] = ticket;
  smem_byte[b->block_idx[0]] = ((unsigned char*)b->shared_mem)[0];
  ((unsigned char*)b->shared_mem)[0] = 0x11;   // what the next block on this thread would see
}
)";
  TempDir t{"kforge-cpu-backend"};
  auto module = CpuModule::load_image(compile_shared_object(t, kOrder), "order");
  REQUIRE(module.ok());
  KernelSpec spec;
  spec.backend = Backend::kCpu;
  spec.language = SourceLanguage::kCpp;
  spec.source = kOrder;
  spec.entry_points = {"order"};
  Launch l;
  l.entry = "order";
  l.grid = {"64", "1", "1"};
  l.shared_mem_bytes = "16";
  l.args = {ArgBinding::input(0), ArgBinding::input(1)};
  spec.plan.launches = {l};
  OpSignature sig{"test::order", "", {Arg::tensor(contiguous({65})), Arg::tensor(contiguous({64}))},
                  Target{Backend::kCpu, "x86_64"}};
  auto plan = spec.resolve(sig);
  REQUIRE(plan.ok());
  auto run = [&](const CpuRunOptions& o) {
    std::vector<int64_t> seq(65, 0), smem(64, -1);
    CpuBuffers io{{seq.data(), smem.data()}, {}, {}};
    REQUIRE(run_cpu_plan(*module, spec, *plan, io, o).ok());
    std::sort(seq.begin() + 1, seq.end());
    for (int64_t i = 0; i < 64; ++i) REQUIRE(seq[static_cast<size_t>(i + 1)] == i);   // every block ran once
    return smem;
  };
  // Poisoned: every block sees the poison, never the previous block's 0x11.
  for (int64_t v : run(CpuRunOptions{0, 0xAB})) CHECK(v == 0xAB);
  // On one thread the start order is exactly the schedule: index order without a seed, a fixed
  // permutation per seed, another one for another seed.
  {
    tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    auto order_of = [&](uint64_t seed) {
      std::vector<int64_t> seq(65, 0), smem(64, 0);
      CpuBuffers io{{seq.data(), smem.data()}, {}, {}};
      REQUIRE(run_cpu_plan(*module, spec, *plan, io, CpuRunOptions{seed, -1}).ok());
      return std::vector<int64_t>(seq.begin() + 1, seq.end());
    };
    std::vector<int64_t> identity(64);
    for (int64_t i = 0; i < 64; ++i) identity[static_cast<size_t>(i)] = i;
    CHECK(order_of(0) == identity);
    CHECK(order_of(1) == order_of(1));
    CHECK(order_of(1) != identity);
    CHECK(order_of(1) != order_of(2));
  }

  // After unload() the module's memfd is closed (no fd leak across thousands of candidates).
  const auto fds = [] { return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{}); };
  const auto before = fds();
  auto extra = CpuModule::load_image(compile_shared_object(t, "extern \"C\" int f() { return 3; }"), "extra");
  REQUIRE(extra.ok());
  CHECK(fds() == before + 1);
  extra->unload();
  CHECK(fds() == before);
}

// CandidateBuilder: a candidate's source in, a loadable binary (or an ordinary compile error) out,
// through a content-addressed build cache. CPU kernels are compiled by the host's C++ compiler
// here, exactly as the worker compiles them; CUDA kernels by the toolkit's NVRTC (no GPU needed).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/syscall.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/cpu_backend.h"
#include "runtime/nvrtc.h"
#include "search_daemon/worker/builder.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;


// y[i] = SCALE * x[i] for one block of `n` elements. SCALE defaults to 2; a -D can change it.
constexpr const char* kScaleSource = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
#ifndef SCALE
#define SCALE 2
#endif
extern "C" void scale(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  int64_t n = *(const int64_t*)p[2];
  for (int64_t i = 0; i < n; ++i) y[i] = SCALE * fabsf(x[i]) * (b->abi_version == KFORGE_CPU_ABI_VERSION);
}
)";

KernelSpec cpu_spec(std::string source, std::vector<std::string> options = {}) {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = std::move(source);
  s.entry_points = {"scale"};
  s.compile_options = std::move(options);
  return s;
}

CpuCompiler host_compiler() {
  StatusOr<CpuCompiler> c = CpuCompiler::detect("c++");
  INFO(c.status().to_string());
  REQUIRE(c.ok());
  return *c;
}

// The same identity as the host compiler (so the same cache keys), but a command that cannot run:
// any build through it that is not a cache hit fails.
CpuCompiler unrunnable_twin(const CpuCompiler& c) { return {"/nonexistent/kforge-no-such-c++", c.identity}; }

CandidateBuilder cpu_builder(const fs::path& dir, CpuCompiler c) {
  StatusOr<CandidateBuilder> b = CandidateBuilder::for_cpu(dir.string(), std::move(c));
  INFO(b.status().to_string());
  REQUIRE(b.ok());
  return std::move(b).value();
}

BuildOutput build_ok(const CandidateBuilder& b, const KernelSpec& spec, uint32_t budget_ms = 60000) {
  StatusOr<BuildOutput> out = b.build(spec, budget_ms);
  INFO(out.status().to_string());
  REQUIRE(out.ok());
  return std::move(out).value();
}

fs::path entry_file(const fs::path& cache, const std::string& key) {
  return cache / key.substr(0, 2) / (key + ".art");
}

std::vector<float> run_scale(const std::string& image, const std::vector<float>& x) {
  StatusOr<CpuModule> m = CpuModule::load_image(image, "scale");
  INFO(m.status().to_string());
  REQUIRE(m.ok());
  StatusOr<kforge_cpu_entry> f = m->entry("scale");
  REQUIRE(f.ok());
  std::vector<float> y(x.size(), -1.f);
  const float* xp = x.data();
  float* yp = y.data();
  int64_t n = static_cast<int64_t>(x.size());
  void* params[] = {&xp, &yp, &n};
  kforge_cpu_block block{};
  block.abi_version = KFORGE_CPU_ABI_VERSION;
  block.grid_dim[0] = block.grid_dim[1] = block.grid_dim[2] = 1;
  block.block_dim[0] = block.block_dim[1] = block.block_dim[2] = 1;
  (*f)(&block, params);
  return y;
}

fs::path write_script(const fs::path& dir, const std::string& name, const std::string& body) {
  fs::path p = dir / name;
  std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

bool is_lower_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

// ---- the compiler ------------------------------------------------------------------------------------

TEST_CASE("builder: the compiler is the one named (the worker's KFORGE_CXX), else c++, identified by the first line of --version") {
  {
    CpuCompiler c = host_compiler();
    CHECK(c.command == "c++");
    CHECK(!c.identity.empty());
    CHECK(c.identity.find('\n') == std::string::npos);
    StatusOr<CpuCompiler> by_default = CpuCompiler::detect("");
    REQUIRE(by_default.ok());
    CHECK(by_default->command == "c++");
  }
  {
    StatusOr<CpuCompiler> c = CpuCompiler::detect("/nonexistent/kforge-no-such-c++");
    REQUIRE(!c.ok());
    CHECK(c.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(c.status().message(), Catch::StartsWith("no C++ compiler: "));
    CHECK_THAT(c.status().message(), Catch::Contains("/nonexistent/kforge-no-such-c++"));
  }
}

// ---- CPU builds ----------------------------------------------------------------------------------------

TEST_CASE("builder: a good CPU kernel builds into a shared object that loads and runs") {
  TempDir t{"kforge-builder-test"};
  CandidateBuilder b = cpu_builder(t.path / "cache", host_compiler());
  CHECK_THAT(b.target_identity(), Catch::StartsWith("cpu "));

  BuildOutput out = build_ok(b, cpu_spec(kScaleSource));
  INFO(out.log);
  REQUIRE(out.compiled);
  CHECK(out.artifact_name == "so");
  CHECK(!out.cached);
  CHECK(out.build_ms > 0);
  CHECK(out.key.size() == 64);
  CHECK(is_lower_hex(out.key));
  CHECK(run_scale(out.artifact, {1.f, -2.f, 3.5f}) == std::vector<float>{2.f, 4.f, 7.f});

  // The cache directory is private to this user.
  struct stat st {};
  REQUIRE(::stat((t.path / "cache").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("builder: a second build of the same spec is a cache hit with the same bytes and no compiler run") {
  TempDir t{"kforge-builder-test"};
  const CpuCompiler cxx = host_compiler();
  BuildOutput first = build_ok(cpu_builder(t.path / "cache", cxx), cpu_spec(kScaleSource));
  REQUIRE(first.compiled);

  // This builder cannot run any compiler, so only the cache can answer.
  CandidateBuilder cache_only = cpu_builder(t.path / "cache", unrunnable_twin(cxx));
  BuildOutput second = build_ok(cache_only, cpu_spec(kScaleSource));
  CHECK(second.cached);
  CHECK(second.compiled);
  CHECK(second.artifact_name == "so");
  CHECK(second.key == first.key);
  CHECK(second.artifact == first.artifact);

  SECTION("the key covers the compiler identity: another compiler is a miss") {
    CandidateBuilder other = cpu_builder(t.path / "cache", {"/nonexistent/kforge-no-such-c++", cxx.identity + " (other)"});
    StatusOr<BuildOutput> miss = other.build(cpu_spec(kScaleSource), 60000);
    REQUIRE(!miss.ok());  // it had to run its compiler, which does not exist
    CHECK(miss.status().code() == StatusCode::kUnavailable);
  }
  SECTION("the key covers the source, the entry points and the options") {
    KernelSpec s = cpu_spec(kScaleSource);
    s.source += "\n// another candidate\n";
    CHECK(!cache_only.build(s, 60000).ok());
    s = cpu_spec(kScaleSource);
    s.entry_points = {"scale", "other"};
    CHECK(!cache_only.build(s, 60000).ok());
    CHECK(!cache_only.build(cpu_spec(kScaleSource, {"-O3"}), 60000).ok());
  }
}

TEST_CASE("builder: a syntax error is an ordinary result carrying the compiler's message, and is cached") {
  TempDir t{"kforge-builder-test"};
  const CpuCompiler cxx = host_compiler();
  const KernelSpec broken = cpu_spec("extern \"C\" void scale( { kforge_undeclared_name; }\n");
  BuildOutput out = build_ok(cpu_builder(t.path / "cache", cxx), broken);
  CHECK(!out.compiled);
  CHECK(out.artifact_name.empty());
  CHECK(out.artifact.empty());
  CHECK_THAT(out.log, Catch::Contains("kernel.cc") && Catch::Contains("error"));
  CHECK(!out.cached);

  BuildOutput again = build_ok(cpu_builder(t.path / "cache", unrunnable_twin(cxx)), broken);
  CHECK(again.cached);
  CHECK(!again.compiled);
  CHECK(again.log == out.log);
}

TEST_CASE("builder: allowed compile options reach the compiler, after the fixed flags") {
  TempDir t{"kforge-builder-test"};
  BuildOutput out = build_ok(cpu_builder(t.path / "cache", host_compiler()),
                             cpu_spec(kScaleSource, {"-O3", "-mtune=generic", "-funroll-loops", "-fno-math-errno",
                                                     "-DSCALE=3", "-USOMETHING", "-std=gnu++20"}));
  INFO(out.log);
  REQUIRE(out.compiled);
  CHECK(run_scale(out.artifact, {1.f, -2.f}) == std::vector<float>{3.f, 6.f});
}

TEST_CASE("builder: a compile option outside the allow-list is refused by name and never reaches the compiler") {
  const std::vector<std::string> options = GENERATE(
      std::vector<std::string>{"-o", "/tmp/x"},           // an output path
      std::vector<std::string>{"@file"},                  // a response file
      std::vector<std::string>{"-I/usr/include"},         // an include directory
      std::vector<std::string>{"-Wl,-rpath,/tmp"},        // a linker flag
      std::vector<std::string>{"-lpthread"},              // a library
      std::vector<std::string>{"-fplugin=x"},             // code run inside the compiler
      std::vector<std::string>{"-fprofile-generate"},     // writes files at run time
      std::vector<std::string>{"-fopt-info-vec=/tmp/x"},  // writes outside the build directory
      std::vector<std::string>{"-ffast-math"},            // accuracy traded for speed
      std::vector<std::string>{"-funsafe-math-optimizations"},
      std::vector<std::string>{"-ffinite-math-only"},
      std::vector<std::string>{"-fno-signed-zeros"},
      std::vector<std::string>{"-Ofast"},
      std::vector<std::string>{"-march=native"},          // depends on the host, not on the key
      std::vector<std::string>{"-flto=auto"},             // parallel jobs on the serving host's cores
      std::vector<std::string>{"-flto=8"},
      std::vector<std::string>{"-flto"},                  // GCC >= 11 picks a job count itself
      std::vector<std::string>{"-std=c++17; rm -rf /"},
      std::vector<std::string>{""});
  TempDir t{"kforge-builder-test"};
  // A compiler that cannot run: a refusal that reached it would be an error, not a result.
  CandidateBuilder b = cpu_builder(t.path / "cache", unrunnable_twin(host_compiler()));
  BuildOutput out = build_ok(b, cpu_spec(kScaleSource, options));
  INFO(out.log);
  CHECK(!out.compiled);
  CHECK_THAT(out.log, Catch::Contains("compile option '" + options[0] + "' is not allowed"));
}

TEST_CASE("builder: a compiler that outlives its budget is killed and the build says so, uncached") {
  TempDir t{"kforge-builder-test"};
  const fs::path hang = write_script(t.path, "hang", "exec sleep 30");
  CandidateBuilder b = cpu_builder(t.path / "cache", {hang.string(), "a compiler that hangs"});

  const auto t0 = std::chrono::steady_clock::now();
  BuildOutput out = build_ok(b, cpu_spec(kScaleSource), /*budget_ms=*/500);
  const double elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(!out.compiled);
  CHECK_THAT(out.log, Catch::Contains("outlived its budget of 500 ms"));
  CHECK(elapsed_ms >= 500);
  CHECK(elapsed_ms < 3000);
  // A timeout says nothing about the source: a later, longer budget must get its chance.
  CHECK(!fs::exists(entry_file(t.path / "cache", out.key)));
}

TEST_CASE("builder: the watchdog kills the compiler's whole process group, not just the driver") {
  // The "driver" exits at once but leaves a tool running that holds its output pipe open: the
  // build must still end at the budget, and the tool must be gone afterwards.
  TempDir t{"kforge-builder-test"};
  const fs::path pid_file = t.path / "tool.pid";
  const fs::path driver = write_script(t.path, "driver", "sleep 30 &\necho $! > '" + pid_file.string() + "'\nexit 0");
  CandidateBuilder b = cpu_builder(t.path / "cache", {driver.string(), "a driver that leaves a tool behind"});

  BuildOutput out = build_ok(b, cpu_spec(kScaleSource), /*budget_ms=*/300);
  CHECK(!out.compiled);
  CHECK_THAT(out.log, Catch::Contains("outlived its budget of 300 ms"));

  pid_t tool = 0;
  std::ifstream(pid_file) >> tool;
  REQUIRE(tool > 0);
  // The tool is not our child, so wait for its exit through a pidfd (ESRCH: already gone).
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, tool, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    CHECK(::poll(&p, 1, 2000) == 1);
    ::close(pidfd);
  } else {
    CHECK(errno == ESRCH);
  }
}

TEST_CASE("builder: a CPU object that imports threads, allocation or I/O is refused, naming the symbol") {
  struct Case {
    const char* symbol;
    const char* source;
  };
  const Case c = GENERATE(
      Case{"pthread_create", R"(
#include <pthread.h>
#include "runtime/cpu_kernel_abi.h"
static void* work(void*) { return nullptr; }
extern "C" void scale(const kforge_cpu_block*, void* const*) { pthread_t t; pthread_create(&t, nullptr, work, nullptr); })"},
      Case{"malloc", R"(
#include <stdlib.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void scale(const kforge_cpu_block*, void* const* p) { *(void**)p[0] = malloc(64); })"},
      Case{"fopen", R"(
#include <stdio.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void scale(const kforge_cpu_block*, void* const* p) { *(void**)p[0] = fopen("/etc/passwd", "r"); })"},
      // A weak reference is bound by ld.so all the same when the process has the symbol.
      Case{"pthread_create", R"(
#include <pthread.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" int pthread_create(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*) __attribute__((weak));
extern "C" void scale(const kforge_cpu_block*, void* const* p) { *(void**)p[0] = (void*)&pthread_create; })"});
  TempDir t{"kforge-builder-test"};
  const CpuCompiler cxx = host_compiler();
  BuildOutput out = build_ok(cpu_builder(t.path / "cache", cxx), cpu_spec(c.source));
  INFO(out.log);
  CHECK(!out.compiled);
  CHECK(out.artifact.empty());
  CHECK_THAT(out.log, Catch::Contains("refused: the object imports ") && Catch::Contains(c.symbol) &&
                          Catch::Contains("CPU kernels may call only the math library and memcpy/memmove/memset"));
  // A refusal is as deterministic as a compile error: cached.
  BuildOutput again = build_ok(cpu_builder(t.path / "cache", unrunnable_twin(cxx)), cpu_spec(c.source));
  CHECK(again.cached);
  CHECK(!again.compiled);
}

TEST_CASE("builder: a damaged cache file is never served: the build runs again and replaces it") {
  TempDir t{"kforge-builder-test"};
  const CpuCompiler cxx = host_compiler();
  const fs::path cache = t.path / "cache";
  CandidateBuilder b = cpu_builder(cache, cxx);
  const BuildOutput good = build_ok(b, cpu_spec(kScaleSource));
  REQUIRE(good.compiled);
  const fs::path file = entry_file(cache, good.key);
  REQUIRE(fs::is_regular_file(file));
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }

  const std::string damage =
      GENERATE("magic", "length", "status byte", "artifact byte", "truncated", "appended", "symbolic link");
  std::string bad = bytes;
  if (damage == std::string("magic")) bad[0] ^= 0x01;
  if (damage == std::string("length")) bad[16] ^= 0x01;
  if (damage == std::string("status byte")) bad[56 + 64] ^= 0x01;
  if (damage == std::string("artifact byte")) bad[bad.size() - 100] ^= 0x40;
  if (damage == std::string("truncated")) bad.resize(bad.size() / 2);
  if (damage == std::string("appended")) bad += "x";
  if (damage == std::string("symbolic link")) {
    // Intact bytes, but behind a link: the cache never follows one.
    std::ofstream(t.path / "elsewhere.art", std::ios::binary) << bytes;
    fs::remove(file);
    fs::create_symlink(t.path / "elsewhere.art", file);
  } else {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bad;
  }
  INFO(damage);

  BuildOutput rebuilt = build_ok(b, cpu_spec(kScaleSource));
  CHECK(!rebuilt.cached);
  CHECK(rebuilt.compiled);
  CHECK(rebuilt.artifact == good.artifact);
  CHECK(fs::is_regular_file(fs::symlink_status(file)));
  // Replaced: the next build is a hit again, with no compiler.
  BuildOutput hit = build_ok(cpu_builder(cache, unrunnable_twin(cxx)), cpu_spec(kScaleSource));
  CHECK(hit.cached);
  CHECK(hit.artifact == good.artifact);
}

TEST_CASE("builder: a cache directory that is a symbolic link is refused") {
  TempDir t{"kforge-builder-test"};
  fs::create_directory(t.path / "real");
  fs::create_directory_symlink(t.path / "real", t.path / "link");
  StatusOr<CandidateBuilder> b = CandidateBuilder::for_cpu((t.path / "link").string(), {"c++", "c++ (test)"});
  REQUIRE(!b.ok());
  CHECK_THAT(b.status().message(), Catch::Contains("symbolic link"));
}

TEST_CASE("builder: a missing cache directory is created with its parents") {
  TempDir t{"kforge-builder-test"};
  StatusOr<CandidateBuilder> b = CandidateBuilder::for_cpu((t.path / "a" / "b" / "cache").string(), {"c++", "c++ (test)"});
  INFO(b.status().to_string());
  REQUIRE(b.ok());
  CHECK(fs::is_directory(t.path / "a" / "b" / "cache"));
}

TEST_CASE("builder: a CPU builder does not build CUDA kernels") {
  TempDir t{"kforge-builder-test"};
  KernelSpec s = cpu_spec(kScaleSource);
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  StatusOr<BuildOutput> out = cpu_builder(t.path / "cache", {"c++", "c++ (test)"}).build(s, 1000);
  REQUIRE(!out.ok());
  CHECK(out.status().code() == StatusCode::kInvalidArgument);
}

// ---- CUDA builds (NVRTC only; no GPU needed) ------------------------------------------------------

TEST_CASE("builder: a CUDA kernel builds with NVRTC for the exact architecture, and is cached") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) {
    WARN("no NVRTC on this host: " << nvrtc.status().to_string());
    return;
  }
  TempDir t{"kforge-builder-test"};
  StatusOr<CandidateBuilder> b = CandidateBuilder::for_cuda((t.path / "cache").string(), *nvrtc, 9, 0);
  REQUIRE(b.ok());
  CHECK_THAT(b->target_identity(), Catch::StartsWith("cuda sm_90 nvrtc "));

  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = "extern \"C\" __global__ void twice(float* y, const float* x) { y[threadIdx.x] = 2 * x[threadIdx.x]; }\n";
  s.entry_points = {"twice"};
  BuildOutput out = build_ok(*b, s);
  INFO(out.log);
  REQUIRE(out.compiled);
  CHECK(out.artifact_name == ((*nvrtc)->emits_cubin() ? "cubin" : "ptx"));
  CHECK(!out.artifact.empty());
  if (out.artifact_name == "ptx") CHECK(out.artifact.back() == '\0');
  BuildOutput again = build_ok(*b, s);
  CHECK(again.cached);
  CHECK(again.artifact == out.artifact);

  SECTION("a compile error is an ordinary result with NVRTC's log") {
    s.source = "extern \"C\" __global__ void twice( { }\n";
    BuildOutput bad = build_ok(*b, s);
    CHECK(!bad.compiled);
    CHECK_THAT(bad.log, Catch::Contains("nvrtc could not compile"));
  }
  SECTION("NVRTC's fast-math options are refused like the CPU ones") {
    s.compile_options = {"--use_fast_math"};
    BuildOutput bad = build_ok(*b, s);
    CHECK(!bad.compiled);
    CHECK_THAT(bad.log, Catch::Contains("compile option '--use_fast_math' is not allowed"));
  }
}

// Prebuilder (search_daemon/daemon/prebuilder.h, Note [Builds ahead]): a template's CUDA spec
// hinted to it is compiled by NVRTC into the build cache, where the workers' CandidateBuilder then
// finds it without compiling; what it must not build (a language model's source, CPU specs, an
// unknown arch) it leaves alone. NVRTC runs on any host (no GPU needed); where it is missing the
// build cases say so and stop.
#include <catch2/catch.hpp>

#include <string>

#include "runtime/nvrtc.h"
#include "search_daemon/daemon/prebuilder.h"
#include "search_daemon/worker/builder.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::daemon;
using kforge::test_support::TempDir;

namespace {

// A CUDA kernel as a template family writes one; `scale` makes distinct specs.
KernelSpec cuda_spec(int scale) {
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = "extern \"C\" __global__ void kf_scale(const float* x, float* y, long long n) {\n"
             "  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) y[i] = x[i] * (float)KF_SCALE;\n"
             "}\n";
  s.entry_points = {"kf_scale"};
  s.compile_options = {"-DKF_SCALE=" + std::to_string(scale)};
  return s;
}

}  // namespace

TEST_CASE("prebuilder: a hinted template spec is built into the workers' cache", "[prebuilder]") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) {
    WARN("no NVRTC on this host: " << nvrtc.status().to_string());
    return;
  }
  TempDir t("kforge-prebuilder-test");
  const std::string cache = (t.path / "builds").string();
  PrebuilderOptions o;
  o.cache_dir = cache;
  o.threads = 2;
  o.idle_priority = false;
  Prebuilder pre(o);
  pre.hint(cuda_spec(2), "template", "sm_90");
  pre.hint(cuda_spec(3), "template", "sm_90");
  pre.hint(cuda_spec(2), "template", "sm_90");   // seen: not queued again
  pre.drain();
  Prebuilder::Stats s = pre.stats();
  CHECK(s.hinted == 3);
  CHECK(s.queued == 2);
  CHECK(s.built == 2);
  CHECK(s.failed == 0);
  CHECK(s.build_ms > 0);

  // The worker's builder, for the same arch and NVRTC: a cache hit, no compile.
  StatusOr<CandidateBuilder> worker = CandidateBuilder::for_cuda(cache, *nvrtc, 9, 0);
  REQUIRE(worker.ok());
  for (int scale : {2, 3}) {
    StatusOr<BuildOutput> out = worker->build(cuda_spec(scale), 60000);
    REQUIRE(out.ok());
    CHECK(out->compiled);
    CHECK(out->cached);
    CHECK(out->artifact.find("kf_scale") != std::string::npos);
  }
  // A spec it was not given is the worker's to compile.
  StatusOr<BuildOutput> fresh = worker->build(cuda_spec(4), 60000);
  REQUIRE(fresh.ok());
  CHECK_FALSE(fresh->cached);

  // Another arch is another key: built again, not confused with sm_90's.
  pre.hint(cuda_spec(2), "template", "sm_80");
  pre.drain();
  CHECK(pre.stats().built == 3);
  StatusOr<CandidateBuilder> ampere = CandidateBuilder::for_cuda(cache, *nvrtc, 8, 0);
  REQUIRE(ampere.ok());
  StatusOr<BuildOutput> a = ampere->build(cuda_spec(2), 60000);
  REQUIRE(a.ok());
  CHECK(a->cached);
}

TEST_CASE("prebuilder: it builds nothing but template CUDA specs for a known arch", "[prebuilder]") {
  TempDir t("kforge-prebuilder-test");
  PrebuilderOptions o;
  o.cache_dir = (t.path / "builds").string();
  o.threads = 1;
  o.idle_priority = false;
  Prebuilder pre(o);
  pre.hint(cuda_spec(5), "llm", "sm_90");   // a model's source: only the isolated worker compiles it
  KernelSpec cpu = cuda_spec(5);
  cpu.backend = Backend::kCpu;
  cpu.language = SourceLanguage::kCpp;
  pre.hint(cpu, "template", "x86_64-avx2");
  pre.drain();
  Prebuilder::Stats s = pre.stats();
  CHECK(s.hinted == 0);
  CHECK(s.queued == 0);
  CHECK(s.built == 0);
  pre.hint(cuda_spec(5), "template", "compute_90");   // no sm_XY: counted, not built
  pre.drain();
  s = pre.stats();
  CHECK(s.hinted == 1);
  CHECK(s.failed == 1);
  CHECK(s.queued == 0);
  CHECK(s.built == 0);
}

TEST_CASE("prebuilder: with no threads it only counts hints", "[prebuilder]") {
  TempDir t("kforge-prebuilder-test");
  PrebuilderOptions o;
  o.cache_dir = (t.path / "builds").string();
  o.threads = 0;
  Prebuilder idle(o);
  idle.hint(cuda_spec(6), "template", "sm_90");
  CHECK(idle.stats().hinted == 1);
  CHECK(idle.stats().queued == 0);
  idle.drain();   // nothing queued: returns at once
}

// kforge-publish-test-entry turns command-line text into exactly the cache entry a worker would
// publish. The hook's swap tests rely on it, so: the text forms parse into the launch-plan
// vocabulary they name (and reject what they cannot mean), and the real executable publishes a
// CPU entry that reads back intact from the store and computes the right thing when run.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache/store.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "tests/support/publish_test_entry.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::test_support;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

// Runs the built executable (not the library function): what the Python tests run.
ToolRun run_tool(const TempDir& t, const std::vector<std::string>& args) {
  std::string cmd = quote(KFORGE_PUBLISH_TEST_ENTRY);
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " >" + quote((t.path / "tool.out").string()) + " 2>" + quote((t.path / "tool.err").string());
  const int status = std::system(cmd.c_str());
  ToolRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(t.path / "tool.out");
  r.err = slurp(t.path / "tool.err");
  return r;
}

std::string to_hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  return hex;
}

// aten::_softmax(float32[rows, cols], -1, false) on this host's CPU target, as the hook reports it.
OpSignature softmax_signature(int64_t rows, int64_t cols) {
  TensorMeta t;
  t.dtype = DType::kFloat32;
  t.device = DeviceType::kCpu;
  t.sizes = {rows, cols};
  t.strides = {cols, 1};
  OpSignature sig;
  sig.op = "aten::_softmax";
  sig.args = {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)};
  sig.target = {Backend::kCpu, cpu_host_environment("").arch};
  return sig;
}

constexpr const char* kSoftmaxKernel = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0] + (long)b->block_idx[0] * *(const int64_t*)p[2];
  float* y = *(float* const*)p[1] + (long)b->block_idx[0] * *(const int64_t*)p[2];
  long cols = *(const int64_t*)p[2];
  double m = -INFINITY, s = 0;
  for (long c = 0; c < cols; ++c) m = x[c] > m ? x[c] : m;
  for (long c = 0; c < cols; ++c) s += exp((double)x[c] - m);
  for (long c = 0; c < cols; ++c) y[c] = (float)(exp((double)x[c] - m) / s);
}
)";

constexpr const char* kLaunchText =
    "entry=softmax_rows; grid=numel0 / size0_1,1,1; block=1,1,1; smem=0; args=input:0,output:0,size:size0_1:i64";

fs::path compile_kernel(const TempDir& t) {
  const fs::path src = t.path / "softmax.cc", so = t.path / "softmax.so";
  std::ofstream(src) << kSoftmaxKernel;
  const std::string cmd = "c++ -std=c++17 -O2 -shared -fPIC -I" KFORGE_SOURCE_DIR " -o " + quote(so.string()) + " " +
                          quote(src.string()) + " 2>" + quote((t.path / "cc.log").string());
  INFO(cmd << "\n" << slurp(t.path / "cc.log"));
  REQUIRE(std::system(cmd.c_str()) == 0);
  return so;
}

std::vector<std::string> cpu_args(const TempDir& t, const fs::path& so, const OpSignature& sig) {
  return {"--cache", (t.path / "cache").string(), "--signature", to_hex(sig.encode()), "--backend", "cpu",
          "--source", (t.path / "softmax.cc").string(), "--so", so.string(), "--entry", "softmax_rows",
          "--launch", kLaunchText, "--output", "like:0", "--torch-version", "2.11.0+cu130",
          "--compile-option", "-O2"};
}

}  // namespace

TEST_CASE("launch text parses into the plan's vocabulary", "[publish_test_entry]") {
  StatusOr<Launch> l = parse_launch(
      "entry=k; grid=ceil_div(numel0, 256), 2; block=256; smem=4 * size0_1;"
      "args=input:0,output:1,scratch:2,size:ceil_div(size0_1, 4):i32,size:numel0,scalar:1:f32,scalar:2:bool");
  REQUIRE(l.ok());
  CHECK(l->entry == "k");
  CHECK(l->grid == std::array<std::string, 3>{"ceil_div(numel0, 256)", "2", "1"});
  CHECK(l->block == std::array<std::string, 3>{"256", "1", "1"});
  CHECK(l->shared_mem_bytes == "4 * size0_1");
  CHECK(l->args == std::vector<ArgBinding>{ArgBinding::input(0), ArgBinding::output(1), ArgBinding::scratch(2),
                                           ArgBinding::size("ceil_div(size0_1, 4)", ValueType::kInt32),
                                           ArgBinding::size("numel0", ValueType::kInt64),
                                           ArgBinding::scalar(1, ValueType::kFloat32),
                                           ArgBinding::scalar(2, ValueType::kBool)});

  StatusOr<Launch> minimal = parse_launch("entry=k");
  REQUIRE(minimal.ok());
  CHECK(minimal->grid == std::array<std::string, 3>{"1", "1", "1"});
  CHECK(minimal->shared_mem_bytes == "0");
  CHECK(minimal->args.empty());
}

TEST_CASE("launch text that cannot mean a launch is rejected, naming the part", "[publish_test_entry]") {
  auto error = [](const char* text) {
    StatusOr<Launch> l = parse_launch(text);
    REQUIRE_FALSE(l.ok());
    return l.status().message();
  };
  CHECK_THAT(error("grid=1"), Catch::Contains("no entry=NAME"));
  CHECK_THAT(error("entry=k;gird=1"), Catch::Contains("unknown launch field 'gird'"));
  CHECK_THAT(error("entry=k;entry=j"), Catch::Contains("given twice"));
  CHECK_THAT(error("entry=k;grid=1,2,3,4"), Catch::Contains("1 to 3"));
  CHECK_THAT(error("entry=k;args=input:x"), Catch::Contains("argument 'input:x'"));
  CHECK_THAT(error("entry=k;args=tensor:0"), Catch::Contains("unknown kind 'tensor'"));
  CHECK_THAT(error("entry=k;args=size:numel0:f32"), Catch::Contains("i64 or i32"));
  CHECK_THAT(error("entry=k;args=scalar:1"), Catch::Contains("scalar:N:TYPE"));
  CHECK_THAT(error("entry=k;args=scalar:1:half"), Catch::Contains("unknown value type 'half'"));
}

TEST_CASE("output text parses into OutputSpec", "[publish_test_entry]") {
  CHECK(*parse_output("like:0") == OutputSpec::like(0));
  CHECK(*parse_output("like:1:float64") == OutputSpec::like(1, DType::kFloat64));
  CHECK(*parse_output("in_place:0") == OutputSpec::in_place(0));
  CHECK_FALSE(parse_output("in_place:0:float32").ok());
  CHECK(*parse_output("explicit:float32:numel0 / size0_1,size0_1:size0_1,1") ==
        OutputSpec::explicit_layout(DType::kFloat32, {"numel0 / size0_1", "size0_1"}, {"size0_1", "1"}));
  CHECK_FALSE(parse_output("like").ok());
  CHECK_FALSE(parse_output("like:0:float33").ok());
  CHECK_THAT(parse_output("explicit:float32:a,b:c").status().message(), Catch::Contains("2 sizes but 1 strides"));
  CHECK(*parse_scratch("tmp=4 * numel0") == ScratchBuffer{"tmp", "4 * numel0"});
}

TEST_CASE("the tool publishes a CPU entry that reads back intact and computes softmax", "[publish_test_entry]") {
  TempDir t{"kforge-publish-test"};
  const fs::path so = compile_kernel(t);
  const OpSignature sig = softmax_signature(8, 100);
  ToolRun run = run_tool(t, cpu_args(t, so, sig));
  INFO(run.err);
  REQUIRE(run.rc == 0);
  REQUIRE(run.out.size() == 33);   // 32 hex digits and a newline

  StatusOr<Store> store = Store::open((t.path / "cache").string());
  REQUIRE(store.ok());
  StatusOr<EntryKey> key = EntryKey::from_hex(run.out.substr(0, 32));
  REQUIRE(key.ok());
  StatusOr<StoredEntry> e = store->load(*key);
  REQUIRE(e.ok());
  CHECK(e->signature == sig);
  Environment env = cpu_host_environment("2.11.0+cu130");
  env.compiler = "c++ (kforge test)";
  CHECK(e->environment == env);
  CHECK(e->status.usable());
  CHECK(e->spec.backend == Backend::kCpu);
  CHECK(e->spec.language == SourceLanguage::kCpp);
  CHECK(e->spec.source == kSoftmaxKernel);
  CHECK(e->spec.entry_points == std::vector<std::string>{"softmax_rows"});
  CHECK(e->spec.compile_options == std::vector<std::string>{"-O2"});
  CHECK(e->spec.plan.outputs == std::vector<OutputSpec>{OutputSpec::like(0)});
  REQUIRE(e->spec.plan.launches.size() == 1);
  CHECK(e->spec.plan.launches[0] == *parse_launch(kLaunchText));
  CHECK(e->verification.passed);
  CHECK(e->provenance.proposer == "test:hand-written");
  REQUIRE(e->blobs.size() == 1);
  CHECK(e->blobs[0].name == "so");
  StatusOr<std::string> image = store->read_blob(e->blobs[0]);
  REQUIRE(image.ok());
  CHECK(*image == slurp(so));

  // The stored entry runs as the hook would run it: the blob's image, the stored plan.
  StatusOr<CpuModule> module = CpuModule::load_image(*image, "published");
  REQUIRE(module.ok());
  StatusOr<ResolvedLaunchPlan> plan = e->spec.resolve(e->signature);
  REQUIRE(plan.ok());
  std::vector<float> x(800), y(800, NAN);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 5);
  REQUIRE(run_cpu_plan(*module, e->spec, *plan, CpuBuffers{{x.data(), nullptr, nullptr}, {y.data()}, {}}).ok());
  for (size_t r = 0; r < 8; ++r) {
    double m = -INFINITY, s = 0;
    for (size_t c = 0; c < 100; ++c) m = std::max(m, static_cast<double>(x[r * 100 + c]));
    for (size_t c = 0; c < 100; ++c) s += std::exp(x[r * 100 + c] - m);
    for (size_t c = 0; c < 100; ++c) {
      INFO("row " << r << " col " << c);
      CHECK(y[r * 100 + c] == Approx(std::exp(x[r * 100 + c] - m) / s).epsilon(1e-6));
    }
  }
}

TEST_CASE("the tool refuses what the hook could never use, and publishes nothing", "[publish_test_entry]") {
  TempDir t{"kforge-publish-test"};
  const fs::path so = compile_kernel(t);
  const OpSignature sig = softmax_signature(8, 100);
  auto expect_failure = [&](std::vector<std::string> args, int rc, const std::string& message) {
    ToolRun run = run_tool(t, args);
    INFO(run.err);
    CHECK(run.rc == rc);
    CHECK_THAT(run.err, Catch::Contains(message));
    CHECK(run.out.empty());
  };
  std::vector<std::string> args = cpu_args(t, so, sig);

  SECTION("usage errors exit 2") {
    expect_failure({"--cache", "x"}, 2, "missing --signature --backend --source");
    std::vector<std::string> no_so = args;
    no_so.erase(no_so.begin() + 8, no_so.begin() + 10);
    expect_failure(no_so, 2, "missing --so");
    std::vector<std::string> bad_launch = args;
    bad_launch[13] = "entry=softmax_rows;args=weights:0";
    expect_failure(bad_launch, 2, "unknown kind 'weights'");
    std::vector<std::string> bad_hex = args;
    bad_hex[3] = "9x";
    expect_failure(bad_hex, 2, "'9x' at offset 0 is not hex");
  }
  SECTION("failed checks exit 1") {
    OpSignature cuda_sig = sig;
    cuda_sig.target = {Backend::kCuda, "sm_90"};
    std::get<TensorMeta>(cuda_sig.args[0].value).device = DeviceType::kCuda;   // a CUDA call's tensor
    std::vector<std::string> wrong_target = args;
    wrong_target[3] = to_hex(cuda_sig.encode());
    expect_failure(wrong_target, 1, "the signature is for backend cuda, not cpu");
    std::vector<std::string> wrong_entry = args;
    wrong_entry[11] = "softmax_cols";
    wrong_entry[13] = "entry=softmax_cols;grid=numel0 / size0_1;args=input:0,output:0,size:size0_1";
    expect_failure(wrong_entry, 1, "entry point 'softmax_cols' is not in");
    std::vector<std::string> unresolvable = args;
    unresolvable[13] = "entry=softmax_rows;grid=numel0 / size1_1;args=input:0,output:0,size:size0_1";
    expect_failure(unresolvable, 1, "does not resolve");
    std::vector<std::string> truncated = args;
    truncated[3] = truncated[3].substr(0, truncated[3].size() - 2);
    expect_failure(truncated, 1, "the signature does not decode");
    if (!CudaDriver::load().ok()) {
      std::vector<std::string> cuda = args;
      cuda[3] = to_hex(cuda_sig.encode());
      cuda[5] = "cuda";
      cuda.erase(cuda.begin() + 8, cuda.begin() + 10);   // no --so
      expect_failure(cuda, 1, "no usable CUDA driver");
    }
  }
  // Nothing was published by any failed run.
  if (fs::exists(t.path / "cache")) {
    StatusOr<Store> store = Store::open((t.path / "cache").string());
    REQUIRE(store.ok());
    CHECK(store->list()->empty());
  }
}

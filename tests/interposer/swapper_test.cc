// The torch-free parts of the hook's loader (interposer/hook/swapper.h, cuda_devices.h): which cache
// entries may run here (Note [Environment rule]), which blob of a CUDA entry is its machine code,
// and what the loader does with a CUDA entry it cannot place on any device. Loading on a real GPU,
// the hot path and graph capture are specified by tests/python/test_hook_swap_cuda.py (gpu).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/store.h"
#include "interposer/hook/cuda_devices.h"
#include "interposer/hook/replacement_table.h"
#include "interposer/hook/swapper.h"
#include "runtime/environment.h"
#include "runtime/wire.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using kforge::hook::CudaModules;
using kforge::hook::entry_environment_differences;
using kforge::hook::entry_environment_matches;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;

// What cuda_device_environment gives for a device (the hook's view: no NVRTC, so 0).
Environment device_env() {
  Environment e;
  e.backend = Backend::kCuda;
  e.arch = "sm_90";
  e.device_model = "NVIDIA H200";
  e.driver_version = 13000;
  e.nvrtc_version = 0;
  e.torch_version = "2.11.0+cu130";
  return e;
}

Environment cpu_env() {
  Environment e = cpu_host_environment("2.11.0+cu130");
  e.arch = "x86_64-avx2";
  e.device_model = "Test CPU";
  return e;
}

}  // namespace

TEST_CASE("Environment rule: a CPU entry fits whatever compiler built it, and nothing else may differ") {
  const Environment host = cpu_env();   // the hook cannot know a compiler: empty
  Environment entry = host;
  entry.compiler = "g++ 12.2.0";
  CHECK(entry_environment_matches(host, entry));
  CHECK(entry_environment_differences(host, entry).empty());

  Environment other_torch = entry;
  other_torch.torch_version = "2.10.0";
  CHECK_FALSE(entry_environment_matches(host, other_torch));
  CHECK(entry_environment_differences(host, other_torch) ==
        std::vector<std::string>{"torch_version: \"2.11.0+cu130\" != \"2.10.0\""});

  // nvrtc_version is ignored for CUDA only: on the CPU it must be what the CPU's is (0).
  Environment with_nvrtc = entry;
  with_nvrtc.nvrtc_version = 13000;
  CHECK_FALSE(entry_environment_matches(host, with_nvrtc));
}

TEST_CASE("Environment rule: a CUDA entry fits whatever NVRTC built it, and its other fields must equal the device's") {
  const Environment host = device_env();
  Environment entry = host;
  entry.nvrtc_version = 12080;   // as the worker (or kforge-publish-test-entry) records it
  CHECK(entry_environment_matches(host, entry));
  CHECK(entry_environment_differences(host, entry).empty());

  SECTION("another driver") {
    entry.driver_version = 12080;
    CHECK_FALSE(entry_environment_matches(host, entry));
    CHECK(entry_environment_differences(host, entry) == std::vector<std::string>{"driver_version: 13000 != 12080"});
  }
  SECTION("another GPU model of the same arch") {
    entry.device_model = "NVIDIA H100 80GB HBM3";
    CHECK(entry_environment_differences(host, entry) ==
          std::vector<std::string>{"device_model: \"NVIDIA H200\" != \"NVIDIA H100 80GB HBM3\""});
  }
  SECTION("another arch, torch or format") {
    entry.arch = "sm_80";
    entry.torch_version = "2.10.0";
    entry.format_version = kFormatVersion + 1;
    CHECK(entry_environment_differences(host, entry).size() == 3);
  }
  SECTION("a compiler is no CUDA field: it must be empty, as the device's is") {
    entry.compiler = "nvcc 13.0";
    CHECK_FALSE(entry_environment_matches(host, entry));
  }
  SECTION("a CPU entry never fits a CUDA device, whatever else it shares") {
    entry.backend = Backend::kCpu;
    CHECK_FALSE(entry_environment_matches(host, entry));
  }
}

TEST_CASE("cuda_entry_image: the cubin if there is one, else the PTX, NUL-terminated") {
  std::vector<std::string> read_names;
  auto read = [&](const BlobRef& b) -> StatusOr<std::string> {
    read_names.push_back(b.name);
    if (b.name == "cubin") return std::string("\x7f" "ELF-cubin", 10);
    if (b.name == "ptx") return std::string(".version 8.0\n.target sm_90\n");
    if (b.name == "ptx0") return std::string(".version 8.0\n\0", 14);
    return unavailable("blob missing");
  };
  auto ref = [](std::string name) { return BlobRef{std::move(name), std::string(64, 'a'), 1}; };

  SECTION("cubin wins over ptx, whatever the order") {
    StatusOr<std::string> image = hook::cuda_entry_image({ref("ptx"), ref("src.cu"), ref("cubin")}, read);
    REQUIRE(image.ok());
    CHECK(*image == std::string("\x7f" "ELF-cubin", 10));
    CHECK(read_names == std::vector<std::string>{"cubin"});   // only the chosen blob is read
  }
  SECTION("PTX without a NUL gets one: the driver reads PTX up to a NUL") {
    StatusOr<std::string> image = hook::cuda_entry_image({ref("ptx")}, read);
    REQUIRE(image.ok());
    CHECK(*image == std::string(".version 8.0\n.target sm_90\n") + '\0');
  }
  SECTION("no cubin and no ptx: an error that lists the blobs there are") {
    StatusOr<std::string> image = hook::cuda_entry_image({ref("so"), ref("src.cu")}, read);
    REQUIRE_FALSE(image.ok());
    CHECK(image.status().message() == "it has no blob named \"cubin\" or \"ptx\" (its blobs: \"so\", \"src.cu\")");
    CHECK(read_names.empty());
  }
  SECTION("a blob that cannot be read: the error names it") {
    auto failing = [](const BlobRef&) -> StatusOr<std::string> { return internal_error("sha256 mismatch"); };
    StatusOr<std::string> image = hook::cuda_entry_image({ref("cubin")}, failing);
    REQUIRE_FALSE(image.ok());
    CHECK(image.status().message() == "blob \"cubin\": sha256 mismatch");
  }
  SECTION("an empty cubin is refused") {
    auto empty = [](const BlobRef&) -> StatusOr<std::string> { return std::string(); };
    CHECK_FALSE(hook::cuda_entry_image({ref("cubin")}, empty).ok());
  }
}

TEST_CASE("ObserveSlots and ReplacementTable::serves: a table serves exactly the operators of its entries") {
  using kforge::hook::kObserveSlots;
  using kforge::hook::ObserveSlots;
  using kforge::hook::Replacement;
  using kforge::hook::ReplacementTable;
  ObserveSlots slots;
  const uint32_t add_cpu = slots.assign("aten::add", "Tensor", Backend::kCpu);
  const uint32_t add_cuda = slots.assign("aten::add", "Tensor", Backend::kCuda);
  const uint32_t gelu_cpu = slots.assign("aten::gelu", "", Backend::kCpu);
  CHECK(add_cpu == 0);
  CHECK(add_cuda == 1);
  CHECK(gelu_cpu == 2);
  hook::ObserveMask only_add_cuda;
  only_add_cuda.set(1);
  CHECK(slots.mask("aten::add", "Tensor", Backend::kCuda) == only_add_cuda);
  CHECK(slots.mask("aten::gelu", "", Backend::kCpu).has(2));
  CHECK_FALSE(slots.mask("aten::gelu", "", Backend::kCpu).has(1));
  // Not registered here: every slot, so its calls are all observed rather than wrongly skipped.
  CHECK(slots.mask("aten::silu", "", Backend::kCpu) == hook::ObserveMask::all());
  // Room for every catalog operator on both backends, and for at least 64 operators.
  CHECK(kObserveSlots >= 2 * catalog::kOperatorCount);
  CHECK(kObserveSlots >= 128);
  for (uint32_t i = 3; i < kObserveSlots; ++i) slots.assign("aten::op" + std::to_string(i), "", Backend::kCpu);
  CHECK(slots.assign("aten::one_too_many", "", Backend::kCpu) == kObserveSlots);
  CHECK(slots.mask("aten::op100", "", Backend::kCpu).has(100));   // a slot past the first 64

  // The hook never frees a table (a thread may still probe it); the test does.
  const std::unique_ptr<const ReplacementTable> empty(ReplacementTable::build({}, hook::ObserveMask::all()));
  CHECK_FALSE(empty->serves(add_cpu));
  CHECK(empty->serves(kObserveSlots));   // an operator without a slot: always observed
  static const Replacement r;
  const std::unique_ptr<const ReplacementTable> t(
      ReplacementTable::build({{SignatureId{1, 2}, &r}}, slots.mask("aten::add", "Tensor", Backend::kCuda)));
  const std::unique_ptr<const ReplacementTable> high(
      ReplacementTable::build({{SignatureId{3, 4}, &r}}, slots.mask("aten::op100", "", Backend::kCpu)));
  CHECK(high->serves(100));
  CHECK_FALSE(high->serves(99));
  CHECK(t->find(SignatureId{1, 2}) == &r);
  CHECK(t->serves(add_cuda));
  CHECK_FALSE(t->serves(add_cpu));
  CHECK_FALSE(t->serves(gelu_cpu));
}

TEST_CASE("CudaModules: a slot per device ordinal, empty until the loader fills it, none out of range") {
  CudaModules modules(nullptr);
  CHECK(modules.on_device(0) == nullptr);
  CHECK(modules.on_device(-1) == nullptr);
  CHECK(modules.on_device(CudaModules::kMaxDevices) == nullptr);
  static const hook::CudaDeviceModule on_one{nullptr, nullptr};
  modules.by_device[1].store(&on_one, std::memory_order_release);
  CHECK(modules.on_device(1) == &on_one);
  CHECK(modules.on_device(0) == nullptr);
}

// A CUDA entry for an arch no device here has (on a host without a driver: no device at all) is
// never loaded: no table slot, no stats entry, no trial marker; the process just observes.
TEST_CASE("Swapper: a CUDA entry no device here can run is not loaded and not marked for trial") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  TensorMeta t;
  t.dtype = DType::kFloat32;
  t.device = DeviceType::kCuda;
  t.sizes = {4, 8};
  t.strides = {8, 1};
  const OpSignature sig{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                        Target{Backend::kCuda, "sm_00"}};
  CacheEntry e;
  e.signature = sig;
  e.environment = device_env();
  e.environment.arch = "sm_00";
  e.environment.nvrtc_version = 13000;
  e.spec.backend = Backend::kCuda;
  e.spec.language = SourceLanguage::kCuda;
  e.spec.source = "extern \"C\" __global__ void k(const float* x, float* y) {}\n";
  e.spec.entry_points = {"k"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.grid = {"size0_0", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  e.spec.plan.launches = {l};
  e.blobs.push_back({"cubin", "not really a cubin"});
  {
    StatusOr<Store> store = Store::open(cache);
    REQUIRE(store.ok());
    REQUIRE(store->publish(e).ok());
  }

  hook::SwapperOptions options;
  options.mode = hook::HookMode::kActive;
  options.host_env = cpu_env();
  options.cache_root = cache;
  // Never destroyed, as in the hook; reachable from a static so leak checkers see it kept.
  // (The vector itself is never destroyed either: a static's destructor runs before the leak check.)
  static auto* keep = new std::vector<hook::Swapper*>();
  auto* swapper = new hook::Swapper(options);
  keep->push_back(swapper);
  swapper->on_round({std::make_shared<const OpSignature>(sig)});
  swapper->on_round({std::make_shared<const OpSignature>(sig)});   // a second round changes nothing

  const hook::SwapStats st = swapper->stats();
  CHECK(st.enabled);
  CHECK(st.cache_error.empty());
  CHECK(st.entries.empty());
  CHECK(hook::ReplacementTable::current()->find(sig.id()) == nullptr);
  const fs::path trial = fs::path(cache) / "trial";
  CHECK((!fs::exists(trial) || fs::is_empty(trial)));
}

namespace {

// Runs `f` with this process's stderr (fd 2, where log_line writes) going to a file; returns what
// was written.
template <class F>
std::string capture_stderr(const fs::path& file, F&& f) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  ::dup2(fd, 2);
  ::close(fd);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("Swapper: a corrupt cache entry is skipped with one line naming it, once per process") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  TensorMeta t;
  t.sizes = {4, 3};
  t.strides = {3, 1};
  const OpSignature sig{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                        Target{Backend::kCpu, cpu_env().arch}};
  CacheEntry e;
  e.signature = sig;
  e.environment = cpu_env();
  e.spec.backend = Backend::kCpu;
  e.spec.language = SourceLanguage::kCpp;
  e.spec.source = "extern \"C\" void k(const void*, void* const*) {}";
  e.spec.entry_points = {"k"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  e.spec.plan.launches = {l};
  e.blobs.push_back({"so", "not a shared object"});
  EntryKey key;
  {
    StatusOr<Store> store = Store::open(cache);
    REQUIRE(store.ok());
    StatusOr<EntryKey> k = store->publish(e);
    REQUIRE(k.ok());
    key = *k;
  }
  // Truncate its manifest, as a full disk or an attacker would.
  const fs::path manifest = fs::path(cache) / "manifests" / key.hex().substr(0, 2) / (key.hex() + ".kfm");
  REQUIRE(fs::exists(manifest));
  fs::resize_file(manifest, 40);

  hook::SwapperOptions options;
  options.mode = hook::HookMode::kActive;
  options.host_env = cpu_env();
  options.cache_root = cache;
  static auto* keep = new std::vector<hook::Swapper*>();
  auto* swapper = new hook::Swapper(options);
  keep->push_back(swapper);
  const std::string log = capture_stderr(dir.path / "stderr.txt", [&] {
    swapper->on_round({std::make_shared<const OpSignature>(sig)});
    TensorMeta t2 = t;
    t2.sizes = {8, 3};
    const OpSignature other{sig.op, "", {Arg::tensor(t2), Arg::integer(-1), Arg::boolean(false)}, sig.target};
    swapper->on_round({std::make_shared<const OpSignature>(other)});   // another look at the cache: no second line
  });
  size_t lines = 0;
  for (size_t pos = log.find("cache entry " + key.hex() + " skipped: "); pos != std::string::npos;
       pos = log.find("cache entry " + key.hex() + " skipped: ", pos + 1)) {
    ++lines;
  }
  CHECK(lines == 1);
  CHECK_THAT(log, Catch::Contains("kforge cache verify names every bad file"));
  CHECK(swapper->stats().entries.empty());
  CHECK(hook::ReplacementTable::current()->find(sig.id()) == nullptr);
}

// ---- Note [Swap states]: observe -> shadow -> active | disabled, with real CPU entries ----------
// Each case publishes an entry whose .so is compiled here (an empty kernel: the state machine never
// runs it; the loader dlopens it and resolves its entry point exactly as in a serving process), and
// drives one Swapper the way the hook does: on_round from the reporter thread, shadow_clean and
// fail from calling threads, on_daemon_message from the client thread.

namespace {

// A shared object exporting `k` with the CPU kernel ABI's signature, compiled by the host's C++
// compiler (the one that built this test).
std::string empty_cpu_kernel_so(const fs::path& dir) {
  const fs::path src = dir / "k.cc";
  const fs::path so = dir / "k.so";
  {
    std::ofstream out(src);
    out << "struct kforge_cpu_block;\nextern \"C\" void k(const kforge_cpu_block*, void* const*) {}\n";
  }
  const std::string cmd = "c++ -shared -fPIC -O1 -o '" + so.string() + "' '" + src.string() + "' 2>'" +
                          (dir / "cc.log").string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(so, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

OpSignature cpu_softmax(int64_t rows) {
  TensorMeta t;
  t.sizes = {rows, 16};
  t.strides = {16, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                     Target{Backend::kCpu, cpu_env().arch}};
}

// A CPU entry's environment: the host's, with the compiler that built it.
Environment built_env() {
  Environment e = cpu_env();
  e.compiler = "c++";
  return e;
}

// Publishes a CPU entry for `sig` (`variant` makes distinct entries) and returns its key.
EntryKey publish_cpu_entry(const std::string& cache, const OpSignature& sig, const std::string& so,
                           const std::string& variant = "v1") {
  CacheEntry e;
  e.signature = sig;
  e.environment = built_env();
  e.spec.backend = Backend::kCpu;
  e.spec.language = SourceLanguage::kCpp;
  e.spec.source = "/* " + variant + " */ extern \"C\" void k(const void*, void* const*) {}";
  e.spec.entry_points = {"k"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  e.spec.plan.launches = {l};
  e.blobs.push_back({"so", so});
  StatusOr<Store> store = Store::open(cache);
  REQUIRE(store.ok());
  StatusOr<EntryKey> key = store->publish(e);
  REQUIRE(key.ok());
  return *key;
}

// confirm_win off unless a case tests Note [In-process win]: the state machine's cases time nothing.
// No timing phase unless a case tests Note [Timing phase]: the win is judged on the shadow calls.
hook::Swapper* new_swapper(const std::string& cache, hook::HookMode mode, uint32_t shadow_calls,
                           bool confirm_win = false, uint32_t timing_pairs = 0) {
  hook::SwapperOptions options;
  options.mode = mode;
  options.shadow_calls = shadow_calls;
  options.confirm_win = confirm_win;
  options.timing_pairs = timing_pairs;
  options.host_env = cpu_env();
  options.cache_root = cache;
  static auto* keep = new std::vector<hook::Swapper*>();   // never destroyed, as in the hook
  auto* s = new hook::Swapper(options);
  keep->push_back(s);
  return s;
}

const hook::Replacement* in_table(const OpSignature& sig) { return hook::ReplacementTable::current()->find(sig.id()); }

std::optional<hook::SwapStats::Entry> stats_of(const hook::Swapper& s, const OpSignature& sig) {
  for (const hook::SwapStats::Entry& e : s.stats().entries) {
    if (e.id == sig.id()) return e;
  }
  return std::nullopt;
}

std::vector<int32_t> marker_pids(const std::string& cache, const EntryKey& key) {
  StatusOr<Store> store = Store::open(cache);
  REQUIRE(store.ok());
  StatusOr<std::vector<Store::TrialMarker>> markers = store->trial_markers();
  REQUIRE(markers.ok());
  std::vector<int32_t> pids;
  for (const Store::TrialMarker& m : *markers) {
    if (m.key == key) pids.push_back(m.pid);
  }
  return pids;
}

EntryStatus cache_status(const std::string& cache, const EntryKey& key) {
  StatusOr<Store> store = Store::open(cache);
  REQUIRE(store.ok());
  StatusOr<StoredEntry> e = store->load(key);
  REQUIRE(e.ok());
  return e->status;
}

// The pid of a process that has exited (and been reaped).
int32_t dead_pid() {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return static_cast<int32_t>(child);
}

}  // namespace

TEST_CASE("Swap states (active mode): a found entry is shadowed, marked for trial, then active after its clean calls") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(101);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 3);

  s->on_round({std::make_shared<const OpSignature>(sig)});
  const hook::Replacement* r = in_table(sig);
  REQUIRE(r != nullptr);
  CHECK(r->state == hook::SwapState::kShadow);
  CHECK(r->key == key);
  CHECK(r->shadow_target == 3);
  REQUIRE(stats_of(*s, sig).has_value());
  CHECK(stats_of(*s, sig)->state == "shadow");
  // Note [Trial marker]: written before the first replacement call, with this process's pid.
  CHECK(marker_pids(cache, key) == std::vector<int32_t>{static_cast<int32_t>(::getpid())});

  s->shadow_clean(*r, 0, 0);
  s->shadow_clean(*r, 0, 0);
  CHECK(in_table(sig)->state == hook::SwapState::kShadow);   // 2 of 3: still on trial
  s->shadow_clean(*r, 0, 0);
  REQUIRE(in_table(sig) != nullptr);
  CHECK(in_table(sig)->state == hook::SwapState::kActive);
  CHECK(stats_of(*s, sig)->state == "active");
  s->shadow_clean(*r, 0, 0);   // a late call on the old shadow replacement changes nothing
  CHECK(in_table(sig)->state == hook::SwapState::kActive);
  // The passed trial's marker goes on the next round (the reporter thread does the I/O).
  CHECK(marker_pids(cache, key).size() == 1);
  s->on_round({});
  CHECK(marker_pids(cache, key).empty());
  CHECK(cache_status(cache, key).state == EntryState::kActive);
}

TEST_CASE("Swap states (shadow mode): a passed trial keeps shadowing, and its marker is removed") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(102);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kShadow, 2);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  const hook::Replacement* r = in_table(sig);
  REQUIRE(r != nullptr);
  CHECK_FALSE(r->activate_after_shadow);
  for (int i = 0; i < 5; ++i) s->shadow_clean(*r, 0, 0);
  CHECK(in_table(sig) == r);   // the same shadow replacement: no new table was needed
  CHECK(stats_of(*s, sig)->state == "shadow");
  s->on_round({});
  CHECK(marker_pids(cache, key).empty());
}

TEST_CASE("Swap states: a failed comparison disables the entry at once and quarantines it on the next round") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(103);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 5);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  const hook::Replacement* r = in_table(sig);
  REQUIRE(r != nullptr);
  s->shadow_clean(*r, 0, 0);

  s->fail(*r, "output 0 element [0, 0]: 0.5 vs 0.25");
  CHECK(in_table(sig) == nullptr);   // PyTorch's kernel runs from the next call on
  CHECK(stats_of(*s, sig)->state == "disabled");
  CHECK(stats_of(*s, sig)->reason == "output 0 element [0, 0]: 0.5 vs 0.25");
  s->fail(*r, "a second failure");   // already disabled: nothing changes
  CHECK(stats_of(*s, sig)->reason == "output 0 element [0, 0]: 0.5 vs 0.25");
  CHECK(cache_status(cache, key).state == EntryState::kActive);   // no I/O on the calling thread

  const std::string log = capture_stderr(dir.path / "stderr.txt", [&] { s->on_round({}); });
  const EntryStatus st = cache_status(cache, key);
  CHECK(st.state == EntryState::kQuarantined);
  CHECK(st.reason == "output 0 element [0, 0]: 0.5 vs 0.25");
  CHECK(marker_pids(cache, key).empty());
  CHECK(s->stats().quarantined == 1);
  CHECK_THAT(log, Catch::Contains("entry " + key.hex()) && Catch::Contains("quarantined in the cache"));
  // A quarantined entry is never found again, by this process or another.
  hook::Swapper* next = new_swapper(cache, hook::HookMode::kActive, 5);
  next->on_round({std::make_shared<const OpSignature>(sig)});
  CHECK(in_table(sig) == nullptr);
}

TEST_CASE("Note [Trial marker]: the entry of a process that died during its trial is quarantined, not loaded") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(104);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  const int32_t gone = dead_pid();
  {
    StatusOr<Store> store = Store::open(cache);
    REQUIRE(store.ok());
    REQUIRE(store->write_trial_marker(key, gone).ok());
  }
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 5);
  const std::string log = capture_stderr(dir.path / "stderr.txt", [&] {
    s->on_round({std::make_shared<const OpSignature>(sig)});
  });
  CHECK(in_table(sig) == nullptr);
  CHECK(s->stats().markers_quarantined == 1);
  const EntryStatus st = cache_status(cache, key);
  CHECK(st.state == EntryState::kQuarantined);
  CHECK(st.reason == "process died during trial");
  CHECK(marker_pids(cache, key).empty());
  CHECK_THAT(log, Catch::Contains("(pid " + std::to_string(gone) + ") died during its trial"));
}

TEST_CASE("Note [Trial marker]: a live process's marker is left alone, and its entry is still used") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(105);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  const int32_t parent = static_cast<int32_t>(::getppid());   // alive while this test runs
  {
    StatusOr<Store> store = Store::open(cache);
    REQUIRE(store.ok());
    REQUIRE(store->write_trial_marker(key, parent).ok());
  }
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 5);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  CHECK(s->stats().markers_quarantined == 0);
  CHECK(cache_status(cache, key).state == EntryState::kActive);
  REQUIRE(in_table(sig) != nullptr);
  // The marker is now this process's (its own trial): one file per entry.
  CHECK(marker_pids(cache, key) == std::vector<int32_t>{static_cast<int32_t>(::getpid())});
}

TEST_CASE("Note [Daemon notices]: Revoke disables the entry in use without touching the cache, and KernelReady brings in the next one") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(106);
  const std::string so = empty_cpu_kernel_so(dir.path);
  const EntryKey first = publish_cpu_entry(cache, sig, so, "first");
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 5);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  REQUIRE(in_table(sig) != nullptr);
  REQUIRE(in_table(sig)->key == first);

  // A notice for another entry of the signature, or for a signature this process never saw: ignored.
  s->on_daemon_message(wire::Revoke{sig.id(), std::string(32, 'a'), "not this one"});
  s->on_daemon_message(wire::Revoke{cpu_softmax(999).id(), first.hex(), "not this signature"});
  s->on_round({});
  REQUIRE(in_table(sig) != nullptr);
  CHECK(s->stats().notices == 2);

  s->on_daemon_message(wire::Revoke{sig.id(), first.hex(), "replaced by a faster kernel"});
  CHECK(in_table(sig) != nullptr);   // queued: the next round acts on it
  s->on_round({});
  CHECK(in_table(sig) == nullptr);
  CHECK(stats_of(*s, sig)->state == "disabled");
  CHECK(stats_of(*s, sig)->reason == "revoked by the daemon: replaced by a faster kernel");
  CHECK(cache_status(cache, first).state == EntryState::kActive);   // the cache is the daemon's to change
  CHECK(marker_pids(cache, first).empty());

  // The daemon publishes a better kernel (the same key: one entry per signature and environment,
  // its manifest replaced) and says so: KernelReady loads the new content, on trial again.
  const EntryKey second = publish_cpu_entry(cache, sig, so, "second");
  REQUIRE(second == first);
  s->on_daemon_message(wire::KernelReady{sig.id(), built_env().key(), second.hex(), 1.5});
  s->on_round({});
  const hook::Replacement* r = in_table(sig);
  REQUIRE(r != nullptr);
  CHECK_THAT(r->spec->source, Catch::StartsWith("/* second */"));
  CHECK(r->state == hook::SwapState::kShadow);
  CHECK(marker_pids(cache, second) == std::vector<int32_t>{static_cast<int32_t>(::getpid())});
}

TEST_CASE("Note [In-process win]: active only for a win of 3% in the medians that holds in 2/3 of the calls") {
  using V = std::vector<uint64_t>;
  // 10% faster in every call: a win, with both medians.
  hook::WinVerdict v = hook::judge_in_process_win(V{100, 100, 100}, V{90, 90, 90});
  CHECK(v.win);
  CHECK(v.pytorch_median_ns == 100);
  CHECK(v.entry_median_ns == 90);
  CHECK(v.entry_faster == 3);
  // 2% faster: within noise, no win.
  CHECK_FALSE(hook::judge_in_process_win(V{100, 100, 100}, V{98, 98, 98}).win);
  // A faster median carried by a few calls: faster in only 1 of 3, no win.
  CHECK_FALSE(hook::judge_in_process_win(V{100, 100, 100}, V{10, 101, 101}).win);
  // Slower: no win. Nothing timed: no win shown.
  CHECK_FALSE(hook::judge_in_process_win(V{100, 100}, V{200, 200}).win);
  CHECK_FALSE(hook::judge_in_process_win(V{}, V{}).win);
  // Even counts: the median is the mean of the middle two.
  CHECK(hook::judge_in_process_win(V{100, 200, 300, 400}, V{1, 1, 1, 1}).pytorch_median_ns == 250);
}

TEST_CASE("Note [Upgrade pays]: an upgrade takes over only at a speedup in this process at least the version in use's") {
  using V = std::vector<uint64_t>;
  const hook::WinVerdict in_use = hook::judge_in_process_win(V{100, 100, 100}, V{50, 50, 50});      // 2x
  const hook::WinVerdict better = hook::judge_in_process_win(V{120, 120, 120}, V{40, 40, 40});      // 3x
  const hook::WinVerdict flattered = hook::judge_in_process_win(V{100, 100, 100}, V{80, 80, 80});   // 1.25x
  CHECK(hook::in_process_speedup(in_use) == Approx(2.0));
  CHECK(hook::upgrade_pays(better, in_use));
  CHECK(hook::upgrade_pays(in_use, in_use));   // a tie keeps the upgrade: nothing shows it slower
  // A win against PyTorch's kernel is not enough: slower than the version in use.
  CHECK(flattered.win);
  CHECK_FALSE(hook::upgrade_pays(flattered, in_use));
  // Speedups, not medians: PyTorch's kernel ran slower during the upgrade's trial (other work on the
  // machine), and the upgrade's slower median is still the better kernel.
  const hook::WinVerdict loaded = hook::judge_in_process_win(V{300, 300, 300}, V{60, 60, 60});      // 5x
  CHECK(hook::upgrade_pays(loaded, in_use));
  // Nothing to compare (a trial that timed nothing, KFORGE_CONFIRM_WIN off): the upgrade takes over.
  CHECK(hook::in_process_speedup(hook::WinVerdict{}) == 0);
  CHECK(hook::upgrade_pays(flattered, hook::WinVerdict{}));
  CHECK(hook::upgrade_pays(hook::WinVerdict{}, in_use));
}

TEST_CASE("Note [In-process win]: a clean but slower trial ends in no_win, out of the table, not quarantined") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(107);
  const EntryKey key = publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 3, /*confirm_win=*/true);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  const hook::Replacement* r = in_table(sig);
  REQUIRE(r != nullptr);
  for (int i = 0; i < 3; ++i) s->shadow_clean(*r, 1000, 1500);
  CHECK(in_table(sig) == nullptr);   // PyTorch's kernel, no more shadow calls
  REQUIRE(stats_of(*s, sig).has_value());
  CHECK(stats_of(*s, sig)->state == "no_win");
  CHECK(stats_of(*s, sig)->pytorch_median_ns == 1000);
  CHECK(stats_of(*s, sig)->entry_median_ns == 1500);
  const std::string log = capture_stderr(dir.path / "stderr.txt", [&] { s->on_round({}); });
  CHECK_THAT(log, Catch::Contains("is correct but not faster in this process"));
  CHECK(cache_status(cache, key).state == EntryState::kActive);
  CHECK(marker_pids(cache, key).empty());
  StatusOr<Store> store = Store::open(cache);
  REQUIRE(store.ok());
  StatusOr<std::vector<Store::NoWinRecord>> records = store->no_win_records(key);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 1);
  CHECK((*records)[0].pid == static_cast<int32_t>(::getpid()));
  CHECK((*records)[0].entry_ns == 1500);
  CHECK((*records)[0].pytorch_ns == 1000);
  // A KernelReady for the same kernel does not bring it back in this process.
  s->on_daemon_message(wire::KernelReady{sig.id(), built_env().key(), key.hex(), 1.5});
  s->on_round({});
  CHECK(in_table(sig) == nullptr);
}

TEST_CASE("Note [Timing phase]: alternating turns, PyTorch's kernel first in even pairs") {
  const bool want[] = {false, true, true, false, false, true, true, false};
  for (uint64_t k = 0; k < 8; ++k) CHECK(hook::timing_turn_is_entry(k) == want[k]);
}

TEST_CASE("Note [Timing phase]: a CPU entry's win is judged on calls timed alone after its shadow calls") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature slow = cpu_softmax(109), fast = cpu_softmax(111);
  const std::string so = empty_cpu_kernel_so(dir.path);
  publish_cpu_entry(cache, slow, so);
  publish_cpu_entry(cache, fast, so);
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 3, /*confirm_win=*/true, /*timing_pairs=*/4);
  s->on_round({std::make_shared<const OpSignature>(slow), std::make_shared<const OpSignature>(fast)});
  for (const OpSignature* sig : {&slow, &fast}) {
    const hook::Replacement* r = in_table(*sig);
    REQUIRE(r != nullptr);
    CHECK(r->timing_pairs == 4);
    // The shadow calls' times (the entry 10x faster) are not what is judged.
    for (int i = 0; i < 3; ++i) s->shadow_clean(*r, 1000, 100);
    const hook::Replacement* t = in_table(*sig);
    REQUIRE(t != nullptr);
    CHECK(t->state == hook::SwapState::kTiming);
    CHECK(stats_of(*s, *sig)->state == "shadow");   // still on trial
    CHECK(stats_of(*s, *sig)->timed_calls == 0);
  }
  // slow: PyTorch's turns 1000 ns, the entry's 1500 ns; fast: the entry's 800 ns.
  for (const auto& [sig, entry_ns] : {std::pair{&slow, uint64_t{1500}}, std::pair{&fast, uint64_t{800}}}) {
    const hook::Replacement* t = in_table(*sig);
    for (uint64_t k = 0; k < 8; ++k) {
      CHECK(in_table(*sig) == t);   // the phase lasts 2 x 4 calls
      t->counters->timing_calls.fetch_add(1);
      s->timing_call(*t, k, hook::timing_turn_is_entry(k) ? entry_ns : 1000);
    }
    REQUIRE(stats_of(*s, *sig).has_value());
    CHECK(stats_of(*s, *sig)->pytorch_median_ns == 1000);
    CHECK(stats_of(*s, *sig)->entry_median_ns == entry_ns);
    CHECK(stats_of(*s, *sig)->timed_calls == 4);
    CHECK(stats_of(*s, *sig)->timing_calls == 8);
    // A late call from the phase's table changes nothing.
    s->timing_call(*t, 8, 1);
    CHECK(stats_of(*s, *sig)->entry_median_ns == entry_ns);
  }
  CHECK(stats_of(*s, slow)->state == "no_win");
  CHECK(in_table(slow) == nullptr);
  CHECK(stats_of(*s, fast)->state == "active");
  REQUIRE(in_table(fast) != nullptr);
  CHECK(in_table(fast)->state == hook::SwapState::kActive);
  s->on_round({});
}

TEST_CASE("Note [Timing phase]: a call that threw counts, so the phase still ends, and its pair is not judged") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(115);
  publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 1, /*confirm_win=*/true, /*timing_pairs=*/3);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  s->shadow_clean(*in_table(sig), 1000, 1000);
  const hook::Replacement* t = in_table(sig);
  REQUIRE(t != nullptr);
  REQUIRE(t->state == hook::SwapState::kTiming);
  for (uint64_t k = 0; k < 6; ++k) {
    t->counters->timing_calls.fetch_add(1);
    // Call 0 (PyTorch's turn of pair 0) threw: untimed.
    s->timing_call(*t, k, k == 0 ? 0 : hook::timing_turn_is_entry(k) ? 500 : 1000);
  }
  REQUIRE(stats_of(*s, sig).has_value());
  CHECK(stats_of(*s, sig)->state == "active");
  CHECK(stats_of(*s, sig)->timed_calls == 2);   // pairs 1 and 2
  CHECK(stats_of(*s, sig)->entry_median_ns == 500);
}

TEST_CASE("Note [Timing phase]: none for shadow mode, nor with confirm_win off") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(113);
  publish_cpu_entry(cache, sig, empty_cpu_kernel_so(dir.path));
  SECTION("shadow mode keeps shadowing and judges the shadow calls") {
    hook::Swapper* s = new_swapper(cache, hook::HookMode::kShadow, 2, /*confirm_win=*/true, /*timing_pairs=*/4);
    s->on_round({std::make_shared<const OpSignature>(sig)});
    const hook::Replacement* r = in_table(sig);
    REQUIRE(r != nullptr);
    for (int i = 0; i < 2; ++i) s->shadow_clean(*r, 1000, 500);
    REQUIRE(in_table(sig) != nullptr);
    CHECK(in_table(sig)->state == hook::SwapState::kShadow);
    CHECK(stats_of(*s, sig)->entry_median_ns == 500);
  }
  SECTION("confirm_win off: active after the shadow calls") {
    hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 2, /*confirm_win=*/false, /*timing_pairs=*/4);
    s->on_round({std::make_shared<const OpSignature>(sig)});
    const hook::Replacement* r = in_table(sig);
    REQUIRE(r != nullptr);
    CHECK(r->timing_pairs == 0);
    for (int i = 0; i < 2; ++i) s->shadow_clean(*r, 1000, 1500);
    REQUIRE(in_table(sig) != nullptr);
    CHECK(in_table(sig)->state == hook::SwapState::kActive);
  }
}

namespace {
// A second entry for the signature: another compiler is another environment, so another key.
EntryKey publish_cpu_entry_with(const std::string& cache, const OpSignature& sig, const std::string& so,
                                const std::string& compiler, double speedup) {
  CacheEntry e;
  e.signature = sig;
  e.environment = built_env();
  e.environment.compiler = compiler;
  e.spec.backend = Backend::kCpu;
  e.spec.language = SourceLanguage::kCpp;
  e.spec.source = "/* " + compiler + " */ extern \"C\" void k(const void*, void* const*) {}";
  e.spec.entry_points = {"k"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  e.spec.plan.launches = {l};
  e.blobs.push_back({"so", so});
  e.timings.baseline_ns = speedup * 1000;
  e.timings.candidate_ns = 1000;
  StatusOr<Store> store = Store::open(cache);
  REQUIRE(store.ok());
  StatusOr<EntryKey> key = store->publish(e);
  REQUIRE(key.ok());
  return *key;
}
}  // namespace

TEST_CASE("Note [Daemon notices]: a better entry is trialled beside the one in use and takes its place, a failed one gives it back") {
  TempDir dir{"kforge-swapper-test"};
  const std::string cache = (dir.path / "cache").string();
  const OpSignature sig = cpu_softmax(108);
  const std::string so = empty_cpu_kernel_so(dir.path);
  const EntryKey a = publish_cpu_entry_with(cache, sig, so, "c++ a", 1.2);
  hook::Swapper* s = new_swapper(cache, hook::HookMode::kActive, 2);
  s->on_round({std::make_shared<const OpSignature>(sig)});
  const hook::Replacement* ra = in_table(sig);
  REQUIRE(ra != nullptr);
  s->shadow_clean(*ra, 0, 0);
  s->shadow_clean(*ra, 0, 0);
  const hook::Replacement* a_active = in_table(sig);
  REQUIRE(a_active != nullptr);
  CHECK(a_active->state == hook::SwapState::kActive);

  // B fails its comparison: quarantined, and A goes back to active.
  const EntryKey b = publish_cpu_entry_with(cache, sig, so, "c++ b", 2.0);
  s->on_daemon_message(wire::KernelReady{sig.id(), built_env().key(), b.hex(), 2.0});
  s->on_round({});
  const hook::Replacement* rb = in_table(sig);
  REQUIRE(rb != nullptr);
  CHECK(rb->key == b);
  CHECK(rb->state == hook::SwapState::kShadow);
  CHECK(stats_of(*s, sig)->previous_key == a.hex());
  s->fail(*rb, "output 0: wrong");
  CHECK(in_table(sig) == a_active);
  CHECK(stats_of(*s, sig)->state == "active");
  s->on_round({});
  CHECK(cache_status(cache, b).state == EntryState::kQuarantined);

  // C is worse than A: not taken. D is better and passes: it replaces A.
  const EntryKey c = publish_cpu_entry_with(cache, sig, so, "c++ c", 1.1);
  s->on_daemon_message(wire::KernelReady{sig.id(), built_env().key(), c.hex(), 1.1});
  s->on_round({});
  CHECK(in_table(sig) == a_active);
  const EntryKey d = publish_cpu_entry_with(cache, sig, so, "c++ d", 3.0);
  s->on_daemon_message(wire::KernelReady{sig.id(), built_env().key(), d.hex(), 3.0});
  s->on_round({});
  const hook::Replacement* rd = in_table(sig);
  REQUIRE(rd != nullptr);
  REQUIRE(rd->key == d);
  s->shadow_clean(*rd, 0, 0);
  s->shadow_clean(*rd, 0, 0);
  REQUIRE(in_table(sig) != nullptr);
  CHECK(in_table(sig)->key == d);
  CHECK(in_table(sig)->state == hook::SwapState::kActive);
  CHECK(stats_of(*s, sig)->previous_key.empty());
  CHECK(s->stats().upgrades == 1);
  s->fail(*a_active, "a late failure of the retired entry");   // changes nothing
  CHECK(in_table(sig)->key == d);

  // `kforge cache disable D`: the next round takes it out.
  {
    StatusOr<Store> store = Store::open(cache);
    REQUIRE(store.ok());
    REQUIRE(store->set_state(d, EntryState::kDisabled, "disabled by user").ok());
  }
  const std::string log = capture_stderr(dir.path / "stderr.txt", [&] { s->on_round({}); });
  CHECK(in_table(sig) == nullptr);
  CHECK(stats_of(*s, sig)->state == "disabled");
  CHECK(s->stats().revoked_in_cache == 1);
  CHECK_THAT(log, Catch::Contains("entry " + d.hex() + " for ") &&
                      Catch::Contains("disabled in the cache: PyTorch's kernel runs"));
}

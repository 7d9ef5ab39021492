// libkforge_hook-torch<major.minor>.so: load-time start-up and the C entry points.
//
// The shim (or ctypes, in tests) loads this library into a process where torch is already loaded;
// its constructor parses KFORGE_*, starts the recorder's reporter thread and registers the
// interceptors. Nothing here throws out of the library or exits the process: a failure logs one
// line and leaves PyTorch's kernels in place.
//
// C entry points (for tests and tools, through ctypes/dlsym):
//   const char* kforge_hook_stats_json(void);   counts per signature (with its swap state: observe,
//                                                shadow, active, no_win, disabled, and shadow/active/
//                                                fallback counters, the trial's medians
//                                                pytorch_median_ns/entry_median_ns, the entry
//                                                kept aside during an upgrade; for an entry also its backend,
//                                                the CUDA devices it is loaded on and the CUDA
//                                                counters unloaded_device_calls and
//                                                capture_shadow_skips), reports, registrations,
//                                                "gpus_in_use" (the UUIDs the last report round
//                                                found), and "swap": the loader's cache and entries
//   int kforge_hook_report_now(int timeout_ms);  asks the reporter for a report now and, with
//                                                timeout_ms > 0, waits until it was built and
//                                                offered; 1 if it was, else 0

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cache/cache_dir.h"
#include "interposer/hook/config.h"
#include "interposer/hook/cuda_devices.h"
#include "interposer/hook/cuda_timer.h"
#include "interposer/hook/input_sampler.h"
#include "interposer/hook/interceptor.h"
#include "interposer/hook/log.h"
#include "interposer/hook/recorder.h"
#include "interposer/hook/swapper.h"
#include "interposer/hook/target_arch.h"
#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "runtime/version.h"

#ifndef KFORGE_TORCH_VERSION_STRING
#error "KFORGE_TORCH_VERSION_STRING must be defined by the build (torch.__version__ at configure time)"
#endif

namespace kforge::hook {
namespace {

struct Hook {
  HookConfig config;
  Recorder* recorder = nullptr;
  Swapper* swapper = nullptr;
  TargetArch* arch = nullptr;
  InputSampler* sampler = nullptr;
  CudaTimer* timer = nullptr;
  ActiveGpus* gpus = nullptr;
  RegistrationSummary registration;
};

// Set once by the constructor; never freed (intercepted calls may come until the process ends).
std::atomic<const Hook*> g_hook{nullptr};

std::string process_name() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string argv0;
  std::getline(in, argv0, '\0');
  const size_t slash = argv0.rfind('/');
  return slash == std::string::npos ? argv0 : argv0.substr(slash + 1);
}

// Devices for Hello: the CPU always; CUDA devices (with their UUIDs) only when the driver is
// already in the process (torch has used CUDA) and not inherited through fork: the rule
// ActiveGpus::may_use_driver() keeps for the reports too. Loading the driver here would initialize
// CUDA in processes that never use it, and a process that forks after cuInit cannot use CUDA in
// the child.
std::vector<wire::DeviceInfo> devices(const Environment& cpu, ActiveGpus& gpus) {
  std::vector<wire::DeviceInfo> out;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  out.push_back(wire::DeviceInfo{0, Backend::kCpu, cpu.arch, cpu.device_model,
                                 pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0,
                                 ""});
  if (!gpus.may_use_driver()) return out;
  StatusOr<const CudaDriver*> driver = CudaDriver::load();
  if (!driver.ok()) return out;
  const CudaDriver& cu = **driver;
  int count = 0;
  if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS) return out;
  for (int i = 0; i < count && i < static_cast<int>(wire::kMaxDevices) - 1; ++i) {
    CUdevice dev = 0;
    int major = 0;
    int minor = 0;
    char name[256] = {};
    if (cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
        cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS ||
        cu.cuDeviceGetName(name, sizeof name - 1, dev) != CUDA_SUCCESS) {
      continue;
    }
    StatusOr<std::string> uuid = device_uuid(cu, dev);
    out.push_back(wire::DeviceInfo{i, Backend::kCuda, "sm_" + std::to_string(major) + std::to_string(minor),
                                   name, 0, uuid.ok() ? *uuid : std::string()});
  }
  return out;
}

void start() noexcept {
  try {
    auto* hook = new Hook();
    hook->config = parse_config(process_env());
    const HookConfig& config = hook->config;
    for (const std::string& w : config.warnings) log_line(w);
    if (config.log) {
      log_line("hook " KFORGE_VERSION_STRING " for torch " KFORGE_TORCH_VERSION_STRING " in pid " +
               std::to_string(::getpid()) + ": " + config.to_string());
    }

    const Environment cpu = cpu_host_environment(KFORGE_TORCH_VERSION_STRING);
    hook->arch = new TargetArch(cpu.arch);

    RecorderOptions options;
    options.endpoint = config.daemon_endpoint;
    options.curve_server_key = config.daemon_server_key;
    options.sample_rate = config.sample_rate;
    options.report_interval_ms = config.report_interval_ms;
    options.hello.kforge_version = KFORGE_VERSION_STRING;
    options.hello.torch_version = KFORGE_TORCH_VERSION_STRING;
    options.hello.process_name = process_name().substr(0, wire::kMaxStringBytes);
    StatusOr<CacheDir::Resolved> cache = CacheDir::resolve_path(process_env());
    if (cache.ok() && cache->path.size() <= wire::kMaxPathBytes) options.hello.cache_dir = cache->path;
    hook->gpus = new ActiveGpus();
    ActiveGpus* gpus = hook->gpus;
    options.hello.devices = devices(cpu, *gpus);

    // The loader runs on the reporter thread (swapper.h); observe mode never opens the cache.
    SwapperOptions swap;
    swap.mode = config.mode;
    swap.shadow_calls = config.shadow_calls;
    swap.confirm_win = config.confirm_win;
    swap.log = config.log;
    swap.host_env = cpu;
    if (cache.ok()) {
      swap.cache_root = cache->path;
    } else {
      swap.cache_error = cache.status().message();
    }
    hook->swapper = new Swapper(std::move(swap));
    Swapper* swapper = hook->swapper;
    options.on_message = [swapper](const wire::WireMessage& m) { swapper->on_daemon_message(m); };
    options.on_round = [swapper](const std::vector<std::shared_ptr<const OpSignature>>& fresh) {
      swapper->on_round(fresh);
    };
    hook->sampler = new InputSampler(config.capture_inputs);
    InputSampler* sampler = hook->sampler;
    hook->timer = new CudaTimer();
    CudaTimer* timer = hook->timer;
    options.before_round = [sampler, timer, gpus](int32_t pid, RoundExtras& extras) {
      sampler->drain(pid, extras);
      timer->collect(extras);
      extras.gpus_in_use = gpus->current();
    };
    hook->recorder = new Recorder(std::move(options));
    Recorder* recorder = hook->recorder;
    swapper->set_wake([recorder] { recorder->report_now(0); });
    if (config.mode != HookMode::kObserve) swapper->install_process_handlers();
    hook->recorder->start();
    gpus->install_fork_handler();   // after the Recorder's: see ActiveGpus::install_fork_handler

    hook->registration = register_catalog(config, *hook->recorder, *hook->arch, hook->sampler, hook->timer);
    if (config.log) {
      std::string reg;
      const RegistrationSummary& rs = hook->registration;
      for (size_t i = 0; i < rs.registered.size(); ++i) {
        reg += (reg.empty() ? "" : ", ") + rs.registered[i] + " (" + rs.how[i] + ")";
      }
      log_line("intercepting " + (reg.empty() ? std::string("nothing") : reg));
      for (const std::string& s : hook->registration.skipped) log_line("not intercepting " + s);
    } else if (hook->registration.registered.empty()) {
      log_line("no operator could be intercepted; kforge observes nothing in this process");
    }
    g_hook.store(hook, std::memory_order_release);
  } catch (const std::exception& e) {
    log_line(std::string("disabled: start-up failed: ") + e.what());
  } catch (...) {
    log_line("disabled: start-up failed");
  }
}

std::string stats_json() {
  nlohmann::json j;
  j["kforge_version"] = KFORGE_VERSION_STRING;
  j["torch_version"] = KFORGE_TORCH_VERSION_STRING;
  j["pid"] = ::getpid();
  const Hook* hook = g_hook.load(std::memory_order_acquire);
  j["started"] = hook != nullptr;
  if (hook == nullptr) return j.dump();
  j["mode"] = std::string(hook_mode_name(hook->config.mode));
  j["config"] = hook->config.to_string();
  j["registered"] = hook->registration.registered;
  nlohmann::json how = nlohmann::json::object();
  for (size_t i = 0; i < hook->registration.registered.size(); ++i) {
    how[hook->registration.registered[i]] = hook->registration.how[i];
  }
  j["interceptors"] = how;
  j["skipped"] = hook->registration.skipped;
  const RecorderStats st = hook->recorder->stats();
  const SwapStats swap = hook->swapper->stats();
  nlohmann::json sigs = nlohmann::json::array();
  for (const RecorderStats::Signature& s : st.signatures) {
    const std::string encoding = s.signature.encode();
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    hex.reserve(encoding.size() * 2);
    for (unsigned char c : encoding) {
      hex += kHex[c >> 4];
      hex += kHex[c & 15];
    }
    std::string op = s.signature.op;
    if (!s.signature.overload.empty()) op += "." + s.signature.overload;
    sigs.push_back({{"id", s.id.hex()},
                    {"op", op},
                    {"signature", s.signature.to_string()},
                    {"encoding", hex},
                    {"calls", s.calls},
                    {"sampled_calls", s.sampled_calls},
                    {"sampled_ns", s.sampled_ns}});
    nlohmann::json stats = nlohmann::json::array();
    for (const wire::InputStats& is : s.input_stats) {
      stats.push_back({{"arg", is.arg_index}, {"min", is.min}, {"max", is.max}, {"mean", is.mean},
                       {"stddev", is.stddev}, {"nan", is.nan_count}, {"inf", is.inf_count},
                       {"zero_fraction", is.zero_fraction}});
    }
    sigs.back()["input_stats"] = std::move(stats);
    nlohmann::json& j_sig = sigs.back();
    j_sig["state"] = "observe";
    for (const SwapStats::Entry& e : swap.entries) {
      if (!(e.id == s.id)) continue;
      j_sig["state"] = e.state;
      j_sig["entry"] = e.key;
      j_sig["reason"] = e.reason;
      j_sig["shadow_calls"] = e.shadow_calls;
      j_sig["clean_shadow_calls"] = e.clean_shadow_calls;
      j_sig["active_calls"] = e.active_calls;
      j_sig["fallbacks"] = e.fallbacks;
      j_sig["backend"] = std::string(backend_name(e.backend));
      j_sig["devices"] = e.devices;
      j_sig["unloaded_device_calls"] = e.unloaded_device_calls;
      j_sig["capture_shadow_skips"] = e.capture_shadow_skips;
      j_sig["pytorch_median_ns"] = e.pytorch_median_ns;
      j_sig["entry_median_ns"] = e.entry_median_ns;
      j_sig["timed_calls"] = e.timed_calls;
      j_sig["speedup"] = e.speedup;
      j_sig["previous_entry"] = e.previous_key;
      j_sig["previous_state"] = e.previous_state;
    }
  }
  nlohmann::json entries = nlohmann::json::array();
  for (const SwapStats::Entry& e : swap.entries) {
    entries.push_back({{"id", e.id.hex()},
                       {"entry", e.key},
                       {"state", e.state},
                       {"reason", e.reason},
                       {"shadow_calls", e.shadow_calls},
                       {"clean_shadow_calls", e.clean_shadow_calls},
                       {"active_calls", e.active_calls},
                       {"fallbacks", e.fallbacks},
                       {"backend", std::string(backend_name(e.backend))},
                       {"devices", e.devices},
                       {"unloaded_device_calls", e.unloaded_device_calls},
                       {"capture_shadow_skips", e.capture_shadow_skips},
                       {"pytorch_median_ns", e.pytorch_median_ns},
                       {"entry_median_ns", e.entry_median_ns},
                       {"timed_calls", e.timed_calls},
                       {"speedup", e.speedup},
                       {"previous_entry", e.previous_key},
                       {"previous_state", e.previous_state}});
  }
  j["swap"] = {{"enabled", swap.enabled},
               {"cache_dir", swap.cache_dir},
               {"cache_error", swap.cache_error},
               {"markers_quarantined", swap.markers_quarantined},
               {"notices", swap.notices},
               {"quarantined", swap.quarantined},
               {"upgrades", swap.upgrades},
               {"revoked_in_cache", swap.revoked_in_cache},
               {"entries", std::move(entries)}};
  j["signatures"] = std::move(sigs);
  j["unknown_calls"] = st.unknown_calls;
  j["overflow_calls"] = st.overflow_calls;
  j["id_mismatches"] = st.id_mismatches;
  j["threads"] = st.threads;
  j["gpus_in_use"] = st.gpus_in_use;
  j["reports"] = {{"built", st.reports_built},
                  {"offered", st.reports_offered},
                  {"client_running", st.client_running},
                  {"client_error", st.client_error},
                  {"client_sent", st.client_sent},
                  {"client_dropped", st.client_dropped},
                  {"extras_offered", st.extras_offered},
                  {"extras_refused", st.extras_refused}};
  const InputSampler::Counters in = hook->sampler->counters();
  j["inputs"] = {{"capture", hook->sampler->capture()},
                 {"sampled", in.sampled},
                 {"skipped_capturing", in.skipped_capturing},
                 {"skipped_too_large", in.skipped_too_large},
                 {"skipped_busy", in.skipped_busy},
                 {"failed", in.failed},
                 {"captured", in.captured}};
  const CudaTimer::Counters tc = hook->timer->counters();
  j["cuda_timing"] = {{"timed", tc.timed},
                      {"skipped_capturing", tc.skipped_capturing},
                      {"skipped_other", tc.skipped_other},
                      {"dropped_stale", tc.dropped_stale},
                      {"skipped_budget", tc.skipped_budget}};
  return j.dump();
}

// Runs when the library is loaded: after torch's own initializers (it depends on torch's
// libraries), so the dispatcher already holds every operator.
__attribute__((constructor)) void on_load() { start(); }

}  // namespace
}  // namespace kforge::hook

extern "C" {

// JSON text, valid until the calling thread's next call. Thread-safe; never null.
__attribute__((visibility("default"))) const char* kforge_hook_stats_json() {
  thread_local std::string result;
  try {
    result = kforge::hook::stats_json();
  } catch (const std::exception& e) {
    result = std::string("{\"error\": \"") + e.what() + "\"}";
  } catch (...) {
    result = "{\"error\": \"stats failed\"}";
  }
  return result.c_str();
}

// Blocks the caller up to timeout_ms: for tools and tests, never called by the hook itself.
__attribute__((visibility("default"))) int kforge_hook_report_now(int timeout_ms) {
  const kforge::hook::Hook* hook = kforge::hook::g_hook.load(std::memory_order_acquire);
  return hook != nullptr && hook->recorder->report_now(timeout_ms) ? 1 : 0;
}

// For benchmarks only (Note [Bench toggle] in interceptor.cc): with KFORGE_BENCH_TOGGLE=1 at load,
// on = 0 takes kforge's interceptors out of the dispatcher and on = 1 puts them back. Returns "" on
// success, else why not; the text is valid until the calling thread's next call. The caller
// guarantees that no other thread calls the catalog's operators meanwhile. Never null.
__attribute__((visibility("default"))) const char* kforge_hook_bench_set_interceptors(int on) {
  thread_local std::string result;
  result = kforge::hook::set_interceptors_registered(on != 0);
  return result.c_str();
}

}  // extern "C"

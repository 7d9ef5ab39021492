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
//                                                found), "thread_block" ("shim": the
//                                                preload shim's static TLS block, else "own
//                                                (why)": Note [The hook's thread block]), and
//                                                "swap": the loader's cache and entries
//   int kforge_hook_report_now(int timeout_ms);  asks the reporter for a report now and, with
//                                                timeout_ms > 0, waits until it was built and
//                                                offered; 1 if it was, else 0
//
// Exit summary (Note [Exit summary]): with KFORGE_SUMMARY_DIR set to a writable directory, each
// process that exits normally writes <dir>/kforge-summary-<pid>.json (atomically: a hidden temp file
// in the same directory, renamed), for `kforge run` to read. The object is kforge_hook_stats_json()'s
// (its "signatures" with "id", "op", "signature", "calls", "sampled_calls", "sampled_ns", "state",
// for a loaded entry "entry", "backend", "shadow_calls", "active_calls", "fallbacks", ...; "swap",
// "registered", "skipped", ...) plus:
//   "summary_format"  1
//   "pid", "ppid"     this process and its parent when it exited
//   "argv0"           the process's name (argv[0] without its directory)
//   "torch"           torch's version the hook was built for ("2.11.0+cu130")
//   "mode"            observe | shadow | active
//   "wall_s"          seconds from the hook's load (a forked child: from the fork) to the exit
//   per signature:
//   "mean_ns"         sampled_ns / sampled_calls: PyTorch's mean time per call of the signature
//                     (CPU: host clock; CUDA: device time from events), null when none was timed
//   "estimated_ns"    calls x mean_ns: the signature's estimated total time in PyTorch's kernel
//                     (null without mean_ns); calls are estimates unless KFORGE_OBSERVE_EVERY=1

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cache/cache_dir.h"
#include "interposer/hook/ab_driver.h"
#include "interposer/hook/config.h"
#include "interposer/hook/cuda_devices.h"
#include "interposer/hook/cuda_timer.h"
#include "interposer/hook/hook_work.h"
#include "interposer/hook/input_sampler.h"
#include "interposer/hook/interceptor.h"
#include "interposer/hook/log.h"
#include "interposer/hook/recorder.h"
#include "interposer/hook/swapper.h"
#include "interposer/hook/target_arch.h"
#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "runtime/file_io.h"
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
  AbDriver* ab = nullptr;     // KFORGE_AB_WINDOW_MS only
  RegistrationSummary registration;
  // Note [Exit summary]: where to write it (absolute; empty: nowhere) and the process's name, read
  // at load so that the exit handler needs nothing but the hook's own data.
  std::string summary_dir;
  std::string argv0;
  // Note [The hook's thread block] (interposer/preload_shim.c): "shim" or "own (<why>)".
  std::string thread_block;
};

// Takes the preload shim's static TLS block as every thread's HookThread block when the shim is in
// the process and its block fits (Note [The hook's thread block]); returns "shim", or "own (why)"
// when the hook's own thread_local stays the block.
std::string adopt_shim_thread_block() {
  void* sym = ::dlsym(RTLD_DEFAULT, "kforge_shim_thread_block");
  if (sym == nullptr) {
    (void)::dlerror();   // a failed lookup must not show up in the program's next dlerror()
    return "own (no preload shim in the process)";
  }
  long (*query)(size_t*, size_t*) = nullptr;
  std::memcpy(&query, &sym, sizeof query);
  size_t bytes = 0;
  size_t align = 0;
  const long offset = query(&bytes, &align);
  const std::string why = use_thread_block(static_cast<intptr_t>(offset), bytes, align);
  return why.empty() ? "shim" : "own (" + why + ")";
}

// Set once by the constructor; never freed (intercepted calls may come until the process ends).
std::atomic<const Hook*> g_hook{nullptr};

// Note [Exit summary]
std::atomic<int64_t> g_life_start_ns{0};        // steady clock at the hook's load; a forked child's fork
std::atomic<int32_t> g_summary_written_by{0};   // the pid that wrote (or tried to): once per process

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void install_exit_summary(Hook& hook);

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
    hook->thread_block = adopt_shim_thread_block();   // before any interceptor exists
    g_life_start_ns.store(steady_ns(), std::memory_order_relaxed);
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
    swap.timing_pairs = config.timing_pairs;
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
    if (config.ab_window_ms != 0 && config.mode == HookMode::kActive) hook->ab = new AbDriver(config.ab_window_ms);
    options.on_round = [swapper, hook](const std::vector<std::shared_ptr<const OpSignature>>& fresh) {
      swapper->on_round(fresh);
      if (hook->ab != nullptr && hook->recorder != nullptr) {
        // Note [End-to-end A/B]: the catalog operators' calls so far (every call is observed).
        uint64_t calls = 0;
        for (const RecorderStats::Signature& sig : hook->recorder->stats().signatures) calls += sig.calls;
        hook->ab->tick(calls, *swapper);
      }
    };
    hook->sampler = new InputSampler(config.capture_inputs);
    InputSampler* sampler = hook->sampler;
    hook->timer = new CudaTimer();
    CudaTimer* timer = hook->timer;
    options.before_round = [sampler, timer, gpus, swapper](int32_t pid, RoundExtras& extras) {
      // The round's CUDA work is no part of any graph a program thread captures (Note [Samples
      // and graph capture] in input_sampler.cc): relaxed, so it neither fails nor spoils one.
      std::optional<ScopedCaptureMode> relaxed;
      if (const CudaDriver* cu = CudaDriver::loaded()) relaxed.emplace(*cu, CU_STREAM_CAPTURE_MODE_RELAXED);
      sampler->drain(pid, extras);
      timer->collect(extras);
      extras.gpus_in_use = gpus->current();
      // What runs where, for the daemon's status and GUI (wire::EntryInProcess). States are the
      // swapper's own words (shadow, active, no_win, disabled); one the decoder would refuse is
      // left out rather than cost the whole report.
      for (SwapStats::Entry& e : swapper->stats().entries) {
        const bool ok_state = !e.state.empty() && e.state.size() <= wire::kMaxStateChars &&
                              e.state.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos;
        if (!ok_state || e.key.empty()) continue;
        extras.in_process.emplace_back(
            e.id, wire::EntryInProcess{e.key, e.state, e.active_calls, e.pytorch_median_ns, e.entry_median_ns});
      }
    };
    hook->recorder = new Recorder(std::move(options));
    Recorder* recorder = hook->recorder;
    swapper->set_wake([recorder] { recorder->report_now(0); });
    if (config.mode != HookMode::kObserve) swapper->install_process_handlers();
    hook->recorder->start();
    gpus->install_fork_handler();   // after the Recorder's: see ActiveGpus::install_fork_handler
    install_exit_summary(*hook);   // after the Recorder's exit handler, so it runs before it

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
  j["thread_block"] = hook->thread_block;
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
      j_sig["timing_calls"] = e.timing_calls;
      j_sig["fallbacks"] = e.fallbacks;
      j_sig["backend"] = std::string(backend_name(e.backend));
      j_sig["devices"] = e.devices;
      j_sig["unloaded_device_calls"] = e.unloaded_device_calls;
      j_sig["capture_shadow_skips"] = e.capture_shadow_skips;
      j_sig["memory_shadow_skips"] = e.memory_shadow_skips;
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
                       {"timing_calls", e.timing_calls},
                       {"fallbacks", e.fallbacks},
                       {"backend", std::string(backend_name(e.backend))},
                       {"devices", e.devices},
                       {"unloaded_device_calls", e.unloaded_device_calls},
                       {"capture_shadow_skips", e.capture_shadow_skips},
                       {"memory_shadow_skips", e.memory_shadow_skips},
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
               {"upgrades_declined", swap.upgrades_declined},
               {"revoked_in_cache", swap.revoked_in_cache},
               {"entries", std::move(entries)}};
  j["signatures"] = std::move(sigs);
  if (hook->ab != nullptr) j["ab"] = nlohmann::json::parse(hook->ab->to_json(), nullptr, false);
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
                  {"extras_refused", st.extras_refused},
                  {"extras_held", st.extras_held}};
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

// Note [Exit summary]
// `kforge run` shows what kforge did for a program and all its processes from one file per process:
// with KFORGE_SUMMARY_DIR set, the hook writes kforge_hook_stats_json()'s object with the process's
// identity and times (the fields are listed at the top of this file) when the process exits
// normally: exit(), a return from main, Python's normal end and sys.exit, in the process that loaded
// the hook and in each child it forks (which inherits the handler; its counters start from zero at
// the fork, and so does its wall_s) or spawns (a new program under the shim loads its own hook).
// What skips every exit handler writes nothing: a crash, a kill, _exit/os._exit, and so the
// children of Python's multiprocessing "fork" and "forkserver" start methods, which end in
// os._exit (the "spawn" method's children exit normally and do write one).
// The handler is registered after the Recorder's first one, so without CUDA it runs first, while
// the reporter still runs; a process that called CUDA operators registers the Recorder's once more
// (Note [Stopping before CUDA's teardown] in recorder.cc), which then runs first and ends with the
// reporter's last round, so the summary counts it. The handler uses only the hook's own objects
// (torch may be partly torn down by then), is bounded (one small file, no fsync), catches
// everything, and writes once per process. The directory is checked
// at start: a bad one costs one line there and no handler. A failed write costs one line at exit.
// The file appears whole or not at all: it is written as a hidden temp file in the same directory
// (O_EXCL, 0600) and renamed.
std::string summary_json(const Hook& hook) {
  nlohmann::json j = nlohmann::json::parse(stats_json());
  j["summary_format"] = 1;
  j["pid"] = ::getpid();
  j["ppid"] = ::getppid();
  j["argv0"] = hook.argv0;
  j["torch"] = KFORGE_TORCH_VERSION_STRING;
  j["mode"] = std::string(hook_mode_name(hook.config.mode));
  j["wall_s"] = static_cast<double>(steady_ns() - g_life_start_ns.load(std::memory_order_relaxed)) * 1e-9;
  for (nlohmann::json& sig : j["signatures"]) {
    const uint64_t sampled = sig.value("sampled_calls", uint64_t{0});
    if (sampled == 0) {
      sig["mean_ns"] = nullptr;
      sig["estimated_ns"] = nullptr;
      continue;
    }
    const double mean = static_cast<double>(sig.value("sampled_ns", uint64_t{0})) / static_cast<double>(sampled);
    sig["mean_ns"] = mean;
    sig["estimated_ns"] = mean * static_cast<double>(sig.value("calls", uint64_t{0}));
  }
  return j.dump();
}

// "" when written, else why not.
std::string write_summary(const Hook& hook) {
  const std::string pid = std::to_string(::getpid());
  const std::string final_path = hook.summary_dir + "/kforge-summary-" + pid + ".json";
  // The suffix keeps a temp file left by a killed process of the same pid from blocking O_EXCL.
  const std::string temp_path =
      hook.summary_dir + "/.kforge-summary-" + pid + "." + std::to_string(steady_ns()) + ".tmp";
  const std::string text = summary_json(hook);
  if (Status st = file_io::write_new_file(temp_path, text); !st.ok()) {
    ::unlink(temp_path.c_str());
    return st.message();
  }
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path.c_str());
    return "cannot rename " + temp_path + " to " + final_path + ": " + std::strerror(err);
  }
  return "";
}

void write_summary_at_exit() noexcept {
  try {
    const Hook* hook = g_hook.load(std::memory_order_acquire);
    if (hook == nullptr || hook->summary_dir.empty()) return;
    const auto pid = static_cast<int32_t>(::getpid());
    if (g_summary_written_by.exchange(pid, std::memory_order_acq_rel) == pid) return;
    const std::string error = write_summary(*hook);
    if (!error.empty()) log_line("no exit summary (KFORGE_SUMMARY_DIR): " + error);
  } catch (const std::exception& e) {
    log_line(std::string("no exit summary (KFORGE_SUMMARY_DIR): ") + e.what());
  } catch (...) {
    log_line("no exit summary (KFORGE_SUMMARY_DIR): an unexpected error");
  }
}

void restart_life_clock_in_child() noexcept { g_life_start_ns.store(steady_ns(), std::memory_order_relaxed); }

// Checks KFORGE_SUMMARY_DIR (one line if it is bad) and registers the exit handler.
void install_exit_summary(Hook& hook) {
  hook.argv0 = process_name();
  if (hook.config.summary_dir.empty()) return;
  const SummaryDir dir = resolve_summary_dir(hook.config.summary_dir);
  if (!dir.problem.empty()) {
    log_line(dir.problem);
    return;
  }
  hook.summary_dir = dir.path;
  ::pthread_atfork(nullptr, nullptr, &restart_life_clock_in_child);
  if (std::atexit(&write_summary_at_exit) != 0) {
    log_line("no exit summary (KFORGE_SUMMARY_DIR): cannot register an exit handler");
    hook.summary_dir.clear();
  }
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

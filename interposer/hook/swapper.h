// Swapper: the loader, and the owner of the hook's ReplacementTable (steps 6-8 of DESIGN.md's "One
// signature's life", for CPU and CUDA entries).
//
//   Swapper* s = new Swapper(options);          // one per process, never destroyed
//   s->set_wake([rec] { rec->report_now(0); });
//   recorder_options.on_round = [s](const auto& fresh) { s->on_round(fresh); };
//   // interceptor, on a hit (calling thread; no I/O):
//   s->shadow_clean(*r);                        // one more clean shadow comparison
//   s->fail(*r, "output 0: max abs error ...");  // disable now, quarantine in the background
//
// Note [Swap states]
// A signature is in one of four states in a process:
//   observe   no cache entry is in use (the table has no slot for it)
//   shadow    an entry is loaded; each call runs PyTorch's kernel (whose result the caller gets),
//             then the entry on the same inputs, and compares (swap_call.cc, Note [Shadow
//             comparison])
//   active    after KFORGE_SHADOW_CALLS clean shadow calls (KFORGE_MODE=active only): each call
//             runs the entry alone
//   disabled  a comparison failed, or the entry's launch failed or threw: the table no longer has
//             the signature (PyTorch's kernel runs) and the entry is quarantined in the cache
// Every change publishes a new immutable table (copy + atomic pointer swap); old tables,
// Replacements, specs, plans and modules are never freed.
// CUDA entries, per call: the call's device is its tensor inputs' device (the signature has no
// device index). On a device the entry is not loaded on, the call runs PyTorch's kernel and counts
// as unloaded_device_calls, not as a failure. While the call's stream is capturing a CUDA graph, an
// active entry launches as usual (its launch is captured; nothing synchronizes), but a shadow call
// runs PyTorch's kernel only: the comparison synchronizes, which capture forbids. Such a call is
// counted as capture_shadow_skips, not as a shadow call, so a trial is only ever passed on calls
// that were compared.
//
// Threads: on_round runs on the recorder's reporter thread and does every piece of I/O (cache
// open, manifest scans, blob reads, module loads, state changes, trial markers, log lines about
// failures). shadow_clean and fail run on calling threads: they take mu_ briefly, publish tables
// and queue events for on_round, nothing else. mu_ is never held during I/O.
//
// Note [Environment rule]
// The Store's key includes the whole Environment, and the hook cannot know everything a worker's
// environment holds, so the loader does not call Store::lookup; it scans the cache's manifests
// once per process (and new keys again on later rounds) and uses an entry for signature S when its
// signature equals S, its environment's and its spec's backend are S's target backend, its state
// is active, and entry_environment_matches(host, entry environment):
//   CPU   host = cpu_host_environment(<torch version>); every field equal except `compiler` (the
//         worker's compiler, which built the .so the hook only loads)
//   CUDA  host = cuda_device_environment(driver, d, <torch version>, 0) of a device d whose arch is
//         S's target arch; every field equal except `nvrtc_version` (the worker's NVRTC, which
//         built the cubin or PTX the hook only loads). Different GPU models are different devices:
//         the entry is loaded on every device whose environment it matches, and on no other.
// Several matches: the lowest key wins.
// A CUDA entry's machine code is its blob "cubin", else "ptx" (PTX text, JIT-compiled by the
// driver). It is loaded into the primary context (torch's) of each matching device whose primary
// context is already active, never creating one (cuDevicePrimaryCtxGetState), with that context
// made current on the reporter thread for the load and the previous one restored. A matching
// device whose context becomes active later gets the entry on a later round. Modules are never
// unloaded: captured CUDA graphs may replay their kernels.
//
// Note [Daemon notices]
// Besides a signature's first sight, the loader looks at the cache when the daemon says so:
//   KernelReady(signature S, entry E)  if this process has seen S and has no entry in use for it
//       (never found one, or the one it had was disabled), the next round looks for S's entries
//       again (find_entry, which also scans keys published since the last look) and loads the
//       best usable one through the usual trial. An entry in shadow or active state stays: the
//       hook does not replace a working entry with a newer one.
//   Revoke(S, E, reason)               if E is in use for S, it is disabled at once (PyTorch's
//       kernel runs) with "revoked by the daemon: <reason>"; the cache is the daemon's to change,
//       so the hook does not quarantine it. Its trial marker, if any, is removed.
// Notices for signatures this process has not seen are ignored (their first sight finds the
// entry). Observe mode ignores every notice.
//
// Note [Trial marker]
// Before an entry's first replacement launch the loader writes <cache>/trial/<entry key> (its
// content is the writer's pid; the cache owns the format: Store::write_trial_marker, which
// `kforge cache verify` and `gc` know too) and removes it when the trial passed (shadow_target clean shadow
// calls), when the entry is quarantined, or when the process exits normally during its trial. On
// its first round in shadow or active mode, the loader quarantines ("process died during trial")
// the entry of every marker whose writer is not alive, and removes the marker. A marker of a
// process that is still alive (another process in its own trial) is left alone. Observe mode
// never opens the cache, so it neither writes nor reads markers. A CUDA entry loaded on another
// device after its trial passed runs there without a new trial (same machine code, same
// environment).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache/store.h"
#include "interposer/hook/config.h"
#include "interposer/hook/replacement_table.h"
#include "runtime/environment.h"
#include "runtime/wire.h"

namespace kforge::hook {

class CudaDevices;

// Note [Environment rule]: whether an entry built for `entry` may run where `host` describes the
// machine (the CPU, or one CUDA device). Every field must be equal except the one the hook cannot
// know for host.backend: `compiler` for CPU, `nvrtc_version` for CUDA.
bool entry_environment_matches(const Environment& host, const Environment& entry);
// Why not, one line per differing field ("driver_version: 13000 != 12080"); empty iff it matches.
std::vector<std::string> entry_environment_differences(const Environment& host, const Environment& entry);

struct SwapperOptions {
  HookMode mode = HookMode::kObserve;
  uint32_t shadow_calls = 20;
  bool log = false;                // KFORGE_LOG: also log loads and activations
  Environment host_env;            // cpu_host_environment(torch version); CUDA devices' environments
                                   // use its torch_version
  std::string cache_root;          // resolved cache directory; empty with cache_error set
  std::string cache_error;
};

struct SwapStats {
  struct Entry {
    SignatureId id;
    std::string key;               // entry key, hex
    Backend backend = Backend::kCpu;
    std::string state;             // shadow | active | disabled
    std::string reason;            // why disabled
    uint64_t shadow_calls = 0, active_calls = 0, fallbacks = 0, clean_shadow_calls = 0;
    uint64_t unloaded_device_calls = 0, capture_shadow_skips = 0;   // CUDA only
    std::vector<int> devices;      // CUDA: the device ordinals the entry is loaded on
  };
  bool enabled = false;            // mode is shadow or active
  std::string cache_dir;
  std::string cache_error;         // why no cache is used, if none is
  uint64_t markers_quarantined = 0;
  uint64_t notices = 0;            // KernelReady/Revoke messages received from the daemon
  uint64_t quarantined = 0;        // entries this process quarantined (set_state succeeded)
  std::vector<Entry> entries;      // by signature id
};

class Swapper {
 public:
  explicit Swapper(SwapperOptions options);
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;
  ~Swapper() = delete;

  // How a calling thread asks for an early round (after fail or a passed trial). Set once.
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  // Installs the exit handler (removes this process's open trial markers) and fork handlers.
  void install_process_handlers();

  // Reporter thread, each round. Never throws.
  void on_round(const std::vector<std::shared_ptr<const OpSignature>>& new_signatures) noexcept;

  // The daemon client's thread (Note [Daemon notices]): queues a KernelReady or Revoke for the
  // next round and wakes the reporter. Never throws, no I/O.
  void on_daemon_message(const wire::WireMessage& message) noexcept;

  // Calling threads. Never throw, never do I/O.
  void shadow_clean(const Replacement& r) noexcept;
  void fail(const Replacement& r, std::string reason) noexcept;

  SwapStats stats() const;

 private:
  struct Record {
    const Replacement* current = nullptr;   // null: disabled
    SwapCounters* counters = nullptr;
    const CudaModules* cuda = nullptr;      // CUDA entries: where they are loaded
    Backend backend = Backend::kCpu;
    ObserveMask observe_bits = ObserveMask::all();   // ObserveSlots::mask of the signature's operator
    SignatureId key;
    std::string label;                      // signature, for logs
    std::string state;
    std::string reason;
  };
  struct Event {
    enum class Kind { kTrialPassed, kQuarantine } kind;
    SignatureId key;
    std::string label;
    std::string reason;
  };

  void publish_locked();
  void wake() noexcept;
  // Reporter thread only:
  bool ensure_store();
  void recover_markers();
  void process_events();
  void process_notices();
  // A CUDA entry that matches devices it is not loaded on yet (their primary context was not
  // active when it was loaded); retried each round.
  struct CudaPending {
    SignatureId id;                         // the signature
    std::string where;                      // "entry <key> for <signature>", for logs
    Environment environment;                // the entry's
    const KernelSpec* spec = nullptr;       // the Replacement's, never freed
    std::string image;
    CudaModules* modules = nullptr;
    std::vector<int> waiting;               // device ordinals to try again
  };
  // Why an entry's environment does not fit here; empty: it fits.
  using EnvironmentCheck = std::function<std::string(const Environment&)>;

  void consider(const OpSignature& sig);
  void consider_cpu(const OpSignature& sig);
  void consider_cuda(const OpSignature& sig);
  // Writes the trial marker, completes `r` and publishes it in shadow state. False (logged): not
  // published. `on` ends the log line's "loaded" (" on cuda:0").
  bool publish_new(const OpSignature& sig, const StoredEntry& entry, Replacement* r, const std::string& on);
  void retry_cuda_pending();
  // Loads a pending entry on `ordinal` if its context is active: 1 loaded, 0 not yet, -1 failed.
  int load_on_device(CudaPending& p, int ordinal);
  std::optional<StoredEntry> find_entry(const OpSignature& sig, const EnvironmentCheck& fits);
  bool write_marker(const SignatureId& key, std::string& error);
  void remove_marker(const SignatureId& key);

  static void at_exit() noexcept;
  static void before_fork() noexcept;
  static void after_fork() noexcept;

  const SwapperOptions options_;
  std::function<void()> wake_;

  mutable std::mutex mu_;                  // guards the members below, up to the next comment
  std::map<SignatureId, Record> records_;
  std::vector<Event> events_;
  struct Notice {
    bool revoke = false;
    SignatureId signature;
    std::string entry_key;   // hex, as the message carries it
    std::string reason;      // Revoke only
  };
  std::vector<Notice> notices_;
  uint64_t notices_received_ = 0;
  std::map<SignatureId, int32_t> open_trials_;   // entry key -> pid that wrote its marker
  uint64_t markers_quarantined_ = 0;
  uint64_t quarantined_ = 0;
  std::string store_error_;

  // Reporter thread only.
  bool store_tried_ = false;
  std::optional<Store> store_;
  std::map<SignatureId, std::shared_ptr<const OpSignature>> looked_up_;   // signatures considered
  std::set<SignatureId> scanned_keys_;
  std::multimap<SignatureId, SignatureId> keys_by_signature_;
  CudaDevices* cuda_devices_ = nullptr;           // made on the first CUDA signature; never freed
  bool cuda_unavailable_logged_ = false;
  std::vector<CudaPending> cuda_pending_;
};

}  // namespace kforge::hook

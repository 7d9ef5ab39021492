// Swapper: the loader, and the owner of the hook's ReplacementTable (steps 6-8 of DESIGN.md's "One
// signature's life", for CPU and CUDA entries).
//
//   Swapper* s = new Swapper(options);          // one per process, never destroyed
//   s->set_wake([rec] { rec->report_now(0); });
//   recorder_options.on_round = [s](const auto& fresh) { s->on_round(fresh); };
//   // interceptor, on a hit (calling thread; no I/O):
//   s->shadow_clean(*r, pytorch_ns, entry_ns);  // one more clean shadow comparison, and its times
//   s->timing_call(*r, k, ns);                  // call k of the timing phase took ns alone
//   s->fail(*r, "output 0: max abs error ...");  // disable now, quarantine in the background
//
// Note [Swap states]
// A signature is in one of five states in a process:
//   observe   no cache entry is in use (the table has no slot for it)
//   shadow    an entry is loaded; each call runs PyTorch's kernel (whose result the caller gets)
//             and the entry on the same inputs, times both, and compares (swap_call.cc, Note
//             [Shadow comparison])
//   active    after KFORGE_SHADOW_CALLS clean shadow calls (KFORGE_MODE=active only), and, unless
//             KFORGE_CONFIRM_WIN=0, only if the entry was faster than PyTorch's kernel on those
//             calls (Note [In-process win]): each call runs the entry alone
//   no_win    the trial was clean but the entry was not faster here: the table no longer has the
//             signature (PyTorch's kernel runs, no more shadow calls); the entry stays active in
//             the cache (it is correct) and a no-win record says why it is unused in this process
//   disabled  a comparison failed, or the entry's launch failed or threw (the entry is quarantined
//             in the cache), or the daemon revoked it, or the cache no longer has it active (Note
//             [Daemon notices]): the table no longer has the signature (PyTorch's kernel runs)
// An upgrade (Note [Daemon notices]) puts a second entry on trial while the first is kept aside:
// the signature is in shadow with the new entry, and goes back to the first entry's state (and
// Replacement) if the new one fails, shows no win, or is revoked.
// Every change publishes a new immutable table (copy + atomic pointer swap); old tables,
// Replacements, specs, plans and modules are never freed. An entry loaded once is identified by
// its SwapCounters (shared by its shadow and active Replacements), not by its key: a key
// republished with a new kernel is another entry.
// CUDA entries, per call: the call's device is its tensor inputs' device (the signature has no
// device index). On a device the entry is not loaded on, the call runs PyTorch's kernel and counts
// as unloaded_device_calls, not as a failure. While the call's stream is capturing a CUDA graph, an
// active entry launches as usual (its launch is captured; nothing synchronizes), but a shadow call
// runs PyTorch's kernel only: the comparison synchronizes, which capture forbids. Such a call is
// counted as capture_shadow_skips, not as a shadow call, so a trial is only ever passed on calls
// that were compared.
//
// Note [In-process win]
// The worker timed the entry against PyTorch's kernel on its own GPU or CPU, in its own process,
// on synthetic inputs; the serving process may differ (other work on the machine, thread pool
// size, caches warm with the model's data, another clock). So with KFORGE_CONFIRM_WIN on, the
// trial also times both in this process. CUDA entries: on the same inputs in every shadow call
// (CUDA events on the call's stream around each launch, read after the comparison has
// synchronized), alternating which runs first (odd calls: the entry) so that caches warmed by the
// first do not favour the second. CPU entries: in a timing phase after the shadow calls (Note
// [Timing phase]). At the end of a clean trial the entry goes active only if, over the trial's
// timed pairs (the last SwapCounters::kTimedPairs, or the timing phase's pairs):
//   median(entry) <= 0.97 x median(PyTorch)   a win of at least 3%: medians ignore the odd
//                                             preempted or page-faulting call, and 3% is above
//                                             the run-to-run drift of a median of 20 paired calls
//                                             on a quiet machine, so noise alone rarely passes;
//   entry faster in >= 2/3 of the pairs       the win is consistent call by call, not carried by a
//                                             few slow PyTorch calls that moved the median.
// Otherwise the entry is "no_win": correct (never quarantined) but not used in this process. Both
// medians are kept for the stats JSON (also for entries that went active: a summary can estimate
// the time saved), and the loader writes a no-win record (Store::write_no_win_record:
// nowin/<key>.<pid>, which `kforge cache ls/show` display and gc removes once the process is
// gone). An entry that lost here is not tried again in this process (a KernelReady for the same
// kernel is ignored; a different kernel under its key is a new entry). The shadow call protects
// the caller whichever runs first: every tensor input is copied before the entry runs and
// compared after it, and an entry that wrote its inputs fails (and the inputs are put back
// before PyTorch's kernel reads them).
//
// Note [Timing phase]
// A shadow call is not the regime the entry will serve in: it copies the inputs first and runs
// both kernels back to back, so each one starts with caches the other (or the copy) left. On the
// 2-core CPU host, aten::mean.dim over the last two dimensions of [8,512,7,7] timed PyTorch
// 42.4 us against the entry's 37.4 us in its shadow calls, and went active; the same calls in a
// loop took 28 us with PyTorch's kernel and 33 us with the entry (0.85x): "never slower" was
// broken by the trial's own measurement. So a CPU entry's trial (KFORGE_CONFIRM_WIN on,
// KFORGE_MODE=active) ends with a timing phase: after its KFORGE_SHADOW_CALLS clean shadow calls
// (which prove it correct here; their times are not kept) the table gets a Replacement in state
// kTiming, and the next 2 x KFORGE_TIMING_PAIRS calls are served by one kernel alone each, exactly
// as an unhooked call (PyTorch's) or an active one (the entry's) would be: no copies, no
// comparison, the caller gets that kernel's result. Call k of the phase (SwapCounters::timing_calls)
// belongs to pair k / 2; even pairs run PyTorch's kernel first, odd pairs the entry first
// (timing_turn_is_entry), so neither is always the one that follows the other. Each call is timed
// with a steady clock around the whole call, dispatch included, in the caller's own loop, with
// the program's own data and neighbours, which is what the entry would save or cost there. The
// call that completes the last pair judges the pairs as above. The entry serves half the calls
// before it is judged: it is verified (worker, then the shadow calls), so that costs at most
// TIMING_PAIRS calls' difference, once per process. An entry that fails or throws in the phase is
// disabled as an active one would be. The stats say "shadow" until the verdict (the trial is
// on); timing_calls counts the phase's calls, which are neither shadow nor active calls.
// KFORGE_TIMING_PAIRS=0 judges CPU entries on their shadow calls' times, as CUDA entries are (a
// CUDA timing phase would need the events read back on the reporter thread, as CudaTimer does:
// not built yet). Shadow mode never uses an entry's results, so it has no timing phase.
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
// Besides a signature's first sight, the loader looks at the cache when the daemon says so, and
// on every round it checks that the entries it uses are still active in the cache:
//   KernelReady(S, E)  for a signature S this process has seen:
//       - no entry in use (never found one, or the one it had was disabled or showed no win): the
//         next round looks for S's entries again (find_entry, which also scans keys published
//         since the last look, skipping entries that lost here) and loads the best usable one
//         through the usual trial;
//       - an entry A in use whose trial has ended: the round loads E if it is usable here (as
//         find_entry checks), is another kernel than A (another key, or A's key republished with
//         other blobs: the daemon republishes a better winner under the same key) and is better
//         (Timings::speedup in the cache higher than A's). E goes on trial (shadow: calls get
//         PyTorch's result) with A kept aside. E passes (and wins, Note [In-process win], at a
//         speedup in this process at least A's, Note [Upgrade pays]): E takes A's place and A's
//         Replacement is retired, never freed. E fails its comparison: E is quarantined and A goes
//         back to the state it had. E shows no win, or no gain over A: A goes back;
//       - an entry still on trial (its own, or an upgrade's): the notice waits for the trial's
//         end (deferred to later rounds).
//   Revoke(S, E, reason)  if E is the entry in use for S, it is disabled at once (PyTorch's
//       kernel runs, or the entry kept aside during an upgrade's trial goes back) with "revoked by
//       the daemon: <reason>"; the cache is the daemon's to change, so the hook does not
//       quarantine it. Its trial marker, if any, is removed. An entry kept aside is dropped.
//   The cache itself, each round: the loader reads the state of every entry in use or kept aside
//       (Store::status: a stat and the small state file, on the reporter thread). One that is no
//       longer active there (`kforge cache disable`, another process's quarantine, removal) is
//       taken out as a Revoke would, logging "entry <key> for <signature> disabled in the cache:
//       PyTorch's kernel runs" (or quarantined in / removed from). So a disable reaches every
//       running process within one report round (KFORGE_REPORT_INTERVAL_MS).
// Notices for signatures this process has not seen are ignored (their first sight finds the
// entry). Observe mode ignores every notice.
//
// Note [Trial marker]
// Before an entry's first replacement launch the loader writes <cache>/trial/<entry key> (its
// content is the writer's pid; the cache owns the format: Store::write_trial_marker, which
// `kforge cache verify` and `gc` know too) and removes it when the trial passed (shadow_target clean shadow
// calls), when the entry is quarantined or showed no win, when it is revoked (by the daemon or in
// the cache) during its trial, or when the process exits normally during its trial. An upgrade's
// trial writes the new entry's marker like any other (for a key republished with a new kernel,
// the marker under that key stands for the new kernel). On
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
#include <span>
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

// Note [In-process win]: the verdict on a trial's timed pairs (pytorch_ns[i] and entry_ns[i] timed
// in the same call).
struct WinVerdict {
  bool win = false;
  uint32_t pairs = 0;              // timed pairs judged
  uint32_t entry_faster = 0;       // pairs in which the entry took less time
  uint64_t pytorch_median_ns = 0;
  uint64_t entry_median_ns = 0;
};
WinVerdict judge_in_process_win(std::span<const uint64_t> pytorch_ns, std::span<const uint64_t> entry_ns);

// Note [Upgrade pays]
// The daemon republishes a signature's winner when its worker times a faster one (Note [Daemon
// notices]), but the worker's timings can flatter a kernel the serving process does not find
// faster: on an H100, with the warm's workload sharing the GPU, the worker timed a softmax over dim
// 1 at 21.55x PyTorch's kernel where the serving process measured 10.94x and the whole space's best
// was 15.7x in a quiet worker. An upgrade that beats PyTorch's kernel but not the version in use
// would make the program slower. So an upgrade's trial also compares the two versions' speedups as
// each trial measured them in this process (PyTorch's median over the entry's, on paired calls):
// the upgrade takes over only if its speedup is at least the version in use's; otherwise the
// version in use runs again and the upgrade is not retried in this process ("not faster here than
// the version in use"). Without both verdicts' timings (KFORGE_CONFIRM_WIN off, or a version whose
// trial timed nothing) there is nothing to compare and the upgrade takes over as before.
bool upgrade_pays(const WinVerdict& next, const WinVerdict& previous);
// PyTorch's median over the entry's; 0 without timings.
double in_process_speedup(const WinVerdict& v);

// Note [Timing phase]: whether call k of the phase is the entry's (else PyTorch's kernel's). Pair
// k / 2 runs PyTorch's kernel first when even, the entry first when odd.
constexpr bool timing_turn_is_entry(uint64_t k) { return ((k & 1) != 0) == (((k / 2) & 1) == 0); }

struct SwapperOptions {
  HookMode mode = HookMode::kObserve;
  uint32_t shadow_calls = 20;
  bool confirm_win = true;         // KFORGE_CONFIRM_WIN (Note [In-process win])
  uint32_t timing_pairs = 20;      // KFORGE_TIMING_PAIRS (Note [Timing phase]); at most kTimedPairs
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
    std::string state;             // shadow | active | no_win | disabled
    std::string reason;            // why disabled, or the no_win verdict
    // Note [In-process win]: medians of the trial's timed calls once it ended (0: not yet).
    uint64_t pytorch_median_ns = 0, entry_median_ns = 0;
    uint32_t timed_calls = 0;
    double speedup = 0;            // the entry's Timings::speedup in the cache
    std::string previous_key;      // during an upgrade's trial: the entry kept aside, and its state
    std::string previous_state;
    uint64_t shadow_calls = 0, active_calls = 0, fallbacks = 0, clean_shadow_calls = 0, timing_calls = 0;
    uint64_t unloaded_device_calls = 0, capture_shadow_skips = 0;   // CUDA only
    uint64_t memory_shadow_skips = 0;   // shadow calls not compared: out of memory (swap_call.cc)
    std::vector<int> devices;      // CUDA: the device ordinals the entry is loaded on
  };
  bool enabled = false;            // mode is shadow or active
  std::string cache_dir;
  std::string cache_error;         // why no cache is used, if none is
  uint64_t markers_quarantined = 0;
  uint64_t notices = 0;            // KernelReady/Revoke messages received from the daemon
  uint64_t quarantined = 0;        // entries this process quarantined (set_state succeeded)
  uint64_t upgrades = 0;           // entries that took the place of another entry (live upgrades)
  uint64_t upgrades_declined = 0;  // upgrades that won against PyTorch but not against the version in use
  uint64_t revoked_in_cache = 0;   // entries taken out because the cache no longer had them active
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

  // Note [End-to-end A/B] (ab_driver.h), reporter thread only. Which replacement table to publish:
  // every entry in use, none (PyTorch's kernels), or every entry but the one for `without`.
  enum class AbTable { kAll, kNone, kWithout };
  void set_ab_table(AbTable table, SignatureId without) noexcept;
  // True when no entry is on trial and no event waits; `active` gets (signature, entry key) of
  // every active entry, by signature.
  bool ab_ready(std::vector<std::pair<SignatureId, std::string>>* active) const noexcept;

  // Calling threads. Never throw, never do I/O. shadow_clean's times (0: not timed) are PyTorch's
  // kernel's and the entry's in that call (Note [In-process win]).
  void shadow_clean(const Replacement& r, uint64_t pytorch_ns, uint64_t entry_ns) noexcept;
  // Call `k` (SwapCounters::timing_calls before it) of r's timing phase took `ns`, served by the
  // kernel timing_turn_is_entry(k) names (Note [Timing phase]); 0: it threw (counted, not timed).
  void timing_call(const Replacement& r, uint64_t k, uint64_t ns) noexcept;
  void fail(const Replacement& r, std::string reason) noexcept;

  SwapStats stats() const;

 private:
  // Ends r's trial with `verdict` (active, or no_win where the win is required and not shown).
  void end_trial(const Replacement& r, const WinVerdict& verdict) noexcept;

  struct Record {
    const Replacement* current = nullptr;   // null: disabled or no_win
    SwapCounters* counters = nullptr;       // the loaded entry's identity (Note [Swap states])
    const CudaModules* cuda = nullptr;      // CUDA entries: where they are loaded
    Backend backend = Backend::kCpu;
    ObserveMask observe_bits = ObserveMask::all();   // ObserveSlots::mask of the signature's operator
    SignatureId key;
    std::string content;                    // the entry's blob hashes: which kernel under the key
    double speedup = 0;                     // its Timings::speedup in the cache
    std::string label;                      // signature, for logs
    std::string state;
    std::string reason;
    bool trial_ended = false;               // passed (active, or shadow mode) or no_win
    WinVerdict verdict;                     // set when the trial ended
    // During an upgrade's trial: the entry this one would replace, as it was (Note [Daemon notices]).
    std::unique_ptr<Record> previous;
  };
  struct Event {
    enum class Kind { kTrialPassed, kQuarantine, kNoWin, kNotBetter } kind;
    SignatureId key;
    std::string label;
    std::string reason;
    std::string content;                    // kNoWin: the kernel that lost
    WinVerdict verdict;                     // kTrialPassed, kNoWin
    std::string restored;                   // the entry that runs again instead, for logs
    std::string replaced;                   // kTrialPassed: the entry an upgrade replaced
  };

  void publish_locked();
  // The current entry of `rec` is out (it failed, showed no win or was revoked): the entry kept
  // aside during an upgrade's trial takes its place again, else the signature is `state`. Returns
  // "entry <key> runs again" when one was restored, else "".
  std::string drop_current_locked(Record& rec, const std::string& state, const std::string& reason);
  static bool is_current(const Record& rec, const Replacement& r) {
    return rec.current != nullptr && rec.counters == r.counters;
  }
  void wake() noexcept;
  // Reporter thread only:
  bool ensure_store();
  void recover_markers();
  void process_events();
  void process_notices();
  // Note [Daemon notices]: entries in use (or kept aside) that the cache no longer has active.
  void check_cache_states();
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

  // Loads `announced` (an upgrade of the entry in use, Note [Daemon notices]) or, without it, the
  // best usable entry for `sig`, and puts it on trial.
  void consider(const OpSignature& sig, const std::optional<EntryKey>& announced = std::nullopt);
  void consider_cpu(const OpSignature& sig, const std::optional<EntryKey>& announced);
  void consider_cuda(const OpSignature& sig, const std::optional<EntryKey>& announced);
  // Writes the trial marker, completes `r` and publishes it in shadow state (an upgrade keeps the
  // entry in use aside). False (logged): not published. `on` ends the log line's "loaded"
  // (" on cuda:0").
  bool publish_new(const OpSignature& sig, const StoredEntry& entry, Replacement* r, const std::string& on,
                   bool upgrade);
  void retry_cuda_pending();
  // Loads a pending entry on `ordinal` if its context is active: 1 loaded, 0 not yet, -1 failed.
  int load_on_device(CudaPending& p, int ordinal);
  std::optional<StoredEntry> find_entry(const OpSignature& sig, const EnvironmentCheck& fits);
  // The announced entry if it may upgrade the one in use for `sig` (usable here, another kernel,
  // a higher speedup); else nullopt, with the reason logged under KFORGE_LOG.
  std::optional<StoredEntry> upgrade_entry(const OpSignature& sig, const EntryKey& key, const EnvironmentCheck& fits);
  // Whether `e` may run for `sig` here at all (signature, backends, state, not lost here, fits).
  bool usable_here(const OpSignature& sig, const StoredEntry& e, const EnvironmentCheck& fits);
  bool write_marker(const SignatureId& key, std::string& error);
  void remove_marker(const SignatureId& key);

  static void at_exit() noexcept;
  static void before_fork() noexcept;
  static void after_fork() noexcept;

  const SwapperOptions options_;
  std::function<void()> wake_;

  mutable std::mutex mu_;                  // guards the members below, up to the next comment
  std::map<SignatureId, Record> records_;
  AbTable ab_table_ = AbTable::kAll;       // under mu_ (Note [End-to-end A/B])
  SignatureId ab_without_;
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
  uint64_t upgrades_ = 0;
  uint64_t upgrades_declined_ = 0;
  uint64_t revoked_in_cache_ = 0;
  std::string store_error_;
  // Kernels ("<key hex>/<content>") whose trial showed no win here: never tried again.
  std::set<std::string> lost_here_;

  // Reporter thread only.
  bool store_tried_ = false;
  std::optional<Store> store_;
  std::map<SignatureId, std::shared_ptr<const OpSignature>> looked_up_;   // signatures considered
  std::set<SignatureId> scanned_keys_;
  std::multimap<SignatureId, SignatureId> keys_by_signature_;
  CudaDevices* cuda_devices_ = nullptr;           // made on the first CUDA signature; never freed
  bool cuda_unavailable_logged_ = false;
  std::vector<CudaPending> cuda_pending_;
  std::vector<Notice> deferred_;                  // KernelReady notices waiting for a trial's end
};

}  // namespace kforge::hook

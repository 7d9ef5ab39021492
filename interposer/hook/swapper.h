// Swapper: the loader, and the owner of the hook's ReplacementTable (steps 6-8 of DESIGN.md's "One
// signature's life", CPU backend only for now).
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
//             then the entry on the same inputs, and compares (interceptor.cc, Note [Shadow
//             comparison])
//   active    after KFORGE_SHADOW_CALLS clean shadow calls (KFORGE_MODE=active only): each call
//             runs the entry alone
//   disabled  a comparison failed, or the entry's launch failed or threw: the table no longer has
//             the signature (PyTorch's kernel runs) and the entry is quarantined in the cache
// Every change publishes a new immutable table (copy + atomic pointer swap); old tables,
// Replacements, specs, plans and modules are never freed.
//
// Threads: on_round runs on the recorder's reporter thread and does every piece of I/O (cache
// open, manifest scans, blob reads, module loads, state changes, trial markers, log lines about
// failures). shadow_clean and fail run on calling threads: they take mu_ briefly, publish tables
// and queue events for on_round, nothing else. mu_ is never held during I/O.
//
// Finding an entry (Note [Environment rule]): the Store's key includes the whole Environment, and
// the hook cannot know the compiler a worker used, so the loader does not call Store::lookup; it
// scans the cache's manifests once per process (and new keys again on later rounds) and uses an
// entry for signature S when its signature equals S, its backend and its spec's backend are CPU,
// its state is active, and its environment equals cpu_host_environment(<this torch version>) in
// every field except `compiler`. Several matches: the lowest key wins.
//
// Note [Trial marker]
// Before an entry's first replacement launch the loader writes <cache>/trial/<entry key> (its
// content is the writer's pid) and removes it when the trial passed (shadow_target clean shadow
// calls), when the entry is quarantined, or when the process exits normally during its trial. On
// its first round in shadow or active mode, the loader quarantines ("process died during trial")
// the entry of every marker whose writer is not alive, and removes the marker. A marker of a
// process that is still alive (another process in its own trial) is left alone. Observe mode
// never opens the cache, so it neither writes nor reads markers.
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

namespace kforge::hook {

struct SwapperOptions {
  HookMode mode = HookMode::kObserve;
  uint32_t shadow_calls = 20;
  bool log = false;                // KFORGE_LOG: also log loads and activations
  Environment host_env;            // cpu_host_environment(torch version)
  std::string cache_root;          // resolved cache directory; empty with cache_error set
  std::string cache_error;
};

struct SwapStats {
  struct Entry {
    SignatureId id;
    std::string key;               // entry key, hex
    std::string state;             // shadow | active | disabled
    std::string reason;            // why disabled
    uint64_t shadow_calls = 0, active_calls = 0, fallbacks = 0, clean_shadow_calls = 0;
  };
  bool enabled = false;            // mode is shadow or active
  std::string cache_dir;
  std::string cache_error;         // why no cache is used, if none is
  uint64_t markers_quarantined = 0;
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

  // Calling threads. Never throw, never do I/O.
  void shadow_clean(const Replacement& r) noexcept;
  void fail(const Replacement& r, std::string reason) noexcept;

  SwapStats stats() const;

 private:
  struct Record {
    const Replacement* current = nullptr;   // null: disabled
    SwapCounters* counters = nullptr;
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
  void consider(const OpSignature& sig);
  std::optional<StoredEntry> find_entry(const OpSignature& sig);
  std::string marker_path(const SignatureId& key) const;
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
  std::map<SignatureId, int32_t> open_trials_;   // entry key -> pid that wrote its marker
  uint64_t markers_quarantined_ = 0;
  uint64_t quarantined_ = 0;
  std::string store_error_;

  // Reporter thread only.
  bool store_tried_ = false;
  std::optional<Store> store_;
  std::set<SignatureId> looked_up_;               // signature ids
  std::set<SignatureId> scanned_keys_;
  std::multimap<SignatureId, SignatureId> keys_by_signature_;
};

}  // namespace kforge::hook

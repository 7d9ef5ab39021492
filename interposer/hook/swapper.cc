#include "interposer/hook/swapper.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "interposer/hook/cuda_devices.h"
#include "interposer/hook/log.h"
#include "runtime/cpu_backend.h"
#include "runtime/human_units.h"
#include "runtime/kernel_spec.h"

namespace kforge::hook {

namespace {

std::atomic<Swapper*> g_swapper{nullptr};

// The entry's environment with the one field the hook cannot know replaced by the host's.
Environment as_seen_by(const Environment& host, Environment entry) {
  if (host.backend == Backend::kCpu) entry.compiler = host.compiler;
  if (host.backend == Backend::kCuda) entry.nvrtc_version = host.nvrtc_version;
  return entry;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += (out.empty() ? "" : ", ") + l;
  return out;
}

std::string cuda_device_name(int ordinal) { return "cuda:" + std::to_string(ordinal); }

std::string device_list(const std::vector<int>& ordinals) {
  std::string out;
  for (int d : ordinals) out += (out.empty() ? "" : ", ") + cuda_device_name(d);
  return out;
}

// Which kernel an entry holds: its blobs, source, options and publication time (the daemon
// republishes a better kernel under the same key, Note [Daemon notices]).
std::string content_of(const std::vector<BlobRef>& blobs, const KernelSpec& spec, int64_t created_unix_ms) {
  std::string out;
  for (const BlobRef& b : blobs) out += b.name + ":" + b.sha256_hex + ",";
  return out + spec.id().hex() + "@" + std::to_string(created_unix_ms);
}

std::string content_of(const StoredEntry& e) { return content_of(e.blobs, e.spec, e.provenance.created_unix_ms); }

std::string lost_id(const SignatureId& key, const std::string& content) { return key.hex() + "/" + content; }

// The version an upgrade sets aside, for logs. The daemon republishes a better kernel under the
// same key, so "entry K replaces entry K" would name one entry twice: name the speedup instead.
std::string earlier_version(const SignatureId& previous, double previous_speedup, const SignatureId& next) {
  char x[32];
  std::snprintf(x, sizeof x, "%.2fx", previous_speedup);
  return previous == next ? std::string("this entry's earlier version (") + x + " in the cache)"
                          : "entry " + previous.hex() + " (" + x + " in the cache)";
}

std::string verdict_text(const WinVerdict& v) {
  return "entry " + human_duration_ns(static_cast<double>(v.entry_median_ns)) + " vs PyTorch " + human_duration_ns(static_cast<double>(v.pytorch_median_ns)) + " (medians of " +
         std::to_string(v.pairs) + " paired calls, entry faster in " + std::to_string(v.entry_faster) + ")";
}

uint64_t median_of(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const uint64_t hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const uint64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lo + (hi - lo) / 2;
}

// The trial's timed pairs from the counters' ring (Note [In-process win]): the shadow calls' pairs,
// or with a timing phase its `timing_pairs` (Note [Timing phase]).
WinVerdict judge_counters(const SwapCounters& c, uint32_t timing_pairs) {
  const uint32_t n = timing_pairs > 0 ? std::min<uint32_t>(timing_pairs, SwapCounters::kTimedPairs)
                                      : std::min<uint32_t>(c.timed_pairs.load(std::memory_order_acquire), SwapCounters::kTimedPairs);
  std::vector<uint64_t> pytorch, entry;
  pytorch.reserve(n);
  entry.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t p = c.pytorch_ns[i].load(std::memory_order_relaxed);
    const uint64_t e = c.entry_ns[i].load(std::memory_order_relaxed);
    if (p == 0 || e == 0) continue;   // a slot whose call is still being counted
    pytorch.push_back(p);
    entry.push_back(e);
  }
  return judge_in_process_win(pytorch, entry);
}

bool pid_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) == 0) return true;
  return errno == EPERM;
}

}  // namespace

// Note [Environment rule] in swapper.h.
bool entry_environment_matches(const Environment& host, const Environment& entry) {
  return as_seen_by(host, entry) == host;
}

std::vector<std::string> entry_environment_differences(const Environment& host, const Environment& entry) {
  return host.differences(as_seen_by(host, entry));
}

// Note [In-process win].
WinVerdict judge_in_process_win(std::span<const uint64_t> pytorch_ns, std::span<const uint64_t> entry_ns) {
  WinVerdict v;
  const size_t n = std::min(pytorch_ns.size(), entry_ns.size());
  v.pairs = static_cast<uint32_t>(n);
  if (n == 0) return v;   // nothing measured: no win is shown
  for (size_t i = 0; i < n; ++i) v.entry_faster += entry_ns[i] < pytorch_ns[i] ? 1 : 0;
  v.pytorch_median_ns = median_of(std::vector<uint64_t>(pytorch_ns.begin(), pytorch_ns.begin() + static_cast<std::ptrdiff_t>(n)));
  v.entry_median_ns = median_of(std::vector<uint64_t>(entry_ns.begin(), entry_ns.begin() + static_cast<std::ptrdiff_t>(n)));
  v.win = static_cast<double>(v.entry_median_ns) <= 0.97 * static_cast<double>(v.pytorch_median_ns) &&
          3 * uint64_t{v.entry_faster} >= 2 * uint64_t{v.pairs};
  return v;
}

double in_process_speedup(const WinVerdict& v) {
  if (v.pairs == 0 || v.entry_median_ns == 0 || v.pytorch_median_ns == 0) return 0;
  return static_cast<double>(v.pytorch_median_ns) / static_cast<double>(v.entry_median_ns);
}

bool upgrade_pays(const WinVerdict& next, const WinVerdict& previous) {
  const double a = in_process_speedup(next), b = in_process_speedup(previous);
  return a == 0 || b == 0 || a >= b;   // Note [Upgrade pays]
}

Swapper::Swapper(SwapperOptions options) : options_(std::move(options)) {}

void Swapper::install_process_handlers() {
  g_swapper.store(this, std::memory_order_release);
  ::pthread_atfork(&Swapper::before_fork, &Swapper::after_fork, &Swapper::after_fork);
  std::atexit(&Swapper::at_exit);
}

void Swapper::before_fork() noexcept {
  if (Swapper* s = g_swapper.load(std::memory_order_acquire)) s->mu_.lock();
}

void Swapper::after_fork() noexcept {
  if (Swapper* s = g_swapper.load(std::memory_order_acquire)) s->mu_.unlock();
}

// A normal exit during a trial is not a crash: remove this process's markers.
void Swapper::at_exit() noexcept {
  Swapper* s = g_swapper.load(std::memory_order_acquire);
  if (s == nullptr) return;
  std::vector<SignatureId> mine;
  try {
    std::lock_guard<std::mutex> lock(s->mu_);
    const int32_t pid = static_cast<int32_t>(::getpid());
    for (auto it = s->open_trials_.begin(); it != s->open_trials_.end();) {
      if (it->second == pid) {
        mine.push_back(it->first);
        it = s->open_trials_.erase(it);
      } else {
        ++it;
      }
    }
  } catch (...) {
    return;
  }
  for (const SignatureId& k : mine) s->remove_marker(k);
}

void Swapper::wake() noexcept {
  try {
    if (wake_) wake_();
  } catch (...) {
  }
}

void Swapper::publish_locked() {
  std::vector<std::pair<SignatureId, const Replacement*>> entries;
  ObserveMask observe_mask;   // the operators with a replacement: every call of them is observed
  for (const auto& [id, rec] : records_) {
    if (rec.current == nullptr) continue;
    // Note [End-to-end A/B]: a table without some active entries, for a window. Entries on trial
    // stay (the driver only switches when none is).
    if (rec.current->state == SwapState::kActive &&
        (ab_table_ == AbTable::kNone || (ab_table_ == AbTable::kWithout && id == ab_without_))) {
      continue;
    }
    entries.emplace_back(id, rec.current);
    observe_mask |= rec.observe_bits;
  }
  ReplacementTable::publish(ReplacementTable::build(std::move(entries), observe_mask));
}

void Swapper::set_ab_table(AbTable table, SignatureId without) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    ab_table_ = table;
    ab_without_ = without;
    publish_locked();
  } catch (...) {
    // Out of memory building a table: the previous one stays; the window is then mislabelled,
    // which an allocation failure here makes the least of the process's problems.
  }
}

bool Swapper::ab_ready(std::vector<std::pair<SignatureId, std::string>>* active) const noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    active->clear();
    bool ready = true;
    for (const auto& [id, rec] : records_) {
      if (rec.current == nullptr) continue;
      if (rec.current->state == SwapState::kActive) {
        active->emplace_back(id, rec.key.hex());
      } else if (!rec.trial_ended) {
        ready = false;   // on trial
      }
    }
    return ready;
  } catch (...) {
    return false;
  }
}

std::string Swapper::drop_current_locked(Record& rec, const std::string& state, const std::string& reason) {
  if (rec.previous) {
    std::unique_ptr<Record> previous = std::move(rec.previous);
    rec = std::move(*previous);
    return "entry " + rec.key.hex() + " runs again (" + rec.state + ")";
  }
  rec.current = nullptr;
  rec.state = state;
  rec.reason = reason;
  return {};
}

void Swapper::shadow_clean(const Replacement& r, uint64_t pytorch_ns, uint64_t entry_ns) noexcept {
  SwapCounters& c = *r.counters;
  const bool timing_phase = r.timing_pairs > 0 && r.activate_after_shadow;   // Note [Timing phase]
  if (pytorch_ns > 0 && entry_ns > 0 && !timing_phase) {
    const uint32_t slot = c.timed_pairs.fetch_add(1, std::memory_order_relaxed) % SwapCounters::kTimedPairs;
    c.pytorch_ns[slot].store(pytorch_ns, std::memory_order_relaxed);
    c.entry_ns[slot].store(entry_ns, std::memory_order_relaxed);
  }
  // acq_rel: the call that reaches the target sees every earlier call's times (SwapCounters).
  const uint32_t n = c.clean_shadow_calls.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (n != r.shadow_target) return;   // exactly one call reaches the target
  if (!timing_phase) return end_trial(r, judge_counters(c, 0));
  try {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(r.id);
    if (it == records_.end() || !is_current(it->second, r)) return;   // disabled meanwhile
    auto* timing = new Replacement(r);   // never freed
    timing->state = SwapState::kTiming;
    it->second.current = timing;          // rec.state stays "shadow": still on trial
    publish_locked();
  } catch (...) {
    // Out of memory: the entry stays in shadow, which is safe.
  }
}

void Swapper::timing_call(const Replacement& r, uint64_t k, uint64_t ns) noexcept {
  SwapCounters& c = *r.counters;
  const uint64_t pair = k / 2;
  if (pair >= r.timing_pairs) return;   // past the phase (a call from an older table)
  // ns 0: the call threw; it still counts, so that the phase ends (its pair is not judged).
  if (ns > 0) (timing_turn_is_entry(k) ? c.entry_ns : c.pytorch_ns)[pair].store(ns, std::memory_order_relaxed);
  // acq_rel: the call that completes the phase sees every earlier call's time.
  const uint32_t n = c.timing_done.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (n != 2 * r.timing_pairs) return;   // exactly one call completes it
  end_trial(r, judge_counters(c, r.timing_pairs));
}

void Swapper::end_trial(const Replacement& r, const WinVerdict& verdict) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(r.id);
      if (it == records_.end() || !is_current(it->second, r)) return;   // disabled meanwhile
      Record& rec = it->second;
      rec.trial_ended = true;
      rec.verdict = verdict;
      if (r.confirm_win && !verdict.win) {
        Event e{Event::Kind::kNoWin, rec.key, rec.label, {}, rec.content, verdict, {}, {}};
        lost_here_.insert(lost_id(rec.key, rec.content));
        e.restored = drop_current_locked(rec, "no_win", "no win in this process: " + verdict_text(verdict));
        publish_locked();
        events_.push_back(std::move(e));
      } else if (rec.previous && r.confirm_win && !upgrade_pays(verdict, rec.previous->verdict)) {
        // Note [Upgrade pays]: faster than PyTorch's kernel, not than the version kept aside.
        char text[96];
        std::snprintf(text, sizeof text, "%.2fx PyTorch's kernel here, the version in use %.2fx",
                      in_process_speedup(verdict), in_process_speedup(rec.previous->verdict));
        Event e{Event::Kind::kNotBetter, rec.key, rec.label, text, rec.content, verdict, {}, {}};
        lost_here_.insert(lost_id(rec.key, rec.content));
        ++upgrades_declined_;
        e.restored = drop_current_locked(rec, "no_win", std::string("not faster here than the version in use: ") + text);
        publish_locked();
        events_.push_back(std::move(e));
      } else {
        Event e{Event::Kind::kTrialPassed, rec.key, rec.label, {}, {}, verdict, {}, {}};
        if (rec.previous) {   // an upgrade passed: the entry kept aside is retired
          e.replaced = earlier_version(rec.previous->key, rec.previous->speedup, rec.key);
          rec.previous.reset();
          ++upgrades_;
        }
        if (r.activate_after_shadow) {
          auto* active = new Replacement(r);   // never freed
          active->state = SwapState::kActive;
          rec.current = active;
          rec.state = "active";
        }
        publish_locked();
        events_.push_back(std::move(e));
      }
    }
    wake();
  } catch (...) {
    // Out of memory: the entry stays in shadow, which is safe.
  }
}

void Swapper::fail(const Replacement& r, std::string reason) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(r.id);
      if (it == records_.end()) return;
      Record& rec = it->second;
      Event e{Event::Kind::kQuarantine, r.key, rec.label, reason, {}, {}, {}, {}};
      if (is_current(rec, r)) {
        e.restored = drop_current_locked(rec, "disabled", reason);
      } else if (rec.previous && is_current(*rec.previous, r)) {
        rec.previous.reset();   // the entry kept aside failed (a call from an older table): nothing to go back to
      } else {
        return;   // already disabled
      }
      publish_locked();
      events_.push_back(std::move(e));
    }
    wake();
  } catch (...) {
    // publish_locked allocates; if it could not, try the cheapest way out: an empty table.
    ReplacementTable::publish(ReplacementTable::build({}));
  }
}

SwapStats Swapper::stats() const {
  SwapStats st;
  st.enabled = options_.mode != HookMode::kObserve;
  st.cache_dir = options_.cache_root;
  std::lock_guard<std::mutex> lock(mu_);
  st.cache_error = options_.cache_error.empty() ? store_error_ : options_.cache_error;
  st.markers_quarantined = markers_quarantined_;
  st.notices = notices_received_;
  st.quarantined = quarantined_;
  st.upgrades = upgrades_;
  st.upgrades_declined = upgrades_declined_;
  st.revoked_in_cache = revoked_in_cache_;
  for (const auto& [id, rec] : records_) {
    SwapStats::Entry e;
    e.id = id;
    e.key = rec.key.hex();
    e.backend = rec.backend;
    e.state = rec.state;
    e.reason = rec.reason;
    e.pytorch_median_ns = rec.verdict.pytorch_median_ns;
    e.entry_median_ns = rec.verdict.entry_median_ns;
    e.timed_calls = rec.verdict.pairs;
    e.speedup = rec.speedup;
    if (rec.previous) {
      e.previous_key = rec.previous->key.hex();
      e.previous_state = rec.previous->state;
    }
    e.shadow_calls = rec.counters->shadow_calls.load(std::memory_order_relaxed);
    e.active_calls = rec.counters->active_calls.load(std::memory_order_relaxed);
    e.timing_calls = rec.counters->timing_calls.load(std::memory_order_relaxed);
    e.fallbacks = rec.counters->fallbacks.load(std::memory_order_relaxed);
    e.clean_shadow_calls = rec.counters->clean_shadow_calls.load(std::memory_order_relaxed);
    e.unloaded_device_calls = rec.counters->unloaded_device_calls.load(std::memory_order_relaxed);
    e.capture_shadow_skips = rec.counters->capture_shadow_skips.load(std::memory_order_relaxed);
    e.memory_shadow_skips = rec.counters->memory_shadow_skips.load(std::memory_order_relaxed);
    if (rec.cuda != nullptr) {
      for (int d = 0; d < CudaModules::kMaxDevices; ++d) {
        if (rec.cuda->on_device(d) != nullptr) e.devices.push_back(d);
      }
    }
    st.entries.push_back(std::move(e));
  }
  return st;
}

// ---- the reporter thread's side -----------------------------------------------------------------

bool Swapper::ensure_store() {
  if (store_) return true;
  if (store_tried_) return false;
  store_tried_ = true;
  std::string error = options_.cache_error;
  if (error.empty()) {
    StatusOr<Store> s = Store::open(options_.cache_root);
    if (s.ok()) {
      store_.emplace(std::move(*s));
      recover_markers();
      return true;
    }
    error = s.status().message();
  }
  log_line("cannot open the kernel cache (" + error + "); no kernels are swapped in this process");
  std::lock_guard<std::mutex> lock(mu_);
  store_error_ = error;
  return false;
}

bool Swapper::write_marker(const SignatureId& key, std::string& error) {
  const Status s = store_->write_trial_marker(key, static_cast<int32_t>(::getpid()));
  if (!s.ok()) error = "cannot write its trial marker: " + s.message();
  return s.ok();
}

void Swapper::remove_marker(const SignatureId& key) {
  if (!store_) return;
  (void)store_->remove_trial_marker(key);
}

void Swapper::recover_markers() {
  StatusOr<std::vector<Store::TrialMarker>> markers = store_->trial_markers();
  if (!markers.ok()) return;
  for (const Store::TrialMarker& m : *markers) {
    if (m.pid != static_cast<int32_t>(::getpid()) && pid_alive(m.pid)) continue;   // in its own trial
    StatusOr<StoredEntry> entry = store_->load(m.key);
    if (entry.ok()) {
      const Status s = store_->set_state(m.key, EntryState::kQuarantined, "process died during trial");
      if (s.ok()) {
        log_line("entry " + m.key.hex() + " for " + entry->signature.to_string() +
                 " quarantined: a process (pid " + std::to_string(m.pid) + ") died during its trial");
        std::lock_guard<std::mutex> lock(mu_);
        ++markers_quarantined_;
      } else {
        log_line("entry " + m.key.hex() + ": a process died during its trial, but quarantining it failed: " +
                 s.message());
        continue;   // keep the marker: the next process tries again
      }
    }
    remove_marker(m.key);
  }
}

void Swapper::process_events() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(events_);
  }
  for (const Event& e : events) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_trials_.erase(e.key);
    }
    remove_marker(e.key);   // the trial ended, whichever way: no crash to record
    const std::string where = "entry " + e.key.hex() + " for " + e.label;
    const std::string then = e.restored.empty() ? "PyTorch's kernel runs" : e.restored;
    switch (e.kind) {
      case Event::Kind::kTrialPassed:
        if (options_.log || !e.replaced.empty()) {
          std::string line = where + " passed its trial (" + std::to_string(options_.shadow_calls) + " clean shadow calls";
          if (e.verdict.pairs > 0) line += "; " + verdict_text(e.verdict);
          line += ")";
          line += options_.mode == HookMode::kActive ? "; it is active" : "; it stays in shadow (KFORGE_MODE=shadow)";
          if (!e.replaced.empty()) line += "; it replaces " + e.replaced;
          log_line(line);
        }
        break;
      case Event::Kind::kNoWin: {
        Status s = store_ ? store_->write_no_win_record({e.key, static_cast<int32_t>(::getpid()),
                                                         e.verdict.entry_median_ns, e.verdict.pytorch_median_ns, {}})
                          : Status(unavailable("no cache"));
        log_line(where + " is correct but not faster in this process: " + verdict_text(e.verdict) + "; " + then +
                 (s.ok() ? "" : " (its no-win record was not written: " + s.message() + ")"));
        break;
      }
      case Event::Kind::kNotBetter:
        log_line(where + " is faster than PyTorch's kernel but not than the version in use in this process (" + e.reason +
                 "; " + verdict_text(e.verdict) + "); " + then);
        break;
      case Event::Kind::kQuarantine: {
        const Status s = store_ ? store_->set_state(e.key, EntryState::kQuarantined, e.reason)
                                : Status(unavailable("no cache"));
        if (s.ok()) {
          std::lock_guard<std::mutex> lock(mu_);
          ++quarantined_;
        }
        log_line(where + " disabled: " + e.reason +
                 (s.ok() ? "; quarantined in the cache" : "; quarantining it failed: " + s.message()) + "; " + then);
        break;
      }
    }
  }
}

std::optional<StoredEntry> Swapper::find_entry(const OpSignature& sig, const EnvironmentCheck& fits) {
  StatusOr<std::vector<EntryKey>> keys = store_->list();
  if (!keys.ok()) return std::nullopt;
  for (const EntryKey& k : *keys) {
    if (!scanned_keys_.insert(k).second) continue;
    StatusOr<StoredEntry> e = store_->load(k);
    if (e.ok()) {
      keys_by_signature_.emplace(e->signature.id(), k);
    } else if (e.status().code() != StatusCode::kNotFound) {   // not found: removed since the scan
      // Once per entry and process (scanned_keys_): a damaged entry is skipped, never loaded.
      log_line("cache entry " + k.hex() + " skipped: " + e.status().message() + " (kforge cache verify names every bad file)");
    }
  }
  const SignatureId id = sig.id();
  std::vector<EntryKey> candidates;
  for (auto [it, end] = keys_by_signature_.equal_range(id); it != end; ++it) candidates.push_back(it->second);
  std::sort(candidates.begin(), candidates.end());
  for (const EntryKey& k : candidates) {
    StatusOr<StoredEntry> e = store_->load(k);   // again: its state may have changed
    if (e.ok() && usable_here(sig, *e, fits)) return std::move(*e);
  }
  return std::nullopt;
}

bool Swapper::usable_here(const OpSignature& sig, const StoredEntry& e, const EnvironmentCheck& fits) {
  const Backend backend = sig.target.backend;
  if (!(e.signature == sig) || e.environment.backend != backend || e.spec.backend != backend || !e.status.usable()) {
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_here_.count(lost_id(e.key, content_of(e)))) return false;   // Note [In-process win]
  }
  if (std::string why = fits(e.environment); !why.empty()) {
    if (options_.log) log_line("entry " + e.key.hex() + " for " + sig.to_string() + " not used: " + why);
    return false;
  }
  return true;
}

std::optional<StoredEntry> Swapper::upgrade_entry(const OpSignature& sig, const EntryKey& key,
                                                  const EnvironmentCheck& fits) {
  const std::string where = "entry " + key.hex() + " for " + sig.to_string();
  auto skip = [&](const std::string& why) -> std::optional<StoredEntry> {
    if (options_.log) log_line(where + " is ready (daemon), but is not taken: " + why);
    return std::nullopt;
  };
  StatusOr<StoredEntry> e = store_->load(key);
  if (!e.ok()) return skip(e.status().message());
  if (!usable_here(sig, *e, fits)) return skip("it is not usable here (signature, backend, state or environment)");
  const std::string content = content_of(*e);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(sig.id());
  if (it == records_.end() || it->second.current == nullptr) return skip("no entry is in use for it any more");
  const Record& rec = it->second;
  if (rec.key == key && rec.content == content) return skip("it is the entry in use");
  if (!(e->timings.speedup() > rec.speedup)) {
    return skip("its speedup in the cache (" + std::to_string(e->timings.speedup()) + "x) is not above entry " +
                rec.key.hex() + "'s (" + std::to_string(rec.speedup) + "x)");
  }
  return std::move(*e);
}

void Swapper::consider(const OpSignature& sig, const std::optional<EntryKey>& announced) {
  switch (sig.target.backend) {
    case Backend::kCpu: return consider_cpu(sig, announced);
    case Backend::kCuda: return consider_cuda(sig, announced);
  }
}

void Swapper::consider_cpu(const OpSignature& sig, const std::optional<EntryKey>& announced) {
  const EnvironmentCheck fits = [&](const Environment& env) -> std::string {
    const std::vector<std::string> diff = entry_environment_differences(options_.host_env, env);
    return diff.empty() ? std::string() : "its environment differs from this host's (here != entry: " + join(diff) + ")";
  };
  std::optional<StoredEntry> entry = announced ? upgrade_entry(sig, *announced, fits) : find_entry(sig, fits);
  if (!entry) return;
  const std::string where = "entry " + entry->key.hex() + " for " + sig.to_string();
  auto give_up = [&](const std::string& why) { log_line(where + " not used: " + why); };

  const BlobRef* so = nullptr;
  for (const BlobRef& b : entry->blobs) {
    if (b.name == "so") so = &b;
  }
  if (so == nullptr) return give_up("it has no blob named \"so\"");
  StatusOr<std::string> image = store_->read_blob(*so);
  if (!image.ok()) return give_up(image.status().message());
  StatusOr<CpuModule> module = CpuModule::load_image(*image, "kforge-" + entry->key.hex());
  if (!module.ok()) return give_up(module.status().message());
  auto* mod = new CpuModule(std::move(*module));   // never freed: code may still run
  for (const std::string& ep : entry->spec.entry_points) {
    if (StatusOr<kforge_cpu_entry> fn = mod->entry(ep); !fn.ok()) return give_up(fn.status().message());
  }
  StatusOr<ResolvedLaunchPlan> plan = entry->spec.resolve(sig);
  if (!plan.ok()) return give_up("its launch plan does not resolve: " + plan.status().message());

  auto* r = new Replacement();
  r->backend = Backend::kCpu;
  r->spec = new KernelSpec(std::move(entry->spec));
  r->plan = new ResolvedLaunchPlan(std::move(*plan));
  r->module = mod;
  (void)publish_new(sig, *entry, r, "", announced.has_value());
}

void Swapper::consider_cuda(const OpSignature& sig, const std::optional<EntryKey>& announced) {
  if (cuda_devices_ == nullptr) cuda_devices_ = new CudaDevices(options_.host_env.torch_version);
  CudaDevices& devs = *cuda_devices_;
  if (devs.driver() == nullptr) {
    if (!cuda_unavailable_logged_) {
      cuda_unavailable_logged_ = true;
      log_line("no CUDA entries are used in this process: " + devs.error());
    }
    return;
  }
  // The devices a call of this signature can run on: those of its target arch.
  std::vector<int> devices;
  for (int d = 0; d < devs.count(); ++d) {
    const StatusOr<Environment>& env = devs.environment(d);
    if (env.ok() && env->arch == sig.target.arch) devices.push_back(d);
  }
  if (devices.empty()) return;
  const EnvironmentCheck fits = [&](const Environment& env) -> std::string {
    std::string why;
    for (int d : devices) {
      const std::vector<std::string> diff = entry_environment_differences(*devs.environment(d), env);
      if (diff.empty()) return {};
      why += (why.empty() ? "" : "; ") + cuda_device_name(d) + ": " + join(diff);
    }
    return "its environment matches no CUDA device here (here != entry: " + why + ")";
  };
  std::optional<StoredEntry> entry = announced ? upgrade_entry(sig, *announced, fits) : find_entry(sig, fits);
  if (!entry) return;
  const std::string where = "entry " + entry->key.hex() + " for " + sig.to_string();
  auto give_up = [&](const std::string& why) { log_line(where + " not used: " + why); };

  StatusOr<std::string> image =
      cuda_entry_image(entry->blobs, [&](const BlobRef& b) { return store_->read_blob(b); });
  if (!image.ok()) return give_up(image.status().message());
  StatusOr<ResolvedLaunchPlan> plan = entry->spec.resolve(sig);
  if (!plan.ok()) return give_up("its launch plan does not resolve: " + plan.status().message());

  auto spec = std::make_unique<KernelSpec>(std::move(entry->spec));
  CudaPending pending;
  pending.id = sig.id();
  pending.where = where;
  pending.environment = entry->environment;
  pending.spec = spec.get();
  pending.image = std::move(*image);
  pending.modules = new CudaModules(devs.driver());   // never freed, like its modules
  std::vector<int> loaded;
  for (int d : devices) {
    if (!entry_environment_matches(*devs.environment(d), entry->environment)) continue;
    switch (load_on_device(pending, d)) {
      case 1: loaded.push_back(d); break;
      case 0: pending.waiting.push_back(d); break;
      default: break;   // logged
    }
  }
  if (loaded.empty() && pending.waiting.empty()) return give_up("it could not be loaded on any CUDA device");

  auto* r = new Replacement();
  r->backend = Backend::kCuda;
  r->spec = spec.release();
  r->plan = new ResolvedLaunchPlan(std::move(*plan));
  r->cuda = pending.modules;
  std::string on = " on " + (loaded.empty() ? std::string("no device yet") : device_list(loaded));
  if (!pending.waiting.empty()) on += " (later on " + device_list(pending.waiting) + " once torch uses it)";
  if (!publish_new(sig, *entry, r, on, announced.has_value())) return;
  if (!pending.waiting.empty()) cuda_pending_.push_back(std::move(pending));
}

int Swapper::load_on_device(CudaPending& p, int ordinal) {
  CudaDevices& devs = *cuda_devices_;
  StatusOr<bool> active = devs.primary_context_active(ordinal);
  if (active.ok() && !*active) return 0;
  StatusOr<const CudaDeviceModule*> module =
      active.ok() ? devs.load(ordinal, p.image, *p.spec) : StatusOr<const CudaDeviceModule*>(active.status());
  if (!module.ok()) {
    log_line(p.where + " not loaded on " + cuda_device_name(ordinal) + ": " + module.status().message() +
             "; PyTorch's kernel runs there");
    return -1;
  }
  p.modules->by_device[ordinal].store(*module, std::memory_order_release);
  return 1;
}

void Swapper::retry_cuda_pending() {
  for (auto it = cuda_pending_.begin(); it != cuda_pending_.end();) {
    bool in_use = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto rec = records_.find(it->id);
      in_use = rec != records_.end() && rec->second.current != nullptr;
    }
    if (in_use) {
      std::vector<int> still_waiting;
      for (int d : it->waiting) {
        const int got = load_on_device(*it, d);
        if (got == 0) still_waiting.push_back(d);
        if (got == 1 && options_.log) log_line(it->where + " loaded on " + cuda_device_name(d) + " too");
      }
      it->waiting = std::move(still_waiting);
    }
    if (!in_use || it->waiting.empty()) {
      it = cuda_pending_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Swapper::publish_new(const OpSignature& sig, const StoredEntry& entry, Replacement* r, const std::string& on,
                          bool upgrade) {
  const std::string label = sig.to_string();
  const std::string where = "entry " + entry.key.hex() + " for " + label;
  std::string marker_error;
  if (!write_marker(entry.key, marker_error)) {
    log_line(where + " not used: " + marker_error);
    return false;
  }
  r->id = sig.id();
  r->key = entry.key;
  r->state = SwapState::kShadow;
  r->shadow_target = options_.shadow_calls;
  r->activate_after_shadow = options_.mode == HookMode::kActive;
  r->confirm_win = options_.confirm_win;
  // Note [Timing phase]: CPU entries; a CUDA entry's win is judged on its shadow calls' events.
  r->timing_pairs = r->backend == Backend::kCpu && options_.confirm_win
                        ? std::min<uint32_t>(options_.timing_pairs, SwapCounters::kTimedPairs)
                        : 0;
  r->counters = new SwapCounters();
  r->owner = this;
  std::string aside;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_trials_[entry.key] = static_cast<int32_t>(::getpid());
    Record& rec = records_[r->id];
    // An upgrade keeps the entry in use aside (Note [Daemon notices]); if that entry went out
    // since upgrade_entry looked, this is an ordinary trial.
    std::unique_ptr<Record> previous;
    if (upgrade && rec.current != nullptr && !rec.previous) {
      aside = earlier_version(rec.key, rec.speedup, entry.key);
      previous = std::make_unique<Record>(std::move(rec));
    }
    rec = Record();
    rec.previous = std::move(previous);
    rec.current = r;
    rec.counters = r->counters;
    rec.cuda = r->cuda;
    rec.backend = r->backend;
    rec.observe_bits = ObserveSlots::instance().mask(sig.op, sig.overload, sig.target.backend);
    rec.key = entry.key;
    rec.content = content_of(entry.blobs, *r->spec, entry.provenance.created_unix_ms);   // entry.spec was moved into r
    rec.speedup = entry.timings.speedup();
    rec.label = label;
    rec.state = "shadow";
    publish_locked();
  }
  (void)store_->touch(entry.key);   // for gc's least-recently-used order; failure is harmless
  if (options_.log || !aside.empty()) {
    log_line(where + " loaded" + on + "; shadow for " + std::to_string(options_.shadow_calls) + " calls" +
             (aside.empty() ? std::string() : " (an upgrade: " + aside + " is kept aside until the trial ends)"));
  }
  return true;
}

void Swapper::on_daemon_message(const wire::WireMessage& message) noexcept {
  if (options_.mode == HookMode::kObserve) return;
  try {
    Notice n;
    if (const auto* ready = std::get_if<wire::KernelReady>(&message)) {
      n.signature = ready->signature_id;
      n.entry_key = ready->entry_key;
    } else if (const auto* revoke = std::get_if<wire::Revoke>(&message)) {
      n.revoke = true;
      n.signature = revoke->signature_id;
      n.entry_key = revoke->entry_key;
      n.reason = revoke->reason;
    } else {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      notices_.push_back(std::move(n));
      ++notices_received_;
    }
    wake();
  } catch (...) {
    // Out of memory: the notice is lost; a KernelReady's entry is still found by the next process.
  }
}

void Swapper::process_notices() {
  std::vector<Notice> notices;
  notices.swap(deferred_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Notice& n : notices_) notices.push_back(std::move(n));
    notices_.clear();
  }
  for (Notice& n : notices) {
    const auto seen = looked_up_.find(n.signature);
    if (seen == looked_up_.end()) continue;   // not a signature of this process (yet)
    const std::string label = seen->second->to_string();
    if (n.revoke) {
      std::optional<SignatureId> key;
      std::string then;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = records_.find(n.signature);
        if (it == records_.end()) continue;
        Record& rec = it->second;
        const std::string reason = "revoked by the daemon: " + n.reason;
        if (rec.previous && rec.previous->key.hex() == n.entry_key) rec.previous.reset();   // kept aside: dropped
        if (rec.current == nullptr || rec.key.hex() != n.entry_key) continue;
        key = rec.key;
        open_trials_.erase(rec.key);
        then = drop_current_locked(rec, "disabled", reason);
        publish_locked();
      }
      remove_marker(*key);
      log_line("entry " + n.entry_key + " for " + label + " revoked by the daemon (" + n.reason + "); " +
               (then.empty() ? "PyTorch's kernel runs" : then));
      continue;
    }
    enum class Use { kNone, kEnded, kOnTrial } use = Use::kNone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(n.signature);
      if (it != records_.end() && it->second.current != nullptr) {
        use = it->second.trial_ended && !it->second.previous ? Use::kEnded : Use::kOnTrial;
      }
    }
    if (use == Use::kOnTrial) {   // Note [Daemon notices]: looked at again when the trial has ended
      deferred_.push_back(std::move(n));
      continue;
    }
    if (use == Use::kEnded) {
      StatusOr<EntryKey> key = EntryKey::from_hex(n.entry_key);
      if (!key.ok()) continue;   // the wire decoder checked it; nothing to do with a bad one
      if (options_.log) log_line("entry " + n.entry_key + " for " + label + " is ready (daemon); an upgrade?");
      consider(*seen->second, *key);
      continue;
    }
    if (options_.log) log_line("entry " + n.entry_key + " for " + label + " is ready (daemon); looking it up");
    consider(*seen->second);
  }
}

void Swapper::check_cache_states() {
  // Which entries to ask about: those in use and those kept aside (by key; Store::status is cheap).
  std::set<SignatureId> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, rec] : records_) {
      if (rec.current != nullptr) keys.insert(rec.key);
      if (rec.previous && rec.previous->current != nullptr) keys.insert(rec.previous->key);
    }
  }
  for (const SignatureId& key : keys) {
    StatusOr<EntryStatus> st = store_->status(key);
    std::string how, why;   // how empty: still active in the cache
    if (!st.ok()) {
      if (st.status().code() != StatusCode::kNotFound) continue;   // cannot tell now: the next round asks again
      how = "removed from the cache";
    } else if (!st->usable()) {
      how = std::string(entry_state_name(st->state)) + " in the cache";
      if (!st->reason.empty()) why = " (" + st->reason + ")";
    }
    if (how.empty()) continue;
    std::vector<std::string> lines;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool changed = false;
      for (auto& [id, rec] : records_) {
        if (rec.previous && rec.previous->current != nullptr && rec.previous->key == key) {
          rec.previous.reset();
          changed = true;
        }
        if (rec.current == nullptr || rec.key != key) continue;
        open_trials_.erase(key);
        const std::string then = drop_current_locked(rec, "disabled", "entry " + how + why);
        lines.push_back("entry " + key.hex() + " for " + rec.label + " " + how + ": " +
                        (then.empty() ? "PyTorch's kernel runs" : then));
        ++revoked_in_cache_;
        changed = true;
      }
      if (changed) publish_locked();
    }
    if (!lines.empty()) remove_marker(key);
    for (const std::string& l : lines) log_line(l);
  }
}

void Swapper::on_round(const std::vector<std::shared_ptr<const OpSignature>>& new_signatures) noexcept {
  if (options_.mode == HookMode::kObserve) return;   // observe never opens the cache
  try {
    if (!ensure_store()) return;
    process_events();
    check_cache_states();
    retry_cuda_pending();
    for (const std::shared_ptr<const OpSignature>& sig : new_signatures) {
      if (!sig || !looked_up_.emplace(sig->id(), sig).second) continue;
      consider(*sig);
    }
    process_notices();
    process_events();
  } catch (const std::exception& e) {
    log_line(std::string("loader error: ") + e.what());
  } catch (...) {
    log_line("loader error");
  }
}

}  // namespace kforge::hook

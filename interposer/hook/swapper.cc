#include "interposer/hook/swapper.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "interposer/hook/cuda_devices.h"
#include "interposer/hook/log.h"
#include "runtime/cpu_backend.h"
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
    entries.emplace_back(id, rec.current);
    observe_mask |= rec.observe_bits;
  }
  ReplacementTable::publish(ReplacementTable::build(std::move(entries), observe_mask));
}

void Swapper::shadow_clean(const Replacement& r) noexcept {
  const uint32_t n = r.counters->clean_shadow_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n != r.shadow_target) return;   // exactly one call reaches the target
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(r.id);
      if (it == records_.end() || it->second.current != &r) return;   // disabled meanwhile
      Record& rec = it->second;
      events_.push_back({Event::Kind::kTrialPassed, rec.key, rec.label, {}});
      if (r.activate_after_shadow) {
        auto* active = new Replacement(r);   // never freed
        active->state = SwapState::kActive;
        rec.current = active;
        rec.state = "active";
        publish_locked();
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
      if (it == records_.end() || it->second.current == nullptr) return;   // already disabled
      Record& rec = it->second;
      rec.current = nullptr;
      rec.state = "disabled";
      rec.reason = reason;
      publish_locked();
      events_.push_back({Event::Kind::kQuarantine, rec.key, rec.label, std::move(reason)});
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
  for (const auto& [id, rec] : records_) {
    SwapStats::Entry e;
    e.id = id;
    e.key = rec.key.hex();
    e.backend = rec.backend;
    e.state = rec.state;
    e.reason = rec.reason;
    e.shadow_calls = rec.counters->shadow_calls.load(std::memory_order_relaxed);
    e.active_calls = rec.counters->active_calls.load(std::memory_order_relaxed);
    e.fallbacks = rec.counters->fallbacks.load(std::memory_order_relaxed);
    e.clean_shadow_calls = rec.counters->clean_shadow_calls.load(std::memory_order_relaxed);
    e.unloaded_device_calls = rec.counters->unloaded_device_calls.load(std::memory_order_relaxed);
    e.capture_shadow_skips = rec.counters->capture_shadow_skips.load(std::memory_order_relaxed);
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
    if (e.kind == Event::Kind::kTrialPassed) {
      remove_marker(e.key);
      if (options_.log) {
        log_line("entry " + e.key.hex() + " for " + e.label + " passed its trial (" +
                 std::to_string(options_.shadow_calls) + " clean shadow calls)" +
                 (options_.mode == HookMode::kActive ? "; it is active" : "; it stays in shadow (KFORGE_MODE=shadow)"));
      }
      continue;
    }
    const Status s = store_ ? store_->set_state(e.key, EntryState::kQuarantined, e.reason)
                            : Status(unavailable("no cache"));
    remove_marker(e.key);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++quarantined_;
    }
    log_line("entry " + e.key.hex() + " for " + e.label + " disabled: " + e.reason +
             (s.ok() ? "; quarantined in the cache" : "; quarantining it failed: " + s.message()) +
             "; PyTorch's kernel runs");
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
    if (!e.ok()) continue;
    const Backend backend = sig.target.backend;
    if (!(e->signature == sig) || e->environment.backend != backend || e->spec.backend != backend ||
        !e->status.usable()) {
      continue;
    }
    if (std::string why = fits(e->environment); !why.empty()) {
      if (options_.log) log_line("entry " + k.hex() + " for " + sig.to_string() + " not used: " + why);
      continue;
    }
    return std::move(*e);
  }
  return std::nullopt;
}

void Swapper::consider(const OpSignature& sig) {
  switch (sig.target.backend) {
    case Backend::kCpu: return consider_cpu(sig);
    case Backend::kCuda: return consider_cuda(sig);
  }
}

void Swapper::consider_cpu(const OpSignature& sig) {
  std::optional<StoredEntry> entry = find_entry(sig, [&](const Environment& env) -> std::string {
    const std::vector<std::string> diff = entry_environment_differences(options_.host_env, env);
    return diff.empty() ? std::string() : "its environment differs from this host's (here != entry: " + join(diff) + ")";
  });
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
  (void)publish_new(sig, *entry, r, "");
}

void Swapper::consider_cuda(const OpSignature& sig) {
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
  std::optional<StoredEntry> entry = find_entry(sig, [&](const Environment& env) -> std::string {
    std::string why;
    for (int d : devices) {
      const std::vector<std::string> diff = entry_environment_differences(*devs.environment(d), env);
      if (diff.empty()) return {};
      why += (why.empty() ? "" : "; ") + cuda_device_name(d) + ": " + join(diff);
    }
    return "its environment matches no CUDA device here (here != entry: " + why + ")";
  });
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
  if (!publish_new(sig, *entry, r, on)) return;
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

bool Swapper::publish_new(const OpSignature& sig, const StoredEntry& entry, Replacement* r, const std::string& on) {
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
  r->counters = new SwapCounters();
  r->owner = this;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_trials_[entry.key] = static_cast<int32_t>(::getpid());
    Record& rec = records_[r->id];
    rec.current = r;
    rec.counters = r->counters;
    rec.cuda = r->cuda;
    rec.backend = r->backend;
    rec.observe_bits = ObserveSlots::instance().mask(sig.op, sig.overload, sig.target.backend);
    rec.key = entry.key;
    rec.label = label;
    rec.state = "shadow";
    rec.reason.clear();
    publish_locked();
  }
  (void)store_->touch(entry.key);   // for gc's least-recently-used order; failure is harmless
  if (options_.log) {
    log_line(where + " loaded" + on + "; shadow for " + std::to_string(options_.shadow_calls) + " calls");
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    notices.swap(notices_);
  }
  for (const Notice& n : notices) {
    const auto seen = looked_up_.find(n.signature);
    if (seen == looked_up_.end()) continue;   // not a signature of this process (yet)
    const std::string label = seen->second->to_string();
    if (n.revoke) {
      bool disabled = false;
      std::optional<SignatureId> key;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = records_.find(n.signature);
        if (it == records_.end() || it->second.current == nullptr || it->second.key.hex() != n.entry_key) continue;
        Record& rec = it->second;
        rec.current = nullptr;
        rec.state = "disabled";
        rec.reason = "revoked by the daemon: " + n.reason;
        publish_locked();
        open_trials_.erase(rec.key);
        key = rec.key;
        disabled = true;
      }
      if (disabled) {
        remove_marker(*key);
        log_line("entry " + n.entry_key + " for " + label + " revoked by the daemon (" + n.reason +
                 "); PyTorch's kernel runs");
      }
      continue;
    }
    bool in_use = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = records_.find(n.signature);
      in_use = it != records_.end() && it->second.current != nullptr;
    }
    if (in_use) {
      if (options_.log) {
        log_line("entry " + n.entry_key + " for " + label + " is ready, but an entry is already in use for it");
      }
      continue;
    }
    if (options_.log) log_line("entry " + n.entry_key + " for " + label + " is ready (daemon); looking it up");
    consider(*seen->second);
  }
}

void Swapper::on_round(const std::vector<std::shared_ptr<const OpSignature>>& new_signatures) noexcept {
  if (options_.mode == HookMode::kObserve) return;   // observe never opens the cache
  try {
    if (!ensure_store()) return;
    process_events();
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

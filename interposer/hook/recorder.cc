#include "interposer/hook/recorder.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "interposer/daemon_client.h"
#include "interposer/hook/config.h"
#include "interposer/hook/log.h"

namespace kforge::hook {

// Note [Per-thread counters]
// Every thread that makes an intercepted call owns a ThreadCounters: a fixed-size open-addressing
// table from SignatureId to counters, reached through a thread_local pointer (Recorder::t_counters_;
// the counting half of on_call is inline in recorder.h, the rest is here). The owner is the
// only writer of its table, so counting is a relaxed load and store, with no lock and no atomic
// read-modify-write; the reporter thread reads the tables under mu_ (which only the slow paths of
// callers take), so a table is never freed while it is read. A slot is published by a release
// store of its signature pointer after its id is written; readers acquire that pointer first.
// Tables are never rehashed: a full table (kMaxUsed signatures in one thread) counts further new
// signatures as overflow. A thread that exits folds its counts into retired_ (its ThreadExit
// destructor), so totals are cumulative for the life of the process, as HotEntry promises.
//
// A forked child bumps generation_: each table remembers the generation it was made in, and a
// thread whose table is older makes a new one on its next call. The child's first such call
// starts its reporter thread, so a child that only execs never starts one.

namespace {

// Set by start(); read by thread-exit destructors and the fork handlers.
std::atomic<Recorder*> g_recorder{nullptr};

// Marks a slot whose signature could not be built, or whose built signature has another id: its
// calls are counted as unknown, and the slow path is not retried on every call.
// Only its address is used: no object lives there, nothing is allocated.
alignas(OpSignature) unsigned char g_poison_tag[sizeof(OpSignature)];
const OpSignature* poisoned() noexcept { return reinterpret_cast<const OpSignature*>(g_poison_tag); }

// Note [Stopping before CUDA's teardown]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// exit() runs the atexit handlers in the reverse order of their registration. The one start()
// registers comes early, when the hook loads (before the program's first CUDA call), so it runs
// late: after the CUDA runtime has begun its own teardown, which it registers at its first call.
// The reporter thread's last round (and any round still running when exit() begins) then drains
// CUDA input samples into a runtime that is going away: on the H100 the demo process (whose last
// steps, a float64 run, sample new signatures) died at exit by SIGABRT, c10's event destructor
// throwing from CUDA's SetDevice in a noexcept destructor, and once by SIGSEGV. So the first CUDA
// signature the process calls (CUDA is initialized by then) registers the handler once more: it
// runs before CUDA's teardown, stops the reporter after its last round, and the early one finds
// nothing left to do (shutdown() is idempotent).
std::atomic<bool> g_exit_after_cuda{false};

}  // namespace

namespace {

thread_local bool t_no_table = false;   // this thread could not get a table, or has exited

}  // namespace

// Retires the thread's table when the thread exits. Touched only on the slow path, so the hot
// path reads a trivially initialized thread_local pointer only.
struct ThreadExit {
  bool armed = false;
  ~ThreadExit() {
    t_no_table = true;   // intercepted calls from later thread-exit code are not recorded
    Recorder* r = g_recorder.load(std::memory_order_acquire);
    if (armed && Recorder::t_counters_ != nullptr && r != nullptr) r->retire(Recorder::t_counters_);
    Recorder::t_counters_ = nullptr;
  }
};

namespace {
thread_local ThreadExit t_exit;
}  // namespace

Recorder::Recorder(RecorderOptions options)
    : options_(std::move(options)),
      wake_(new std::condition_variable()),
      round_done_(new std::condition_variable()),
      pid_(::getpid()) {}

void Recorder::start() {
  g_recorder.store(this, std::memory_order_release);
  // Registered once per process; a forked child inherits them.
  ::pthread_atfork(&Recorder::before_fork, &Recorder::after_fork_parent, &Recorder::after_fork_child);
  std::atexit(&Recorder::at_exit);
  std::lock_guard<std::mutex> lock(mu_);
  start_reporter_locked();
}

ThreadCounters* Recorder::counters() noexcept {
  ThreadCounters* t = t_counters_;
  if (t != nullptr && t->generation == generation_.load(std::memory_order_relaxed)) [[likely]] {
    return t;
  }
  return t_no_table ? nullptr : register_thread();
}

ThreadCounters* Recorder::register_thread() noexcept {
  try {
    const uint64_t gen = generation_.load(std::memory_order_relaxed);
    auto table = std::make_unique<ThreadCounters>(gen);
    t_exit.armed = true;   // first touch constructs it and registers its destructor
    ThreadCounters* old = t_counters_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.push_back(table.get());
      ++threads_;
      if (!reporter_started_) start_reporter_locked();   // a forked child's first call
    }
    t_counters_ = table.release();
    // A table from before a fork: the child's registry no longer lists it and nobody reads it.
    delete old;
    return t_counters_;
  } catch (...) {
    t_no_table = true;
    return nullptr;
  }
}

void Recorder::retire(ThreadCounters* t) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(live_.begin(), live_.end(), t);
    if (it != live_.end()) {
      live_.erase(it);
      t->for_each_slot([&](const CounterSlot& s, const OpSignature* sig) {
        if (sig == poisoned()) {
          retired_unknown_ += s.calls.load(std::memory_order_relaxed);
          return;
        }
        Totals& tot = retired_[s.id];
        tot.calls += s.calls.load(std::memory_order_relaxed);
        tot.sampled_calls += s.sampled_calls.load(std::memory_order_relaxed);
        tot.sampled_ns += s.sampled_ns.load(std::memory_order_relaxed);
        if (!tot.signature) tot.signature = std::make_shared<const OpSignature>(*sig);
      });
      retired_unknown_ += t->unknown_calls.load(std::memory_order_relaxed);
      retired_overflow_ += t->overflow_calls.load(std::memory_order_relaxed);
    }
    delete t;
  } catch (...) {
    // Out of memory while folding: the thread's counts are lost, nothing else.
  }
}

Recorder::Call Recorder::on_call_slow(const SignatureId& id, SignatureFactory make, void* context,
                                      bool timeable, uint64_t weight) noexcept {
  Call c;
  ThreadCounters* t = counters();
  if (t == nullptr) return c;
  CounterSlot* s = t->find(id);
  if (s == nullptr) [[unlikely]] {
    // Slow path: this thread's first call of this signature.
    if (t->full()) {
      bump(t->overflow_calls, weight);
      return c;
    }
    std::unique_ptr<OpSignature> sig;
    try {
      sig = make(context);
    } catch (...) {
      sig = nullptr;
    }
    const OpSignature* published = sig.get();
    if (sig == nullptr) {
      published = poisoned();
    } else if (sig->id() != id) {
      c.id_mismatch = true;
      published = poisoned();
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = id_mismatches_++ == 0;
      }
      if (first) {
        log_line("internal error: fast-path signature id " + id.hex() + " differs from " +
                 sig->id().hex() + " for " + sig->to_string() + "; that operator is no longer intercepted");
      }
      sig = nullptr;
    }
    if (published != poisoned() && published->target.backend == Backend::kCuda &&
        !g_exit_after_cuda.exchange(true, std::memory_order_acq_rel)) {
      std::atexit(&Recorder::at_exit);   // Note [Stopping before CUDA's teardown]
    }
    s = t->insert(id, published, std::move(sig));
  }
  bump(s->calls, weight);
  c.slot = s;
  if (timeable && --s->sample_countdown == 0) {
    s->sample_countdown = options_.sample_rate;
    c.sample = true;
  }
  return c;
}

void Recorder::on_unknown_call(uint64_t weight) noexcept {
  if (ThreadCounters* t = counters()) bump(t->unknown_calls, weight);
}

Recorder::TotalsMap Recorder::merge_locked() const {
  TotalsMap m = retired_;
  for (const ThreadCounters* t : live_) {
    t->for_each_slot([&](const CounterSlot& s, const OpSignature* sig) {
      if (sig == poisoned()) return;
      Totals& tot = m[s.id];
      tot.calls += s.calls.load(std::memory_order_relaxed);
      tot.sampled_calls += s.sampled_calls.load(std::memory_order_relaxed);
      tot.sampled_ns += s.sampled_ns.load(std::memory_order_relaxed);
      // Copied once per signature and process: later merges share it.
      if (!tot.signature) {
        auto known = known_.find(s.id);
        if (known == known_.end()) known = known_.emplace(s.id, std::make_shared<const OpSignature>(*sig)).first;
        tot.signature = known->second;
      }
    });
  }
  // Device times measured by the reporter (CudaTimer) for calls the slots above counted.
  for (const auto& [id, timed] : device_timed_) {
    auto it = m.find(id);
    if (it == m.end()) continue;
    it->second.sampled_calls += timed.first;
    it->second.sampled_ns += timed.second;
  }
  return m;
}

RecorderStats Recorder::stats() const {
  RecorderStats st;
  std::lock_guard<std::mutex> lock(mu_);
  TotalsMap m = merge_locked();
  st.signatures.reserve(m.size());
  for (const auto& [id, tot] : m) {
    const auto stats = input_stats_.find(id);
    st.signatures.push_back({id, *tot.signature, tot.calls, tot.sampled_calls, tot.sampled_ns,
                             stats == input_stats_.end() ? std::vector<wire::InputStats>{} : stats->second});
  }
  std::sort(st.signatures.begin(), st.signatures.end(),
            [](const RecorderStats::Signature& a, const RecorderStats::Signature& b) { return a.id < b.id; });
  st.unknown_calls = retired_unknown_;
  st.overflow_calls = retired_overflow_;
  for (const ThreadCounters* t : live_) {
    st.unknown_calls += t->unknown_calls.load(std::memory_order_relaxed);
    st.overflow_calls += t->overflow_calls.load(std::memory_order_relaxed);
    t->for_each_slot([&](const CounterSlot& s, const OpSignature* sig) {
      if (sig == poisoned()) st.unknown_calls += s.calls.load(std::memory_order_relaxed);
    });
  }
  st.id_mismatches = id_mismatches_;
  st.gpus_in_use = gpus_in_use_;
  st.threads = threads_;
  st.reports_built = reports_built_;
  st.reports_offered = reports_offered_;
  st.extras_offered = extras_offered_;
  st.extras_refused = extras_refused_;
  st.extras_held = extras_held_;
  st.client_running = client_ != nullptr;
  st.client_error = client_error_;
  if (client_ != nullptr) {
    const DaemonClient::Counters c = client_->counters();
    st.client_sent = c.sent;
    st.client_dropped = c.dropped_queue_full + c.dropped_unsendable;
  }
  return st;
}

bool Recorder::report_now(int timeout_ms) noexcept {
  try {
    std::unique_lock<std::mutex> lock(mu_);
    // A round under way may have merged its counts before this call: then wait for the next.
    const uint64_t target = rounds_ + (in_round_ ? 2 : 1);
    report_requested_ = true;
    wake_->notify_all();
    if (timeout_ms <= 0 || reporter_ == nullptr) return false;
    return round_done_->wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                 [&] { return rounds_ >= target || stop_; }) &&
           rounds_ >= target;
  } catch (...) {
    return false;
  }
}

void Recorder::start_reporter_locked() {
  reporter_started_ = true;
  pid_ = ::getpid();
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  try {
    reporter_ = new std::thread([this, gen] { reporter_main(gen); });
  } catch (...) {
    reporter_ = nullptr;
    client_error_ = "could not start the reporter thread";
    log_line("could not start the reporter thread; counters stay in this process");
  }
}

void Recorder::reporter_main(uint64_t generation) {
  DaemonClient::Options o;
  o.endpoint = options_.endpoint;
  o.curve_server_key = options_.curve_server_key;
  wire::Hello hello = options_.hello;
  hello.pid = static_cast<int32_t>(::getpid());
  o.hello = std::move(hello);
  o.on_message = options_.on_message;
  // Never connect into a socket directory someone else could have planted (config.h). No
  // endpoint: KFORGE_DAEMON_ENDPOINT=none, the rounds still run (the loader's work) but report nothing.
  const bool no_daemon = o.endpoint.empty();
  const Status safe = no_daemon ? unavailable("no daemon (KFORGE_DAEMON_ENDPOINT=none)") : secure_ipc_directory(o.endpoint);
  StatusOr<std::unique_ptr<DaemonClient>> client =
      safe.ok() ? DaemonClient::start(std::move(o)) : StatusOr<std::unique_ptr<DaemonClient>>(safe);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (generation != generation_.load(std::memory_order_relaxed)) return;
    if (client.ok()) {
      client_ = client->release();   // never deleted: stats may read its counters at any time
    } else {
      client_error_ = client.status().message();
    }
  }
  if (!client.ok() && !no_daemon) {
    log_line("cannot reach the daemon at " + options_.endpoint + " (" + client.status().message() +
             "); counting locally only");
  }
  const auto interval = std::chrono::milliseconds(options_.report_interval_ms);
  for (;;) {
    bool final_report = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_->wait_for(lock, interval, [&] { return stop_ || report_requested_; });
      report_requested_ = false;
      final_report = stop_;
      in_round_ = true;
    }
    build_and_offer_reports();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++rounds_;
      in_round_ = false;
    }
    round_done_->notify_all();
    if (final_report) break;
  }
  DaemonClient* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = client_;
  }
  if (c != nullptr) c->stop("interpreter exit");
}

void Recorder::build_and_offer_reports() {
  std::vector<wire::HotEntry> changed;
  std::vector<std::shared_ptr<const OpSignature>> fresh;
  DaemonClient* client = nullptr;
  int32_t pid = 0;
  std::vector<std::string> gpus;
  bool gpus_changed = false;
  RoundExtras extras;
  if (options_.before_round) {
    int32_t p = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p = pid_;
    }
    try {
      options_.before_round(p, extras);
    } catch (...) {
      // before_round promises not to throw.
    }
  }
  try {
    std::lock_guard<std::mutex> lock(mu_);
    client = client_;
    pid = pid_;
    for (auto& [id, stats] : extras.stats) {
      input_stats_[id] = std::move(stats);
      if (auto it = last_reported_calls_.find(id); it != last_reported_calls_.end()) it->second = UINT64_MAX;
    }
    for (const auto& [id, ns] : extras.timed) {
      auto& [n, total] = device_timed_[id];
      ++n;
      total += ns;
    }
    {
      std::unordered_map<SignatureId, wire::EntryInProcess, IdHash> now;
      for (auto& [id, e] : extras.in_process) now[id] = std::move(e);
      auto resend = [this](const SignatureId& id) {
        if (auto it = last_reported_calls_.find(id); it != last_reported_calls_.end()) it->second = UINT64_MAX;
      };
      for (const auto& [id, e] : now) {
        auto before = in_process_.find(id);
        if (before == in_process_.end() || !(before->second == e)) resend(id);
      }
      for (const auto& [id, e] : in_process_) {
        if (now.find(id) == now.end()) resend(id);
      }
      in_process_ = std::move(now);
    }
    gpus_in_use_ = std::move(extras.gpus_in_use);
    gpus = gpus_in_use_;
    // A report the client dropped (no daemon connected yet, or a slow one) carried counts that
    // only appear again when they change. Counts are cumulative, so after any drop the next round
    // reports every signature again: a daemon that connects late still learns everything.
    if (client != nullptr) {
      const DaemonClient::Counters c = client->counters();
      const uint64_t drops = c.dropped_queue_full + c.dropped_unsendable;
      if (drops != drops_seen_ || resend_all_) {
        drops_seen_ = drops;
        resend_all_ = false;
        for (auto& [id, last] : last_reported_calls_) last = UINT64_MAX;
        gpus_offered_.reset();
      }
    }
    gpus_changed = gpus_offered_ != gpus;
    TotalsMap m = merge_locked();
    for (const auto& [id, tot] : m) {
      auto [it, inserted] = last_reported_calls_.try_emplace(id, 0);
      if (inserted) fresh.push_back(tot.signature);
      uint64_t& last = it->second;
      if (tot.calls == last) continue;
      last = tot.calls;
      const auto stats = input_stats_.find(id);
      changed.push_back(wire::HotEntry{*tot.signature, tot.calls, tot.sampled_calls, tot.sampled_ns,
                                       stats == input_stats_.end() ? std::vector<wire::InputStats>{}
                                                                   : stats->second});
      if (const auto p = in_process_.find(id); p != in_process_.end()) changed.back().in_process.push_back(p->second);
    }
  } catch (...) {
    return;   // out of memory: try again next interval (counts are cumulative)
  }
  // Reports are split at the decoder's limit; each part is a report of its own. A change of the
  // GPUs in use is news even without counts, and so is being alive (kHeartbeatMs): then one report
  // with no entries carries it.
  const auto now = std::chrono::steady_clock::now();
  const bool heartbeat_due = now - last_offered_ >= std::chrono::milliseconds(kHeartbeatMs);
  const size_t parts = std::max<size_t>((changed.size() + wire::kMaxReportEntries - 1) / wire::kMaxReportEntries,
                                        gpus_changed || (heartbeat_due && client != nullptr) ? 1 : 0);
  for (size_t part = 0; part < parts; ++part) {
    const size_t first = part * wire::kMaxReportEntries;
    const size_t last = std::min(changed.size(), first + wire::kMaxReportEntries);
    wire::HotReport report;
    report.pid = pid;
    report.gpus_in_use = gpus;
    report.entries.assign(std::make_move_iterator(changed.begin() + static_cast<std::ptrdiff_t>(first)),
                          std::make_move_iterator(changed.begin() + static_cast<std::ptrdiff_t>(last)));
    {
      std::lock_guard<std::mutex> lock(mu_);
      report.sequence = ++sequence_;
      ++reports_built_;
    }
    if (client == nullptr) continue;
    // The client counts drops per message, not per type; all but a Goodbye are reports.
    const DaemonClient::Counters c = client->counters();
    report.reports_dropped = c.dropped_queue_full + c.dropped_unsendable;
    if (client->offer(std::move(report))) {
      last_offered_ = now;
      std::lock_guard<std::mutex> lock(mu_);
      ++reports_offered_;
      gpus_offered_ = gpus;
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      resend_all_ = true;
    }
  }
  offer_extras(client, std::move(extras.messages));
  if (options_.on_round) {
    try {
      options_.on_round(fresh);
    } catch (...) {
      // on_round promises not to throw; nothing to do if it did.
    }
  }
}

// Note [Extras wait for a daemon]
// A report dropped before the daemon connects is sent again (counts are cumulative), but a
// message of before_round (CapturedInputs: a sample taken once) would be gone for good. The
// client drops what it is offered while no daemon is connected, which is the usual state in the
// first milliseconds of a process, or whenever the daemon restarts. So these messages wait here,
// in arrival order, until DaemonClient::connected(); beyond kMaxHeldExtras messages or
// kMaxHeldExtraBytes of captured tensors the oldest are given up (counted as refused). Reporter
// thread only.
void Recorder::offer_extras(DaemonClient* client, std::vector<wire::WireMessage> messages) noexcept {
  uint64_t given_up = 0;
  uint64_t offered = 0;
  try {
    const auto bytes_of = [](const wire::WireMessage& m) {
      size_t n = 0;
      if (const auto* c = std::get_if<wire::CapturedInputs>(&m)) {
        for (const wire::CapturedTensor& t : c->tensors) n += t.bytes.size();
      }
      return n;
    };
    for (wire::WireMessage& m : messages) {
      held_extra_bytes_ += bytes_of(m);
      held_extras_.push_back(std::move(m));
    }
    while (!held_extras_.empty() &&
           (client == nullptr || held_extras_.size() > kMaxHeldExtras || held_extra_bytes_ > kMaxHeldExtraBytes)) {
      held_extra_bytes_ -= bytes_of(held_extras_.front());
      held_extras_.pop_front();
      ++given_up;
    }
    while (!held_extras_.empty() && client->connected()) {
      held_extra_bytes_ -= bytes_of(held_extras_.front());
      const bool ok = client->offer(std::move(held_extras_.front()));
      held_extras_.pop_front();
      ++(ok ? offered : given_up);
    }
  } catch (...) {
    // Out of memory while holding: what is held stays (bounded); this round's new ones may be lost.
  }
  std::lock_guard<std::mutex> lock(mu_);
  extras_offered_ += offered;
  extras_refused_ += given_up;
  extras_held_ = held_extras_.size();
}

void Recorder::shutdown() noexcept {
  std::thread* reporter = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ != ::getpid() || reporter_ == nullptr) return;
    stop_ = true;
    reporter = reporter_;
    reporter_ = nullptr;
  }
  wake_->notify_all();
  // Bounded: the reporter builds one last report and stops the client (stop_timeout_ms).
  if (reporter->joinable() && reporter->get_id() != std::this_thread::get_id()) {
    reporter->join();
    delete reporter;   // joined: nothing refers to the thread object any more
  }
}

void Recorder::before_fork() noexcept {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire)) r->mu_.lock();
}

void Recorder::after_fork_parent() noexcept {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire)) r->mu_.unlock();
}

void Recorder::after_fork_child() noexcept {
  Recorder* r = g_recorder.load(std::memory_order_acquire);
  if (r == nullptr) return;
  // Only this thread exists now. The parent's tables, reporter thread object, client and condition
  // variable (which may count waiters that are not here) are left behind, never touched again.
  r->generation_.fetch_add(1, std::memory_order_relaxed);
  r->live_.clear();
  r->retired_.clear();
  r->retired_unknown_ = 0;
  r->retired_overflow_ = 0;
  r->threads_ = 0;
  r->id_mismatches_ = 0;
  r->reporter_started_ = false;
  r->stop_ = false;
  r->report_requested_ = false;
  r->reporter_ = nullptr;
  r->client_ = nullptr;
  r->client_error_.clear();
  r->sequence_ = 0;
  r->reports_built_ = 0;
  r->reports_offered_ = 0;
  r->last_reported_calls_.clear();
  r->input_stats_.clear();
  r->in_process_.clear();
  r->device_timed_.clear();
  r->gpus_in_use_.clear();
  r->gpus_offered_ = std::vector<std::string>{};
  r->wake_ = new std::condition_variable();
  r->round_done_ = new std::condition_variable();
  r->rounds_ = 0;
  r->in_round_ = false;
  r->pid_ = ::getpid();
  r->mu_.unlock();
}

void Recorder::at_exit() noexcept {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire)) r->shutdown();
}

}  // namespace kforge::hook

// Recorder: counts intercepted calls per signature, times a sample of them, and reports the
// totals to kforged, without ever making a calling thread wait.
//
//   Recorder& r = *new Recorder(options);         // one per process, never destroyed
//   r.start();                                    // reporter thread: Hello, then HotReports
//   // in the interceptor, per call:
//   Recorder::Call c = r.on_call(id, make_signature, &ctx, /*timeable=*/cpu, /*weight=*/n);
//   if (c.sample) { t0 = now(); original(); Recorder::add_sample(c.slot, now() - t0); }
//
// Promises:
// - The hot path (on_call for a signature this thread has seen) takes no lock, allocates nothing
//   and does no I/O: each thread counts in its own fixed-size open-addressing table (Note
//   [Per-thread counters] in recorder.cc). Only a thread's first call, and its first call of each
//   new signature, take the slow path: the full OpSignature is built (allocating) once per thread
//   and signature, and a thread's first call registers its table under a mutex.
// - One background thread merges the tables every report interval into cumulative HotReports
//   (only signatures whose counts moved; with no such signature, a report is still built when the
//   GPUs in use changed, or as a heartbeat when nothing was offered for kHeartbeatMs, so the
//   daemon can tell a quiet process from a gone one), offered to DaemonClient, which never blocks: a daemon that is absent
//   costs dropped reports, counted, never a delay. Every report carries the GPUs in use that
//   before_round gave (RoundExtras::gpus_in_use).
// - Fork: a child process starts over with empty counters and its own reporter thread, started
//   by the child's first intercepted call (a child that only execs never starts one).
// - Nothing here throws to the caller.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/wire.h"

namespace kforge {
class DaemonClient;
}

namespace kforge::hook {

// A report with no entries goes out when nothing was offered for this long: the daemon takes a
// process that sends nothing for daemon.process_timeout_s (at least 15 s) for gone.
inline constexpr int64_t kHeartbeatMs = 10000;

// One signature's counters in one thread's table. The owning thread is the only writer; the
// reporter reads. A single writer needs no read-modify-write: bump() is a relaxed load and store.
struct CounterSlot {
  SignatureId id;                                        // written before `signature` is published
  std::atomic<const OpSignature*> signature{nullptr};    // null: free slot
  // Timeable calls of this signature on this thread until the next sampled one; the owning thread
  // alone reads and writes it. Per signature, not per thread: with one countdown shared by a
  // thread's calls, a loop calling two ops alternately with an even sample rate timed only one.
  uint32_t sample_countdown = 1;                         // the first call is timed
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> sampled_calls{0};
  std::atomic<uint64_t> sampled_ns{0};
};

inline void bump(std::atomic<uint64_t>& counter, uint64_t n) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// One thread's counters: a fixed-size open-addressing table from SignatureId to CounterSlot (Note
// [Per-thread counters] in recorder.cc). Declared here so that the hot half of Recorder::on_call
// is inlined into the interceptors; only the Recorder makes and reads them.
class ThreadCounters {
 public:
  static constexpr size_t kSlots = 512;     // power of two
  static constexpr size_t kMaxUsed = 384;   // keeps probe sequences short

  explicit ThreadCounters(uint64_t gen) : generation(gen) {}

  // Hot path: a few probes of this thread's own table.
  [[gnu::always_inline]] CounterSlot* find(const SignatureId& id) noexcept {
    size_t i = static_cast<size_t>(id.lo) & (kSlots - 1);
    for (;;) {
      CounterSlot& s = slots_[i];
      if (s.signature.load(std::memory_order_relaxed) == nullptr) return nullptr;
      if (s.id == id) return &s;
      i = (i + 1) & (kSlots - 1);
    }
  }

  bool full() const noexcept { return used_ >= kMaxUsed; }

  // Precondition: !full() and find(id) == nullptr. Takes ownership of `owned` (may be null when
  // `sig` is a poison tag).
  CounterSlot* insert(const SignatureId& id, const OpSignature* sig, std::unique_ptr<OpSignature> owned) noexcept {
    size_t i = static_cast<size_t>(id.lo) & (kSlots - 1);
    while (slots_[i].signature.load(std::memory_order_relaxed) != nullptr) i = (i + 1) & (kSlots - 1);
    slots_[i].id = id;
    owned_[i] = std::move(owned);
    slots_[i].signature.store(sig, std::memory_order_release);
    ++used_;
    return &slots_[i];
  }

  template <typename F>
  void for_each_slot(F&& f) const {
    for (const CounterSlot& s : slots_) {
      const OpSignature* sig = s.signature.load(std::memory_order_acquire);
      if (sig != nullptr) f(s, sig);
    }
  }

  const uint64_t generation;
  std::atomic<uint64_t> unknown_calls{0};
  std::atomic<uint64_t> overflow_calls{0};

 private:
  size_t used_ = 0;
  CounterSlot slots_[kSlots];
  std::unique_ptr<OpSignature> owned_[kSlots];
};

// What a round's before_round hook hands the recorder (input_sampler.h makes it).
struct RoundExtras {
  // Input statistics per signature (cumulative): attached to the signature's HotEntry from now on,
  // and the signature is reported again this round.
  std::vector<std::pair<SignatureId, std::vector<wire::InputStats>>> stats;
  // Offered to the daemon after the round's reports (CapturedInputs).
  std::vector<wire::WireMessage> messages;
  // Device times (ns) of sampled calls, one per call, measured off the calling thread (CUDA
  // events); counted as sampled calls of the signature.
  std::vector<std::pair<SignatureId, uint64_t>> timed;
  // The GPUs this process uses now (ActiveGpus::current()): every report carries them, and a
  // change is reported even in a round with no counts to report.
  std::vector<std::string> gpus_in_use;
  // What the process does with the cache entries it loaded (Swapper::stats), the whole current
  // set: each signature's HotEntry carries its own, and a change is reported at once.
  std::vector<std::pair<SignatureId, wire::EntryInProcess>> in_process;
};

// What the background thread needs that the hook knows at load.
struct RecorderOptions {
  std::string endpoint;            // DaemonClient endpoint
  std::string curve_server_key;    // DaemonClient curve_server_key (tcp:// only)
  uint32_t sample_rate = 64;       // time one timeable call in this many
  uint32_t report_interval_ms = 1000;
  wire::Hello hello;               // pid is filled in per process (and again after fork)
  // Called on the reporter thread at the end of every round (also rounds with nothing new), with
  // the signatures this process's reporter had not seen before (after a fork: every signature
  // again). It may do I/O: it is how the loader (swapper.h) runs off the calling threads. Must
  // not throw.
  std::function<void(const std::vector<std::shared_ptr<const OpSignature>>& new_signatures)> on_round;
  // Called on the reporter thread at the start of every round, before reports are built. May
  // block this thread (it synchronizes CUDA streams); must not throw.
  std::function<void(int32_t pid, RoundExtras& extras)> before_round;
  // Daemon -> hook messages (KernelReady, Revoke), on the client's thread. Must not throw.
  std::function<void(const wire::WireMessage&)> on_message;
};

// A copy of the totals, for kforge_hook_stats_json and tests.
struct RecorderStats {
  struct Signature {
    SignatureId id;
    OpSignature signature;
    uint64_t calls = 0;
    uint64_t sampled_calls = 0;
    uint64_t sampled_ns = 0;
    std::vector<wire::InputStats> input_stats;
  };
  std::vector<Signature> signatures;     // sorted by id
  std::vector<std::string> gpus_in_use;  // as the last round found them (HotReport.gpus_in_use)
  uint64_t unknown_calls = 0;            // signature not computable: fell through uncounted
  uint64_t overflow_calls = 0;           // a thread's table was full
  uint64_t id_mismatches = 0;            // fast-path id != OpSignature::id() (a kforge bug)
  uint64_t threads = 0;                  // tables registered in this process
  uint64_t reports_built = 0;
  uint64_t reports_offered = 0;          // accepted by DaemonClient::offer
  uint64_t extras_offered = 0;           // before_round's messages accepted by DaemonClient::offer
  uint64_t extras_refused = 0;           // ... given up (no client, queue full, over the held bound)
  uint64_t extras_held = 0;              // ... waiting for a daemon to connect (Note [Extras wait for a daemon])
  bool client_running = false;
  uint64_t client_sent = 0;              // messages (Hello, reports) the client sent
  uint64_t client_dropped = 0;           // messages the client dropped (queue full or unsendable)
  std::string client_error;              // why there is no client, if there is none
};

class Recorder {
 public:
  explicit Recorder(RecorderOptions options);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  ~Recorder() = delete;   // lives as long as the process: intercepted calls may come at any time

  // Starts the reporter thread (it connects the client and sends Hello) and installs the fork
  // and exit handlers. Call once.
  void start();

  // Builds the full signature of the call being recorded (slow path, may allocate); null if it
  // cannot. `context` is the caller's.
  using SignatureFactory = std::unique_ptr<OpSignature> (*)(void* context);

  struct Call {
    CounterSlot* slot = nullptr;   // null: not counted by signature (table full, no table)
    bool sample = false;           // time this call and pass the time to add_sample
    bool id_mismatch = false;      // the built signature's id differs from `id`: disable the op
  };
  // Counts `weight` calls of signature `id`: this one and the calls of the same operator this
  // thread did not observe before it (Note [Observed calls] in interceptor.cc; 1 when every call
  // is observed). Hot path for a known signature: no lock, no allocation.
  // `timeable`: the caller can time this call (CPU with a clock, CUDA with events); only such
  // calls take part in sampling.
  [[gnu::always_inline]] Call on_call(const SignatureId& id, SignatureFactory make, void* context,
                                      bool timeable, uint64_t weight = 1) noexcept {
    // Inline: a signature this thread has counted before, in its current table. Anything else
    // (no table yet, a table from before a fork, a new signature) takes on_call_slow.
    ThreadCounters* t = t_counters_;
    if (t != nullptr && t->generation == generation_.load(std::memory_order_relaxed)) [[likely]] {
      if (CounterSlot* s = t->find(id)) [[likely]] {
        Call c;
        bump(s->calls, weight);
        c.slot = s;
        if (timeable && --s->sample_countdown == 0) [[unlikely]] {
          s->sample_countdown = options_.sample_rate;
          c.sample = true;
        }
        return c;
      }
    }
    return on_call_slow(id, make, context, timeable, weight);
  }
  // `weight` calls (as on_call's) whose signature could not be computed on the fast path.
  void on_unknown_call(uint64_t weight = 1) noexcept;
  static void add_sample(CounterSlot* slot, uint64_t ns) noexcept {
    bump(slot->sampled_calls, 1);
    bump(slot->sampled_ns, ns);
  }

  // Wakes the reporter thread to build and offer a report now. With timeout_ms > 0, waits (at
  // most that long) until the reporter has finished that round; true if it has. For tools and
  // tests: the hook itself never makes a thread wait for the reporter.
  bool report_now(int timeout_ms) noexcept;
  RecorderStats stats() const;

 private:
  struct Totals {
    std::shared_ptr<const OpSignature> signature;
    uint64_t calls = 0;
    uint64_t sampled_calls = 0;
    uint64_t sampled_ns = 0;
  };
  struct IdHash {
    size_t operator()(const SignatureId& id) const noexcept { return static_cast<size_t>(id.lo); }
  };
  using TotalsMap = std::unordered_map<SignatureId, Totals, IdHash>;

  // This thread's table; null before its first call and after it could not get one. One
  // thread_local, constant-initialized, so reading it needs no initialization check.
  static inline thread_local constinit ThreadCounters* t_counters_ = nullptr;

  Call on_call_slow(const SignatureId& id, SignatureFactory make, void* context, bool timeable,
                    uint64_t weight) noexcept;
  ThreadCounters* counters() noexcept;
  ThreadCounters* register_thread() noexcept;
  void retire(ThreadCounters* t) noexcept;
  friend struct ThreadExit;

  // Under mu_: retired totals plus every live table, now (poisoned slots left out).
  TotalsMap merge_locked() const;
  void reporter_main(uint64_t generation);
  void start_reporter_locked();
  void build_and_offer_reports();
  void offer_extras(DaemonClient* client, std::vector<wire::WireMessage> messages) noexcept;
  void shutdown() noexcept;   // atexit: final report, Goodbye, join

  static void before_fork() noexcept;
  static void after_fork_parent() noexcept;
  static void after_fork_child() noexcept;
  static void at_exit() noexcept;

  const RecorderOptions options_;

  // Bumped in a forked child: every thread's table from before the fork is abandoned.
  std::atomic<uint64_t> generation_{1};

  mutable std::mutex mu_;                 // everything below
  // Replaced (the old ones leaked) in a forked child, where they may count waiters that are gone.
  std::condition_variable* wake_;         // the reporter waits here for its interval or a request
  std::condition_variable* round_done_;   // report_now(timeout) waits here
  uint64_t rounds_ = 0;                   // report rounds the reporter has finished
  bool in_round_ = false;                 // the reporter is between its wait and rounds_++
  std::vector<ThreadCounters*> live_;
  TotalsMap retired_;                     // counts of exited threads' tables
  // One shared copy of each signature seen, so merges copy a signature once per process.
  mutable std::unordered_map<SignatureId, std::shared_ptr<const OpSignature>, IdHash> known_;
  uint64_t retired_unknown_ = 0;
  uint64_t retired_overflow_ = 0;
  uint64_t threads_ = 0;
  uint64_t id_mismatches_ = 0;
  bool reporter_started_ = false;
  bool stop_ = false;
  bool report_requested_ = false;
  std::thread* reporter_ = nullptr;       // leaked in a forked child (that thread is not there)
  int32_t pid_ = 0;
  // Owned by the reporter thread while it runs; read under mu_ for stats. Leaked in a child.
  DaemonClient* client_ = nullptr;
  std::string client_error_;
  uint64_t sequence_ = 0;
  uint64_t reports_built_ = 0;
  uint64_t reports_offered_ = 0;
  std::unordered_map<SignatureId, uint64_t, IdHash> last_reported_calls_;
  std::unordered_map<SignatureId, std::vector<wire::InputStats>, IdHash> input_stats_;
  std::unordered_map<SignatureId, wire::EntryInProcess, IdHash> in_process_;
  std::unordered_map<SignatureId, std::pair<uint64_t, uint64_t>, IdHash> device_timed_;   // calls, ns
  uint64_t extras_offered_ = 0;
  uint64_t extras_refused_ = 0;
  // Note [Extras wait for a daemon]: before_round's messages not yet offered (reporter thread only).
  static constexpr size_t kMaxHeldExtras = 32;
  static constexpr size_t kMaxHeldExtraBytes = size_t{128} << 20;
  std::deque<wire::WireMessage> held_extras_;
  size_t held_extra_bytes_ = 0;
  uint64_t extras_held_ = 0;         // held_extras_.size() as of the last round (guarded by mu_)
  uint64_t drops_seen_ = 0;          // the client's drop count at the last round (guarded by mu_)
  bool resend_all_ = false;          // an offer was refused: report everything next round
  std::vector<std::string> gpus_in_use_;                  // the last round's
  // In the last report offered; a daemon assumes none until told. nullopt after a drop: resend.
  std::optional<std::vector<std::string>> gpus_offered_{std::vector<std::string>{}};
  std::chrono::steady_clock::time_point last_offered_{};   // the last report offered (reporter thread)
};

}  // namespace kforge::hook

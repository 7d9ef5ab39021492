// HotSignatures: what the daemon knows of the attached serving processes and of every signature they
// reported, and the scheduler's rule for which signature to search next. Single-threaded: the
// daemon's I/O thread owns it (the JSON status and the searches get copies).
//
//   HotSignatures hot(options);
//   hot.on_hello(peer, hello);  hot.on_report(peer, report);  hot.on_goodbye(peer, bye);
//   hot.expire(now, pid_alive);                               // once a second
//   if (std::optional<SignatureId> next = hot.next_to_search(can_run, bandwidth)) start_search(*hot.find(*next));
//   pool.set_serving_gpus(serving_gpus(hot.processes()));   // who uses which GPU (by UUID)
//
// Note [Search priority]
// Reports carry cumulative counters per process; the daemon keeps each process's latest numbers,
// so a lost report loses nothing and a restarted process starts over. A signature's time in a
// process is that process's calls times its own mean sampled time (a process that never timed a
// call of it counts the signature's mean over all processes); its total time is the sum over
// processes; its time share is that over the time of every signature of the processes that
// reported it, each counted the same way, so a share is never over 1. Its headroom is how far
// PyTorch's kernel is from the roofline floor: mean time / (fewest bytes / the device's measured
// copy bandwidth); unknown (no sampled time, or no bandwidth yet) counts as 2. The scheduler
// searches, among the signatures with at least min_calls calls and min_time_share of the time
// that a slot can run and that are not searched yet, the one with the largest expected saving:
// total time x (1 - 1/headroom); a signature no search has evaluated yet goes before one whose
// search was paused (Note [Yielding searches] in daemon_config.h), whatever their savings.
//
// Note [Bounded state]
// Any local client can connect and send anything, so everything kept per client is bounded and
// expires; a flood costs refused or evicted records (counted in counters()), never memory without
// bound or quadratic time:
// - Processes. A record per connection (routing id). A local (ipc://) peer's pid is the kernel's
//   word (SO_PEERCRED, which ZeroMQ passes on as the peer address), not the pid its Hello claims:
//   the record is gone once that process has exited. Any peer that sends nothing for
//   process_timeout is gone too (a hook sends a report at least every 10 s: a heartbeat). A gone
//   record is dropped after gone_retention. At most max_peers_per_pid records per local process
//   (a new connection of the same process evicts its oldest), at most max_processes in all (a new
//   one evicts the longest gone, else the least recently heard from).
// - Counters are kept per process key: the attested pid of a local peer, else the claimed pid and
//   the peer's address (over tcp://, two processes behind one address with one pid share a key).
//   A dropped record's counters fold into one "departed" bucket per signature, so totals stay
//   exact and the buckets stay bounded by the processes alive.
// - Signatures. At most max_signatures_per_process new signatures from one process (more are
//   refused and counted), at most max_signatures in all: past that the coldest (least total time,
//   then fewest calls) that no search is running for are evicted, a sixteenth of the table at a
//   time. Captured inputs: at most eval::kMaxCapturedCalls per signature and max_captured_bytes in
//   all.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/wire.h"

namespace kforge::daemon {

using SteadyClock = std::chrono::steady_clock;

enum class SearchState : uint8_t {
  kObserved,     // reported; below the thresholds, or waiting for a slot
  kSearching,    // a search runs (it may have published already: entry_key says)
  kDone,         // searched; nothing faster found
  kPublished,    // searched, and a faster verified kernel is in the cache
  kUnrunnable,   // no evaluation slot runs this target
  kFailed,       // the search could not run (journal unusable, ...)
};
std::string_view search_state_name(SearchState s) noexcept;

// Who sent a message, as the transport says (not as the message claims).
struct PeerCredentials {
  int32_t pid = 0;        // a local (ipc://) peer's process, in the daemon's pid namespace; 0: unknown (tcp://)
  std::string address;    // tcp://: the peer's IP address; empty for ipc://
};
// Parses ZeroMQ's "Peer-Address" message property: "<host>:<uid>:<gid>:<pid>" for an ipc://
// peer (libzmq appends SO_PEERCRED's uid, gid and pid), an IP address for tcp://.
PeerCredentials peer_credentials_from_address(std::string_view peer_address);

struct ProcessRecord {
  std::string peer;              // ZeroMQ routing id (opaque)
  wire::Hello hello;             // its devices name the process's GPUs by UUID too
  int32_t peer_pid = 0;          // PeerCredentials::pid: the transport's word; 0 over tcp://
  uint64_t key = 0;              // its counters' key in SignatureRecord::by_process (Note [Bounded state])
  uint64_t reports = 0;
  uint64_t reports_dropped = 0;  // as the hook counts them
  uint64_t sequence_gaps = 0;    // reports the daemon never saw
  uint64_t last_sequence = 0;
  uint64_t signatures = 0;           // signatures this process brought in
  uint64_t signatures_refused = 0;   // ... and refused over max_signatures_per_process
  SteadyClock::time_point first_seen;
  SteadyClock::time_point last_seen;
  SteadyClock::time_point gone_since;
  // The latest report's HotReport::gpus_in_use: the GPUs (UUIDs) this process uses. Cleared by a
  // new Hello (until the next report says) and when the process is gone.
  std::vector<std::string> gpus_in_use;
  bool gone = false;
  std::string goodbye_reason;    // the Goodbye's, or why the daemon decided it is gone
  bool shares_cache = true;      // its Hello's cache directory is the daemon's (Note [Shared cache] in daemon.cc)
};

struct SignatureRecord {
  OpSignature signature;
  SignatureId id;
  // Latest cumulative counters per process key (ProcessRecord::key; kDeparted: dropped processes).
  struct PerProcess {
    uint64_t calls = 0;
    uint64_t sampled_calls = 0;
    uint64_t sampled_ns = 0;
    // The latest report's wire::HotEntry::in_process: the cache entry this process runs or tries
    // for the signature, in its state, with its own trial's medians (none: PyTorch's kernel).
    std::vector<wire::EntryInProcess> in_process{};
  };
  static constexpr uint64_t kDeparted = 0;
  std::map<uint64_t, PerProcess> by_process;
  std::vector<wire::InputStats> input_stats;     // the latest report's
  std::vector<wire::CapturedInputs> captured;    // at most 4 (eval::kMaxCapturedCalls)
  SearchState state = SearchState::kObserved;
  std::string note;                               // why failed / unrunnable / done
  double best_speedup = 0;
  std::string entry_key;                          // the published entry
  uint64_t evaluations = 0;
  uint64_t shared_gpu_timings = 0;                // evaluations timed on a GPU a serving process used
  bool shared_gpu_logged = false;                 // the daemon said so once
  uint64_t implausible_timings = 0;               // results whose timing failed a plausibility check
  bool implausible_logged = false;

  uint64_t calls() const;
  double mean_ns() const;                         // 0 when never sampled
  // Note [Search priority]: the sum over processes of calls x that process's mean (else mean_ns()).
  double total_ns() const;
  // One process's time of this signature, by the same rule.
  double process_ns(const PerProcess& p) const;
};

struct HotOptions {
  uint64_t min_calls = 50;
  double min_time_share = 0;
  // Note [Bounded state].
  size_t max_processes = 1024;
  size_t max_peers_per_pid = 8;
  size_t max_signatures = 16384;
  size_t max_signatures_per_process = 8192;
  uint64_t max_captured_bytes = uint64_t{512} << 20;
  SteadyClock::duration process_timeout = std::chrono::seconds(60);
  SteadyClock::duration gone_retention = std::chrono::minutes(10);
  std::function<SteadyClock::time_point()> clock = [] { return SteadyClock::now(); };
};

// What the bounds refused or evicted so far.
struct HotCounters {
  uint64_t processes_evicted = 0;     // records dropped to make room (not expired ones)
  uint64_t processes_expired = 0;     // gone records dropped after gone_retention
  uint64_t signatures_evicted = 0;
  uint64_t signatures_refused = 0;    // over a process's quota
  uint64_t captured_refused = 0;      // over max_captured_bytes, or for an unknown signature
};

// The pids (sorted, unique) of the attached processes (not gone) whose latest report lists GPU
// `uuid` in use; none for "" (a CPU slot, or a GPU whose worker could not name it).
std::vector<int32_t> serving_pids_on(const std::map<std::string, ProcessRecord>& processes, const std::string& uuid);
// The same for every GPU some attached process uses: UUID -> pids (EvaluatorPool::set_serving_gpus).
std::map<std::string, std::vector<int32_t>> serving_gpus(const std::map<std::string, ProcessRecord>& processes);
// "123, 456": pids for a log line.
std::string pid_list(const std::vector<int32_t>& pids);

class HotSignatures {
 public:
  explicit HotSignatures(HotOptions options) : options_(std::move(options)) {}

  void on_hello(const std::string& peer, const wire::Hello& hello, const PeerCredentials& creds = {});
  // Returns how many of the report's new signatures were refused (the process's quota).
  uint64_t on_report(const std::string& peer, const wire::HotReport& report, const PeerCredentials& creds = {});
  // False when refused (unknown signature, or the captured-bytes budget is spent).
  bool on_captured(const std::string& peer, const wire::CapturedInputs& captured, const PeerCredentials& creds = {});
  void on_goodbye(const std::string& peer, const wire::Goodbye& bye, const PeerCredentials& creds = {});

  struct Expired {
    std::vector<int32_t> exited;      // pids (as their Hellos said) found gone without a Goodbye
    std::vector<int32_t> silent;      // ... that sent nothing for process_timeout
    size_t dropped = 0;               // gone records dropped after gone_retention
  };
  // Marks gone every attached process whose transport-given pid `alive` says no longer exists
  // (killed, crashed) or that sent nothing for process_timeout, and drops records gone for longer
  // than gone_retention. A later report from a record still kept revives it.
  Expired expire(const std::function<bool(int32_t pid)>& alive);

  // Note [Search priority]. `runnable` says whether a slot runs the signature's target;
  // `bandwidth` gives a target's measured copy bandwidth (0: unknown).
  std::optional<SignatureId> next_to_search(const std::function<bool(const OpSignature&)>& runnable,
                                            const std::function<double(const OpSignature&)>& bandwidth);

  // Each process key's total time over all its signatures (Note [Search priority]): one pass.
  using ProcessTimes = std::unordered_map<uint64_t, double>;
  ProcessTimes process_times() const;
  double time_share(const SignatureRecord& r, const ProcessTimes& times) const;
  double time_share(const SignatureRecord& r) const { return time_share(r, process_times()); }
  double headroom(const SignatureRecord& r, double bandwidth) const;

  SignatureRecord* find(const SignatureId& id);
  // The record of `sig`, created if new (a journaled search resumed before any process reported).
  SignatureRecord& adopt(const OpSignature& sig);
  const std::map<SignatureId, SignatureRecord>& signatures() const noexcept { return signatures_; }
  const std::map<std::string, ProcessRecord>& processes() const noexcept { return processes_; }
  ProcessRecord* process(const std::string& peer);
  // Peers (routing ids) of live processes that reported `id`, for KernelReady.
  std::vector<std::string> peers_of(const SignatureId& id) const;
  std::vector<std::string> live_peers() const;
  const HotCounters& counters() const noexcept { return counters_; }
  const HotOptions& options() const noexcept { return options_; }

 private:
  ProcessRecord& record_for(const std::string& peer, const PeerCredentials& creds, int32_t claimed_pid);
  void make_room_for_process(const PeerCredentials& creds);
  void drop_process(std::map<std::string, ProcessRecord>::iterator it);
  void evict_cold_signatures();
  SignatureRecord* insert_signature(const OpSignature& sig, const SignatureId& id);
  void erase_signature(std::map<SignatureId, SignatureRecord>::iterator it);

  HotOptions options_;
  std::map<std::string, ProcessRecord> processes_;
  std::map<SignatureId, SignatureRecord> signatures_;
  // Per process key, the signatures it has counters in (ids of evicted signatures linger until
  // the key is folded): what drop_process folds without scanning every signature.
  std::unordered_map<uint64_t, std::vector<SignatureId>> key_signatures_;
  uint64_t captured_bytes_ = 0;
  HotCounters counters_;
};

}  // namespace kforge::daemon

// HotSignatures: what the daemon knows of the attached serving processes and of every signature they
// reported, and the scheduler's rule for which signature to search next. Single-threaded: the
// daemon's I/O thread owns it (the JSON status and the searches get copies).
//
//   HotSignatures hot(options);
//   hot.on_hello(peer, hello);  hot.on_report(peer, report);  hot.on_goodbye(peer, bye);
//   if (std::optional<SignatureId> next = hot.next_to_search(can_run)) start_search(hot.get(*next));
//   pool.set_serving_gpus(serving_gpus(hot.processes()));   // who uses which GPU (by UUID)
//
// Note [Search priority]
// Reports carry cumulative counters per process; the daemon keeps each process's latest numbers,
// so a lost report loses nothing and a restarted process starts over. A signature's time is its
// calls times its mean sampled time (summed over processes); its time share is that over the
// time of every signature of the processes that reported it. Its headroom is how far PyTorch's
// kernel is from the roofline floor: mean time / (fewest bytes / the device's measured copy
// bandwidth); unknown (no sampled time, or no bandwidth yet) counts as 2. The scheduler searches,
// among the signatures with at least min_calls calls and min_time_share of the time that a slot
// can run and that are not searched yet, the one with the largest expected saving:
// total time x (1 - 1/headroom).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/wire.h"

namespace kforge::daemon {

enum class SearchState : uint8_t {
  kObserved,     // reported; below the thresholds, or waiting for a slot
  kSearching,    // a search runs (it may have published already: entry_key says)
  kDone,         // searched; nothing faster found
  kPublished,    // searched, and a faster verified kernel is in the cache
  kUnrunnable,   // no evaluation slot runs this target
  kFailed,       // the search could not run (journal unusable, ...)
};
std::string_view search_state_name(SearchState s) noexcept;

struct ProcessRecord {
  std::string peer;              // ZeroMQ routing id (opaque)
  wire::Hello hello;             // its devices name the process's GPUs by UUID too
  uint64_t reports = 0;
  uint64_t reports_dropped = 0;  // as the hook counts them
  uint64_t sequence_gaps = 0;    // reports the daemon never saw
  uint64_t last_sequence = 0;
  std::chrono::steady_clock::time_point last_seen;
  // The latest report's HotReport::gpus_in_use: the GPUs (UUIDs) this process uses. Cleared by a
  // new Hello (until the next report says) and when the process is gone.
  std::vector<std::string> gpus_in_use;
  bool gone = false;
  std::string goodbye_reason;    // the Goodbye's, or why the daemon decided it is gone
};

struct SignatureRecord {
  OpSignature signature;
  SignatureId id;
  // Latest cumulative counters per process (pid).
  struct PerProcess {
    uint64_t calls = 0;
    uint64_t sampled_calls = 0;
    uint64_t sampled_ns = 0;
  };
  std::map<int32_t, PerProcess> by_pid;
  std::vector<wire::InputStats> input_stats;     // the latest report's
  std::vector<wire::CapturedInputs> captured;    // at most 4 (eval::kMaxCapturedCalls)
  SearchState state = SearchState::kObserved;
  std::string note;                               // why failed / unrunnable / done
  double best_speedup = 0;
  std::string entry_key;                          // the published entry
  uint64_t evaluations = 0;
  uint64_t shared_gpu_timings = 0;                // evaluations timed on a GPU a serving process used
  bool shared_gpu_logged = false;                 // the daemon said so once

  uint64_t calls() const;
  double mean_ns() const;                         // 0 when never sampled
  double total_ns() const { return static_cast<double>(calls()) * mean_ns(); }
};

struct HotOptions {
  uint64_t min_calls = 50;
  double min_time_share = 0;
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
  explicit HotSignatures(HotOptions options) : options_(options) {}

  void on_hello(const std::string& peer, const wire::Hello& hello);
  void on_report(const std::string& peer, const wire::HotReport& report);
  void on_captured(const std::string& peer, const wire::CapturedInputs& captured);
  void on_goodbye(const std::string& peer, const wire::Goodbye& bye);
  // Marks gone every attached process whose pid `exists` says no longer exists (it exited without a
  // Goodbye: killed, crashed); returns their pids. A later Hello or report from one revives it.
  std::vector<int32_t> forget_exited(const std::function<bool(int32_t pid)>& exists);

  // Note [Search priority]. `runnable` says whether a slot runs the signature's target;
  // `bandwidth` gives a target's measured copy bandwidth (0: unknown).
  std::optional<SignatureId> next_to_search(const std::function<bool(const OpSignature&)>& runnable,
                                            const std::function<double(const OpSignature&)>& bandwidth);
  double time_share(const SignatureRecord& r) const;
  double headroom(const SignatureRecord& r, double bandwidth) const;

  SignatureRecord* find(const SignatureId& id);
  // The record of `sig`, created if new (a journaled search resumed before any process reported).
  SignatureRecord& adopt(const OpSignature& sig);
  const std::map<SignatureId, SignatureRecord>& signatures() const noexcept { return signatures_; }
  const std::map<std::string, ProcessRecord>& processes() const noexcept { return processes_; }
  // Peers (routing ids) of live processes that reported `id`, for KernelReady.
  std::vector<std::string> peers_of(const SignatureId& id) const;
  std::vector<std::string> live_peers() const;

 private:
  HotOptions options_;
  std::map<std::string, ProcessRecord> processes_;
  std::map<SignatureId, SignatureRecord> signatures_;
};

}  // namespace kforge::daemon

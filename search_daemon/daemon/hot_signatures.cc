#include "search_daemon/daemon/hot_signatures.h"

#include <algorithm>

#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/worker/op_cost.h"

namespace kforge::daemon {

namespace {

// ProcessRecord::goodbye_reason of a process forget_exited() found gone.
constexpr std::string_view kExitedWithoutGoodbye = "exited without a Goodbye";

}  // namespace

std::string_view search_state_name(SearchState s) noexcept {
  switch (s) {
    case SearchState::kObserved: return "observed";
    case SearchState::kSearching: return "searching";
    case SearchState::kDone: return "done";
    case SearchState::kPublished: return "published";
    case SearchState::kUnrunnable: return "unrunnable";
    case SearchState::kFailed: return "failed";
  }
  return "?";
}

uint64_t SignatureRecord::calls() const {
  uint64_t n = 0;
  for (const auto& [pid, p] : by_pid) n += p.calls;
  return n;
}

double SignatureRecord::mean_ns() const {
  uint64_t n = 0, ns = 0;
  for (const auto& [pid, p] : by_pid) {
    n += p.sampled_calls;
    ns += p.sampled_ns;
  }
  return n > 0 ? static_cast<double>(ns) / static_cast<double>(n) : 0;
}

void HotSignatures::on_hello(const std::string& peer, const wire::Hello& hello) {
  ProcessRecord& p = processes_[peer];
  // A new connection of the same peer (a hook that reconnected) or a new process. Its GPUs in use
  // are the next report's to say.
  p.peer = peer;
  p.hello = hello;
  p.gone = false;
  p.goodbye_reason.clear();
  p.gpus_in_use.clear();
  p.last_seen = std::chrono::steady_clock::now();
}

void HotSignatures::on_report(const std::string& peer, const wire::HotReport& report) {
  ProcessRecord& p = processes_[peer];
  p.peer = peer;
  if (p.hello.pid == 0) p.hello.pid = report.pid;
  ++p.reports;
  p.reports_dropped = report.reports_dropped;
  if (p.last_sequence != 0 && report.sequence > p.last_sequence + 1) p.sequence_gaps += report.sequence - p.last_sequence - 1;
  p.last_sequence = std::max(p.last_sequence, report.sequence);
  p.last_seen = std::chrono::steady_clock::now();
  p.gpus_in_use = report.gpus_in_use;
  // A process that reports is attached, whatever forget_exited() concluded (Goodbye is its last).
  if (p.gone && p.goodbye_reason == kExitedWithoutGoodbye) {
    p.gone = false;
    p.goodbye_reason.clear();
  }
  for (const wire::HotEntry& e : report.entries) {
    const SignatureId id = e.signature.id();
    auto [it, inserted] = signatures_.try_emplace(id);
    SignatureRecord& r = it->second;
    if (inserted) {
      r.signature = e.signature;
      r.id = id;
    }
    SignatureRecord::PerProcess& pp = r.by_pid[report.pid];
    // Cumulative counters: keep the latest (a restarted process with the same pid starts lower).
    pp.calls = e.calls;
    pp.sampled_calls = e.sampled_calls;
    pp.sampled_ns = e.sampled_total_ns;
    if (!e.input_stats.empty()) r.input_stats = e.input_stats;
  }
}

void HotSignatures::on_captured(const std::string& peer, const wire::CapturedInputs& captured) {
  processes_[peer].last_seen = std::chrono::steady_clock::now();
  auto it = signatures_.find(captured.signature_id);
  if (it == signatures_.end()) return;   // captured inputs of a signature never reported: nothing to attach to
  if (it->second.captured.size() < eval::kMaxCapturedCalls) it->second.captured.push_back(captured);
}

void HotSignatures::on_goodbye(const std::string& peer, const wire::Goodbye& bye) {
  ProcessRecord& p = processes_[peer];
  p.gone = true;
  p.goodbye_reason = bye.reason;
  p.gpus_in_use.clear();
}

std::vector<int32_t> HotSignatures::forget_exited(const std::function<bool(int32_t pid)>& exists) {
  std::vector<int32_t> out;
  for (auto& [peer, p] : processes_) {
    if (p.gone || p.hello.pid <= 0 || exists(p.hello.pid)) continue;
    p.gone = true;
    p.goodbye_reason = kExitedWithoutGoodbye;
    p.gpus_in_use.clear();
    out.push_back(p.hello.pid);
  }
  return out;
}

std::vector<int32_t> serving_pids_on(const std::map<std::string, ProcessRecord>& processes, const std::string& uuid) {
  std::vector<int32_t> pids;
  if (uuid.empty()) return pids;
  for (const auto& [peer, p] : processes) {
    if (p.gone || p.hello.pid <= 0) continue;
    if (std::find(p.gpus_in_use.begin(), p.gpus_in_use.end(), uuid) != p.gpus_in_use.end()) pids.push_back(p.hello.pid);
  }
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  return pids;
}

std::map<std::string, std::vector<int32_t>> serving_gpus(const std::map<std::string, ProcessRecord>& processes) {
  // One pass over the attached processes (serving_pids_on's rule), so a GPU listed only by
  // processes that are gone has no entry.
  std::map<std::string, std::vector<int32_t>> out;
  for (const auto& [peer, p] : processes) {
    if (p.gone || p.hello.pid <= 0) continue;
    for (const std::string& uuid : p.gpus_in_use) {
      if (!uuid.empty()) out[uuid].push_back(p.hello.pid);
    }
  }
  for (auto& [uuid, pids] : out) {
    std::sort(pids.begin(), pids.end());
    pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  }
  return out;
}

std::string pid_list(const std::vector<int32_t>& pids) {
  std::string out;
  for (int32_t p : pids) out += (out.empty() ? "" : ", ") + std::to_string(p);
  return out;
}

double HotSignatures::time_share(const SignatureRecord& r) const {
  // The total time of every signature of the processes that reported this one.
  double total = 0;
  for (const auto& [id, other] : signatures_) {
    double t = 0;
    for (const auto& [pid, pp] : other.by_pid) {
      if (r.by_pid.count(pid) == 0) continue;
      t += pp.sampled_calls > 0 ? static_cast<double>(pp.calls) * static_cast<double>(pp.sampled_ns) /
                                      static_cast<double>(pp.sampled_calls)
                                : 0;
    }
    total += t;
  }
  return total > 0 ? r.total_ns() / total : 0;
}

double HotSignatures::headroom(const SignatureRecord& r, double bandwidth) const {
  const double mean = r.mean_ns();
  if (mean <= 0 || bandwidth <= 0) return 2.0;
  // The fewest bytes: every input once, and outputs like input 0 (the catalog's ops all return a
  // tensor of their first input's shape; mean/rstd of layer_norm are small).
  std::vector<ResolvedOutput> outs;
  for (const Arg& a : r.signature.args) {
    if (const auto* t = std::get_if<TensorMeta>(&a.value)) {
      ResolvedOutput o;
      o.dtype = t->dtype;
      o.sizes = t->sizes;
      o.strides = t->strides;
      o.storage_bytes = t->numel() * dtype_size_bytes(t->dtype);
      outs.push_back(o);
      break;
    }
  }
  const OpCost cost = op_cost(r.signature, outs);
  const double floor_ns = cost.bytes / bandwidth * 1e9;
  if (floor_ns <= 0) return 2.0;
  return std::max(1.0, mean / floor_ns);
}

std::optional<SignatureId> HotSignatures::next_to_search(const std::function<bool(const OpSignature&)>& runnable,
                                                         const std::function<double(const OpSignature&)>& bandwidth) {
  std::optional<SignatureId> best;
  double best_saving = -1;
  for (auto& [id, r] : signatures_) {
    if (r.state != SearchState::kObserved && r.state != SearchState::kUnrunnable) continue;
    if (r.calls() < options_.min_calls) continue;
    if (options_.min_time_share > 0 && time_share(r) < options_.min_time_share) continue;
    if (!runnable(r.signature)) {
      r.state = SearchState::kUnrunnable;
      r.note = "no evaluation slot runs " + std::string(backend_name(r.signature.target.backend)) + " " + r.signature.target.arch;
      continue;
    }
    if (r.state == SearchState::kUnrunnable) {
      r.state = SearchState::kObserved;
      r.note.clear();
    }
    const double h = headroom(r, bandwidth(r.signature));
    // Never sampled: rank by calls alone, behind every signature with a measured time.
    const double saving = r.mean_ns() > 0 ? r.total_ns() * (1 - 1 / h) : 1e-9 * static_cast<double>(r.calls());
    if (saving > best_saving) {
      best_saving = saving;
      best = id;
    }
  }
  return best;
}

SignatureRecord* HotSignatures::find(const SignatureId& id) {
  auto it = signatures_.find(id);
  return it == signatures_.end() ? nullptr : &it->second;
}

SignatureRecord& HotSignatures::adopt(const OpSignature& sig) {
  const SignatureId id = sig.id();
  auto [it, inserted] = signatures_.try_emplace(id);
  if (inserted) {
    it->second.signature = sig;
    it->second.id = id;
  }
  return it->second;
}

std::vector<std::string> HotSignatures::peers_of(const SignatureId& id) const {
  std::vector<std::string> out;
  auto it = signatures_.find(id);
  if (it == signatures_.end()) return out;
  for (const auto& [peer, p] : processes_) {
    if (!p.gone && it->second.by_pid.count(p.hello.pid) > 0) out.push_back(peer);
  }
  return out;
}

std::vector<std::string> HotSignatures::live_peers() const {
  std::vector<std::string> out;
  for (const auto& [peer, p] : processes_) {
    if (!p.gone) out.push_back(peer);
  }
  return out;
}

}  // namespace kforge::daemon

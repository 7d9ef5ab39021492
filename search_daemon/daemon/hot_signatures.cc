#include "search_daemon/daemon/hot_signatures.h"

#include <algorithm>
#include <charconv>

#include "search_daemon/evaluator/eval_protocol.h"
#include "runtime/op_catalog.h"

namespace kforge::daemon {

namespace {

// ProcessRecord::goodbye_reason of a process expire() found gone.
constexpr std::string_view kExitedWithoutGoodbye = "exited without a Goodbye";
constexpr std::string_view kSilent = "sent nothing for too long";

// Note [Bounded state]: the attested pid of a local peer; else the claimed pid and the peer's
// address, with the top bit set so the two kinds never meet (and never meet kDeparted).
uint64_t process_key(const PeerCredentials& c, int32_t claimed_pid) {
  if (c.pid > 0) return static_cast<uint64_t>(c.pid);
  uint64_t h = 1469598103934665603ull;   // FNV-1a
  for (char ch : c.address) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  return (uint64_t{1} << 63) | ((h & 0x7fffffffull) << 32) | static_cast<uint32_t>(claimed_pid);
}

uint64_t captured_size(const wire::CapturedInputs& c) {
  uint64_t n = 0;
  for (const wire::CapturedTensor& t : c.tensors) n += t.bytes.size() + 64;
  return n;
}

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

PeerCredentials peer_credentials_from_address(std::string_view a) {
  PeerCredentials c;
  // ipc://: "<host>:<uid>:<gid>:<pid>" (libzmq's stream engine, with SO_PEERCRED). An IPv6
  // address has colons too, but never three decimal fields at its end after a non-hex host.
  const size_t p3 = a.rfind(':');
  if (p3 != std::string_view::npos && p3 > 0) {
    const size_t p2 = a.rfind(':', p3 - 1);
    const size_t p1 = p2 == std::string_view::npos || p2 == 0 ? std::string_view::npos : a.rfind(':', p2 - 1);
    if (p1 != std::string_view::npos && a.substr(0, p1) == "localhost") {
      int32_t pid = 0;
      const std::string_view field = a.substr(p3 + 1);
      auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), pid);
      if (ec == std::errc() && end == field.data() + field.size() && pid > 0) {
        c.pid = pid;
        return c;
      }
    }
  }
  c.address = std::string(a.substr(0, 128));
  return c;
}

uint64_t SignatureRecord::calls() const {
  uint64_t n = 0;
  for (const auto& [key, p] : by_process) n += p.calls;
  return n;
}

double SignatureRecord::mean_ns() const {
  uint64_t n = 0, ns = 0;
  for (const auto& [key, p] : by_process) {
    n += p.sampled_calls;
    ns += p.sampled_ns;
  }
  return n > 0 ? static_cast<double>(ns) / static_cast<double>(n) : 0;
}

namespace {

double time_at(const SignatureRecord::PerProcess& p, double pooled_mean) {
  const double mean = p.sampled_calls > 0 ? static_cast<double>(p.sampled_ns) / static_cast<double>(p.sampled_calls)
                                          : pooled_mean;
  return static_cast<double>(p.calls) * mean;
}

}  // namespace

double SignatureRecord::process_ns(const PerProcess& p) const { return time_at(p, mean_ns()); }

double SignatureRecord::total_ns() const {
  const double pooled = mean_ns();
  double t = 0;
  for (const auto& [key, p] : by_process) t += time_at(p, pooled);
  return t;
}

// ---- processes ------------------------------------------------------------------------------------

ProcessRecord* HotSignatures::process(const std::string& peer) {
  auto it = processes_.find(peer);
  return it == processes_.end() ? nullptr : &it->second;
}

void HotSignatures::drop_process(std::map<std::string, ProcessRecord>::iterator it) {
  const uint64_t key = it->second.key;
  processes_.erase(it);
  for (const auto& [peer, p] : processes_) {
    if (p.key == key) return;   // another connection of the same process keeps the counters
  }
  // Fold its counters into the departed bucket of each signature (Note [Bounded state]).
  auto ks = key_signatures_.find(key);
  if (ks == key_signatures_.end()) return;
  for (const SignatureId& id : ks->second) {
    auto s = signatures_.find(id);
    if (s == signatures_.end()) continue;
    auto pp = s->second.by_process.find(key);
    if (pp == s->second.by_process.end()) continue;
    SignatureRecord::PerProcess& d = s->second.by_process[SignatureRecord::kDeparted];
    d.calls += pp->second.calls;
    d.sampled_calls += pp->second.sampled_calls;
    d.sampled_ns += pp->second.sampled_ns;
    s->second.by_process.erase(pp);
  }
  key_signatures_.erase(ks);
}

void HotSignatures::make_room_for_process(const PeerCredentials& creds) {
  // The oldest of a set by one order: gone ones first (longest gone), then those that never
  // brought a signature (a bare Hello), then the least recently heard from.
  auto worse = [](const ProcessRecord& a, const ProcessRecord& b) {
    if (a.gone != b.gone) return a.gone;
    if (a.gone) return a.gone_since < b.gone_since;
    if ((a.signatures == 0) != (b.signatures == 0)) return a.signatures == 0;
    return a.last_seen < b.last_seen;
  };
  auto evict_worst = [&](auto&& in_set) {
    auto victim = processes_.end();
    for (auto it = processes_.begin(); it != processes_.end(); ++it) {
      if (!in_set(it->second)) continue;
      if (victim == processes_.end() || worse(it->second, victim->second)) victim = it;
    }
    if (victim == processes_.end()) return;
    ++counters_.processes_evicted;
    drop_process(victim);
  };
  if (creds.pid > 0) {
    size_t same = 0;
    for (const auto& [peer, p] : processes_) same += p.peer_pid == creds.pid ? 1 : 0;
    if (same >= std::max<size_t>(options_.max_peers_per_pid, 1)) {
      evict_worst([&](const ProcessRecord& p) { return p.peer_pid == creds.pid; });
    }
  }
  if (processes_.size() >= std::max<size_t>(options_.max_processes, 1)) {
    evict_worst([](const ProcessRecord&) { return true; });
  }
}

ProcessRecord& HotSignatures::record_for(const std::string& peer, const PeerCredentials& creds, int32_t claimed_pid) {
  const SteadyClock::time_point now = options_.clock();
  auto it = processes_.find(peer);
  if (it == processes_.end()) {
    make_room_for_process(creds);
    it = processes_.emplace(peer, ProcessRecord{}).first;
    ProcessRecord& p = it->second;
    p.peer = peer;
    p.peer_pid = creds.pid;
    p.key = process_key(creds, claimed_pid);
    p.first_seen = now;
  }
  it->second.last_seen = now;
  return it->second;
}

void HotSignatures::on_hello(const std::string& peer, const wire::Hello& hello, const PeerCredentials& creds) {
  ProcessRecord& p = record_for(peer, creds, hello.pid);
  // A new connection of the same peer (a hook that reconnected) or a new process. Its GPUs in use
  // are the next report's to say.
  p.hello = hello;
  p.gone = false;
  p.goodbye_reason.clear();
  p.gpus_in_use.clear();
}

uint64_t HotSignatures::on_report(const std::string& peer, const wire::HotReport& report, const PeerCredentials& creds) {
  ProcessRecord& p = record_for(peer, creds, report.pid);
  if (p.hello.pid == 0) p.hello.pid = report.pid;
  ++p.reports;
  p.reports_dropped = report.reports_dropped;
  if (p.last_sequence != 0 && report.sequence > p.last_sequence + 1) p.sequence_gaps += report.sequence - p.last_sequence - 1;
  p.last_sequence = std::max(p.last_sequence, report.sequence);
  p.gpus_in_use = report.gpus_in_use;
  // A process that reports is attached, whatever expire() concluded (Goodbye is its last).
  if (p.gone && (p.goodbye_reason == kExitedWithoutGoodbye || p.goodbye_reason == kSilent)) {
    p.gone = false;
    p.goodbye_reason.clear();
  }
  const uint64_t key = p.key;
  uint64_t refused = 0;
  for (const wire::HotEntry& e : report.entries) {
    const SignatureId id = e.signature.id();
    SignatureRecord* r = find(id);
    const bool new_for_process = r == nullptr || r->by_process.count(key) == 0;
    if (new_for_process && p.signatures >= options_.max_signatures_per_process) {
      ++p.signatures_refused;
      ++counters_.signatures_refused;
      ++refused;
      continue;
    }
    if (r == nullptr) r = insert_signature(e.signature, id);
    if (new_for_process) {
      ++p.signatures;
      key_signatures_[key].push_back(id);
    }
    SignatureRecord::PerProcess& pp = r->by_process[key];
    // Cumulative counters: keep the latest (a restarted process with the same pid starts lower).
    pp.calls = e.calls;
    pp.sampled_calls = e.sampled_calls;
    pp.sampled_ns = e.sampled_total_ns;
    pp.in_process = e.in_process;
    if (!e.input_stats.empty()) r->input_stats = e.input_stats;
  }
  return refused;
}

bool HotSignatures::on_captured(const std::string& peer, const wire::CapturedInputs& captured, const PeerCredentials& creds) {
  (void)record_for(peer, creds, captured.pid);
  auto it = signatures_.find(captured.signature_id);
  const uint64_t bytes = captured_size(captured);
  // Captured inputs of a signature never reported have nothing to attach to.
  if (it == signatures_.end() || it->second.captured.size() >= eval::kMaxCapturedCalls ||
      captured_bytes_ + bytes > options_.max_captured_bytes) {
    ++counters_.captured_refused;
    return false;
  }
  it->second.captured.push_back(captured);
  captured_bytes_ += bytes;
  return true;
}

void HotSignatures::on_goodbye(const std::string& peer, const wire::Goodbye& bye, const PeerCredentials& creds) {
  ProcessRecord& p = record_for(peer, creds, bye.pid);
  if (!p.gone) p.gone_since = options_.clock();
  p.gone = true;
  p.goodbye_reason = bye.reason;
  p.gpus_in_use.clear();
}

HotSignatures::Expired HotSignatures::expire(const std::function<bool(int32_t pid)>& alive) {
  Expired out;
  const SteadyClock::time_point now = options_.clock();
  for (auto it = processes_.begin(); it != processes_.end();) {
    ProcessRecord& p = it->second;
    if (!p.gone) {
      const bool exited = p.peer_pid > 0 && !alive(p.peer_pid);
      const bool silent = now - p.last_seen > options_.process_timeout;
      if (exited || silent) {
        p.gone = true;
        p.gone_since = now;
        p.goodbye_reason = exited ? kExitedWithoutGoodbye : kSilent;
        p.gpus_in_use.clear();
        (exited ? out.exited : out.silent).push_back(p.hello.pid);
      }
    }
    if (p.gone && now - p.gone_since > options_.gone_retention) {
      auto victim = it++;
      ++counters_.processes_expired;
      ++out.dropped;
      drop_process(victim);
      continue;
    }
    ++it;
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

// ---- signatures -----------------------------------------------------------------------------------

SignatureRecord* HotSignatures::insert_signature(const OpSignature& sig, const SignatureId& id) {
  if (signatures_.size() >= std::max<size_t>(options_.max_signatures, 1)) evict_cold_signatures();
  SignatureRecord& r = signatures_[id];
  r.signature = sig;
  r.id = id;
  return &r;
}

void HotSignatures::erase_signature(std::map<SignatureId, SignatureRecord>::iterator it) {
  for (const wire::CapturedInputs& c : it->second.captured) captured_bytes_ -= std::min(captured_bytes_, captured_size(c));
  signatures_.erase(it);
}

void HotSignatures::evict_cold_signatures() {
  struct Cold {
    double ns;
    uint64_t calls;
    std::map<SignatureId, SignatureRecord>::iterator it;
  };
  std::vector<Cold> cold;
  cold.reserve(signatures_.size());
  for (auto it = signatures_.begin(); it != signatures_.end(); ++it) {
    if (it->second.state == SearchState::kSearching) continue;   // a session refers to it
    cold.push_back(Cold{it->second.total_ns(), it->second.calls(), it});
  }
  if (cold.empty()) return;
  const size_t n = std::min(cold.size(), std::max<size_t>(options_.max_signatures / 16, 1));
  auto colder = [](const Cold& a, const Cold& b) { return a.ns != b.ns ? a.ns < b.ns : a.calls < b.calls; };
  std::nth_element(cold.begin(), cold.begin() + static_cast<std::ptrdiff_t>(n - 1), cold.end(), colder);
  for (size_t i = 0; i < n; ++i) erase_signature(cold[i].it);
  counters_.signatures_evicted += n;
  // The process keys' lists may now name evicted signatures: compact a list once it is twice the
  // quota, so they stay bounded.
  for (auto& [key, ids] : key_signatures_) {
    if (ids.size() <= 2 * options_.max_signatures_per_process) continue;
    std::erase_if(ids, [&](const SignatureId& id) { return signatures_.count(id) == 0; });
  }
}

HotSignatures::ProcessTimes HotSignatures::process_times() const {
  ProcessTimes t;
  for (const auto& [id, r] : signatures_) {
    const double pooled = r.mean_ns();
    for (const auto& [key, p] : r.by_process) t[key] += time_at(p, pooled);
  }
  return t;
}

double HotSignatures::time_share(const SignatureRecord& r, const ProcessTimes& times) const {
  // The total time of every signature of the processes that reported this one.
  double total = 0;
  for (const auto& [key, p] : r.by_process) {
    const auto it = times.find(key);
    if (it != times.end()) total += it->second;
  }
  return total > 0 ? std::min(1.0, r.total_ns() / total) : 0;
}

double HotSignatures::headroom(const SignatureRecord& r, double bandwidth) const {
  const double mean = r.mean_ns();
  if (mean <= 0 || bandwidth <= 0) return 2.0;
  const catalog::OpCost cost = catalog::op_cost(r.signature);
  const double floor_ns = cost.bytes / bandwidth * 1e9;
  if (floor_ns <= 0) return 2.0;
  return std::max(1.0, mean / floor_ns);
}

std::optional<SignatureId> HotSignatures::next_to_search(const std::function<bool(const OpSignature&)>& runnable,
                                                         const std::function<double(const OpSignature&)>& bandwidth) {
  std::optional<SignatureId> best;
  double best_saving = -1;
  bool best_fresh = false;   // no evaluation yet: ahead of paused searches (Note [Search priority])
  std::optional<ProcessTimes> times;
  for (auto& [id, r] : signatures_) {
    if (r.state != SearchState::kObserved && r.state != SearchState::kUnrunnable) continue;
    if (r.calls() < options_.min_calls) continue;
    if (options_.min_time_share > 0) {
      if (!times) times = process_times();
      if (time_share(r, *times) < options_.min_time_share) continue;
    }
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
    const bool fresh = r.evaluations == 0;
    if (!best || (fresh && !best_fresh) || (fresh == best_fresh && saving > best_saving)) {
      best_saving = saving;
      best_fresh = fresh;
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
  if (SignatureRecord* r = find(id)) return *r;
  return *insert_signature(sig, id);
}

std::vector<std::string> HotSignatures::peers_of(const SignatureId& id) const {
  std::vector<std::string> out;
  auto it = signatures_.find(id);
  if (it == signatures_.end()) return out;
  for (const auto& [peer, p] : processes_) {
    if (!p.gone && it->second.by_process.count(p.key) > 0) out.push_back(peer);
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

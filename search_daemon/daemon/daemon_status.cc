#include "search_daemon/daemon/daemon_status.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/version.h"

namespace kforge::daemon {

using json = nlohmann::json;

std::string status_document(const StatusInputs& in, std::optional<uint32_t> limit) {
  const DaemonConfig& config = *in.config;
  const HotSignatures& hot = *in.hot;
  json j;
  j["daemon"] = {{"pid", ::getpid()},
                 {"version", KFORGE_VERSION_STRING},
                 {"uptime_s", in.uptime_s},
                 {"endpoint", config.endpoint},
                 {"events_endpoint", config.events_endpoint},
                 {"strategy", config.strategy},
                 {"cache_dir", config.cache_dir},
                 {"state_dir", config.state_dir}};
  j["budgets"] = {{"evaluations_total", in.evaluations_total},
                  {"max_evaluations_total", config.max_evaluations_total},
                  {"max_evaluations_per_signature", config.max_evaluations_per_signature},
                  {"max_seconds_per_signature", config.max_seconds_per_signature}};
  json slots = json::array();
  const std::map<std::string, std::vector<int32_t>> on_gpu = serving_gpus(hot.processes());
  for (const eval::SlotInfo& s : *in.slots) {
    const auto pids = on_gpu.find(s.uuid);
    slots.push_back({{"device", s.device}, {"state", s.state}, {"arch", s.arch}, {"model", s.device_model},
                     {"uuid", s.uuid}, {"serving_pids", pids == on_gpu.end() ? std::vector<int32_t>{} : pids->second},
                     {"jobs", s.jobs}, {"restarts", s.restarts}, {"bandwidth_bytes_per_s", s.bandwidth_bytes_per_s}});
  }
  j["slots"] = slots;
  // Note [Time saved]: what the kernels running in each process saved it, by its own trial's
  // medians: active calls x (PyTorch's median - the entry's). An estimate (the trial's calls stand
  // for the later ones), never measured per call; 0 where the trial timed nothing.
  struct InProcess {
    double saved_ns = 0;
    std::map<std::string, uint64_t> states;   // entries by state
  };
  std::map<uint64_t, InProcess> by_key;
  for (const auto& [id, r] : hot.signatures()) {
    for (const auto& [key, pp] : r.by_process) {
      for (const wire::EntryInProcess& e : pp.in_process) {
        InProcess& ip = by_key[key];
        ++ip.states[e.state];
        if (e.pytorch_median_ns > e.entry_median_ns && e.entry_median_ns > 0) {
          ip.saved_ns += static_cast<double>(e.active_calls) * static_cast<double>(e.pytorch_median_ns - e.entry_median_ns);
        }
      }
    }
  }
  std::map<uint64_t, int32_t> pid_of;   // process key -> the pid its Hello gave
  json procs = json::array();
  size_t attached = 0;
  for (const auto& [peer, p] : hot.processes()) {
    pid_of[p.key] = p.hello.pid;
    attached += p.gone ? 0 : 1;
    procs.push_back({{"pid", p.hello.pid}, {"peer_pid", p.peer_pid}, {"torch", p.hello.torch_version},
                     {"reports", p.reports}, {"reports_dropped", p.reports_dropped}, {"sequence_gaps", p.sequence_gaps},
                     {"signatures", p.signatures}, {"signatures_refused", p.signatures_refused},
                     {"attached", !p.gone}, {"goodbye", p.goodbye_reason}, {"gpus", p.gpus_in_use},
                     {"cache_dir", p.hello.cache_dir}, {"shares_cache", p.shares_cache}});
    const auto ip = by_key.find(p.key);
    procs.back()["kernels"] = ip == by_key.end() ? json::object() : json(ip->second.states);
    procs.back()["saved_ns"] = ip == by_key.end() ? 0.0 : ip->second.saved_ns;
  }
  j["processes"] = procs;
  j["processes_attached"] = attached;

  // Largest share first: the shares in one pass over the registry, then one sort.
  const HotSignatures::ProcessTimes times = hot.process_times();
  struct Row {
    double share;
    const SignatureRecord* r;
  };
  std::vector<Row> rows;
  rows.reserve(hot.signatures().size());
  for (const auto& [id, r] : hot.signatures()) rows.push_back(Row{hot.time_share(r, times), &r});
  const size_t shown = std::min<size_t>(rows.size(), limit.value_or(static_cast<uint32_t>(rows.size())));
  auto order = [](const Row& a, const Row& b) {
    if (a.share != b.share) return a.share > b.share;
    return a.r->calls() != b.r->calls() ? a.r->calls() > b.r->calls() : a.r->id < b.r->id;
  };
  std::partial_sort(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(shown), rows.end(), order);
  json sigs = json::array();
  for (size_t i = 0; i < shown; ++i) {
    const SignatureRecord& r = *rows[i].r;
    json s{{"id", r.id.hex()},
           {"signature", r.signature.to_string()},
           {"state", search_state_name(r.state)},
           {"calls", r.calls()},
           {"mean_ns", r.mean_ns()},
           {"time_share", rows[i].share},
           {"evaluations", r.evaluations},
           {"shared_gpu_timings", r.shared_gpu_timings},
           {"implausible_timings", r.implausible_timings},
           {"best_speedup", r.best_speedup},
           {"entry", r.entry_key},
           {"note", r.note}};
    // Where its entries run: per process (at most kMaxInProcessRows), the entry, its state there
    // and that process's trial medians.
    constexpr size_t kMaxInProcessRows = 32;
    json where = json::array();
    for (const auto& [key, pp] : r.by_process) {
      for (const wire::EntryInProcess& e : pp.in_process) {
        if (where.size() >= kMaxInProcessRows) break;
        const auto pid = pid_of.find(key);
        where.push_back({{"pid", pid == pid_of.end() ? 0 : pid->second}, {"entry", e.entry_key}, {"state", e.state},
                         {"active_calls", e.active_calls}, {"pytorch_median_ns", e.pytorch_median_ns},
                         {"entry_median_ns", e.entry_median_ns}});
      }
    }
    s["in_process"] = std::move(where);
    if (std::optional<SessionProgress> p = in.progress(r.id)) {
      s["search"] = {{"state", session_state_name(p->state)}, {"nodes", p->nodes}, {"evaluated", p->evaluated}, {"in_flight", p->in_flight},
                     {"best_speedup", p->best_speedup}, {"best", p->best_label}};
      s["evaluations"] = p->evaluated;
      if (p->best_speedup > r.best_speedup) s["best_speedup"] = p->best_speedup;
    }
    sigs.push_back(std::move(s));
  }
  j["signatures"] = std::move(sigs);
  j["signatures_total"] = rows.size();
  json c = json::object();
  for (const auto& [k, v] : *in.counters) c[k] = v;
  const HotCounters& hc = hot.counters();
  c["processes_evicted"] = hc.processes_evicted;
  c["processes_expired"] = hc.processes_expired;
  c["signatures_evicted"] = hc.signatures_evicted;
  c["log_lines_suppressed"] = in.log_lines_suppressed;
  j["counters"] = c;
  // A signature string or note may quote a client's bytes: never throw on invalid UTF-8.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kforge::daemon

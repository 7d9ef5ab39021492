#include "cache/entry_json.h"

#include "runtime/human_units.h"

namespace kforge {

using json = nlohmann::ordered_json;   // the CLI prints keys in this order

json entry_summary_json(const StoredEntry& e) {
  return json{{"key", e.key.hex()},
              {"signature", e.signature.to_string()},
              {"op", e.signature.op},
              {"backend", std::string(backend_name(e.environment.backend))},
              {"arch", e.environment.arch},
              {"state", std::string(entry_state_name(e.status.state))},
              {"reason", e.status.reason},
              {"pinned", e.status.pinned},
              {"speedup", e.timings.speedup()},
              {"baseline_ns", e.timings.baseline_ns},
              {"candidate_ns", e.timings.candidate_ns},
              {"last_use_unix_ms", e.status.last_use_unix_ms},
              {"created_unix_ms", e.provenance.created_unix_ms}};
}

std::vector<Store::NoWinRecord> no_wins(const Store& store, const EntryKey& key) {
  StatusOr<std::vector<Store::NoWinRecord>> r = store.no_win_records(key);
  return r.ok() ? std::move(*r) : std::vector<Store::NoWinRecord>();
}

std::string describe_no_win(const Store::NoWinRecord& r) {
  return "no win in process " + std::to_string(r.pid) + " (" + human_duration_ns(static_cast<double>(r.entry_ns)) + " vs " +
         human_duration_ns(static_cast<double>(r.pytorch_ns)) + ")";
}

json no_wins_json(const std::vector<Store::NoWinRecord>& records) {
  json list = json::array();
  for (const Store::NoWinRecord& r : records) {
    list.push_back(json{{"pid", r.pid}, {"entry_ns", r.entry_ns}, {"pytorch_ns", r.pytorch_ns},
                        {"text", describe_no_win(r)}});
  }
  return list;
}

}  // namespace kforge

// The status document: what `kforge status`, the HTTP API (/api/status) and the GUI show of a
// running kforged, as one JSON object. Built from the daemon's parts under the daemon's lock, in
// O(n log n) for n signatures (the time shares in one pass, a sort for the order), whatever the
// registry holds (Note [Bounded state] in hot_signatures.h).
//
//   StatusInputs in{&config, uptime, evaluations, &slots, &hot, &counters, progress_of};
//   std::string json = status_document(in, /*limit=*/20);
//
// Signatures come largest time share first; `limit` keeps the first n (the document's
// "signatures_total" says how many there are). The layout is documented by `kforge status --json`
// and docs/ARCHITECTURE.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "search_daemon/daemon/client_messages.h"
#include "search_daemon/daemon/daemon_config.h"
#include "search_daemon/daemon/hot_signatures.h"
#include "search_daemon/daemon/search_session.h"
#include "search_daemon/evaluator/evaluator_pool.h"

namespace kforge::daemon {

struct StatusInputs {
  const DaemonConfig* config = nullptr;
  double uptime_s = 0;
  uint64_t evaluations_total = 0;
  const std::vector<eval::SlotInfo>* slots = nullptr;
  const HotSignatures* hot = nullptr;
  const Counters* counters = nullptr;
  uint64_t log_lines_suppressed = 0;   // LogLimiter::suppressed_total()
  // A running search's progress (nullopt: none runs for the signature).
  std::function<std::optional<SessionProgress>(const SignatureId&)> progress;
};

std::string status_document(const StatusInputs& in, std::optional<uint32_t> limit);

}  // namespace kforge::daemon

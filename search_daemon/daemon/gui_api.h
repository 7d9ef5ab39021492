// The web GUI's server side (Note [Web GUI] in gui_api.cc): its files and the JSON documents that
// kforged's HTTP listener (daemon.http, loopback only) serves beside /metrics and /api/status.
// A search's documents come from its journal on disk, read as a restarted daemon would read it
// (SearchJournal::read, never opened for writing), live updates from the EventLog of what the
// daemon published, the cache page from the cache. The only writes are the cache actions and
// stopping a search (daemon.cc), behind the token (Note [GUI token]).
//
//   StatusOr<GuiAssets> assets = GuiAssets::load(default_gui_dir());
//   json tree = tree_json(*SearchJournal::read(path));
//   EventLog events;  events.append(line);  events.after(seq, 256, 15s);
//
// Promises:
// - No document carries a secret: journals hold signatures, kernel sources, plans, outcomes and an
//   LLM move's conversation (already redacted by the LLM client: Note [Key redaction]); no key,
//   input or path outside the state directory.
// - Nothing throws out of these functions into the HTTP handlers; bad input is a Status naming it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/store.h"
#include "runtime/status.h"
#include "search_daemon/daemon/journal.h"

namespace kforge::daemon {

// The GUI's files (index.html, app.js, style.css), read once at start-up.
struct GuiAssets {
  struct File {
    std::string content_type;
    std::string bytes;
  };
  std::map<std::string, File> files;   // by name, exactly the names above
  // An error names the file that is missing or unreadable.
  static StatusOr<GuiAssets> load(const std::string& dir);
};

// <the directory of this program>/../share/kforge/gui: the bundle's layout (bin/, share/) and the
// build tree's (search_daemon/kforged, share/kforge/gui).
std::string default_gui_dir();

// /api/searches: every journal in state_dir, summarized (signature, strategy, nodes, evaluated,
// in flight, done and why, best speedup and its label); unreadable journals listed with the error.
nlohmann::json searches_json(const std::string& state_dir);

// /api/progress: per search, the best speedup over time (the charts page): one point per
// evaluation that raised the best (a published kind: measured, significant, believable), with its
// time since the search began (null for outcomes journaled before times were kept) and its
// evaluation's rank; plus the search's start and its evaluations so far.
nlohmann::json progress_json(const std::string& state_dir);

// /api/tree/<id>: the tree's nodes with their status ("pending", "in_flight" or the outcome's
// eval status name), speedup, proposer, label, prior, visits and mean reward (Note [Reward]) of
// their subtree, and whether they are the best node or on the path to it.
nlohmann::json tree_json(const SearchJournal::Contents& c);

// /api/candidate/<id>/<node>: one node in full: its source, compile options, launch plan, its
// parent's source (for the diff), its outcome (message, compile log, failed check, times and
// spreads, PyTorch's own error), the catalog's fewest bytes for the operator (its achieved
// bandwidth) and, for an LLM move, the conversation that wrote it. nullopt for
// the root or a node the tree does not have.
std::optional<nlohmann::json> candidate_json(const SearchJournal::Contents& c, uint64_t node);

// /api/cache: every entry of the cache at `store` (entry_summary_json, its no-win records, its
// proposer, host and search, its blobs' names and sizes), and the entries that cannot be read,
// with why.
nlohmann::ordered_json cache_json(const Store& store);

// Note [GUI token] in gui_api.cc: a fresh random token in <state_dir>/gui-token (0600, the state
// directory 0700), written at start-up; the actions need it. Returns the token.
StatusOr<std::string> write_gui_token(const std::string& state_dir);
// Whether `given` is the token, in time independent of where they differ.
bool token_matches(std::string_view given, std::string_view token);
// The entry's state after an action on it: "disable", "enable", "pin" or "unpin" (an entry named
// by its 32-digit key). Errors name the action or entry that is wrong.
StatusOr<nlohmann::ordered_json> cache_action(Store& store, const std::string& key_hex, const std::string& action);

// The last `capacity` events the daemon published (the PUB socket's JSON), numbered from 1, for
// /api/events (server-sent events; a page that reconnects sends the last number it saw).
class EventLog {
 public:
  explicit EventLog(size_t capacity = 4096) : capacity_(capacity) {}
  void append(std::string json_line);
  struct Batch {
    std::vector<std::pair<uint64_t, std::string>> events;   // number, JSON
    bool missed = false;   // events after `seq` were dropped from the log before this call
  };
  // Events numbered after `seq` (at most `max`), waiting up to `wait` for one when there is none.
  // Empty after close().
  Batch after(uint64_t seq, size_t max, std::chrono::milliseconds wait);
  uint64_t last() const;
  // Wakes every waiter for good (the daemon is stopping).
  void close();
  bool closed() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::string>> events_;
  uint64_t next_ = 1;
  bool closed_ = false;
};

}  // namespace kforge::daemon

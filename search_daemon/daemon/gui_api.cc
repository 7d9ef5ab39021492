#include "search_daemon/daemon/gui_api.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache/entry_json.h"
#include "runtime/op_catalog.h"
#include "search_daemon/proposers/llm/kernel_answer.h"

namespace kforge::daemon {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// Note [Web GUI]
// The GUI is three static files (search_daemon/daemon/gui/: plain HTML, CSS and JavaScript, no
// build step, nothing fetched at run time) that kforged serves under /gui/ on its HTTP listener,
// and reads:
//   /api/status                 the status document (`kforge status`): processes, workers,
//                               signatures with their state, time share and best speedup;
//   /api/searches               every search's journal, summarized;
//   /api/tree/<signature id>    one search's tree (tree_json);
//   /api/candidate/<id>/<node>  one candidate (candidate_json);
//   /api/progress               per search, its best speedup over time (progress_json);
//   /api/cache                  the cache's entries (cache_json);
//   /api/events                 server-sent events: every event the daemon publishes on its PUB
//                               socket (node, result, published, finished), numbered; a page that
//                               reconnects sends Last-Event-ID and gets what it missed, or an event
//                               "reset" when the log no longer holds it (then it reloads).
// The journals are the source of the trees: they hold every node and outcome as they happen
// (fdatasync'ed), so the GUI shows exactly what a restarted daemon would resume, and the search
// threads share nothing with the HTTP threads. Reads are SearchJournal::read (never opened for
// writing; a record being written is a torn tail, ignored). Everything is read-only but the
// actions behind the token (Note [GUI token]: the cache's, and stopping a search); the listener
// is loopback only (daemon.http), requests are bounded (64 KiB, 5 s timeouts), paths outside these
// forms are 404, a signature id is 32 hex digits and a node a number, so no request names a file.

namespace {

std::string read_file(const fs::path& p, std::string& error) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    error = "cannot read " + p.string();
    return {};
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json outcome_json(const search::Outcome& o) {
  json j = {{"status", std::string(eval::eval_status_name(o.status))},
            {"speedup", o.speedup},
            {"noise_band", o.noise_band},
            {"significant", o.significant},
            {"improves", o.improves()},
            {"baseline_ns", o.baseline_ns},
            {"candidate_ns", o.candidate_ns},
            {"baseline_spread", o.baseline_spread},
            {"candidate_spread", o.candidate_spread},
            {"torch_max_abs_error", o.torch_max_abs_error},
            {"torch_rel_error", o.torch_rel_error},
            {"failed_check", o.failed_check},
            {"message", o.message},
            {"build_log", o.build_log},
            {"shared_gpu_pids", o.shared_gpu_pids},
            {"implausible", o.implausible},
            {"reward", search::reward(o)}};
  return j;
}

std::string node_status(const search::Node& n) {
  if (n.outcome) return std::string(eval::eval_status_name(n.outcome->status));
  return n.virtual_loss > 0 ? "in_flight" : "pending";
}

}  // namespace

StatusOr<GuiAssets> GuiAssets::load(const std::string& dir) {
  static const std::pair<const char*, const char*> kFiles[] = {
      {"index.html", "text/html; charset=utf-8"},
      {"app.js", "text/javascript; charset=utf-8"},
      {"style.css", "text/css; charset=utf-8"},
  };
  GuiAssets a;
  for (const auto& [name, type] : kFiles) {
    std::string error;
    std::string bytes = read_file(fs::path(dir) / name, error);
    if (!error.empty()) return unavailable("the GUI's files: " + error + " (daemon.gui_dir)");
    a.files[name] = File{type, std::move(bytes)};
  }
  return a;
}

std::string default_gui_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/kforge/gui";
  return (self.parent_path() / ".." / "share" / "kforge" / "gui").lexically_normal().string();
}

json searches_json(const std::string& state_dir) {
  json out = json::array();
  for (const std::string& path : SearchJournal::list(state_dir)) {
    const std::string id = fs::path(path).stem().string();
    StatusOr<SearchJournal::Contents> c = SearchJournal::read(path);
    if (!c.ok()) {
      out.push_back({{"id", id}, {"error", c.status().message()}});
      continue;
    }
    size_t in_flight = 0;
    for (const search::Node& n : c->tree.nodes()) {
      if (n.id != 0 && !n.outcome && n.virtual_loss > 0) ++in_flight;
    }
    json j = {{"id", id},
              {"signature", c->signature.to_string()},
              {"op", c->signature.op},
              {"strategy", c->strategy},
              {"nodes", c->tree.size() - 1},
              {"evaluated", c->tree.evaluated()},
              {"in_flight", in_flight},
              {"done", c->done},
              {"done_reason", c->done_reason},
              {"best_speedup", 0.0},
              {"best_label", ""}};
    if (const search::Node* b = c->tree.best()) {
      j["best_speedup"] = b->outcome->speedup;
      j["best_label"] = b->move.label;
      j["best_node"] = b->id;
    }
    out.push_back(std::move(j));
  }
  return out;
}

json progress_json(const std::string& state_dir) {
  json out = json::array();
  for (const std::string& path : SearchJournal::list(state_dir)) {
    StatusOr<SearchJournal::Contents> c = SearchJournal::read(path);
    if (!c.ok()) continue;   // /api/searches names it
    // Evaluations in the order they finished: by time where journaled, else by node id (the order
    // of submission, close to it).
    std::vector<const search::Node*> done;
    for (const search::Node& n : c->tree.nodes()) {
      if (n.id != 0 && n.outcome) done.push_back(&n);
    }
    std::stable_sort(done.begin(), done.end(), [](const search::Node* a, const search::Node* b) {
      const uint64_t ta = a->outcome->finished_unix_ms, tb = b->outcome->finished_unix_ms;
      if (ta != 0 && tb != 0) return ta < tb;
      return a->id < b->id;
    });
    json points = json::array();
    double best = 1.0;
    uint64_t last_ms = 0;
    for (size_t k = 0; k < done.size(); ++k) {
      const search::Outcome& o = *done[k]->outcome;
      if (o.finished_unix_ms != 0) last_ms = o.finished_unix_ms;
      if (!o.improves() || o.speedup <= best) continue;
      best = o.speedup;
      json t = nullptr;
      if (o.finished_unix_ms != 0 && c->created_unix_ms != 0 && o.finished_unix_ms >= c->created_unix_ms) {
        t = static_cast<double>(o.finished_unix_ms - c->created_unix_ms) / 1000.0;
      }
      points.push_back({{"t_s", t}, {"evaluation", k + 1}, {"speedup", o.speedup}, {"node", done[k]->id}, {"label", done[k]->move.label}});
    }
    json j = {{"id", fs::path(path).stem().string()},
              {"signature", c->signature.to_string()},
              {"op", c->signature.op},
              {"evaluated", done.size()},
              {"done", c->done},
              {"points", std::move(points)}};
    j["last_t_s"] = last_ms != 0 && c->created_unix_ms != 0 && last_ms >= c->created_unix_ms
                        ? json(static_cast<double>(last_ms - c->created_unix_ms) / 1000.0)
                        : json(nullptr);
    out.push_back(std::move(j));
  }
  return out;
}

json tree_json(const SearchJournal::Contents& c) {
  const search::SearchTree& tree = c.tree;
  // Per node: outcomes in its subtree and the sum of their rewards (Note [MCTS]'s N and W).
  std::vector<uint32_t> visits(tree.size(), 0);
  std::vector<double> value(tree.size(), 0);
  for (uint64_t id = 1; id < tree.size(); ++id) {
    const search::Node& n = tree.node(id);
    if (!n.outcome) continue;
    const double r = search::reward(*n.outcome);
    for (uint64_t a : tree.lineage(id)) {
      visits[a] += 1;
      value[a] += r;
    }
  }
  const search::Node* best = tree.best();
  std::vector<bool> on_path(tree.size(), false);
  if (best != nullptr) {
    for (uint64_t a : tree.lineage(best->id)) on_path[a] = true;
  }
  json nodes = json::array();
  for (const search::Node& n : tree.nodes()) {
    json j = {{"id", n.id},
              {"parent", n.parent},
              {"proposer", n.id == 0 ? "pytorch" : n.move.proposer},
              {"label", n.id == 0 ? "PyTorch's kernel" : n.move.label},
              {"prior", n.move.prior},
              {"status", n.id == 0 ? "root" : node_status(n)},
              {"visits", visits[n.id]},
              {"mean_reward", visits[n.id] > 0 ? value[n.id] / visits[n.id] : 0.0},
              {"best", best != nullptr && best->id == n.id},
              {"on_best_path", on_path[n.id]}};
    if (n.outcome) {
      j["speedup"] = n.outcome->speedup;
      j["significant"] = n.outcome->significant;
      j["improves"] = n.outcome->improves();
    }
    nodes.push_back(std::move(j));
  }
  json out = {{"id", c.signature.id().hex()},
              {"signature", c.signature.to_string()},
              {"strategy", c.strategy},
              {"done", c.done},
              {"done_reason", c.done_reason},
              {"evaluated", tree.evaluated()},
              {"nodes", std::move(nodes)}};
  if (best != nullptr) out["best_node"] = best->id;
  return out;
}

std::optional<json> candidate_json(const SearchJournal::Contents& c, uint64_t node) {
  if (node == 0 || !c.tree.contains(node)) return std::nullopt;
  const search::Node& n = c.tree.node(node);
  const KernelSpec& spec = n.move.spec;
  json plan;
  try {
    plan = json::parse(llm::plan_json(spec, ""));
    plan.erase("summary");
  } catch (const std::exception& e) {
    plan = {{"error", std::string("the plan cannot be shown: ") + e.what()}};
  }
  json j = {{"signature_id", c.signature.id().hex()},
            {"signature", c.signature.to_string()},
            {"id", n.id},
            {"parent", n.parent},
            {"proposer", n.move.proposer},
            {"label", n.move.label},
            {"prior", n.move.prior},
            {"status", node_status(n)},
            {"kernel_id", n.spec_id.hex()},
            {"language", spec.language == SourceLanguage::kCuda ? "cuda" : "c++"},
            {"source", spec.source},
            {"entry_points", spec.entry_points},
            {"compile_options", spec.compile_options},
            {"plan", std::move(plan)},
            {"backend", std::string(backend_name(c.signature.target.backend))},
            {"op_bytes", catalog::op_cost(c.signature).bytes},
            {"parent_label", n.parent == 0 ? "PyTorch's kernel" : c.tree.node(n.parent).move.label},
            {"parent_source", n.parent == 0 ? std::string() : c.tree.node(n.parent).move.spec.source}};
  if (n.outcome) j["outcome"] = outcome_json(*n.outcome);
  if (!n.move.origin.empty()) {
    json origin = json::parse(n.move.origin, nullptr, /*allow_exceptions=*/false);
    j["origin"] = origin.is_discarded() ? json(n.move.origin) : origin;
  }
  json children = json::array();
  for (uint64_t ch : n.children) children.push_back(ch);
  j["children"] = std::move(children);
  return j;
}

ordered_json cache_json(const Store& store) {
  ordered_json entries = ordered_json::array();
  ordered_json unreadable = ordered_json::array();
  StatusOr<std::vector<EntryKey>> keys = store.list();
  if (!keys.ok()) return ordered_json{{"error", keys.status().message()}, {"entries", entries}, {"unreadable", unreadable}};
  for (const EntryKey& k : *keys) {
    StatusOr<StoredEntry> e = store.load(k);
    if (!e.ok()) {
      unreadable.push_back({{"key", k.hex()}, {"error", e.status().message()}});
      continue;
    }
    ordered_json j = entry_summary_json(*e);
    j["no_win"] = no_wins_json(no_wins(store, e->key));
    j["proposer"] = e->provenance.proposer;
    j["search_id"] = e->provenance.search_id;
    j["host"] = e->provenance.host;
    ordered_json blobs = ordered_json::array();
    uint64_t bytes = e->manifest_bytes;
    for (const BlobRef& b : e->blobs) {
      blobs.push_back({{"name", b.name}, {"bytes", b.size}});
      bytes += b.size;
    }
    j["blobs"] = std::move(blobs);
    j["bytes"] = bytes;
    // The fewest bytes the operator moves (the catalog's cost model): with the entry's time, its
    // achieved bandwidth for the roofline chart.
    j["op_bytes"] = catalog::op_cost(e->signature).bytes;
    entries.push_back(std::move(j));
  }
  std::sort(entries.begin(), entries.end(), [](const ordered_json& a, const ordered_json& b) {
    return a.at("speedup").get<double>() > b.at("speedup").get<double>();
  });
  return ordered_json{{"root", store.root()}, {"entries", std::move(entries)}, {"unreadable", std::move(unreadable)}};
}

// Note [GUI token]
// The GUI is read-only for anyone who can reach the loopback listener; what changes state (an
// entry disabled, enabled, pinned or unpinned; a search stopped) needs a token only the daemon's user can read: 32
// random bytes (getrandom), hex, written at every start to <state_dir>/gui-token (0600, in the
// 0700 state directory) and sent in the X-Kforge-Token header. No token: 401; a wrong one: 403;
// both name the file, never the token. The page keeps a pasted token in the tab's sessionStorage
// only. The token is not a secret of anything else (no API key, no CURVE key is ever in a page).
StatusOr<std::string> write_gui_token(const std::string& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return unavailable("cannot create " + state_dir + ": " + ec.message());
  ::chmod(state_dir.c_str(), 0700);
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return unavailable(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char c : raw) {
    token += hex[c >> 4];
    token += hex[c & 15];
  }
  const std::string path = state_dir + "/gui-token";
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size()) &&
                  ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return unavailable("cannot write " + path + ": " + std::strerror(ok ? errno : saved));
  }
  return token;
}

bool token_matches(std::string_view given, std::string_view token) {
  if (given.size() != token.size() || token.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ token[i]);
  return diff == 0;
}

StatusOr<ordered_json> cache_action(Store& store, const std::string& key_hex, const std::string& action) {
  StatusOr<EntryKey> key = EntryKey::from_hex(key_hex);
  if (!key.ok()) return invalid_argument("not an entry key: " + key.status().message());
  StatusOr<StoredEntry> before = store.load(*key);
  if (!before.ok()) return before.status();
  Status s;
  if (action == "disable") {
    s = store.set_state(*key, EntryState::kDisabled, "disabled from the GUI");
  } else if (action == "enable") {
    s = store.set_state(*key, EntryState::kActive, "");
  } else if (action == "pin" || action == "unpin") {
    s = store.set_pinned(*key, action == "pin");
  } else {
    return invalid_argument("unknown action '" + action + "' (disable, enable, pin, unpin)");
  }
  if (!s.ok()) return s;
  StatusOr<StoredEntry> after = store.load(*key);
  if (!after.ok()) return after.status();
  return entry_summary_json(*after);
}

void EventLog::append(std::string json_line) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(next_++, std::move(json_line));
    while (events_.size() > capacity_) events_.pop_front();
  }
  cv_.notify_all();
}

EventLog::Batch EventLog::after(uint64_t seq, size_t max, std::chrono::milliseconds wait) {
  Batch b;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return closed_ || next_ > seq + 1; });
  if (closed_) return b;
  if (!events_.empty() && events_.front().first > seq + 1) b.missed = true;
  for (const auto& e : events_) {
    if (e.first <= seq) continue;
    b.events.push_back(e);
    if (b.events.size() >= max) break;
  }
  return b;
}

uint64_t EventLog::last() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ - 1;
}

void EventLog::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool EventLog::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace kforge::daemon

#include "search_daemon/daemon/daemon.h"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "cache/cache_dir.h"
#include "runtime/daemon_endpoint.h"
#include "runtime/op_catalog.h"
#include "runtime/unique_fd.h"
#include "runtime/version.h"
#include "runtime/wire.h"
#include "search_daemon/daemon/client_messages.h"
#include "search_daemon/daemon/daemon_socket.h"
#include "search_daemon/daemon/daemon_status.h"
#include "search_daemon/daemon/gui_api.h"
#include "search_daemon/daemon/journal.h"
#include "search_daemon/daemon/log_limiter.h"
#include "search_daemon/daemon/prebuilder.h"

namespace kforge::daemon {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Note [Web GUI] (gui_api.cc): the HTTP listener's threads, and how many of them event streams
// may hold (each holds one for as long as the page is open).
constexpr int kHttpThreads = 16;
constexpr int kMaxEventStreams = 8;

std::string iso_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm {};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

// Note [Shared cache]
// The daemon publishes winners to its cache directory; a process loads entries only from its own
// (KFORGE_CACHE_DIR, sent in its Hello). They must be one directory: the same path, or paths that
// name the same directory (a symlink, a shared mount seen at the same place). A process whose
// cache is elsewhere is still searched for (its reports count) but never gets the kernels: the
// daemon says so when the process attaches and `kforge status` shows it (shares_cache).
bool same_directory(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

struct Daemon::Impl {
  DaemonConfig config;
  std::vector<search::Proposer*> proposers;
  Daemon* self = nullptr;

  std::unique_ptr<DaemonSocket> socket;   // the ROUTER, the PUB and the endpoint's lock
  UniqueFd wake_fd;      // eventfd: session events queued, or a stop request
  UniqueFd signal_fd;    // SIGTERM, SIGINT
  std::atomic<bool> stopping{false};

  std::unique_ptr<eval::EvaluatorPool> pool;
  std::unique_ptr<Prebuilder> prebuilder;   // Note [Builds ahead] (prebuilder.h)
  std::unique_ptr<httplib::Server> http;
  std::thread http_thread;
  // Note [Web GUI] (gui_api.cc): its files (or why they could not be read), and the published
  // events for /api/events.
  std::optional<GuiAssets> gui;
  std::string gui_error;
  std::string gui_token;   // Note [GUI token]; empty: actions are refused (the file could not be written)
  EventLog event_log;
  std::atomic<int> event_streams{0};

  // Guarded by mu: the registry, the message handler, the sessions' table and the counters (the
  // HTTP thread reads them).
  mutable std::mutex mu;
  HotSignatures hot;
  LogLimiter limiter{LogLimiter::Options{}};
  std::unique_ptr<ClientMessages> messages;
  std::map<SignatureId, std::unique_ptr<SearchSession>> sessions;
  std::deque<SessionEvent> events;
  Counters counters;
  bool schedule_due = true;   // counts arrived or a search ended since the scheduler last looked
  std::set<SignatureId> yielding;   // searches stopped to give their place (Note [Yielding searches])
  Clock::time_point started = Clock::now();
  Clock::time_point liveness_checked = Clock::now();
  Clock::time_point scheduled = Clock::now();

  std::atomic<uint64_t> evaluations_total{0};
  std::atomic<uint64_t> next_job_id{1};

  explicit Impl(DaemonConfig c) : config(std::move(c)), hot(hot_options(config)) {}

  static HotOptions hot_options(const DaemonConfig& c) {
    HotOptions o;
    o.min_calls = c.min_calls;
    o.min_time_share = c.min_time_share;
    o.max_processes = c.max_processes;
    o.max_signatures = c.max_signatures;
    o.max_signatures_per_process = c.max_signatures_per_process;
    o.process_timeout = std::chrono::seconds(c.process_timeout_s);
    return o;
  }

  void count(const std::string& name, uint64_t n = 1) { counters[name] += n; }
  // A line that a flood could repeat: at most a burst per key and window (LogLimiter). Under mu.
  void log_limited(const std::string& key, const std::string& level, const std::string& message) {
    if (std::optional<std::string> line = limiter.admit(key, message, Clock::now())) log(level, *line);
  }

  void log(const std::string& level, const std::string& message) const {
    write_log_line(config.log_format, level, message);
  }

  Status start_http();
  void add_gui_routes();
  void resume_journals();
  void schedule();
  void yield_locked(const std::optional<SignatureId>& waiting);
  void start_session(SignatureRecord& r);
  void handle_router();
  void handle_events();
  void check_liveness();
  void share_serving_gpus_locked();
  void send_to(const std::string& peer, const std::string& bytes);
  void publish_event(const std::string& topic, const json& body);
  std::string status_locked(std::optional<uint32_t> limit) const;
};

Status Daemon::Impl::start_http() {
  if (config.http.empty()) return Status();
  const size_t colon = config.http.rfind(':');
  const std::string host = config.http.substr(0, colon);
  const int port = std::stoi(config.http.substr(colon + 1));
  http = std::make_unique<httplib::Server>();
  // Bounded requests (Note [Web GUI]): no GET needs a body; slow clients are cut off; event
  // streams cannot take every thread.
  http->set_payload_max_length(64 * 1024);
  http->set_read_timeout(5, 0);
  http->set_write_timeout(5, 0);
  http->new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->metrics_text(), "text/plain; version=0.0.4");
  });
  http->Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->status_json(), "application/json");
  });
  add_gui_routes();
  if (!http->bind_to_port(host, port)) return unavailable("cannot listen on " + config.http);
  http_thread = std::thread([this] { http->listen_after_bind(); });
  log("info", "HTTP on http://" + config.http + " (/metrics, /api/status, the GUI at /gui/" +
                  (gui ? std::string(")") : " not served: " + gui_error + ")"));
  return Status();
}

namespace {

void json_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The journal of a signature id from a path ("<32 hex digits>"), or an error answered on `res`.
std::optional<SearchJournal::Contents> journal_for(const std::string& state_dir, const std::string& hex, httplib::Response& res) {
  StatusOr<SignatureId> id = SignatureId::from_hex(hex);
  if (!id.ok()) {
    json_error(res, 400, "not a signature id: " + id.status().message());
    return std::nullopt;
  }
  const std::string path = SearchJournal::path_for(state_dir, *id);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    json_error(res, 404, "no search of signature " + hex);
    return std::nullopt;
  }
  StatusOr<SearchJournal::Contents> c = SearchJournal::read(path);
  if (!c.ok()) {
    json_error(res, 500, c.status().message());
    return std::nullopt;
  }
  return std::move(*c);
}

}  // namespace

void Daemon::Impl::add_gui_routes() {
  StatusOr<GuiAssets> assets = GuiAssets::load(config.gui_dir.empty() ? default_gui_dir() : config.gui_dir);
  if (assets.ok()) {
    gui = std::move(*assets);
  } else {
    gui_error = assets.status().message();
  }
  http->Get("/gui", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/gui/"); });
  http->Get(R"(/gui/([a-z]+\.[a-z]+)?)", [this](const httplib::Request& req, httplib::Response& res) {
    if (!gui) return json_error(res, 503, "the GUI is not served: " + gui_error);
    const std::string name = req.matches[1].length() > 0 ? req.matches[1].str() : std::string("index.html");
    auto it = gui->files.find(name);
    if (it == gui->files.end()) return json_error(res, 404, "no such file: " + name);
    res.set_header("Cache-Control", "no-cache");
    res.set_content(it->second.bytes, it->second.content_type);
  });
  if (StatusOr<std::string> t = write_gui_token(config.state_dir); t.ok()) {
    gui_token = std::move(*t);
  } else {
    log("warn", "the GUI's actions are off: " + t.status().message());
  }
  http->Get("/api/cache", [this](const httplib::Request&, httplib::Response& res) {
    StatusOr<Store> store = Store::open(config.cache_dir);
    if (!store.ok()) return json_error(res, 500, store.status().message());
    res.set_content(cache_json(*store).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  // Note [GUI token]: whether the request may change state; when not, the answer is written.
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    const std::string where = config.state_dir + "/gui-token";
    if (gui_token.empty()) {
      json_error(res, 503, "the GUI's actions are off: " + where + " could not be written");
      return false;
    }
    const std::string given = req.get_header_value("X-Kforge-Token");
    if (given.empty()) {
      json_error(res, 401, "this action needs the token in " + where + " (header X-Kforge-Token)");
      return false;
    }
    if (!token_matches(given, gui_token)) {
      json_error(res, 403, "wrong token: the current one is in " + where);
      return false;
    }
    return true;
  };
  http->Post(R"(/api/cache/([0-9a-f]{32})/([a-z]{1,16}))", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    StatusOr<Store> store = Store::open(config.cache_dir);
    if (!store.ok()) return json_error(res, 500, store.status().message());
    StatusOr<nlohmann::ordered_json> after = cache_action(*store, req.matches[1].str(), req.matches[2].str());
    if (!after.ok()) {
      const bool missing = after.status().code() == StatusCode::kNotFound;
      return json_error(res, missing ? 404 : 400, after.status().message());
    }
    log("info", "GUI: " + req.matches[2].str() + " of cache entry " + req.matches[1].str());
    res.set_content(after->dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  // Stops a running search for good: its evaluations in flight finish, its journal is marked done
  // (a restarted daemon does not resume it), its signature is not searched again.
  http->Post(R"(/api/search/([0-9a-f]{32})/stop)", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    StatusOr<SignatureId> id = SignatureId::from_hex(req.matches[1].str());
    if (!id.ok()) return json_error(res, 400, "not a signature id: " + id.status().message());
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = sessions.find(*id);
      if (it == sessions.end() || it->second->finished()) {
        return json_error(res, 409, "no search of " + req.matches[1].str() + " is running");
      }
      it->second->stop_for_good("stopped from the GUI");
    }
    log("info", "GUI: stop of the search of " + req.matches[1].str());
    res.set_content(json{{"id", req.matches[1].str()}, {"stopping", true}}.dump(), "application/json");
  });
  http->Get("/api/progress", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(progress_json(config.state_dir).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  http->Get("/api/searches", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(searches_json(config.state_dir).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  http->Get(R"(/api/tree/([0-9a-f]{32}))", [this](const httplib::Request& req, httplib::Response& res) {
    std::optional<SearchJournal::Contents> c = journal_for(config.state_dir, req.matches[1].str(), res);
    if (!c) return;
    res.set_content(tree_json(*c).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  http->Get(R"(/api/candidate/([0-9a-f]{32})/([0-9]{1,9}))", [this](const httplib::Request& req, httplib::Response& res) {
    std::optional<SearchJournal::Contents> c = journal_for(config.state_dir, req.matches[1].str(), res);
    if (!c) return;
    const uint64_t node = std::stoull(req.matches[2].str());
    std::optional<json> j = candidate_json(*c, node);
    if (!j) return json_error(res, 404, "the search has no candidate " + std::to_string(node));
    res.set_content(j->dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  http->Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) {
    // From the event after Last-Event-ID (a reconnecting page) or ?since=N, else from now on.
    uint64_t since = event_log.last();
    std::string from = req.get_header_value("Last-Event-ID");
    if (from.empty() && req.has_param("since")) from = req.get_param_value("since");
    if (!from.empty()) {
      if (from.size() > 19 || from.find_first_not_of("0123456789") != std::string::npos) {
        return json_error(res, 400, "Last-Event-ID / since: not an event number");
      }
      since = std::stoull(from);
    }
    if (event_streams.fetch_add(1) >= kMaxEventStreams) {
      event_streams.fetch_sub(1);
      return json_error(res, 503, "too many event streams open (" + std::to_string(kMaxEventStreams) + ")");
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, since](size_t, httplib::DataSink& sink) mutable {
          EventLog::Batch b = event_log.after(since, 256, std::chrono::seconds(15));
          if (event_log.closed()) return false;
          std::string out;
          if (b.missed) out += "event: reset\ndata: {}\n\n";
          for (const auto& [seq, line] : b.events) {
            out += "id: " + std::to_string(seq) + "\ndata: " + line + "\n\n";
            since = seq;
          }
          if (out.empty()) out = ": keep-alive\n\n";
          return sink.write(out.data(), out.size());
        },
        [this](bool) { event_streams.fetch_sub(1); });
  });
}

void Daemon::Impl::resume_journals() {
  for (const std::string& path : SearchJournal::list(config.state_dir)) {
    StatusOr<SearchJournal::Contents> c = SearchJournal::read(path);
    if (!c.ok()) {
      log("warn", "skipping a journal that cannot be read: " + c.status().message());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu);
    SignatureRecord& r = hot.adopt(c->signature);
    r.evaluations = c->tree.evaluated();
    r.shared_gpu_timings = 0;
    for (const search::Node& n : c->tree.nodes()) {
      if (n.outcome && !n.outcome->shared_gpu_pids.empty()) ++r.shared_gpu_timings;
    }
    if (const search::Node* b = c->tree.best()) r.best_speedup = b->outcome->speedup;
    if (c->done) {
      r.state = r.best_speedup > 1 ? SearchState::kPublished : SearchState::kDone;
      r.note = c->done_reason;
      continue;
    }
    if (pool->slots_for(r.signature) == 0) {
      r.state = SearchState::kUnrunnable;
      r.note = "journaled search waits for a slot that runs its target";
      continue;
    }
    log("info", "resuming the search of " + r.signature.to_string() + " (" + std::to_string(c->tree.size() - 1) +
                    " nodes, " + std::to_string(c->tree.evaluated()) + " evaluated)");
    start_session(r);
  }
}

void Daemon::Impl::start_session(SignatureRecord& r) {
  r.state = SearchState::kSearching;
  SessionContext ctx;
  ctx.evaluator = pool.get();
  ctx.prebuilder = prebuilder.get();
  ctx.proposers = proposers;
  ctx.strategy = config.strategy;
  ctx.options.max_evaluations = config.max_evaluations_per_signature;
  ctx.options.seed = config.seed ^ r.id.lo;
  ctx.options.c_puct = config.c_puct;
  ctx.options.widening_c = config.widening_c;
  ctx.options.widening_alpha = config.widening_alpha;
  ctx.max_seconds = config.max_seconds_per_signature;
  ctx.evaluations_total = &evaluations_total;
  ctx.max_evaluations_total = config.max_evaluations_total;
  ctx.next_job_id = &next_job_id;
  ctx.state_dir = config.state_dir;
  ctx.cache_dir = config.cache_dir;
  ctx.measure_runs = config.measure_runs;
  ctx.max_baseline_model_ratio = config.max_baseline_model_ratio;
  ctx.max_baseline_observed_ratio = config.max_baseline_observed_ratio;
  ctx.compile_budget_ms = config.compile_budget_ms;
  ctx.run_budget_ms = config.run_budget_ms;
  ctx.on_event = [this](SessionEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    const uint64_t one = 1;
    (void)::write(wake_fd.get(), &one, sizeof one);
  };
  ctx.log = [this](const std::string& line) { log("info", line); };
  search::Roofline roof;
  roof.baseline_ns = r.mean_ns();
  roof.bandwidth_bytes_per_s = pool->bandwidth_for(r.signature);
  roof.device_facts = pool->device_facts_for(r.signature);
  const catalog::OpCost cost = catalog::op_cost(r.signature);
  roof.bytes = cost.bytes;
  roof.flops = cost.flops;
  auto s = std::make_unique<SearchSession>(r.signature, r.input_stats, r.captured, roof, std::move(ctx));
  log("info", "searching " + r.signature.to_string() + " (" + std::to_string(r.calls()) + " calls, " +
                  std::to_string(r.mean_ns()) + " ns each, strategy " + config.strategy + ")");
  s->start();
  sessions[r.id] = std::move(s);
  count("searches_started");
}

// The scheduler looks when counts arrived or a search ended, and once a second (budgets and
// thresholds that time alone changes): never once per message of a flood.
void Daemon::Impl::schedule() {
  if (stopping.load()) return;
  std::lock_guard<std::mutex> lock(mu);
  const Clock::time_point now = Clock::now();
  if (!schedule_due && now - scheduled < std::chrono::seconds(1)) return;
  schedule_due = false;
  scheduled = now;
  size_t active = 0;
  for (const auto& [id, s] : sessions) active += s->finished() ? 0 : 1;
  auto next_to_search = [this] {
    return hot.next_to_search([this](const OpSignature& sig) { return pool->slots_for(sig) > 0; },
                              [this](const OpSignature& sig) { return pool->bandwidth_for(sig); });
  };
  while (active < config.concurrent_searches) {
    if (evaluations_total.load() >= config.max_evaluations_total) return;
    std::optional<SignatureId> next = next_to_search();
    if (!next) return;
    SignatureRecord* r = hot.find(*next);
    start_session(*r);
    ++active;
  }
  yield_locked(next_to_search());
}

// Note [Yielding searches] in daemon_config.h: under mu, with every search slot taken.
void Daemon::Impl::yield_locked(const std::optional<SignatureId>& waiting) {
  if (config.yield_after_evaluations == 0 || !waiting || !yielding.empty()) return;
  const SignatureRecord* w = hot.find(*waiting);
  if (w == nullptr || w->evaluations > 0) return;   // only for a signature no search has evaluated
  SearchSession* pick = nullptr;
  SignatureRecord* pick_record = nullptr;
  for (const auto& [id, s] : sessions) {
    SignatureRecord* r = hot.find(id);
    if (s->finished() || r == nullptr || r->entry_key.empty() || r->evaluations < config.yield_after_evaluations) continue;
    if (pick_record == nullptr || r->evaluations > pick_record->evaluations) {
      pick = s.get();
      pick_record = r;
    }
  }
  if (pick == nullptr) return;
  yielding.insert(pick_record->id);
  log("info", "pausing the search of " + pick_record->signature.to_string() + " after " +
                  std::to_string(pick_record->evaluations) + " evaluations (best " + std::to_string(pick_record->best_speedup) +
                  "x): its place goes to " + w->signature.to_string() + ", which no search has evaluated yet");
  count("searches_yielded");
  pick->stop();
}

// Under mu: the pool learns which GPUs serving processes use (slot choice and JobPlacement).
void Daemon::Impl::share_serving_gpus_locked() { pool->set_serving_gpus(serving_gpus(hot.processes())); }

// Note [Bounded state] in hot_signatures.h: a local process found gone by its pid (as the kernel
// gave it), or any peer silent for daemon.process_timeout_s, is no longer attached; records gone
// for long are dropped. Also where suppressed log lines of a flood that ended are counted.
void Daemon::Impl::check_liveness() {
  const Clock::time_point now = Clock::now();
  if (now - liveness_checked < std::chrono::seconds(1)) return;
  liveness_checked = now;
  std::lock_guard<std::mutex> lock(mu);
  const HotSignatures::Expired gone = hot.expire([](int32_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; });
  if (!gone.exited.empty()) log_limited("exited", "info", "process(es) " + pid_list(gone.exited) + " exited without a Goodbye");
  if (!gone.silent.empty()) {
    log_limited("silent", "info", "process(es) " + pid_list(gone.silent) + " sent nothing for " +
                                      std::to_string(config.process_timeout_s) + " s: taken for gone");
  }
  if (!gone.exited.empty() || !gone.silent.empty()) share_serving_gpus_locked();
  for (const std::string& line : limiter.flush(now)) log("info", line);
}

void Daemon::Impl::send_to(const std::string& peer, const std::string& bytes) { socket->send_to(peer, bytes); }

void Daemon::Impl::publish_event(const std::string& topic, const json& body) {
  json j = body;
  j["event"] = topic;
  j["ts"] = iso_now();
  std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  socket->publish(topic, line);
  event_log.append(std::move(line));
}

// Reads at most kMaxMessagesPerTurn frames, so that a flood of messages never keeps the loop from
// its signals, session events and liveness checks (zmq_poll reports the rest at once).
void Daemon::Impl::handle_router() {
  constexpr int kMaxMessagesPerTurn = 256;
  for (int turn = 0; turn < kMaxMessagesPerTurn; ++turn) {
    std::optional<DaemonSocket::Frame> f = socket->receive();
    if (!f) return;
    ClientMessages::Effects effects;
    {
      std::lock_guard<std::mutex> lock(mu);
      effects = messages->handle(f->peer, f->creds, f->bytes(), f->multipart);
      if (effects.processes_changed) share_serving_gpus_locked();
      if (effects.signatures_changed) schedule_due = true;
    }
    if (effects.reply) send_to(f->peer, *effects.reply);
  }
}

void Daemon::Impl::handle_events() {
  uint64_t n = 0;
  (void)::read(wake_fd.get(), &n, sizeof n);
  std::deque<SessionEvent> batch;
  std::vector<SignatureId> finished;
  {
    std::lock_guard<std::mutex> lock(mu);
    batch.swap(events);
  }
  for (const SessionEvent& e : batch) {
    const std::string sig = e.signature.hex();
    switch (e.kind) {
      case SessionEvent::Kind::kNode:
        publish_event("node", {{"signature", sig}, {"node", e.node}, {"parent", e.parent}, {"proposer", e.proposer}, {"label", e.label}});
        break;
      case SessionEvent::Kind::kResult: {
        std::lock_guard<std::mutex> lock(mu);
        count("evaluations_" + std::string(eval::eval_status_name(e.status)));
        SignatureRecord* r = hot.find(e.signature);
        if (r != nullptr) ++r->evaluations;
        // What the build cache (and builds ahead: Note [Builds ahead]) saved the workers.
        if (e.build_cached) {
          count("worker_builds_cached");
        } else if (e.build_ms > 0) {
          count("worker_builds_compiled");
          count("worker_build_ms", static_cast<uint64_t>(e.build_ms + 0.5));
        }
        if (!e.shared_gpu_pids.empty()) {
          count("timings_on_shared_gpu");
          if (r != nullptr) {
            ++r->shared_gpu_timings;
            if (!r->shared_gpu_logged) {
              r->shared_gpu_logged = true;
              log("warn", "timing of " + r->signature.to_string() + " on " + e.device + " (" + e.uuid +
                              ") shared the GPU with serving pid(s) " + pid_list(e.shared_gpu_pids) +
                              ": speedups may be noisier");
            }
          }
        }
        if (!e.implausible.empty()) {
          count("timings_implausible");
          if (r != nullptr) {
            ++r->implausible_timings;
            if (!r->implausible_logged) {
              r->implausible_logged = true;
              log("warn", "an implausible timing of " + r->signature.to_string() + " was not published (" +
                              e.implausible + "); later ones are counted in kforge status");
            }
          }
        }
        publish_event("result", {{"signature", sig}, {"node", e.node}, {"status", eval::eval_status_name(e.status)},
                                 {"speedup", e.speedup}, {"message", e.message}, {"label", e.label},
                                 {"device", e.device}, {"uuid", e.uuid}, {"shared_gpu_pids", e.shared_gpu_pids},
                                 {"implausible", e.implausible}});
        break;
      }
      case SessionEvent::Kind::kPublished: {
        std::vector<std::string> peers;
        {
          std::lock_guard<std::mutex> lock(mu);
          count("kernels_published");
          // The state stays "searching" until the search ends (then "published", see kFinished).
          if (SignatureRecord* r = hot.find(e.signature)) {
            r->best_speedup = e.speedup;
            r->entry_key = e.entry_key;
          }
          peers = hot.live_peers();
        }
        wire::KernelReady k;
        k.signature_id = e.signature;
        k.environment_key = e.environment_key;
        k.entry_key = e.entry_key;
        k.speedup = e.speedup;
        const std::string bytes = wire::encode(wire::WireMessage(k));
        for (const std::string& p : peers) send_to(p, bytes);
        {
          std::lock_guard<std::mutex> lock(mu);
          count("kernel_ready_sent", peers.size());
        }
        publish_event("published", {{"signature", sig}, {"entry", e.entry_key}, {"speedup", e.speedup}, {"label", e.label},
                                    {"shared_gpu_pids", e.shared_gpu_pids}});
        break;
      }
      case SessionEvent::Kind::kFinished: {
        std::lock_guard<std::mutex> lock(mu);
        schedule_due = true;
        if (SignatureRecord* r = hot.find(e.signature)) {
          switch (e.end) {
            case SessionState::kStopped:   // the daemon is stopping; the journal resumes it
            case SessionState::kStarting:
            case SessionState::kSearching:
              r->state = SearchState::kObserved;
              break;
            case SessionState::kFailed:
              r->state = SearchState::kFailed;
              break;
            case SessionState::kDone:
              r->state = r->entry_key.empty() ? SearchState::kDone : SearchState::kPublished;
              break;
          }
          r->note = std::string(session_state_name(e.end)) + ": " + e.message;
          if (yielding.erase(e.signature) > 0 && e.end == SessionState::kStopped) {
            r->note = "paused after " + std::to_string(r->evaluations) +
                      " evaluations for a signature not yet searched; resumes from its journal";
          }
        }
        finished.push_back(e.signature);
        log("info", "search of " + sig.substr(0, 12) + " ended after " + std::to_string(e.evaluations) +
                        " evaluations: " + std::string(session_state_name(e.end)) + ": " + e.message);
        publish_event("finished", {{"signature", sig},
                                   {"state", session_state_name(e.end)},
                                   {"message", std::string(session_state_name(e.end)) + ": " + e.message},
                                   {"evaluations", e.evaluations}});
        break;
      }
    }
  }
  for (const SignatureId& id : finished) {
    std::unique_ptr<SearchSession> s;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = sessions.find(id);
      if (it == sessions.end()) continue;
      s = std::move(it->second);
      sessions.erase(it);
    }
    s->join();
  }
}

std::string Daemon::Impl::status_locked(std::optional<uint32_t> limit) const {
  StatusInputs in;
  in.config = &config;
  in.uptime_s = std::chrono::duration<double>(Clock::now() - started).count();
  in.evaluations_total = evaluations_total.load();
  const std::vector<eval::SlotInfo> slots = pool->slots();
  in.slots = &slots;
  in.hot = &hot;
  Counters with_builds = counters;
  if (prebuilder) {
    const Prebuilder::Stats p = prebuilder->stats();
    with_builds["prebuilds_queued"] = p.queued;
    with_builds["prebuilds_built"] = p.built;
    with_builds["prebuilds_already_cached"] = p.cached;
    with_builds["prebuilds_failed"] = p.failed;
    with_builds["prebuilds_dropped"] = p.dropped;
  }
  in.counters = &with_builds;
  in.log_lines_suppressed = limiter.suppressed_total();
  in.progress = [this](const SignatureId& id) -> std::optional<SessionProgress> {
    auto it = sessions.find(id);
    if (it == sessions.end()) return std::nullopt;
    return it->second->progress();
  };
  return status_document(in, limit);
}

// ---- Daemon -------------------------------------------------------------------------------------

Daemon::Daemon(DaemonConfig config, std::vector<search::Proposer*> proposers) : impl_(std::make_unique<Impl>(std::move(config))) {
  impl_->proposers = std::move(proposers);
  impl_->self = this;
}

Daemon::~Daemon() {
  request_stop();
  std::map<SignatureId, std::unique_ptr<SearchSession>> sessions;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    sessions.swap(impl_->sessions);
  }
  for (auto& [id, s] : sessions) s->stop();
  if (impl_->pool) impl_->pool->stop();
  sessions.clear();   // joins
  impl_->prebuilder.reset();   // drops its queue, waits for the builds in progress
  impl_->event_log.close();   // event streams end, so the HTTP threads can
  if (impl_->http) impl_->http->stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
  impl_->socket.reset();
}

void Daemon::log(const std::string& level, const std::string& message) const { impl_->log(level, message); }

void write_log_line(const std::string& log_format, const std::string& level, const std::string& message) {
  if (log_format == "json") {
    // A message that is not valid UTF-8 (an LLM's answer quoted in a line) is escaped, not thrown.
    const json j{{"ts", iso_now()}, {"level", level}, {"msg", message}, {"pid", ::getpid()}};
    std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    std::fprintf(stderr, "%s kforged %s: %s\n", iso_now().c_str(), level.c_str(), message.c_str());
  }
  std::fflush(stderr);
}

Status Daemon::start() {
  Impl& d = *impl_;
  d.log("info", "kforged " KFORGE_VERSION_STRING " starting; config: " + d.config.to_string());
  if (d.config.cache_dir.empty()) {
    StatusOr<CacheDir::Resolved> r = CacheDir::resolve_path(process_env());
    if (!r.ok()) return r.status();
    if (!r->warning.empty()) d.log("warn", r->warning);
    d.config.cache_dir = r->path;
  }
  KFORGE_RETURN_IF_ERROR(CacheDir::open(d.config.cache_dir).status());
  ClientMessages::Context mc;
  mc.hot = &d.hot;
  mc.counters = &d.counters;
  mc.limiter = &d.limiter;
  mc.log = [&d](const std::string& level, const std::string& line) { d.log(level, line); };
  mc.daemon_cache_dir = d.config.cache_dir;
  mc.same_directory = same_directory;
  mc.status = [&d](const control::ControlRequest& r) { return d.status_locked(r.limit); };
  d.messages = std::make_unique<ClientMessages>(std::move(mc));
  d.wake_fd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Blocked here, before any thread starts, so every thread inherits the mask and the signals
  // reach only the I/O loop's signalfd.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  d.signal_fd = UniqueFd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  StatusOr<std::unique_ptr<DaemonSocket>> socket = DaemonSocket::bind(d.config);
  if (!socket.ok()) return socket.status();
  d.socket = std::move(*socket);
  eval::PoolOptions po;
  po.devices = d.config.devices;
  po.cpu_slots = d.config.cpu_slots;
  po.cpu_threads = d.config.cpu_threads;
  po.priority = d.config.worker_priority;
  po.program = d.config.worker_program;
  po.python = d.config.worker_python;
  po.build_cache_dir = d.config.state_dir + "/builds";
  po.log = [&d](const std::string& line) { d.log("info", line); };
  d.pool = std::make_unique<eval::EvaluatorPool>(po);
  KFORGE_RETURN_IF_ERROR(d.pool->start());
  PrebuilderOptions pre;
  pre.cache_dir = po.build_cache_dir;
  pre.threads = d.config.prebuild_threads;
  pre.idle_priority = d.config.worker_priority == eval::WorkerPriority::kIdle;
  pre.compile_budget_ms = d.config.compile_budget_ms;
  d.prebuilder = std::make_unique<Prebuilder>(std::move(pre));
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.count("timings_on_shared_gpu", 0);   // in the status from the start: tools read them
    d.count("timings_implausible", 0);
    d.count("worker_builds_compiled", 0);
    d.count("worker_builds_cached", 0);
    d.count("worker_build_ms", 0);
  }
  KFORGE_RETURN_IF_ERROR(d.start_http());
  d.resume_journals();
  d.log("info", "listening on " + d.config.endpoint + " (events on " + d.config.events_endpoint + ")" +
                    (d.socket->curve_public_key().empty()
                         ? std::string()
                         : "; CURVE on, clients set KFORGE_DAEMON_SERVER_KEY=" + d.socket->curve_public_key()));
  return Status();
}

int Daemon::run() {
  Impl& d = *impl_;
  while (!d.stopping.load()) {
    zmq_pollitem_t items[3] = {{d.socket->router_handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, d.wake_fd.get(), ZMQ_POLLIN, 0},
                               {nullptr, d.signal_fd.get(), ZMQ_POLLIN, 0}};
    // The timeout only re-checks budgets and thresholds that time alone changes (a search's wall
    // clock ends inside its own thread); every message and event wakes the loop at once.
    const int n = zmq_poll(items, 3, 1000);
    if (n < 0 && zmq_errno() == EINTR) continue;
    if (n < 0) {
      d.log("error", std::string("zmq_poll: ") + zmq_strerror(zmq_errno()));
      return 1;
    }
    if (items[2].revents & ZMQ_POLLIN) {
      signalfd_siginfo si {};
      (void)::read(d.signal_fd.get(), &si, sizeof si);
      d.log("info", std::string("stopping on ") + (si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT"));
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) d.handle_router();
    if (items[1].revents & ZMQ_POLLIN) d.handle_events();
    d.check_liveness();
    d.schedule();
  }
  d.stopping.store(true);
  // Searches stop submitting; what is running finishes and is journaled; the journal resumes them.
  std::vector<SearchSession*> running;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto& [id, s] : d.sessions) {
      s->stop();
      running.push_back(s.get());
    }
  }
  for (SearchSession* s : running) s->join();
  d.log("info", "stopped");
  return 0;
}

void Daemon::request_stop() {
  impl_->stopping.store(true);
  if (impl_->wake_fd.valid()) {
    const uint64_t one = 1;
    (void)::write(impl_->wake_fd.get(), &one, sizeof one);
  }
}

std::string Daemon::status_json() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->status_locked(std::nullopt);
}

std::string Daemon::metrics_text() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl& d = *impl_;
  std::ostringstream o;
  auto gauge = [&](const std::string& name, const std::string& help, double v, const std::string& labels = "") {
    o << "# HELP kforge_" << name << " " << help << "\n# TYPE kforge_" << name << " gauge\n";
    o << "kforge_" << name << labels << " " << v << "\n";
  };
  size_t attached = 0;
  for (const auto& [peer, p] : d.hot.processes()) attached += p.gone ? 0 : 1;
  gauge("processes_attached", "serving processes attached", static_cast<double>(attached));
  gauge("signatures_seen", "signatures reported", static_cast<double>(d.hot.signatures().size()));
  size_t searching = 0;
  for (const auto& [id, s] : d.sessions) searching += s->finished() ? 0 : 1;
  gauge("searches_active", "searches running", static_cast<double>(searching));
  gauge("evaluations_total", "evaluations submitted", static_cast<double>(d.evaluations_total.load()));
  o << "# HELP kforge_events_total daemon events by kind\n# TYPE kforge_events_total counter\n";
  for (const auto& [k, v] : d.counters) o << "kforge_events_total{kind=\"" << k << "\"} " << v << "\n";
  o << "# HELP kforge_best_speedup best verified speedup per signature\n# TYPE kforge_best_speedup gauge\n";
  for (const auto& [id, r] : d.hot.signatures()) {
    if (r.best_speedup > 0) o << "kforge_best_speedup{signature=\"" << id.hex() << "\"} " << r.best_speedup << "\n";
  }
  o << "# HELP kforge_worker_restarts_total worker restarts per slot\n# TYPE kforge_worker_restarts_total counter\n";
  for (const eval::SlotInfo& s : d.pool->slots()) {
    o << "kforge_worker_restarts_total{device=\"" << s.device << "\"} " << s.restarts << "\n";
  }
  return o.str();
}

}  // namespace kforge::daemon

// SearchSession (search_daemon/daemon/search_session.h) with kforged's real parts: an
// EvaluatorPool of one CPU kforge-worker (python3 + torch, label 'integration'), the template
// proposer, a cache and a journal in a temporary directory. What is checked: the budgets end a
// search where they say, a stopped search resumes from its journal without evaluating anything
// twice, a finished one stays finished, and a session that cannot run says why.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cache/store.h"
#include "search_daemon/daemon/journal.h"
#include "search_daemon/daemon/search_session.h"
#include "search_daemon/evaluator/evaluator_pool.h"
#include "search_daemon/proposers/templates/template_proposer.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::daemon;
using kforge::test_support::TempDir;
using namespace std::chrono_literals;

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// One CPU worker, started; its arch is what a signature must target to run there.
struct Rig {
  TempDir dir{"kforge-session-test"};
  eval::EvaluatorPool pool;
  search::TemplateProposer templates;
  std::atomic<uint64_t> evaluations_total{0};
  std::atomic<uint64_t> next_job_id{1};
  std::string arch;

  static eval::PoolOptions options(const TempDir& dir) {
    eval::PoolOptions o;
    o.devices = {"cpu"};
    o.cpu_slots = 1;
    o.program = env_or_empty("KFORGE_WORKER");
    o.python = env_or_empty("KFORGE_PYTHON");
    o.build_cache_dir = (dir.path / "builds").string();
    return o;
  }
  Rig() : pool(options(dir)) {
    REQUIRE_FALSE(env_or_empty("KFORGE_WORKER").empty());
    REQUIRE(pool.start().ok());
    REQUIRE(pool.wait_started(std::chrono::minutes(3)));
    const std::vector<eval::SlotInfo> slots = pool.slots();
    REQUIRE(slots.size() == 1);
    INFO(slots[0].state);
    REQUIRE(slots[0].state == "idle");
    arch = slots[0].arch;
  }

  OpSignature softmax() const {
    TensorMeta t;
    t.sizes = {64, 512};
    t.strides = {512, 1};
    return OpSignature{"aten::_softmax", "", {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false)},
                       Target{Backend::kCpu, arch}};
  }

  // Everything a session emits, by kind; a test waits on them (the session's own signals), never
  // on a guessed delay.
  struct Events {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<SessionEvent> all;
    size_t count_locked(SessionEvent::Kind k) const {
      return static_cast<size_t>(std::count_if(all.begin(), all.end(), [k](const SessionEvent& e) { return e.kind == k; }));
    }
    std::vector<SessionEvent> of(SessionEvent::Kind k) {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<SessionEvent> out;
      for (const SessionEvent& e : all) {
        if (e.kind == k) out.push_back(e);
      }
      return out;
    }
    // Until `n` events of kind `k` (or the finished event) arrived, or `timeout`: whether they did.
    bool wait_for(SessionEvent::Kind k, size_t n, std::chrono::seconds timeout) {
      std::unique_lock<std::mutex> lock(mu);
      return cv.wait_for(lock, timeout, [&] { return count_locked(k) >= n || count_locked(SessionEvent::Kind::kFinished) > 0; });
    }
  };

  SessionContext context(Events& events, uint32_t max_evaluations) {
    SessionContext c;
    c.evaluator = &pool;
    c.proposers = {&templates};
    c.options.max_evaluations = max_evaluations;
    c.options.seed = 7;
    c.max_seconds = 600;
    c.evaluations_total = &evaluations_total;
    c.max_evaluations_total = 1000;
    c.next_job_id = &next_job_id;
    c.state_dir = (dir.path / "state").string();
    c.cache_dir = (dir.path / "cache").string();
    c.measure_runs = 5;
    c.max_baseline_observed_ratio = 0;   // no serving process observed this signature
    c.on_event = [&events](SessionEvent e) {
      std::lock_guard<std::mutex> lock(events.mu);
      events.all.push_back(std::move(e));
      events.cv.notify_all();
    };
    return c;
  }
};

search::Roofline no_observations() { return search::Roofline{}; }

// Waits for the session's finished event (its last act but one: join() then returns at once);
// fails the test after `timeout`.
void wait_finished(Rig::Events& events, std::chrono::seconds timeout) {
  REQUIRE(events.wait_for(SessionEvent::Kind::kFinished, 1, timeout));
}

}  // namespace

TEST_CASE("SearchSession: ends at its evaluation budget, journals every outcome, and stays finished", "[cpu]") {
  Rig rig;
  const OpSignature sig = rig.softmax();
  Rig::Events events;
  SearchSession s(sig, {}, {}, no_observations(), rig.context(events, 3));
  s.start();
  wait_finished(events, 600s);
  s.join();
  const SessionProgress p = s.progress();
  INFO(p.reason);
  CHECK(p.state == SessionState::kDone);
  CHECK(p.reason == "evaluation budget of 3 spent");
  CHECK(p.evaluated == 3);
  CHECK(p.in_flight == 0);
  CHECK(rig.evaluations_total.load() == 3);
  const std::vector<SessionEvent> results = events.of(SessionEvent::Kind::kResult);
  CHECK(results.size() == 3);
  for (const SessionEvent& r : results) {
    INFO(r.label << ": " << r.message);
    CHECK(r.device == "cpu");
    CHECK(r.proposer == "template");
    CHECK(r.status == eval::EvalStatus::kMeasured);   // built, verified and timed by the worker
  }
  const std::vector<SessionEvent> finished = events.of(SessionEvent::Kind::kFinished);
  REQUIRE(finished.size() == 1);
  CHECK(finished[0].end == SessionState::kDone);
  CHECK(finished[0].evaluations == 3);
  // Each published winner is the signature's cache entry (the last one published is the one there).
  const std::vector<SessionEvent> published = events.of(SessionEvent::Kind::kPublished);
  if (!published.empty()) {
    StatusOr<Store> store = Store::open(rig.dir.path / "cache");
    REQUIRE(store.ok());
    StatusOr<std::vector<EntryKey>> keys = store->list();
    REQUIRE(keys.ok());
    REQUIRE(keys->size() == 1);
    CHECK(keys->front().hex() == published.back().entry_key);
    CHECK(p.entry_key == published.back().entry_key);
    CHECK(p.best_speedup == published.back().speedup);
    for (const SessionEvent& e : published) CHECK(e.speedup > 1);
  }

  // The journal holds the three outcomes and the end.
  const std::vector<std::string> journals = SearchJournal::list((rig.dir.path / "state").string());
  REQUIRE(journals.size() == 1);
  StatusOr<SearchJournal::Contents> j = SearchJournal::read(journals[0]);
  REQUIRE(j.ok());
  CHECK(j->done);
  CHECK(j->done_reason == "evaluation budget of 3 spent");
  CHECK(j->tree.evaluated() == 3);

  // A finished search is final: a new session for the signature evaluates nothing.
  Rig::Events again;
  SearchSession s2(sig, {}, {}, no_observations(), rig.context(again, 10));
  s2.start();
  wait_finished(again, 60s);
  s2.join();
  CHECK(s2.progress().state == SessionState::kDone);
  CHECK(s2.progress().reason == "finished earlier: evaluation budget of 3 spent");
  CHECK(s2.progress().evaluated == 3);
  CHECK(again.of(SessionEvent::Kind::kResult).empty());
  CHECK(rig.evaluations_total.load() == 3);
}

TEST_CASE("SearchSession: a stopped search awaits its evaluations, and a new session resumes it without repeating one", "[cpu]") {
  Rig rig;
  const OpSignature sig = rig.softmax();
  Rig::Events first;
  std::set<uint64_t> evaluated_first;
  {
    SearchSession s(sig, {}, {}, no_observations(), rig.context(first, 6));
    s.start();
    REQUIRE(first.wait_for(SessionEvent::Kind::kResult, 2, 600s));
    s.stop();
    s.join();
    const SessionProgress p = s.progress();
    CHECK(p.state == SessionState::kStopped);
    CHECK(p.reason == "stopped");
    CHECK(p.in_flight == 0);
    REQUIRE(p.evaluated >= 2);
    REQUIRE(p.evaluated < 6);
    for (const SessionEvent& r : first.of(SessionEvent::Kind::kResult)) evaluated_first.insert(r.node);
    CHECK(evaluated_first.size() == p.evaluated);   // every submitted job came back before the end
    const std::vector<SessionEvent> fin = first.of(SessionEvent::Kind::kFinished);
    REQUIRE(fin.size() == 1);
    CHECK(fin[0].end == SessionState::kStopped);
  }
  // Not done: the journal resumes it, with nothing in flight.
  const std::vector<std::string> journals = SearchJournal::list((rig.dir.path / "state").string());
  REQUIRE(journals.size() == 1);
  {
    StatusOr<SearchJournal::Contents> j = SearchJournal::read(journals[0]);
    REQUIRE(j.ok());
    CHECK_FALSE(j->done);
    CHECK(j->tree.evaluated() == evaluated_first.size());
    for (size_t id = 1; id < j->tree.size(); ++id) CHECK(j->tree.node(id).virtual_loss == 0);
  }

  Rig::Events second;
  SearchSession s2(sig, {}, {}, no_observations(), rig.context(second, 6));
  s2.start();
  wait_finished(second, 600s);
  s2.join();
  const SessionProgress p2 = s2.progress();
  INFO(p2.reason);
  CHECK(p2.state == SessionState::kDone);
  CHECK(p2.reason == "evaluation budget of 6 spent");
  CHECK(p2.evaluated == 6);   // the budget counts the restored outcomes
  const std::vector<SessionEvent> resumed = second.of(SessionEvent::Kind::kResult);
  CHECK(resumed.size() == 6 - evaluated_first.size());
  for (const SessionEvent& r : resumed) {
    INFO("node " << r.node);
    CHECK(evaluated_first.count(r.node) == 0);
  }
  CHECK(rig.evaluations_total.load() == 6);
}

TEST_CASE("SearchSession: the daemon's total budget, the wall-time budget and an unusable journal end a search at once", "[cpu]") {
  Rig rig;
  const OpSignature sig = rig.softmax();
  SECTION("the daemon-wide evaluation budget is spent") {
    Rig::Events events;
    SessionContext c = rig.context(events, 10);
    c.max_evaluations_total = 4;
    rig.evaluations_total.store(4);
    SearchSession s(sig, {}, {}, no_observations(), c);
    s.start();
    wait_finished(events, 60s);
    s.join();
    CHECK(s.progress().state == SessionState::kDone);
    CHECK(s.progress().reason == "the daemon's evaluation budget of 4 is spent");
    CHECK(s.progress().evaluated == 0);
    CHECK(events.of(SessionEvent::Kind::kResult).empty());
    CHECK(rig.evaluations_total.load() == 4);   // nothing counted that was not submitted
  }
  SECTION("the wall-time budget is spent") {
    Rig::Events events;
    SessionContext c = rig.context(events, 10);
    c.max_seconds = 0;
    SearchSession s(sig, {}, {}, no_observations(), c);
    s.start();
    wait_finished(events, 60s);
    s.join();
    CHECK(s.progress().state == SessionState::kDone);
    CHECK(s.progress().reason == "wall-time budget of 0 s spent");
    CHECK(events.of(SessionEvent::Kind::kResult).empty());
  }
  SECTION("the state directory is a file: the session fails and says why") {
    Rig::Events events;
    SessionContext c = rig.context(events, 10);
    c.state_dir = (rig.dir.path / "not-a-dir").string();
    std::ofstream(c.state_dir) << "x";
    SearchSession s(sig, {}, {}, no_observations(), c);
    s.start();
    wait_finished(events, 60s);
    s.join();
    CHECK(s.progress().state == SessionState::kFailed);
    CHECK_THAT(s.progress().reason, Catch::StartsWith("journal: "));
    const std::vector<SessionEvent> fin = events.of(SessionEvent::Kind::kFinished);
    REQUIRE(fin.size() == 1);
    CHECK(fin[0].end == SessionState::kFailed);
  }
}

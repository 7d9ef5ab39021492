// What each result does (search_daemon/daemon/result_observers.h), each observer against the real
// component it writes to: the cache (Store), the journal (SearchJournal), the event sink.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cache/store.h"
#include "search_daemon/daemon/journal.h"
#include "search_daemon/daemon/result_observers.h"
#include "search_daemon/search/search_tree.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::daemon;
using kforge::test_support::TempDir;

namespace {

OpSignature sig() {
  TensorMeta m;
  m.sizes = {8, 32};
  m.strides = {32, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(m), Arg::integer(-1), Arg::boolean(false)},
                     Target{Backend::kCpu, "x86_64-avx2"}};
}

Environment worker_env() {
  Environment e;
  e.backend = Backend::kCpu;
  e.arch = "x86_64-avx2";
  e.device_model = "Test CPU";
  e.compiler = "g++ 12.2.0";
  e.torch_version = "2.11.0";
  return e;
}

search::Move move(int knob) {
  search::Move m;
  m.spec.backend = Backend::kCpu;
  m.spec.language = SourceLanguage::kCpp;
  m.spec.source = "extern \"C\" void k(const void*, void* const*) { /* " + std::to_string(knob) + " */ }";
  m.spec.entry_points = {"k"};
  m.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  m.spec.plan.launches = {l};
  m.proposer = "template";
  m.label = "softmax rows=" + std::to_string(knob);
  return m;
}

// A worker's result for a measured candidate `speedup` times faster than PyTorch's kernel.
eval::EvalResult measured(double speedup, bool significant = true) {
  eval::EvalResult r;
  r.status = eval::EvalStatus::kMeasured;
  r.artifact_name = "so";
  r.artifact = "built-object-" + std::to_string(speedup);
  r.environment = worker_env();
  r.verify.trials_run = 12;
  r.verify.checks = "12 trials";
  r.timing.runs = 30;
  r.timing.baseline_median_ns = 2000;
  r.timing.candidate_median_ns = 2000 / speedup;
  r.timing.speedup = speedup;
  r.timing.noise_band = 0.02;
  r.timing.significant = significant;
  return r;
}

struct Fixture {
  TempDir dir{"kforge-observers-test"};
  search::SearchTree tree;
  std::vector<SessionEvent> events;
  std::vector<std::string> log;
  EventSink emit() {
    return [this](SessionEvent e) { events.push_back(std::move(e)); };
  }
  LogSink logger() {
    return [this](const std::string& l) { log.push_back(l); };
  }
  std::string cache() const { return (dir.path / "cache").string(); }
};

}  // namespace

TEST_CASE("WinnerPublisher: only a result that improves on the best so far becomes a cache entry") {
  Fixture f;
  StatusOr<Store> store = Store::open(f.cache());
  REQUIRE(store.ok());
  const OpSignature s = sig();
  WinnerPublisher publisher(*store, 1.2, f.emit(), f.logger());   // a restored tree's best: 1.2x
  const eval::JobPlacement where{"cpu", "", {}};

  auto offer = [&](int knob, const eval::EvalResult& r) {
    const uint64_t id = f.tree.add(0, move(knob));
    const search::Outcome o = search::outcome_of(r);
    REQUIRE(publisher.on_result(EvaluatedNode{s, id, f.tree.node(id), r, where, o}).ok());
    return id;
  };
  auto published = [&]() -> std::optional<StoredEntry> {
    StatusOr<std::optional<StoredEntry>> hit = store->lookup(s, worker_env());
    REQUIRE(hit.ok());
    return *hit;
  };

  offer(1, measured(1.1));                        // faster than PyTorch, not than the best so far
  offer(2, measured(3.0, /*significant=*/false)); // inside the noise band
  eval::EvalResult implausible = measured(40);
  implausible.timing.implausible = "PyTorch's kernel measured 250x its cost model";
  offer(3, implausible);
  eval::EvalResult failed = measured(5);
  failed.status = eval::EvalStatus::kVerifyFailed;
  offer(4, failed);
  CHECK_FALSE(published().has_value());
  CHECK(f.events.empty());
  CHECK(publisher.best() == 1.2);

  const uint64_t winner = offer(5, measured(2.0));
  std::optional<StoredEntry> e = published();
  REQUIRE(e.has_value());
  CHECK(e->spec == move(5).spec);
  CHECK(e->timings.baseline_ns == 2000);
  CHECK(e->timings.candidate_ns == 1000);
  CHECK(e->verification.passed);
  CHECK(e->provenance.proposer == "template:softmax rows=5");
  CHECK(e->provenance.search_id == s.id().hex());
  REQUIRE(e->blobs.size() == 1);
  CHECK(store->read_blob(e->blobs[0]).value() == "built-object-2.000000");
  CHECK(publisher.best() == 2.0);
  CHECK(publisher.best_label() == "softmax rows=5");
  CHECK(publisher.entry_key() == e->key.hex());
  REQUIRE(f.events.size() == 1);
  CHECK(f.events[0].kind == SessionEvent::Kind::kPublished);
  CHECK(f.events[0].node == winner);
  CHECK(f.events[0].entry_key == e->key.hex());
  CHECK(f.events[0].environment_key == worker_env().key());
  CHECK(f.events[0].speedup == 2.0);

  offer(6, measured(1.9));   // no better: the entry stays
  CHECK(published()->spec == move(5).spec);
  offer(7, measured(2.5));   // better: it replaces the entry (one per signature and environment)
  CHECK(published()->spec == move(7).spec);
  CHECK(f.events.size() == 2);
}

TEST_CASE("WinnerPublisher: a winner the cache refuses is logged, not fatal, and not counted as the best") {
  Fixture f;
  StatusOr<Store> store = Store::open(f.cache());
  REQUIRE(store.ok());
  const OpSignature s = sig();
  WinnerPublisher publisher(*store, 0, f.emit(), f.logger());
  search::Move bad = move(1);
  bad.spec.plan.launches[0].entry = "not_an_entry_point";   // an invalid spec: the store refuses it
  const uint64_t id = f.tree.add(0, bad);
  const eval::EvalResult r = measured(2.0);
  const search::Outcome o = search::outcome_of(r);
  CHECK(publisher.on_result(EvaluatedNode{s, id, f.tree.node(id), r, eval::JobPlacement{"cpu", "", {}}, o}).ok());
  CHECK(publisher.best() == 0);
  CHECK(f.events.empty());
  REQUIRE(f.log.size() == 1);
  CHECK_THAT(f.log[0], Catch::StartsWith("cannot publish the winner softmax rows=1: "));
}

TEST_CASE("WinnerPublisher: a winner timed on a GPU that serving processes used says so in its log line and event") {
  Fixture f;
  StatusOr<Store> store = Store::open(f.cache());
  REQUIRE(store.ok());
  const OpSignature s = sig();
  WinnerPublisher publisher(*store, 0, f.emit(), f.logger());
  const uint64_t id = f.tree.add(0, move(1));
  const eval::EvalResult r = measured(2.0);
  search::Outcome o = search::outcome_of(r);
  o.shared_gpu_pids = {4242, 4343};
  REQUIRE(publisher.on_result(EvaluatedNode{s, id, f.tree.node(id), r, eval::JobPlacement{"cuda:0", "GPU-1", {4242, 4343}}, o}).ok());
  REQUIRE(f.log.size() == 1);
  CHECK_THAT(f.log[0], Catch::Contains("timed on cuda:0, GPU-1, while serving pid(s) 4242, 4343 used that GPU"));
  REQUIRE(f.events.size() == 1);
  CHECK(f.events[0].shared_gpu_pids == std::vector<int32_t>{4242, 4343});
}

TEST_CASE("OutcomeJournal: every outcome is in the journal a restarted daemon reads") {
  Fixture f;
  const std::string state = (f.dir.path / "state").string();
  const OpSignature s = sig();
  StatusOr<SearchJournal> journal = SearchJournal::open(state, s, "mcts");
  REQUIRE(journal.ok());
  OutcomeJournal observer(*journal);
  const uint64_t id = f.tree.add(0, move(1));
  REQUIRE(journal->append_node(f.tree.node(id)).ok());
  eval::EvalResult r = measured(1.7);
  search::Outcome o = search::outcome_of(r);
  o.implausible = "too fast to be true";
  REQUIRE(observer.on_result(EvaluatedNode{s, id, f.tree.node(id), r, eval::JobPlacement{"cpu", "", {}}, o}).ok());

  StatusOr<SearchJournal::Contents> back = SearchJournal::read(journal->path());
  REQUIRE(back.ok());
  REQUIRE(back->tree.contains(id));
  const std::optional<search::Outcome>& got = back->tree.node(id).outcome;
  REQUIRE(got.has_value());
  CHECK(got->status == o.status);
  CHECK(got->speedup == o.speedup);
  CHECK(got->significant == o.significant);
  CHECK(got->noise_band == o.noise_band);
  CHECK(got->baseline_ns == o.baseline_ns);
  CHECK(got->candidate_ns == o.candidate_ns);
  CHECK(got->implausible == "too fast to be true");
}

TEST_CASE("ResultEvents: the result event carries the node, its move, the verdict and where it ran") {
  Fixture f;
  const OpSignature s = sig();
  ResultEvents observer(f.emit());
  const uint64_t parent = f.tree.add(0, move(1));
  const uint64_t id = f.tree.add(parent, move(2));
  eval::EvalResult r = measured(1.5);
  r.status = eval::EvalStatus::kCompileError;
  r.message = "compile error: expected ';'";
  r.build_cached = true;
  r.build_ms = 3.5;
  search::Outcome o = search::outcome_of(r);
  REQUIRE(observer.on_result(EvaluatedNode{s, id, f.tree.node(id), r, eval::JobPlacement{"cuda:1", "GPU-2", {7}}, o}).ok());
  REQUIRE(f.events.size() == 1);
  const SessionEvent& e = f.events[0];
  CHECK(e.kind == SessionEvent::Kind::kResult);
  CHECK(e.signature == s.id());
  CHECK(e.node == id);
  CHECK(e.parent == parent);
  CHECK(e.status == eval::EvalStatus::kCompileError);
  CHECK(e.message == "compile error: expected ';'");
  CHECK(e.label == "softmax rows=2");
  CHECK(e.proposer == "template");
  CHECK(e.device == "cuda:1");
  CHECK(e.uuid == "GPU-2");
  CHECK(e.build_cached);
  CHECK(e.build_ms == 3.5);
}

// The web GUI's documents and event log (search_daemon/daemon/gui_api.h) on a real journal: what a
// tree and a candidate say, and how the event log numbers, waits, resumes and closes.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "search_daemon/daemon/gui_api.h"
#include "search_daemon/daemon/journal.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::daemon;
using namespace std::chrono_literals;
using kforge::test_support::TempDir;

namespace {

OpSignature sig() {
  TensorMeta m;
  m.sizes = {8, 32};
  m.strides = {32, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(m), Arg::integer(-1), Arg::boolean(false)}, Target{Backend::kCpu, "x86_64"}};
}

search::Move move(const std::string& source, const std::string& label) {
  search::Move m;
  m.spec.backend = Backend::kCpu;
  m.spec.language = SourceLanguage::kCpp;
  m.spec.source = source;
  m.spec.entry_points = {"k"};
  m.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.grid = {"size0_0", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  m.spec.plan.launches = {l};
  m.proposer = "llm";
  m.label = label;
  m.prior = 0.5;
  m.origin = R"({"api": "openai", "model": "m", "messages": [{"role": "user", "content": "write a kernel"}]})";
  return m;
}

}  // namespace

TEST_CASE("gui api: a tree shows each node's status, visits and the path to the best, and a candidate its parent and logs") {
  TempDir dir("kforge-gui-api");
  const std::string state = (dir.path / "state").string();
  StatusOr<SearchJournal> j = SearchJournal::open(state, sig(), "mcts");
  REQUIRE(j.ok());
  search::SearchTree tree;
  const uint64_t broken = tree.add(0, move("extern \"C\" void k(const void*, void* const*) {}\n// broken", "llm: first"));
  const uint64_t fixed = tree.add(broken, move("extern \"C\" void k(const void*, void* const*) {}\n// fixed", "llm: repair"));
  const uint64_t waiting = tree.add(fixed, move("extern \"C\" void k(const void*, void* const*) {}\n// next", "llm: next"));
  for (uint64_t id : {broken, fixed, waiting}) REQUIRE(j->append_node(tree.node(id)).ok());
  for (uint64_t id : {broken, fixed, waiting}) REQUIRE(j->append_submitted(id).ok());
  search::Outcome bad;
  bad.status = eval::EvalStatus::kCompileError;
  bad.message = "compile error";
  bad.build_log = "kernel.cc:2: error: expected ';'";
  REQUIRE(j->append_outcome(broken, bad).ok());
  search::Outcome good;
  good.status = eval::EvalStatus::kMeasured;
  good.speedup = 2.0;
  good.significant = true;
  good.baseline_ns = 2000;
  good.candidate_ns = 1000;
  REQUIRE(j->append_outcome(fixed, good).ok());

  StatusOr<SearchJournal::Contents> c = SearchJournal::read(SearchJournal::path_for(state, sig().id()));
  REQUIRE(c.ok());
  const nlohmann::json t = tree_json(*c);
  CHECK(t.at("id") == sig().id().hex());
  REQUIRE(t.at("nodes").size() == 4);
  const nlohmann::json& n = t.at("nodes");
  CHECK(n[0].at("status") == "root");
  CHECK(n[0].at("visits") == 2);
  CHECK(n[broken].at("status") == "compile_error");
  CHECK(n[broken].at("visits") == 2);   // itself and its repair
  CHECK(n[fixed].at("status") == "measured");
  CHECK(n[fixed].at("best") == true);
  CHECK(n[waiting].at("status") == "in_flight");
  CHECK(n[broken].at("on_best_path") == true);
  CHECK(n[waiting].at("on_best_path") == false);
  CHECK(t.at("best_node") == fixed);

  std::optional<nlohmann::json> cand = candidate_json(*c, fixed);
  REQUIRE(cand);
  CHECK(cand->at("parent") == broken);
  CHECK(cand->at("parent_source").get<std::string>().find("// broken") != std::string::npos);
  CHECK(cand->at("source").get<std::string>().find("// fixed") != std::string::npos);
  CHECK(cand->at("plan").at("launches").at(0).at("entry") == "k");
  CHECK(cand->at("origin").at("model") == "m");
  CHECK(cand->at("outcome").at("speedup") == 2.0);
  CHECK(cand->at("op_bytes").get<double>() == 2.0 * 8 * 32 * 4);   // [8,32] float32 read once, written once
  CHECK(cand->at("backend") == "cpu");
  std::optional<nlohmann::json> failed = candidate_json(*c, broken);
  REQUIRE(failed);
  CHECK(failed->at("outcome").at("build_log") == "kernel.cc:2: error: expected ';'");
  CHECK(failed->at("parent_source") == "");
  CHECK_FALSE(candidate_json(*c, 0));
  CHECK_FALSE(candidate_json(*c, 99));

  const nlohmann::json all = searches_json(state);
  REQUIRE(all.size() == 1);
  CHECK(all[0].at("evaluated") == 2);
  CHECK(all[0].at("in_flight") == 1);
  CHECK(all[0].at("best_speedup") == 2.0);
}

TEST_CASE("gui api: progress steps up at each evaluation that beat the best, in the order they finished") {
  TempDir dir("kforge-gui-api");
  const std::string state = (dir.path / "state").string();
  StatusOr<SearchJournal> j = SearchJournal::open(state, sig(), "mcts");
  REQUIRE(j.ok());
  search::SearchTree tree;
  std::vector<uint64_t> ids;
  for (int k = 0; k < 4; ++k) {
    ids.push_back(tree.add(0, move("extern \"C\" void k(const void*, void* const*) {}\n// " + std::to_string(k), "t" + std::to_string(k))));
    REQUIRE(j->append_node(tree.node(ids.back())).ok());
  }
  StatusOr<SearchJournal::Contents> header = SearchJournal::read(SearchJournal::path_for(state, sig().id()));
  REQUIRE(header.ok());
  const uint64_t t0 = header->created_unix_ms;
  auto measured = [&](double speedup, bool significant, uint64_t after_ms) {
    search::Outcome o;
    o.status = eval::EvalStatus::kMeasured;
    o.speedup = speedup;
    o.significant = significant;
    o.finished_unix_ms = t0 + after_ms;
    return o;
  };
  // Node 3 finished first (1.5x at 2 s), node 1 next (1.4x: not better), node 2 (2.0x but not
  // significant: not a win), node 4 last (1.8x at 9 s).
  REQUIRE(j->append_outcome(ids[2], measured(1.5, true, 2000)).ok());
  REQUIRE(j->append_outcome(ids[0], measured(1.4, true, 4000)).ok());
  REQUIRE(j->append_outcome(ids[1], measured(2.0, false, 6000)).ok());
  REQUIRE(j->append_outcome(ids[3], measured(1.8, true, 9000)).ok());

  const nlohmann::json p = progress_json(state);
  REQUIRE(p.size() == 1);
  CHECK(p[0].at("evaluated") == 4);
  CHECK(p[0].at("last_t_s") == 9.0);
  const nlohmann::json& pts = p[0].at("points");
  REQUIRE(pts.size() == 2);
  CHECK(pts[0].at("speedup") == 1.5);
  CHECK(pts[0].at("t_s") == 2.0);
  CHECK(pts[0].at("evaluation") == 1);
  CHECK(pts[0].at("node") == ids[2]);
  CHECK(pts[1].at("speedup") == 1.8);
  CHECK(pts[1].at("t_s") == 9.0);
  CHECK(pts[1].at("evaluation") == 4);
}

TEST_CASE("gui api: the event log numbers events, resumes after a number, says what was dropped, and closes") {
  EventLog log(3);
  CHECK(log.last() == 0);
  for (int i = 1; i <= 5; ++i) log.append("{\"n\": " + std::to_string(i) + "}");
  CHECK(log.last() == 5);
  EventLog::Batch b = log.after(3, 10, 0ms);
  REQUIRE(b.events.size() == 2);
  CHECK(b.events[0].first == 4);
  CHECK(b.events[1].second == "{\"n\": 5}");
  CHECK_FALSE(b.missed);
  b = log.after(0, 10, 0ms);   // events 1 and 2 are gone: the page must reload
  CHECK(b.missed);
  CHECK(b.events.size() == 3);
  CHECK(log.after(5, 10, 0ms).events.empty());
  // A waiter wakes on the next event, and close() ends every wait for good.
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    log.append("{\"n\": 6}");
  });
  b = log.after(5, 10, 10s);
  t.join();
  REQUIRE(b.events.size() == 1);
  CHECK(b.events[0].first == 6);
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    log.close();
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(log.after(6, 10, 10s).events.empty());
  closer.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(log.closed());
}

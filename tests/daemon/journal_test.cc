// The search journal (Note [Journal format]): what a daemon killed at any point finds again, and
// what it refuses to guess about.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "runtime/msgpack_codec.h"
#include "search_daemon/daemon/journal.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::daemon;
using kforge::test_support::TempDir;
namespace fs = std::filesystem;

namespace {

OpSignature sig() {
  TensorMeta m;
  m.sizes = {8, 32};
  m.strides = {32, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(m), Arg::integer(-1), Arg::boolean(false)}, Target{Backend::kCpu, "x86_64"}};
}

search::Move move(int knob) {
  search::Move m;
  m.spec.backend = Backend::kCpu;
  m.spec.language = SourceLanguage::kCpp;
  m.spec.source = "extern \"C\" void k(const void*, void* const*) {}";
  m.spec.entry_points = {"k"};
  m.spec.compile_options = {"-DKNOB=" + std::to_string(knob)};
  m.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  m.spec.plan.launches = {l};
  m.proposer = "template";
  m.label = "knob=" + std::to_string(knob);
  m.prior = 0.25 * knob;
  return m;
}

search::Outcome measured(double speedup) {
  search::Outcome o;
  o.status = eval::EvalStatus::kMeasured;
  o.speedup = speedup;
  o.significant = true;
  o.noise_band = 0.01;
  o.baseline_ns = 1000;
  o.candidate_ns = 1000 / speedup;
  return o;
}

// A journal with: node 1 measured 1.5x, node 2 a compile error, node 3 submitted (in flight),
// node 4 proposed only.
std::string write_journal(const std::string& state) {
  StatusOr<SearchJournal> j = SearchJournal::open(state, sig(), "mcts");
  REQUIRE(j.ok());
  search::SearchTree tree;
  for (int k = 1; k <= 4; ++k) {
    const uint64_t id = tree.add(k == 4 ? 1 : 0, move(k));
    REQUIRE(j->append_node(tree.node(id)).ok());
  }
  REQUIRE(j->append_submitted(1).ok());
  REQUIRE(j->append_submitted(2).ok());
  REQUIRE(j->append_submitted(3).ok());
  REQUIRE(j->append_outcome(1, measured(1.5)).ok());
  search::Outcome bad;
  bad.status = eval::EvalStatus::kCompileError;
  bad.message = "compile error: expected ';'";
  bad.build_log = "kernel.cc:3: error: expected ';'";
  REQUIRE(j->append_outcome(2, bad).ok());
  return j->path();
}

}  // namespace

TEST_CASE("journal: a reopened journal gives back every node, outcome and in-flight mark, in order") {
  TempDir t("kforge-journal-test");
  const std::string path = write_journal(t.path.string());
  StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
  REQUIRE(j.ok());
  const SearchJournal::Contents& c = j->restored();
  CHECK(c.signature == sig());
  CHECK(c.strategy == "mcts");
  CHECK_FALSE(c.done);
  CHECK(c.truncated_bytes == 0);
  REQUIRE(c.tree.size() == 5);
  CHECK(c.tree.node(4).parent == 1);
  CHECK(c.tree.node(2).move.label == "knob=2");
  CHECK(c.tree.node(3).move.prior == Approx(0.75));
  CHECK(c.tree.node(1).move.spec == move(1).spec);
  CHECK(c.tree.node(1).move.origin.empty());   // a template's node has no origin
  REQUIRE(c.tree.node(1).outcome);
  CHECK(c.tree.node(1).outcome->speedup == Approx(1.5));
  CHECK(c.tree.node(2).outcome->status == eval::EvalStatus::kCompileError);
  CHECK(c.tree.node(2).outcome->build_log == "kernel.cc:3: error: expected ';'");
  CHECK(c.tree.evaluated() == 2);
  CHECK(c.tree.node(3).virtual_loss == 1);   // submitted, no outcome: in flight when it stopped
  CHECK(c.tree.node(4).virtual_loss == 0);   // proposed only
  CHECK(c.tree.node(1).virtual_loss == 0);
  REQUIRE(c.tree.best() != nullptr);
  CHECK(c.tree.best()->id == 1);
  // Private: 0600 in a 0700 directory.
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat((t.path / "journal").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(SearchJournal::list(t.path.string()) == std::vector<std::string>{path});
}

TEST_CASE("journal: a write cut short by a kill is dropped, and appending goes on after the last whole record") {
  TempDir t("kforge-journal-test");
  const std::string path = write_journal(t.path.string());
  const auto full = fs::file_size(path);
  // Every cut inside the last record (the compile error's outcome) loses exactly that record.
  for (uintmax_t cut : {full - 1, full - 20, full - 60}) {
    fs::copy_file(path, path + ".orig", fs::copy_options::overwrite_existing);
    fs::resize_file(path, cut);
    StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
    REQUIRE(j.ok());
    CHECK(j->restored().truncated_bytes > 0);
    CHECK(j->restored().tree.evaluated() == 1);
    CHECK_FALSE(j->restored().tree.node(2).outcome);
    REQUIRE(j->append_done("budget spent").ok());
    StatusOr<SearchJournal::Contents> again = SearchJournal::read(path);
    REQUIRE(again.ok());
    CHECK(again->done);
    CHECK(again->done_reason == "budget spent");
    CHECK(again->truncated_bytes == 0);
    fs::copy_file(path + ".orig", path, fs::copy_options::overwrite_existing);
  }
}

TEST_CASE("journal: a bad record in the middle is corruption: refused with the offset, the file untouched") {
  TempDir t("kforge-journal-test");
  const std::string path = write_journal(t.path.string());
  const auto size = fs::file_size(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 3));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size / 3));
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
  REQUIRE_FALSE(j.ok());
  CHECK_THAT(j.status().message(), Catch::Contains(path) && Catch::Contains("corrupt journal"));
  CHECK(fs::file_size(path) == size);
}

TEST_CASE("journal: a journal of another signature is refused, not overwritten") {
  TempDir t("kforge-journal-test");
  const std::string path = write_journal(t.path.string());
  // Same file name, other content: as if two signatures collided or the file was copied by hand.
  OpSignature other = sig();
  other.args[1] = Arg::integer(0);
  const std::string other_path = t.path.string() + "/journal/" + other.id().hex() + ".kfj";
  fs::copy_file(path, other_path);
  StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), other, "mcts");
  REQUIRE_FALSE(j.ok());
  CHECK_THAT(j.status().message(), Catch::Contains("another signature"));
}

TEST_CASE("journal: an outcome keeps the serving processes its timing shared a GPU with, and older outcomes have none") {
  TempDir t("kforge-journal-test");
  const std::string path = write_journal(t.path.string());
  {
    StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
    REQUIRE(j.ok());
    search::Outcome shared = measured(1.2);
    shared.shared_gpu_pids = {4242, 4343};
    shared.implausible = "PyTorch's kernel measured 16 ms, 2100x the cost model's 7.6 us";
    REQUIRE(j->append_outcome(3, shared).ok());
  }
  // An outcome record as a daemon before shared_gpu_pids wrote it: 11 fields.
  {
    msgpack::sbuffer buf;
    codec::Packer pk(buf);
    pk.pack_array(11);
    pk.pack_text("outcome");
    pk.pack_uint64(4);
    pk.pack_uint8(static_cast<uint8_t>(eval::EvalStatus::kMeasured));
    pk.pack_f64(1.1);
    pk.pack_f64(0.01);
    pk.pack(true);
    pk.pack_f64(1000);
    pk.pack_f64(900);
    pk.pack_text("");
    pk.pack_text("");
    pk.pack_text("");
    const std::string payload(buf.data(), buf.size());
    std::string rec;
    const uint64_t hash = hash128(payload).lo;
    for (int i = 0; i < 4; ++i) rec.push_back(static_cast<char>((payload.size() >> (8 * i)) & 0xff));
    for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>((hash >> (8 * i)) & 0xff));
    rec += payload;
    std::ofstream(path, std::ios::binary | std::ios::app) << rec;
  }
  StatusOr<SearchJournal::Contents> c = SearchJournal::read(path);
  REQUIRE(c.ok());
  REQUIRE(c->tree.node(3).outcome);
  CHECK(c->tree.node(3).outcome->shared_gpu_pids == std::vector<int32_t>{4242, 4343});
  CHECK(c->tree.node(3).outcome->implausible == "PyTorch's kernel measured 16 ms, 2100x the cost model's 7.6 us");
  CHECK_FALSE(c->tree.node(3).outcome->improves());   // correct, but its speed is not to be believed
  REQUIRE(c->tree.node(4).outcome);
  CHECK(c->tree.node(4).outcome->speedup == Approx(1.1));
  CHECK(c->tree.node(4).outcome->finished_unix_ms == 0);   // an older outcome has no time
  CHECK(c->tree.node(4).outcome->shared_gpu_pids.empty());
  CHECK(c->tree.node(4).outcome->implausible.empty());
  CHECK(c->tree.node(1).outcome->shared_gpu_pids.empty());
}

TEST_CASE("journal: a node keeps its origin, and an outcome its spreads and PyTorch's errors") {
  TempDir t("kforge-journal-test");
  const std::string big(2u << 20, 'c');   // over msgpack's default 1 MiB string limit
  {
    StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
    REQUIRE(j.ok());
    search::SearchTree tree;
    search::Move m = move(7);
    m.proposer = "llm";
    m.origin = R"({"model": "test-model", "messages": [")" + big + R"("]})";
    const uint64_t id = tree.add(0, m);
    REQUIRE(j->append_node(tree.node(id)).ok());
    search::Outcome o = measured(1.3);
    o.baseline_spread = 0.04;
    o.candidate_spread = 0.02;
    o.torch_max_abs_error = 2.5e-7;
    o.torch_rel_error = 1e-7;
    o.finished_unix_ms = 1796000000123;
    REQUIRE(j->append_outcome(id, o).ok());
  }
  StatusOr<SearchJournal> j = SearchJournal::open(t.path.string(), sig(), "mcts");
  REQUIRE(j.ok());
  const search::SearchTree& tree = j->restored().tree;
  REQUIRE(tree.size() == 2);
  CHECK(tree.node(1).move.origin == R"({"model": "test-model", "messages": [")" + big + R"("]})");
  REQUIRE(tree.node(1).outcome);
  CHECK(tree.node(1).outcome->baseline_spread == Approx(0.04));
  CHECK(tree.node(1).outcome->candidate_spread == Approx(0.02));
  CHECK(tree.node(1).outcome->torch_max_abs_error == Approx(2.5e-7));
  CHECK(tree.node(1).outcome->torch_rel_error == Approx(1e-7));
  CHECK(tree.node(1).outcome->finished_unix_ms == 1796000000123);
  // The header's start time is read back too (the GUI's time axis).
  StatusOr<SearchJournal::Contents> c = SearchJournal::read(j->path());
  REQUIRE(c.ok());
  const auto now_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  CHECK(c->created_unix_ms > now_ms - 600000);
  CHECK(c->created_unix_ms <= now_ms);
}

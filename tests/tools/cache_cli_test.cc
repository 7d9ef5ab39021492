// `kforge cache ...` end to end on a real cache directory: what users and scripts see.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache/store.h"
#include "tools/cli.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;

struct Run {
  int rc;
  std::string out, err;
};

Run run_kforge(const fs::path& cache, std::vector<std::string> args) {
  args.insert(args.begin(), {"kforge", "--cache-dir", cache.string()});
  std::ostringstream out, err;
  int rc = run_cli(args, out, err);
  return {rc, out.str(), err.str()};
}

// A store in a new 0700 directory `dir`.
Store private_store(const fs::path& dir) {
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  StatusOr<Store> store = Store::open(dir.string());
  REQUIRE(store.ok());
  return std::move(*store);
}

TensorMeta contiguous(std::vector<int64_t> sizes) { return contiguous_tensor(DType::kFloat32, DeviceType::kCpu, std::move(sizes)); }

CacheEntry entry(int64_t rows, double speedup) {
  CacheEntry e;
  e.signature = OpSignature{"aten::_softmax", "", {Arg::tensor(contiguous({rows, 1024})), Arg::integer(-1),
                                                   Arg::boolean(false)},
                            Target{Backend::kCpu, "x86_64-avx2"}};
  e.environment.backend = Backend::kCpu;
  e.environment.arch = "x86_64-avx2";
  e.environment.compiler = "g++ 12.2.0";
  e.environment.torch_version = "2.11.0";
  e.spec.backend = Backend::kCpu;
  e.spec.language = SourceLanguage::kCpp;
  e.spec.source = "extern \"C\" void softmax_rows(const float* x, float* y, long rows, long cols) { /* ... */ }\n";
  e.spec.entry_points = {"softmax_rows"};
  e.spec.compile_options = {"-O3", "-mavx2"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "softmax_rows";
  l.grid = {"size0_0", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("size0_0"), ArgBinding::size("size0_1")};
  e.spec.plan.launches = {l};
  e.blobs = {{"so", std::string(4096, static_cast<char>(rows & 0x7f))}};
  e.verification = {5, 1e-7, 2e-7, 1e-7, 2e-7, true, "5 trials: normal, uniform, large"};
  e.timings = {2000.0, 2000.0 / speedup, 0.01, 30};
  e.provenance = {"template:softmax_rowwise", "s-1", "0.1.0", 1764680000000, "staging-1"};
  return e;
}

}  // namespace

TEST_CASE("kforge cache: ls, show, verify, state changes, rm on a real cache") {
  TempDir t{"kforge-cli-test"};
  fs::path cache = t.path / "cache";
  auto store = Store::open((fs::create_directories(cache), fs::permissions(cache, fs::perms::owner_all,
                                                                            fs::perm_options::replace),
                            cache.string()));
  REQUIRE(store.ok());
  auto k1 = store->publish(entry(64, 1.5));
  auto k2 = store->publish(entry(128, 2.0));
  REQUIRE(k1.ok());
  REQUIRE(k2.ok());
  const std::string p1 = k1->hex().substr(0, 8);

  Run ls = run_kforge(cache, {"cache", "ls"});
  CHECK(ls.rc == 0);
  CHECK_THAT(ls.out, Catch::Contains("aten::_softmax(float32[64,1024], -1, false)"));
  CHECK_THAT(ls.out, Catch::Contains("1.50x"));
  CHECK_THAT(ls.out, Catch::Contains("2 entries"));

  Run js = run_kforge(cache, {"cache", "ls", "--json"});
  REQUIRE(js.rc == 0);
  auto j = nlohmann::json::parse(js.out);
  CHECK(j["entries"].size() == 2);

  Run show = run_kforge(cache, {"cache", "show", p1});
  CHECK(show.rc == 0);
  CHECK_THAT(show.out, Catch::Contains(k1->hex()));
  CHECK_THAT(show.out, Catch::Contains("speedup 1.50x"));
  CHECK_THAT(show.out, Catch::Contains("template:softmax_rowwise"));
  CHECK_THAT(show.out, Catch::Contains("launch 0: softmax_rows grid (size0_0, 1, 1)"));
  CHECK_THAT(show.out, Catch::Contains("extern \"C\" void softmax_rows"));

  CHECK(run_kforge(cache, {"cache", "verify"}).rc == 0);

  Run dis = run_kforge(cache, {"cache", "disable", p1, "--reason", "suspicious"});
  CHECK(dis.rc == 0);
  CHECK_THAT(run_kforge(cache, {"cache", "show", p1}).out, Catch::Contains("disabled (suspicious)"));
  CHECK(run_kforge(cache, {"cache", "enable", p1}).rc == 0);
  CHECK_THAT(run_kforge(cache, {"cache", "show", p1}).out, Catch::Contains("state:        active"));
  CHECK(run_kforge(cache, {"cache", "pin", p1}).rc == 0);
  CHECK_THAT(run_kforge(cache, {"cache", "show", p1}).out, Catch::Contains("pinned"));

  // gc to zero keeps only the pinned entry.
  Run gc = run_kforge(cache, {"cache", "gc", "--max-size", "0"});
  CHECK(gc.rc == 0);
  CHECK_THAT(run_kforge(cache, {"cache", "ls"}).out, Catch::Contains("1 entries"));

  CHECK(run_kforge(cache, {"cache", "unpin", p1}).rc == 0);
  Run rm = run_kforge(cache, {"cache", "rm", p1});
  CHECK(rm.rc == 0);
  CHECK_THAT(run_kforge(cache, {"cache", "ls"}).out, Catch::Contains("is empty"));
}

TEST_CASE("kforge cache show: a kernel a model wrote shows its model, tokens and cost, and --llm its conversation") {
  TempDir t{"kforge-cli-test"};
  fs::path cache = t.path / "cache";
  Store store = private_store(cache);
  CacheEntry e = entry(64, 1.5);
  e.provenance.proposer = "llm:llm: warp per row";
  const nlohmann::json conversation = {
      {"api", "openai"},
      {"model", "test-model"},
      {"prompt_kind", "repair"},
      {"format_repairs", 1},
      {"messages", {{{"role", "system"}, {"content", "You write kernels for kforge."}},
                    {{"role", "user"}, {"content", "## Operator\naten::_softmax"}},
                    {{"role", "assistant"}, {"content", "```cpp\nextern \"C\" void softmax_rows() {}\n```"}}}},
      {"answer_tokens", {{"input", 1200}, {"output", 800}, {"estimated", false}}},
      {"signature_spend", {{"answers", 5}, {"input_tokens", 6000}, {"output_tokens", 3000}, {"cost_usd", 0.063}}}};
  e.blobs.push_back({kLlmProvenanceBlob, conversation.dump()});
  auto k = store.publish(e);
  REQUIRE(k.ok());
  auto plain = store.publish(entry(128, 2.0));
  REQUIRE(plain.ok());

  Run show = run_kforge(cache, {"cache", "show", k->hex()});
  REQUIRE(show.rc == 0);
  CHECK_THAT(show.out, Catch::Contains("llm:          test-model (openai), repair prompt, 1 format repair(s), answer 1200 "
                                       "input + 800 output tokens; the signature's search had spent 5 answers, 9000 "
                                       "tokens, $0.0630 by then (--llm: the conversation)"));
  Run convo = run_kforge(cache, {"cache", "show", k->hex(), "--llm"});
  REQUIRE(convo.rc == 0);
  CHECK_THAT(convo.out, Catch::Contains("--- system ---\nYou write kernels for kforge."));
  CHECK_THAT(convo.out, Catch::Contains("--- user ---\n## Operator\naten::_softmax"));
  CHECK_THAT(convo.out, Catch::Contains("--- assistant ---\n```cpp"));
  Run js = run_kforge(cache, {"cache", "show", k->hex(), "--json"});
  REQUIRE(js.rc == 0);
  const auto j = nlohmann::json::parse(js.out);
  CHECK(j["llm"]["model"] == "test-model");
  CHECK_FALSE(j["llm"].contains("messages"));
  CHECK(nlohmann::json::parse(run_kforge(cache, {"cache", "show", k->hex(), "--llm", "--json"}).out)["messages"].size() == 3);
  // A template's entry says it has none.
  CHECK_THAT(run_kforge(cache, {"cache", "show", plain->hex(), "--llm"}).out, Catch::Contains("was not written by a language model"));
  CHECK_THAT(run_kforge(cache, {"cache", "show", plain->hex()}).out, !Catch::Contains("llm:"));
  CHECK(run_kforge(cache, {"cache", "verify"}).rc == 0);
}

TEST_CASE("kforge cache verify names each bad file and exits 1") {
  TempDir t{"kforge-cli-test"};
  fs::path cache = t.path / "c";
  Store store = private_store(cache);
  auto k = store.publish(entry(32, 1.2));
  REQUIRE(k.ok());
  auto loaded = store.load(*k);
  REQUIRE(loaded.ok());
  // Flip one byte of the blob.
  fs::path blob;
  for (auto& f : fs::recursive_directory_iterator(cache / "blobs")) {
    if (f.is_regular_file()) blob = f.path();
  }
  REQUIRE(!blob.empty());
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f' ^ 0x55);
  }
  Run v = run_kforge(cache, {"cache", "verify"});
  CHECK(v.rc == 1);
  CHECK_THAT(v.err, Catch::Contains(blob.string()));
}

TEST_CASE("kforge cache: signed export and import round trip, a foreign key is refused") {
  TempDir t{"kforge-cli-test"};
  fs::path src = t.path / "src", dst = t.path / "dst", other = t.path / "other";
  for (const fs::path& p : {src, dst, other}) {
    fs::create_directories(p);
    fs::permissions(p, fs::perms::owner_all, fs::perm_options::replace);
  }
  auto store = Store::open(src.string());
  REQUIRE(store.ok());
  REQUIRE(store->publish(entry(16, 1.1)).ok());
  REQUIRE(store->publish(entry(48, 1.7)).ok());

  fs::path sec = t.path / "k.sec", pub = t.path / "k.pub", sec2 = t.path / "o.sec", pub2 = t.path / "o.pub";
  REQUIRE(run_kforge(src, {"cache", "keygen", sec.string(), pub.string()}).rc == 0);
  REQUIRE(run_kforge(src, {"cache", "keygen", sec2.string(), pub2.string()}).rc == 0);
  fs::path bundle = t.path / "b.kfb";
  Run ex = run_kforge(src, {"cache", "export", bundle.string(), "--sign", sec.string()});
  REQUIRE(ex.rc == 0);
  CHECK_THAT(ex.out, Catch::Contains("exported 2 entries"));

  Run bad = run_kforge(other, {"cache", "import", bundle.string(), "--trusted-key", pub2.string()});
  CHECK(bad.rc == 1);
  CHECK_FALSE(bad.err.empty());
  CHECK_THAT(run_kforge(other, {"cache", "ls"}).out, Catch::Contains("is empty"));

  Run im = run_kforge(dst, {"cache", "import", bundle.string(), "--trusted-key", pub.string()});
  CHECK(im.rc == 0);
  CHECK_THAT(im.out, Catch::Contains("imported 2 entries"));
  CHECK_THAT(run_kforge(dst, {"cache", "ls"}).out, Catch::Contains("2 entries"));
}

TEST_CASE("kforge cache: usage errors name the problem") {
  TempDir t{"kforge-cli-test"};
  CHECK(run_kforge(t.path, {"cache", "frob"}).rc == 2);
  CHECK_THAT(run_kforge(t.path, {"cache", "frob"}).err, Catch::Contains("unknown subcommand 'frob'"));
  CHECK(run_kforge(t.path, {"cache", "gc"}).rc == 2);
  CHECK_THAT(run_kforge(t.path, {"cache", "gc", "--max-size", "12X"}).err, Catch::Contains("unknown unit 'X'"));
  CHECK(run_kforge(t.path, {"cache", "show"}).rc == 2);
  CHECK(run_kforge(t.path, {"cache", "import", "x", "--require-signature"}).rc == 2);
  Run missing = run_kforge(t.path, {"cache", "show", "abcd"});
  CHECK(missing.rc == 1);
}

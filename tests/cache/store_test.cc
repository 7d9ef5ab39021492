// The cache store's contract, one promise per test: what is published comes back exactly; any
// difference in signature or environment is a miss; republishing replaces; state changes persist
// (and a quarantine survives a republish); key prefixes resolve like git's; gc honours the cap in
// least-recently-used order and never touches pinned entries; remove makes an entry disappear.
// Corruption and concurrency have their own files (store_corruption_test.cc, store_stress_test.cc).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cache/store.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;

Store open_store(const std::string& root, StoreOptions opts = {}) {
  auto s = Store::open(root, opts);
  REQUIRE(s.ok());
  return std::move(s).value();
}

Environment test_env() {
  Environment e;
  e.backend = Backend::kCpu;
  e.arch = "x86_64-avx2";
  e.device_model = "Test CPU @ 3.0GHz";
  e.compiler = "g++ 12.2.0";
  e.torch_version = "2.9.0";
  return e;
}

// aten::add(float32[n], float32[n], alpha) on the CPU: n and alpha make distinct keys.
OpSignature add_signature(int64_t n, int64_t alpha = 1) {
  TensorMeta t;
  t.dtype = DType::kFloat32;
  t.device = DeviceType::kCpu;
  t.sizes = {n};
  t.strides = {1};
  return OpSignature{"aten::add",
                     "Tensor",
                     {Arg::tensor(t), Arg::tensor(t), Arg::integer(alpha)},
                     Target{Backend::kCpu, "x86_64-avx2"}};
}

KernelSpec add_spec(const std::string& body) {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = "extern \"C\" void add_k(...) { " + body + " }\n";
  s.entry_points = {"add_k"};
  s.compile_options = {"-O3"};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "add_k";
  l.grid = {"ceil_div(numel0, 1024)", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::input(1), ArgBinding::output(0), ArgBinding::size("numel0")};
  s.plan.launches = {l};
  return s;
}

CacheEntry make_entry(int64_t n, const std::string& variant = "v1", int64_t alpha = 1) {
  CacheEntry e;
  e.signature = add_signature(n, alpha);
  e.environment = test_env();
  e.spec = add_spec("/* " + variant + " */");
  e.blobs.push_back({"so", "ELF-so-bytes:" + variant + ":" + std::to_string(n) + std::string(200, 'x')});
  e.blobs.push_back({"src.ll", "llvm:" + variant});
  e.verification = {16, 1.5e-7, 2e-8, 3e-7, 4e-8, true, "16 trials, normal and edge inputs"};
  e.timings = {1200.5, 800.25, 0.01, 50};
  e.provenance = {"template:add", "search-7", "0.1.0", 1700000000123, "host-a"};
  return e;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void set_mtime_ms(const std::string& path, int64_t ms) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = ms / 1000;
  ts[0].tv_nsec = ts[1].tv_nsec = (ms % 1000) * 1000000;
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), ts, 0) == 0);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Paths of the documented layout (store.h), for tests that age or inspect files.
std::string manifest_path(const Store& s, const EntryKey& k) {
  return s.root() + "/manifests/" + k.hex().substr(0, 2) + "/" + k.hex() + ".kfm";
}
std::string used_path(const Store& s, const EntryKey& k) {
  return s.root() + "/used/" + k.hex().substr(0, 2) + "/" + k.hex();
}
std::string state_path(const Store& s, const EntryKey& k) {
  return s.root() + "/state/" + k.hex().substr(0, 2) + "/" + k.hex() + ".state";
}

}  // namespace

TEST_CASE("Store: a fresh cache gets VERSION and the layout directories") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  CHECK(slurp(t / "cache" + "/VERSION") == "kforge-cache 1\n");
  for (const char* d : {"manifests", "blobs", "state", "used", "tmp"}) CHECK(fs::is_directory(t / "cache" + "/" + d));
  auto problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  CHECK(Store::open(t / "cache").ok());  // reopening an existing cache
}

TEST_CASE("Store: a VERSION of another format is refused, naming both versions") {
  TempDir t{"kforge-store-test"};
  { Store s = open_store(t / "cache"); }
  std::ofstream(t / "cache" + "/VERSION", std::ios::trunc) << "kforge-cache 2\n";
  auto s = Store::open(t / "cache");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.status().message(),
             Catch::Contains("kforge-cache 2") && Catch::Contains("kforge-cache 1") && Catch::Contains("VERSION"));
}

TEST_CASE("Store: publish then lookup returns exactly what was published") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const CacheEntry in = make_entry(4096);
  auto key = s.publish(in);
  REQUIRE(key.ok());
  CHECK(*key == entry_key(in.signature, in.environment));

  auto hit = s.lookup(in.signature, in.environment);
  REQUIRE(hit.ok());
  REQUIRE(hit->has_value());
  const StoredEntry& out = **hit;
  CHECK(out.key == *key);
  CHECK(out.signature == in.signature);
  CHECK(out.environment == in.environment);
  CHECK(out.spec == in.spec);
  CHECK(out.verification == in.verification);
  CHECK(out.timings == in.timings);
  CHECK(out.provenance == in.provenance);
  REQUIRE(out.blobs.size() == in.blobs.size());
  for (size_t i = 0; i < in.blobs.size(); ++i) {
    CHECK(out.blobs[i].name == in.blobs[i].name);
    CHECK(out.blobs[i].size == in.blobs[i].bytes.size());
    CHECK(out.blobs[i].sha256_hex.size() == 64);
    auto bytes = s.read_blob(out.blobs[i]);
    REQUIRE(bytes.ok());
    CHECK(*bytes == in.blobs[i].bytes);
  }
  CHECK(out.status.state == EntryState::kActive);
  CHECK(out.status.usable());
  CHECK_FALSE(out.status.pinned);
  CHECK(out.status.reason.empty());
  CHECK(out.status.last_use_unix_ms == 0);
  CHECK(out.manifest_bytes == fs::file_size(manifest_path(s, *key)));

  // load() by key and a second Store on the same directory see the same entry.
  auto loaded = open_store(t / "cache").load(*key);
  REQUIRE(loaded.ok());
  CHECK(loaded->spec == in.spec);
  auto keys = s.list();
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<EntryKey>{*key});
  auto problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->empty());
}

TEST_CASE("Store: an entry without blobs and with empty provenance round-trips") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  CacheEntry in = make_entry(7);
  in.blobs.clear();
  in.provenance = {};
  in.verification = {};
  in.timings = {};
  REQUIRE(s.publish(in).ok());
  auto hit = s.lookup(in.signature, in.environment);
  REQUIRE(hit.ok());
  REQUIRE(hit->has_value());
  CHECK((*hit)->blobs.empty());
  CHECK((*hit)->provenance == in.provenance);
  CHECK((*hit)->timings == in.timings);
}

TEST_CASE("Store: a difference in any field of the environment is a miss") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const CacheEntry in = make_entry(1024);
  REQUIRE(s.publish(in).ok());
  std::vector<std::pair<const char*, std::function<void(Environment&)>>> changes = {
      {"backend", [](Environment& e) { e.backend = Backend::kCuda; }},
      {"arch", [](Environment& e) { e.arch = "x86_64-avx512f"; }},
      {"device_model", [](Environment& e) { e.device_model = "Other CPU"; }},
      {"driver_version", [](Environment& e) { e.driver_version = 13000; }},
      {"nvrtc_version", [](Environment& e) { e.nvrtc_version = 12080; }},
      {"compiler", [](Environment& e) { e.compiler = "g++ 12.3.0"; }},
      {"torch_version", [](Environment& e) { e.torch_version = "2.9.1"; }},
      {"format_version", [](Environment& e) { e.format_version = kFormatVersion + 1; }},
  };
  for (auto& [field, change] : changes) {
    INFO("changed field: " << field);
    Environment env = in.environment;
    change(env);
    REQUIRE_FALSE(env.differences(in.environment).empty());
    auto hit = s.lookup(in.signature, env);
    REQUIRE(hit.ok());
    CHECK_FALSE(hit->has_value());
  }
  // And a different signature (another scalar argument) is a miss too.
  auto hit = s.lookup(add_signature(1024, 2), in.environment);
  REQUIRE(hit.ok());
  CHECK_FALSE(hit->has_value());
  // The original still hits.
  hit = s.lookup(in.signature, in.environment);
  REQUIRE(hit.ok());
  CHECK(hit->has_value());
}

TEST_CASE("Store: republishing a key replaces the entry") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const CacheEntry v1 = make_entry(512, "v1");
  const CacheEntry v2 = make_entry(512, "v2");
  auto k1 = s.publish(v1);
  auto k2 = s.publish(v2);
  REQUIRE(k1.ok());
  REQUIRE(k2.ok());
  CHECK(*k1 == *k2);
  auto hit = s.lookup(v2.signature, v2.environment);
  REQUIRE(hit.ok());
  REQUIRE(hit->has_value());
  CHECK((*hit)->spec == v2.spec);
  auto blob = s.read_blob((*hit)->blobs[0]);
  REQUIRE(blob.ok());
  CHECK(*blob == v2.blobs[0].bytes);
  auto keys = s.list();
  REQUIRE(keys.ok());
  CHECK(keys->size() == 1);
}

TEST_CASE("Store: disable, quarantine and enable persist across Store instances") {
  TempDir t{"kforge-store-test"};
  EntryKey key;
  {
    Store s = open_store(t / "cache");
    auto k = s.publish(make_entry(64));
    REQUIRE(k.ok());
    key = *k;
    REQUIRE(s.set_state(key, EntryState::kDisabled, "slower than torch on this host").ok());
  }
  {
    Store s = open_store(t / "cache");
    auto e = s.load(key);
    REQUIRE(e.ok());
    CHECK(e->status.state == EntryState::kDisabled);
    CHECK_FALSE(e->status.usable());
    CHECK(e->status.reason == "slower than torch on this host");
    CHECK(e->status.changed_unix_ms > 0);
    REQUIRE(s.set_state(key, EntryState::kQuarantined, "shadow mismatch at element 17").ok());
  }
  {
    Store s = open_store(t / "cache");
    auto e = s.load(key);
    REQUIRE(e.ok());
    CHECK(e->status.state == EntryState::kQuarantined);
    CHECK(e->status.reason == "shadow mismatch at element 17");
    REQUIRE(s.set_state(key, EntryState::kActive, "reviewed by me").ok());
  }
  Store s = open_store(t / "cache");
  auto e = s.load(key);
  REQUIRE(e.ok());
  CHECK(e->status.state == EntryState::kActive);
  CHECK(e->status.reason.empty());  // active entries carry no reason
  CHECK(entry_state_name(EntryState::kQuarantined) == "quarantined");
}

TEST_CASE("Store: pin and unpin persist and are independent of the state") {
  TempDir t{"kforge-store-test"};
  EntryKey key;
  {
    Store s = open_store(t / "cache");
    key = s.publish(make_entry(64)).value();
    REQUIRE(s.set_state(key, EntryState::kQuarantined, "bad").ok());
    REQUIRE(s.set_pinned(key, true).ok());
  }
  {
    Store s = open_store(t / "cache");
    auto e = s.load(key);
    REQUIRE(e.ok());
    CHECK(e->status.pinned);
    CHECK(e->status.state == EntryState::kQuarantined);  // pinning does not re-enable
    REQUIRE(s.set_pinned(key, false).ok());
  }
  auto e = open_store(t / "cache").load(key);
  REQUIRE(e.ok());
  CHECK_FALSE(e->status.pinned);
  CHECK(e->status.state == EntryState::kQuarantined);
}

TEST_CASE("Store: state changes on an unknown key are not-found") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const EntryKey nobody = entry_key(add_signature(1), test_env());
  CHECK(s.set_state(nobody, EntryState::kDisabled, "x").code() == StatusCode::kNotFound);
  CHECK(s.set_pinned(nobody, true).code() == StatusCode::kNotFound);
  CHECK(s.touch(nobody).code() == StatusCode::kNotFound);
  CHECK(s.remove(nobody).code() == StatusCode::kNotFound);
  CHECK(s.load(nobody).status().code() == StatusCode::kNotFound);
  CHECK(s.read_manifest_bytes(nobody).status().code() == StatusCode::kNotFound);
  auto problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->empty());  // and none of these left a file behind
}

TEST_CASE("Store: a quarantined key stays quarantined when it is published again") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const CacheEntry v1 = make_entry(256, "v1");
  const EntryKey key = s.publish(v1).value();
  REQUIRE(s.set_state(key, EntryState::kQuarantined, "shadow mismatch").ok());
  // The daemon, unaware, publishes a new kernel for the same key.
  REQUIRE(s.publish(make_entry(256, "v2")).ok());
  auto hit = s.lookup(v1.signature, v1.environment);
  REQUIRE(hit.ok());
  REQUIRE(hit->has_value());
  CHECK((*hit)->spec == make_entry(256, "v2").spec);
  CHECK((*hit)->status.state == EntryState::kQuarantined);
  CHECK((*hit)->status.reason == "shadow mismatch");
}

TEST_CASE("Store: touch records the last use") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const EntryKey key = s.publish(make_entry(32)).value();
  CHECK(s.load(key)->status.last_use_unix_ms == 0);
  const int64_t before = now_ms();
  REQUIRE(s.touch(key).ok());
  const int64_t used = s.load(key)->status.last_use_unix_ms;
  CHECK(used >= before - 1000);  // file times use the kernel's coarse clock
  CHECK(used <= now_ms() + 1000);
  // A lost use record is recreated by the next touch.
  fs::remove(used_path(s, key));
  REQUIRE(s.touch(key).ok());
  CHECK(s.load(key)->status.last_use_unix_ms > 0);
}

TEST_CASE("Store: resolve_prefix finds a key from a unique prefix, like git") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  // Find two signatures whose keys share their first four hex digits (a birthday search over
  // computed keys: deterministic, and certain well before 5000 tries).
  std::map<std::string, int64_t> seen;
  int64_t a = -1, b = -1;
  for (int64_t n = 1; n < 5000 && a < 0; ++n) {
    std::string p = entry_key(add_signature(n), test_env()).hex().substr(0, 4);
    auto [it, fresh] = seen.emplace(p, n);
    if (!fresh) {
      a = it->second;
      b = n;
    }
  }
  REQUIRE(a > 0);
  const EntryKey ka = s.publish(make_entry(a)).value();
  const EntryKey kb = s.publish(make_entry(b)).value();
  const std::string ha = ka.hex(), hb = kb.hex();
  size_t common = 0;
  while (ha[common] == hb[common]) ++common;
  REQUIRE(common >= 4);

  SECTION("a prefix one digit longer than the common part is unique") {
    auto r = s.resolve_prefix(ha.substr(0, common + 1));
    REQUIRE(r.ok());
    CHECK(*r == ka);
    r = s.resolve_prefix(hb.substr(0, common + 1));
    REQUIRE(r.ok());
    CHECK(*r == kb);
  }
  SECTION("the full key and upper case work") {
    CHECK(s.resolve_prefix(ha).value() == ka);
    std::string upper = hb.substr(0, common + 1);
    for (char& c : upper) c = static_cast<char>(std::toupper(c));
    CHECK(s.resolve_prefix(upper).value() == kb);
  }
  SECTION("an ambiguous prefix lists every candidate") {
    auto r = s.resolve_prefix(ha.substr(0, 4));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("ambiguous") && Catch::Contains(ha) && Catch::Contains(hb));
  }
  SECTION("fewer than four digits, non-hex and over-long prefixes are refused with the reason") {
    auto r = s.resolve_prefix(ha.substr(0, 3));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("at least 4"));
    r = s.resolve_prefix("12g4");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("not hexadecimal"));
    r = s.resolve_prefix(ha + "0");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("longer than a key"));
  }
  SECTION("a prefix nothing has is not-found, and says so") {
    std::string miss = ha.substr(0, 4) + "0";
    for (char c : std::string("0123456789abcdef")) {
      if (c != ha[4] && c != hb[4]) {
        miss.back() = c;
        break;
      }
    }
    auto r = s.resolve_prefix(miss);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("no cache entry matches '" + miss + "'"));
  }
}

TEST_CASE("Store: remove makes the entry disappear with its state and use record") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  const CacheEntry in = make_entry(128);
  const EntryKey key = s.publish(in).value();
  const EntryKey other = s.publish(make_entry(129)).value();
  REQUIRE(s.set_pinned(key, true).ok());
  REQUIRE(s.touch(key).ok());
  REQUIRE(s.remove(key).ok());
  auto hit = s.lookup(in.signature, in.environment);
  REQUIRE(hit.ok());
  CHECK_FALSE(hit->has_value());
  CHECK(s.list().value() == std::vector<EntryKey>{other});
  CHECK_FALSE(fs::exists(manifest_path(s, key)));
  CHECK_FALSE(fs::exists(state_path(s, key)));
  CHECK_FALSE(fs::exists(used_path(s, key)));
  CHECK(s.remove(key).code() == StatusCode::kNotFound);
  // Published again, it starts afresh: active and unpinned.
  REQUIRE(s.publish(in).ok());
  auto e = s.load(key);
  REQUIRE(e.ok());
  CHECK(e->status.state == EntryState::kActive);
  CHECK_FALSE(e->status.pinned);
  CHECK(s.verify_all().value().empty());
}

TEST_CASE("Store: publish refuses entries it could not load back, and writes nothing for them") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  CacheEntry dup = make_entry(8);
  dup.blobs.push_back({"so", "again"});
  auto r = s.publish(dup);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("duplicate name 'so'"));

  CacheEntry bad_name = make_entry(8);
  bad_name.blobs[0].name = "../../etc/passwd";
  r = s.publish(bad_name);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("blobs[0].name"));

  CacheEntry bad_spec = make_entry(8);
  bad_spec.spec.plan.launches[0].entry = "nope";
  r = s.publish(bad_spec);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("kernel spec") && Catch::Contains("launches[0].entry"));

  CHECK(s.list().value().empty());
  CHECK(fs::is_empty(t / "cache" + "/blobs"));
  CHECK(fs::is_empty(t / "cache" + "/tmp"));
}

TEST_CASE("Store: two entries with the same blob content share one blob file") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");
  CacheEntry a = make_entry(10, "same");
  CacheEntry b = make_entry(11, "same");
  b.blobs = a.blobs;
  const EntryKey ka = s.publish(a).value();
  const EntryKey kb = s.publish(b).value();
  CHECK(s.load(ka)->blobs[0].sha256_hex == s.load(kb)->blobs[0].sha256_hex);
  size_t blob_files = 0;
  for (const auto& f : fs::recursive_directory_iterator(t / "cache" + "/blobs")) blob_files += f.is_regular_file();
  CHECK(blob_files == 2);  // "so" and "src.ll", once each
  // Removing one entry and collecting garbage keeps the blobs the other still uses.
  StoreOptions no_grace;
  no_grace.gc_grace_ms = 0;
  Store g = open_store(t / "cache", no_grace);
  REQUIRE(g.remove(ka).ok());
  auto report = g.gc(UINT64_MAX);
  REQUIRE(report.ok());
  CHECK(report->blobs_removed == 0);
  const StoredEntry kept = g.load(kb).value();
  for (const BlobRef& r : kept.blobs) CHECK(g.read_blob(r).ok());
}

TEST_CASE("Store: gc removes least recently used unpinned entries until the cache fits the cap") {
  TempDir t{"kforge-store-test"};
  StoreOptions opts;
  opts.gc_grace_ms = 0;  // so that blobs of removed entries go at once
  Store s = open_store(t / "cache", opts);
  std::vector<EntryKey> k;
  for (int64_t i = 0; i < 5; ++i) k.push_back(s.publish(make_entry(100 + i, "e" + std::to_string(i))).value());
  const int64_t now = now_ms();
  // Last uses, oldest first: e0 used long ago; e1 never used but published before the others;
  // e2 pinned; e3 and e4 used recently.
  set_mtime_ms(used_path(s, k[0]), now - 400000);
  set_mtime_ms(manifest_path(s, k[1]), now - 300000);
  set_mtime_ms(used_path(s, k[2]), now - 350000);
  REQUIRE(s.set_pinned(k[2], true).ok());
  set_mtime_ms(used_path(s, k[3]), now - 100000);
  REQUIRE(s.touch(k[4]).ok());

  auto size_of = [&](const EntryKey& key) {
    auto e = s.load(key);
    REQUIRE(e.ok());
    uint64_t n = e->manifest_bytes;
    for (const BlobRef& r : e->blobs) n += r.size;
    return n;
  };
  uint64_t total = 0;
  for (const EntryKey& key : k) total += size_of(key);

  SECTION("a cap above the size removes nothing") {
    auto r = s.gc(total);
    REQUIRE(r.ok());
    CHECK(r->bytes_before == total);
    CHECK(r->bytes_after == total);
    CHECK(r->removed.empty());
    CHECK(s.list().value().size() == 5);
  }
  SECTION("just under the size of five minus two entries: three go, oldest first, the pinned one stays") {
    const uint64_t cap = total - size_of(k[0]) - size_of(k[1]) - 1;
    const uint64_t e3 = size_of(k[3]);
    auto r = s.gc(cap);
    REQUIRE(r.ok());
    CHECK(r->bytes_before == total);
    CHECK(r->removed == std::vector<EntryKey>{k[0], k[1], k[3]});
    CHECK(r->bytes_after <= cap);
    CHECK(r->bytes_after == cap + 1 - e3);
    CHECK(r->blobs_removed == 6);  // two blobs per removed entry, none shared
    std::vector<EntryKey> left = s.list().value();
    std::vector<EntryKey> expected{k[2], k[4]};
    std::sort(expected.begin(), expected.end());
    CHECK(left == expected);
    CHECK(s.verify_all().value().empty());
  }
  SECTION("cap zero removes every unpinned entry and never the pinned one") {
    auto r = s.gc(0);
    REQUIRE(r.ok());
    CHECK(r->removed.size() == 4);
    CHECK(s.list().value() == std::vector<EntryKey>{k[2]});
    CHECK(r->bytes_after == size_of(k[2]));
  }
  SECTION("a quarantined entry is kept: removing it would forget the quarantine") {
    REQUIRE(s.set_state(k[0], EntryState::kQuarantined, "shadow mismatch").ok());
    REQUIRE(s.set_state(k[1], EntryState::kDisabled, "user").ok());
    auto r = s.gc(0);
    REQUIRE(r.ok());
    CHECK(r->removed == std::vector<EntryKey>{k[1], k[3], k[4]});
    std::vector<EntryKey> expected{k[0], k[2]};
    std::sort(expected.begin(), expected.end());
    CHECK(s.list().value() == expected);
  }
}

TEST_CASE("Store: gc leaves young unreferenced blobs and tmp files alone, and removes old ones") {
  TempDir t{"kforge-store-test"};
  Store s = open_store(t / "cache");  // default grace: one hour
  const EntryKey key = s.publish(make_entry(5)).value();
  REQUIRE(s.remove(key).ok());
  const std::string tmp = t / "cache" + "/tmp/manifest.99999.00000000deadbeef";
  std::ofstream(tmp) << "partial";
  auto r = s.gc(0);
  REQUIRE(r.ok());
  CHECK(r->blobs_removed == 0);
  CHECK(r->tmp_removed == 0);
  CHECK(fs::exists(tmp));
  CHECK(s.verify_all().value().empty());  // young leftovers may belong to a writer in progress

  StoreOptions no_grace;
  no_grace.gc_grace_ms = 0;
  Store g = open_store(t / "cache", no_grace);
  auto problems = g.verify_all();
  REQUIRE(problems.ok());
  REQUIRE(problems->size() == 1);
  CHECK((*problems)[0].path == tmp);
  r = g.gc(0);
  REQUIRE(r.ok());
  CHECK(r->blobs_removed == 2);
  CHECK(r->tmp_removed == 1);
  CHECK_FALSE(fs::exists(tmp));
  CHECK(g.verify_all().value().empty());
}

TEST_CASE("Store: export bytes re-imported elsewhere reproduce the manifest and blobs byte for byte") {
  TempDir t{"kforge-store-test"};
  Store a = open_store(t / "cache" + "-a");
  Store b = open_store(t / "cache" + "-b");
  const CacheEntry in = make_entry(77);
  const EntryKey key = a.publish(in).value();
  auto manifest = a.read_manifest_bytes(key);
  REQUIRE(manifest.ok());
  auto parsed = Store::parse_manifest(*manifest);
  REQUIRE(parsed.ok());
  CHECK(parsed->key == key);
  CHECK(parsed->spec == in.spec);

  SECTION("with every blob supplied") {
    auto k = b.publish_manifest_bytes(*manifest, in.blobs);
    REQUIRE(k.ok());
    CHECK(*k == key);
    CHECK(b.read_manifest_bytes(key).value() == *manifest);
    CHECK(slurp(manifest_path(b, key)) == slurp(manifest_path(a, key)));
    const StoredEntry imported = b.load(key).value();
    for (const BlobRef& r : imported.blobs) CHECK(b.read_blob(r).ok());
  }
  SECTION("a blob whose bytes do not match the manifest is refused and nothing is published") {
    std::vector<BlobData> blobs = in.blobs;
    blobs[0].bytes[0] ^= 1;
    auto k = b.publish_manifest_bytes(*manifest, blobs);
    REQUIRE_FALSE(k.ok());
    CHECK_THAT(k.status().message(), Catch::Contains("'so'"));
    CHECK(b.list().value().empty());
  }
  SECTION("a missing blob is refused unless the cache already has it") {
    std::vector<BlobData> blobs = {in.blobs[1]};
    auto k = b.publish_manifest_bytes(*manifest, blobs);
    REQUIRE_FALSE(k.ok());
    CHECK_THAT(k.status().message(), Catch::Contains("'so'"));
    CHECK(b.list().value().empty());
    REQUIRE(b.publish_manifest_bytes(*manifest, in.blobs).ok());
    REQUIRE(b.publish_manifest_bytes(*manifest, blobs).ok());  // "so" is there now
  }
  SECTION("manifest bytes that do not parse are refused") {
    std::string bad = *manifest;
    bad[bad.size() / 2] ^= 0x10;
    auto k = b.publish_manifest_bytes(bad, in.blobs);
    REQUIRE_FALSE(k.ok());
    CHECK_THAT(k.status().message(), Catch::Contains("checksum"));
  }
}

// Damaged cache files: every kind of file the store keeps (manifest, blob, state file, use record,
// VERSION) is truncated, bit-flipped and deleted, and each damage must be detected twice: by
// verify_all, which names the file, and by the reading calls (lookup/load/read_blob), which give
// an error or a miss and never a wrong entry. A corrupt state file must never make a quarantined
// entry usable again.
#include <catch2/catch.hpp>

#include <sodium.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
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

// A small entry, so that every byte of its manifest can be flipped in turn.
CacheEntry small_entry(int64_t n) {
  CacheEntry e;
  TensorMeta t;
  t.sizes = {n};
  t.strides = {1};
  e.signature = OpSignature{"aten::neg", "", {Arg::tensor(t)}, Target{Backend::kCpu, "x86_64"}};
  e.environment.backend = Backend::kCpu;
  e.environment.arch = "x86_64";
  e.environment.torch_version = "2.9.0";
  e.spec.backend = Backend::kCpu;
  e.spec.language = SourceLanguage::kCpp;
  e.spec.source = "void k(){}";
  e.spec.entry_points = {"k"};
  e.spec.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  e.spec.plan.launches = {l};
  e.blobs = {{"so", "so-bytes-" + std::to_string(n) + "-0123456789abcdef0123456789abcdef"}};
  e.verification.passed = true;
  e.provenance.proposer = "template:neg";
  return e;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  REQUIRE(f.good());
}

bool names_file(const std::vector<CacheProblem>& problems, const std::string& path) {
  for (const CacheProblem& p : problems) {
    if (p.path == path) return true;
  }
  return false;
}

std::string describe(const std::vector<CacheProblem>& problems) {
  std::string s;
  for (const CacheProblem& p : problems) s += p.path + ": " + p.what + "\n";
  return s;
}

// One published entry and the paths of its files (the layout store.h documents).
struct Fixture {
  TempDir dir{"kforge-corrupt-test"};
  CacheEntry entry = small_entry(16);
  EntryKey key;
  std::string manifest, state, used, blob, version;
  BlobRef blob_ref;

  Fixture() {
    Store s = open_store(dir / "cache");
    key = s.publish(entry).value();
    const std::string h = key.hex();
    manifest = dir / "cache" + "/manifests/" + h.substr(0, 2) + "/" + h + ".kfm";
    state = dir / "cache" + "/state/" + h.substr(0, 2) + "/" + h + ".state";
    used = dir / "cache" + "/used/" + h.substr(0, 2) + "/" + h;
    blob_ref = s.load(key).value().blobs.at(0);
    blob = dir / "cache" + "/blobs/" + blob_ref.sha256_hex.substr(0, 2) + "/" + blob_ref.sha256_hex;
    version = dir / "cache" + "/VERSION";
    REQUIRE(fs::exists(manifest));
    REQUIRE(fs::exists(state));
    REQUIRE(fs::exists(used));
    REQUIRE(fs::exists(blob));
  }

  // Checks that a damaged manifest is an error for load, a (reported) miss for lookup and a
  // problem naming the file for verify_all. A fresh Store each time: lookup reports once per Store.
  void expect_bad_manifest(const std::string& damage) {
    INFO(damage);
    Store s = open_store(dir / "cache");
    std::vector<CacheProblem> reported;
    s.set_problem_callback([&](const CacheProblem& p) { reported.push_back(p); });
    auto e = s.load(key);
    REQUIRE_FALSE(e.ok());
    CHECK_THAT(e.status().message(), Catch::Contains(manifest));
    auto hit = s.lookup(entry.signature, entry.environment);
    REQUIRE(hit.ok());
    CHECK_FALSE(hit->has_value());
    REQUIRE(reported.size() == 1);
    CHECK(reported[0].path == manifest);
    CHECK(reported[0].key == key);
    auto problems = s.verify_all();
    REQUIRE(problems.ok());
    CHECK(names_file(*problems, manifest));
  }

  // A damaged state file: the entry still loads (its manifest is fine) but is not usable, and the
  // reason names the state file.
  void expect_bad_state(const std::string& damage) {
    INFO(damage);
    Store s = open_store(dir / "cache");
    auto hit = s.lookup(entry.signature, entry.environment);
    REQUIRE(hit.ok());
    REQUIRE(hit->has_value());
    CHECK_FALSE((*hit)->status.usable());
    CHECK_THAT((*hit)->status.reason, Catch::Contains(state));
    auto problems = s.verify_all();
    REQUIRE(problems.ok());
    CHECK(names_file(*problems, state));
  }

  void expect_bad_blob(const std::string& damage) {
    INFO(damage);
    Store s = open_store(dir / "cache");
    auto hit = s.lookup(entry.signature, entry.environment);
    REQUIRE(hit.ok());
    REQUIRE(hit->has_value());  // the manifest is intact; its blob is what is wrong
    auto bytes = s.read_blob((*hit)->blobs.at(0));
    REQUIRE_FALSE(bytes.ok());
    CHECK_THAT(bytes.status().message(), Catch::Contains(blob));
    auto problems = s.verify_all();
    REQUIRE(problems.ok());
    CHECK(names_file(*problems, blob));
  }
};

}  // namespace

TEST_CASE("Corruption: a flipped bit at any position of a manifest is detected") {
  Fixture f;
  const std::string good = slurp(f.manifest);
  REQUIRE(good.size() > 100);
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (pos % 8)));
    write_bytes(f.manifest, bad);
    f.expect_bad_manifest("bit " + std::to_string(pos % 8) + " of byte " + std::to_string(pos) + " flipped");
  }
  write_bytes(f.manifest, good);
  Store s = open_store(f.dir / "cache");
  CHECK(s.verify_all().value().empty());
  CHECK(s.lookup(f.entry.signature, f.entry.environment).value().has_value());
}

TEST_CASE("Corruption: a manifest truncated at any length, or with bytes appended, is detected") {
  Fixture f;
  const std::string good = slurp(f.manifest);
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(f.manifest, good.substr(0, len));
    f.expect_bad_manifest("truncated to " + std::to_string(len) + " bytes");
  }
  write_bytes(f.manifest, good + "x");
  f.expect_bad_manifest("one byte appended");
  write_bytes(f.manifest, good + good);
  f.expect_bad_manifest("written twice");
}

// The checks behind the checksum: bytes changed by someone who also recomputed the frame's
// SHA-256 (Note [Cache layout] in store.cc: 56-byte header, SHA-256 of the payload at offset 24).
// Each such manifest must be refused (FlatBuffers verifier, canonical decoders, or the key no
// longer matching the file name) or, where the change hit a plain value such as a timing, load as
// an entry that still has this key: never another entry's kernel under this name.
TEST_CASE("Corruption: a manifest changed anywhere and re-checksummed never loads as another entry") {
  Fixture f;
  const std::string good = slurp(f.manifest);
  constexpr size_t kHeader = 56;
  size_t refused = 0, by_verifier = 0, by_key = 0;
  for (size_t pos = kHeader; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (pos % 8)));
    crypto_hash_sha256(reinterpret_cast<unsigned char*>(bad.data()) + 24,
                       reinterpret_cast<const unsigned char*>(bad.data()) + kHeader, bad.size() - kHeader);
    write_bytes(f.manifest, bad);
    INFO("byte " << pos);
    auto e = open_store(f.dir / "cache").load(f.key);
    if (e.ok()) {
      CHECK(e->key == f.key);
      CHECK(e->signature == f.entry.signature);
      CHECK(e->environment == f.entry.environment);
      continue;
    }
    ++refused;
    CHECK_THAT(e.status().message(), Catch::Contains(f.manifest));
    by_verifier += e.status().message().find("FlatBuffers verifier") != std::string::npos;
    by_key += e.status().message().find("not the one its name says") != std::string::npos;
    auto parsed = Store::parse_manifest(bad);   // the same bytes, checked without a store
    if (parsed.ok()) CHECK(parsed->key != f.key);
  }
  // Every layer is exercised: the structure, and the key recomputed from the content.
  CHECK(refused > 0);
  CHECK(by_verifier > 0);
  CHECK(by_key > 0);
}

TEST_CASE("Corruption: the truncation message gives the sizes") {
  Fixture f;
  const std::string good = slurp(f.manifest);
  write_bytes(f.manifest, good.substr(0, good.size() - 10));
  auto e = open_store(f.dir / "cache").load(f.key);
  REQUIRE_FALSE(e.ok());
  CHECK_THAT(e.status().message(), Catch::Contains("truncated (" + std::to_string(good.size() - 10) + " of " +
                                                   std::to_string(good.size()) + " bytes)"));
}

TEST_CASE("Corruption: a manifest under another entry's name is refused, not served for that key") {
  Fixture f;
  Store s = open_store(f.dir / "cache");
  const CacheEntry other = small_entry(32);
  const EntryKey other_key = s.publish(other).value();
  const std::string h = other_key.hex();
  const std::string other_manifest = f.dir / "cache" + "/manifests/" + h.substr(0, 2) + "/" + h + ".kfm";
  fs::copy_file(f.manifest, other_manifest, fs::copy_options::overwrite_existing);
  auto e = s.load(other_key);
  REQUIRE_FALSE(e.ok());
  CHECK_THAT(e.status().message(), Catch::Contains("holds entry " + f.key.hex()));
  auto hit = s.lookup(other.signature, other.environment);
  REQUIRE(hit.ok());
  CHECK_FALSE(hit->has_value());
  CHECK(names_file(s.verify_all().value(), other_manifest));
}

TEST_CASE("Corruption: a deleted manifest is a miss, and its leftovers are reported under its name") {
  Fixture f;
  fs::remove(f.manifest);
  Store s = open_store(f.dir / "cache");
  CHECK(s.load(f.key).status().code() == StatusCode::kNotFound);
  auto hit = s.lookup(f.entry.signature, f.entry.environment);
  REQUIRE(hit.ok());
  CHECK_FALSE(hit->has_value());
  // Within the grace period the state file and use record look like a publish in progress (the
  // manifest comes last); past it they are reported, under the name of the missing manifest.
  StoreOptions no_grace;
  no_grace.gc_grace_ms = 0;
  auto problems = open_store(f.dir / "cache", no_grace).verify_all();
  REQUIRE(problems.ok());
  CHECK(names_file(*problems, f.manifest));
  CHECK_THAT(describe(*problems), Catch::Contains("manifest missing"));
}

TEST_CASE("Corruption: a blob flipped at any position, truncated, extended or deleted fails read_blob") {
  Fixture f;
  const std::string good = slurp(f.blob);
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (pos % 8)));
    write_bytes(f.blob, bad);
    f.expect_bad_blob("byte " + std::to_string(pos) + " flipped");
  }
  for (size_t len : {size_t{0}, size_t{1}, good.size() / 2, good.size() - 1}) {
    write_bytes(f.blob, good.substr(0, len));
    f.expect_bad_blob("truncated to " + std::to_string(len));
  }
  write_bytes(f.blob, good + "!");
  f.expect_bad_blob("one byte appended");
  fs::remove(f.blob);
  f.expect_bad_blob("deleted");
  write_bytes(f.blob, good);
  CHECK(open_store(f.dir / "cache").verify_all().value().empty());
}

TEST_CASE("Corruption: a damaged state file makes the entry unusable and never re-enables a quarantine") {
  Fixture f;
  REQUIRE(open_store(f.dir / "cache").set_state(f.key, EntryState::kQuarantined, "shadow mismatch").ok());
  const std::string good = slurp(f.state);
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (pos % 8)));
    write_bytes(f.state, bad);
    f.expect_bad_state("byte " + std::to_string(pos) + " flipped");
  }
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(f.state, good.substr(0, len));
    f.expect_bad_state("truncated to " + std::to_string(len));
  }
  fs::remove(f.state);
  f.expect_bad_state("deleted");
  // Restored, the quarantine is back and nothing else is wrong.
  write_bytes(f.state, good);
  Store s = open_store(f.dir / "cache");
  auto e = s.load(f.key);
  REQUIRE(e.ok());
  CHECK(e->status.state == EntryState::kQuarantined);
  CHECK(s.verify_all().value().empty());
}

TEST_CASE("Corruption: another entry's state file does not apply to this one") {
  Fixture f;
  Store s = open_store(f.dir / "cache");
  const EntryKey other = s.publish(small_entry(48)).value();
  const std::string h = other.hex();
  const std::string other_state = f.dir / "cache" + "/state/" + h.substr(0, 2) + "/" + h + ".state";
  REQUIRE(s.set_state(f.key, EntryState::kQuarantined, "bad").ok());
  fs::copy_file(other_state, f.state, fs::copy_options::overwrite_existing);  // an active record
  auto e = s.load(f.key);
  REQUIRE(e.ok());
  CHECK_FALSE(e->status.usable());
  CHECK_THAT(e->status.reason, Catch::Contains("belongs to entry " + h));
  CHECK(names_file(s.verify_all().value(), f.state));
}

TEST_CASE("Corruption: a damaged or deleted use record is reported and costs only LRU information") {
  Fixture f;
  SECTION("deleted") {
    fs::remove(f.used);
    Store s = open_store(f.dir / "cache");
    auto hit = s.lookup(f.entry.signature, f.entry.environment);
    REQUIRE(hit.ok());
    REQUIRE(hit->has_value());
    CHECK((*hit)->status.usable());
    CHECK((*hit)->status.last_use_unix_ms == 0);
    CHECK(names_file(s.verify_all().value(), f.used));
    REQUIRE(s.touch(f.key).ok());  // recreates it
    CHECK(s.verify_all().value().empty());
  }
  SECTION("given content") {
    write_bytes(f.used, "garbage");
    Store s = open_store(f.dir / "cache");
    auto hit = s.lookup(f.entry.signature, f.entry.environment);
    REQUIRE(hit.ok());
    REQUIRE(hit->has_value());
    auto problems = s.verify_all().value();
    CHECK(names_file(problems, f.used));
    CHECK_THAT(describe(problems), Catch::Contains("should be empty"));
  }
  SECTION("replaced by a directory") {
    fs::remove(f.used);
    fs::create_directory(f.used);
    CHECK(names_file(open_store(f.dir / "cache").verify_all().value(), f.used));
  }
}

TEST_CASE("Corruption: a damaged or deleted VERSION stops every read and is named by verify_all") {
  Fixture f;
  const std::string good = slurp(f.version);
  // Either open refuses the cache (a VERSION that reads as another format), or it opens it for
  // verify_all only: every other call fails naming VERSION.
  auto expect_detected = [&](const std::string& damage) {
    INFO(damage);
    auto s = Store::open(f.dir / "cache");
    if (!s.ok()) {
      CHECK_THAT(s.status().message(), Catch::Contains(f.version) && Catch::Contains("kforge-cache 1"));
      return;
    }
    auto e = s->load(f.key);
    REQUIRE_FALSE(e.ok());
    CHECK_THAT(e.status().message(), Catch::Contains(f.version));
    auto hit = s->lookup(f.entry.signature, f.entry.environment);
    CHECK_FALSE(hit.ok());
    CHECK_FALSE(s->read_blob(f.blob_ref).ok());
    CHECK_FALSE(s->publish(small_entry(99)).ok());
    CHECK_FALSE(s->list().ok());
    auto problems = s->verify_all();
    REQUIRE(problems.ok());
    CHECK(names_file(*problems, f.version));
  };
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << bit));
      write_bytes(f.version, bad);
      expect_detected("bit " + std::to_string(bit) + " of byte " + std::to_string(pos) + " flipped");
    }
  }
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(f.version, good.substr(0, len));
    expect_detected("truncated to " + std::to_string(len));
  }
  fs::remove(f.version);
  expect_detected("deleted");
  write_bytes(f.version, good);
  CHECK(open_store(f.dir / "cache").verify_all().value().empty());
}

TEST_CASE("Corruption: lookup reports a corrupt entry once per key per Store") {
  Fixture f;
  std::string bad = slurp(f.manifest);
  bad[bad.size() - 1] ^= 1;
  write_bytes(f.manifest, bad);
  int calls = 0;
  Store s = open_store(f.dir / "cache");
  s.set_problem_callback([&](const CacheProblem& p) {
    ++calls;
    CHECK(p.path == f.manifest);
    CHECK_THAT(p.what, Catch::Contains("checksum mismatch"));
  });
  for (int i = 0; i < 3; ++i) {
    auto hit = s.lookup(f.entry.signature, f.entry.environment);
    REQUIRE(hit.ok());
    CHECK_FALSE(hit->has_value());
  }
  CHECK(calls == 1);
  Store copy = s;  // copies share the reported set
  CHECK_FALSE(copy.lookup(f.entry.signature, f.entry.environment).value().has_value());
  CHECK(calls == 1);
  Store other = open_store(f.dir / "cache");
  other.set_problem_callback([&](const CacheProblem&) { ++calls; });
  CHECK_FALSE(other.lookup(f.entry.signature, f.entry.environment).value().has_value());
  CHECK(calls == 2);
}

TEST_CASE("Corruption: unknown files are reported by name and left in place") {
  Fixture f;
  const std::vector<std::string> strays = {
      f.dir / "cache" + "/notes.txt",
      f.dir / "cache" + "/manifests/zz",
      f.dir / "cache" + "/manifests/" + f.key.hex().substr(0, 2) + "/backup.kfm",
      f.dir / "cache" + "/blobs/00/not-a-hash",
      f.dir / "cache" + "/state/" + f.key.hex().substr(0, 2) + "/" + f.key.hex() + ".state.orig",
  };
  fs::create_directories(f.dir / "cache" + "/blobs/00");
  for (const std::string& p : strays) write_bytes(p, "?");
  Store s = open_store(f.dir / "cache");
  auto problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->size() == strays.size());
  for (const std::string& p : strays) {
    CHECK(names_file(*problems, p));
    CHECK(fs::exists(p));
  }
  REQUIRE(s.gc(0).ok());  // gc deletes only what it knows to be its own
  for (const std::string& p : strays) CHECK(fs::exists(p));
}

TEST_CASE("trial markers: a cache that hooked processes used verifies clean, and every damaged marker is named") {
  TempDir t{"kforge-corrupt-test"};
  Store s = open_store(t / "cache");
  auto a = s.publish(small_entry(1));
  auto b = s.publish(small_entry(2));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // A trial in progress and one whose process died: both what the hook leaves, both healthy.
  REQUIRE(s.write_trial_marker(*a, 4242).ok());
  REQUIRE(s.write_trial_marker(*b, 99999999).ok());
  CHECK(slurp(t / "cache" + "/trial/" + a->hex()) == "4242\n");
  auto problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  auto markers = s.trial_markers();
  REQUIRE(markers.ok());
  REQUIRE(markers->size() == 2);

  // What an attacker (or a broken disk) could do to trial/.
  const std::string dir = t / "cache" + "/trial/";
  write_bytes(dir + b->hex(), "not a pid");
  write_bytes(dir + "0123456789abcdef0123456789abcdeg", "1\n");   // not a key
  fs::create_directory(dir + "0123456789abcdef0123456789abcdef");  // a directory where a marker goes
  fs::create_symlink("/etc/passwd", dir + "fedcba9876543210fedcba9876543210");
  problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(names_file(*problems, dir + b->hex()));
  CHECK(names_file(*problems, dir + "0123456789abcdef0123456789abcdeg"));
  CHECK(names_file(*problems, dir + "0123456789abcdef0123456789abcdef"));
  CHECK(names_file(*problems, dir + "fedcba9876543210fedcba9876543210"));
  CHECK_FALSE(names_file(*problems, dir + a->hex()));
  // Only well-formed markers are markers; the damaged ones stay for the user to see.
  markers = s.trial_markers();
  REQUIRE(markers.ok());
  REQUIRE(markers->size() == 1);
  CHECK((*markers)[0].key == *a);
  CHECK((*markers)[0].pid == 4242);

  // Removed and re-verified: clean again; gc drops the marker of an entry it removes.
  REQUIRE(s.remove_trial_marker(*b).ok());
  REQUIRE(s.remove_trial_marker(*b).ok());   // gone already: not an error
  fs::remove(dir + "0123456789abcdef0123456789abcdeg");
  fs::remove(dir + "0123456789abcdef0123456789abcdef");
  fs::remove(dir + "fedcba9876543210fedcba9876543210");
  problems = s.verify_all();
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  auto gc = s.gc(0);   // removes every unpinned entry
  REQUIRE(gc.ok());
  CHECK(gc->trial_markers_removed == 1);
  CHECK_FALSE(fs::exists(dir + a->hex()));
}

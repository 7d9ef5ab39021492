// Bundles (cache/bundle.h): how verified kernels travel from a staging cache to production. These
// tests pin down the promises production relies on: export -> import reproduces every manifest and
// blob byte for byte; a bundle that is damaged anywhere (every flipped byte, every truncation),
// signed by the wrong key, stripped of its signature, or internally inconsistent is refused with a
// message naming what was wrong, and the target cache is then byte-for-byte unchanged; key files
// are private and never leak into messages.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <msgpack.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cache/bundle.h"
#include "cache/store.h"

using namespace kforge;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kforge-bundle-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

TensorMeta contiguous(DType dt, std::vector<int64_t> sizes, DeviceType dev) {
  TensorMeta t;
  t.dtype = dt;
  t.device = dev;
  t.sizes = sizes;
  t.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) t.strides[d - 1] = t.strides[d] * sizes[d];
  return t;
}

Environment h200() {
  Environment e;
  e.backend = Backend::kCuda;
  e.arch = "sm_90";
  e.device_model = "NVIDIA H200";
  e.driver_version = 13000;
  e.nvrtc_version = 12080;
  e.torch_version = "2.9.0+cu130";
  return e;
}

Environment cpu() {
  Environment e;
  e.backend = Backend::kCpu;
  e.arch = "x86_64-avx2";
  e.device_model = "AMD EPYC 9654 96-Core Processor";
  e.compiler = "g++ 12.2.0";
  e.torch_version = "2.9.0+cpu";
  return e;
}

// A two-pass row softmax, as a template proposer would write it.
KernelSpec cuda_softmax_spec() {
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = "extern \"C\" __global__ void row_stats(...) {}\nextern \"C\" __global__ void normalize(...) {}\n";
  s.entry_points = {"row_stats", "normalize"};
  s.compile_options = {"--use_fast_math", "-DVEC=8"};
  s.plan.scratch = {{"row_max", "numel0 / size0_1 * 4"}, {"row_sum", "numel0 / size0_1 * 4"}};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch stats;
  stats.entry = "row_stats";
  stats.grid = {"numel0 / size0_1", "1", "1"};
  stats.block = {"min(1024, round_up(ceil_div(size0_1, 8), 32))", "1", "1"};
  stats.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::scratch(1),
                ArgBinding::size("size0_1", ValueType::kInt32)};
  Launch norm;
  norm.entry = "normalize";
  norm.grid = {"ceil_div(size0_1, 2048)", "numel0 / size0_1", "1"};
  norm.block = {"256", "1", "1"};
  norm.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::scratch(0), ArgBinding::scratch(1),
               ArgBinding::size("size0_1", ValueType::kInt32)};
  s.plan.launches = {stats, norm};
  return s;
}

KernelSpec cpu_spec() {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = "extern \"C\" void run(...) {}";
  s.entry_points = {"run"};
  Launch l;
  l.entry = "run";
  l.args = {ArgBinding::input(0)};
  s.plan.launches = {l};
  return s;
}

// Entry i: a softmax over a shape unique to i, on CUDA (even i) or CPU (odd i), with random
// artifacts of about `blob_bytes` (incompressible, like real cubins mostly are).
CacheEntry make_entry(int i, std::mt19937_64& rng, size_t blob_bytes) {
  const bool cuda = i % 2 == 0;
  const DeviceType dev = cuda ? DeviceType::kCuda : DeviceType::kCpu;
  CacheEntry e;
  e.signature = OpSignature{"aten::_softmax", "",
                            {Arg::tensor(contiguous(DType::kBFloat16, {64 * (i + 1), 1000 + i}, dev)),
                             Arg::integer(-1), Arg::boolean(false)},
                            cuda ? Target{Backend::kCuda, "sm_90"} : Target{Backend::kCpu, "x86_64-avx2"}};
  e.environment = cuda ? h200() : cpu();
  e.spec = cuda ? cuda_softmax_spec() : cpu_spec();
  if (cuda) {
    e.blobs.push_back({"cubin", random_bytes(rng, blob_bytes)});
    e.blobs.push_back({"ptx", "//\n// Generated by NVIDIA NVVM Compiler\n.version 8.8\n.target sm_90\n" +
                                  std::string(blob_bytes / 4, 'x')});
  } else {
    e.blobs.push_back({"so", random_bytes(rng, blob_bytes + static_cast<size_t>(i))});
  }
  e.verification = {16, 1.5e-3, 2e-4, 1.2e-3, 1.8e-4, true, "16 trials: normal, uniform, extremes; all passed"};
  e.timings = {1200.0 + i, 800.0, 0.012, 100};
  e.provenance = {"template:softmax_rowwise", "search-" + std::to_string(i), "0.1.0", 1760000000000 + i, "staging-1"};
  return e;
}

Store open_store(const std::string& root) {
  StoreOptions opts;
  opts.durable = false;   // these tests do not survive power loss; they check bytes
  StatusOr<Store> s = Store::open(root, opts);
  REQUIRE(s.ok());
  return std::move(s).value();
}

std::vector<EntryKey> publish_entries(Store& store, int first, int count, size_t blob_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<EntryKey> keys;
  for (int i = first; i < first + count; ++i) {
    StatusOr<EntryKey> k = store.publish(make_entry(i, rng, blob_bytes));
    INFO(k.status().to_string());
    REQUIRE(k.ok());
    keys.push_back(*k);
  }
  return keys;
}

// Every path under the cache with its type, mode, size, mtime and bytes: "unchanged" means this
// compares equal.
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& de : fs::recursive_directory_iterator(root)) {
    struct stat st {};
    REQUIRE(::lstat(de.path().c_str(), &st) == 0);
    std::string desc = std::to_string(st.st_mode) + " " + std::to_string(st.st_size) + " " +
                       std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
    if (S_ISREG(st.st_mode)) desc += "\n" + read_file(de.path().string());
    out[fs::relative(de.path(), root).string()] = desc;
  }
  return out;
}

// Checks that `target` holds `key` with exactly the manifest and blob bytes it has in `source`.
void require_same_entry(const Store& source, const Store& target, const EntryKey& key) {
  INFO("entry " << key.hex());
  StatusOr<std::string> a = source.read_manifest_bytes(key);
  StatusOr<std::string> b = target.read_manifest_bytes(key);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == *b);
  StatusOr<StoredEntry> sa = source.load(key);
  StatusOr<StoredEntry> sb = target.load(key);
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  REQUIRE(sa->blobs.size() == sb->blobs.size());
  for (size_t i = 0; i < sa->blobs.size(); ++i) {
    StatusOr<std::string> ba = source.read_blob(sa->blobs[i]);
    StatusOr<std::string> bb = target.read_blob(sb->blobs[i]);
    REQUIRE(ba.ok());
    REQUIRE(bb.ok());
    CHECK(*ba == *bb);
  }
}

SigningKey new_key() {
  StatusOr<SigningKey> k = SigningKey::generate();
  REQUIRE(k.ok());
  return *k;
}

ImportOptions trusting(const PublicKey& k) {
  ImportOptions o;
  o.trusted_key = k;
  return o;
}

// ---- the file format, written out independently (Note [Bundle format] in bundle.cc) ------------

constexpr size_t kHeader = 40;

std::string sha256_of(std::string_view data) {
  std::string h(32, '\0');
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(h.data()), reinterpret_cast<const unsigned char*>(data.data()),
                     data.size());
  return h;
}

void put_le(std::string& s, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// An unsigned bundle around an arbitrary msgpack payload, with a correct checksum: how the tests
// build bundles that export would never write. `declared` overrides the header's size field.
std::string frame_unsigned(const std::string& payload, uint32_t entries, std::optional<uint64_t> declared = {}) {
  std::string z(ZSTD_compressBound(payload.size()), '\0');
  size_t n = ZSTD_compress(z.data(), z.size(), payload.data(), payload.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(n));
  z.resize(n);
  std::string file("\x89KFB\r\n\x1a\n", 8);
  file.resize(kHeader, '\0');
  put_le(file, 8, 1, 4);
  put_le(file, 16, z.size(), 8);
  put_le(file, 24, declared.value_or(payload.size()), 8);
  put_le(file, 32, entries, 4);
  file += z;
  file += sha256_of(file);
  return file;
}

struct PayloadEntry {
  std::string manifest;
  std::vector<std::tuple<std::string, std::string, std::string>> blobs;   // name, sha256 (raw), bytes
};

std::string pack_payload(const std::vector<PayloadEntry>& entries) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(static_cast<uint32_t>(entries.size()));
  for (const PayloadEntry& e : entries) {
    pk.pack_array(2);
    pk.pack_bin(static_cast<uint32_t>(e.manifest.size()));
    pk.pack_bin_body(e.manifest.data(), static_cast<uint32_t>(e.manifest.size()));
    pk.pack_array(static_cast<uint32_t>(e.blobs.size()));
    for (const auto& [name, sha, bytes] : e.blobs) {
      pk.pack_array(3);
      pk.pack(name);
      pk.pack_bin(static_cast<uint32_t>(sha.size()));
      pk.pack_bin_body(sha.data(), static_cast<uint32_t>(sha.size()));
      pk.pack_bin(static_cast<uint32_t>(bytes.size()));
      pk.pack_bin_body(bytes.data(), static_cast<uint32_t>(bytes.size()));
    }
  }
  return std::string(buf.data(), buf.size());
}

// The entry with `key` as the payload would carry it, read straight from a store.
PayloadEntry payload_entry(const Store& store, const EntryKey& key) {
  PayloadEntry e;
  e.manifest = store.read_manifest_bytes(key).value();
  StoredEntry s = store.load(key).value();
  for (const BlobRef& ref : s.blobs) {
    std::string bytes = store.read_blob(ref).value();
    e.blobs.emplace_back(ref.name, sha256_of(bytes), bytes);
  }
  return e;
}

// A staging cache with entries, a production cache, and a place for bundles.
struct Caches {
  TempDir dir;
  Store staging = open_store(dir / "staging");
  Store production = open_store(dir / "production");
  std::string bundle = dir / "kernels.kfb";
};

}  // namespace

// ---- round trip ---------------------------------------------------------------------------------

TEST_CASE("Bundle: export -> import into an empty cache reproduces every entry byte for byte") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 6, 64 << 10, 1);
  // Two entries share one artifact (same bytes, content-addressed once in each cache).
  std::mt19937_64 rng(2);
  CacheEntry shared_a = make_entry(10, rng, 1000);
  CacheEntry shared_b = make_entry(12, rng, 1000);
  shared_b.blobs = shared_a.blobs;
  keys.push_back(c.staging.publish(shared_a).value());
  keys.push_back(c.staging.publish(shared_b).value());

  const bool sign = GENERATE(false, true);
  SigningKey key = new_key();
  StatusOr<ExportReport> ex = export_bundle(c.staging, {}, c.bundle, sign ? &key : nullptr);
  INFO(ex.status().to_string());
  REQUIRE(ex.ok());
  CHECK(ex->entries == keys.size());
  CHECK(ex->signed_bundle == sign);
  CHECK(ex->file_bytes == fs::file_size(c.bundle));

  ImportOptions opts;
  if (sign) opts.trusted_key = key.public_key;
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, opts);
  INFO(im.status().to_string());
  REQUIRE(im.ok());
  CHECK(im->entries_imported == keys.size());
  CHECK(im->entries_identical == 0);
  CHECK(im->signature_checked == sign);
  CHECK(im->signer_fingerprint == (sign ? key.public_key.fingerprint() : ""));

  auto listed = c.production.list();
  REQUIRE(listed.ok());
  CHECK(listed->size() == keys.size());
  for (const EntryKey& k : keys) require_same_entry(c.staging, c.production, k);
  // The imported entries are usable: lookup finds them by (signature, environment).
  std::mt19937_64 rng0(1);
  CacheEntry first = make_entry(0, rng0, 64 << 10);
  auto hit = c.production.lookup(first.signature, first.environment);
  REQUIRE(hit.ok());
  REQUIRE(hit->has_value());
  CHECK((*hit)->status.usable());
}

TEST_CASE("Bundle: export of chosen keys carries exactly those, and the same cache gives the same file") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 4, 4096, 3);
  StatusOr<ExportReport> ex = export_bundle(c.staging, {keys[1], keys[3], keys[1]}, c.bundle, nullptr);
  REQUIRE(ex.ok());
  CHECK(ex->entries == 2);   // the duplicate is ignored
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK(im->entries_imported == 2);
  auto listed = c.production.list().value();
  std::sort(listed.begin(), listed.end());
  std::vector<EntryKey> want = {keys[1], keys[3]};
  std::sort(want.begin(), want.end());
  CHECK(listed == want);

  // Unsigned exports of the same cache are identical files (sorted keys, deterministic zstd).
  std::string a = c.dir / "a.kfb", b = c.dir / "b.kfb";
  REQUIRE(export_bundle(c.staging, {}, a, nullptr).ok());
  REQUIRE(export_bundle(c.staging, {}, b, nullptr).ok());
  CHECK(read_file(a) == read_file(b));
}

TEST_CASE("Bundle: exporting a key the cache does not have fails and names the key") {
  Caches c;
  publish_entries(c.staging, 0, 1, 256, 4);
  EntryKey missing{0x1234, 0x5678};
  StatusOr<ExportReport> ex = export_bundle(c.staging, {missing}, c.bundle, nullptr);
  REQUIRE_FALSE(ex.ok());
  CHECK_THAT(ex.status().message(), Contains(missing.hex()));
  CHECK_FALSE(fs::exists(c.bundle));
}

TEST_CASE("Bundle: an empty cache exports a bundle that imports as nothing") {
  Caches c;
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK(im->entries_imported == 0);
  CHECK(c.production.list().value().empty());
}

// ---- import into a cache that already has entries -----------------------------------------------

TEST_CASE("Bundle: import into a cache that already holds some entries adds only the new ones") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 5, 2048, 5);
  // Production already got entries 0 and 1 from an earlier bundle, and has one of its own.
  std::string first = c.dir / "first.kfb";
  REQUIRE(export_bundle(c.staging, {keys[0], keys[1]}, first, nullptr).ok());
  REQUIRE(import_bundle(c.production, first, {}).ok());
  std::vector<EntryKey> own = publish_entries(c.production, 20, 1, 512, 6);
  // An entry quarantined in production stays quarantined: import never touches state.
  REQUIRE(c.production.set_state(keys[0], EntryState::kQuarantined, "shadow phase: wrong values").ok());

  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  INFO(im.status().to_string());
  REQUIRE(im.ok());
  CHECK(im->entries_identical == 2);
  CHECK(im->entries_imported == 3);
  for (const EntryKey& k : keys) require_same_entry(c.staging, c.production, k);
  CHECK(c.production.load(own[0]).ok());
  CHECK(c.production.list().value().size() == 6);
  CHECK(c.production.load(keys[0]).value().status.state == EntryState::kQuarantined);

  // Importing the same bundle again changes nothing.
  auto before = snapshot(c.production.root());
  im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK(im->entries_identical == 5);
  CHECK(im->entries_imported == 0);
  CHECK(snapshot(c.production.root()) == before);
}

TEST_CASE("Bundle: an entry present with a missing blob is repaired by import") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 1, 2048, 7);
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  REQUIRE(import_bundle(c.production, c.bundle, {}).ok());
  StoredEntry e = c.production.load(keys[0]).value();
  const std::string& sha = e.blobs[0].sha256_hex;
  fs::remove(fs::path(c.production.root()) / "blobs" / sha.substr(0, 2) / sha);
  REQUIRE_FALSE(c.production.read_blob(e.blobs[0]).ok());

  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK(im->entries_imported == 1);
  CHECK(im->entries_identical == 0);
  require_same_entry(c.staging, c.production, keys[0]);
}

// ---- damage -------------------------------------------------------------------------------------

TEST_CASE("Bundle: every single flipped byte of a small bundle is refused and the target is unchanged") {
  Caches c;
  publish_entries(c.staging, 0, 2, 48, 8);
  publish_entries(c.production, 30, 1, 64, 9);   // the target is not empty
  const bool sign = GENERATE(false, true);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, sign ? &key : nullptr).ok());
  const std::string good = read_file(c.bundle);
  INFO("bundle of " << good.size() << " bytes, signed=" << sign);
  REQUIRE(good.size() < 16384);   // small enough to try every position

  const auto before = snapshot(c.production.root());
  const std::string damaged = c.dir / "damaged.kfb";
  size_t refused = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    // Vary the flip: one bit, all bits, and a low bit, so no field survives by luck.
    static constexpr uint8_t kFlips[] = {0x01, 0xff, 0x80, 0x10};
    bad[pos] = static_cast<char>(static_cast<uint8_t>(bad[pos]) ^ kFlips[pos % 4]);
    write_file(damaged, bad);
    ImportOptions opts;
    if (sign && pos % 2 == 0) opts.trusted_key = key.public_key;
    StatusOr<ImportReport> im = import_bundle(c.production, damaged, opts);
    if (!im.ok()) {
      ++refused;
      if (refused % 97 == 1) CHECK_THAT(im.status().message(), Contains("bundle " + damaged + ": "));
    } else {
      FAIL("flipping byte " << pos << " was not detected");
    }
  }
  CHECK(refused == good.size());
  CHECK(snapshot(c.production.root()) == before);
  // The undamaged bundle still imports: the refusals were about the damage.
  CHECK(import_bundle(c.production, c.bundle, sign ? trusting(key.public_key) : ImportOptions{}).ok());
}

TEST_CASE("Bundle: flipped bytes across a larger bundle are refused (dense sample)") {
  Caches c;
  publish_entries(c.staging, 0, 4, 96 << 10, 10);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, &key).ok());
  const std::string good = read_file(c.bundle);
  const auto before = snapshot(c.production.root());
  const std::string damaged = c.dir / "damaged.kfb";

  // Every byte of the header and trailer, plus a stride through the payload.
  std::vector<size_t> positions;
  for (size_t p = 0; p < 256; ++p) positions.push_back(p);
  for (size_t p = good.size() - 256; p < good.size(); ++p) positions.push_back(p);
  for (size_t p = 256; p < good.size() - 256; p += 997) positions.push_back(p);
  for (size_t pos : positions) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x04);
    write_file(damaged, bad);
    if (import_bundle(c.production, damaged, trusting(key.public_key)).ok()) {
      FAIL("flipping byte " << pos << " was not detected");
    }
  }
  CHECK(snapshot(c.production.root()) == before);
}

TEST_CASE("Bundle: a bundle truncated at any length is refused and the target is unchanged") {
  Caches c;
  publish_entries(c.staging, 0, 2, 48, 11);
  publish_entries(c.production, 30, 1, 64, 12);
  const bool sign = GENERATE(false, true);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, sign ? &key : nullptr).ok());
  const std::string good = read_file(c.bundle);
  const auto before = snapshot(c.production.root());
  const std::string cut = c.dir / "cut.kfb";
  for (size_t len = 0; len < good.size(); ++len) {
    write_file(cut, std::string_view(good).substr(0, len));
    StatusOr<ImportReport> im = import_bundle(c.production, cut, {});
    if (im.ok()) FAIL("truncation to " << len << " bytes was not detected");
    if (len == 0 || len == good.size() - 1) CHECK_THAT(im.status().message(), Contains("truncated"));
  }
  CHECK(snapshot(c.production.root()) == before);
  // Bytes appended are refused too.
  write_file(cut, good + std::string(1, '\0'));
  StatusOr<ImportReport> im = import_bundle(c.production, cut, {});
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("1 unexpected bytes after the end of the bundle"));
}

TEST_CASE("Bundle: a corrupted payload is reported as a checksum mismatch naming the file") {
  Caches c;
  publish_entries(c.staging, 0, 1, 1024, 13);
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  std::string bytes = read_file(c.bundle);
  bytes[kHeader + 10] = static_cast<char>(bytes[kHeader + 10] ^ 0x20);
  write_file(c.bundle, bytes);
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE_FALSE(im.ok());
  CHECK(im.status().message() ==
        "bundle " + c.bundle + ": payload checksum mismatch (file corrupted or truncated)");
}

TEST_CASE("Bundle: files that are not bundles are refused with a reason") {
  Caches c;
  write_file(c.bundle, "kforge-ed25519-public 00\n and then some more text to pass the size checks......");
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("not a kforge bundle (bad magic)"));

  im = import_bundle(c.production, c.dir / "nowhere.kfb", {});
  REQUIRE_FALSE(im.ok());
  CHECK(im.status().code() == StatusCode::kNotFound);
  CHECK_THAT(im.status().message(), Contains("nowhere.kfb"));

  im = import_bundle(c.production, c.dir.path.string(), {});
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("not a regular file"));
}

// ---- signatures ---------------------------------------------------------------------------------

TEST_CASE("Bundle: signed with the trusted key is accepted, by another key it is refused") {
  Caches c;
  publish_entries(c.staging, 0, 2, 512, 14);
  SigningKey staging_key = new_key();
  SigningKey other_key = new_key();
  const auto before = snapshot(c.production.root());

  REQUIRE(export_bundle(c.staging, {}, c.bundle, &other_key).ok());
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, trusting(staging_key.public_key));
  REQUIRE_FALSE(im.ok());
  CHECK(im.status().message() == "bundle " + c.bundle + ": signed by key " + other_key.public_key.fingerprint() +
                                     " but the trusted key is " + staging_key.public_key.fingerprint());
  CHECK(snapshot(c.production.root()) == before);

  REQUIRE(export_bundle(c.staging, {}, c.bundle, &staging_key).ok());
  im = import_bundle(c.production, c.bundle, trusting(staging_key.public_key));
  INFO(im.status().to_string());
  REQUIRE(im.ok());
  CHECK(im->signature_checked);
  CHECK(im->signer_fingerprint == staging_key.public_key.fingerprint());
  CHECK(im->entries_imported == 2);
}

TEST_CASE("Bundle: an unsigned bundle is refused when a trusted key is given") {
  Caches c;
  publish_entries(c.staging, 0, 1, 512, 15);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, trusting(key.public_key));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("unsigned bundle, but a trusted key was given"));
  CHECK(c.production.list().value().empty());
}

TEST_CASE("Bundle: stripping the signature and fixing the checksum does not get past a trusted key") {
  Caches c;
  publish_entries(c.staging, 0, 1, 512, 16);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, &key).ok());
  std::string signed_bytes = read_file(c.bundle);
  // What an attacker can do without the key: clear the flag, drop the signature block, rehash.
  std::string stripped = signed_bytes.substr(0, signed_bytes.size() - 96 - 32);
  put_le(stripped, 12, 0, 4);
  stripped += sha256_of(stripped);
  write_file(c.bundle, stripped);
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, trusting(key.public_key));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("unsigned bundle"));
  // Without a trusted key it is just an unsigned bundle: the signature was integrity, not policy.
  im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK_FALSE(im->signature_checked);
}

TEST_CASE("Bundle: a signed bundle without a trusted key imports, naming the signer but not vouching for it") {
  Caches c;
  publish_entries(c.staging, 0, 1, 512, 17);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, &key).ok());
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
  REQUIRE(im.ok());
  CHECK_FALSE(im->signature_checked);   // no trusted key: integrity, not origin
  CHECK(im->signer_fingerprint == key.public_key.fingerprint());
  // Even without a trusted key, a signature that does not verify is refused.
  std::string bytes = read_file(c.bundle);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x01);
  write_file(c.bundle, bytes);
  im = import_bundle(c.production, c.bundle, {});
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("signature by key " + key.public_key.fingerprint() + " does not verify"));
}

TEST_CASE("Bundle: require_signature without a trusted key refuses every bundle") {
  Caches c;
  publish_entries(c.staging, 0, 1, 512, 18);
  SigningKey key = new_key();
  REQUIRE(export_bundle(c.staging, {}, c.bundle, &key).ok());
  ImportOptions opts;
  opts.require_signature = true;
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, opts);
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("no trusted key"));
  opts.trusted_key = key.public_key;
  CHECK(import_bundle(c.production, c.bundle, opts).ok());
}

// ---- payloads export would never write ----------------------------------------------------------

TEST_CASE("Bundle: a well-framed payload that breaks the entry rules is refused, target unchanged") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 2, 700, 19);
  const PayloadEntry e0 = payload_entry(c.staging, keys[0]);
  const PayloadEntry e1 = payload_entry(c.staging, keys[1]);
  const auto before = snapshot(c.production.root());

  auto refused_with = [&](const std::vector<PayloadEntry>& entries, const std::string& what) {
    std::string bundle = frame_unsigned(pack_payload(entries), static_cast<uint32_t>(entries.size()));
    write_file(c.bundle, bundle);
    StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
    INFO("expected: " << what);
    REQUIRE_FALSE(im.ok());
    CHECK_THAT(im.status().message(), Contains(what));
    CHECK(snapshot(c.production.root()) == before);
  };

  // The framing itself is right: the unchanged entries import (into a scratch cache).
  {
    Store scratch = open_store(c.dir / "scratch");
    write_file(c.bundle, frame_unsigned(pack_payload({e0, e1}), 2));
    StatusOr<ImportReport> im = import_bundle(scratch, c.bundle, {});
    INFO(im.status().to_string());
    REQUIRE(im.ok());
    CHECK(im->entries_imported == 2);
  }

  SECTION("a manifest references a blob the bundle does not carry") {
    PayloadEntry e = e0;
    e.blobs.pop_back();
    refused_with({e, e1}, "which the bundle does not carry");
  }
  SECTION("a blob's bytes do not match its hash") {
    PayloadEntry e = e0;
    std::get<2>(e.blobs[0])[5] ^= 1;
    refused_with({e1, e}, "does not match its SHA-256");
  }
  SECTION("a blob matches its own hash but not the manifest's") {
    PayloadEntry e = e1;
    std::string& bytes = std::get<2>(e.blobs[0]);
    bytes[0] ^= 1;
    std::get<1>(e.blobs[0]) = sha256_of(bytes);
    refused_with({e0, e}, "which the bundle does not carry");
  }
  SECTION("an extra blob the manifest does not reference") {
    PayloadEntry e = e0;
    e.blobs.emplace_back("extra", sha256_of("hello"), "hello");
    refused_with({e, e1}, "that the manifest does not reference");
  }
  SECTION("the same key twice") {
    refused_with({e0, e1, e0}, "carries this key twice");
  }
  SECTION("a manifest that is not a manifest") {
    PayloadEntry e = e1;
    e.manifest[e.manifest.size() / 2] ^= 0x40;
    refused_with({e0, e}, "entry 1: manifest: ");
  }
  SECTION("an entry that is not [manifest, blobs]") {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_array(1);
    pk.pack_array(1);
    pk.pack(std::string("x"));
    write_file(c.bundle, frame_unsigned(std::string(buf.data(), buf.size()), 1));
    StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, {});
    REQUIRE_FALSE(im.ok());
    CHECK_THAT(im.status().message(), Contains("payload[0]: expected 2 elements, got 1"));
  }
}

TEST_CASE("Bundle: the header's sizes and counts must match the payload, checksum or not") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 1, 300, 20);
  const std::string payload = pack_payload({payload_entry(c.staging, keys[0])});
  auto import_bytes = [&](const std::string& bytes) {
    write_file(c.bundle, bytes);
    return import_bundle(c.production, c.bundle, {});
  };

  auto im = import_bytes(frame_unsigned(payload, 1, payload.size() - 1));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("decompresses to more than the"));
  im = import_bytes(frame_unsigned(payload, 1, payload.size() + 1));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("but the header declares"));
  // A lying header asking for the whole limit costs nothing: it is refused by what the frame holds.
  im = import_bytes(frame_unsigned(payload, 1, uint64_t{4} << 30));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("but the header declares 4294967296"));
  im = import_bytes(frame_unsigned(payload, 1, (uint64_t{4} << 30) + 1));
  REQUIRE_FALSE(im.ok());
  CHECK(im.status().code() == StatusCode::kOutOfRange);
  CHECK_THAT(im.status().message(), Contains("more than the limit of 4294967296"));
  im = import_bytes(frame_unsigned(payload, 2));
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("payload has 1 entries, but the header declares 2"));

  std::string future = frame_unsigned(payload, 1);
  put_le(future, 8, 2, 4);
  future.resize(future.size() - 32);
  future += sha256_of(future);
  im = import_bytes(future);
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("bundle format version 2 is newer than this kforge reads"));

  CHECK(c.production.list().value().empty());
}

TEST_CASE("Bundle: limits refuse big payloads before decompressing them") {
  Caches c;
  publish_entries(c.staging, 0, 3, 8192, 21);
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  ImportOptions opts;
  opts.limits.max_payload_bytes = 4096;
  StatusOr<ImportReport> im = import_bundle(c.production, c.bundle, opts);
  REQUIRE_FALSE(im.ok());
  CHECK(im.status().code() == StatusCode::kOutOfRange);
  CHECK_THAT(im.status().message(), Contains("more than the limit of 4096"));

  opts = {};
  opts.limits.max_entries = 2;
  im = import_bundle(c.production, c.bundle, opts);
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("3 entries, more than the limit of 2"));

  opts = {};
  opts.limits.max_blob_bytes = 1000;
  im = import_bundle(c.production, c.bundle, opts);
  REQUIRE_FALSE(im.ok());
  CHECK_THAT(im.status().message(), Contains("bytes exceeds 1000"));

  CHECK(c.production.list().value().empty());
  CHECK(import_bundle(c.production, c.bundle, {}).ok());
}

TEST_CASE("Bundle: parse_bundle_bytes checks a bundle in memory without a store") {
  Caches c;
  std::vector<EntryKey> keys = publish_entries(c.staging, 0, 2, 256, 22);
  REQUIRE(export_bundle(c.staging, {}, c.bundle, nullptr).ok());
  StatusOr<ParsedBundle> p = parse_bundle_bytes(read_file(c.bundle), "mem", {});
  REQUIRE(p.ok());
  REQUIRE(p->entries.size() == 2);
  CHECK_FALSE(p->signer.has_value());
  for (const BundleEntry& e : p->entries) {
    CHECK(e.manifest == c.staging.read_manifest_bytes(e.entry.key).value());
    REQUIRE(e.blobs.size() == e.entry.blobs.size());
    for (size_t i = 0; i < e.blobs.size(); ++i) {
      CHECK(e.blobs[i].name == e.entry.blobs[i].name);
      CHECK(e.blobs[i].bytes == c.staging.read_blob(e.entry.blobs[i]).value());
    }
  }
  StatusOr<ParsedBundle> bad = parse_bundle_bytes("", "mem", {});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "bundle mem: truncated (0 bytes; a bundle is at least 72)");
}

// ---- key files ----------------------------------------------------------------------------------

TEST_CASE("Keys: a saved key pair loads back identical and the secret file is mode 0600") {
  TempDir dir;
  SigningKey key = new_key();
  REQUIRE(key.save(dir / "staging.key").ok());
  REQUIRE(key.public_key.save(dir / "staging.pub").ok());
  struct stat st {};
  REQUIRE(::stat((dir / "staging.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);

  StatusOr<SigningKey> back = SigningKey::load(dir / "staging.key");
  REQUIRE(back.ok());
  CHECK(back->secret == key.secret);
  CHECK(back->public_key == key.public_key);
  StatusOr<PublicKey> pub = PublicKey::load(dir / "staging.pub");
  REQUIRE(pub.ok());
  CHECK(*pub == key.public_key);

  std::string text = read_file(dir / "staging.pub");
  CHECK(text.rfind("kforge-ed25519-public ", 0) == 0);
  CHECK(text.size() == 22 + 64 + 1);
  CHECK(text.back() == '\n');
  CHECK(key.public_key.fingerprint().size() == 16);
  // No temp files left beside the keys.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 2);
}

TEST_CASE("Keys: saving never overwrites an existing key file") {
  TempDir dir;
  SigningKey a = new_key(), b = new_key();
  REQUIRE(a.save(dir / "k").ok());
  REQUIRE(a.public_key.save(dir / "k.pub").ok());
  const std::string secret_before = read_file(dir / "k"), pub_before = read_file(dir / "k.pub");
  Status s = b.save(dir / "k");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Contains("already exists; refusing to overwrite"));
  s = b.public_key.save(dir / "k.pub");
  REQUIRE_FALSE(s.ok());
  CHECK(read_file(dir / "k") == secret_before);
  CHECK(read_file(dir / "k.pub") == pub_before);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 2);
}

TEST_CASE("Keys: a secret key readable by group or others is refused, and the secret never leaks") {
  TempDir dir;
  SigningKey key = new_key();
  REQUIRE(key.save(dir / "k").ok());
  const std::string file = read_file(dir / "k");
  const std::string secret_hex = file.substr(22, 128);
  for (mode_t mode : {0640, 0604, 0644, 0660, 0700, 0666}) {
    REQUIRE(::chmod((dir / "k").c_str(), mode) == 0);
    StatusOr<SigningKey> k = SigningKey::load(dir / "k");
    REQUIRE_FALSE(k.ok());
    char want[8];
    std::snprintf(want, sizeof want, "%04o", static_cast<unsigned>(mode));
    CHECK_THAT(k.status().message(), Contains(std::string("has mode ") + want) && Contains("chmod 600"));
    CHECK_THAT(k.status().message(), !Contains(secret_hex.substr(0, 16)));
  }
  REQUIRE(::chmod((dir / "k").c_str(), 0400) == 0);   // narrower is fine
  CHECK(SigningKey::load(dir / "k").ok());
}

TEST_CASE("Keys: damaged or malformed key files are refused without echoing their content") {
  TempDir dir;
  SigningKey key = new_key();
  REQUIRE(key.save(dir / "k").ok());
  std::string file = read_file(dir / "k");
  const std::string secret_hex = file.substr(22, 128);

  auto write_secret = [&](const std::string& text) {
    fs::remove(dir / "s");
    write_file(dir / "s", text);
    REQUIRE(::chmod((dir / "s").c_str(), 0600) == 0);
    return SigningKey::load(dir / "s");
  };
  // Public half (the last 64 hex digits) no longer matches the seed.
  std::string damaged = file;
  damaged[22 + 127] = damaged[22 + 127] == '0' ? '1' : '0';
  StatusOr<SigningKey> k = write_secret(damaged);
  REQUIRE_FALSE(k.ok());
  CHECK_THAT(k.status().message(), Contains("damaged"));
  CHECK_THAT(k.status().message(), !Contains(secret_hex.substr(0, 16)));

  for (const std::string& text :
       {file.substr(0, file.size() - 3) + "\n", file.substr(0, 22) + "zz" + file.substr(24), "kforge-ed25519-public " +
        secret_hex + "\n", file + "extra\n", std::string()}) {
    k = write_secret(text);
    REQUIRE_FALSE(k.ok());
    CHECK_THAT(k.status().message(), Contains("expected one line 'kforge-ed25519-secret <128 hex digits>'"));
    CHECK_THAT(k.status().message(), !Contains(secret_hex.substr(0, 16)));
  }

  // A symlink to a good key is refused: a planted link must not choose the signing key.
  REQUIRE(::chmod((dir / "k").c_str(), 0600) == 0);
  fs::create_symlink(dir / "k", dir / "link");
  k = SigningKey::load(dir / "link");
  REQUIRE_FALSE(k.ok());
  CHECK_THAT(k.status().message(), Contains("symbolic link"));

  // Public keys: malformed text, and 32 bytes that are not a curve point.
  write_file(dir / "p", "kforge-ed25519-public 1234\n");
  StatusOr<PublicKey> p = PublicKey::load(dir / "p");
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(), Contains("expected one line 'kforge-ed25519-public <64 hex digits>'"));
  fs::remove(dir / "p");
  write_file(dir / "p", "kforge-ed25519-public " + std::string(64, '0') + "\n");
  p = PublicKey::load(dir / "p");
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(), Contains("not a valid Ed25519 public key"));
  p = PublicKey::load(dir / "absent.pub");
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() == StatusCode::kNotFound);
}

// Internal to cache/: what the store's source files share. store.cc holds the Store's operations
// and Note [Cache layout]; store_format.cc the checksummed frame and the manifest and state codecs;
// store_files.cc the layout's files (side files, blobs, manifests, VERSION); store_maintenance.cc
// verify_all and gc. Not a public interface: the rest of kforge uses store.h.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include <flatbuffers/flatbuffers.h>

#include "cache/cache_dir.h"
#include "cache/manifest_generated.h"
#include "runtime/msgpack_codec.h"
#include "runtime/unique_fd.h"

#include "cache/store.h"
#include "runtime/file_io.h"

namespace kforge {

struct StoreShared {
  // Set once at open when VERSION is missing or corrupt in a cache that has entries; every
  // operation except verify_all then fails with it.
  Status version_error;
  std::mutex mu;
  std::set<EntryKey> reported;                        // guarded by mu
  std::function<void(const CacheProblem&)> callback;  // guarded by mu; empty = stderr
};

namespace store_detail {

using file_io::ensure_dir;
using file_io::exists;
using file_io::fsync_dir;
using file_io::get_le;
using file_io::io_error;
using file_io::list_names;
using file_io::parent_of;
using file_io::put_u32;
using file_io::put_u64;
using file_io::read_file;
using file_io::write_all;

constexpr std::string_view kVersionText = "kforge-cache 1\n";
constexpr std::string_view kVersionPrefix = "kforge-cache ";
constexpr uint32_t kManifestFormatVersion = 1;
constexpr uint32_t kStateFormatVersion = 1;
constexpr size_t kFrameHeaderBytes = 56;
static_assert(kFrameHeaderBytes % 8 == 0, "the payload must stay 8-byte aligned for FlatBuffers");
constexpr std::string_view kManifestMagic{"kforgeMF", 8};
constexpr std::string_view kStateMagic{"kforgeST", 8};
constexpr size_t kMaxManifestPayload = 16u << 20;  // a kernel's source alone may be 1 MiB
constexpr size_t kMaxStatePayload = 16u << 10;
constexpr size_t kMaxReasonBytes = 4096;
constexpr uint64_t kMaxBlobBytes = uint64_t{1} << 32;
constexpr size_t kMaxBlobs = 64;
constexpr size_t kMaxBlobNameBytes = 64;
constexpr size_t kMinPrefixDigits = 4;
constexpr size_t kSha256Bytes = crypto_hash_sha256_BYTES;
constexpr std::string_view kManifestSuffix = ".kfm";
constexpr std::string_view kStateSuffix = ".state";
constexpr uint64_t kMaxTrialMarkerBytes = 16;
constexpr uint64_t kMaxNoWinRecordBytes = 64;

// ---- small helpers ----------------------------------------------------------------------------------

int64_t now_ms();
int64_t ms_of(const struct timespec& t);
// When a file was last written (or touched, for blobs): the age that the grace period measures.
// Use records keep the last use in their mtime (0 = never), so for them it is the ctime, which
// creation and utimensat set. Not the ctime of the others: a state file is installed by link(),
// and unlinking a second link left by a killed writer would make the survivor look new.
int64_t written_ms(const struct stat& st, bool use_record = false);
bool is_lower_hex(std::string_view s);
std::string sha256_hex(std::string_view bytes);
// Printable excerpt of untrusted bytes for an error message.
std::string excerpt(std::string_view s);
Status corrupt(const std::string& kind_and_path, std::string_view what);

// Runs a public operation so that nothing throws out of the store (std::bad_alloc from a builder
// or a container is the realistic case).
template <typename F>
auto guarded(std::string_view op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return internal_error("cache " + std::string(op) + ": " + e.what());
  } catch (...) {
    return internal_error("cache " + std::string(op) + ": unknown exception");
  }
}

// Unlinks a temporary file unless it was installed (or handed over).
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)) {}
  TmpFile(TmpFile&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  TmpFile& operator=(TmpFile&&) = delete;
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;
  ~TmpFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const noexcept { return path_; }
  void release() noexcept { path_.clear(); }

 private:
  std::string path_;
};

// ---- the layout ------------------------------------------------------------------------------------

struct Layout {
  const std::string& root;
  bool durable;

  std::string tmp_dir() const { return root + "/tmp"; }
  std::string manifest_dir(const std::string& hex) const { return root + "/manifests/" + hex.substr(0, 2); }
  std::string manifest(const EntryKey& k) const {
    std::string h = k.hex();
    return manifest_dir(h) + "/" + h + std::string(kManifestSuffix);
  }
  std::string state_dir(const std::string& hex) const { return root + "/state/" + hex.substr(0, 2); }
  std::string state(const EntryKey& k) const {
    std::string h = k.hex();
    return state_dir(h) + "/" + h + std::string(kStateSuffix);
  }
  std::string used_dir(const std::string& hex) const { return root + "/used/" + hex.substr(0, 2); }
  std::string used(const EntryKey& k) const {
    std::string h = k.hex();
    return used_dir(h) + "/" + h;
  }
  std::string trial_dir() const { return root + "/trial"; }
  std::string trial(const EntryKey& k) const { return trial_dir() + "/" + k.hex(); }
  std::string nowin_dir() const { return root + "/nowin"; }
  std::string nowin(const EntryKey& k, int32_t pid) const {
    return nowin_dir() + "/" + k.hex() + "." + std::to_string(pid);
  }
  std::string blob_dir(const std::string& sha) const { return root + "/blobs/" + sha.substr(0, 2); }
  std::string blob(const std::string& sha) const { return blob_dir(sha) + "/" + sha; }

  // A new file under tmp/ holding `bytes`, fsynced when durable. The name is unique across
  // processes (pid) and within one (random), so no writer ever opens another's file.
  StatusOr<TmpFile> write_tmp(std::string_view kind, std::string_view bytes) const {
    uint8_t rnd[8];
    randombytes_buf(rnd, sizeof rnd);
    const std::string path =
        tmp_dir() + "/" + std::string(kind) + "." + std::to_string(::getpid()) + "." + file_io::to_hex(rnd, sizeof rnd);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    UniqueFd fd(::open(path.c_str(), flags, 0600));
    if (!fd.valid() && errno == ENOENT) {  // tmp/ itself was removed: put it back
      KFORGE_RETURN_IF_ERROR(ensure_dir(tmp_dir(), durable));
      fd = UniqueFd(::open(path.c_str(), flags, 0600));
    }
    if (!fd.valid()) return io_error("cannot create", path, errno);
    TmpFile tmp(path);
    KFORGE_RETURN_IF_ERROR(write_all(fd.get(), bytes, path));
    if (durable && ::fsync(fd.get()) != 0) return io_error("cannot fsync", path, errno);
    return tmp;
  }

  // Gives a tmp file its final name, replacing what is there.
  Status install_replace(TmpFile& tmp, const std::string& final_path) const {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(final_path), durable));
    if (::rename(tmp.path().c_str(), final_path.c_str()) != 0) return io_error("cannot rename into", final_path, errno);
    tmp.release();
    return durable ? fsync_dir(parent_of(final_path)) : Status();
  }

  // Gives a tmp file its final name unless a file already has it (link fails on an existing name,
  // rename would not). Returns whether it was installed.
  StatusOr<bool> install_if_absent(TmpFile& tmp, const std::string& final_path) const {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(final_path), durable));
    if (::link(tmp.path().c_str(), final_path.c_str()) != 0) {
      if (errno == EEXIST) return false;
      return io_error("cannot link into", final_path, errno);
    }
    if (durable) KFORGE_RETURN_IF_ERROR(fsync_dir(parent_of(final_path)));
    return true;  // ~TmpFile unlinks the tmp name
  }
};

// "<32 hex>.kfm" in the fan-out directory of its first two digits -> key.
std::optional<EntryKey> key_from_name(std::string_view dir, std::string_view name, std::string_view suffix);
struct FanoutFile {
  std::string dir;    // the two-digit fan-out directory
  std::string name;   // the file's name in it
  std::string path;
};
// Every file in base's fan-out directories; names that do not belong there go to *strays.
StatusOr<std::vector<FanoutFile>> scan_fanout(const std::string& base, std::vector<std::string>* strays);

// ---- formats (store_format.cc) -----------------------------------------------------------------------

std::string frame(std::string_view magic, uint32_t version, std::string_view payload);
// A blob reference's name, hash and size within the format's limits, or an error naming `field`.
Status check_blob_ref(const std::string& field, std::string_view name, std::string_view sha, uint64_t size);
// The payload of a framed file, or what is wrong with it (without the file's name: callers add it).
StatusOr<std::string_view> unframe(std::string_view file, std::string_view magic, uint32_t version, size_t max_payload);
std::string encode_manifest(const CacheEntry& e, const std::vector<BlobRef>& refs);
StatusOr<StoredEntry> parse_manifest_impl(std::string_view file);
std::string encode_state(const EntryKey& key, const EntryStatus& s);
StatusOr<EntryStatus> decode_state(std::string_view file, const EntryKey& key);

// ---- the layout's files (store_files.cc) ----------------------------------------------------------------

// The status of an entry as its files say. Never fails: what cannot be read makes the entry
// disabled with a reason naming the file, so that corruption can only take a kernel out of use.
// *state_ok says whether the state file was read (gc keeps entries whose pin it cannot know).
EntryStatus read_status(const Layout& l, const EntryKey& key, bool* state_ok = nullptr);
Status write_state(const Layout& l, const EntryKey& key, const EntryStatus& s);
// Creates the entry's state file ("active") and use record ("never used") unless they exist.
Status ensure_side_files(const Layout& l, const EntryKey& key);
// A blob to install: bytes when the caller has them; without bytes the blob must be in the cache.
struct BlobToInstall {
  BlobRef ref;
  std::optional<std::string_view> bytes;
};
Status install_blob(const Layout& l, const BlobToInstall& b);
// Publishes a verified manifest (Note [Cache layout], "Publish order").
Status install_entry(const Layout& l, const EntryKey& key, std::string_view manifest,
                     const std::vector<BlobToInstall>& blobs);
// A manifest file and what it holds, after every check of Note [Cache layout]; errors name the file.
struct VerifiedManifest {
  std::string bytes;
  StoredEntry entry;
};
StatusOr<VerifiedManifest> read_manifest(const Layout& l, const EntryKey& key);
StatusOr<StoredEntry> load_entry(const Layout& l, const EntryKey& key);
Status remove_entry_files(const Layout& l, const EntryKey& key);
Status require_entry(const Layout& l, const EntryKey& key);
// Streams a file through SHA-256 (blobs can be large; verify_all does not keep them in memory).
StatusOr<std::string> sha256_of_file(const std::string& path);
// Checks VERSION, creating it in a cache that was never used. Returns an error for a cache of
// another format (open refuses it); a missing or damaged VERSION in a used cache goes to *damage
// instead, so that verify_all can still look at everything else.
Status check_version(const Layout& l, Status* damage);
void default_problem_report(const CacheProblem& p);
// A trial marker's pid, or why the file is not a marker ("pid\n", nothing else).
StatusOr<int32_t> parse_trial_marker(const std::string& path);
// A no-win record named `name` under nowin/ ("<key>.<pid>", holding "<pid> <entry ns> <pytorch
// ns>\n" with the same pid), or why the file is not one.
StatusOr<Store::NoWinRecord> parse_no_win_record(const std::string& dir, const std::string& name);
// Whether process `pid` exists (kill 0; EPERM: it exists but is another user's).
bool process_alive(int32_t pid);
// The shared state of a Store that opened: its VERSION's damage, or an error for a moved-from one.
Status opened(const std::shared_ptr<StoreShared>& shared);

}  // namespace store_detail
}  // namespace kforge

// Store: the on-disk kernel cache. The hand-off between search and serving, and what users ship
// from staging to production: it must never lose an entry and never load a wrong one.
//
//   StatusOr<Store> store = Store::open("/home/me/.cache/kforge");     // see cache_dir.h
//   StatusOr<EntryKey> key = store->publish(entry);                     // atomic
//   StatusOr<std::optional<StoredEntry>> hit = store->lookup(sig, env);
//   if (hit.ok() && *hit && (*hit)->status.usable()) {
//     StatusOr<std::string> cubin = store->read_blob((*hit)->blobs[0]);  // hash-checked
//   }
//
// Layout under the root (format in VERSION; Note [Cache layout] in store.cc):
//   VERSION                          "kforge-cache 1\n"
//   manifests/<k0k1>/<key>.kfm       immutable, checksummed FlatBuffers manifest per entry
//   blobs/<h0h1>/<sha256>            immutable content-addressed artifacts
//   state/<k0k1>/<key>.state         mutable EntryStatus (disable/quarantine/pin), replaced atomically
//   used/<k0k1>/<key>                empty file; its mtime is the entry's last use
//   trial/<key>                      "<pid>\n": that process runs the entry's shadow trial (Note
//                                    [Trial marker] in interposer/hook/swapper.h)
//   nowin/<key>.<pid>                "<pid> <entry ns> <pytorch ns>\n": the entry passed its trial in
//                                    that process but was not faster there (Note [In-process win]
//                                    in interposer/hook/swapper.h); gc removes it once pid is gone
//   tmp/                             writes in progress; gc removes what a killed writer left
//
// Promises:
// - Publish is one atomic step (blobs first, then the manifest by rename after fsync): readers
//   see a whole entry or none, never parts of two writers' work. Republishing the same key
//   replaces the entry atomically.
// - No locks anywhere: a writer killed at any point leaves at most files under tmp/, which block
//   nobody and which gc removes.
// - Every load verifies the manifest (length, SHA-256, FlatBuffers verifier, key recomputed from
//   its content) and read_blob verifies the blob's SHA-256. A bad entry is an error naming the
//   file and what is wrong; lookup reports it once per entry per Store and treats it as a miss.
// - A mismatch in any part of the environment is a miss (a different key).
// - A state file that cannot be read makes the entry unusable (disabled, reason says why): a
//   corrupt file must never re-enable a quarantined kernel.
// - Nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entry.h"
#include "runtime/status.h"

namespace kforge {

struct StoreOptions {
  // fsync files and directories on publish. Off only for benchmarks that fill large caches.
  bool durable = true;
  // Blobs and tmp files younger than this are never removed by gc (a concurrent publisher may be
  // about to reference them).
  int64_t gc_grace_ms = 3600 * 1000;
};

// One problem found by verify_all().
struct CacheProblem {
  std::string path;       // the bad file
  std::string what;       // "manifest checksum mismatch", "blob missing", "truncated (12 of 840 bytes)"
  std::optional<EntryKey> key;
};

struct GcReport {
  uint64_t bytes_before = 0, bytes_after = 0;
  std::vector<EntryKey> removed;          // entries removed, least recently used first
  uint64_t blobs_removed = 0, tmp_removed = 0;
  uint64_t trial_markers_removed = 0;     // of entries that are gone
  uint64_t no_win_records_removed = 0;    // of processes (or entries) that are gone
};

class Store {
 public:
  // Opens (creating if needed) a cache at `root`, which must pass CacheDir::open's checks. Writes
  // VERSION on first use; a VERSION from another format is an error naming both versions. A
  // VERSION that is missing or corrupt in a cache that has entries opens the cache for
  // verify_all() only: every other call fails with an error naming VERSION.
  static StatusOr<Store> open(const std::string& root, StoreOptions options = {});

  const std::string& root() const noexcept { return root_; }

  // Writes the entry's blobs and manifest and makes it visible atomically. The entry's status
  // starts active (an existing state file for the key is kept: a quarantined key stays so).
  StatusOr<EntryKey> publish(const CacheEntry& entry);

  // The entry for (sig, env), or nullopt on a miss. A corrupt entry is reported through the
  // problem callback once and returned as a miss.
  StatusOr<std::optional<StoredEntry>> lookup(const OpSignature& sig, const Environment& env) const;

  // The entry with this key; not-found if absent; an error naming the file if corrupt.
  StatusOr<StoredEntry> load(const EntryKey& key) const;

  // The blob's bytes after checking size and SHA-256.
  StatusOr<std::string> read_blob(const BlobRef& ref) const;

  // Every published entry's key (a directory scan; no manifest is read).
  StatusOr<std::vector<EntryKey>> list() const;

  // A key from a unique prefix of its hex form (at least 4 digits), like git. Ambiguous prefixes
  // are an error listing the candidates.
  StatusOr<EntryKey> resolve_prefix(std::string_view hex_prefix) const;

  Status remove(const EntryKey& key);

  // Disable / quarantine (with a reason) / re-enable. Quarantine is what the hook does after a
  // failed shadow phase; enable is the user's decision to trust the entry again.
  Status set_state(const EntryKey& key, EntryState state, std::string reason);
  Status set_pinned(const EntryKey& key, bool pinned);
  // Records a use now (for gc's LRU order). Cheap: one utimensat; never blocks on a lock.
  Status touch(const EntryKey& key) const;
  // The entry's status alone, cheaply: a stat of its manifest and a read of its small state file
  // (no manifest parse), for a process that has the entry in use and must notice a disable within
  // a round. not-found: the entry was removed. An unreadable state file reads as disabled, as in
  // load().
  StatusOr<EntryStatus> status(const EntryKey& key) const;

  // Trial markers (Note [Trial marker] in interposer/hook/swapper.h): trial/<key> names the
  // process whose shadow trial of the entry runs. Written atomically (tmp file, rename) and
  // durably; a marker left by a process that died is the evidence that its trial crashed it.
  struct TrialMarker {
    EntryKey key;
    int32_t pid = 0;
    std::string path;
  };
  Status write_trial_marker(const EntryKey& key, int32_t pid);
  // Removes the marker if present (a missing one is not an error).
  Status remove_trial_marker(const EntryKey& key);
  // Every well-formed marker; malformed files under trial/ are left for verify_all to name.
  StatusOr<std::vector<TrialMarker>> trial_markers() const;

  // No-win records (Note [In-process win] in interposer/hook/swapper.h): nowin/<key>.<pid> says
  // that the entry, correct in that process's trial, was not faster than PyTorch's kernel there,
  // with both medians. One small file per entry and process (rewritten, never appended), so the
  // directory is bounded by entries x live processes; gc removes the records of processes that are
  // gone and of entries that are gone.
  struct NoWinRecord {
    EntryKey key;
    int32_t pid = 0;
    uint64_t entry_ns = 0;     // the entry's median time in that process's trial
    uint64_t pytorch_ns = 0;   // PyTorch's kernel's median on the same calls
    std::string path;          // set by no_win_records()
  };
  Status write_no_win_record(const NoWinRecord& record);
  // Every well-formed record (of `key` only, if given); malformed files are left for verify_all.
  StatusOr<std::vector<NoWinRecord>> no_win_records(std::optional<EntryKey> key = std::nullopt) const;

  // Checks every manifest, blob, state file, trial marker, no-win record; lists each problem with its file. Files that may
  // belong to a write in progress (tmp/ files, and state files or use records whose manifest does
  // not exist yet) are reported only once they are older than gc_grace_ms; a missing manifest is
  // reported under its own path.
  StatusOr<std::vector<CacheProblem>> verify_all() const;

  // Removes least recently used unpinned entries until the cache (manifests + referenced blobs)
  // is at most max_bytes; then unreferenced blobs and abandoned tmp files past the grace period.
  // Pinned and quarantined entries are always kept (removing a quarantined entry would forget its
  // quarantine), and so are entries whose manifest or state file cannot be read (verify_all
  // reports them): the cap can then stay exceeded, as bytes_after shows. Trial markers of entries
  // that are gone go too, and no-win records of processes or entries that are gone.
  StatusOr<GcReport> gc(uint64_t max_bytes);

  // Raw manifest bytes and blobs, for export; and the inverse for import, which must produce
  // byte-identical files (used by bundle.h).
  StatusOr<std::string> read_manifest_bytes(const EntryKey& key) const;
  StatusOr<EntryKey> publish_manifest_bytes(std::string_view manifest, const std::vector<BlobData>& blobs);
  // Parses and fully verifies manifest bytes without touching the store.
  static StatusOr<StoredEntry> parse_manifest(std::string_view manifest);

  // Where corrupt entries found by lookup() are reported (default: one line on stderr per key).
  void set_problem_callback(std::function<void(const CacheProblem&)> cb);

 private:
  Store() = default;
  std::string root_;
  StoreOptions options_;
  std::shared_ptr<struct StoreShared> shared_;   // reported-once set, callback (thread-safe)
};

}  // namespace kforge

#include "cache/store.h"

#include "cache/store_internal.h"

// Note [Cache layout]
// ~~~~~~~~~~~~~~~~~~~
// Files under the root (store.h lists them) and the rules that make the store safe without locks:
//
// * Every file is written under tmp/ with a unique name (kind.pid.random), fsynced when
//   options.durable, and only then given its final name by rename (or link, where an existing
//   file must win). A writer killed at any point leaves only tmp/ files, unreferenced blobs and
//   the side files of an entry whose manifest never appeared (below). Nothing waits for anyone.
//
// * Checksummed frame. Manifests and state files start with a 56-byte header:
//     magic[8] | format version u32 | reserved u32 (0) | payload length u64 | SHA-256(payload)
//   (integers little-endian), followed by the payload: the FlatBuffer of cache/manifest.fbs, or the
//   msgpack state record. A flipped bit anywhere, in the header or the payload, and any truncation
//   or appended byte, fail the frame check before a parser sees the payload. The FlatBuffers
//   verifier then checks the structure, the canonical decoders check the signature, environment
//   and kernel spec, and the key recomputed from the signature and environment must equal the key
//   in the file name (so a manifest copied to another name is refused as well).
//
// * Publish order: blobs, state file (only if absent), use record (only if absent), manifest. The
//   manifest's rename is the moment the entry exists; everything it refers to is already in place
//   (and durable) by then, so a reader that sees a manifest sees a whole entry. Republishing
//   renames a new manifest over the old one: readers get the old or the new file, never a mix.
//
// * State file: created "active" at publish (unless one exists: a quarantined key stays
//   quarantined), replaced by rename on every change. Because every entry has one, a missing or
//   unreadable state file is detected, and it makes the entry disabled: deleting or corrupting a
//   quarantine record must never bring a bad kernel back. It carries the key it belongs to.
//
// * Use record used/<k0k1>/<key>: an empty file whose mtime is the last use; created at publish
//   with mtime 0 ("never used"), moved forward by touch() with one utimensat. Losing it only
//   loses LRU information, but verify_all reports it.
//
// * Removal unlinks the manifest first (the entry disappears at once), then the state file and
//   the use record. State and use records without a manifest ("orphans": an interrupted publish
//   or removal, or a deleted manifest) are not entries. Like tmp/ files they may belong to a
//   writer in progress, so both verify_all and gc leave them alone until they are older than
//   gc_grace_ms; then verify_all reports them (as a missing manifest) and gc deletes them. The
//   same grace protects unreferenced blobs: a publisher touches an existing blob before it
//   renames a manifest that refers to it, so gc never deletes a blob a concurrent publish is about
//   to use (except in the instant between gc's stat and unlink of a blob unused for the whole
//   grace period). Fan-out directories are never removed, so a publisher's mkdir can never lose
//   a race against a cleaner.

namespace kforge {

using namespace store_detail;

// ---- Store ---------------------------------------------------------------------------------------------

StatusOr<Store> Store::open(const std::string& root, StoreOptions options) {
  return guarded("open", [&]() -> StatusOr<Store> {
    // sodium_init is idempotent and thread-safe; it only fails when no entropy source exists.
    if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
    KFORGE_ASSIGN_OR_RETURN(CacheDir dir, CacheDir::open(root));
    Store s;
    s.root_ = dir.path();
    s.options_ = options;
    s.shared_ = std::make_shared<StoreShared>();
    KFORGE_RETURN_IF_ERROR(check_version(Layout{s.root_, options.durable}, &s.shared_->version_error));
    if (s.shared_->version_error.ok()) {
      for (const char* sub : {"tmp", "manifests", "blobs", "state", "used"}) {
        KFORGE_RETURN_IF_ERROR(ensure_dir(s.root_ + "/" + sub, options.durable));
      }
    }
    return s;
  });
}

StatusOr<EntryKey> Store::publish(const CacheEntry& entry) {
  return guarded("publish", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    if (entry.blobs.size() > kMaxBlobs) {
      return invalid_argument(std::to_string(entry.blobs.size()) + " blobs, over the limit of " +
                              std::to_string(kMaxBlobs));
    }
    std::vector<BlobRef> refs;
    std::vector<BlobToInstall> blobs;
    for (size_t i = 0; i < entry.blobs.size(); ++i) {
      const BlobData& b = entry.blobs[i];
      BlobRef ref{b.name, sha256_hex(b.bytes), b.bytes.size()};
      const std::string field = "blobs[" + std::to_string(i) + "]";
      KFORGE_RETURN_IF_ERROR(check_blob_ref(field, ref.name, ref.sha256_hex, ref.size));
      for (const BlobRef& prev : refs) {
        if (prev.name == ref.name) return invalid_argument(field + ".name: duplicate name '" + ref.name + "'");
      }
      refs.push_back(ref);
      blobs.push_back({ref, std::string_view(b.bytes)});
    }
    const std::string manifest = encode_manifest(entry, refs);
    // Publish only what load() will accept: this is where an invalid spec or an oversized entry is
    // refused, instead of becoming an entry nobody can read.
    auto parsed = parse_manifest_impl(manifest);
    if (!parsed.ok()) return invalid_argument("cannot publish the entry: " + parsed.status().message());
    KFORGE_RETURN_IF_ERROR(install_entry(Layout{root_, options_.durable}, parsed->key, manifest, blobs));
    return parsed->key;
  });
}

StatusOr<EntryKey> Store::publish_manifest_bytes(std::string_view manifest, const std::vector<BlobData>& blobs) {
  return guarded("publish_manifest_bytes", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    auto parsed = parse_manifest_impl(manifest);
    if (!parsed.ok()) return invalid_argument("manifest: " + parsed.status().message());
    std::vector<BlobToInstall> install;
    for (const BlobRef& ref : parsed->blobs) install.push_back({ref, std::nullopt});
    for (const BlobData& b : blobs) {
      auto it =
          std::find_if(install.begin(), install.end(), [&](const BlobToInstall& x) { return x.ref.name == b.name; });
      if (it == install.end()) return invalid_argument("blob '" + excerpt(b.name) + "' is not in the manifest");
      if (it->bytes) return invalid_argument("blob '" + b.name + "' supplied twice");
      if (b.bytes.size() != it->ref.size || sha256_hex(b.bytes) != it->ref.sha256_hex) {
        return invalid_argument("blob '" + b.name + "' does not match the manifest's size and SHA-256");
      }
      it->bytes = std::string_view(b.bytes);
    }
    KFORGE_RETURN_IF_ERROR(install_entry(Layout{root_, options_.durable}, parsed->key, manifest, install));
    return parsed->key;
  });
}

StatusOr<StoredEntry> Store::parse_manifest(std::string_view manifest) {
  return guarded("parse_manifest", [&]() -> StatusOr<StoredEntry> {
    if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
    return parse_manifest_impl(manifest);
  });
}

StatusOr<StoredEntry> Store::load(const EntryKey& key) const {
  return guarded("load", [&]() -> StatusOr<StoredEntry> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    return load_entry(Layout{root_, options_.durable}, key);
  });
}

StatusOr<std::optional<StoredEntry>> Store::lookup(const OpSignature& sig, const Environment& env) const {
  return guarded("lookup", [&]() -> StatusOr<std::optional<StoredEntry>> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const EntryKey key = entry_key(sig, env);
    auto e = load_entry(l, key);
    std::optional<CacheProblem> problem;
    if (e.ok()) {
      // The key is a 128-bit hash; comparing what the manifest holds makes a collision a miss.
      if (e->signature == sig && e->environment == env) return std::optional<StoredEntry>(std::move(e).value());
      problem = CacheProblem{l.manifest(key), "manifest holds another signature or environment with the same key", key};
    } else if (e.status().code() == StatusCode::kNotFound) {
      return std::optional<StoredEntry>();
    } else {
      problem = CacheProblem{l.manifest(key), e.status().message(), key};
    }
    std::function<void(const CacheProblem&)> cb;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->reported.insert(key).second) return std::optional<StoredEntry>();
      cb = shared_->callback;
    }
    if (cb) {
      cb(*problem);
    } else {
      default_problem_report(*problem);
    }
    return std::optional<StoredEntry>();
  });
}

StatusOr<std::string> Store::read_blob(const BlobRef& ref) const {
  return guarded("read_blob", [&]() -> StatusOr<std::string> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    KFORGE_RETURN_IF_ERROR(check_blob_ref("blob", ref.name, ref.sha256_hex, ref.size));
    const std::string path = Layout{root_, options_.durable}.blob(ref.sha256_hex);
    auto bytes = read_file(path, ref.size);  // a longer file fails here, before it is read
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return not_found("blob " + path + " is missing");
      return Status(bytes.status().code(), "blob " + bytes.status().message());
    }
    if (bytes->size() != ref.size) {
      return corrupt("blob " + path,
                     "truncated (" + std::to_string(bytes->size()) + " of " + std::to_string(ref.size) + " bytes)");
    }
    if (sha256_hex(*bytes) != ref.sha256_hex) return corrupt("blob " + path, "SHA-256 mismatch (content corrupt)");
    return bytes;
  });
}

StatusOr<std::vector<EntryKey>> Store::list() const {
  return guarded("list", [&]() -> StatusOr<std::vector<EntryKey>> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/manifests", nullptr));
    std::vector<EntryKey> keys;
    for (const FanoutFile& f : files) {
      if (auto k = key_from_name(f.dir, f.name, kManifestSuffix)) keys.push_back(*k);
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  });
}

StatusOr<EntryKey> Store::resolve_prefix(std::string_view hex_prefix) const {
  return guarded("resolve_prefix", [&]() -> StatusOr<EntryKey> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    std::string p(hex_prefix);
    for (char& c : p) {
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    }
    if (!is_lower_hex(p)) return invalid_argument("key prefix '" + excerpt(hex_prefix) + "' is not hexadecimal");
    if (p.size() < kMinPrefixDigits) {
      return invalid_argument("key prefix '" + p + "' is too short: give at least " + std::to_string(kMinPrefixDigits) +
                              " hex digits");
    }
    if (p.size() > 32) return invalid_argument("key prefix '" + excerpt(p) + "' is longer than a key (32 hex digits)");
    const std::string dir = Layout{root_, options_.durable}.manifest_dir(p);
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(dir));
    std::vector<EntryKey> matches;
    for (const std::string& n : names) {
      auto k = key_from_name(p.substr(0, 2), n, kManifestSuffix);
      if (k && n.compare(0, p.size(), p) == 0) matches.push_back(*k);
    }
    if (matches.empty()) return not_found("no cache entry matches '" + p + "'");
    if (matches.size() > 1) {
      std::string msg =
          "key prefix '" + p + "' is ambiguous; it matches " + std::to_string(matches.size()) + " entries:";
      for (size_t i = 0; i < matches.size() && i < 16; ++i) msg += " " + matches[i].hex();
      if (matches.size() > 16) msg += " ...";
      return invalid_argument(msg);
    }
    return matches[0];
  });
}

Status Store::remove(const EntryKey& key) {
  return guarded("remove", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    return remove_entry_files(Layout{root_, options_.durable}, key);
  });
}

Status Store::set_state(const EntryKey& key, EntryState state, std::string reason) {
  return guarded("set_state", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    if (static_cast<uint8_t>(state) > 2) return invalid_argument("unknown entry state");
    if (reason.size() > kMaxReasonBytes) {
      return invalid_argument("reason is " + std::to_string(reason.size()) + " bytes, over the limit of " +
                              std::to_string(kMaxReasonBytes));
    }
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    EntryStatus s = read_status(l, key);  // keeps the pin (unknown, i.e. off, if unreadable)
    s.state = state;
    s.reason = state == EntryState::kActive ? std::string() : std::move(reason);
    s.changed_unix_ms = now_ms();
    return write_state(l, key, s);
  });
}

Status Store::set_pinned(const EntryKey& key, bool pinned) {
  return guarded("set_pinned", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    // An unreadable state file reads as disabled with a reason; writing that back keeps the entry
    // disabled, so pinning never re-enables anything.
    EntryStatus s = read_status(l, key);
    s.pinned = pinned;
    return write_state(l, key, s);
  });
}

Status Store::touch(const EntryKey& key) const {
  return guarded("touch", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const std::string path = l.used(key);
    if (::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) return Status();
    if (errno != ENOENT) return io_error("cannot touch", path, errno);
    // The use record was lost; recreate it, but only for an entry that exists.
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(path), false));
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return io_error("cannot create", path, errno);
    if (::futimens(fd.get(), nullptr) != 0) return io_error("cannot touch", path, errno);
    return Status();
  });
}

StatusOr<EntryStatus> Store::status(const EntryKey& key) const {
  return guarded("status", [&]() -> StatusOr<EntryStatus> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(require_entry(l, key));
    return read_status(l, key);
  });
}

StatusOr<std::string> Store::read_manifest_bytes(const EntryKey& key) const {
  return guarded("read_manifest_bytes", [&]() -> StatusOr<std::string> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    // Export must never carry a corrupt entry elsewhere: the same checks as load().
    KFORGE_ASSIGN_OR_RETURN(VerifiedManifest m, read_manifest(Layout{root_, options_.durable}, key));
    return std::move(m.bytes);
  });
}

void Store::set_problem_callback(std::function<void(const CacheProblem&)> cb) {
  if (!shared_) return;
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->callback = std::move(cb);
}

Status Store::write_trial_marker(const EntryKey& key, int32_t pid) {
  return guarded("write_trial_marker", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("trial", std::to_string(pid) + "\n"));
    return l.install_replace(tmp, l.trial(key));
  });
}

Status Store::remove_trial_marker(const EntryKey& key) {
  return guarded("remove_trial_marker", [&]() -> Status {
    const Layout l{root_, options_.durable};
    const std::string path = l.trial(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error("cannot remove", path, errno);
    return Status();
  });
}

StatusOr<std::vector<Store::TrialMarker>> Store::trial_markers() const {
  return guarded("trial_markers", [&]() -> StatusOr<std::vector<TrialMarker>> {
    const Layout l{root_, options_.durable};
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(l.trial_dir()));
    std::vector<TrialMarker> out;
    for (const std::string& n : names) {
      StatusOr<EntryKey> key = EntryKey::from_hex(n);
      if (!key.ok() || key->hex() != n) continue;
      const std::string path = l.trial_dir() + "/" + n;
      StatusOr<int32_t> pid = parse_trial_marker(path);
      if (pid.ok()) out.push_back(TrialMarker{*key, *pid, path});
    }
    return out;
  });
}

Status Store::write_no_win_record(const NoWinRecord& record) {
  return guarded("write_no_win_record", [&]() -> Status {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    if (record.pid <= 0) return invalid_argument("no-win record: pid " + std::to_string(record.pid));
    const Layout l{root_, options_.durable};
    KFORGE_RETURN_IF_ERROR(ensure_dir(l.nowin_dir(), options_.durable));
    const std::string text = std::to_string(record.pid) + " " + std::to_string(record.entry_ns) + " " +
                             std::to_string(record.pytorch_ns) + "\n";
    KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("nowin", text));
    return l.install_replace(tmp, l.nowin(record.key, record.pid));
  });
}

StatusOr<std::vector<Store::NoWinRecord>> Store::no_win_records(std::optional<EntryKey> key) const {
  return guarded("no_win_records", [&]() -> StatusOr<std::vector<NoWinRecord>> {
    const Layout l{root_, options_.durable};
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(l.nowin_dir()));
    std::vector<NoWinRecord> out;
    for (const std::string& n : names) {
      if (key && n.compare(0, 33, key->hex() + ".") != 0) continue;
      StatusOr<NoWinRecord> r = parse_no_win_record(l.nowin_dir(), n);
      if (r.ok()) out.push_back(std::move(*r));
    }
    std::sort(out.begin(), out.end(), [](const NoWinRecord& a, const NoWinRecord& b) {
      return a.key != b.key ? a.key < b.key : a.pid < b.pid;
    });
    return out;
  });
}

}  // namespace kforge

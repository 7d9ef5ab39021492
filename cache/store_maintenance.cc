// Store::verify_all and Store::gc (Note [Cache layout] in store.cc): every file checked, and the
// cache brought down to a size without losing what must be kept.
#include "cache/store_internal.h"

namespace kforge {

using namespace store_detail;

// ---- verify_all ----------------------------------------------------------------------------------------

StatusOr<std::vector<CacheProblem>> Store::verify_all() const {
  return guarded("verify_all", [&]() -> StatusOr<std::vector<CacheProblem>> {
    if (!shared_) return internal_error("use of a moved-from cache Store");
    const Layout l{root_, options_.durable};
    const int64_t settled_before = now_ms() - options_.gc_grace_ms;
    std::vector<CacheProblem> problems;
    auto add = [&](std::string path, std::string what, std::optional<EntryKey> key = std::nullopt) {
      problems.push_back({std::move(path), std::move(what), key});
    };
    auto add_strays = [&](const std::vector<std::string>& strays) {
      for (const std::string& s : strays) add(s, "unknown file in the cache (not part of the layout; left in place)");
    };
    if (!shared_->version_error.ok()) add(root_ + "/VERSION", shared_->version_error.message());

    // The root holds the layout and nothing else.
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> top, list_names(root_));
    const std::set<std::string> known{"VERSION", "manifests", "blobs", "state", "used", "tmp", "trial", "nowin"};
    for (const std::string& n : top) {
      if (!known.count(n)) add(root_ + "/" + n, "unknown file in the cache (not part of the layout; left in place)");
    }
    for (const char* sub : {"manifests", "blobs", "state", "used", "tmp"}) {
      struct stat st {};
      const std::string p = root_ + "/" + sub;
      if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) add(p, "directory missing or not a directory");
    }

    // Manifests.
    std::vector<std::string> strays;
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> manifests, scan_fanout(root_ + "/manifests", &strays));
    std::map<EntryKey, std::vector<BlobRef>> entries;  // parsed entries
    std::set<EntryKey> present;                        // every well-named manifest, parsed or not
    for (const FanoutFile& f : manifests) {
      auto key = key_from_name(f.dir, f.name, kManifestSuffix);
      if (!key) {
        strays.push_back(f.path);
        continue;
      }
      present.insert(*key);
      auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxManifestPayload);
      if (!bytes.ok()) {
        if (bytes.status().code() != StatusCode::kNotFound) add(f.path, bytes.status().message(), key);
        continue;  // not found: removed while we scanned
      }
      auto e = parse_manifest_impl(*bytes);
      if (!e.ok()) {
        add(f.path, e.status().message(), key);
      } else if (e->key != *key) {
        add(f.path, "holds entry " + e->key.hex() + ", not the one its name says", key);
      } else {
        entries[*key] = e->blobs;
      }
    }

    // Blobs: every blob's content must hash to its name, referenced or not (a later publish may
    // reuse an unreferenced one without rewriting it).
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> blob_files, scan_fanout(root_ + "/blobs", &strays));
    std::map<std::string, uint64_t> blob_sizes;  // sha -> size, for blobs whose content is right
    for (const FanoutFile& f : blob_files) {
      struct stat st {};
      if (f.name.size() != 64 || !is_lower_hex(f.name) || f.name.compare(0, 2, f.dir) != 0 ||
          ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        strays.push_back(f.path);
        continue;
      }
      auto h = sha256_of_file(f.path);
      if (!h.ok()) {
        add(f.path, h.status().message());
      } else if (*h != f.name) {
        add(f.path, "blob content does not match its SHA-256 name (corrupt)");
      } else {
        blob_sizes[f.name] = static_cast<uint64_t>(st.st_size);
      }
    }
    std::set<std::string> blob_reported;
    for (const auto& [key, refs] : entries) {
      for (const BlobRef& r : refs) {
        const std::string path = l.blob(r.sha256_hex);
        auto it = blob_sizes.find(r.sha256_hex);
        if (it == blob_sizes.end()) {
          if (!exists(path)) add(path, "blob missing (entry's '" + r.name + "')", key);
          // else: corrupt, reported above
        } else if (it->second != r.size && blob_reported.insert(path).second) {
          add(path, "blob is " + std::to_string(it->second) + " bytes, the manifest says " + std::to_string(r.size),
              key);
        }
      }
    }

    // State files and use records, and which entries lack them. Side files without a manifest are
    // reported once per key, under the manifest's name: that is the file that is missing.
    std::map<EntryKey, std::string> orphans;
    auto side_files = [&](const char* sub, std::string_view suffix, bool is_state) -> Status {
      KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/" + sub, &strays));
      std::set<EntryKey> seen;
      for (const FanoutFile& f : files) {
        auto key = key_from_name(f.dir, f.name, suffix);
        struct stat st {};
        if (!key || ::lstat(f.path.c_str(), &st) != 0) {
          strays.push_back(f.path);
          continue;
        }
        seen.insert(*key);
        if (!present.count(*key)) {
          // Young: a writer may be in progress (Note [Cache layout]).
          if (written_ms(st, !is_state) <= settled_before) orphans.emplace(*key, f.path);
          continue;
        }
        if (!S_ISREG(st.st_mode)) {
          add(f.path, "not a regular file", key);
        } else if (is_state) {
          auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxStatePayload);
          StatusOr<EntryStatus> s = bytes.ok() ? decode_state(*bytes, *key) : StatusOr<EntryStatus>(bytes.status());
          if (!s.ok()) add(f.path, "state file unreadable, entry treated as disabled: " + s.status().message(), key);
        } else if (st.st_size != 0) {
          add(f.path, "use record should be empty but has " + std::to_string(st.st_size) + " bytes", key);
        }
      }
      for (const EntryKey& k : present) {
        if (seen.count(k)) continue;
        const std::string path = is_state ? l.state(k) : l.used(k);
        if (exists(path) || !exists(l.manifest(k))) continue;  // changed while we scanned
        add(path, is_state ? "state file missing, entry treated as disabled" : "use record missing", k);
      }
      return Status();
    };
    KFORGE_RETURN_IF_ERROR(side_files("state", kStateSuffix, true));
    KFORGE_RETURN_IF_ERROR(side_files("used", "", false));
    for (const auto& [key, side] : orphans) {
      if (exists(l.manifest(key))) continue;  // published while we scanned
      add(l.manifest(key),
          "manifest missing, but " + side +
              " remains (an interrupted publish or removal, or a deleted manifest); gc removes it",
          key);
    }

    // trial/ (made by the first trial, so it may be absent): markers, "<pid>\n" under an entry's key.
    {
      struct stat st {};
      const std::string dir = l.trial_dir();
      if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) add(dir, "not a directory (trial markers live there)");
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> trials, list_names(l.trial_dir()));
    for (const std::string& n : trials) {
      const std::string p = l.trial_dir() + "/" + n;
      StatusOr<EntryKey> key = EntryKey::from_hex(n);
      if (!key.ok() || key->hex() != n) {
        strays.push_back(p);
        continue;
      }
      StatusOr<int32_t> pid = parse_trial_marker(p);
      if (!pid.ok() && pid.status().code() != StatusCode::kNotFound) add(p, pid.status().message(), *key);
    }

    // nowin/ (made by the first no-win verdict, so it may be absent): "<key>.<pid>" records.
    {
      struct stat st {};
      const std::string dir = l.nowin_dir();
      if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) add(dir, "not a directory (no-win records live there)");
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> nowins, list_names(l.nowin_dir()));
    for (const std::string& n : nowins) {
      StatusOr<NoWinRecord> r = parse_no_win_record(l.nowin_dir(), n);
      if (!r.ok() && r.status().code() != StatusCode::kNotFound) add(l.nowin_dir() + "/" + n, r.status().message());
    }

    // tmp/: young files belong to writers in progress; old ones were abandoned.
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> tmps, list_names(l.tmp_dir()));
    for (const std::string& n : tmps) {
      const std::string p = l.tmp_dir() + "/" + n;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) continue;
      if (!S_ISREG(st.st_mode)) {
        strays.push_back(p);
      } else if (written_ms(st) <= settled_before) {
        add(p, "abandoned temporary file (a writer was interrupted); gc removes it");
      }
    }
    add_strays(strays);
    std::stable_sort(problems.begin(), problems.end(),
                     [](const CacheProblem& a, const CacheProblem& b) { return a.path < b.path; });
    return problems;
  });
}

// ---- gc ------------------------------------------------------------------------------------------------

StatusOr<GcReport> Store::gc(uint64_t max_bytes) {
  return guarded("gc", [&]() -> StatusOr<GcReport> {
    KFORGE_RETURN_IF_ERROR(opened(shared_));
    const Layout l{root_, options_.durable};
    const int64_t settled_before = now_ms() - options_.gc_grace_ms;

    struct Candidate {
      EntryKey key;
      uint64_t manifest_bytes = 0;
      int64_t lru_ms = 0;
      std::vector<BlobRef> blobs;
      bool removable = false;
    };
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> manifests, scan_fanout(root_ + "/manifests", nullptr));
    std::vector<Candidate> entries;
    std::set<EntryKey> present;
    std::map<std::string, uint64_t> refcount;
    for (const FanoutFile& f : manifests) {
      auto key = key_from_name(f.dir, f.name, kManifestSuffix);
      struct stat st {};
      if (!key || ::lstat(f.path.c_str(), &st) != 0) continue;
      present.insert(*key);
      Candidate c;
      c.key = *key;
      c.manifest_bytes = static_cast<uint64_t>(st.st_size);
      auto bytes = read_file(f.path, kFrameHeaderBytes + kMaxManifestPayload);
      auto e = bytes.ok() ? parse_manifest_impl(*bytes) : StatusOr<StoredEntry>(bytes.status());
      // A corrupt manifest is left for the user to inspect (verify_all reports it); it still counts.
      if (e.ok() && e->key == *key) {
        bool state_ok = false;
        const EntryStatus s = read_status(l, *key, &state_ok);
        // An entry whose state file cannot be read might be pinned: keep it. A quarantined entry
        // is kept too: dropping it would drop the quarantine, and the same kernel published again
        // would come back active without anyone deciding to trust it (only remove() forgets it).
        c.removable = state_ok && !s.pinned && s.state != EntryState::kQuarantined;
        c.lru_ms = s.last_use_unix_ms > 0 ? s.last_use_unix_ms : ms_of(st.st_mtim);
        c.blobs = e->blobs;
        for (const BlobRef& r : c.blobs) ++refcount[r.sha256_hex];
      }
      entries.push_back(std::move(c));
    }
    std::map<std::string, uint64_t> blob_size;
    for (const auto& [sha, n] : refcount) {
      struct stat st {};
      if (::lstat(l.blob(sha).c_str(), &st) == 0) blob_size[sha] = static_cast<uint64_t>(st.st_size);
    }
    GcReport report;
    uint64_t total = 0;
    for (const Candidate& c : entries) total += c.manifest_bytes;
    for (const auto& [sha, size] : blob_size) total += size;
    report.bytes_before = total;

    std::vector<const Candidate*> order;
    for (const Candidate& c : entries) {
      if (c.removable) order.push_back(&c);
    }
    std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
      return a->lru_ms != b->lru_ms ? a->lru_ms < b->lru_ms : a->key < b->key;
    });
    for (const Candidate* c : order) {
      if (total <= max_bytes) break;
      Status s = remove_entry_files(l, c->key);
      if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
      present.erase(c->key);
      total -= c->manifest_bytes;
      for (const BlobRef& r : c->blobs) {
        if (--refcount[r.sha256_hex] == 0) {
          total -= blob_size.count(r.sha256_hex) ? blob_size[r.sha256_hex] : 0;
          blob_size.erase(r.sha256_hex);
        }
      }
      report.removed.push_back(c->key);
    }
    report.bytes_after = total;

    // Unreferenced blobs past the grace period. A publisher touches a blob before it renames the
    // manifest that refers to it, so a blob referenced by a manifest newer than our scan is young.
    KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> blob_files, scan_fanout(root_ + "/blobs", nullptr));
    for (const FanoutFile& f : blob_files) {
      struct stat st {};
      if (f.name.size() != 64 || !is_lower_hex(f.name) || ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        continue;  // not ours to delete: verify_all reports it
      }
      auto it = refcount.find(f.name);
      if ((it != refcount.end() && it->second > 0) || written_ms(st) > settled_before) continue;
      if (::unlink(f.path.c_str()) == 0) ++report.blobs_removed;
    }
    // Side files whose manifest is gone (Note [Cache layout]), then abandoned tmp files.
    using SideDir = std::pair<const char*, std::string_view>;
    for (const auto& [sub, suffix] : {SideDir{"state", kStateSuffix}, SideDir{"used", ""}}) {
      KFORGE_ASSIGN_OR_RETURN(std::vector<FanoutFile> files, scan_fanout(root_ + "/" + sub, nullptr));
      for (const FanoutFile& f : files) {
        auto key = key_from_name(f.dir, f.name, suffix);
        struct stat st {};
        if (!key || present.count(*key) || ::lstat(f.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
            written_ms(st, suffix.empty()) > settled_before) {
          continue;
        }
        if (exists(l.manifest(*key))) continue;  // published while we worked
        ::unlink(f.path.c_str());
      }
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> tmps, list_names(l.tmp_dir()));
    for (const std::string& n : tmps) {
      const std::string p = l.tmp_dir() + "/" + n;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || written_ms(st) > settled_before) continue;
      if (::unlink(p.c_str()) == 0) ++report.tmp_removed;
    }
    // Trial markers of entries that are gone (removed here, or older than the grace period: a
    // marker is written just before its entry's first launch) say nothing any more.
    const std::set<EntryKey> removed(report.removed.begin(), report.removed.end());
    KFORGE_ASSIGN_OR_RETURN(std::vector<TrialMarker> markers, trial_markers());
    for (const TrialMarker& m : markers) {
      struct stat st {};
      if (::lstat(m.path.c_str(), &st) != 0) continue;
      const bool entry_gone = removed.count(m.key) > 0 || (!exists(l.manifest(m.key)) && written_ms(st) <= settled_before);
      if (entry_gone && ::unlink(m.path.c_str()) == 0) ++report.trial_markers_removed;
    }
    // No-win records say something only while their process runs (another process measures for
    // itself) and while their entry exists.
    KFORGE_ASSIGN_OR_RETURN(std::vector<NoWinRecord> nowins, no_win_records());
    for (const NoWinRecord& r : nowins) {
      const bool gone = !process_alive(r.pid) || removed.count(r.key) > 0 || !exists(l.manifest(r.key));
      if (gone && ::unlink(r.path.c_str()) == 0) ++report.no_win_records_removed;
    }
    return report;
  });
}

}  // namespace kforge

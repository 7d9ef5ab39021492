// The layout's files (Note [Cache layout] in store.cc): small helpers, the fan-out scan, side
// files, blobs, manifests, VERSION and trial markers.
#include "cache/store_internal.h"

namespace kforge::store_detail {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ms_of(const struct timespec& t) { return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1000000; }

// When a file was last written (or touched, for blobs): the age that the grace period measures.
// Use records keep the last use in their mtime (0 = never), so for them it is the ctime, which
// creation and utimensat set. Not the ctime of the others: a state file is installed by link(),
// and unlinking a second link left by a killed writer would make the survivor look new.
int64_t written_ms(const struct stat& st, bool use_record) {
  return use_record ? ms_of(st.st_ctim) : ms_of(st.st_mtim);
}


bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string sha256_hex(std::string_view bytes) {
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return file_io::to_hex(h.data(), h.size());
}

// Printable excerpt of untrusted bytes for an error message.
std::string excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

Status corrupt(const std::string& kind_and_path, std::string_view what) {
  return invalid_argument(kind_and_path + ": " + std::string(what));
}

// "<32 hex>.kfm" in the fan-out directory of its first two digits -> key.
std::optional<EntryKey> key_from_name(std::string_view dir, std::string_view name, std::string_view suffix) {
  if (name.size() != 32 + suffix.size() || name.substr(32) != suffix) return std::nullopt;
  std::string_view hex = name.substr(0, 32);
  if (!is_lower_hex(hex) || hex.substr(0, 2) != dir) return std::nullopt;
  auto k = SignatureId::from_hex(hex);
  if (!k.ok()) return std::nullopt;
  return *k;
}

bool is_fanout_name(std::string_view name) { return name.size() == 2 && is_lower_hex(name); }


// Every file two levels under `base` (base/<xx>/<name>). First-level names that are not fan-out
// directories are appended to *strays.
StatusOr<std::vector<FanoutFile>> scan_fanout(const std::string& base, std::vector<std::string>* strays) {
  KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> dirs, list_names(base));
  std::vector<FanoutFile> files;
  for (const std::string& d : dirs) {
    const std::string dir_path = base + "/" + d;
    struct stat st {};
    if (!is_fanout_name(d) || ::lstat(dir_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      if (strays != nullptr) strays->push_back(dir_path);
      continue;
    }
    KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> names, list_names(dir_path));
    for (std::string& n : names) files.push_back({d, n, dir_path + "/" + n});
  }
  return files;
}

// The status of an entry as its files say. Never fails: what cannot be read makes the entry
// disabled with a reason naming the file, so that corruption can only take a kernel out of use.
// *state_ok says whether the state file was read (gc keeps entries whose pin it cannot know).
EntryStatus read_status(const Layout& l, const EntryKey& key, bool* state_ok) {
  EntryStatus s;
  const std::string path = l.state(key);
  auto bytes = read_file(path, kFrameHeaderBytes + kMaxStatePayload);
  StatusOr<EntryStatus> parsed = bytes.ok() ? decode_state(*bytes, key) : StatusOr<EntryStatus>(bytes.status());
  if (parsed.ok()) {
    s = std::move(parsed).value();
  } else {
    s.state = EntryState::kDisabled;
    s.reason = bytes.status().code() == StatusCode::kNotFound ? "state file " + path + " is missing"
               : bytes.ok() ? "state file " + path + " is corrupt: " + parsed.status().message()
                            : "state file unreadable: " + bytes.status().message();
  }
  if (state_ok != nullptr) *state_ok = parsed.ok();
  struct stat st {};
  if (::stat(l.used(key).c_str(), &st) == 0) {
    const int64_t t = ms_of(st.st_mtim);
    s.last_use_unix_ms = t > 0 ? t : 0;
  }
  return s;
}

Status write_state(const Layout& l, const EntryKey& key, const EntryStatus& s) {
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("state", encode_state(key, s)));
  return l.install_replace(tmp, l.state(key));
}

// Creates the entry's state file ("active") and use record ("never used") unless they exist.
Status ensure_side_files(const Layout& l, const EntryKey& key) {
  const std::string state_path = l.state(key);
  if (!exists(state_path)) {
    EntryStatus active;
    active.changed_unix_ms = now_ms();
    KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("state", encode_state(key, active)));
    KFORGE_ASSIGN_OR_RETURN(bool installed, l.install_if_absent(tmp, state_path));
    (void)installed;  // someone else's state file wins: it may be a quarantine
  }
  const std::string used_path = l.used(key);
  if (!exists(used_path)) {
    KFORGE_RETURN_IF_ERROR(ensure_dir(parent_of(used_path), l.durable));
    UniqueFd fd(::open(used_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.valid()) {
      const struct timespec never[2] = {{0, 0}, {0, 0}};
      if (::futimens(fd.get(), never) != 0) return io_error("cannot set times of", used_path, errno);
      if (l.durable) KFORGE_RETURN_IF_ERROR(fsync_dir(parent_of(used_path)));
    } else if (errno != EEXIST) {
      return io_error("cannot create", used_path, errno);
    }
  }
  return Status();
}


Status install_blob(const Layout& l, const BlobToInstall& b) {
  const std::string path = l.blob(b.ref.sha256_hex);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == b.ref.size) {
    // Already there (content-addressed). Touch it: gc spares blobs younger than its grace period,
    // and the manifest that will refer to it is not visible yet.
    if (::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) return Status();
    if (errno != ENOENT) return io_error("cannot touch", path, errno);
    // gc removed it between the two calls: write it again below.
  }
  if (!b.bytes) return not_found("blob '" + b.ref.name + "' (" + path + ") is neither supplied nor in the cache");
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("blob", *b.bytes));
  return l.install_replace(tmp, path);  // replaces a blob of the wrong size or type
}

// Publishes a verified manifest (Note [Cache layout], "Publish order").
Status install_entry(const Layout& l, const EntryKey& key, std::string_view manifest,
                     const std::vector<BlobToInstall>& blobs) {
  for (const BlobToInstall& b : blobs) KFORGE_RETURN_IF_ERROR(install_blob(l, b));
  KFORGE_RETURN_IF_ERROR(ensure_side_files(l, key));
  KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("manifest", manifest));
  KFORGE_RETURN_IF_ERROR(l.install_replace(tmp, l.manifest(key)));
  // A concurrent remove() of the same key may have deleted the side files between our check and
  // the rename; the entry is ours now, so put them back (a missing state file would disable it).
  return ensure_side_files(l, key);
}


StatusOr<VerifiedManifest> read_manifest(const Layout& l, const EntryKey& key) {
  const std::string path = l.manifest(key);
  auto bytes = read_file(path, kFrameHeaderBytes + kMaxManifestPayload);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return not_found("no cache entry " + key.hex());
    return Status(bytes.status().code(), "manifest " + bytes.status().message());
  }
  auto e = parse_manifest_impl(*bytes);
  if (!e.ok()) return corrupt("manifest " + path, e.status().message());
  if (e->key != key) {
    return corrupt("manifest " + path, "holds entry " + e->key.hex() + ", not the one its name says");
  }
  return VerifiedManifest{std::move(bytes).value(), std::move(e).value()};
}

StatusOr<StoredEntry> load_entry(const Layout& l, const EntryKey& key) {
  KFORGE_ASSIGN_OR_RETURN(VerifiedManifest m, read_manifest(l, key));
  m.entry.status = read_status(l, key);
  return std::move(m.entry);
}

Status remove_entry_files(const Layout& l, const EntryKey& key) {
  const std::string m = l.manifest(key);
  if (::unlink(m.c_str()) != 0) {
    if (errno == ENOENT) return not_found("no cache entry " + key.hex());
    return io_error("cannot remove", m, errno);
  }
  for (const std::string& p : {l.state(key), l.used(key)}) {
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return io_error("cannot remove", p, errno);
  }
  return l.durable ? fsync_dir(parent_of(m)) : Status();
}

Status require_entry(const Layout& l, const EntryKey& key) {
  if (exists(l.manifest(key))) return Status();
  return not_found("no cache entry " + key.hex());
}

// Streams a file through SHA-256 (blobs can be large; verify_all does not keep them in memory).
StatusOr<std::string> sha256_of_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return io_error("cannot open", path, errno);
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read", path, errno);
    if (n == 0) break;
    crypto_hash_sha256_update(&st, buf.data(), static_cast<unsigned long long>(n));
  }
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256_final(&st, h.data());
  return file_io::to_hex(h.data(), h.size());
}

// Checks VERSION, creating it in a cache that was never used. Returns an error for a cache of
// another format (open refuses it); a missing or damaged VERSION in a used cache goes to *damage
// instead, so that verify_all can still look at everything else.
Status check_version(const Layout& l, Status* damage) {
  const std::string path = l.root + "/VERSION";
  auto v = read_file(path, 256);
  if (!v.ok() && v.status().code() == StatusCode::kNotFound) {
    if (!exists(l.root + "/manifests")) {
      KFORGE_RETURN_IF_ERROR(ensure_dir(l.tmp_dir(), l.durable));
      KFORGE_ASSIGN_OR_RETURN(TmpFile tmp, l.write_tmp("VERSION", kVersionText));
      return l.install_replace(tmp, path);
    }
    // VERSION is written before manifests/ is created, so manifests/ without VERSION means it was
    // lost, unless another process set the cache up between our two looks: look again.
    v = read_file(path, 256);
    if (!v.ok() && v.status().code() == StatusCode::kNotFound) {
      *damage = not_found("cache VERSION file " + path + " is missing, but the cache has a manifests/ directory");
      return Status();
    }
  }
  if (!v.ok()) {
    *damage = Status(v.status().code(), "cache VERSION file " + v.status().message());
    return Status();
  }
  const std::string_view text = *v;
  if (text == kVersionText) return Status();
  const std::string_view number = text.substr(std::min(text.size(), kVersionPrefix.size()));
  const bool well_formed = text.substr(0, kVersionPrefix.size()) == kVersionPrefix && number.size() >= 2 &&
                           number.back() == '\n' &&
                           std::all_of(number.begin(), number.end() - 1, [](char c) { return c >= '0' && c <= '9'; });
  const std::string_view expected = kVersionText.substr(0, kVersionText.size() - 1);
  if (well_formed) {
    return invalid_argument("cache " + l.root + " has format '" + std::string(text.substr(0, text.size() - 1)) + "' (" +
                            path + "); this kforge reads '" + std::string(expected) + "'");
  }
  *damage = invalid_argument("cache VERSION file " + path + " is corrupt: '" + excerpt(text) + "', expected '" +
                             std::string(expected) + "'");
  return Status();
}

void default_problem_report(const CacheProblem& p) {
  std::fprintf(stderr, "kforge: cache entry %s is unusable and treated as a miss: %s\n",
               p.key ? p.key->hex().c_str() : "?", p.what.c_str());
}

// A marker's pid, or why the file is not a marker ("pid\n", nothing else).
StatusOr<int32_t> parse_trial_marker(const std::string& path) {
  KFORGE_ASSIGN_OR_RETURN(std::string text, read_file(path, kMaxTrialMarkerBytes));
  if (text.size() < 2 || text.back() != '\n') return invalid_argument(path + ": not a trial marker (expected a pid and a newline)");
  int64_t pid = 0;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return invalid_argument(path + ": not a trial marker (expected a pid and a newline)");
    pid = pid * 10 + (text[i] - '0');
  }
  if (pid <= 0 || pid > INT32_MAX) return invalid_argument(path + ": not a trial marker (pid " + text.substr(0, text.size() - 1) + ")");
  return static_cast<int32_t>(pid);
}

StatusOr<Store::NoWinRecord> parse_no_win_record(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  auto bad = [&](const std::string& why) { return invalid_argument(path + ": not a no-win record (" + why + ")"); };
  const size_t dot = name.find('.');
  if (dot != 32) return bad("expected the name <key>.<pid>");
  StatusOr<EntryKey> key = EntryKey::from_hex(name.substr(0, 32));
  if (!key.ok() || key->hex() != name.substr(0, 32)) return bad("expected the name <key>.<pid>");
  KFORGE_ASSIGN_OR_RETURN(std::string text, read_file(path, kMaxNoWinRecordBytes));
  // "<pid> <entry ns> <pytorch ns>\n": three decimal numbers, nothing else.
  uint64_t fields[3] = {0, 0, 0};
  size_t f = 0, digits = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9' && digits < 19) {
      fields[f] = fields[f] * 10 + static_cast<uint64_t>(c - '0');
      ++digits;
    } else if (digits > 0 && ((c == ' ' && f < 2) || (c == '\n' && f == 2 && i + 1 == text.size()))) {
      ++f;
      digits = 0;
    } else {
      return bad("expected \"<pid> <entry ns> <pytorch ns>\" and a newline");
    }
  }
  if (f != 3) return bad("expected \"<pid> <entry ns> <pytorch ns>\" and a newline");
  if (fields[0] == 0 || fields[0] > INT32_MAX || name.substr(33) != std::to_string(fields[0])) {
    return bad("its pid does not match its name");
  }
  return Store::NoWinRecord{*key, static_cast<int32_t>(fields[0]), fields[1], fields[2], path};
}

bool process_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) == 0) return true;
  return errno == EPERM;
}

Status opened(const std::shared_ptr<StoreShared>& shared) {
  if (!shared) return internal_error("use of a moved-from cache Store");
  return shared->version_error;
}

}  // namespace kforge::store_detail

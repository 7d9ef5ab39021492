#include "search_daemon/worker/builder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "runtime/cpu_kernel_abi.h"
#include "runtime/file_io.h"
#include "runtime/nvrtc.h"
#include "runtime/unique_fd.h"
#include "search_daemon/worker/cpu_kernel_abi_text.h"
#include "search_daemon/worker/cpu_symbol_policy.h"

extern char** environ;

// Note [Build cache files]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// One file per key, <cache_dir>/<k0k1>/<key>.art, made by writing <cache_dir>/tmp/<key>.<pid>.<rnd>,
// fsync and rename, so a reader sees a whole old file or a whole new one, never a torn one, and
// concurrent builders of one key simply both rename (same content). The frame:
//
//   magic "kforgeBC" | format u32 | reserved u32 (0) | body length u64 | SHA-256(body)   (56 bytes)
//   body: key (64 hex) | compiled u8 | name length u32 | name | log length u64 | log
//         | artifact length u64 | artifact
//
// (little-endian). The hash covers the whole body, not just the artifact: a flipped bit in the
// status byte would otherwise turn a compile error into "compiled" with an empty artifact. The
// key inside must equal the file's name, so a file copied or renamed to another key is refused.
// Anything that fails these checks is treated as a miss; the rebuild renames a good file over it.
//
// What is cached: deterministic outcomes only, i.e. a successful build, a compiler that exited
// with an error, and an object refused by the import policy. A compiler killed for its budget, or
// by a signal (the OOM killer), says nothing about the source, and caching it would fail the
// candidate forever even under a larger budget. Rejected compile options cost no compile and are
// not cached either.

namespace kforge {

namespace {

constexpr std::string_view kFrameMagic{"kforgeBC", 8};
constexpr uint32_t kFrameFormat = 1;
constexpr size_t kFrameHeaderBytes = 56;
constexpr size_t kSha256Bytes = crypto_hash_sha256_BYTES;
constexpr uint64_t kMaxArtifactFileBytes = uint64_t{256} << 20;
constexpr size_t kMaxLogBytes = size_t{1} << 20;
constexpr uint32_t kDetectBudgetMs = 10000;
// Bumped when the frame or the meaning of a key changes (the fixed flags are in the key itself).
constexpr std::string_view kKeyDomain = "kforge-build-key 1";
constexpr std::array<const char*, 4> kFixedCpuFlags = {"-std=c++17", "-O2", "-fPIC", "-shared"};

// ---- small RAII types and I/O helpers ------------------------------------------------------------


std::string errno_text(int err) { return std::strerror(err); }

using file_io::fsync_dir;
using file_io::io_error;
using file_io::put_u32;
using file_io::put_u64;
using file_io::write_all;

// A fresh private directory under $TMPDIR (else /tmp), removed with everything in it.
class ScratchDir {
 public:
  static StatusOr<ScratchDir> create() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string tmpl = (base / "kforge-build-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return io_error("cannot create a build directory in", base.string(), errno);
    return ScratchDir(std::move(tmpl));
  }
  ScratchDir(ScratchDir&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const noexcept { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// mkdir that tolerates an existing directory but not a symbolic link (the cache holds code that
// runs in users' processes) nor someone else's directory.
Status ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return io_error("cannot create directory", dir, errno);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return io_error("cannot stat", dir, errno);
  if (S_ISLNK(st.st_mode)) return invalid_argument("build cache directory " + dir + " is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return invalid_argument("build cache directory " + dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return invalid_argument("build cache directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                            ", not to this process's uid " + std::to_string(::geteuid()));
  }
  return Status();
}

// mkdir -p: the components above `dir` may be anything the system provides (/tmp may be a link);
// `dir` itself must be ours.
Status make_cache_dir(const std::string& dir) {
  if (dir.empty()) return invalid_argument("build cache directory is empty");
  for (size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1)) {
    const std::string parent = dir.substr(0, slash);
    if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) return io_error("cannot create directory", parent, errno);
  }
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return ensure_private_dir(d);
}


std::array<uint8_t, kSha256Bytes> sha256(std::string_view bytes) {
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return h;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the cache key and the frame ---------------------------------------------------------------------

void put_field(std::string& out, std::string_view field) {
  put_u64(out, field.size());
  out.append(field);
}

// Length-prefixed fields, so no two different inputs concatenate to the same bytes.
std::string cache_key(const KernelSpec& spec, const std::string& identity) {
  std::string in;
  put_field(in, kKeyDomain);
  put_field(in, backend_name(spec.backend));
  put_field(in, identity);
  put_field(in, std::to_string(KFORGE_CPU_ABI_VERSION));
  put_field(in, kCpuKernelAbiHeaderText);
  if (spec.backend == Backend::kCpu) {
    put_u64(in, kFixedCpuFlags.size());
    for (const char* f : kFixedCpuFlags) put_field(in, f);
  }
  put_field(in, spec.source);
  put_u64(in, spec.entry_points.size());
  for (const std::string& e : spec.entry_points) put_field(in, e);
  put_u64(in, spec.compile_options.size());
  for (const std::string& o : spec.compile_options) put_field(in, o);
  auto h = sha256(in);
  return file_io::to_hex(h.data(), h.size());
}

struct CacheRecord {
  bool compiled = false;
  std::string artifact_name;
  std::string log;
  std::string artifact;
};

std::string encode_frame(const std::string& key, const CacheRecord& r) {
  std::string body;
  body.reserve(key.size() + 32 + r.artifact_name.size() + r.log.size() + r.artifact.size());
  body.append(key);
  body.push_back(r.compiled ? '\1' : '\0');
  put_u32(body, static_cast<uint32_t>(r.artifact_name.size()));
  body.append(r.artifact_name);
  put_u64(body, r.log.size());
  body.append(r.log);
  put_u64(body, r.artifact.size());
  body.append(r.artifact);

  std::string out(kFrameMagic);
  put_u32(out, kFrameFormat);
  put_u32(out, 0);
  put_u64(out, body.size());
  auto h = sha256(body);
  out.append(reinterpret_cast<const char*>(h.data()), h.size());
  out.append(body);
  return out;
}

// Reads little-endian fields from a bounded buffer; every read checks what is left.
class FrameReader {
 public:
  explicit FrameReader(std::string_view b) : b_(b) {}
  std::optional<uint64_t> uint(size_t bytes) {
    if (b_.size() - pos_ < bytes) return std::nullopt;
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(b_[pos_ + i])} << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::optional<std::string_view> bytes(uint64_t n) {
    if (b_.size() - pos_ < n) return std::nullopt;
    std::string_view v = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return v;
  }
  bool at_end() const noexcept { return pos_ == b_.size(); }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// nullopt: not a valid frame for `key` (Note [Build cache files]).
std::optional<CacheRecord> decode_frame(std::string_view file, const std::string& key) {
  if (file.size() < kFrameHeaderBytes || file.substr(0, kFrameMagic.size()) != kFrameMagic) return std::nullopt;
  FrameReader header(file.substr(kFrameMagic.size(), kFrameHeaderBytes - kFrameMagic.size()));
  auto format = header.uint(4), reserved = header.uint(4), length = header.uint(8);
  auto digest = header.bytes(kSha256Bytes);
  if (!format || *format != kFrameFormat || !reserved || *reserved != 0 || !length || !digest) return std::nullopt;
  std::string_view body = file.substr(kFrameHeaderBytes);
  if (*length != body.size()) return std::nullopt;
  auto h = sha256(body);
  if (std::memcmp(h.data(), digest->data(), h.size()) != 0) return std::nullopt;

  FrameReader r(body);
  auto stored_key = r.bytes(key.size());
  auto compiled = r.uint(1);
  if (!stored_key || *stored_key != key || !compiled || *compiled > 1) return std::nullopt;
  auto name_len = r.uint(4);
  auto name = name_len ? r.bytes(*name_len) : std::nullopt;
  auto log_len = name ? r.uint(8) : std::nullopt;
  auto log = log_len ? r.bytes(*log_len) : std::nullopt;
  auto art_len = log ? r.uint(8) : std::nullopt;
  auto art = art_len ? r.bytes(*art_len) : std::nullopt;
  if (!art || !r.at_end()) return std::nullopt;
  CacheRecord rec;
  rec.compiled = *compiled == 1;
  rec.artifact_name = std::string(*name);
  rec.log = std::string(*log);
  rec.artifact = std::string(*art);
  if (rec.compiled == rec.artifact_name.empty()) return std::nullopt;
  return rec;
}

// ---- running the compiler ------------------------------------------------------------------------

struct ProcessResult {
  bool timed_out = false;
  bool exited = false;     // exited normally (else: killed by a signal)
  int exit_code = 0;
  int signal = 0;
  std::string output;      // stdout and stderr, interleaved, at most kMaxLogBytes
  bool output_truncated = false;
};

class SpawnFileActions {
 public:
  SpawnFileActions() { ok_ = ::posix_spawn_file_actions_init(&fa_) == 0; }
  SpawnFileActions(const SpawnFileActions&) = delete;
  SpawnFileActions& operator=(const SpawnFileActions&) = delete;
  ~SpawnFileActions() {
    if (ok_) ::posix_spawn_file_actions_destroy(&fa_);
  }
  bool ok() const noexcept { return ok_; }
  posix_spawn_file_actions_t* get() noexcept { return &fa_; }

 private:
  posix_spawn_file_actions_t fa_{};
  bool ok_ = false;
};

class SpawnAttr {
 public:
  SpawnAttr() { ok_ = ::posix_spawnattr_init(&at_) == 0; }
  SpawnAttr(const SpawnAttr&) = delete;
  SpawnAttr& operator=(const SpawnAttr&) = delete;
  ~SpawnAttr() {
    if (ok_) ::posix_spawnattr_destroy(&at_);
  }
  bool ok() const noexcept { return ok_; }
  posix_spawnattr_t* get() noexcept { return &at_; }

 private:
  posix_spawnattr_t at_{};
  bool ok_ = false;
};

// A spawned process group: until reaped, destruction kills the whole group and reaps the leader,
// so no error path leaves a compiler running or a zombie behind.
class ChildGroup {
 public:
  explicit ChildGroup(pid_t pid) : pid_(pid) {}
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    if (pid_ <= 0) return;
    kill_group();
    int status = 0;
    (void)wait(&status);
  }
  pid_t pid() const noexcept { return pid_; }
  void kill_group() const noexcept {
    ::kill(-pid_, SIGKILL);  // the leader's pid is the group id (POSIX_SPAWN_SETPGROUP, 0)
    ::kill(pid_, SIGKILL);
  }
  // Blocks until the leader is gone; then nothing is left to clean up.
  bool wait(int* status) noexcept {
    if (pid_ <= 0) return false;
    pid_t r;
    do {
      r = ::waitpid(pid_, status, 0);
    } while (r < 0 && errno == EINTR);
    pid_ = -1;
    return r > 0;
  }

 private:
  pid_t pid_;
};

// Runs argv[0] (PATH search) in `dir` (if not empty), stdin from /dev/null, stdout and stderr into
// one pipe, in its own process group so the watchdog can kill the driver and every tool it started.
// The wait is a poll on the pipe and on a pidfd with the remaining budget as its timeout: no
// sleeping, and a compile that finishes early returns at once.
StatusOr<ProcessResult> run_process(const std::vector<std::string>& args, const std::string& dir, uint32_t budget_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(budget_ms);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return unavailable("cannot create a pipe: " + errno_text(errno));
  UniqueFd read_end(fds[0]), write_end(fds[1]);

  SpawnFileActions fa;
  SpawnAttr attr;
  if (!fa.ok() || !attr.ok()) return internal_error("posix_spawn setup failed");
  int rc = ::posix_spawn_file_actions_addopen(fa.get(), 0, "/dev/null", O_RDONLY, 0);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(fa.get(), write_end.get(), 1);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(fa.get(), write_end.get(), 2);
  if (rc == 0 && !dir.empty()) rc = ::posix_spawn_file_actions_addchdir_np(fa.get(), dir.c_str());
  // The host process (the worker) may block or ignore signals; the compiler must start clean.
  sigset_t empty_mask, defaults;
  sigemptyset(&empty_mask);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGCHLD, SIGALRM, SIGUSR1, SIGUSR2}) sigaddset(&defaults, s);
  if (rc == 0) rc = ::posix_spawnattr_setflags(attr.get(), POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (rc == 0) rc = ::posix_spawnattr_setpgroup(attr.get(), 0);
  if (rc == 0) rc = ::posix_spawnattr_setsigmask(attr.get(), &empty_mask);
  if (rc == 0) rc = ::posix_spawnattr_setsigdefault(attr.get(), &defaults);
  if (rc != 0) return internal_error("posix_spawn setup failed: " + errno_text(rc));

  pid_t pid = -1;
  rc = ::posix_spawnp(&pid, argv[0], fa.get(), attr.get(), argv.data(), environ);
  if (rc != 0) return unavailable("cannot run '" + args[0] + "': " + errno_text(rc));
  ChildGroup child(pid);
  write_end.reset();  // only the child holds the write end now: EOF means every writer is gone

  // A pidfd tells us when the driver exits even if a tool it started keeps the pipe open. Without
  // one (kernel before 5.3) we wait for EOF, then reap.
  UniqueFd pidfd;
#ifdef SYS_pidfd_open
  pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif

  ProcessResult result;
  bool pipe_open = true, leader_exited = false;
  std::array<char, 65536> buf;
  while (pipe_open || (!leader_exited && pidfd.valid())) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      result.timed_out = true;
      break;
    }
    // Rounded up, so a sub-millisecond remainder does not turn into a busy loop of poll(0).
    const auto left_ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    std::array<pollfd, 2> pfds{};
    nfds_t n = 0;
    const nfds_t pipe_slot = pipe_open ? n++ : 2;
    if (pipe_open) pfds[pipe_slot] = {read_end.get(), POLLIN, 0};
    const nfds_t pid_slot = !leader_exited && pidfd.valid() ? n++ : 2;
    if (pid_slot < 2) pfds[pid_slot] = {pidfd.get(), POLLIN, 0};
    int r = ::poll(pfds.data(), n, static_cast<int>(std::min<int64_t>(left_ms, INT32_MAX)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return internal_error("poll failed: " + errno_text(errno));
    if (pipe_slot < 2 && pfds[pipe_slot].revents != 0) {
      ssize_t got = ::read(read_end.get(), buf.data(), buf.size());
      if (got < 0 && errno != EINTR && errno != EAGAIN) return internal_error("reading the compiler's output failed: " + errno_text(errno));
      if (got == 0) pipe_open = false;
      if (got > 0) {
        // Keep draining past the cap: a compiler blocked on a full pipe would only time out.
        const size_t room = kMaxLogBytes - result.output.size();
        const size_t take = std::min(room, static_cast<size_t>(got));
        result.output.append(buf.data(), take);
        if (take < static_cast<size_t>(got)) result.output_truncated = true;
      }
    }
    if (pid_slot < 2 && pfds[pid_slot].revents != 0) leader_exited = true;
  }
  // On a timeout, everything goes. After a normal exit the leader is a zombie until reaped, so its
  // group id cannot be reused yet: killing the group now removes only tools it left behind.
  if (result.timed_out || leader_exited) child.kill_group();
  int status = 0;
  if (!child.wait(&status)) return internal_error("waitpid failed: " + errno_text(errno));
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  if (result.output_truncated) result.output += "\n[kforge: output truncated at 1 MiB]";
  return result;
}

// ---- the compile-option allow-list ----------------------------------------------------------------

bool all_of_chars(std::string_view s, std::string_view allowed_extra) {
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           allowed_extra.find(c) != std::string_view::npos;
  });
}

bool is_identifier(std::string_view s) {
  return !s.empty() && !(s[0] >= '0' && s[0] <= '9') && all_of_chars(s, "_");
}

bool starts_with_any(std::string_view s, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return s.substr(0, p.size()) == p; });
}

// Why `option` may not be passed to the compiler, or nullopt when it may.
std::optional<std::string> refuse_cpu_option(std::string_view o) {
  if (o == "-O0" || o == "-O1" || o == "-O2" || o == "-O3" || o == "-Os") return std::nullopt;
  if (o.substr(0, 7) == "-march=" || o.substr(0, 7) == "-mtune=") {
    std::string_view v = o.substr(7);
    if (v == "native") {
      return "the object would depend on the build host's CPU, which the cache key does not cover; name the "
             "architecture instead";
    }
    if (!v.empty() && all_of_chars(v, "-_.+")) return std::nullopt;
    return "not a CPU name";
  }
  if (o.substr(0, 5) == "-std=") {
    std::string_view v = o.substr(5);
    std::string_view lang = v.substr(0, v.substr(0, 3) == "gnu" ? 5 : 3);
    std::string_view year = v.substr(lang.size());
    if ((lang == "c++" || lang == "gnu++") &&
        (year == "11" || year == "14" || year == "17" || year == "20" || year == "23" || year == "26" ||
         year == "1z" || year == "2a" || year == "2b" || year == "2c")) {
      return std::nullopt;
    }
    return "not a C++ standard (c++XX or gnu++XX)";
  }
  if (o.substr(0, 2) == "-D" || o.substr(0, 2) == "-U") {
    std::string_view rest = o.substr(2);
    std::string_view name = o[1] == 'D' ? rest.substr(0, rest.find('=')) : rest;
    if (!is_identifier(name)) return "not a macro name";
    // The value travels as one argv element (no shell), so only control characters are a concern.
    if (std::any_of(rest.begin(), rest.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      return "control characters in the macro";
    }
    return std::nullopt;
  }
  if (o.substr(0, 2) == "-f") {
    const std::string_view body = o.substr(2);
    const bool negative = body.substr(0, 3) == "no-";
    const std::string_view feature = negative ? body.substr(3) : body;
    const std::string_view name = feature.substr(0, feature.find('='));
    const std::string_view value = feature.size() > name.size() ? feature.substr(name.size() + 1) : std::string_view();
    if (name.empty() || !all_of_chars(name, "-+") || !all_of_chars(value, "-_.,+:")) {
      // No '/' in a value: a -f option cannot name a path outside the build directory.
      return "not a -f<feature>[=value] switch";
    }
    if (starts_with_any(name, {"plugin", "dump", "profile", "auto-profile", "use-ld", "ld-path"})) {
      return "loads or writes files outside the compile";
    }
    if (!negative && starts_with_any(name, {"fast-math", "unsafe-math-optimizations", "finite-math-only",
                                            "associative-math", "reciprocal-math", "cx-limited-range",
                                            "cx-fortran-rules"})) {
      return "changes floating-point results, and kforge does not trade accuracy for speed";
    }
    if (negative && starts_with_any(name, {"signed-zeros", "honor-nans", "honor-infinities"})) {
      return "changes floating-point results, and kforge does not trade accuracy for speed";
    }
    return std::nullopt;
  }
  return "not on the allow-list (-O0..-O3, -Os, -march=, -mtune=, -f<feature>, -fno-<feature>, -D<name>[=value], "
         "-U<name>, -std=c++XX)";
}

// NVRTC's options that trade accuracy for speed, refused for the same reason as on the CPU.
std::optional<std::string> refuse_cuda_option(std::string_view o) {
  std::string_view bare = o.substr(0, 2) == "--" ? o.substr(2) : o.substr(0, 1) == "-" ? o.substr(1) : o;
  if (bare == "use_fast_math" || bare == "ftz=true" || bare == "prec-div=false" || bare == "prec-sqrt=false") {
    return "changes floating-point results, and kforge does not trade accuracy for speed";
  }
  return std::nullopt;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// "refused: the object imports a, b and needs libx.so.1 (...)".
std::string refusal_text(const std::vector<std::string>& bad) {
  std::vector<std::string> imports, needs;
  for (const std::string& b : bad) {
    if (b.substr(0, 6) == "needs ") {
      needs.push_back(b.substr(6));
    } else {
      imports.push_back(b);
    }
  }
  std::string out = "refused: the object";
  if (!imports.empty()) out += " imports " + join(imports);
  if (!needs.empty()) out += std::string(imports.empty() ? "" : " and") + " needs " + join(needs);
  return out + " (CPU kernels may call only the math library and memcpy/memmove/memset)";
}

}  // namespace

// ---- CpuCompiler -----------------------------------------------------------------------------------

StatusOr<CpuCompiler> CpuCompiler::detect(const std::string& command) {
  CpuCompiler c;
  c.command = command.empty() ? "c++" : command;
  StatusOr<ProcessResult> r = run_process({c.command, "--version"}, "", kDetectBudgetMs);
  if (!r.ok()) return unavailable("no C++ compiler: " + r.status().message());
  const std::string first_line = r->output.substr(0, r->output.find('\n'));
  if (r->timed_out) return unavailable("no C++ compiler: '" + c.command + " --version' did not finish in 10 s");
  if (!r->exited || r->exit_code != 0) {
    return unavailable("no C++ compiler: '" + c.command + " --version' failed (" +
                       (r->exited ? "exit status " + std::to_string(r->exit_code) : "signal " + std::to_string(r->signal)) +
                       "): " + first_line);
  }
  if (first_line.empty()) return unavailable("no C++ compiler: '" + c.command + " --version' printed nothing");
  c.identity = first_line;
  return c;
}

// ---- CandidateBuilder -------------------------------------------------------------------------------

StatusOr<CandidateBuilder> CandidateBuilder::for_cpu(std::string cache_dir, CpuCompiler compiler) {
  if (compiler.command.empty() || compiler.identity.empty()) {
    return invalid_argument("CPU builder: the compiler needs a command and an identity (CpuCompiler::detect)");
  }
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  KFORGE_RETURN_IF_ERROR(make_cache_dir(cache_dir));
  KFORGE_RETURN_IF_ERROR(ensure_private_dir(cache_dir + "/tmp"));
  CandidateBuilder b;
  b.cache_dir_ = std::move(cache_dir);
  b.identity_ = "cpu " + compiler.identity;
  b.cpu_ = std::move(compiler);
  return b;
}

StatusOr<CandidateBuilder> CandidateBuilder::for_cuda(std::string cache_dir, const Nvrtc* nvrtc, int sm_major, int sm_minor) {
  if (nvrtc == nullptr) return invalid_argument("CUDA builder: no NVRTC");
  if (sm_major <= 0 || sm_minor < 0 || sm_minor > 9) {
    return invalid_argument("CUDA builder: bad compute capability " + std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  KFORGE_RETURN_IF_ERROR(make_cache_dir(cache_dir));
  KFORGE_RETURN_IF_ERROR(ensure_private_dir(cache_dir + "/tmp"));
  CandidateBuilder b;
  b.cache_dir_ = std::move(cache_dir);
  b.identity_ = "cuda sm_" + std::to_string(sm_major * 10 + sm_minor) + " nvrtc " +
                std::to_string(nvrtc->version().major) + "." + std::to_string(nvrtc->version().minor);
  b.nvrtc_ = nvrtc;
  b.sm_major_ = sm_major;
  b.sm_minor_ = sm_minor;
  b.cuda_ = true;
  return b;
}

StatusOr<BuildOutput> CandidateBuilder::build(const KernelSpec& spec, uint32_t budget_ms) const {
  const auto t0 = std::chrono::steady_clock::now();
  const Backend want = cuda_ ? Backend::kCuda : Backend::kCpu;
  if (spec.backend != want) {
    return invalid_argument("a " + std::string(backend_name(want)) + " builder cannot build a " +
                            std::string(backend_name(spec.backend)) + " kernel");
  }
  BuildOutput out;
  out.key = cache_key(spec, identity_);
  auto finish = [&](BuildOutput o) {
    o.build_ms = ms_since(t0);
    return o;
  };

  // Refused options are decided before anything touches the disk (Note [Build cache files]).
  for (const std::string& option : spec.compile_options) {
    std::optional<std::string> why = cuda_ ? refuse_cuda_option(option) : refuse_cpu_option(option);
    if (why) {
      out.log = "compile option '" + option + "' is not allowed: " + *why;
      return finish(std::move(out));
    }
  }

  const std::string fanout = cache_dir_ + "/" + out.key.substr(0, 2);
  const std::string entry_path = fanout + "/" + out.key + ".art";
  StatusOr<std::string> file = file_io::read_file(entry_path, kMaxArtifactFileBytes);
  if (file.ok()) {
    if (std::optional<CacheRecord> rec = decode_frame(*file, out.key)) {
      out.compiled = rec->compiled;
      out.artifact_name = std::move(rec->artifact_name);
      out.artifact = std::move(rec->artifact);
      out.log = std::move(rec->log);
      out.cached = true;
      return finish(std::move(out));
    }
    // Damaged: fall through, rebuild, and let the rename below replace it.
  } else if (file.status().code() != StatusCode::kNotFound && file.status().code() != StatusCode::kInvalidArgument) {
    // kInvalidArgument (a symbolic link, not a regular file, oversized) is damage as well, and
    // rename replaces a link rather than following it; anything else is the disk failing.
    return file.status();
  }

  CacheRecord rec;
  bool cacheable = true;
  if (cuda_) {
    // NVRTC compiles inside this process and cannot be interrupted, so budget_ms does not apply
    // here: the worker's supervisor (WorkerProcess) kills the whole worker when a phase overruns.
    StatusOr<CompiledKernel> k = nvrtc_->compile(spec.source, "kernel.cu", spec.compile_options, sm_major_, sm_minor_);
    if (k.ok()) {
      rec.compiled = true;
      rec.artifact_name = std::string(image_kind_name(k->kind));
      rec.artifact.assign(reinterpret_cast<const char*>(k->image.data()), k->image.size());
      rec.log = std::move(k->log);
    } else if (k.status().code() == StatusCode::kInvalidArgument) {
      rec.log = k.status().message();
    } else {
      return k.status();  // NVRTC itself failed (out of memory, internal error): not the source's fault
    }
  } else {
    KFORGE_ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::create());
    KFORGE_RETURN_IF_ERROR(ensure_private_dir(dir.path() + "/runtime"));
    KFORGE_RETURN_IF_ERROR(file_io::write_new_file(dir.path() + "/runtime/cpu_kernel_abi.h", kCpuKernelAbiHeaderText));
    KFORGE_RETURN_IF_ERROR(file_io::write_new_file(dir.path() + "/kernel.cc", spec.source));
    std::vector<std::string> args = {cpu_.command};
    args.insert(args.end(), kFixedCpuFlags.begin(), kFixedCpuFlags.end());
    args.push_back("-I" + dir.path());
    args.insert(args.end(), spec.compile_options.begin(), spec.compile_options.end());
    args.insert(args.end(), {"kernel.cc", "-o", "kernel.so"});
    StatusOr<ProcessResult> run = run_process(args, dir.path(), budget_ms);
    if (!run.ok()) return unavailable("CPU build: " + run.status().message());
    rec.log = std::move(run->output);
    if (run->timed_out) {
      rec.log += std::string(rec.log.empty() || rec.log.back() == '\n' ? "" : "\n") +
                 "kforge: the compiler was killed: it outlived its budget of " + std::to_string(budget_ms) + " ms";
      cacheable = false;
    } else if (!run->exited) {
      rec.log += std::string(rec.log.empty() || rec.log.back() == '\n' ? "" : "\n") +
                 "kforge: the compiler was killed by signal " + std::to_string(run->signal);
      cacheable = false;
    } else if (run->exit_code == 0) {
      StatusOr<std::string> so = file_io::read_file(dir.path() + "/kernel.so", kMaxArtifactFileBytes);
      if (!so.ok()) {
        rec.log += "\nkforge: the compiler exited 0 but left no usable kernel.so: " + so.status().message();
      } else if (StatusOr<std::vector<std::string>> bad = forbidden_imports(*so); !bad.ok()) {
        rec.log += std::string(rec.log.empty() ? "" : "\n") + "refused: " + bad.status().message();
      } else if (!bad->empty()) {
        rec.log += std::string(rec.log.empty() ? "" : "\n") + refusal_text(*bad);
      } else {
        rec.compiled = true;
        rec.artifact_name = "so";
        rec.artifact = std::move(*so);
      }
    }
  }

  if (cacheable) {
    // Installed by rename after fsync (Note [Build cache files]); a unique temporary name per
    // writer, so concurrent builders of one key never write the same file.
    KFORGE_RETURN_IF_ERROR(ensure_private_dir(fanout));
    uint8_t rnd[8];
    randombytes_buf(rnd, sizeof rnd);
    const std::string tmp = cache_dir_ + "/tmp/" + out.key + "." + std::to_string(::getpid()) + "." + file_io::to_hex(rnd, sizeof rnd);
    const std::string frame = encode_frame(out.key, rec);
    {
      UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd.valid()) return io_error("cannot create", tmp, errno);
      Status s = write_all(fd.get(), frame, tmp);
      if (s.ok() && ::fsync(fd.get()) != 0) s = io_error("cannot fsync", tmp, errno);
      if (s.ok() && ::rename(tmp.c_str(), entry_path.c_str()) != 0) s = io_error("cannot rename into", entry_path, errno);
      if (!s.ok()) {
        ::unlink(tmp.c_str());
        return s;
      }
    }
    KFORGE_RETURN_IF_ERROR(fsync_dir(fanout));
  }

  out.compiled = rec.compiled;
  out.artifact_name = std::move(rec.artifact_name);
  out.artifact = std::move(rec.artifact);
  out.log = std::move(rec.log);
  return finish(std::move(out));
}

}  // namespace kforge

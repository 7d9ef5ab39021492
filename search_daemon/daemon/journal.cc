#include "search_daemon/daemon/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "runtime/msgpack_codec.h"

namespace kforge::daemon {

namespace {

namespace fs = std::filesystem;
using codec::Packer;
using codec::Reader;

constexpr uint32_t kJournalVersion = 1;
constexpr size_t kRecordHeader = 12;                 // u32 length + u64 hash
constexpr size_t kMaxRecord = 8u << 20;              // a node with a 1 MiB source and its plan fits
constexpr size_t kMaxSharedGpuPids = 4096;           // an outcome's shared_gpu_pids

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

uint64_t payload_hash(std::string_view payload) { return hash128(payload).lo; }

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

std::string journal_dir(const std::string& state_dir) { return state_dir + "/journal"; }

Status make_private_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return unavailable("cannot create " + dir + ": " + ec.message());
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return unavailable(errno_text("lstat " + dir));
  if (!S_ISDIR(st.st_mode)) return invalid_argument(dir + " is not a directory (a symlink?)");
  if (st.st_uid != ::getuid()) return invalid_argument(dir + " belongs to another user");
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0) return unavailable(errno_text("chmod 0700 " + dir));
  return Status();
}

Status apply_record(std::string_view payload, SearchJournal::Contents& c, size_t index, const std::string& where) {
  codec::Limits limits;
  limits.max_bytes = kMaxRecord;
  limits.max_bin = kMaxRecord;
  limits.max_str = kMaxRecord;   // a node's origin (Move::origin)
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle h, codec::parse(payload, limits));
  const Reader r(h.get(), where + " record " + std::to_string(index));
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n < 1) return r.error("empty record");
  KFORGE_ASSIGN_OR_RETURN(std::string kind, r.at(0).str(16));
  if (index == 0 && kind != "search") return r.error("the first record is not the search header");
  if (kind == "search") {
    if (index != 0) return r.error("a second search header");
    KFORGE_RETURN_IF_ERROR(r.expect_array(5, 64));
    KFORGE_ASSIGN_OR_RETURN(uint64_t version, r.field(1, "version").u64());
    if (version != kJournalVersion) return r.error("journal version " + std::to_string(version) + " is not " + std::to_string(kJournalVersion));
    KFORGE_ASSIGN_OR_RETURN(std::string sig, r.field(2, "signature").bin(1u << 20));
    KFORGE_ASSIGN_OR_RETURN(c.signature, OpSignature::decode(sig));
    KFORGE_ASSIGN_OR_RETURN(c.strategy, r.field(3, "strategy").str(64));
    KFORGE_ASSIGN_OR_RETURN(int64_t created, r.field(4, "created_unix_ms").i64());
    c.created_unix_ms = created > 0 ? static_cast<uint64_t>(created) : 0;
    return Status();
  }
  if (kind == "node") {
    KFORGE_RETURN_IF_ERROR(r.expect_array(7, 64));
    KFORGE_ASSIGN_OR_RETURN(uint64_t id, r.field(1, "id").u64());
    KFORGE_ASSIGN_OR_RETURN(uint64_t parent, r.field(2, "parent").u64());
    search::Move m;
    KFORGE_ASSIGN_OR_RETURN(m.proposer, r.field(3, "proposer").str(256));
    KFORGE_ASSIGN_OR_RETURN(m.label, r.field(4, "label").str(4096));
    KFORGE_ASSIGN_OR_RETURN(m.prior, r.field(5, "prior").f64());
    KFORGE_ASSIGN_OR_RETURN(std::string spec, r.field(6, "spec").bin(kMaxRecord));
    KFORGE_ASSIGN_OR_RETURN(m.spec, KernelSpec::decode(spec));
    KFORGE_ASSIGN_OR_RETURN(size_t node_fields, r.array_size());
    if (node_fields > 7) {   // appended later: journals of older daemons have no origin
      KFORGE_ASSIGN_OR_RETURN(m.origin, r.field(7, "origin").str(kMaxRecord));
    }
    if (parent >= c.tree.size()) return r.error("parent " + std::to_string(parent) + " is not an earlier node");
    const uint64_t got = c.tree.add(parent, std::move(m));
    if (got != id) return r.error("node " + std::to_string(id) + " replayed as " + std::to_string(got) + " (a duplicate spec?)");
    return Status();
  }
  if (kind == "submit") {
    KFORGE_RETURN_IF_ERROR(r.expect_array(2, 64));
    KFORGE_ASSIGN_OR_RETURN(uint64_t id, r.field(1, "id").u64());
    if (id == 0 || id >= c.tree.size()) return r.error("submit of unknown node " + std::to_string(id));
    if (!c.tree.node(id).outcome) c.tree.node(id).virtual_loss = 1;
    return Status();
  }
  if (kind == "outcome") {
    KFORGE_RETURN_IF_ERROR(r.expect_array(11, 64));
    KFORGE_ASSIGN_OR_RETURN(uint64_t id, r.field(1, "id").u64());
    if (id == 0 || id >= c.tree.size()) return r.error("outcome of unknown node " + std::to_string(id));
    search::Outcome o;
    KFORGE_ASSIGN_OR_RETURN(uint64_t status, r.field(2, "status").u64());
    if (status > static_cast<uint64_t>(eval::EvalStatus::kWorkerError)) return r.error("unknown status " + std::to_string(status));
    o.status = static_cast<eval::EvalStatus>(status);
    KFORGE_ASSIGN_OR_RETURN(o.speedup, r.field(3, "speedup").f64());
    KFORGE_ASSIGN_OR_RETURN(o.noise_band, r.field(4, "noise_band").f64());
    KFORGE_ASSIGN_OR_RETURN(o.significant, r.field(5, "significant").boolean());
    KFORGE_ASSIGN_OR_RETURN(o.baseline_ns, r.field(6, "baseline_ns").f64());
    KFORGE_ASSIGN_OR_RETURN(o.candidate_ns, r.field(7, "candidate_ns").f64());
    KFORGE_ASSIGN_OR_RETURN(o.failed_check, r.field(8, "failed_check").str(256));
    KFORGE_ASSIGN_OR_RETURN(o.message, r.field(9, "message").str(1u << 16));
    KFORGE_ASSIGN_OR_RETURN(o.build_log, r.field(10, "build_log").str(1u << 20));
    KFORGE_ASSIGN_OR_RETURN(size_t fields, r.array_size());
    if (fields > 11) {
      const Reader pids = r.field(11, "shared_gpu_pids");
      KFORGE_ASSIGN_OR_RETURN(size_t npids, pids.array_size());
      if (npids > kMaxSharedGpuPids) return pids.error(std::to_string(npids) + " pids exceed " + std::to_string(kMaxSharedGpuPids));
      for (size_t i = 0; i < npids; ++i) {
        KFORGE_ASSIGN_OR_RETURN(int64_t pid, pids.at(i).i64_in(1, INT32_MAX));
        o.shared_gpu_pids.push_back(static_cast<int32_t>(pid));
      }
    }
    if (fields > 12) {
      KFORGE_ASSIGN_OR_RETURN(o.implausible, r.field(12, "implausible").str(1u << 16));
    }
    if (fields > 16) {   // journals written before these were kept have 13 fields
      KFORGE_ASSIGN_OR_RETURN(o.baseline_spread, r.field(13, "baseline_spread").f64());
      KFORGE_ASSIGN_OR_RETURN(o.candidate_spread, r.field(14, "candidate_spread").f64());
      KFORGE_ASSIGN_OR_RETURN(o.torch_max_abs_error, r.field(15, "torch_max_abs_error").f64());
      KFORGE_ASSIGN_OR_RETURN(o.torch_rel_error, r.field(16, "torch_rel_error").f64());
    }
    if (fields > 17) {   // journals written before it was kept have 17 fields
      KFORGE_ASSIGN_OR_RETURN(o.finished_unix_ms, r.field(17, "finished_unix_ms").u64());
    }
    c.tree.set_outcome(id, std::move(o));
    c.tree.node(id).virtual_loss = 0;
    return Status();
  }
  if (kind == "done") {
    KFORGE_RETURN_IF_ERROR(r.expect_array(2, 64));
    KFORGE_ASSIGN_OR_RETURN(c.done_reason, r.field(1, "reason").str(4096));
    c.done = true;
    return Status();
  }
  return r.error("unknown record kind '" + kind + "'");
}

// Reads whole records from `bytes`; returns the offset just past the last good one. Only the last
// record can be torn (every earlier one was fdatasync'ed before the next was written): a short
// header or payload at the end, or a last record whose hash fails, ends the replay there. A bad
// record with more records after it is corruption: an error naming the file and the offset, and
// the file is left as it is for inspection.
Status replay(std::string_view bytes, SearchJournal::Contents& c, const std::string& where, size_t* good_end) {
  size_t pos = 0;
  *good_end = 0;
  while (pos + kRecordHeader <= bytes.size()) {
    const uint64_t len = get_le(bytes.data() + pos, 4);
    const uint64_t hash = get_le(bytes.data() + pos + 4, 8);
    const std::string at = where + ": byte " + std::to_string(pos);
    if (len == 0 || len > kMaxRecord) return invalid_argument(at + ": a record length of " + std::to_string(len) + " (corrupt journal)");
    if (pos + kRecordHeader + len > bytes.size()) break;   // torn: the tail of the last write is missing
    const std::string_view payload = bytes.substr(pos + kRecordHeader, len);
    if (payload_hash(payload) != hash) {
      if (pos + kRecordHeader + len == bytes.size()) break;   // the last record, never synced whole
      return invalid_argument(at + ": a record fails its hash and more follow (corrupt journal)");
    }
    KFORGE_RETURN_IF_ERROR(apply_record(payload, c, c.records, where));
    ++c.records;
    pos += kRecordHeader + len;
    *good_end = pos;
  }
  return Status();
}

StatusOr<std::string> read_all(int fd, const std::string& path) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return unavailable(errno_text("read " + path));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

std::vector<std::string> SearchJournal::list(const std::string& state_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(journal_dir(state_dir), ec)) {
    if (e.path().extension() == ".kfj") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<SearchJournal::Contents> SearchJournal::read(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return not_found(errno_text("open " + path));
  KFORGE_ASSIGN_OR_RETURN(std::string bytes, read_all(fd.get(), path));
  Contents c;
  size_t good = 0;
  KFORGE_RETURN_IF_ERROR(replay(bytes, c, path, &good));
  if (c.records == 0) return invalid_argument(path + ": no search header");
  c.truncated_bytes = bytes.size() - good;
  return c;
}

std::string SearchJournal::path_for(const std::string& state_dir, const SignatureId& id) {
  return journal_dir(state_dir) + "/" + id.hex() + ".kfj";
}

StatusOr<SearchJournal> SearchJournal::open(const std::string& state_dir, const OpSignature& sig,
                                            const std::string& strategy) {
  const std::string dir = journal_dir(state_dir);
  KFORGE_RETURN_IF_ERROR(make_private_dir(state_dir));
  KFORGE_RETURN_IF_ERROR(make_private_dir(dir));
  SearchJournal j;
  j.path_ = path_for(state_dir, sig.id());
  j.fd_ = UniqueFd(::open(j.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!j.fd_.valid()) return unavailable(errno_text("open " + j.path_));
  KFORGE_ASSIGN_OR_RETURN(std::string bytes, read_all(j.fd_.get(), j.path_));
  size_t good = 0;
  KFORGE_RETURN_IF_ERROR(replay(bytes, j.contents_, j.path_, &good));
  if (j.contents_.records > 0 && !(j.contents_.signature == sig)) {
    return invalid_argument(j.path_ + ": the journal is of another signature (" + j.contents_.signature.to_string() + ")");
  }
  j.contents_.truncated_bytes = bytes.size() - good;
  if (good != bytes.size()) {
    // A torn tail: cut it off so appends continue from the last whole record.
    if (::ftruncate(j.fd_.get(), static_cast<off_t>(good)) != 0) return unavailable(errno_text("ftruncate " + j.path_));
  }
  if (::lseek(j.fd_.get(), static_cast<off_t>(good), SEEK_SET) < 0) return unavailable(errno_text("lseek " + j.path_));
  if (j.contents_.records == 0) {
    j.contents_.signature = sig;
    j.contents_.strategy = strategy;
    msgpack::sbuffer buf;
    Packer pk(buf);
    pk.pack_array(5);
    pk.pack_text("search");
    pk.pack_uint32(kJournalVersion);
    pk.pack_bytes(sig.encode());
    pk.pack_text(strategy);
    pk.pack_int64(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
    KFORGE_RETURN_IF_ERROR(j.append(std::string(buf.data(), buf.size())));
  }
  return j;
}

Status SearchJournal::append(const std::string& payload) {
  if (payload.size() > kMaxRecord) return invalid_argument(path_ + ": a record of " + std::to_string(payload.size()) + " bytes is too large");
  std::string rec;
  rec.reserve(kRecordHeader + payload.size());
  put_le(rec, payload.size(), 4);
  put_le(rec, payload_hash(payload), 8);
  rec += payload;
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t n = ::write(fd_.get(), rec.data() + done, rec.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return unavailable(errno_text("write " + path_));
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd_.get()) != 0) return unavailable(errno_text("fdatasync " + path_));
  ++contents_.records;
  return Status();
}

Status SearchJournal::append_node(const search::Node& node) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(8);
  pk.pack_text("node");
  pk.pack_uint64(node.id);
  pk.pack_uint64(node.parent);
  pk.pack_text(node.move.proposer);
  pk.pack_text(node.move.label);
  pk.pack_f64(node.move.prior);
  pk.pack_bytes(node.move.spec.encode());
  pk.pack_text(node.move.origin.size() <= kMaxRecord / 2 ? node.move.origin : std::string());
  return append(std::string(buf.data(), buf.size()));
}

Status SearchJournal::append_submitted(uint64_t id) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(2);
  pk.pack_text("submit");
  pk.pack_uint64(id);
  return append(std::string(buf.data(), buf.size()));
}

Status SearchJournal::append_outcome(uint64_t id, const search::Outcome& o) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(18);
  pk.pack_text("outcome");
  pk.pack_uint64(id);
  pk.pack_uint8(static_cast<uint8_t>(o.status));
  pk.pack_f64(o.speedup);
  pk.pack_f64(o.noise_band);
  pk.pack(o.significant);
  pk.pack_f64(o.baseline_ns);
  pk.pack_f64(o.candidate_ns);
  pk.pack_text(o.failed_check);
  pk.pack_text(o.message.substr(0, 1u << 16));
  pk.pack_text(o.build_log.substr(0, 1u << 20));
  const size_t npids = std::min(o.shared_gpu_pids.size(), kMaxSharedGpuPids);
  pk.pack_array(static_cast<uint32_t>(npids));
  for (size_t i = 0; i < npids; ++i) pk.pack_int32(o.shared_gpu_pids[i]);
  pk.pack_text(o.implausible.substr(0, 1u << 16));
  pk.pack_f64(o.baseline_spread);
  pk.pack_f64(o.candidate_spread);
  pk.pack_f64(o.torch_max_abs_error);
  pk.pack_f64(o.torch_rel_error);
  pk.pack_uint64(o.finished_unix_ms);
  return append(std::string(buf.data(), buf.size()));
}

Status SearchJournal::append_done(const std::string& reason) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(2);
  pk.pack_text("done");
  pk.pack_text(reason.substr(0, 4096));
  const Status s = append(std::string(buf.data(), buf.size()));
  if (s.ok()) {
    contents_.done = true;
    contents_.done_reason = reason;
  }
  return s;
}

}  // namespace kforge::daemon

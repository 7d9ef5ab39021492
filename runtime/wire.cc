#include "runtime/wire.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>

#include "runtime/msgpack_codec.h"

namespace kforge::wire {

// Note [Decode memory bound]
// msgpack-c builds the whole object tree before we look at it: 24 bytes per element, allocated
// as soon as an array's header is read, before its elements arrive. Its per-array limit bounds
// one array, not the total: a 4 MiB message of one-byte elements would cost ~100 MiB, and every
// array header costs its declared length even when the message ends right after it. So decode()
// works in three steps:
//   1. peek at the envelope head (magic, version, type) without parsing the body: refuse an
//      unsupported version at once, and pick the byte limit (64 MiB for CapturedInputs, 4 MiB for
//      everything else), checked before anything is parsed;
//   2. scan the bytes once with a counting visitor that allocates nothing, adding up every
//      declared array length (map pairs count twice). Every element takes at least one byte, so a
//      valid message declares at most as many elements as it has bytes; the scan stops at the
//      first header that breaks min(bytes, per-type cap) or nests deeper than kMaxDepth;
//   3. only then build the tree and read it field by field.
// Peak memory is therefore about 2 x the message (string/bin copies in the tree and in the
// result) plus ~32 bytes per element, with elements capped at kMaxElements (2 Mi, so ~64 MiB)
// for control messages and kMaxCapturedElements (64 Ki) for CapturedInputs, whose bulk is bins.
// (Measured: a 2 MiB message of 2 Mi one-byte elements peaks at ~48 MiB RSS.)

namespace {

using codec::open_record;
using codec::Packer;
using codec::read_f64;
using codec::read_str;
using codec::read_uint;
using codec::Reader;

constexpr size_t kMaxDepth = 16;                 // envelope..tensor sizes is 10 levels
constexpr size_t kMaxElements = 2u << 20;
constexpr size_t kMaxCapturedElements = 64u << 10;
constexpr size_t kSignatureIdBytes = 16;

// ---- step 1: choose the limits ----------------------------------------------------------------

struct EnvelopeHead {
  uint64_t version = 0;
  uint64_t type = 0;
};

// The version and type of a message that starts like a kforge envelope, without parsing the
// body. Anything odd answers nullopt: the message then gets the smaller limits and the full
// decode says what is wrong with it.
std::optional<EnvelopeHead> peek_head(std::string_view bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t off = 0;
  uint64_t count = 0;
  if (n >= 1 && (p[0] & 0xf0u) == 0x90u) {
    count = p[0] & 0x0fu;
    off = 1;
  } else if (n >= 3 && p[0] == 0xdc) {
    count = (uint64_t{p[1]} << 8) | p[2];
    off = 3;
  } else if (n >= 5 && p[0] == 0xdd) {
    count = (uint64_t{p[1]} << 24) | (uint64_t{p[2]} << 16) | (uint64_t{p[3]} << 8) | p[4];
    off = 5;
  } else {
    return std::nullopt;
  }
  if (count != 4) return std::nullopt;
  try {
    // Scalars only: arrays and maps are refused outright and strings capped, so this allocates
    // a few small zones at most.
    msgpack::unpack_limit lim(/*array=*/0, /*map=*/0, /*str=*/64, /*bin=*/64, /*ext=*/0, /*depth=*/1);
    msgpack::object_handle magic = msgpack::unpack(bytes.data(), n, off, nullptr, nullptr, lim);
    msgpack::object_handle version = msgpack::unpack(bytes.data(), n, off, nullptr, nullptr, lim);
    msgpack::object_handle type = msgpack::unpack(bytes.data(), n, off, nullptr, nullptr, lim);
    const msgpack::object& m = magic.get();
    const msgpack::object& v = version.get();
    const msgpack::object& t = type.get();
    if (m.type != msgpack::type::STR || std::string_view(m.via.str.ptr, m.via.str.size) != kWireMagic ||
        v.type != msgpack::type::POSITIVE_INTEGER || t.type != msgpack::type::POSITIVE_INTEGER) {
      return std::nullopt;
    }
    return EnvelopeHead{v.via.u64, t.via.u64};
  } catch (...) {
    return std::nullopt;
  }
}

bool supported_version(int64_t v) { return v >= kMinWireVersion && v <= kWireVersion; }

std::string unsupported_version(const std::string& v) {
  const std::string supported = kMinWireVersion == kWireVersion
                                    ? std::to_string(kWireVersion)
                                    : std::to_string(kMinWireVersion) + " to " + std::to_string(kWireVersion);
  return "envelope.version: unsupported wire protocol version " + v + "; this build supports version " +
         supported;
}

// ---- step 2: bound the tree before building it --------------------------------------------------

class ElementBudget : public msgpack::null_visitor {
 public:
  ElementBudget(size_t budget, size_t cap) : budget_(budget), cap_(cap) {}

  bool start_array(uint32_t n) { return open(n); }
  bool end_array() { --depth_; return true; }
  bool start_map(uint32_t n) { return open(uint64_t{n} * 2); }
  bool end_map() { --depth_; return true; }

  // Empty when the scan found nothing over the limits (it may still have found malformed bytes,
  // which the full parse reports with its own reason).
  Status verdict(size_t message_bytes) const {
    if (too_deep_) return out_of_range("message nests deeper than " + std::to_string(kMaxDepth) + " levels");
    if (over_) {
      if (budget_ == cap_) {
        return out_of_range("message declares at least " + std::to_string(declared_) +
                            " array elements, over the limit of " + std::to_string(cap_));
      }
      return invalid_argument("message declares at least " + std::to_string(declared_) +
                              " array elements but has only " + std::to_string(message_bytes) +
                              " bytes");
    }
    return Status();
  }

 private:
  bool open(uint64_t elements) {
    if (++depth_ > kMaxDepth) {
      too_deep_ = true;
      return false;
    }
    declared_ += elements;
    if (declared_ > budget_) {
      over_ = true;
      return false;
    }
    return true;
  }

  size_t budget_;
  size_t cap_;
  uint64_t declared_ = 0;
  size_t depth_ = 0;
  bool over_ = false;
  bool too_deep_ = false;
};

Status check_element_budget(std::string_view bytes, size_t cap) {
  ElementBudget budget(std::min(bytes.size(), cap), cap);
  try {
    size_t off = 0;
    (void)msgpack::parse(bytes.data(), bytes.size(), off, budget);
  } catch (...) {
    // Malformed bytes: codec::parse reports them with its own reason.
  }
  return budget.verdict(bytes.size());
}

// ---- step 3: fields -------------------------------------------------------------------------------

Reader field(const Reader& record, size_t i, std::string_view name) {
  return Reader(record.at(i).object(), record.path() + "." + std::string(name));
}

Status read_pid(const Reader& r, int32_t* out) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, r.i64_in(1, std::numeric_limits<int32_t>::max()));
  *out = static_cast<int32_t>(v);
  return Status();
}

Status read_arg_index(const Reader& r, uint32_t* out) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, r.i64_in(0, kMaxArgIndex));
  *out = static_cast<uint32_t>(v);
  return Status();
}

Status read_backend(const Reader& r, Backend* out) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, r.i64_in(0, static_cast<int64_t>(Backend::kCuda)));
  *out = static_cast<Backend>(v);
  return Status();
}

Status read_id(const Reader& r, SignatureId* out) {
  KFORGE_ASSIGN_OR_RETURN(std::string b, r.bin(kSignatureIdBytes));
  if (b.size() != kSignatureIdBytes) {
    return r.error("expected a 16-byte id, got " + std::to_string(b.size()) + " bytes");
  }
  auto half = [&b](size_t first) {
    uint64_t v = 0;
    for (size_t i = first; i < first + 8; ++i) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  };
  out->hi = half(0);
  out->lo = half(8);
  return Status();
}

Status read_entry_key(const Reader& r, std::string* out) {
  KFORGE_ASSIGN_OR_RETURN(*out, r.str(kMaxEntryKeyChars));
  if (out->empty()) return r.error("empty entry key");
  for (char c : *out) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return r.error("entry key must be lowercase hex digits");
    }
  }
  return Status();
}

// Reads a list of at most `max` records; the list length is checked before anything is reserved.
template <typename T, typename ReadOne>
Status read_list(const Reader& r, size_t max, std::vector<T>* out, ReadOne read_one) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n > max) {
    return r.error(std::to_string(n) + " elements exceed the limit of " + std::to_string(max));
  }
  out->clear();
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    KFORGE_RETURN_IF_ERROR(read_one(r.at(i), &out->emplace_back()));
  }
  return Status();
}

// A GPU UUID: 1..kMaxGpuUuidChars letters, digits and '-'. The daemon logs and serves these
// strings, so nothing else (no spaces, quotes or control characters) gets through.
Status read_gpu_uuid(const Reader& r, std::string* out) {
  KFORGE_ASSIGN_OR_RETURN(*out, r.str(kMaxGpuUuidChars));
  if (out->empty()) return r.error("empty GPU UUID");
  for (char c : *out) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-')) {
      return r.error("not a GPU UUID (expected letters, digits and '-', like \"GPU-5e2a910c-d34f-...\")");
    }
  }
  return Status();
}

Status read_device(const Reader& r, DeviceInfo* d) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 5));
  KFORGE_ASSIGN_OR_RETURN(int64_t index, field(r, 0, "index").i64_in(0, kMaxDeviceIndex));
  d->index = static_cast<int32_t>(index);
  KFORGE_RETURN_IF_ERROR(read_backend(field(r, 1, "backend"), &d->backend));
  KFORGE_RETURN_IF_ERROR(read_str(field(r, 2, "arch"), kMaxStringBytes, &d->arch));
  KFORGE_RETURN_IF_ERROR(read_str(field(r, 3, "model"), kMaxStringBytes, &d->model));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 4, "total_memory_bytes"), &d->total_memory_bytes));
  // Appended after version 1's first release: absent (an older hook) means "".
  KFORGE_ASSIGN_OR_RETURN(size_t fields, r.array_size());
  if (fields < 6) return Status();
  Reader uuid = field(r, 5, "uuid");
  KFORGE_RETURN_IF_ERROR(read_str(uuid, kMaxGpuUuidChars, &d->uuid));
  if (d->uuid.empty()) return Status();
  if (d->backend == Backend::kCpu) return uuid.error("the CPU has no GPU UUID (expected \"\")");
  return read_gpu_uuid(uuid, &d->uuid);
}

StatusOr<WireMessage> read_hello(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 6));
  Hello m;
  KFORGE_RETURN_IF_ERROR(read_pid(field(b, 0, "pid"), &m.pid));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 1, "kforge_version"), kMaxStringBytes, &m.kforge_version));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 2, "torch_version"), kMaxStringBytes, &m.torch_version));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 3, "process_name"), kMaxStringBytes, &m.process_name));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 4, "cache_dir"), kMaxPathBytes, &m.cache_dir));
  KFORGE_RETURN_IF_ERROR(read_list(field(b, 5, "devices"), kMaxDevices, &m.devices, read_device));
  return WireMessage(std::move(m));
}

Status read_stats(const Reader& r, size_t signature_args, InputStats* s) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 8));
  Reader index = field(r, 0, "arg_index");
  KFORGE_RETURN_IF_ERROR(read_arg_index(index, &s->arg_index));
  // Statistics of an argument the signature does not have cannot steer input generation.
  if (s->arg_index >= signature_args) {
    return index.error(std::to_string(s->arg_index) + " is not an argument of the signature (it has " +
                       std::to_string(signature_args) + ")");
  }
  KFORGE_RETURN_IF_ERROR(read_f64(field(r, 1, "min"), &s->min));
  KFORGE_RETURN_IF_ERROR(read_f64(field(r, 2, "max"), &s->max));
  KFORGE_RETURN_IF_ERROR(read_f64(field(r, 3, "mean"), &s->mean));
  KFORGE_RETURN_IF_ERROR(read_f64(field(r, 4, "stddev"), &s->stddev));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 5, "nan_count"), &s->nan_count));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 6, "inf_count"), &s->inf_count));
  Reader zf = field(r, 7, "zero_fraction");
  KFORGE_RETURN_IF_ERROR(read_f64(zf, &s->zero_fraction));
  if (!(s->zero_fraction >= 0.0 && s->zero_fraction <= 1.0)) {   // NaN fails too
    return zf.error("value outside [0, 1]");
  }
  return Status();
}

Status read_entry_in_process(const Reader& r, EntryInProcess* e) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 5));
  KFORGE_RETURN_IF_ERROR(read_entry_key(field(r, 0, "entry_key"), &e->entry_key));
  const Reader state = field(r, 1, "state");
  KFORGE_ASSIGN_OR_RETURN(e->state, state.str(kMaxStateChars));
  if (e->state.empty()) return state.error("empty state");
  for (char c : e->state) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return state.error("a state is lowercase letters and '_'");
  }
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 2, "active_calls"), &e->active_calls));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 3, "pytorch_median_ns"), &e->pytorch_median_ns));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 4, "entry_median_ns"), &e->entry_median_ns));
  return Status();
}

Status read_hot_entry(const Reader& r, HotEntry* e) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 5));
  KFORGE_ASSIGN_OR_RETURN(e->signature, codec::read_op_signature(field(r, 0, "signature")));
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 1, "calls"), &e->calls));
  Reader sampled = field(r, 2, "sampled_calls");
  KFORGE_RETURN_IF_ERROR(read_uint(sampled, &e->sampled_calls));
  if (e->sampled_calls > e->calls) {
    return sampled.error(std::to_string(e->sampled_calls) + " exceeds calls (" + std::to_string(e->calls) + ")");
  }
  KFORGE_RETURN_IF_ERROR(read_uint(field(r, 3, "sampled_total_ns"), &e->sampled_total_ns));
  const size_t nargs = e->signature.args.size();
  KFORGE_RETURN_IF_ERROR(read_list(field(r, 4, "input_stats"), kMaxStatsPerEntry, &e->input_stats,
                                   [nargs](const Reader& s, InputStats* out) { return read_stats(s, nargs, out); }));
  // Appended later: absent (an older hook) means none.
  KFORGE_ASSIGN_OR_RETURN(size_t fields, r.array_size());
  if (fields > 5) KFORGE_RETURN_IF_ERROR(read_list(field(r, 5, "in_process"), 1, &e->in_process, read_entry_in_process));
  return Status();
}

StatusOr<WireMessage> read_hot_report(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 4));
  HotReport m;
  KFORGE_RETURN_IF_ERROR(read_pid(field(b, 0, "pid"), &m.pid));
  KFORGE_RETURN_IF_ERROR(read_uint(field(b, 1, "sequence"), &m.sequence));
  KFORGE_RETURN_IF_ERROR(read_uint(field(b, 2, "reports_dropped"), &m.reports_dropped));
  KFORGE_RETURN_IF_ERROR(read_list(field(b, 3, "entries"), kMaxReportEntries, &m.entries, read_hot_entry));
  // Appended after version 1's first release: absent (an older hook) means none.
  KFORGE_ASSIGN_OR_RETURN(size_t fields, b.array_size());
  if (fields > 4) KFORGE_RETURN_IF_ERROR(read_list(field(b, 4, "gpus_in_use"), kMaxDevices, &m.gpus_in_use, read_gpu_uuid));
  return WireMessage(std::move(m));
}

Status read_dims(const Reader& r, int64_t lo, int64_t hi, std::vector<int64_t>* out) {
  return read_list(r, kMaxTensorRank, out, [lo, hi](const Reader& e, int64_t* v) -> Status {
    KFORGE_ASSIGN_OR_RETURN(*v, e.i64_in(lo, hi));
    return Status();
  });
}

Status read_captured_tensor(const Reader& r, CapturedTensor* t) {
  KFORGE_RETURN_IF_ERROR(open_record(r, 5));
  KFORGE_RETURN_IF_ERROR(read_arg_index(field(r, 0, "arg_index"), &t->arg_index));
  KFORGE_ASSIGN_OR_RETURN(int64_t dtype, field(r, 1, "dtype").i64_in(0, kDTypeCount - 1));
  t->dtype = static_cast<DType>(dtype);
  // 2^62 keeps numel * 16-byte elements overflow-checkable and is far beyond any real tensor.
  constexpr int64_t kMaxDim = int64_t{1} << 62;
  KFORGE_RETURN_IF_ERROR(read_dims(field(r, 2, "sizes"), 0, kMaxDim, &t->sizes));
  Reader strides = field(r, 3, "strides");
  KFORGE_RETURN_IF_ERROR(read_dims(strides, -kMaxDim, kMaxDim, &t->strides));
  if (t->strides.size() != t->sizes.size()) {
    return strides.error(std::to_string(t->strides.size()) + " strides for " + std::to_string(t->sizes.size()) +
                         " sizes");
  }
  Reader bytes = field(r, 4, "bytes");
  KFORGE_ASSIGN_OR_RETURN(t->bytes, bytes.bin(kMaxCapturedInputsBytes));
  // The worker reinterprets these bytes as the tensor: a length that disagrees with the shape
  // would read past the end or leave elements uninitialized.
  uint64_t expected = static_cast<uint64_t>(dtype_size_bytes(t->dtype));
  for (int64_t s : t->sizes) {
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(s), &expected)) {
      return bytes.error("tensor size overflows");
    }
  }
  if (t->bytes.size() != expected) {
    return bytes.error(std::to_string(t->bytes.size()) + " bytes, expected " + std::to_string(expected) +
                       " for the sizes and dtype");
  }
  return Status();
}

StatusOr<WireMessage> read_captured_inputs(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 3));
  CapturedInputs m;
  KFORGE_RETURN_IF_ERROR(read_pid(field(b, 0, "pid"), &m.pid));
  KFORGE_RETURN_IF_ERROR(read_id(field(b, 1, "signature_id"), &m.signature_id));
  KFORGE_RETURN_IF_ERROR(read_list(field(b, 2, "tensors"), kMaxCapturedTensors, &m.tensors, read_captured_tensor));
  return WireMessage(std::move(m));
}

StatusOr<WireMessage> read_goodbye(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 2));
  Goodbye m;
  KFORGE_RETURN_IF_ERROR(read_pid(field(b, 0, "pid"), &m.pid));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 1, "reason"), kMaxStringBytes, &m.reason));
  return WireMessage(std::move(m));
}

StatusOr<WireMessage> read_kernel_ready(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 4));
  KernelReady m;
  KFORGE_RETURN_IF_ERROR(read_id(field(b, 0, "signature_id"), &m.signature_id));
  KFORGE_RETURN_IF_ERROR(read_id(field(b, 1, "environment_key"), &m.environment_key));
  KFORGE_RETURN_IF_ERROR(read_entry_key(field(b, 2, "entry_key"), &m.entry_key));
  Reader speedup = field(b, 3, "speedup");
  KFORGE_RETURN_IF_ERROR(read_f64(speedup, &m.speedup));
  if (!(std::isfinite(m.speedup) && m.speedup > 0.0)) return speedup.error("expected a finite value > 0");
  return WireMessage(std::move(m));
}

StatusOr<WireMessage> read_revoke(const Reader& b) {
  KFORGE_RETURN_IF_ERROR(open_record(b, 3));
  Revoke m;
  KFORGE_RETURN_IF_ERROR(read_id(field(b, 0, "signature_id"), &m.signature_id));
  KFORGE_RETURN_IF_ERROR(read_entry_key(field(b, 1, "entry_key"), &m.entry_key));
  KFORGE_RETURN_IF_ERROR(read_str(field(b, 2, "reason"), kMaxStringBytes, &m.reason));
  return WireMessage(std::move(m));
}

// A short, printable rendering of an unexpected magic for the error message.
std::string describe(const msgpack::object& o) {
  if (o.type != msgpack::type::STR) return std::string(codec::type_name(o.type));
  std::string out = "\"";
  for (uint32_t i = 0; i < o.via.str.size && i < 16; ++i) {
    char c = o.via.str.ptr[i];
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out + (o.via.str.size > 16 ? "...\"" : "\"");
}

// ---- encoding -------------------------------------------------------------------------------------

void pack_string(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_id(Packer& pk, const SignatureId& id) {
  char b[kSignatureIdBytes];
  for (size_t i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(static_cast<unsigned char>(id.hi >> (56 - 8 * i)));
    b[8 + i] = static_cast<char>(static_cast<unsigned char>(id.lo >> (56 - 8 * i)));
  }
  pk.pack_bin(kSignatureIdBytes);
  pk.pack_bin_body(b, kSignatureIdBytes);
}

void pack_body(Packer& pk, const Hello& m) {
  pk.pack_array(6);
  pk.pack_int32(m.pid);
  pack_string(pk, m.kforge_version);
  pack_string(pk, m.torch_version);
  pack_string(pk, m.process_name);
  pack_string(pk, m.cache_dir);
  pk.pack_array(static_cast<uint32_t>(m.devices.size()));
  for (const DeviceInfo& d : m.devices) {
    pk.pack_array(6);
    pk.pack_int32(d.index);
    pk.pack_uint8(static_cast<uint8_t>(d.backend));
    pack_string(pk, d.arch);
    pack_string(pk, d.model);
    pk.pack_uint64(d.total_memory_bytes);
    pack_string(pk, d.uuid);
  }
}

void pack_body(Packer& pk, const HotReport& m) {
  pk.pack_array(5);
  pk.pack_int32(m.pid);
  pk.pack_uint64(m.sequence);
  pk.pack_uint64(m.reports_dropped);
  pk.pack_array(static_cast<uint32_t>(m.entries.size()));
  for (const HotEntry& e : m.entries) {
    pk.pack_array(6);
    codec::pack(pk, e.signature);
    pk.pack_uint64(e.calls);
    pk.pack_uint64(e.sampled_calls);
    pk.pack_uint64(e.sampled_total_ns);
    pk.pack_array(static_cast<uint32_t>(e.input_stats.size()));
    for (const InputStats& s : e.input_stats) {
      pk.pack_array(8);
      pk.pack_uint32(s.arg_index);
      pk.pack_f64(s.min);
      pk.pack_f64(s.max);
      pk.pack_f64(s.mean);
      pk.pack_f64(s.stddev);
      pk.pack_uint64(s.nan_count);
      pk.pack_uint64(s.inf_count);
      pk.pack_f64(s.zero_fraction);
    }
    pk.pack_array(static_cast<uint32_t>(e.in_process.size()));
    for (const EntryInProcess& p : e.in_process) {
      pk.pack_array(5);
      pack_string(pk, p.entry_key);
      pack_string(pk, p.state);
      pk.pack_uint64(p.active_calls);
      pk.pack_uint64(p.pytorch_median_ns);
      pk.pack_uint64(p.entry_median_ns);
    }
  }
  pk.pack_array(static_cast<uint32_t>(m.gpus_in_use.size()));
  for (const std::string& uuid : m.gpus_in_use) pack_string(pk, uuid);
}

void pack_body(Packer& pk, const CapturedInputs& m) {
  pk.pack_array(3);
  pk.pack_int32(m.pid);
  pack_id(pk, m.signature_id);
  pk.pack_array(static_cast<uint32_t>(m.tensors.size()));
  for (const CapturedTensor& t : m.tensors) {
    pk.pack_array(5);
    pk.pack_uint32(t.arg_index);
    pk.pack_uint8(static_cast<uint8_t>(t.dtype));
    pk.pack_array(static_cast<uint32_t>(t.sizes.size()));
    for (int64_t s : t.sizes) pk.pack_int64(s);
    pk.pack_array(static_cast<uint32_t>(t.strides.size()));
    for (int64_t s : t.strides) pk.pack_int64(s);
    pk.pack_bin(static_cast<uint32_t>(t.bytes.size()));
    pk.pack_bin_body(t.bytes.data(), static_cast<uint32_t>(t.bytes.size()));
  }
}

void pack_body(Packer& pk, const Goodbye& m) {
  pk.pack_array(2);
  pk.pack_int32(m.pid);
  pack_string(pk, m.reason);
}

void pack_body(Packer& pk, const KernelReady& m) {
  pk.pack_array(4);
  pack_id(pk, m.signature_id);
  pack_id(pk, m.environment_key);
  pack_string(pk, m.entry_key);
  pk.pack_f64(m.speedup);
}

void pack_body(Packer& pk, const Revoke& m) {
  pk.pack_array(3);
  pack_id(pk, m.signature_id);
  pack_string(pk, m.entry_key);
  pack_string(pk, m.reason);
}

uint64_t canonical_bits(double d) noexcept {
  if (std::isnan(d)) d = std::numeric_limits<double>::quiet_NaN();
  return std::bit_cast<uint64_t>(d);
}

}  // namespace

bool operator==(const InputStats& a, const InputStats& b) noexcept {
  return a.arg_index == b.arg_index && canonical_bits(a.min) == canonical_bits(b.min) &&
         canonical_bits(a.max) == canonical_bits(b.max) && canonical_bits(a.mean) == canonical_bits(b.mean) &&
         canonical_bits(a.stddev) == canonical_bits(b.stddev) && a.nan_count == b.nan_count &&
         a.inf_count == b.inf_count && canonical_bits(a.zero_fraction) == canonical_bits(b.zero_fraction);
}

std::string_view message_type_name(MessageType t) noexcept {
  switch (t) {
    case MessageType::kHello: return "Hello";
    case MessageType::kHotReport: return "HotReport";
    case MessageType::kCapturedInputs: return "CapturedInputs";
    case MessageType::kGoodbye: return "Goodbye";
    case MessageType::kKernelReady: return "KernelReady";
    case MessageType::kRevoke: return "Revoke";
  }
  return "unknown";
}

MessageType message_type(const WireMessage& m) noexcept {
  return std::visit([](const auto& v) { return std::decay_t<decltype(v)>::kType; }, m);
}

std::string encode(const WireMessage& m) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(4);
  pack_string(pk, kWireMagic);
  pk.pack_uint16(kWireVersion);
  pk.pack_uint8(static_cast<uint8_t>(message_type(m)));
  std::visit([&pk](const auto& body) { pack_body(pk, body); }, m);
  return std::string(buf.data(), buf.size());
}

StatusOr<WireMessage> decode(std::string_view bytes) {
  // A newer peer's message is refused by its version before its size or layout is judged: its
  // limits and body may differ from ours.
  const std::optional<EnvelopeHead> head = peek_head(bytes);
  if (head && (head->version > static_cast<uint64_t>(kWireVersion) || head->version < kMinWireVersion)) {
    return invalid_argument(unsupported_version(std::to_string(head->version)));
  }
  const bool captured = head && head->type == static_cast<uint64_t>(MessageType::kCapturedInputs);
  const size_t max_bytes = captured ? kMaxCapturedInputsBytes : kMaxMessageBytes;
  const size_t max_elements = captured ? kMaxCapturedElements : kMaxElements;
  if (bytes.size() > max_bytes) {
    return out_of_range("message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                        std::to_string(max_bytes) + (captured ? " for CapturedInputs" : ""));
  }
  KFORGE_RETURN_IF_ERROR(check_element_budget(bytes, max_elements));

  // Per-field limits are enforced by the readers below, which name the field; these only repeat
  // the bounds already established, as a second line of defence.
  codec::Limits limits;
  limits.max_bytes = max_bytes;
  limits.max_array = max_elements;
  limits.max_map = max_elements;
  limits.max_str = max_bytes;
  limits.max_bin = max_bytes;
  limits.max_depth = kMaxDepth;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(bytes, limits));

  Reader envelope(oh.get(), "envelope");
  KFORGE_ASSIGN_OR_RETURN(size_t n, envelope.array_size());
  if (n != 4) return envelope.error("expected [magic, version, type, body], got " + std::to_string(n) + " elements");

  Reader magic = field(envelope, 0, "magic");
  const msgpack::object& mo = magic.object();
  if (mo.type != msgpack::type::STR || std::string_view(mo.via.str.ptr, mo.via.str.size) != kWireMagic) {
    return magic.error("not a kforge message: expected \"kforge\", got " + describe(mo));
  }

  KFORGE_ASSIGN_OR_RETURN(int64_t v, field(envelope, 1, "version").i64());
  if (!supported_version(v)) return invalid_argument(unsupported_version(std::to_string(v)));

  Reader type = field(envelope, 2, "type");
  KFORGE_ASSIGN_OR_RETURN(int64_t t, type.i64());
  if (t < 1 || t > static_cast<int64_t>(std::variant_size_v<WireMessage>)) {
    return type.error("unknown message type " + std::to_string(t) + " (known: 1 to " +
                      std::to_string(std::variant_size_v<WireMessage>) + ")");
  }
  const auto mt = static_cast<MessageType>(t);

  Reader body(envelope.at(3).object(), std::string(message_type_name(mt)));
  switch (mt) {
    case MessageType::kHello: return read_hello(body);
    case MessageType::kHotReport: return read_hot_report(body);
    case MessageType::kCapturedInputs: return read_captured_inputs(body);
    case MessageType::kGoodbye: return read_goodbye(body);
    case MessageType::kKernelReady: return read_kernel_ready(body);
    case MessageType::kRevoke: return read_revoke(body);
  }
  return internal_error("unhandled message type");   // unreachable: the range check above
}

}  // namespace kforge::wire

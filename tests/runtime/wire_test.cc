// The hook <-> daemon wire protocol. These tests are its specification: every message survives a
// round trip unchanged, the envelope bytes are pinned, and every class of malformed input (from a
// buggy or hostile peer, or a torn socket read) is rejected with a reason that names the field,
// without throwing and without allocating what the message merely declares.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "runtime/msgpack_codec.h"
#include "runtime/wire.h"

using namespace kforge;
using namespace kforge::wire;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

TensorMeta contiguous(DType dt, std::vector<int64_t> sizes) { return contiguous_tensor(dt, DeviceType::kCuda, std::move(sizes)); }

OpSignature softmax() {
  return OpSignature{"aten::_softmax", "",
                     {Arg::tensor(contiguous(DType::kBFloat16, {4096, 50257})), Arg::integer(-1),
                      Arg::boolean(false)},
                     Target{Backend::kCuda, "sm_90"}};
}

OpSignature addmm() {
  return OpSignature{"aten::addmm", "",
                     {Arg::tensor(contiguous(DType::kFloat16, {3072})),
                      Arg::tensor(contiguous(DType::kFloat16, {512, 768})),
                      Arg::tensor(contiguous(DType::kFloat16, {768, 3072})), Arg::integer(1), Arg::real(1.0)},
                     Target{Backend::kCuda, "sm_90"}};
}

const std::string kGpu0 = "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b";
const std::string kGpu1 = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";

Hello hello() {
  Hello m;
  m.pid = 4242;
  m.kforge_version = "0.1.0";
  m.torch_version = "2.9.0+cu130";
  m.process_name = "python3.12";
  m.cache_dir = "/home/ml/.cache/kforge";
  m.devices = {DeviceInfo{0, Backend::kCuda, "sm_90", "NVIDIA H200", 150754820096ull, kGpu0},
               DeviceInfo{1, Backend::kCuda, "sm_90", "NVIDIA H200", 150754820096ull, kGpu1},
               DeviceInfo{0, Backend::kCpu, "x86_64-avx512f", "AMD EPYC 9654 96-Core Processor", 540000000000ull, ""}};
  return m;
}

InputStats stats(uint32_t arg, double mean) {
  InputStats s;
  s.arg_index = arg;
  s.min = -12.5;
  s.max = 30.25;
  s.mean = mean;
  s.stddev = 1.75;
  s.nan_count = 0;
  s.inf_count = 3;
  s.zero_fraction = 0.125;
  return s;
}

HotEntry entry(OpSignature sig, uint64_t calls) {
  HotEntry e;
  e.signature = std::move(sig);
  e.calls = calls;
  e.sampled_calls = calls / 100;
  e.sampled_total_ns = e.sampled_calls * 183000;
  e.input_stats = {stats(0, 0.01)};
  return e;
}

HotReport hot_report(size_t n_entries = 4) {
  HotReport m;
  m.pid = 4242;
  m.sequence = 17;
  m.reports_dropped = 2;
  m.gpus_in_use = {kGpu1, kGpu0};
  for (size_t i = 0; i < n_entries; ++i) {
    m.entries.push_back(entry(i % 2 ? addmm() : softmax(), 1000 * (i + 1)));
  }
  if (n_entries > 1) {
    m.entries[1].input_stats = {stats(0, 0.5), stats(1, -0.25), stats(2, 3.0)};
    m.entries[1].input_stats[2].nan_count = 7;
    m.entries[1].input_stats[2].min = std::numeric_limits<double>::quiet_NaN();
    m.entries[1].in_process = {EntryInProcess{std::string(32, 'c'), "active", 9000, 183000, 61000}};
  }
  return m;
}

CapturedInputs captured() {
  CapturedInputs m;
  m.pid = 4242;
  m.signature_id = softmax().id();
  CapturedTensor t;
  t.arg_index = 0;
  t.dtype = DType::kBFloat16;
  t.sizes = {4, 8};
  t.strides = {1, 4};   // captured from a transposed tensor; the bytes are row-major
  for (int i = 0; i < 4 * 8 * 2; ++i) t.bytes += static_cast<char>(i * 37);
  m.tensors.push_back(t);
  CapturedTensor scalar;
  scalar.arg_index = 3;
  scalar.dtype = DType::kFloat64;
  scalar.bytes = std::string(8, '\x01');
  m.tensors.push_back(scalar);
  return m;
}

KernelReady kernel_ready() {
  KernelReady m;
  m.signature_id = softmax().id();
  m.environment_key = SignatureId{0x0123456789abcdefull, 0xfedcba9876543210ull};
  m.entry_key = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
  m.speedup = 1.73;
  return m;
}

Revoke revoke() {
  Revoke m;
  m.signature_id = addmm().id();
  m.entry_key = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
  m.reason = "shadow mismatch in pid 4242: max abs err 3.1e-2 at output[0][17]";
  return m;
}

std::vector<WireMessage> every_message() {
  return {hello(), hot_report(), captured(), Goodbye{4242, "interpreter exit"}, kernel_ready(), revoke()};
}

std::string bytes_of(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += static_cast<char>(c);
  return s;
}

std::string message_of(const StatusOr<WireMessage>& r) { return r.ok() ? "(ok)" : r.status().message(); }

// msgpack-c's own packer writes integral doubles as integers, which would turn a float field
// into an integer one; this keeps every float a float64, like kforge's encoders.
void repack(codec::Packer& pk, const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: pk.pack_f64(o.via.f64); break;
    case msgpack::type::ARRAY:
      pk.pack_array(o.via.array.size);
      for (uint32_t i = 0; i < o.via.array.size; ++i) repack(pk, o.via.array.ptr[i]);
      break;
    default: pk.pack(o); break;   // scalars, strings, bins, maps of scalars: as they were
  }
}

// Re-encodes `bytes` with the element at `path` (array indices from the envelope down) replaced
// by what `replace` writes into it. How the tests build malformed messages from valid ones.
std::string mutate(const std::string& bytes, std::vector<size_t> path,
                   const std::function<void(msgpack::object&, msgpack::zone&)>& replace) {
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  msgpack::object* o = const_cast<msgpack::object*>(&oh.get());
  for (size_t i : path) {
    REQUIRE(o->type == msgpack::type::ARRAY);
    REQUIRE(i < o->via.array.size);
    o = &o->via.array.ptr[i];
  }
  replace(*o, *oh.zone());
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  repack(pk, oh.get());
  return std::string(buf.data(), buf.size());
}

auto with_string(const char* s) {
  return [s](msgpack::object& o, msgpack::zone& z) { o = msgpack::object(std::string(s), z); };
}
auto with_int(int64_t v) {
  return [v](msgpack::object& o, msgpack::zone&) { o = msgpack::object(v); };
}
auto with_double(double v) {
  return [v](msgpack::object& o, msgpack::zone&) { o = msgpack::object(v); };
}
// Keeps the first `n` elements of an array (or appends nils up to `n`).
auto with_length(uint32_t n) {
  return [n](msgpack::object& o, msgpack::zone& z) {
    auto* items = static_cast<msgpack::object*>(z.allocate_align(sizeof(msgpack::object) * (n + 1)));
    for (uint32_t i = 0; i < n; ++i) items[i] = i < o.via.array.size ? o.via.array.ptr[i] : msgpack::object();
    o.via.array.ptr = items;
    o.via.array.size = n;
  };
}

}  // namespace

TEST_CASE("wire: every message type round-trips unchanged, byte for byte") {
  for (const WireMessage& m : every_message()) {
    INFO(message_type_name(message_type(m)));
    const std::string bytes = encode(m);
    auto back = decode(bytes);
    REQUIRE(back.ok());
    CHECK(*back == m);
    CHECK(encode(*back) == bytes);
    CHECK(message_type(*back) == message_type(m));
  }
}

TEST_CASE("wire: the envelope is pinned byte for byte") {
  // ["kforge", 1, 4 (Goodbye), [4242, "bye"]]: a change here breaks every deployed peer.
  const std::string want = bytes_of({0x94, 0xa6}) + "kforge" + bytes_of({0x01, 0x04, 0x92, 0xcd, 0x10, 0x92, 0xa3}) + "bye";
  CHECK(encode(Goodbye{4242, "bye"}) == want);
  // Ids travel as 16-byte bins, hi then lo, big-endian: the same digits as SignatureId::hex().
  const std::string kr = encode(kernel_ready());
  const std::string env_key_bin = bytes_of({0xc4, 0x10, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
                                            0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10});
  CHECK(kr.find(env_key_bin) != std::string::npos);
}

TEST_CASE("wire: an embedded signature has exactly the bytes of OpSignature::encode()") {
  // The daemon hashes what it received; the id must be the one the hook computed.
  const std::string bytes = encode(hot_report());
  CHECK(bytes.find(softmax().encode()) != std::string::npos);
  CHECK(bytes.find(addmm().encode()) != std::string::npos);
  auto back = decode(bytes);
  REQUIRE(back.ok());
  CHECK(std::get<HotReport>(*back).entries[1].signature.id() == addmm().id());
}

TEST_CASE("wire: InputStats compare like their encodings (NaN equals NaN, -0.0 differs from 0.0)") {
  InputStats a = stats(0, 1.0), b = a;
  a.min = b.min = std::numeric_limits<double>::quiet_NaN();
  CHECK(a == b);
  b.min = -std::numeric_limits<double>::quiet_NaN();
  CHECK(a == b);
  a.mean = 0.0;
  b.mean = -0.0;
  CHECK_FALSE(a == b);
}

TEST_CASE("wire: a message truncated at any byte offset fails cleanly") {
  // A torn read or a half-written frame must never decode as something else.
  for (const WireMessage& m : every_message()) {
    const std::string bytes = encode(m);
    INFO(message_type_name(message_type(m)) << ", " << bytes.size() << " bytes");
    size_t accepted = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto r = decode(std::string_view(bytes).substr(0, n));
      if (r.ok()) ++accepted;
      else CHECK_FALSE(r.status().message().empty());
    }
    CHECK(accepted == 0);
  }
}

TEST_CASE("wire: the envelope is checked before the body") {
  const std::string good = encode(Goodbye{4242, "bye"});

  SECTION("wrong magic") {
    auto r = decode(mutate(good, {0}, with_string("kforgf")));
    CHECK(message_of(r) == "envelope.magic: not a kforge message: expected \"kforge\", got \"kforgf\"");
    r = decode(mutate(good, {0}, with_int(7)));
    CHECK(message_of(r) == "envelope.magic: not a kforge message: expected \"kforge\", got integer");
  }
  SECTION("a future version is refused, naming the versions this build speaks") {
    auto r = decode(mutate(good, {1}, with_int(2)));
    CHECK(message_of(r) == "envelope.version: unsupported wire protocol version 2; this build supports version 1");
    r = decode(mutate(good, {1}, with_int(0)));
    CHECK(message_of(r) == "envelope.version: unsupported wire protocol version 0; this build supports version 1");
    r = decode(mutate(good, {1}, with_string("1")));
    CHECK(message_of(r) == "envelope.version: expected integer, got string");
  }
  SECTION("a future version is refused by its version even when it is larger than our limits") {
    Goodbye big{4242, std::string(kMaxMessageBytes, 'x')};
    auto r = decode(mutate(encode(big), {1}, with_int(9)));
    CHECK_THAT(message_of(r), StartsWith("envelope.version: unsupported wire protocol version 9"));
  }
  SECTION("unknown message types") {
    for (int t : {0, 7, 200, 255, 70000}) {
      auto r = decode(mutate(good, {2}, with_int(t)));
      CHECK(message_of(r) == "envelope.type: unknown message type " + std::to_string(t) + " (known: 1 to 6)");
    }
  }
  SECTION("wrong envelope arity, not an array, trailing bytes, empty input") {
    CHECK(message_of(decode(mutate(good, {}, with_length(3)))) ==
          "envelope: expected [magic, version, type, body], got 3 elements");
    CHECK(message_of(decode(mutate(good, {}, with_length(5)))) ==
          "envelope: expected [magic, version, type, body], got 5 elements");
    CHECK(message_of(decode(bytes_of({0xa3}) + "abc")) == "envelope: expected array, got string");
    CHECK_THAT(message_of(decode(good + bytes_of({0xc0}))), Contains("trailing bytes"));
    CHECK(message_of(decode("")) == "empty message");
  }
}

TEST_CASE("wire: a field of the wrong type is rejected with its path") {
  const std::string report = encode(hot_report());
  // envelope[3] = body, body[3] = entries, entries[3][0] = signature.
  auto r = decode(mutate(report, {3, 3, 1, 1}, with_string("many")));
  CHECK(message_of(r) == "HotReport.entries[1].calls: expected unsigned integer, got string");

  r = decode(mutate(report, {3, 3, 1, 4, 2, 7}, with_string("0.5")));
  CHECK(message_of(r) == "HotReport.entries[1].input_stats[2].zero_fraction: expected float, got string");

  // Inside the embedded signature the path continues in OpSignature's own reader. Here:
  // signature[3] = args, args[0] = the first tensor [kind, dtype, device, sizes, ...], sizes[0].
  r = decode(mutate(report, {3, 3, 3, 0, 3, 0, 3, 0}, with_string("4096")));
  CHECK_THAT(message_of(r), StartsWith("HotReport.entries[3].signature"));
  CHECK_THAT(message_of(r), EndsWith("expected integer, got string"));

  r = decode(mutate(encode(hello()), {3, 5, 2, 3}, with_int(5)));
  CHECK(message_of(r) == "Hello.devices[2].model: expected string, got integer");

  r = decode(mutate(encode(captured()), {3, 2, 0, 2, 1}, with_double(8.0)));
  CHECK(message_of(r) == "CapturedInputs.tensors[0].sizes[1]: expected integer, got float");

  r = decode(mutate(encode(kernel_ready()), {3, 1}, with_string("0123456789abcdef")));
  // A str where a bin belongs is tolerated by the codec; the length still has to be 16.
  CHECK(r.ok());
  r = decode(mutate(encode(kernel_ready()), {3, 1}, with_int(1)));
  CHECK(message_of(r) == "KernelReady.environment_key: expected binary, got integer");
  r = decode(mutate(encode(revoke()), {3}, with_string("revoked")));
  CHECK(message_of(r) == "Revoke: expected array, got string");
}

TEST_CASE("wire: missing fields are rejected, extra trailing fields are ignored (forward compatibility)") {
  const std::string report = encode(hot_report());
  CHECK(message_of(decode(mutate(report, {3}, with_length(3)))) == "HotReport: expected 4 fields, got 3");
  CHECK(message_of(decode(mutate(report, {3, 3, 0, 4, 0}, with_length(7)))) ==
        "HotReport.entries[0].input_stats[0]: expected 8 fields, got 7");
  CHECK(message_of(decode(mutate(encode(hello()), {3, 5, 1}, with_length(4)))) ==
        "Hello.devices[1]: expected 5 fields, got 4");

  // A newer peer of the same version appends fields to the body and to nested records.
  std::string extended = mutate(report, {3}, with_length(6));
  extended = mutate(extended, {3, 3, 2}, with_length(9));
  extended = mutate(extended, {3, 3, 1, 4, 0}, with_length(12));
  auto r = decode(extended);
  REQUIRE(r.ok());
  CHECK(*r == WireMessage(hot_report()));
  CHECK(encode(*r) == report);
}

TEST_CASE("wire: GPU UUIDs appended to Hello's devices and to HotReport decode, and older messages without them too") {
  // An older hook of the same version sends 5-field devices and 4-field reports: it keeps being
  // understood (no GPU named, none in use), and what it sends re-encodes in today's form.
  const std::string old_hello = mutate(mutate(encode(hello()), {3, 5, 0}, with_length(5)), {3, 5, 1}, with_length(5));
  auto h = decode(old_hello);
  REQUIRE(h.ok());
  const Hello& got = std::get<Hello>(*h);
  CHECK(got.devices[0].uuid.empty());
  CHECK(got.devices[1].uuid.empty());
  CHECK(got.devices[0].model == "NVIDIA H200");

  const std::string old_report = mutate(encode(hot_report()), {3}, with_length(4));
  auto r = decode(old_report);
  REQUIRE(r.ok());
  CHECK(std::get<HotReport>(*r).gpus_in_use.empty());
  CHECK(std::get<HotReport>(*r).entries.size() == 4);

  // Today's messages carry them, in the order the hook wrote them.
  auto now = decode(encode(hot_report()));
  REQUIRE(now.ok());
  CHECK(std::get<HotReport>(*now).gpus_in_use == std::vector<std::string>{kGpu1, kGpu0});
  HotReport none = hot_report(1);
  none.gpus_in_use.clear();
  REQUIRE(decode(encode(none)).ok());
}

TEST_CASE("wire: what a process runs for a signature decodes, an older hook's entries without it too, and bad values are named") {
  const std::string report = encode(hot_report());
  auto now = decode(report);
  REQUIRE(now.ok());
  const HotReport& got = std::get<HotReport>(*now);
  REQUIRE(got.entries[1].in_process.size() == 1);
  CHECK(got.entries[1].in_process[0].state == "active");
  CHECK(got.entries[1].in_process[0].active_calls == 9000);
  CHECK(got.entries[1].in_process[0].pytorch_median_ns == 183000);
  CHECK(got.entries[1].in_process[0].entry_median_ns == 61000);
  CHECK(got.entries[0].in_process.empty());

  // An older hook's entries have 5 fields: none is loaded, as far as the daemon knows.
  auto old = decode(mutate(report, {3, 3, 1}, with_length(5)));
  REQUIRE(old.ok());
  CHECK(std::get<HotReport>(*old).entries[1].in_process.empty());
  CHECK(std::get<HotReport>(*old).entries[1].calls == 2000);

  struct Case {
    std::string bytes;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {mutate(report, {3, 3, 1, 5}, with_string("active")), "HotReport.entries[1].in_process: expected array, got string"},
      {mutate(report, {3, 3, 1, 5, 0}, with_length(4)), "HotReport.entries[1].in_process[0]: expected 5 fields, got 4"},
      {mutate(report, {3, 3, 1, 5, 0, 0}, with_string("XYZ")),
       "HotReport.entries[1].in_process[0].entry_key: entry key must be lowercase hex digits"},
      {mutate(report, {3, 3, 1, 5, 0, 1}, with_string("<script>")),
       "HotReport.entries[1].in_process[0].state: a state is lowercase letters and '_'"},
      {mutate(report, {3, 3, 1, 5, 0, 1}, with_string("")), "HotReport.entries[1].in_process[0].state: empty state"},
      {mutate(report, {3, 3, 1, 5, 0, 1}, with_string("a_state_far_too_long")),
       "HotReport.entries[1].in_process[0].state: string of 20 bytes exceeds 16"},
      {mutate(report, {3, 3, 1, 5, 0, 2}, with_int(-1)), "HotReport.entries[1].in_process[0].active_calls: expected unsigned integer, got negative"},
  };
  for (const Case& c : cases) CHECK(message_of(decode(c.bytes)) == c.reason);

  // At most one per signature.
  HotReport two = hot_report(2);
  two.entries[1].in_process.push_back(two.entries[1].in_process[0]);
  CHECK(message_of(decode(encode(two))) == "HotReport.entries[1].in_process: 2 elements exceed the limit of 1");
}

TEST_CASE("wire: malformed GPU UUIDs are rejected with their path") {
  const std::string h = encode(hello());
  const std::string report = encode(hot_report());
  struct Case {
    std::string bytes;
    std::string reason;
  };
  const std::string long_uuid = "GPU-" + std::string(kMaxGpuUuidChars, 'a');
  const std::vector<Case> cases = {
      {mutate(h, {3, 5, 2, 5}, with_string("GPU-5e2a910c")),
       "Hello.devices[2].uuid: the CPU has no GPU UUID (expected \"\")"},
      {mutate(h, {3, 5, 0, 5}, with_string("GPU 5e2a910c")),
       "Hello.devices[0].uuid: not a GPU UUID (expected letters, digits and '-', like \"GPU-5e2a910c-d34f-...\")"},
      {mutate(h, {3, 5, 1, 5}, with_string(long_uuid.c_str())), "Hello.devices[1].uuid: string of 68 bytes exceeds 64"},
      {mutate(h, {3, 5, 1, 5}, with_int(3)), "Hello.devices[1].uuid: expected string, got integer"},
      {mutate(report, {3, 4}, with_string(kGpu0.c_str())), "HotReport.gpus_in_use: expected array, got string"},
      {mutate(report, {3, 4, 1}, with_string("")), "HotReport.gpus_in_use[1]: empty GPU UUID"},
      {mutate(report, {3, 4, 0}, with_string("GPU-\n")),
       "HotReport.gpus_in_use[0]: not a GPU UUID (expected letters, digits and '-', like \"GPU-5e2a910c-d34f-...\")"},
      {mutate(report, {3, 4, 0}, with_string(long_uuid.c_str())), "HotReport.gpus_in_use[0]: string of 68 bytes exceeds 64"},
  };
  for (const Case& c : cases) CHECK(message_of(decode(c.bytes)) == c.reason);

  HotReport many = hot_report(1);
  many.gpus_in_use.assign(kMaxDevices, kGpu0);
  REQUIRE(decode(encode(many)).ok());
  many.gpus_in_use.push_back(kGpu1);
  CHECK(message_of(decode(encode(many))) == "HotReport.gpus_in_use: 65 elements exceed the limit of 64");
}

TEST_CASE("wire: out-of-range values are rejected with their path") {
  struct Case {
    std::string bytes;
    std::string reason;
  };
  const std::string report = encode(hot_report());
  const std::string ready = encode(kernel_ready());
  const std::string cap = encode(captured());
  const std::vector<Case> cases = {
      {mutate(report, {3, 0}, with_int(0)), "HotReport.pid: value 0 outside [1, 2147483647]"},
      {mutate(report, {3, 0}, with_int(int64_t{1} << 31)), "HotReport.pid: value 2147483648 outside [1, 2147483647]"},
      {mutate(report, {3, 3, 0, 2}, with_int(1000000)), "HotReport.entries[0].sampled_calls: 1000000 exceeds calls (1000)"},
      {mutate(report, {3, 3, 0, 4, 0, 7}, with_double(1.5)),
       "HotReport.entries[0].input_stats[0].zero_fraction: value outside [0, 1]"},
      {mutate(report, {3, 3, 0, 4, 0, 7}, with_double(std::nan(""))),
       "HotReport.entries[0].input_stats[0].zero_fraction: value outside [0, 1]"},
      {mutate(report, {3, 3, 0, 4, 0, 0}, with_int(3)),
       "HotReport.entries[0].input_stats[0].arg_index: 3 is not an argument of the signature (it has 3)"},
      {mutate(report, {3, 3, 0, 4, 0, 5}, with_int(-1)),
       "HotReport.entries[0].input_stats[0].nan_count: expected unsigned integer, got negative"},
      {mutate(ready, {3, 3}, with_double(0.0)), "KernelReady.speedup: expected a finite value > 0"},
      {mutate(ready, {3, 3}, with_double(-2.0)), "KernelReady.speedup: expected a finite value > 0"},
      {mutate(ready, {3, 3}, with_double(std::numeric_limits<double>::infinity())),
       "KernelReady.speedup: expected a finite value > 0"},
      {mutate(ready, {3, 2}, with_string("9F86D081")), "KernelReady.entry_key: entry key must be lowercase hex digits"},
      {mutate(ready, {3, 2}, with_string("")), "KernelReady.entry_key: empty entry key"},
      {mutate(ready, {3, 0}, with_string("short")), "KernelReady.signature_id: expected a 16-byte id, got 5 bytes"},
      {mutate(encode(hello()), {3, 5, 0, 0}, with_int(70000)), "Hello.devices[0].index: value 70000 outside [0, 65535]"},
      {mutate(encode(hello()), {3, 5, 0, 1}, with_int(2)), "Hello.devices[0].backend: value 2 outside [0, 1]"},
      {mutate(cap, {3, 2, 0, 1}, with_int(14)), "CapturedInputs.tensors[0].dtype: value 14 outside [0, 13]"},
      {mutate(cap, {3, 2, 0, 2, 0}, with_int(-4)),
       "CapturedInputs.tensors[0].sizes[0]: value -4 outside [0, 4611686018427387904]"},
      {mutate(cap, {3, 2, 0, 3}, with_length(1)), "CapturedInputs.tensors[0].strides: 1 strides for 2 sizes"},
      {mutate(cap, {3, 2, 0, 2, 0}, with_int(5)),
       "CapturedInputs.tensors[0].bytes: 64 bytes, expected 80 for the sizes and dtype"},
      {mutate(cap, {3, 2, 1, 0}, with_int(256)), "CapturedInputs.tensors[1].arg_index: value 256 outside [0, 255]"},
  };
  for (const Case& c : cases) {
    auto r = decode(c.bytes);
    CHECK(message_of(r) == c.reason);
  }
}

TEST_CASE("wire: lists and strings over their limits are rejected with their path") {
  SECTION("HotReport.entries") {
    HotReport m = hot_report(kMaxReportEntries);
    REQUIRE(decode(encode(m)).ok());
    m.entries.push_back(entry(softmax(), 5));
    CHECK(message_of(decode(encode(m))) == "HotReport.entries: 4097 elements exceed the limit of 4096");
  }
  SECTION("input_stats per entry") {
    HotReport m = hot_report(1);
    m.entries[0].input_stats.assign(kMaxStatsPerEntry + 1, stats(0, 1.0));
    CHECK(message_of(decode(encode(m))) == "HotReport.entries[0].input_stats: 65 elements exceed the limit of 64");
  }
  SECTION("Hello.devices") {
    Hello m = hello();
    m.devices.assign(kMaxDevices + 1, m.devices[0]);
    CHECK(message_of(decode(encode(m))) == "Hello.devices: 65 elements exceed the limit of 64");
  }
  SECTION("CapturedInputs.tensors and tensor rank") {
    CapturedInputs m = captured();
    m.tensors.assign(kMaxCapturedTensors + 1, m.tensors[1]);
    CHECK(message_of(decode(encode(m))) == "CapturedInputs.tensors: 65 elements exceed the limit of 64");
    m = captured();
    m.tensors[1].sizes.assign(kMaxTensorRank + 1, 1);
    m.tensors[1].strides.assign(kMaxTensorRank + 1, 1);
    CHECK(message_of(decode(encode(m))) == "CapturedInputs.tensors[1].sizes: 17 elements exceed the limit of 16");
  }
  SECTION("strings and paths") {
    Hello m = hello();
    m.cache_dir = "/" + std::string(kMaxPathBytes - 1, 'd');
    REQUIRE(decode(encode(m)).ok());
    m.cache_dir += "d";
    CHECK(message_of(decode(encode(m))) == "Hello.cache_dir: string of 4097 bytes exceeds 4096");
    CHECK(message_of(decode(encode(Goodbye{1, std::string(kMaxStringBytes + 1, 'r')}))) ==
          "Goodbye.reason: string of 4097 bytes exceeds 4096");
    KernelReady k = kernel_ready();
    k.entry_key = std::string(kMaxEntryKeyChars + 1, 'a');
    CHECK(message_of(decode(encode(k))) == "KernelReady.entry_key: string of 129 bytes exceeds 128");
  }
}

TEST_CASE("wire: message size limits depend on the type") {
  SECTION("control messages are capped at 4 MiB") {
    Goodbye big{1, std::string(kMaxMessageBytes, 'x')};
    const std::string bytes = encode(big);
    CHECK(message_of(decode(bytes)) ==
          "message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of 4194304");
  }
  SECTION("CapturedInputs may carry up to 64 MiB of tensors") {
    CapturedInputs m = captured();
    CapturedTensor t;
    t.arg_index = 2;
    t.dtype = DType::kFloat32;
    t.sizes = {1024, 1024 * 3};   // 12 MiB
    t.strides = {1024 * 3, 1};
    t.bytes.assign(size_t{12} << 20, '\x3f');
    m.tensors.push_back(t);
    const std::string bytes = encode(m);
    REQUIRE(bytes.size() > kMaxMessageBytes);
    auto r = decode(bytes);
    REQUIRE(r.ok());
    CHECK(*r == WireMessage(m));

    t.sizes = {1024, 1024 * 16};  // 64 MiB of tensor alone: over the limit with the envelope
    t.strides = {1024 * 16, 1};
    t.bytes.assign(size_t{64} << 20, '\x3f');
    m.tensors.back() = std::move(t);
    CHECK(message_of(decode(encode(m))) ==
          "message of " + std::to_string(encode(m).size()) + " bytes exceeds the limit of 67108864 for CapturedInputs");
  }
}

TEST_CASE("wire: declared lengths are bounded before anything is allocated") {
  SECTION("a 4-billion-element array in a 15-byte message") {
    // ["kforge", 1, 2, array32(0xffffffff)]: msgpack-c would allocate 96 GiB of element slots.
    const std::string bomb = bytes_of({0x94, 0xa6}) + "kforge" + bytes_of({0x01, 0x02, 0xdd, 0xff, 0xff, 0xff, 0xff});
    auto r = decode(bomb);
    CHECK(message_of(r) == "message declares at least 4294967299 array elements but has only 15 bytes");
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("the same bomb deep inside a valid-looking report") {
    std::string bytes = encode(hot_report(1));
    // Replace the entries array header and everything after it by an array16 of 65535.
    const std::string entries_hdr = bytes_of({0x91, 0x96});   // entries: [ [sig, ..., in_process] ]
    size_t at = bytes.find(entries_hdr);
    REQUIRE(at != std::string::npos);
    bytes = bytes.substr(0, at) + bytes_of({0xdc, 0xff, 0xff});
    CHECK_THAT(message_of(decode(bytes)), StartsWith("message declares at least"));
  }
  SECTION("a CapturedInputs may not declare more elements than its cap either") {
    std::string bytes = bytes_of({0x94, 0xa6}) + "kforge" + bytes_of({0x01, 0x03, 0xdd, 0x00, 0x01, 0x00, 0x01});
    bytes.append(70000, '\0');
    CHECK_THAT(message_of(decode(bytes)), StartsWith("message declares at least"));
    CHECK_THAT(message_of(decode(bytes)), EndsWith("over the limit of 65536"));
  }
  SECTION("nesting bombs stop at the depth limit") {
    std::string deep(100000, static_cast<char>(0x91));
    deep += static_cast<char>(0xc0);
    CHECK(message_of(decode(deep)) == "message nests deeper than 16 levels");
  }
  SECTION("maps count twice and are still a type error") {
    const std::string m = bytes_of({0x94, 0xa6}) + "kforge" + bytes_of({0x01, 0x04, 0x81, 0x01, 0x02});
    CHECK(message_of(decode(m)) == "Goodbye: expected array, got map");
  }
}

TEST_CASE("wire: message type names and numbering are stable") {
  CHECK(message_type_name(MessageType::kHello) == "Hello");
  CHECK(message_type_name(MessageType::kHotReport) == "HotReport");
  CHECK(message_type_name(MessageType::kCapturedInputs) == "CapturedInputs");
  CHECK(message_type_name(MessageType::kGoodbye) == "Goodbye");
  CHECK(message_type_name(MessageType::kKernelReady) == "KernelReady");
  CHECK(message_type_name(MessageType::kRevoke) == "Revoke");
  CHECK(static_cast<int>(MessageType::kRevoke) == 6);
  CHECK(kWireVersion == 1);
}

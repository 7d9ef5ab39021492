// kforged's message handler (search_daemon/daemon/client_messages.h): whatever a client sends, the
// daemon answers or drops it with a reason, stays within its bounds, and never crashes. The same
// handler runs under the fuzzer (tests/fuzz/fuzz_daemon_messages.cc) and in tests/python's
// hostile-client test against a real kforged.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "runtime/control_message.h"
#include "runtime/wire.h"
#include "search_daemon/daemon/client_messages.h"
#include "search_daemon/daemon/daemon_status.h"

using namespace kforge;
using namespace kforge::daemon;
using json = nlohmann::json;

namespace {

OpSignature softmax(int64_t rows, int64_t cols) {
  TensorMeta m;
  m.dtype = DType::kFloat32;
  m.device = DeviceType::kCpu;
  m.sizes = {rows, cols};
  m.strides = {cols, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(m), Arg::integer(-1), Arg::boolean(false)}, Target{Backend::kCpu, "x86_64"}};
}

// A handler over a real registry and the real status document, logging into `lines`.
struct Harness {
  HotSignatures hot;
  Counters counters;
  LogLimiter limiter{LogLimiter::Options{}};
  DaemonConfig config;
  std::vector<eval::SlotInfo> slots;
  std::vector<std::string> lines;
  ClientMessages messages;

  explicit Harness(HotOptions o = HotOptions{})
      : hot(std::move(o)), messages(context()) {}

  ClientMessages::Context context() {
    config.cache_dir = "/cache";
    ClientMessages::Context c;
    c.hot = &hot;
    c.counters = &counters;
    c.limiter = &limiter;
    c.log = [this](const std::string& level, const std::string& line) { lines.push_back(level + ": " + line); };
    c.daemon_cache_dir = "/cache";
    c.same_directory = [](const std::string& a, const std::string& b) { return a == b; };
    c.status = [this](const control::ControlRequest& r) {
      StatusInputs in;
      in.config = &config;
      in.slots = &slots;
      in.hot = &hot;
      in.counters = &counters;
      in.progress = [](const SignatureId&) { return std::optional<SessionProgress>(); };
      return status_document(in, r.limit);
    };
    return c;
  }

  ClientMessages::Effects send(const std::string& peer, std::string_view bytes, PeerCredentials creds = {7, ""}) {
    return messages.handle(peer, creds, bytes, false);
  }
  json status(std::optional<uint32_t> limit = std::nullopt) {
    ClientMessages::Effects e = send("cli", control::encode_request({control::Request::kStatus, limit}));
    REQUIRE(e.reply);
    StatusOr<std::string> st = control::decode_status_reply(*e.reply);
    REQUIRE(st.ok());
    return json::parse(*st);
  }
};

std::string hello(int32_t pid, const std::string& cache_dir = "/cache") {
  wire::Hello h;
  h.pid = pid;
  h.torch_version = "2.11.0";
  h.cache_dir = cache_dir;
  return wire::encode(wire::WireMessage(h));
}

std::string report(int32_t pid, uint64_t seq, const std::vector<std::pair<OpSignature, uint64_t>>& sigs) {
  wire::HotReport r;
  r.pid = pid;
  r.sequence = seq;
  for (const auto& [sig, calls] : sigs) r.entries.push_back(wire::HotEntry{sig, calls, calls / 10, calls / 10 * 1000, {}});
  return wire::encode(wire::WireMessage(r));
}

}  // namespace

TEST_CASE("client messages: a control request of any shape is answered, never fatal") {
  Harness h;
  for (const char* bad : {R"({"kforge_ctl": "1", "request": "status"})", R"({"kforge_ctl": null, "request": "status"})",
                          R"({"kforge_ctl": [1], "request": "status"})", R"({"kforge_ctl": 1, "request": ["status"]})",
                          R"({"kforge_ctl": 1, "request": "status", "limit": {}})", "{", "{}"}) {
    INFO(bad);
    ClientMessages::Effects e = h.send("cli", bad);
    REQUIRE(e.reply);
    StatusOr<std::string> st = control::decode_status_reply(*e.reply);
    CHECK_FALSE(st.ok());
    CHECK_FALSE(st.status().message().empty());
  }
  CHECK(h.counters["control_malformed"] == 7);
  CHECK(h.status()["signatures"].is_array());
}

TEST_CASE("client messages: malformed wire messages are counted, and the log is rate-limited, with the count") {
  Harness h;
  for (int i = 0; i < 100; ++i) {
    const ClientMessages::Effects e = h.send("peer" + std::to_string(i), std::string("\x94\xa6kforge\x01\x02\xc0", 10));
    CHECK_FALSE(e.reply);
  }
  (void)h.messages.handle("p", PeerCredentials{}, "x", /*multipart=*/true);
  CHECK(h.counters["messages_malformed"] == 101);
  CHECK(h.lines.size() == 10);   // the burst; the other 91 are counted
  CHECK(h.limiter.pending("malformed") == 91);
}

TEST_CASE("client messages: a Hello and a report attach a process and bring its signatures, which status shows") {
  Harness h;
  CHECK(h.send("hook", hello(4242), PeerCredentials{4242, ""}).processes_changed);
  const ClientMessages::Effects e = h.send("hook", report(4242, 1, {{softmax(64, 3), 1000}, {softmax(8, 3), 10}}),
                                           PeerCredentials{4242, ""});
  CHECK(e.signatures_changed);
  const json st = h.status();
  REQUIRE(st["processes"].size() == 1);
  CHECK(st["processes"][0]["pid"] == 4242);
  CHECK(st["processes"][0]["peer_pid"] == 4242);
  CHECK(st["processes"][0]["shares_cache"] == true);
  CHECK(st["signatures_total"] == 2);
  CHECK(st["signatures"][0]["calls"] == 1000);   // the larger share first
  CHECK(h.status(1)["signatures"].size() == 1);
  CHECK(h.status(1)["signatures_total"] == 2);
  // Another cache directory: attached, shown, warned about.
  (void)h.send("other", hello(5000, "/elsewhere"), PeerCredentials{5000, ""});
  CHECK(h.status()["processes"][1]["shares_cache"] == false);
  CHECK(std::count_if(h.lines.begin(), h.lines.end(),
                      [](const std::string& l) { return l.find("uses the cache at /elsewhere") != std::string::npos; }) == 1);
}

TEST_CASE("client messages: the kernels a process runs and the time they saved it show in status, and go when it drops them") {
  Harness h;
  (void)h.send("hook", hello(4242), PeerCredentials{4242, ""});
  wire::HotReport r;
  r.pid = 4242;
  r.sequence = 1;
  r.entries.push_back(wire::HotEntry{softmax(64, 3), 1000, 100, 100000, {}});
  r.entries.push_back(wire::HotEntry{softmax(8, 3), 500, 50, 5000, {}});
  r.entries.push_back(wire::HotEntry{softmax(16, 3), 300, 30, 3000, {}});
  // Active: 900 calls served, 3.0 us by PyTorch against 1.0 us in its trial here: 1.8 ms saved.
  r.entries[0].in_process = {wire::EntryInProcess{std::string(32, 'a'), "active", 900, 3000, 1000}};
  // No win here: it saves nothing, whatever its medians.
  r.entries[1].in_process = {wire::EntryInProcess{std::string(32, 'b'), "no_win", 0, 1000, 1100}};
  // Still in its trial: no medians yet.
  r.entries[2].in_process = {wire::EntryInProcess{std::string(32, 'c'), "shadow", 0, 0, 0}};
  (void)h.send("hook", wire::encode(wire::WireMessage(r)), PeerCredentials{4242, ""});
  json st = h.status();
  REQUIRE(st["processes"].size() == 1);
  CHECK(st["processes"][0]["saved_ns"].get<double>() == Approx(900.0 * 2000));
  CHECK(st["processes"][0]["kernels"] == json{{"active", 1}, {"no_win", 1}, {"shadow", 1}});
  const json& top = st["signatures"][0];
  REQUIRE(top["in_process"].size() == 1);
  CHECK(top["in_process"][0]["pid"] == 4242);
  CHECK(top["in_process"][0]["entry"] == std::string(32, 'a'));
  CHECK(top["in_process"][0]["state"] == "active");
  CHECK(top["in_process"][0]["pytorch_median_ns"] == 3000);

  // The next report of that signature without it (revoked, back to PyTorch's kernel): gone.
  r.sequence = 2;
  r.entries.resize(1);
  r.entries[0].calls = 1100;
  r.entries[0].in_process.clear();
  (void)h.send("hook", wire::encode(wire::WireMessage(r)), PeerCredentials{4242, ""});
  st = h.status();
  CHECK(st["signatures"][0]["in_process"].empty());
  CHECK(st["processes"][0]["saved_ns"].get<double>() == 0.0);
  CHECK(st["processes"][0]["kernels"] == json{{"no_win", 1}, {"shadow", 1}});
}

TEST_CASE("client messages: forged reports with thousands of signatures keep the registry bounded and status fast") {
  HotOptions o;
  o.max_signatures = 4096;
  o.max_signatures_per_process = 2048;
  Harness h(o);
  for (int p = 0; p < 4; ++p) {
    std::vector<std::pair<OpSignature, uint64_t>> sigs;
    for (int i = 0; i < 4096; ++i) sigs.emplace_back(softmax(p + 1, i + 1), 100 + static_cast<uint64_t>(i));
    (void)h.send("forger" + std::to_string(p), report(100 + p, 1, sigs), PeerCredentials{100 + p, ""});
  }
  CHECK(h.hot.signatures().size() <= 4096);
  CHECK(h.counters["signatures_refused"] == 4 * 2048);
  const json st = h.status(10);
  CHECK(st["signatures"].size() == 10);
  CHECK(st["signatures_total"].get<size_t>() <= 4096);
  for (const json& s : st["signatures"]) CHECK(s["time_share"].get<double>() <= 1.0);
}

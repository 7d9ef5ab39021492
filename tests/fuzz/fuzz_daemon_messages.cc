// libFuzzer target for everything a client can send kforged: the daemon's whole message handler
// (search_daemon/daemon/client_messages.h) over a real registry, status document and log limiter,
// fed a sequence of frames from a handful of peers.
//
// Input: frames, each [header][length: 2 bytes, little endian][bytes]. The header picks the peer
// (low 3 bits), how the transport names it (bits 3-4: a local pid of its own, a tcp address, the
// pid of a local process every peer shares, nothing) and whether the frame came with more parts
// (bit 5). Every 8th frame the clock moves a minute and expire() runs (odd pids are dead).
//
// Checks, for arbitrary frames: handle() returns (never throws, crashes or trips a sanitizer); the
// registry stays within its bounds (processes, peers per pid, signatures); every control request
// gets a reply that decodes, an ok one carrying a status document that is a JSON object; a refusal
// carries a reason.
//
//   fuzz_daemon_messages -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/daemon_messages
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/control_message.h"
#include "search_daemon/daemon/client_messages.h"
#include "search_daemon/daemon/daemon_status.h"

namespace {

using namespace kforge;
using namespace kforge::daemon;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_daemon_messages: %s: %s\n", what, detail.c_str());
  std::abort();
}

constexpr size_t kMaxProcesses = 16;
constexpr size_t kMaxPeersPerPid = 4;
constexpr size_t kMaxSignatures = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SteadyClock::time_point now = SteadyClock::time_point{} + std::chrono::hours(1);
  HotOptions o;
  o.min_calls = 1;
  o.max_processes = kMaxProcesses;
  o.max_peers_per_pid = kMaxPeersPerPid;
  o.max_signatures = kMaxSignatures;
  o.max_signatures_per_process = 32;
  o.max_captured_bytes = 1 << 20;
  o.clock = [&now] { return now; };
  HotSignatures hot(o);
  Counters counters;
  LogLimiter limiter(LogLimiter::Options{});
  DaemonConfig config;
  config.cache_dir = "/nonexistent/kforge-cache";
  eval::SlotInfo slot;
  slot.device = "cpu";
  slot.state = "idle";
  slot.arch = "x86_64";
  slot.bandwidth_bytes_per_s = 1e10;
  const std::vector<eval::SlotInfo> slots{slot};

  ClientMessages::Context ctx;
  ctx.hot = &hot;
  ctx.counters = &counters;
  ctx.limiter = &limiter;
  ctx.log = [](const std::string&, const std::string&) {};
  ctx.daemon_cache_dir = config.cache_dir;
  ctx.same_directory = [](const std::string& a, const std::string& b) { return a == b; };
  ctx.status = [&](const control::ControlRequest& r) {
    StatusInputs in;
    in.config = &config;
    in.slots = &slots;
    in.hot = &hot;
    in.counters = &counters;
    in.progress = [](const SignatureId&) { return std::optional<SessionProgress>(); };
    return status_document(in, r.limit);
  };
  ClientMessages messages(ctx);

  size_t pos = 0;
  for (int frame = 0; pos + 3 <= size; ++frame) {
    const uint8_t h = data[pos];
    const size_t len = std::min<size_t>(size - pos - 3, data[pos + 1] | (size_t{data[pos + 2]} << 8));
    const std::string_view bytes(reinterpret_cast<const char*>(data + pos + 3), len);
    pos += 3 + len;
    const int peer = h & 7;
    PeerCredentials creds;
    switch ((h >> 3) & 3) {
      case 0: creds.pid = 1000 + peer; break;
      case 1: creds.address = "10.0.0." + std::to_string(peer); break;
      case 2: creds.pid = 4242; break;
      default: break;
    }
    const ClientMessages::Effects e = messages.handle("peer" + std::to_string(peer), creds, bytes, (h >> 5) & 1);
    if (control::is_control_message(bytes) && !((h >> 5) & 1)) {
      if (!e.reply) fail("a control request got no reply", std::string(bytes.substr(0, 80)));
      StatusOr<std::string> st = control::decode_status_reply(*e.reply);
      if (st.ok()) {
        const nlohmann::json j = nlohmann::json::parse(*st, nullptr, false);
        if (!j.is_object() || !j.contains("signatures") || !j.contains("processes")) fail("a status that is not a status", st->substr(0, 200));
      } else if (st.status().message().empty()) {
        fail("a refusal without a reason", *e.reply);
      }
    }
    if (frame % 8 == 7) {
      now += std::chrono::minutes(1);
      (void)hot.expire([](int32_t pid) { return pid % 2 == 0; });
    }
    if (hot.processes().size() > kMaxProcesses) fail("too many process records", std::to_string(hot.processes().size()));
    if (hot.signatures().size() > kMaxSignatures) fail("too many signatures", std::to_string(hot.signatures().size()));
    size_t shared = 0;
    for (const auto& [p, r] : hot.processes()) shared += r.peer_pid == 4242 ? 1 : 0;
    if (shared > kMaxPeersPerPid) fail("too many records for one process", std::to_string(shared));
  }
  return 0;
}

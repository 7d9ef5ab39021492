// Daemon: kforged itself. One I/O thread owns the ZeroMQ sockets and the HotSignatures registry;
// search sessions run on threads of their own and talk back through an event queue; the evaluator
// pool runs one thread per slot; an HTTP server (optional, loopback only) serves /metrics and the
// JSON status.
//
//   StatusOr<DaemonConfig> config = load_daemon_config(args, process_env());
//   Daemon d(*config, proposers);
//   KFORGE_RETURN_IF_ERROR(d.start());      // binds, starts workers, resumes journaled searches
//   return d.run();                         // until SIGTERM/SIGINT (or request_stop())
//
// Note [Daemon messages]
// ROUTER socket (config.endpoint): hooks send wire messages (Hello, HotReport, CapturedInputs,
// Goodbye: runtime/wire.h), each one frame after the routing id; the daemon sends KernelReady to
// every live hook when a search publishes (hooks of other environments ignore it). The CLI sends
// one control request ({"kforge_ctl": 1, "request": "status"}: runtime/control_message.h) and gets
// one reply. Wire messages are msgpack arrays, control messages JSON objects: the first byte tells
// them apart. ClientMessages (client_messages.h) decodes and applies them all, whatever the bytes:
// a malformed message is counted and logged (rate-limited, with the count of what was
// suppressed), never fatal; the loop reads at most 256 frames a turn, so signals and session
// events are never starved by a flood. What any client can make the daemon keep is bounded (Note
// [Bounded state] in hot_signatures.h): a local peer's pid comes from the kernel (the ipc peer
// address), and its record is gone when that process is; any peer silent for
// daemon.process_timeout_s is gone too. Which GPUs attached processes use (their reports'
// gpus_in_use) goes to the evaluator pool as it changes; a timing run on one of them is flagged
// (counter timings_on_shared_gpu, the signature's shared_gpu_timings, one log line per signature,
// the result event's shared_gpu_pids). PUB socket (config.events_endpoint): every session event as
// one JSON frame, topic first ("published ..."). ipc:// endpoints live in a private directory
// (0700, ours); tcp:// needs CURVE keys.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "search_daemon/daemon/daemon_config.h"
#include "search_daemon/daemon/hot_signatures.h"
#include "search_daemon/daemon/search_session.h"
#include "search_daemon/evaluator/evaluator_pool.h"
#include "search_daemon/proposers/proposer.h"

namespace kforge::daemon {

// One log line on stderr in the daemon's format: `log_format` "json" gives one JSON object
// {"ts", "level", "msg", "pid"} per line, anything else "<ISO time> kforged <level>: <message>".
// Thread-safe (one fprintf per line). What Daemon::log writes, and what kforged's proposers use
// before and after the Daemon exists.
void write_log_line(const std::string& log_format, const std::string& level, const std::string& message);

class Daemon {
 public:
  Daemon(DaemonConfig config, std::vector<search::Proposer*> proposers);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  Status start();
  // The I/O loop; returns the process exit status (0 after a stop request).
  int run();
  // Thread-safe; also what SIGTERM/SIGINT do.
  void request_stop();
  // The status document the CLI and the HTTP API serve (JSON text). Thread-safe.
  std::string status_json() const;
  std::string metrics_text() const;
  void log(const std::string& level, const std::string& message) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kforge::daemon

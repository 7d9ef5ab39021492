// DaemonClient: how the hook inside the user's process talks to kforged, without ever making the
// user's threads wait.
//
//   auto client = DaemonClient::start({.endpoint = "ipc:///run/user/1000/kforge/daemon.sock",
//                                      .hello = hello, .on_message = on_daemon_message});
//   if (!client.ok()) { log_once(client.status()); return; }   // kforge off, the process goes on
//   (*client)->offer(wire::HotReport{...});   // returns at once: queued, or dropped and counted
//   (*client)->stop("interpreter exit");      // best-effort Goodbye, bounded
//
// Promises:
// - offer() never blocks, never does I/O, never throws, takes no lock and allocates nothing: it
//   moves the message into a bounded queue or, when the queue is full, drops it and counts the
//   drop. Callers may be hot threads of the user. (Waking an idle background thread costs one
//   non-blocking eventfd write. A refused message is destroyed inside offer(); freeing its memory
//   is the allocator's business and may wait for a malloc arena lock, as any free() may.)
// - One background thread owns the ZeroMQ socket and does all encoding and sending. A daemon that
//   is absent, slow or killed costs dropped messages (counted), never a stall of the process: the
//   socket never blocks on send (high-water mark; no linger beyond stop()'s bound).
// - Messages are sent only while a daemon is connected (ZeroMQ handshake done); otherwise they are
//   dropped as unsendable without being encoded. Options::hello, when set, is sent first on every
//   new connection, so a daemon that restarts learns who this process is.
// - Messages the daemon sends (KernelReady, Revoke) are decoded on the background thread and handed
//   to the on_message callback there; malformed ones (undecodable, multi-part, or a hook -> daemon
//   type) are counted and logged once, never delivered. An exception from on_message is logged
//   once and swallowed.
// - Framing: one message per ZeroMQ frame. The daemon's ROUTER sees [routing id, message] and
//   replies [routing id, message]; no empty delimiter frame.
// - stop() (and the destructor) sends what is queued and a best-effort Goodbye, and returns within
//   stop_timeout_ms. A thread that cannot stop in time (an on_message that does not return) is
//   detached, not waited for. Messages offered concurrently with stop() may be lost uncounted.
// - fork(): a child process inherits a copy without the thread; offer() there only fills the
//   copy's queue, and stop()/the destructor leak it instead of touching the parent's sockets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/wire.h"

namespace kforge {

class DaemonClient {
 public:
  struct Options {
    // "ipc://..." or "tcp://127.0.0.1:port". A host name would be resolved inside start().
    std::string endpoint;
    // tcp:// only: the daemon's CURVE public key (z85, 40 characters; runtime/transport.h).
    // The client makes a throwaway key pair of its own; the traffic is encrypted and only the
    // holder of the daemon's secret key can answer. A handshake that fails is logged once.
    std::string curve_server_key;
    size_t queue_capacity = 64;         // messages waiting for the background thread; >= 2
    int send_hwm = 16;                  // ZeroMQ send high-water mark (messages); >= 1
    int stop_timeout_ms = 200;          // bound on stop(); >= 0
    std::optional<wire::Hello> hello;   // sent first on every connection (not counted below)
    std::function<void(const wire::WireMessage&)> on_message;   // daemon -> hook (background thread)
  };

  // Once stopped: offered == sent + dropped_queue_full + dropped_unsendable.
  struct Counters {
    uint64_t offered = 0;
    uint64_t sent = 0;
    uint64_t dropped_queue_full = 0;    // offer() found the queue full
    uint64_t dropped_unsendable = 0;    // no daemon connected, the socket would have blocked
                                        // (daemon slow), or offered after stop()
    uint64_t received = 0;              // valid daemon messages handed to on_message
    uint64_t received_malformed = 0;
  };

  // Starts the background thread. Fails (no thread started) only for malformed options or endpoint,
  // or when ZeroMQ cannot create a socket; an endpoint nobody serves is not an error.
  static StatusOr<std::unique_ptr<DaemonClient>> start(Options options);

  ~DaemonClient();
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  bool offer(wire::WireMessage message) noexcept;   // true if queued
  Counters counters() const noexcept;
  // A daemon has completed the handshake and not disconnected, as the client thread last saw it.
  // A message offered while this is false is dropped as unsendable; one that must not be lost
  // (the hook's captured inputs) waits with its owner until this is true.
  bool connected() const noexcept;
  // Idempotent; a second call, even a concurrent one, returns at once. The Goodbye carries
  // getpid() and `goodbye_reason` ("interpreter exit", "kforge disabled: <why>").
  void stop(std::string_view goodbye_reason = "client stopped") noexcept;

 private:
  DaemonClient() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kforge

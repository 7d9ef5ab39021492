// DaemonSocket: kforged's two ZeroMQ sockets and the lock that makes it the only daemon on its
// endpoint. The ROUTER (config.endpoint) takes every client's frames (hooks' wire messages, the
// CLI's control requests) and answers them; the PUB (config.events_endpoint) carries every search
// event as one JSON frame, topic first. ipc:// endpoints live in a private directory (0700, ours:
// runtime/daemon_endpoint.h); tcp:// needs CURVE keys (runtime/transport.h).
//
//   StatusOr<std::unique_ptr<DaemonSocket>> s = DaemonSocket::bind(config);
//   while (std::optional<DaemonSocket::Frame> f = (*s)->receive()) { ... f->bytes ... }
//   (*s)->send_to(peer, reply);
//   (*s)->publish("published", json_text);
//
// Promises: one message a frame (a multi-part message is drained and marked); every frame carries
// its sender's credentials as the transport gives them (a local peer's pid: Note [Bounded state]
// in hot_signatures.h); sending never blocks (a gone or slow peer's replies are dropped); a second
// daemon on the same ipc:// endpoint is refused, naming the first's pid. Only the I/O thread uses it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <zmq.hpp>

#include "runtime/status.h"
#include "runtime/unique_fd.h"
#include "search_daemon/daemon/daemon_config.h"
#include "search_daemon/daemon/hot_signatures.h"

namespace kforge::daemon {

class DaemonSocket {
 public:
  static StatusOr<std::unique_ptr<DaemonSocket>> bind(const DaemonConfig& config);

  struct Frame {
    std::string peer;            // ZeroMQ routing id
    PeerCredentials creds;
    zmq::message_t body;         // the message; bytes() views it
    bool multipart = false;      // it came with more frames (they were drained)
    std::string_view bytes() const { return {static_cast<const char*>(body.data()), body.size()}; }
  };
  // The next frame, without waiting; nullopt when none is queued.
  std::optional<Frame> receive();
  void send_to(const std::string& peer, std::string_view bytes);
  void publish(std::string_view topic, std::string_view json_text);

  // For zmq_poll: the ROUTER socket.
  void* router_handle() { return router_.handle(); }
  // With daemon.curve_secret_key_file: the public key clients need; else "".
  const std::string& curve_public_key() const noexcept { return curve_public_key_; }

 private:
  DaemonSocket() = default;
  UniqueFd lock_fd_;
  zmq::context_t context_;
  zmq::socket_t router_{context_, zmq::socket_type::router};
  zmq::socket_t pub_{context_, zmq::socket_type::pub};
  std::string curve_public_key_;
};

}  // namespace kforge::daemon

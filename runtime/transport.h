// Transport: what every ZeroMQ user in kforge shares: the hook's DaemonClient, kforged, the CLI and
// the evaluation channel between the daemon and its workers. Sockets are cppzmq's RAII types
// (zmq::context_t, zmq::socket_t, zmq::message_t); this adds what kforge decides about them once:
// CURVE (the client's throwaway key pair, the server's key file and its checks, key generation),
// the endpoint rules (runtime/daemon_endpoint.h), and one request/reply exchange for tools.
//
//   zmq::context_t ctx;
//   zmq::socket_t s(ctx, zmq::socket_type::dealer);
//   KFORGE_RETURN_IF_ERROR(transport::make_curve_client(s, server_key));   // tcp:// only
//   StatusOr<std::string> reply = transport::request_reply(endpoint, key, request, 2000);
//
// Nothing here throws: cppzmq's errors become Status values naming what failed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <zmq.hpp>

#include "runtime/daemon_endpoint.h"
#include "runtime/status.h"

namespace kforge::transport {

// Makes `socket` (before it connects) a CURVE client of the server whose public key is
// `server_key` (z85, checked), with a throwaway key pair of its own whose secret is wiped from
// memory here.
Status make_curve_client(zmq::socket_t& socket, std::string_view server_key);

// Makes `socket` (before it binds) a CURVE server with the secret key in `secret_key_file`: a file
// of its owner's only (mode 0600: else an error naming `chmod 600`), holding a 40-character z85
// secret key. Returns the matching public key (what clients need).
StatusOr<std::string> make_curve_server(zmq::socket_t& socket, const std::string& secret_key_file);

// A new CURVE key pair: the secret key goes to `path` (created 0600, never overwritten), the public
// key is returned. `kforged --curve-keygen FILE`.
StatusOr<std::string> generate_curve_key_file(const std::string& path);

// The secret key in `path` after make_curve_server's checks (for tests and tools), or why not.
StatusOr<std::string> read_curve_secret_key(const std::string& path);

// One request and its reply over a fresh DEALER socket, within timeout_ms: the reply's bytes, or
// nullopt with `why` ("no answer within 2000 ms", "cannot connect: ..."). `server_key`: the CURVE
// public key for tcp:// (empty for ipc://).
std::optional<std::string> request_reply(const std::string& endpoint, const std::string& server_key,
                                         std::string_view request, int timeout_ms, std::string& why);

}  // namespace kforge::transport

#include "search_daemon/daemon/daemon_socket.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/transport.h"

namespace kforge::daemon {

namespace {

std::string ipc_path(const std::string& endpoint) {
  return endpoint.rfind("ipc://", 0) == 0 ? endpoint.substr(6) : "";
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

StatusOr<std::unique_ptr<DaemonSocket>> DaemonSocket::bind(const DaemonConfig& config) {
  for (const std::string& e : {config.endpoint, config.events_endpoint}) {
    if (!ipc_path(e).empty()) KFORGE_RETURN_IF_ERROR(secure_ipc_directory(e));
  }
  std::unique_ptr<DaemonSocket> d(new DaemonSocket());
  // One daemon per socket directory: a second one would take the first's ipc socket over.
  if (const std::string path = ipc_path(config.endpoint); !path.empty()) {
    const std::string lock_path = path + ".lock";
    d->lock_fd_ = UniqueFd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!d->lock_fd_.valid()) return unavailable("cannot open " + lock_path + ": " + std::strerror(errno));
    if (::flock(d->lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      const std::string other = read_text_file(lock_path);
      return unavailable("another kforged serves " + config.endpoint + (other.empty() ? "" : " (pid " + other + ")"));
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(d->lock_fd_.get(), 0) != 0 || ::pwrite(d->lock_fd_.get(), pid.data(), pid.size(), 0) < 0) {
      return unavailable("cannot write " + lock_path);
    }
  }
  try {
    d->router_.set(zmq::sockopt::linger, 0);
    d->pub_.set(zmq::sockopt::linger, 0);
    d->router_.set(zmq::sockopt::maxmsgsize, int64_t{80} << 20);   // CapturedInputs: 64 MiB of tensors and framing
    // A hook that is gone must not make the daemon queue replies for it forever.
    d->router_.set(zmq::sockopt::router_mandatory, 0);
    d->router_.set(zmq::sockopt::sndhwm, 1000);
    if (!config.curve_secret_key_file.empty()) {
      StatusOr<std::string> public_key = transport::make_curve_server(d->router_, config.curve_secret_key_file);
      if (!public_key.ok()) return public_key.status();
      KFORGE_RETURN_IF_ERROR(transport::make_curve_server(d->pub_, config.curve_secret_key_file).status());
      d->curve_public_key_ = *public_key;
    }
  } catch (const zmq::error_t& e) {
    return unavailable(std::string("cannot set up the daemon's sockets: ") + e.what());
  }
  for (auto [socket, endpoint] : {std::pair{&d->router_, &config.endpoint}, std::pair{&d->pub_, &config.events_endpoint}}) {
    try {
      socket->bind(*endpoint);
    } catch (const zmq::error_t& e) {
      return unavailable("cannot bind " + *endpoint + ": " + e.what());
    }
  }
  return d;
}

std::optional<DaemonSocket::Frame> DaemonSocket::receive() {
  for (;;) {
    zmq::message_t id;
    if (!router_.recv(id, zmq::recv_flags::dontwait)) return std::nullopt;
    if (!id.more()) continue;   // a routing id alone: nothing to read
    Frame f;
    f.peer = id.to_string();
    if (!router_.recv(f.body, zmq::recv_flags::none)) continue;
    // Who sent it, as the transport says (Note [Bounded state] in hot_signatures.h).
    const char* address = zmq_msg_gets(f.body.handle(), "Peer-Address");
    f.creds = peer_credentials_from_address(address != nullptr ? address : "");
    // One message per frame: a multi-part message is drained and marked.
    bool extra = f.body.more();
    f.multipart = extra;
    while (extra) {
      zmq::message_t part;
      if (!router_.recv(part, zmq::recv_flags::none)) break;
      extra = part.more();
    }
    return f;
  }
}

void DaemonSocket::send_to(const std::string& peer, std::string_view bytes) {
  try {
    if (!router_.send(zmq::buffer(peer.data(), peer.size()), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    (void)router_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // A peer that is gone: its reply is dropped (router_mandatory is off, so this is rare).
  }
}

void DaemonSocket::publish(std::string_view topic, std::string_view json_text) {
  std::string text;
  text.reserve(topic.size() + 1 + json_text.size());
  text.append(topic).append(" ").append(json_text);
  try {
    (void)pub_.send(zmq::buffer(text.data(), text.size()), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
}

}  // namespace kforge::daemon

#include "runtime/transport.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/unique_fd.h"

namespace kforge::transport {

namespace {

std::string zmq_error_text() { return zmq_strerror(zmq_errno()); }

}  // namespace

Status make_curve_client(zmq::socket_t& socket, std::string_view server_key) {
  KFORGE_RETURN_IF_ERROR(check_curve_key(server_key, "the daemon's CURVE public key"));
  char public_key[41];
  char secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return unavailable("cannot make a CURVE key pair (is this libzmq built with CURVE?): " + zmq_error_text());
  }
  void* s = socket.handle();
  const bool ok = zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key.data(), server_key.size()) == 0 &&
                  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, public_key, 40) == 0 &&
                  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, secret_key, 40) == 0;
  ::explicit_bzero(secret_key, sizeof secret_key);
  if (!ok) return invalid_argument("the daemon's CURVE public key was refused: " + zmq_error_text());
  return Status();
}

StatusOr<std::string> read_curve_secret_key(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return invalid_argument(file + ": " + std::strerror(errno));
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return invalid_argument(file + " has mode " + mode + ": a CURVE secret key must be readable by its owner only (chmod 600 " +
                            file + ")");
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  while (!key.empty() && (key.back() == '\n' || key.back() == ' ' || key.back() == '\r')) key.pop_back();
  if (key.size() != 40) return invalid_argument(file + ": expected a 40-character z85 CURVE secret key");
  return key;
}

StatusOr<std::string> make_curve_server(zmq::socket_t& socket, const std::string& secret_key_file) {
  StatusOr<std::string> key = read_curve_secret_key(secret_key_file);
  if (!key.ok()) return key.status();
  char public_key[41] = {};
  if (zmq_curve_public(public_key, key->c_str()) != 0) {
    return invalid_argument(secret_key_file + ": not a valid CURVE secret key: " + zmq_error_text());
  }
  const int server = 1;
  void* s = socket.handle();
  const bool ok = zmq_setsockopt(s, ZMQ_CURVE_SERVER, &server, sizeof server) == 0 &&
                  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, key->data(), key->size()) == 0;
  ::explicit_bzero(key->data(), key->size());
  if (!ok) return invalid_argument(secret_key_file + ": not a valid CURVE secret key: " + zmq_error_text());
  return std::string(public_key, 40);
}

StatusOr<std::string> generate_curve_key_file(const std::string& path) {
  char public_key[41] = {};
  char secret_key[41] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return unavailable("cannot make a CURVE key pair (is this libzmq built with CURVE?): " + zmq_error_text());
  }
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    const int e = errno;
    ::explicit_bzero(secret_key, sizeof secret_key);
    return e == EEXIST ? invalid_argument(path + " exists; refusing to overwrite a key (remove it first)")
                       : unavailable("cannot create " + path + ": " + std::strerror(e));
  }
  std::string line = std::string(secret_key, 40) + "\n";
  ::explicit_bzero(secret_key, sizeof secret_key);
  const bool written = ::write(fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       ::fsync(fd.get()) == 0;
  ::explicit_bzero(line.data(), line.size());
  if (!written) {
    const int e = errno;
    ::unlink(path.c_str());
    return unavailable("cannot write " + path + ": " + std::strerror(e));
  }
  return std::string(public_key, 40);
}

std::optional<std::string> request_reply(const std::string& endpoint, const std::string& server_key,
                                         std::string_view request, int timeout_ms, std::string& why) {
  try {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (!server_key.empty()) {
      if (Status keyed = make_curve_client(s, server_key); !keyed.ok()) {
        why = keyed.message();
        return std::nullopt;
      }
    }
    try {
      s.connect(endpoint);
    } catch (const zmq::error_t& e) {
      why = std::string("cannot connect: ") + e.what();
      return std::nullopt;
    }
    if (!s.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::dontwait)) {
      // Not connected yet: wait for the connection within the same budget.
      s.set(zmq::sockopt::sndtimeo, timeout_ms);
      if (!s.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::none)) {
        why = "cannot send within " + std::to_string(timeout_ms) + " ms";
        return std::nullopt;
      }
    }
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) {
      why = "no answer within " + std::to_string(timeout_ms) + " ms" +
            (server_key.empty() ? "" : "; if kforged runs there, check that the server key is its public key");
      return std::nullopt;
    }
    zmq::message_t reply;
    if (!s.recv(reply, zmq::recv_flags::dontwait)) {
      why = "the answer could not be read";
      return std::nullopt;
    }
    return reply.to_string();
  } catch (const zmq::error_t& e) {
    why = std::string("ZeroMQ: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace kforge::transport

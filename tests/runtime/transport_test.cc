// The transport every ZeroMQ user shares (runtime/transport.h): CURVE key files and their checks,
// the server and client sides of CURVE, and the one request/reply exchange tools use. Real
// sockets, real files, a real server thread.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/transport.h"
#include "tests/support/temp_dir.h"

using namespace kforge;

namespace {

// A ROUTER that answers every request with "echo:" + the request, until stopped.
class EchoServer {
 public:
  EchoServer(const std::string& endpoint, const std::string& secret_key_file) {
    if (!secret_key_file.empty()) public_key = transport::make_curve_server(router_, secret_key_file).value();
    router_.set(zmq::sockopt::linger, 0);
    router_.bind(endpoint);
    thread_ = std::thread([this] {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      while (!stop_.load()) {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) <= 0) continue;
        zmq::message_t id, body;
        if (!router_.recv(id) || !router_.recv(body)) continue;
        const std::string reply = "echo:" + body.to_string();
        router_.send(id, zmq::send_flags::sndmore);
        router_.send(zmq::buffer(reply), zmq::send_flags::none);
      }
    });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
  }
  std::string public_key;

 private:
  zmq::context_t ctx_;
  zmq::socket_t router_{ctx_, zmq::socket_type::router};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("transport: a CURVE key file is its owner's only, never overwritten, and checked when read") {
  const test_support::TempDir t("kforge-transport-test");
  const std::string file = (t.path / "daemon.key").string();
  StatusOr<std::string> public_key = transport::generate_curve_key_file(file);
  REQUIRE(public_key.ok());
  CHECK(public_key->size() == 40);
  CHECK(check_curve_key(*public_key, "the key").ok());
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // Never overwritten.
  StatusOr<std::string> again = transport::generate_curve_key_file(file);
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status().message(), Catch::Contains("refusing to overwrite a key"));
  // Readable by others: refused, naming the fix.
  ::chmod(file.c_str(), 0640);
  StatusOr<std::string> open_key = transport::read_curve_secret_key(file);
  REQUIRE_FALSE(open_key.ok());
  CHECK_THAT(open_key.status().message(), Catch::Contains("chmod 600 " + file));
  ::chmod(file.c_str(), 0600);
  REQUIRE(transport::read_curve_secret_key(file).ok());
  // Not a key.
  const std::string junk = (t.path / "junk.key").string();
  std::ofstream(junk) << "not a key\n";
  ::chmod(junk.c_str(), 0600);
  CHECK_THAT(transport::read_curve_secret_key(junk).status().message(), Catch::Contains("expected a 40-character z85"));
  // A server made from the file says the same public key the generator printed.
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::router);
  StatusOr<std::string> served = transport::make_curve_server(s, file);
  REQUIRE(served.ok());
  CHECK(*served == *public_key);
  s.close();
}

TEST_CASE("transport: request_reply gets the answer over ipc://, and says when there is none") {
  const test_support::TempDir t("kforge-transport-test");
  const std::string endpoint = "ipc://" + (t.path / "echo.sock").string();
  std::string why;
  // Nobody serves it: no answer, in bounded time, saying so.
  CHECK_FALSE(transport::request_reply(endpoint, "", "ping", 200, why));
  CHECK(why == "no answer within 200 ms");
  EchoServer server(endpoint, "");
  std::optional<std::string> reply = transport::request_reply(endpoint, "", "ping", 5000, why);
  REQUIRE(reply);
  CHECK(*reply == "echo:ping");
}

TEST_CASE("transport: over tcp:// with CURVE only the holder of the server's key pair answers") {
  const test_support::TempDir t("kforge-transport-test");
  const std::string key_file = (t.path / "daemon.key").string();
  REQUIRE(transport::generate_curve_key_file(key_file).ok());
  // A free port: bind to an ephemeral one and read it back (the context's end releases it).
  std::string endpoint;
  {
    zmq::context_t probe_ctx;
    zmq::socket_t probe(probe_ctx, zmq::socket_type::router);
    probe.set(zmq::sockopt::linger, 0);
    probe.bind("tcp://127.0.0.1:*");
    endpoint = probe.get(zmq::sockopt::last_endpoint);
  }
  EchoServer server(endpoint, key_file);
  std::string why;
  std::optional<std::string> reply = transport::request_reply(endpoint, server.public_key, "secret", 5000, why);
  REQUIRE(reply);
  CHECK(*reply == "echo:secret");
  // Another key pair's public key: the handshake fails, nothing comes back.
  const std::string stranger_file = (t.path / "other.key").string();
  const std::string stranger = transport::generate_curve_key_file(stranger_file).value();
  CHECK_FALSE(transport::request_reply(endpoint, stranger, "secret", 500, why));
  CHECK_THAT(why, Catch::Contains("check that the server key is its public key"));
  // Not a key at all: refused before anything is sent.
  CHECK_FALSE(transport::request_reply(endpoint, "short", "secret", 500, why));
  CHECK_THAT(why, Catch::Contains("40"));
}

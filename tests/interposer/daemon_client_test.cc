// DaemonClient, against a real ZeroMQ ROUTER standing in for kforged. What these tests pin down is
// the interposer's failure policy on the wire: whatever the daemon does (answer, send garbage, not
// exist, stop reading, die and come back), the hook's threads never wait, every message is either
// delivered or counted, and stop() keeps its time bound. Synchronization is by handshakes (the
// Hello that opens every connection, messages arriving in order) and polling timeouts, never sleeps.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "interposer/daemon_client.h"
#include "runtime/wire.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::wire;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_THREAD__)
// libzmq and libpgm (which libzmq initializes per context) are not instrumented: libzmq's I/O
// thread allocates a message that the client thread frees, and libpgm's init/shutdown pair runs on
// whichever threads create and terminate contexts, ordered by their own atomics, which
// ThreadSanitizer cannot see. Ignore what those libraries' own calls into libc do; every access
// made by kforge code is still checked.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libzmq.so\ncalled_from_lib:libpgm-5.3.so\n";
}
#endif

namespace {

// Generous: these only bound how long a failing test takes to fail.
constexpr auto kArrival = 5s;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kSlowdown = 10;   // sanitizer builds run everything several times slower
#else
constexpr int kSlowdown = 1;
#endif
// stop() returns at its deadline at the latest; how soon the waiting thread then runs again is
// up to the scheduler of a shared machine.
constexpr auto kSchedulingSlack = 50ms * kSlowdown;

// ---- messages as the hook and the daemon really send them ----------------------------------------

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

Hello hello() {
  Hello m;
  m.pid = 4242;
  m.kforge_version = "0.1.0";
  m.torch_version = "2.11.0+cu130";
  m.process_name = "python3.12";
  m.cache_dir = "/home/ml/.cache/kforge";
  m.devices = {DeviceInfo{0, Backend::kCuda, "sm_90", "NVIDIA H200", 150754820096ull, "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b"},
               DeviceInfo{0, Backend::kCpu, "x86_64-avx512f", "AMD EPYC 9654 96-Core Processor", 540000000000ull, ""}};
  return m;
}

HotReport hot_report(uint64_t sequence, size_t n_entries = 4) {
  HotReport m;
  m.pid = 4242;
  m.sequence = sequence;
  for (size_t i = 0; i < n_entries; ++i) {
    HotEntry e;
    e.signature = i % 2 ? addmm() : softmax();
    e.calls = 1000 * (i + 1);
    e.sampled_calls = e.calls / 100;
    e.sampled_total_ns = e.sampled_calls * 183000;
    InputStats s;
    s.arg_index = 0;
    s.min = -12.5;
    s.max = 30.25;
    s.mean = 0.01;
    s.stddev = 1.75;
    s.inf_count = 3;
    s.zero_fraction = 0.125;
    e.input_stats = {s};
    m.entries.push_back(std::move(e));
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
  t.strides = {8, 1};
  for (int i = 0; i < 4 * 8 * 2; ++i) t.bytes += static_cast<char>(i * 37);
  m.tensors.push_back(t);
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
  m.reason = "shadow mismatch in pid 4242: max abs err 3.1e-2";
  return m;
}

// ---- the daemon's side ----------------------------------------------------------------------------

// A directory of its own for ipc:// endpoints, so parallel test runs never share one.
using TempDir = kforge::test_support::TempDir;

// kforged's ROUTER, with a context of its own: kill() returns only once ZeroMQ has let go of the
// endpoint, so a new daemon can bind it at once (as a restarted kforged would).
class FakeDaemon {
 public:
  // receive_hwm: how many messages ZeroMQ reads ahead for the daemon (1: it soon stops reading).
  explicit FakeDaemon(const std::string& endpoint, int receive_hwm = 1000)
      : router_(context_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::rcvhwm, receive_hwm);
    router_.bind(endpoint);
  }

  // The next frame a hook sent, raw; nullopt if none arrives within `timeout`.
  std::optional<std::string> receive_bytes(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    std::vector<zmq::message_t> parts;
    REQUIRE(zmq::recv_multipart(router_, std::back_inserter(parts)));
    REQUIRE(parts.size() == 2);   // [routing id, message]: one message per frame
    routing_id_ = parts[0].to_string();
    return parts[1].to_string();
  }

  WireMessage receive(std::chrono::milliseconds timeout = kArrival) {
    std::optional<std::string> bytes = receive_bytes(timeout);
    REQUIRE(bytes.has_value());
    StatusOr<WireMessage> m = decode(*bytes);
    REQUIRE(m.ok());
    return *m;
  }

  // To the hook that sent the last message received.
  void send(const std::string& bytes) { send_parts({bytes}); }
  void send_parts(const std::vector<std::string>& parts) {
    REQUIRE(!routing_id_.empty());
    std::vector<zmq::const_buffer> frames{zmq::buffer(routing_id_)};
    for (const std::string& p : parts) frames.push_back(zmq::buffer(p));
    REQUIRE(zmq::send_multipart(router_, frames));
  }

  void kill() {
    router_.close();
    context_.close();
  }

 private:
  zmq::context_t context_;
  zmq::socket_t router_;
  std::string routing_id_;
};

// What on_message delivered, for the test thread to wait on.
class Inbox {
 public:
  std::function<void(const WireMessage&)> callback() {
    return [this](const WireMessage& m) {
      std::lock_guard lock(mutex_);
      messages_.push_back(m);
      changed_.notify_all();
    };
  }
  std::vector<WireMessage> wait_for(size_t n, std::chrono::milliseconds timeout = kArrival) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, timeout, [&] { return messages_.size() >= n; });
    return messages_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<WireMessage> messages_;
};

// Holds the client thread inside on_message until released: the only way to make the queue fill
// deterministically. Shared, so a thread that stop() detached still finds it alive.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false;
  bool released = false;

  static std::function<void(const WireMessage&)> callback(const std::shared_ptr<Gate>& gate) {
    return [gate](const WireMessage&) {
      std::unique_lock lock(gate->mutex);
      gate->entered = true;
      gate->changed.notify_all();
      gate->changed.wait(lock, [&] { return gate->released; });
    };
  }
  bool wait_entered() {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, kArrival, [&] { return entered; });
  }
  void release() {
    std::lock_guard lock(mutex);
    released = true;
    changed.notify_all();
  }
};

std::unique_ptr<DaemonClient> start_client(DaemonClient::Options options) {
  StatusOr<std::unique_ptr<DaemonClient>> client = DaemonClient::start(std::move(options));
  INFO(client.status().to_string());
  REQUIRE(client.ok());
  return std::move(client).value();
}

DaemonClient::Options options_for(const std::string& endpoint) {
  DaemonClient::Options o;
  o.endpoint = endpoint;
  o.hello = hello();
  return o;
}

// A voluntary context switch: the thread blocked (waited for a lock, I/O, a condition).
long this_thread_voluntary_context_switches() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nvcsw;
}

uint64_t accounted(const DaemonClient::Counters& c) {
  return c.sent + c.dropped_queue_full + c.dropped_unsendable;
}

}  // namespace

TEST_CASE("offered messages reach the daemon unchanged and in order, after the Hello and before the Goodbye") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  auto client = start_client(options_for(("ipc://" + (dir / "daemon.sock"))));

  // The Hello opens the connection: it is the handshake that says the client can send.
  CHECK(daemon.receive() == WireMessage(hello()));

  const std::vector<WireMessage> offered = {hot_report(1), captured(), hot_report(2, 64), hello(),
                                            Goodbye{4242, "kforge disabled: test"}};
  for (const WireMessage& m : offered) CHECK(client->offer(m));
  for (const WireMessage& m : offered) CHECK(daemon.receive() == m);

  client->stop("interpreter exit");
  CHECK(daemon.receive() == WireMessage(Goodbye{static_cast<int32_t>(::getpid()), "interpreter exit"}));

  const DaemonClient::Counters c = client->counters();
  CHECK(c.offered == offered.size());
  CHECK(c.sent == offered.size());   // the client's own Hello and Goodbye are not counted
  CHECK(c.dropped_queue_full == 0);
  CHECK(c.dropped_unsendable == 0);
  // After stop(), offer() refuses and counts.
  CHECK_FALSE(client->offer(hot_report(3)));
  CHECK(client->counters().dropped_unsendable == 1);
  CHECK(accounted(client->counters()) == client->counters().offered);
}

TEST_CASE("KernelReady and Revoke from the daemon reach on_message, on the connection the hook opened") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  Inbox inbox;
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.on_message = inbox.callback();
  auto client = start_client(std::move(options));
  REQUIRE(daemon.receive() == WireMessage(hello()));

  daemon.send(encode(kernel_ready()));
  daemon.send(encode(revoke()));
  const std::vector<WireMessage> delivered = inbox.wait_for(2);
  REQUIRE(delivered.size() == 2);
  CHECK(delivered[0] == WireMessage(kernel_ready()));
  CHECK(delivered[1] == WireMessage(revoke()));
  CHECK(client->counters().received == 2);
  CHECK(client->counters().received_malformed == 0);
  client.reset();   // before `inbox`, which on_message writes to
}

TEST_CASE("malformed messages from the daemon are counted and never delivered, and the client keeps working") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  Inbox inbox;
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.on_message = inbox.callback();
  auto client = start_client(std::move(options));
  REQUIRE(daemon.receive() == WireMessage(hello()));

  const std::string ready = encode(kernel_ready());
  daemon.send("GET / HTTP/1.1\r\n\r\n");                       // not msgpack at all
  daemon.send(ready.substr(0, ready.size() - 1));               // torn
  daemon.send_parts({"", ready});                               // REQ-style envelope: two frames
  daemon.send(encode(hello()));                                 // only hooks send Hello
  daemon.send(std::string(ready).replace(2, 6, "kforgf"));      // wrong magic
  daemon.send(ready);                                           // the marker: arrives last
  // One connection keeps order, so once the marker is delivered every bad message was handled.
  const std::vector<WireMessage> delivered = inbox.wait_for(1);
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0] == WireMessage(kernel_ready()));
  CHECK(client->counters().received_malformed == 5);
  CHECK(client->counters().received == 1);

  // Still connected both ways.
  CHECK(client->offer(hot_report(7)));
  CHECK(daemon.receive() == WireMessage(hot_report(7)));
  daemon.send(encode(revoke()));
  CHECK(inbox.wait_for(2).size() == 2);
  CHECK(client->counters().received_malformed == 5);
  client.reset();
}

TEST_CASE("an exception thrown by on_message is swallowed and later messages are still delivered") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  Inbox inbox;
  auto record = inbox.callback();
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.on_message = [&, calls = 0](const WireMessage& m) mutable {
    record(m);
    if (++calls == 1) throw std::runtime_error("bug in the hook's handler");
  };
  auto client = start_client(std::move(options));
  REQUIRE(daemon.receive() == WireMessage(hello()));

  daemon.send(encode(kernel_ready()));
  daemon.send(encode(revoke()));
  CHECK(inbox.wait_for(2).size() == 2);
  CHECK(client->counters().received == 2);
  client.reset();
}

TEST_CASE("with no daemon, 10000 offers return at once and never block, every drop is counted, and stop() keeps its bound") {
  TempDir dir{"kforge-client"};
  DaemonClient::Options options = options_for(("ipc://" + (dir / "nobody-serves-this.sock")));
  auto client = start_client(options);

  // Built beforehand: only offer() itself is timed, and a HotReport moves without allocating.
  constexpr size_t kOffers = 10000;
  std::vector<WireMessage> messages;
  messages.reserve(kOffers);
  for (size_t i = 0; i < kOffers; ++i) messages.emplace_back(hot_report(i + 1, 2));

  // On a shared virtual machine a loop that only reads the clock sees gaps of 4-12 ms many times a
  // second (vCPU preemption by the host), and one may land inside any call. So the latency bound is
  // on the 99.9th percentile, and blocking is checked directly: a voluntary context switch during
  // a call that queued means offer() itself waited for something. A refused call also destroys the
  // message, and free() may wait for malloc's arena lock (the client thread frees this thread's
  // messages too); that is the allocator, as anywhere the caller frees, so it is only reported.
  std::vector<Clock::duration> latencies;
  latencies.reserve(kOffers);
  long waited_queued = 0;
  long waited_refused = 0;
  for (WireMessage& m : messages) {
    const long voluntary_before = this_thread_voluntary_context_switches();
    const Clock::time_point t0 = Clock::now();
    const bool queued = client->offer(std::move(m));
    latencies.push_back(Clock::now() - t0);
    (queued ? waited_queued : waited_refused) += this_thread_voluntary_context_switches() - voluntary_before;
  }

  Clock::duration total{0};
  for (Clock::duration d : latencies) total += d;
  std::sort(latencies.begin(), latencies.end());
  const auto percentile = [&](double p) { return latencies[static_cast<size_t>(p * (kOffers - 1))]; };
  const auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  std::printf("no daemon: %zu offers: total %.0f us; per call p50 %.2f us, p99 %.2f us, p99.9 %.1f us, "
              "max %.1f us; voluntary context switches: %ld in calls that queued, %ld in calls that refused\n",
              kOffers, us(total), us(percentile(0.5)), us(percentile(0.99)), us(percentile(0.999)),
              us(latencies.back()), waited_queued, waited_refused);
  // Sanitizer runtimes take locks of their own inside the atomics and system calls they intercept,
  // so only an uninstrumented build can show that offer()'s own path never waits.
  if (kSlowdown == 1) CHECK(waited_queued == 0);
  CHECK(percentile(0.999) < 1ms * kSlowdown);
  CHECK(total < 100ms * kSlowdown);

  const Clock::time_point t0 = Clock::now();
  client->stop();
  const Clock::duration stopping = Clock::now() - t0;
  std::printf("no daemon: stop() took %.0f us (bound %d ms)\n", us(stopping), options.stop_timeout_ms);
  CHECK(stopping < std::chrono::milliseconds(options.stop_timeout_ms) + kSchedulingSlack);

  const DaemonClient::Counters c = client->counters();
  CHECK(c.offered == kOffers);
  CHECK(c.sent == 0);
  CHECK(c.dropped_queue_full + c.dropped_unsendable == kOffers);
}

TEST_CASE("a full queue refuses what does not fit and counts it, then sends what it holds") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  auto gate = std::make_shared<Gate>();
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.queue_capacity = 8;
  options.on_message = Gate::callback(gate);
  auto client = start_client(std::move(options));
  REQUIRE(daemon.receive() == WireMessage(hello()));

  // Park the client thread in on_message: now nothing drains the queue.
  daemon.send(encode(kernel_ready()));
  REQUIRE(gate->wait_entered());
  for (uint64_t seq = 1; seq <= 8; ++seq) CHECK(client->offer(hot_report(seq)));
  for (uint64_t seq = 9; seq <= 13; ++seq) CHECK_FALSE(client->offer(hot_report(seq)));
  CHECK(client->counters().dropped_queue_full == 5);

  gate->release();
  for (uint64_t seq = 1; seq <= 8; ++seq) CHECK(daemon.receive() == WireMessage(hot_report(seq)));
  client->stop();
  const DaemonClient::Counters c = client->counters();
  CHECK(c.offered == 13);
  CHECK(c.sent == 8);
  CHECK(c.dropped_queue_full == 5);
  CHECK(c.dropped_unsendable == 0);
}

TEST_CASE("a daemon that is killed and restarted on the same endpoint gets the Hello again, then new messages") {
  TempDir dir{"kforge-client"};
  const std::string endpoint = ("ipc://" + (dir / "daemon.sock"));
  auto first = std::make_unique<FakeDaemon>(endpoint);
  auto client = start_client(options_for(endpoint));
  REQUIRE(first->receive() == WireMessage(hello()));
  CHECK(client->offer(hot_report(1)));
  CHECK(first->receive() == WireMessage(hot_report(1)));

  first->kill();
  FakeDaemon second(endpoint);
  // ZeroMQ reconnects on its own (100 ms, backing off to 1 s); the Hello says it did.
  const Clock::time_point t0 = Clock::now();
  CHECK(second.receive() == WireMessage(hello()));
  std::printf("restarted daemon: Hello again after %.0f ms\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  CHECK(client->offer(hot_report(2)));
  CHECK(second.receive() == WireMessage(hot_report(2)));
  client->stop("interpreter exit");
  CHECK(second.receive() == WireMessage(Goodbye{static_cast<int32_t>(::getpid()), "interpreter exit"}));
}

TEST_CASE("connected() is false until a daemon completes the handshake, and false again once it is gone") {
  TempDir dir{"kforge-client"};
  const std::string endpoint = ("ipc://" + (dir / "daemon.sock"));
  auto client = start_client(options_for(endpoint));
  const auto becomes = [&](bool want) {
    const Clock::time_point deadline = Clock::now() + kArrival;
    while (client->connected() != want && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return client->connected() == want;
  };
  std::this_thread::sleep_for(kSchedulingSlack);
  CHECK_FALSE(client->connected());
  auto daemon = std::make_unique<FakeDaemon>(endpoint);
  REQUIRE(daemon->receive() == WireMessage(hello()));
  CHECK(becomes(true));
  // Offered once connected() is true: sent (after the Hello), not dropped.
  CHECK(client->offer(captured()));
  CHECK(daemon->receive() == WireMessage(captured()));
  daemon->kill();
  CHECK(becomes(false));
  CHECK(client->counters().dropped_unsendable == 0);
}

TEST_CASE("stop() with a full queue and a daemon that reads nothing returns within the bound, every message accounted for") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")), /*receive_hwm=*/1);
  auto gate = std::make_shared<Gate>();
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.queue_capacity = 64;
  options.send_hwm = 4;
  // Room to encode what fits in a third of it even under a sanitizer, so the thread exits (is not
  // detached) and every message is accounted for when stop() returns.
  options.stop_timeout_ms = 1000;
  options.on_message = Gate::callback(gate);
  auto client = start_client(options);
  REQUIRE(daemon.receive() == WireMessage(hello()));

  daemon.send(encode(kernel_ready()));
  REQUIRE(gate->wait_entered());
  const HotReport big = hot_report(1, 512);   // ~100 KiB encoded: the socket buffers fill quickly
  for (size_t i = 0; i < options.queue_capacity; ++i) CHECK(client->offer(big));

  gate->release();
  const Clock::time_point t0 = Clock::now();
  client->stop();
  const Clock::duration stopping = Clock::now() - t0;
  std::printf("daemon not reading: stop() with %zu queued reports took %.1f ms (bound %d ms)\n",
              options.queue_capacity, std::chrono::duration<double, std::milli>(stopping).count(),
              options.stop_timeout_ms);
  CHECK(stopping < std::chrono::milliseconds(options.stop_timeout_ms) + kSchedulingSlack);

  const DaemonClient::Counters c = client->counters();
  CHECK(c.offered == options.queue_capacity);
  CHECK(c.dropped_unsendable > 0);
  CHECK(accounted(c) == c.offered);
}

TEST_CASE("stop() returns within the bound even when on_message never returns") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  auto gate = std::make_shared<Gate>();
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.stop_timeout_ms = 100;
  options.on_message = Gate::callback(gate);
  auto client = start_client(options);
  REQUIRE(daemon.receive() == WireMessage(hello()));

  daemon.send(encode(kernel_ready()));
  REQUIRE(gate->wait_entered());
  for (uint64_t seq = 1; seq <= 10; ++seq) CHECK(client->offer(hot_report(seq)));

  const Clock::time_point t0 = Clock::now();
  client->stop();   // logs that the thread was detached
  const Clock::duration stopping = Clock::now() - t0;
  CHECK(stopping >= 100ms);
  CHECK(stopping < 100ms + kSchedulingSlack);
  client.reset();
  gate->release();   // the detached thread finishes on its own, with state it co-owns
}

TEST_CASE("offer() from several threads at once: per-thread order is kept and every message is delivered or counted") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  DaemonClient::Options options = options_for(("ipc://" + (dir / "daemon.sock")));
  options.queue_capacity = 16;
  options.send_hwm = 100000;   // so drops come from the queue alone
  auto client = start_client(options);
  REQUIRE(daemon.receive() == WireMessage(hello()));

  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 2000;
  std::atomic<int> running{kThreads};
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint64_t seq = 1; seq <= kPerThread; ++seq) {
        HotReport r;
        r.pid = t + 1;
        r.sequence = seq;
        static_cast<void>(client->offer(std::move(r)));
      }
      running.fetch_sub(1);
    });
  }

  std::map<int32_t, uint64_t> last_sequence;
  uint64_t received = 0;
  bool in_order = true;
  const Clock::time_point give_up = Clock::now() + 30s;
  for (;;) {
    if (running.load() == 0) {
      const DaemonClient::Counters c = client->counters();
      if (accounted(c) == c.offered && received == c.sent) break;
    }
    if (Clock::now() > give_up) break;
    std::optional<std::string> bytes = daemon.receive_bytes(50ms);
    if (!bytes) continue;
    StatusOr<WireMessage> m = decode(*bytes);
    REQUIRE(m.ok());
    const auto* r = std::get_if<HotReport>(&*m);
    REQUIRE(r != nullptr);
    in_order = in_order && r->sequence > last_sequence[r->pid];
    last_sequence[r->pid] = r->sequence;
    ++received;
  }
  for (std::thread& p : producers) p.join();
  client->stop();

  const DaemonClient::Counters c = client->counters();
  std::printf("4 producers: %llu offered, %llu sent, %llu dropped (queue full)\n",
              static_cast<unsigned long long>(c.offered), static_cast<unsigned long long>(c.sent),
              static_cast<unsigned long long>(c.dropped_queue_full));
  CHECK(in_order);
  CHECK(c.offered == kThreads * kPerThread);
  CHECK(accounted(c) == c.offered);
  CHECK(received == c.sent);
  CHECK(c.sent > 0);
}

TEST_CASE("a fork()ed child can destroy its copy of the client, and the parent's client keeps working") {
  TempDir dir{"kforge-client"};
  FakeDaemon daemon(("ipc://" + (dir / "daemon.sock")));
  auto client = start_client(options_for(("ipc://" + (dir / "daemon.sock"))));
  REQUIRE(daemon.receive() == WireMessage(hello()));

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(5);   // a hang in the child fails the test instead of stalling it
    static_cast<void>(client->offer(hot_report(99)));
    client.reset();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  CHECK(client->offer(hot_report(1)));
  CHECK(daemon.receive() == WireMessage(hot_report(1)));
}

TEST_CASE("start() rejects malformed endpoints and options, but an endpoint nobody serves is fine") {
  TempDir dir{"kforge-client"};
  const auto start_with = [](DaemonClient::Options o) { return DaemonClient::start(std::move(o)); };
  const auto with_endpoint = [](std::string endpoint) {
    DaemonClient::Options o;
    o.endpoint = std::move(endpoint);
    return o;
  };
  for (const char* bad : {"", "daemon.sock", "bogus://daemon", "tcp://127.0.0.1", "tcp://127.0.0.1:notaport"}) {
    INFO(bad);
    StatusOr<std::unique_ptr<DaemonClient>> c = start_with(with_endpoint(bad));
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
  }

  DaemonClient::Options o = with_endpoint(("ipc://" + (dir / "daemon.sock")));
  o.queue_capacity = 1;
  CHECK(start_with(o).status().code() == StatusCode::kInvalidArgument);
  o = with_endpoint(("ipc://" + (dir / "daemon.sock")));
  o.send_hwm = 0;
  CHECK(start_with(o).status().code() == StatusCode::kInvalidArgument);
  o = with_endpoint(("ipc://" + (dir / "daemon.sock")));
  o.stop_timeout_ms = -1;
  CHECK(start_with(o).status().code() == StatusCode::kInvalidArgument);

  CHECK(start_with(with_endpoint(("ipc://" + (dir / "nobody/here.sock")))).ok());
  CHECK(start_with(with_endpoint("tcp://127.0.0.1:1")).ok());
}

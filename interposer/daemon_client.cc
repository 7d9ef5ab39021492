// DaemonClient: a bounded lock-free queue in front of one thread that owns every ZeroMQ socket.
// The user's threads only ever touch the queue, a few atomic counters and, to wake an idle
// thread, an eventfd (Note [Waking the client thread]). Everything that can be slow or can fail
// (encoding, sockets, decoding, the callback) happens on the client thread, and stop() bounds how
// long anyone waits for it (Note [Stopping within the bound]).
#include "interposer/daemon_client.h"

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "runtime/transport.h"

namespace kforge {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// offer() is noexcept and runs on the user's threads: moving a message into the queue must neither
// throw nor allocate.
static_assert(std::is_nothrow_move_constructible_v<wire::WireMessage>);

// A daemon that goes away is retried after 100 ms, backing off to once a second while it stays
// away: a restarted daemon is found quickly, an absent one costs one connect attempt a second.
constexpr int kReconnectInitialMs = 100;
constexpr int kReconnectMaxMs = 1000;
// Bounds one loop turn in each direction, so a flood from the daemon cannot starve sending and a
// producer offering at full speed cannot starve receiving or stop().
constexpr size_t kMaxReceivesPerTurn = 64;
// Each client has its own ZeroMQ context, and inproc names are per context: no collisions.
constexpr const char* kMonitorEndpoint = "inproc://kforge-daemon-client-monitor";

void log_line(const std::string& what) noexcept {
  std::fprintf(stderr, "kforge: daemon client: %s\n", what.c_str());
}

// The failure policy allows one line per kind of trouble; the counters carry the rest.
class LogOnce {
 public:
  template <typename MakeLine>
  void operator()(MakeLine&& make_line) noexcept {
    if (logged_.exchange(true, std::memory_order_relaxed)) return;
    try {
      log_line(make_line());
    } catch (...) {   // building the line can only fail to allocate; the counters still count
    }
  }

 private:
  std::atomic<bool> logged_{false};
};

// Vyukov's bounded MPMC queue, used with one consumer (the client thread). Each slot's sequence
// number says whose turn it is: == position, free for the producer of that position;
// == position + 1, holds that position's message for the consumer. Producers claim a position with
// one CAS and publish with a release store, so offer() takes no lock and allocates nothing; a
// producer preempted between claiming and publishing delays only the consumer, never another
// producer. Needs at least two slots (with one, "free for position p + 1" and "full at p" would
// be the same sequence number).
class MessageRing {
 public:
  explicit MessageRing(size_t capacity) : capacity_(capacity), slots_(new Slot[capacity]) {
    for (size_t i = 0; i < capacity_; ++i) slots_[i].sequence.store(i, std::memory_order_relaxed);
  }

  // Moves from `message` only on success.
  bool try_push(wire::WireMessage& message) noexcept {
    uint64_t pos = enqueue_pos_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[pos % capacity_];
      const uint64_t seq = slot.sequence.load(std::memory_order_acquire);
      const auto diff = static_cast<int64_t>(seq - pos);
      if (diff == 0) {
        if (enqueue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          slot.message.emplace(std::move(message));
          slot.sequence.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;   // the slot still holds the message from one lap ago: full
      } else {
        pos = enqueue_pos_.load(std::memory_order_relaxed);   // another producer took it
      }
    }
  }

  // Client thread only. Empty also while the next producer is between claiming and publishing;
  // that producer wakes the thread after it publishes.
  std::optional<wire::WireMessage> try_pop() noexcept {
    Slot& slot = slots_[dequeue_pos_ % capacity_];
    if (slot.sequence.load(std::memory_order_acquire) != dequeue_pos_ + 1) return std::nullopt;
    std::optional<wire::WireMessage> message = std::move(slot.message);
    slot.message.reset();
    slot.sequence.store(dequeue_pos_ + capacity_, std::memory_order_release);
    ++dequeue_pos_;
    return message;
  }

 private:
  struct Slot {
    std::atomic<uint64_t> sequence{0};
    std::optional<wire::WireMessage> message;
  };
  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> enqueue_pos_{0};
  alignas(64) uint64_t dequeue_pos_ = 0;
};

class EventFd {
 public:
  EventFd() = default;
  explicit EventFd(int fd) : fd_(fd) {}
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  ~EventFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const noexcept { return fd_; }

  // Non-blocking: fails only if the counter would overflow 2^64 - 2, which one write per wakeup
  // never reaches.
  void signal() const noexcept {
    const uint64_t one = 1;
    while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  void clear() const noexcept {
    uint64_t value = 0;
    while (::read(fd_, &value, sizeof value) < 0 && errno == EINTR) {
    }
  }

 private:
  int fd_ = -1;
};

// Note [Waking the client thread]
// The client thread sleeps in zmq::poll on the DEALER, the monitor socket and an eventfd. A
// producer publishes its message, then sets wake_pending; only the producer that flips it from
// false writes the eventfd, so a busy thread costs producers no system call. The thread reads the
// eventfd, then clears wake_pending (an RMW, acq_rel), then drains the queue. Either a producer's
// RMW comes after the thread's in wake_pending's modification order, so it sees false and writes
// the eventfd again (the next poll returns), or it comes before, so the thread's RMW synchronizes
// with it and the drain sees its message. No message can sit in the queue while the thread sleeps.

// What the user's threads and the client thread share. The client thread co-owns it, so a thread
// that stop() had to detach still finds it alive.
struct ClientState {
  explicit ClientState(size_t capacity)
      : queue(capacity), wakeup(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  MessageRing queue;
  EventFd wakeup;
  std::atomic<bool> wake_pending{false};

  std::atomic<bool> stop_requested{false};
  // Written by stop() before its release store of stop_requested; read by the client thread only
  // after it has seen stop_requested.
  std::string goodbye_reason;
  Clock::time_point stop_deadline;

  std::function<void(const wire::WireMessage&)> on_message;

  std::atomic<uint64_t> offered{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> dropped_queue_full{0};
  std::atomic<uint64_t> dropped_unsendable{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> received_malformed{0};
  std::atomic<bool> connected{false};   // mirrors the client thread's connected_ (for connected())

  LogOnce log_malformed;
  LogOnce log_callback_threw;
  LogOnce log_send_failed;
  LogOnce log_thread_failed;
  LogOnce log_handshake_failed;
  std::string endpoint;   // for log lines; set before the thread starts

  std::mutex exit_mutex;
  std::condition_variable exit_cv;
  bool exited = false;   // guarded by exit_mutex
};

// Owned by the client thread alone once it starts. Members are destroyed in reverse order, so the
// context outlives its sockets.
struct Connection {
  zmq::context_t context;
  zmq::socket_t dealer;
  zmq::socket_t monitor;      // ZMQ_EVENT_HANDSHAKE_* / DISCONNECTED of the DEALER
  std::string hello_bytes;    // encoded once at start(); empty: no Hello
};

class ClientThread {
 public:
  ClientThread(ClientState& state, Connection& connection) : state_(state), conn_(connection) {}

  void run() noexcept {
    std::string goodbye_reason;
    try {
      loop();
      goodbye_reason = state_.goodbye_reason;
    } catch (const std::exception& e) {
      state_.log_thread_failed([&] { return std::string("stopped sending, messages are dropped: ") + e.what(); });
      goodbye_reason = "kforge daemon client failed";
    } catch (...) {
      goodbye_reason = "kforge daemon client failed";
    }
    try {
      shut_down(goodbye_reason);
    } catch (...) {   // the sockets close with their owner below; the thread must still report
    }
    {
      std::lock_guard lock(state_.exit_mutex);
      state_.exited = true;
    }
    state_.exit_cv.notify_all();
  }

 private:
  void loop() {
    zmq_pollitem_t items[] = {
        {conn_.monitor.handle(), 0, ZMQ_POLLIN, 0},
        {conn_.dealer.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, state_.wakeup.fd(), ZMQ_POLLIN, 0},
    };
    bool backlog = false;
    while (!state_.stop_requested.load(std::memory_order_acquire)) {
      try {
        zmq::poll(items, std::size(items), backlog ? milliseconds(0) : milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[2].revents & ZMQ_POLLIN) {
        state_.wakeup.clear();
        state_.wake_pending.exchange(false, std::memory_order_acq_rel);
      }
      // Connection events first, so a new connection gets its Hello before anything queued.
      if (items[0].revents & ZMQ_POLLIN) handle_connection_events();
      if (items[1].revents & ZMQ_POLLIN) receive_from_daemon();
      backlog = send_queued();
    }
  }

  // Returns true if the turn ended with messages possibly still queued.
  bool send_queued() {
    const size_t per_turn = 1024;
    for (size_t i = 0; i < per_turn; ++i) {
      // Once stop() is waiting, shut_down() sends the rest within its budget.
      if (state_.stop_requested.load(std::memory_order_relaxed)) return false;
      std::optional<wire::WireMessage> message = state_.queue.try_pop();
      if (!message) return false;
      send_offered(*message);
    }
    return true;
  }

  void send_offered(const wire::WireMessage& message) {
    // Not connected: sending would fail anyway (ZMQ_IMMEDIATE), and not encoding saves the
    // process the work while no daemon runs.
    if (!connected_) {
      state_.dropped_unsendable.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    bool sent = false;
    try {
      sent = send_bytes(wire::encode(message));
    } catch (const std::exception& e) {   // encode can only fail to allocate
      state_.log_send_failed([&] { return std::string("cannot encode a message: ") + e.what(); });
    }
    (sent ? state_.sent : state_.dropped_unsendable).fetch_add(1, std::memory_order_relaxed);
  }

  // False when ZeroMQ would block (high-water mark reached, or no daemon connected).
  bool send_bytes(const std::string& bytes) {
    try {
      return conn_.dealer.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      state_.log_send_failed([&] { return std::string("send failed: ") + e.what(); });
      return false;
    }
  }

  void handle_connection_events() {
    for (;;) {
      zmq::message_t event;
      if (!conn_.monitor.recv(event, zmq::recv_flags::dontwait)) return;
      uint16_t id = 0;   // frame 1: u16 event id, u32 value (native order); frame 2: endpoint
      if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
      for (bool more = event.more(); more;) {
        zmq::message_t part;
        if (!conn_.monitor.recv(part, zmq::recv_flags::dontwait)) break;
        more = part.more();
      }
      if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        connected_ = true;
        state_.connected.store(true, std::memory_order_relaxed);
        if (!conn_.hello_bytes.empty()) send_bytes(conn_.hello_bytes);
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        connected_ = false;
        state_.connected.store(false, std::memory_order_relaxed);
      } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                 id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        // Typically a CURVE key that is not the daemon's: nothing gets through until it is fixed.
        state_.log_handshake_failed([&] {
          return "the handshake with the daemon at " + state_.endpoint +
                 " failed (a wrong KFORGE_DAEMON_SERVER_KEY?); reports are dropped and counted until it succeeds";
        });
      }
    }
  }

  void receive_from_daemon() {
    for (size_t i = 0; i < kMaxReceivesPerTurn; ++i) {
      zmq::message_t frame;
      if (!conn_.dealer.recv(frame, zmq::recv_flags::dontwait)) return;
      const bool multipart = frame.more();
      for (bool more = multipart; more;) {
        zmq::message_t part;
        if (!conn_.dealer.recv(part, zmq::recv_flags::dontwait)) break;
        more = part.more();
      }
      if (multipart) {
        reject("a multi-part message (the protocol is one message per frame)");
        continue;
      }
      StatusOr<wire::WireMessage> message = wire::decode(frame.to_string_view());
      if (!message.ok()) {
        reject(message.status().message());
        continue;
      }
      const wire::MessageType type = wire::message_type(*message);
      if (type != wire::MessageType::kKernelReady && type != wire::MessageType::kRevoke) {
        reject(std::string("a ") + std::string(wire::message_type_name(type)) +
               " message, which only hooks send");
        continue;
      }
      state_.received.fetch_add(1, std::memory_order_relaxed);
      deliver(*message);
    }
  }

  void reject(const std::string& reason) {
    state_.received_malformed.fetch_add(1, std::memory_order_relaxed);
    state_.log_malformed([&] {
      return "dropped a malformed message from the daemon: " + reason + " (further ones are counted, not logged)";
    });
  }

  void deliver(const wire::WireMessage& message) {
    if (!state_.on_message) return;
    try {
      state_.on_message(message);
    } catch (const std::exception& e) {
      state_.log_callback_threw([&] { return std::string("on_message threw (ignored): ") + e.what(); });
    } catch (...) {
      state_.log_callback_threw([] { return std::string("on_message threw a non-standard exception (ignored)"); });
    }
  }

  // Note [Stopping within the bound]
  // stop() waits until stop_deadline for the thread to report that it exited. The thread spends
  // at most the first third of that budget sending what is queued (the rest is dropped, counted,
  // without being encoded), then sends the Goodbye. LINGER is 0 while running, but closing a
  // socket with LINGER 0 discards what ZeroMQ has not yet written, the Goodbye included; so before
  // closing it raises LINGER to a third of the time left, and terminating the context waits at
  // most that long for a connected daemon to take the last messages. With no daemon connected
  // nothing is pending (ZMQ_IMMEDIATE) and termination is immediate. The thirds leave room for one
  // slow encode and a busy scheduler. Beyond that, the only way past the deadline is an on_message
  // call that does not return (or a starved CPU); stop() then detaches the thread.
  void shut_down(const std::string& goodbye_reason) {
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline =
        state_.stop_requested.load(std::memory_order_acquire) ? state_.stop_deadline : start;
    const Clock::time_point send_until = start + (deadline - start) / 3;
    while (std::optional<wire::WireMessage> message = state_.queue.try_pop()) {
      if (Clock::now() < send_until) {
        send_offered(*message);
      } else {
        state_.dropped_unsendable.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (connected_) {
      try {
        send_bytes(wire::encode(wire::Goodbye{static_cast<int32_t>(::getpid()), goodbye_reason}));
      } catch (const std::exception&) {   // out of memory: no Goodbye; the sockets must still close
      }
    }

    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    const int linger_ms = static_cast<int>(std::max<int64_t>(0, left.count() / 3));
    conn_.dealer.set(zmq::sockopt::linger, linger_ms);
    zmq_socket_monitor(conn_.dealer.handle(), nullptr, 0);
    conn_.monitor.close();
    conn_.dealer.close();
    conn_.context.close();
  }

  ClientState& state_;
  Connection& conn_;
  bool connected_ = false;   // between HANDSHAKE_SUCCEEDED and DISCONNECTED
};

// The client thread must not take the process's signals (a serving process may expect them on
// its own threads); it inherits the mask in effect when it is created.
class AllSignalsBlocked {
 public:
  AllSignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous_);
  }
  AllSignalsBlocked(const AllSignalsBlocked&) = delete;
  AllSignalsBlocked& operator=(const AllSignalsBlocked&) = delete;
  ~AllSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

 private:
  sigset_t previous_;
};

}  // namespace

struct DaemonClient::Impl {
  std::shared_ptr<ClientState> state;
  // Joined or detached by stop(); released (leaked) in a forked child, where the thread it names
  // does not exist and neither join nor detach is safe.
  std::unique_ptr<std::thread> thread;
  pid_t owner_pid = 0;
  int stop_timeout_ms = 0;
  std::atomic<bool> stop_called{false};
};

StatusOr<std::unique_ptr<DaemonClient>> DaemonClient::start(Options options) {
  if (options.endpoint.empty()) return invalid_argument("daemon endpoint is empty");
  if (options.queue_capacity < 2) {
    return invalid_argument("daemon client queue_capacity must be at least 2, got " +
                            std::to_string(options.queue_capacity));
  }
  if (options.send_hwm < 1) {
    return invalid_argument("daemon client send_hwm must be at least 1, got " + std::to_string(options.send_hwm));
  }
  if (options.stop_timeout_ms < 0) {
    return invalid_argument("daemon client stop_timeout_ms must not be negative, got " +
                            std::to_string(options.stop_timeout_ms));
  }
  try {
    auto state = std::make_shared<ClientState>(options.queue_capacity);
    if (state->wakeup.fd() < 0) return unavailable(std::string("cannot create an eventfd: ") + std::strerror(errno));
    state->on_message = std::move(options.on_message);

    auto conn = std::make_unique<Connection>();
    if (options.hello) conn->hello_bytes = wire::encode(*options.hello);
    conn->dealer = zmq::socket_t(conn->context, zmq::socket_type::dealer);
    conn->dealer.set(zmq::sockopt::linger, 0);
    conn->dealer.set(zmq::sockopt::sndhwm, options.send_hwm);
    conn->dealer.set(zmq::sockopt::immediate, 1);
    conn->dealer.set(zmq::sockopt::reconnect_ivl, kReconnectInitialMs);
    conn->dealer.set(zmq::sockopt::reconnect_ivl_max, kReconnectMaxMs);
    // A daemon -> hook message is small; a peer announcing more is cut off before we allocate.
    conn->dealer.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxMessageBytes));
    if (!options.curve_server_key.empty()) {
      KFORGE_RETURN_IF_ERROR(transport::make_curve_client(conn->dealer, options.curve_server_key));
    }
    state->endpoint = options.endpoint;
    if (zmq_socket_monitor(conn->dealer.handle(), kMonitorEndpoint,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
      throw zmq::error_t();
    }
    conn->monitor = zmq::socket_t(conn->context, zmq::socket_type::pair);
    conn->monitor.set(zmq::sockopt::linger, 0);
    conn->monitor.connect(kMonitorEndpoint);   // before the DEALER connects: no event is missed
    try {
      conn->dealer.connect(options.endpoint);
    } catch (const zmq::error_t& e) {
      return invalid_argument("daemon endpoint '" + options.endpoint + "': " + e.what());
    }

    std::unique_ptr<DaemonClient> client(new DaemonClient());
    client->impl_ = std::make_unique<Impl>();
    Impl& impl = *client->impl_;
    impl.state = state;
    impl.owner_pid = ::getpid();
    impl.stop_timeout_ms = options.stop_timeout_ms;
    {
      AllSignalsBlocked blocked;
      impl.thread = std::make_unique<std::thread>([state, conn = std::move(conn)]() mutable {
        ClientThread(*state, *conn).run();
      });
    }
    pthread_setname_np(impl.thread->native_handle(), "kforge-client");
    return client;
  } catch (const zmq::error_t& e) {
    return unavailable(std::string("cannot create the daemon client's ZeroMQ sockets: ") + e.what());
  } catch (const std::exception& e) {
    return internal_error(std::string("cannot start the daemon client: ") + e.what());
  }
}

DaemonClient::~DaemonClient() { stop(); }

bool DaemonClient::offer(wire::WireMessage message) noexcept {
  ClientState& state = *impl_->state;
  state.offered.fetch_add(1, std::memory_order_relaxed);
  if (state.stop_requested.load(std::memory_order_relaxed)) {
    state.dropped_unsendable.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (!state.queue.try_push(message)) {
    state.dropped_queue_full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Note [Waking the client thread]
  if (!state.wake_pending.exchange(true, std::memory_order_acq_rel)) state.wakeup.signal();
  return true;
}

bool DaemonClient::connected() const noexcept {
  return impl_->state->connected.load(std::memory_order_relaxed);
}

DaemonClient::Counters DaemonClient::counters() const noexcept {
  const ClientState& state = *impl_->state;
  Counters c;
  c.offered = state.offered.load(std::memory_order_relaxed);
  c.sent = state.sent.load(std::memory_order_relaxed);
  c.dropped_queue_full = state.dropped_queue_full.load(std::memory_order_relaxed);
  c.dropped_unsendable = state.dropped_unsendable.load(std::memory_order_relaxed);
  c.received = state.received.load(std::memory_order_relaxed);
  c.received_malformed = state.received_malformed.load(std::memory_order_relaxed);
  return c;
}

void DaemonClient::stop(std::string_view goodbye_reason) noexcept {
  Impl& impl = *impl_;
  if (impl.stop_called.exchange(true)) return;
  if (::getpid() != impl.owner_pid) {
    // A fork()ed child: its copy of the thread handle names the parent's thread, and the sockets
    // belong to the parent's ZeroMQ context. Touching either is unsafe; leaking them is not.
    static_cast<void>(impl.thread.release());
    return;
  }
  ClientState& state = *impl.state;
  try {
    state.goodbye_reason.assign(goodbye_reason);
  } catch (...) {   // out of memory: the Goodbye goes without a reason
  }
  const Clock::time_point deadline = Clock::now() + milliseconds(impl.stop_timeout_ms);
  state.stop_deadline = deadline;
  state.stop_requested.store(true, std::memory_order_release);
  state.wakeup.signal();
  try {
    bool exited = false;
    {
      std::unique_lock lock(state.exit_mutex);
      exited = state.exit_cv.wait_until(lock, deadline, [&] { return state.exited; });
    }
    if (exited) {
      impl.thread->join();
    } else {
      impl.thread->detach();
      log_line("the client thread did not stop within " + std::to_string(impl.stop_timeout_ms) +
               " ms (an on_message call that does not return?); it was detached");
    }
  } catch (...) {   // join/detach failing means the thread is already gone; nothing to undo
  }
}

}  // namespace kforge

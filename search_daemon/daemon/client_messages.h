// ClientMessages: every message a client can send kforged, decoded defensively and applied to the
// registry. Hooks send wire messages (runtime/wire.h: Hello, HotReport, CapturedInputs, Goodbye);
// the CLI sends control requests (runtime/control_message.h). Whatever the bytes, handle() returns:
// a malformed message is counted, logged (rate-limited: LogLimiter) and answered, if it looked
// like a control request, with an error naming what was wrong. No socket here: the daemon's I/O
// loop feeds it frames, and the fuzz target (tests/fuzz/fuzz_daemon_messages.cc) feeds it anything.
//
//   ClientMessages messages(context);
//   ClientMessages::Effects e = messages.handle(peer, credentials, frame, /*multipart=*/false);
//   if (e.reply) send_to(peer, *e.reply);
//   if (e.processes_changed) pool.set_serving_gpus(...);
//
// Not thread-safe: the caller holds the lock that guards the registry and the counters.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/control_message.h"
#include "search_daemon/daemon/hot_signatures.h"
#include "search_daemon/daemon/log_limiter.h"

namespace kforge::daemon {

using Counters = std::map<std::string, uint64_t>;

class ClientMessages {
 public:
  struct Context {
    HotSignatures* hot = nullptr;
    Counters* counters = nullptr;
    LogLimiter* limiter = nullptr;
    std::function<void(const std::string& level, const std::string& line)> log;
    // The directory the daemon publishes to, and whether a process's cache is that directory
    // (Note [Shared cache] in daemon.cc); looked at once per Hello.
    std::string daemon_cache_dir;
    std::function<bool(const std::string& a, const std::string& b)> same_directory;
    // The status document (JSON text) for a status request.
    std::function<std::string(const control::ControlRequest&)> status;
  };

  struct Effects {
    std::optional<std::string> reply;   // to send back to the peer
    bool processes_changed = false;     // who is attached, or which GPUs they use
    bool signatures_changed = false;    // counts arrived: the scheduler may have work
  };

  explicit ClientMessages(Context context) : ctx_(std::move(context)) {}

  // One frame from `peer`; `multipart`: it came with more frames (refused: one message a frame).
  Effects handle(const std::string& peer, const PeerCredentials& creds, std::string_view bytes, bool multipart);

 private:
  void count(const std::string& name, uint64_t n = 1) { (*ctx_.counters)[name] += n; }
  void log_limited(const std::string& key, const std::string& level, const std::string& line);
  Effects handle_wire(const std::string& peer, const PeerCredentials& creds, std::string_view bytes);
  Effects handle_control(std::string_view bytes);

  Context ctx_;
};

}  // namespace kforge::daemon

#include "search_daemon/daemon/client_messages.h"

#include <variant>

#include "runtime/wire.h"

namespace kforge::daemon {

void ClientMessages::log_limited(const std::string& key, const std::string& level, const std::string& line) {
  if (!ctx_.log) return;
  if (std::optional<std::string> admitted = ctx_.limiter->admit(key, line, SteadyClock::now())) ctx_.log(level, *admitted);
}

ClientMessages::Effects ClientMessages::handle(const std::string& peer, const PeerCredentials& creds, std::string_view bytes,
                                               bool multipart) {
  if (multipart) {
    count("messages_malformed");
    log_limited("malformed", "warn", "a peer sent a multi-part message (one message a frame); dropped");
    return {};
  }
  if (control::is_control_message(bytes)) return handle_control(bytes);
  return handle_wire(peer, creds, bytes);
}

ClientMessages::Effects ClientMessages::handle_control(std::string_view bytes) {
  Effects e;
  count("control_requests");
  StatusOr<control::ControlRequest> req = control::decode_request(bytes);
  if (!req.ok()) {
    count("control_malformed");
    log_limited("control", "warn", "refused a control request: " + req.status().message());
    e.reply = control::encode_error(req.status().message());
    return e;
  }
  e.reply = control::encode_status_reply(ctx_.status(*req));
  return e;
}

ClientMessages::Effects ClientMessages::handle_wire(const std::string& peer, const PeerCredentials& creds,
                                                    std::string_view bytes) {
  Effects e;
  StatusOr<wire::WireMessage> m = wire::decode(bytes);
  if (!m.ok()) {
    count("messages_malformed");
    log_limited("malformed", "warn", "malformed message from a peer" +
                                         (creds.pid > 0 ? " (pid " + std::to_string(creds.pid) + ")" : std::string()) +
                                         ": " + m.status().message());
    return e;
  }
  count("messages_received");
  HotSignatures& hot = *ctx_.hot;
  if (const auto* h = std::get_if<wire::Hello>(&*m)) {
    hot.on_hello(peer, *h, creds);
    e.processes_changed = true;
    const bool shares = ctx_.same_directory(h->cache_dir, ctx_.daemon_cache_dir);
    if (ProcessRecord* p = hot.process(peer)) p->shares_cache = shares;
    log_limited("attach", "info", "process " + std::to_string(h->pid) +
                                      (creds.pid > 0 && creds.pid != h->pid ? " (pid " + std::to_string(creds.pid) + " here)" : "") +
                                      " attached (torch " + h->torch_version.substr(0, 64) + ")");
    if (!shares) {
      log_limited("cache", "warn",
                  "process " + std::to_string(h->pid) +
                      (h->cache_dir.empty() ? std::string(" has no cache directory") : " uses the cache at " + h->cache_dir) +
                      " but this daemon publishes to " + ctx_.daemon_cache_dir +
                      ": it will not load the kernels found here (give both the same directory: KFORGE_CACHE_DIR "
                      "for the process, daemon.cache_dir for the daemon)");
    }
  } else if (const auto* r = std::get_if<wire::HotReport>(&*m)) {
    const uint64_t refused = hot.on_report(peer, *r, creds);
    count("reports_received");
    e.processes_changed = true;
    e.signatures_changed = !r->entries.empty();
    if (refused > 0) {
      count("signatures_refused", refused);
      const ProcessRecord* p = hot.process(peer);
      log_limited("quota", "warn", "process " + std::to_string(r->pid) + " reported more than " +
                                       std::to_string(hot.options().max_signatures_per_process) + " signatures; " +
                                       std::to_string(p != nullptr ? p->signatures_refused : refused) +
                                       " refused so far (daemon.max_signatures_per_process)");
    }
  } else if (const auto* c = std::get_if<wire::CapturedInputs>(&*m)) {
    if (hot.on_captured(peer, *c, creds)) {
      count("captured_inputs_received");
    } else {
      count("captured_inputs_refused");
    }
  } else if (const auto* g = std::get_if<wire::Goodbye>(&*m)) {
    hot.on_goodbye(peer, *g, creds);
    e.processes_changed = true;
    log_limited("detach", "info", "process " + std::to_string(g->pid) + " detached: " + g->reason.substr(0, 200));
  } else {
    count("messages_malformed");
    log_limited("malformed", "warn", "a peer sent a daemon-to-hook message type; dropped");
  }
  return e;
}

}  // namespace kforge::daemon

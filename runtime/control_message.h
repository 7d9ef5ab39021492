// Control messages: what the CLI (and any local tool) asks kforged, and what it answers. One header
// for both sides, beside the hooks' wire protocol (wire.h): both travel on the daemon's ROUTER
// socket, one frame each; a control message is a JSON object, a wire message a msgpack array, so
// the first byte tells them apart (is_control_message).
//
//   request:  {"kforge_ctl": 1, "request": "status", "limit": 20}      ("limit" optional)
//   reply:    {"kforge_ctl": 1, "ok": true, "status": {...}}  or  {"kforge_ctl": 1, "ok": false, "error": "..."}
//
//   std::string bytes = control::encode_request({control::Request::kStatus, 20});
//   StatusOr<control::ControlRequest> r = control::decode_request(bytes);   // the daemon
//   if (!r.ok()) reply(control::encode_error(r.status().message()));
//
// Promises of decode_request() and decode_reply():
//   - never throw, whatever the bytes (a local client may send anything);
//   - refuse more than kMaxRequestBytes / kMaxReplyBytes before parsing;
//   - every refusal names what was wrong: the field, its JSON type, the value allowed.
// A request with a field this version does not know is refused (CLI and daemon ship together; a
// silently ignored option would be worse than an error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace kforge::control {

inline constexpr int kControlVersion = 1;
inline constexpr size_t kMaxRequestBytes = 64u << 10;
inline constexpr size_t kMaxReplyBytes = 256u << 20;
inline constexpr uint32_t kMaxLimit = 1000000;

enum class Request : uint8_t {
  kStatus,   // the daemon's status document (slots, processes, signatures, counters)
};
std::string_view request_name(Request r) noexcept;   // "status"

struct ControlRequest {
  Request request = Request::kStatus;
  // status: at most this many signatures, the largest time shares first (the document says how
  // many there are in all). nullopt: every signature.
  std::optional<uint32_t> limit;

  bool operator==(const ControlRequest&) const = default;
};

// Whether a frame on the daemon's socket is a control message (JSON object) rather than a wire
// message (msgpack array): its first byte after JSON whitespace is '{'.
bool is_control_message(std::string_view bytes) noexcept;

std::string encode_request(const ControlRequest& r);
StatusOr<ControlRequest> decode_request(std::string_view bytes);

// Replies. `status_json` is the status document as JSON text (an object).
std::string encode_status_reply(std::string_view status_json);
std::string encode_error(std::string_view error);
// The status document (JSON text) of an ok reply; an error reply becomes an error carrying the
// daemon's message; anything else an error saying what was wrong with it.
StatusOr<std::string> decode_status_reply(std::string_view bytes);

}  // namespace kforge::control

#include "runtime/control_message.h"

#include <nlohmann/json.hpp>

namespace kforge::control {

namespace {

using json = nlohmann::json;

// The JSON type of a value, for error messages ("a string", "null").
std::string type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "something else";
  }
}

// Parses without exceptions; an error names what the bytes are not.
StatusOr<json> parse_object(std::string_view bytes, size_t max_bytes, std::string_view what) {
  if (bytes.size() > max_bytes) {
    return invalid_argument(std::string(what) + " of " + std::to_string(bytes.size()) + " bytes is over the limit of " +
                            std::to_string(max_bytes));
  }
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(std::string(what) + " is not valid JSON");
  if (!j.is_object()) return invalid_argument(std::string(what) + " is " + type_of(j) + ", expected a JSON object");
  const auto v = j.find("kforge_ctl");
  if (v == j.end()) return invalid_argument(std::string(what) + " has no \"kforge_ctl\" field");
  if (!v->is_number_integer() || v->get<int64_t>() != kControlVersion) {
    return invalid_argument(std::string(what) + ": \"kforge_ctl\" is " +
                            (v->is_number_integer() ? std::to_string(v->get<int64_t>()) : type_of(*v)) +
                            ", expected the integer " + std::to_string(kControlVersion));
  }
  return j;
}

}  // namespace

std::string_view request_name(Request r) noexcept {
  switch (r) {
    case Request::kStatus: return "status";
  }
  return "?";
}

bool is_control_message(std::string_view bytes) noexcept {
  for (char c : bytes) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

std::string encode_request(const ControlRequest& r) {
  json j{{"kforge_ctl", kControlVersion}, {"request", std::string(request_name(r.request))}};
  if (r.limit) j["limit"] = *r.limit;
  return j.dump();
}

StatusOr<ControlRequest> decode_request(std::string_view bytes) {
  StatusOr<json> parsed = parse_object(bytes, kMaxRequestBytes, "control request");
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  ControlRequest out;
  const auto req = j.find("request");
  if (req == j.end()) return invalid_argument("control request has no \"request\" field (known: status)");
  if (!req->is_string()) return invalid_argument("control request: \"request\" is " + type_of(*req) + ", expected a string (known: status)");
  const std::string& name = req->get_ref<const std::string&>();
  if (name == "status") {
    out.request = Request::kStatus;
  } else {
    return invalid_argument("control request: unknown request \"" + name.substr(0, 64) + "\" (known: status)");
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "kforge_ctl" || key == "request") continue;
    if (key == "limit") {
      if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0)) {
        return invalid_argument("control request: \"limit\" is " + type_of(value) + ", expected an integer in 0.." +
                                std::to_string(kMaxLimit));
      }
      const uint64_t n = value.get<uint64_t>();
      if (n > kMaxLimit) {
        return invalid_argument("control request: \"limit\" is " + std::to_string(n) + ", expected at most " +
                                std::to_string(kMaxLimit));
      }
      out.limit = static_cast<uint32_t>(n);
      continue;
    }
    return invalid_argument("control request: unknown field \"" + key.substr(0, 64) + "\" (known: kforge_ctl, request, limit)");
  }
  return out;
}

std::string encode_status_reply(std::string_view status_json) {
  std::string out = R"({"kforge_ctl":1,"ok":true,"status":)";
  out.append(status_json);
  out.push_back('}');
  return out;
}

std::string encode_error(std::string_view error) {
  // Invalid UTF-8 in an error (a client's bytes quoted back) is replaced, never thrown.
  const json j{{"kforge_ctl", kControlVersion}, {"ok", false}, {"error", std::string(error)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<std::string> decode_status_reply(std::string_view bytes) {
  StatusOr<json> parsed = parse_object(bytes, kMaxReplyBytes, "the daemon's reply");
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  const auto ok = j.find("ok");
  if (ok == j.end() || !ok->is_boolean()) return invalid_argument("the daemon's reply has no boolean \"ok\" field");
  if (!ok->get<bool>()) {
    const auto e = j.find("error");
    return invalid_argument(e != j.end() && e->is_string() ? e->get<std::string>() : std::string("the daemon refused, saying nothing"));
  }
  const auto st = j.find("status");
  if (st == j.end() || !st->is_object()) return invalid_argument("the daemon's reply has no status object");
  return st->dump();
}

}  // namespace kforge::control

// The control-message schema (runtime/control_message.h): what the CLI asks kforged and what it
// answers. A local client may send anything; every refusal must name what was wrong, never throw.
#include <catch2/catch.hpp>

#include "runtime/control_message.h"

using namespace kforge;
using namespace kforge::control;

TEST_CASE("control: a status request round-trips, with and without a limit") {
  const ControlRequest plain{Request::kStatus, std::nullopt};
  const ControlRequest limited{Request::kStatus, 20};
  CHECK(decode_request(encode_request(plain)).value() == plain);
  CHECK(decode_request(encode_request(limited)).value() == limited);
  CHECK(is_control_message(encode_request(plain)));
  CHECK(is_control_message("  \n{"));
  CHECK_FALSE(is_control_message("\x94\xa6kforge"));
  CHECK_FALSE(is_control_message(""));
}

TEST_CASE("control: every malformed request is refused with a reason naming the field, never a throw") {
  // The first four crashed kforged before (an uncaught nlohmann::json type error): issue 19, item 1.
  const std::pair<const char*, const char*> cases[] = {
      {R"({"kforge_ctl": "1", "request": "status"})", "\"kforge_ctl\" is a string, expected the integer 1"},
      {R"({"kforge_ctl": null, "request": "status"})", "\"kforge_ctl\" is null"},
      {R"({"kforge_ctl": [1], "request": "status"})", "\"kforge_ctl\" is an array"},
      {R"({"kforge_ctl": {"a": 1}, "request": "status"})", "\"kforge_ctl\" is an object"},
      {R"({"kforge_ctl": 2, "request": "status"})", "\"kforge_ctl\" is 2, expected the integer 1"},
      {R"({"kforge_ctl": 1.0, "request": "status"})", "\"kforge_ctl\" is a number"},
      {R"({"request": "status"})", "no \"kforge_ctl\" field"},
      {R"({"kforge_ctl": 1})", "no \"request\" field"},
      {R"({"kforge_ctl": 1, "request": 7})", "\"request\" is an integer, expected a string"},
      {R"({"kforge_ctl": 1, "request": "explode"})", "unknown request \"explode\""},
      {R"({"kforge_ctl": 1, "request": "status", "limit": -1})", "\"limit\" is an integer, expected an integer in 0..1000000"},
      {R"({"kforge_ctl": 1, "request": "status", "limit": "5"})", "\"limit\" is a string"},
      {R"({"kforge_ctl": 1, "request": "status", "limit": 1e9})", "\"limit\" is a number"},
      {R"({"kforge_ctl": 1, "request": "status", "limit": 2000000})", "\"limit\" is 2000000, expected at most 1000000"},
      {R"({"kforge_ctl": 1, "request": "status", "sudo": true})", "unknown field \"sudo\""},
      {R"([1, 2])", "is an array, expected a JSON object"},
      {R"({not json)", "is not valid JSON"},
      {"", "is not valid JSON"},
  };
  for (const auto& [text, reason] : cases) {
    INFO(text);
    StatusOr<ControlRequest> r = decode_request(text);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains(reason));
  }
  const std::string huge = R"({"kforge_ctl": 1, "request": "status", "x": ")" + std::string(70000, 'a') + "\"}";
  CHECK_THAT(decode_request(huge).status().message(), Catch::Contains("over the limit of 65536"));
}

TEST_CASE("control: replies carry the status document or the daemon's error") {
  CHECK(decode_status_reply(encode_status_reply(R"({"signatures": []})")).value() == R"({"signatures":[]})");
  StatusOr<std::string> refused = decode_status_reply(encode_error("unknown request \"x\""));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message() == "unknown request \"x\"");
  // An error quoting invalid UTF-8 is still a valid reply.
  CHECK_FALSE(decode_status_reply(encode_error("bad \xff\xfe bytes")).ok());
  CHECK_THAT(decode_status_reply(R"({"kforge_ctl": 1, "ok": true})").status().message(), Catch::Contains("no status object"));
  CHECK_THAT(decode_status_reply(R"({"kforge_ctl": 1})").status().message(), Catch::Contains("no boolean \"ok\""));
  CHECK_THAT(decode_status_reply("garbage").status().message(), Catch::Contains("not valid JSON"));
}

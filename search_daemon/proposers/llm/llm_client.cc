#include "search_daemon/proposers/llm/llm_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/version.h"

namespace kforge::llm {

namespace {

using nlohmann::json;

// A body larger than this is refused: no chat answer comes close, and it bounds what a broken or
// hostile server can make the daemon hold.
constexpr size_t kMaxResponseBytes = 8u << 20;
// The API's error message in our errors and log lines is cut to this many bytes.
constexpr size_t kMaxQuotedBytes = 400;
// Bytes of request or answer per token when the API reports no usage (Note [Budgets]).
constexpr double kBytesPerEstimatedToken = 4;

std::string field(std::string_view name) { return "llm." + std::string(name); }

// ---- libcurl handles -----------------------------------------------------------------------------

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct EasyDeleter {
  void operator()(CURL* h) const noexcept { curl_easy_cleanup(h); }
};
using EasyHandle = std::unique_ptr<CURL, EasyDeleter>;

struct SlistDeleter {
  void operator()(curl_slist* l) const noexcept { curl_slist_free_all(l); }
};
using HeaderList = std::unique_ptr<curl_slist, SlistDeleter>;

struct UrlDeleter {
  void operator()(CURLU* u) const noexcept { curl_url_cleanup(u); }
};
using UrlHandle = std::unique_ptr<CURLU, UrlDeleter>;

// One part of a parsed URL, or "" when absent.
std::string url_part(CURLU* u, CURLUPart part) {
  char* value = nullptr;
  if (curl_url_get(u, part, &value, 0) != CURLUE_OK || value == nullptr) return {};
  std::string out(value);
  curl_free(value);
  return out;
}

bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host == "[::1]" || host == "::1" || host.substr(0, 4) == "127.";
}

std::string trim_trailing_slashes(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// base_url without its trailing slashes and a final "/v1" (the form providers document: the client
// adds "/v1/..." itself).
std::string api_root(std::string base_url) {
  std::string s = trim_trailing_slashes(std::move(base_url));
  if (s.size() >= 3 && s.compare(s.size() - 3, 3, "/v1") == 0) s.resize(s.size() - 3);
  return trim_trailing_slashes(std::move(s));
}

bool is_env_name(std::string_view s) {
  if (s.empty()) return false;
  auto alpha = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!alpha(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

std::string fmt_seconds(uint32_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", ms / 1000.0);
  return buf;
}

std::string fmt_usd(double usd) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "$%.4f", usd);
  return buf;
}

// One line of printable text, at most `max` bytes: what the server said goes into messages and
// logs only in this form.
std::string one_line(std::string_view text, size_t max = kMaxQuotedBytes) {
  std::string out;
  for (char c : text) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u == 0x7f) ? ' ' : c;
  }
  return out;
}

// The API's own error message from an error body: {"error": {"message": ...}} (OpenAI, Anthropic,
// vLLM's newer versions), {"error": "..."} (llama.cpp, Ollama), {"message": ...} (vLLM); else the
// start of the body as it is.
std::string api_error_message(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_string()) return e->get<std::string>();
      if (e->is_object()) {
        std::string m;
        if (auto msg = e->find("message"); msg != e->end() && msg->is_string()) m = msg->get<std::string>();
        if (auto type = e->find("type"); type != e->end() && type->is_string()) {
          m += (m.empty() ? "" : " ") + ("(" + type->get<std::string>() + ")");
        }
        if (!m.empty()) return m;
      }
    }
    if (auto msg = j.find("message"); msg != j.end() && msg->is_string()) return msg->get<std::string>();
  }
  if (body.empty()) return "(empty body)";
  return "body: " + std::string(body.substr(0, kMaxQuotedBytes));
}

// Note [Retries]
// Retried: 429 (rate limits), 5xx (overloaded or failing servers), timeouts, and failures to
// connect, send or receive (a local server restarting). Not retried: other 4xx (a bad request, a
// bad key, an unknown model: the same request fails the same way), malformed bodies, oversized
// bodies, cancellation. The n-th retry waits min(max_backoff, initial * 2^(n-1)), drawn uniformly
// from its upper half ("equal jitter": concurrent searches that failed together do not retry in
// lockstep, and no wait is shorter than half the schedule). A Retry-After header (seconds or an
// HTTP date) or OpenAI's retry-after-ms replaces that wait; one longer than max_backoff_ms ends
// the retries with an error, since waiting less than the server asked only earns another 429.
bool retryable_transport(CURLcode c) {
  switch (c) {
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

bool retryable_status(long status) { return status == 429 || (status >= 500 && status <= 599); }

// The wait a response asks for, in ms, or -1 when it asks for none (or says it unreadably).
int64_t retry_after_ms(CURL* h) {
  curl_header* hdr = nullptr;
  if (curl_easy_header(h, "retry-after-ms", 0, CURLH_HEADER, -1, &hdr) == CURLHE_OK && hdr->value != nullptr) {
    char* end = nullptr;
    const double ms = std::strtod(hdr->value, &end);
    if (end != hdr->value && std::isfinite(ms) && ms >= 0 && ms < 1e12) return static_cast<int64_t>(std::ceil(ms));
  }
  if (curl_easy_header(h, "retry-after", 0, CURLH_HEADER, -1, &hdr) == CURLHE_OK && hdr->value != nullptr) {
    std::string_view v(hdr->value);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    if (!v.empty() && v.size() <= 9 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::stoll(std::string(v)) * 1000;
    }
    const time_t when = curl_getdate(hdr->value, nullptr);
    if (when != -1) return std::max<int64_t>(0, (static_cast<int64_t>(when) - static_cast<int64_t>(std::time(nullptr))) * 1000);
  }
  return -1;
}

size_t write_body(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::pair<std::string, bool>*>(user);
  const size_t bytes = size * n;
  if (out->first.size() + bytes > kMaxResponseBytes) {
    out->second = true;   // oversized: returning less than given aborts the transfer
    return 0;
  }
  out->first.append(data, bytes);
  return bytes;
}

// What ends a transfer early: the client's cancel(), or the caller's own flag (complete()'s
// `abandon`). libcurl calls this about once a second even while no byte arrives.
struct CancelFlags {
  const std::atomic<bool>* client = nullptr;
  const std::atomic<bool>* call = nullptr;
  bool any() const {
    return client->load(std::memory_order_relaxed) || (call != nullptr && call->load(std::memory_order_relaxed));
  }
};

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const CancelFlags*>(user)->any() ? 1 : 0;
}

// ---- the two wire formats ------------------------------------------------------------------------

std::string_view role_name(ChatRole r) { return r == ChatRole::kAssistant ? "assistant" : "user"; }

std::string request_body(const LlmClientConfig& c, const ChatRequest& r) {
  json messages = json::array();
  if (c.api == ChatApi::kOpenAi && !r.system.empty()) {
    messages.push_back({{"role", "system"}, {"content", r.system}});
  }
  for (const ChatMessage& m : r.messages) messages.push_back({{"role", role_name(m.role)}, {"content", m.content}});
  json body = {{"model", c.model}, {"max_tokens", c.max_tokens}, {"temperature", c.temperature}, {"messages", messages}};
  if (c.api == ChatApi::kAnthropic && !r.system.empty()) body["system"] = r.system;
  if (c.stream) {   // Note [Streamed answers]
    body["stream"] = true;
    if (c.api == ChatApi::kOpenAi) body["stream_options"] = {{"include_usage", true}};
  }
  // Invalid UTF-8 in a prompt (a parent's source, a compile log) is replaced, never an exception.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Reads a non-negative integer member, or nullopt.
std::optional<uint64_t> count_at(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_number_integer()) return std::nullopt;
  const auto v = it->get<int64_t>();
  if (v < 0) return std::nullopt;
  return static_cast<uint64_t>(v);
}

// Anthropic's input tokens: prompt caching bills its cache writes and reads as input too.
std::optional<uint64_t> anthropic_input_tokens(const json& usage) {
  std::optional<uint64_t> in = count_at(usage, "input_tokens");
  if (in) *in += count_at(usage, "cache_creation_input_tokens").value_or(0) + count_at(usage, "cache_read_input_tokens").value_or(0);
  return in;
}

// The usage as the API reported it, or marked for an estimate when it did not report both counts;
// truncated from the stop reason.
void finish_answer(ChatApi api, ChatResponse& r, std::optional<uint64_t> in, std::optional<uint64_t> out) {
  r.truncated = api == ChatApi::kOpenAi ? r.stop_reason == "length" : r.stop_reason == "max_tokens";
  if (in && out) {
    r.usage.input_tokens = *in;
    r.usage.output_tokens = *out;
  } else {
    r.usage.estimated = true;
  }
}

// The answer's text, stop reason and usage, or what is wrong with the body ("choices[0].message:
// missing").
StatusOr<ChatResponse> parse_answer_body(ChatApi api, std::string_view body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    return invalid_argument("not JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) return invalid_argument("not a JSON object");
  ChatResponse r;
  std::optional<uint64_t> in, out;
  if (api == ChatApi::kOpenAi) {
    auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty()) return invalid_argument("choices: missing or empty");
    const json& c0 = (*choices)[0];
    if (!c0.is_object()) return invalid_argument("choices[0]: not an object");
    auto msg = c0.find("message");
    if (msg == c0.end() || !msg->is_object()) return invalid_argument("choices[0].message: missing");
    auto content = msg->find("content");
    if (content == msg->end() || !content->is_string()) {
      return invalid_argument("choices[0].message.content: missing or not text");
    }
    r.text = content->get<std::string>();
    if (auto fr = c0.find("finish_reason"); fr != c0.end() && fr->is_string()) r.stop_reason = fr->get<std::string>();
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      in = count_at(*u, "prompt_tokens");
      out = count_at(*u, "completion_tokens");
    }
  } else {
    auto content = j.find("content");
    if (content == j.end() || !content->is_array()) return invalid_argument("content: missing or not an array");
    bool any_text = false;
    for (const json& block : *content) {
      if (!block.is_object()) return invalid_argument("content[]: not an object");
      auto type = block.find("type");
      if (type == block.end() || *type != "text") continue;
      auto text = block.find("text");
      if (text == block.end() || !text->is_string()) return invalid_argument("content[].text: missing or not text");
      r.text += text->get<std::string>();
      any_text = true;
    }
    if (!any_text) return invalid_argument("content: no text block");
    if (auto sr = j.find("stop_reason"); sr != j.end() && sr->is_string()) r.stop_reason = sr->get<std::string>();
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      in = anthropic_input_tokens(*u);
      out = count_at(*u, "output_tokens");
    }
  }
  finish_answer(api, r, in, out);
  return r;
}

// Note [Streamed answers]
// With llm.stream (the default) the request asks for server-sent events: "stream": true, and for
// OpenAI-compatible servers "stream_options": {"include_usage": true} so the last event carries the
// token counts. A model writing a kernel for minutes then sends bytes all along, so a connection
// that stops delivering is found after llm.stream_idle_timeout_ms of silence (libcurl's low-speed
// limit: under 1 byte/s for that long; libcurl averages over its last 5 s, so up to about 6 s
// later), not at the end of the whole request_timeout_ms, and
// proxies that cut idle connections keep it open. The whole stream is read into memory (the same
// size limit as a body) and then parsed: the answer is used only once it is complete. Events:
// OpenAI's "data: {chunk}" lines (choices[0].delta.content appended, finish_reason, a final usage
// chunk) ended by "data: [DONE]"; Anthropic's message_start (input tokens), content_block_delta
// (text_delta appended; thinking and other deltas skipped), message_delta (stop reason, output
// tokens), message_stop, ping, error. A stream that ends before its last event, or carries an
// error event (an overloaded server), is retried as a dropped connection is (Note [Retries]); a
// data line that is not JSON is a malformed body. A server that ignores "stream" and answers with
// one JSON body is read as such.
StatusOr<ChatResponse> parse_stream_body(ChatApi api, std::string_view body) {
  ChatResponse r;
  std::optional<uint64_t> in, out;
  bool complete = false;
  size_t events = 0;
  std::string data;         // the current event's data lines, joined by '\n'
  bool has_data = false;
  auto error_of = [](const json& j) -> std::string {
    const json* e = &j;
    if (auto it = j.find("error"); it != j.end()) e = &*it;
    if (e->is_object()) {
      if (auto m = e->find("message"); m != e->end() && m->is_string()) return m->get<std::string>();
    }
    if (e->is_string()) return e->get<std::string>();
    return "(no message)";
  };
  auto dispatch = [&]() -> Status {
    if (!has_data) return Status();
    has_data = false;
    ++events;
    const std::string payload = std::move(data);
    data.clear();
    if (api == ChatApi::kOpenAi && payload == "[DONE]") {
      complete = true;
      return Status();
    }
    json j;
    try {
      j = json::parse(payload);
    } catch (const json::parse_error& e) {
      return invalid_argument("event " + std::to_string(events) + ": data is not JSON (byte " + std::to_string(e.byte) + ")");
    }
    if (!j.is_object()) return invalid_argument("event " + std::to_string(events) + ": data is not a JSON object");
    if (j.contains("error") || j.value("type", std::string()) == "error") {
      return unavailable("the stream carried an error: " + one_line(error_of(j)));
    }
    if (api == ChatApi::kOpenAi) {
      if (auto choices = j.find("choices"); choices != j.end() && choices->is_array() && !choices->empty()) {
        const json& c0 = (*choices)[0];
        if (c0.is_object()) {
          if (auto delta = c0.find("delta"); delta != c0.end() && delta->is_object()) {
            if (auto content = delta->find("content"); content != delta->end() && content->is_string()) {
              r.text += content->get<std::string>();
            }
          }
          if (auto fr = c0.find("finish_reason"); fr != c0.end() && fr->is_string()) r.stop_reason = fr->get<std::string>();
        }
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        in = count_at(*u, "prompt_tokens");
        out = count_at(*u, "completion_tokens");
      }
      return Status();
    }
    const std::string type = j.value("type", std::string());
    if (type == "message_start") {
      if (auto m = j.find("message"); m != j.end() && m->is_object()) {
        if (auto u = m->find("usage"); u != m->end() && u->is_object()) {
          in = anthropic_input_tokens(*u);
          if (auto o = count_at(*u, "output_tokens")) out = o;
        }
      }
    } else if (type == "content_block_delta") {
      if (auto d = j.find("delta"); d != j.end() && d->is_object() && d->value("type", std::string()) == "text_delta") {
        if (auto t = d->find("text"); t != d->end() && t->is_string()) r.text += t->get<std::string>();
      }
    } else if (type == "message_delta") {
      if (auto d = j.find("delta"); d != j.end() && d->is_object()) {
        if (auto sr = d->find("stop_reason"); sr != d->end() && sr->is_string()) r.stop_reason = sr->get<std::string>();
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (auto o = count_at(*u, "output_tokens")) out = o;
      }
    } else if (type == "message_stop") {
      complete = true;
    }
    return Status();
  };
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    if (end == std::string_view::npos) end = body.size();
    std::string_view line = body.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      KFORGE_RETURN_IF_ERROR(dispatch());
      continue;
    }
    if (line.front() == ':') continue;   // a comment (a keep-alive)
    if (line.substr(0, 5) == "data:") {
      std::string_view v = line.substr(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      if (has_data) data += '\n';
      data += v;
      has_data = true;
    }
    // "event:", "id:", "retry:": the data says all this client needs
  }
  KFORGE_RETURN_IF_ERROR(dispatch());
  if (api == ChatApi::kOpenAi && !complete && !r.stop_reason.empty() && in && out) complete = true;   // no [DONE], but finished
  if (!complete) {
    return unavailable("the stream ended before the answer was complete (" + std::to_string(events) + " events, " +
                       std::to_string(r.text.size()) + " bytes of text)");
  }
  finish_answer(api, r, in, out);
  return r;
}

// A streamed answer, or one JSON body from a server that does not stream.
StatusOr<ChatResponse> parse_any_body(ChatApi api, bool streamed, std::string_view body) {
  const size_t first = body.find_first_not_of(" \t\r\n");
  if (!streamed || (first != std::string_view::npos && body[first] == '{')) return parse_answer_body(api, body);
  return parse_stream_body(api, body);
}

}  // namespace

// ---- configuration -------------------------------------------------------------------------------

std::string_view chat_api_name(ChatApi api) noexcept { return api == ChatApi::kAnthropic ? "anthropic" : "openai"; }

StatusOr<ChatApi> chat_api_from_name(std::string_view name) {
  if (name == "openai") return ChatApi::kOpenAi;
  if (name == "anthropic") return ChatApi::kAnthropic;
  return invalid_argument("unknown chat API '" + std::string(name) + "' (expected openai or anthropic)");
}

Status LlmClientConfig::validate() const {
  if (api != ChatApi::kOpenAi && api != ChatApi::kAnthropic) return invalid_argument(field("api") + ": unknown API");
  if (base_url.empty()) return invalid_argument(field("base_url") + ": empty (e.g. http://127.0.0.1:8000)");
  {
    init_curl_once();
    UrlHandle u(curl_url());
    if (!u) return internal_error(field("base_url") + ": libcurl could not allocate a URL");
    // Never quote a URL that may hold credentials: only its parts that are known to be clean.
    if (curl_url_set(u.get(), CURLUPART_URL, base_url.c_str(), 0) != CURLUE_OK) {
      return invalid_argument(field("base_url") + ": not a URL with a scheme and a host (e.g. http://127.0.0.1:8000)");
    }
    const std::string scheme = url_part(u.get(), CURLUPART_SCHEME);
    if (scheme != "http" && scheme != "https") {
      return invalid_argument(field("base_url") + ": scheme '" + one_line(scheme, 16) + "' is not http or https");
    }
    if (!url_part(u.get(), CURLUPART_USER).empty() || !url_part(u.get(), CURLUPART_PASSWORD).empty()) {
      return invalid_argument(field("base_url") + ": credentials in the URL are not allowed (put the key in the "
                              "environment variable that llm.api_key_env names)");
    }
    if (!url_part(u.get(), CURLUPART_QUERY).empty() || !url_part(u.get(), CURLUPART_FRAGMENT).empty()) {
      return invalid_argument(field("base_url") + ": a query or fragment is not allowed");
    }
    if (url_part(u.get(), CURLUPART_HOST).empty()) return invalid_argument(field("base_url") + ": no host");
  }
  if (model.empty()) return invalid_argument(field("model") + ": empty");
  if (!api_key_env.empty() && !is_env_name(api_key_env)) {
    // Not quoted: a value that is not a variable name may be the key itself.
    return invalid_argument(field("api_key_env") +
                            ": must be the NAME of an environment variable ([A-Za-z_][A-Za-z0-9_]*) that holds the "
                            "key, never the key itself");
  }
  if (max_tokens < 1 || max_tokens > 1000000) {
    return invalid_argument(field("max_tokens") + ": " + std::to_string(max_tokens) + " is outside 1..1000000");
  }
  if (!finite_in(temperature, 0, 2)) return invalid_argument(field("temperature") + ": must be within 0..2");
  if (request_timeout_ms < 1 || request_timeout_ms > 3600000) {
    return invalid_argument(field("request_timeout_ms") + ": " + std::to_string(request_timeout_ms) +
                            " is outside 1..3600000");
  }
  if (stream && (stream_idle_timeout_ms < 1000 || stream_idle_timeout_ms > 3600000)) {
    return invalid_argument(field("stream_idle_timeout_ms") + ": " + std::to_string(stream_idle_timeout_ms) +
                            " is outside 1000..3600000");
  }
  if (max_retries > 100) return invalid_argument(field("max_retries") + ": " + std::to_string(max_retries) + " exceeds 100");
  if (initial_backoff_ms < 1 || initial_backoff_ms > 3600000) {
    return invalid_argument(field("initial_backoff_ms") + ": " + std::to_string(initial_backoff_ms) +
                            " is outside 1..3600000");
  }
  if (max_backoff_ms < initial_backoff_ms || max_backoff_ms > 3600000) {
    return invalid_argument(field("max_backoff_ms") + ": " + std::to_string(max_backoff_ms) + " is outside " +
                            field("initial_backoff_ms") + " (" + std::to_string(initial_backoff_ms) + ")..3600000");
  }
  if (!finite_in(max_cost_usd, 0, std::numeric_limits<double>::max())) {
    return invalid_argument(field("max_cost_usd") + ": must be a finite number >= 0");
  }
  if (!finite_in(input_usd_per_million, 0, std::numeric_limits<double>::max())) {
    return invalid_argument(field("input_usd_per_million") + ": must be a finite number >= 0");
  }
  if (!finite_in(output_usd_per_million, 0, std::numeric_limits<double>::max())) {
    return invalid_argument(field("output_usd_per_million") + ": must be a finite number >= 0");
  }
  return Status();
}

// ---- the client ----------------------------------------------------------------------------------

struct LlmClient::Attempt {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string body;
  bool oversized = false;
  int64_t retry_after_ms = -1;
  std::string transport_error;   // libcurl's message when code != CURLE_OK
};

StatusOr<std::unique_ptr<LlmClient>> LlmClient::create(LlmClientConfig config, LogSink log) {
  KFORGE_RETURN_IF_ERROR(config.validate());
  init_curl_once();
  std::string key;
  if (!config.api_key_env.empty()) {
    // The one place the key is read (the header says so). Surrounding whitespace (a newline from
    // `$(cat keyfile)`) is dropped; a control character inside would split the header line, so such
    // a value is refused, and never quoted.
    if (const char* v = std::getenv(config.api_key_env.c_str()); v != nullptr) key = v;
    const size_t first = key.find_first_not_of(" \t\r\n");
    key = first == std::string::npos ? std::string() : key.substr(first, key.find_last_not_of(" \t\r\n") - first + 1);
    if (std::any_of(key.begin(), key.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; })) {
      return invalid_argument(field("api_key_env") + ": $" + config.api_key_env +
                              " holds control characters, which no API key has");
    }
  }
  std::unique_ptr<LlmClient> c(new LlmClient(std::move(config), std::move(log), std::move(key)));
  const LlmClientConfig& k = c->config_;
  std::string line = "llm: " + std::string(chat_api_name(k.api)) + " API at " + c->endpoint_ + ", model " + k.model;
  if (k.api_key_env.empty()) {
    line += ", no key";
  } else {
    line += ", key from $" + k.api_key_env + (c->key_.empty() ? " (not set: requests go without a key)" : "");
  }
  line += ", max_tokens " + std::to_string(k.max_tokens) + ", timeout " + fmt_seconds(k.request_timeout_ms) + ", " +
          std::to_string(k.max_retries) + " retries";
  line += k.stream ? ", streamed (idle timeout " + fmt_seconds(k.stream_idle_timeout_ms) + ")" : std::string(", not streamed");
  line += ", token budget " + (k.max_total_tokens ? std::to_string(k.max_total_tokens) : std::string("unlimited"));
  line += ", cost budget " + (k.max_cost_usd > 0 ? fmt_usd(k.max_cost_usd) : std::string("unlimited"));
  // A local server is free: kforged's defaults carry a cost budget with no prices, which then never
  // binds. Said, not refused.
  if (k.max_cost_usd > 0 && k.input_usd_per_million == 0 && k.output_usd_per_million == 0) {
    line += " (no prices set: nothing costs, so only the token budget limits spending)";
  }
  c->log(line);
  if (!c->key_.empty() && !c->loopback_ && k.base_url.substr(0, 7) == "http://") {
    c->log("llm: warning: the key travels to " + c->endpoint_ + " unencrypted (use https)");
  }
  return c;
}

LlmClient::LlmClient(LlmClientConfig config, LogSink log, std::string key)
    : config_(std::move(config)),
      log_(std::move(log)),
      key_(std::move(key)),
      endpoint_(api_root(config_.base_url) + (config_.api == ChatApi::kAnthropic ? "/v1/messages" : "/v1/chat/completions")),
      loopback_([&] {
        UrlHandle u(curl_url());
        if (!u || curl_url_set(u.get(), CURLUPART_URL, config_.base_url.c_str(), 0) != CURLUE_OK) return false;
        return is_loopback_host(url_part(u.get(), CURLUPART_HOST));
      }()),
      rng_state_(std::random_device{}()) {}

LlmClient::~LlmClient() = default;

// Note [Key redaction]
// The key lives in key_ and in the one header of each request; no code path formats it. Whatever
// the server sends back (an error body, an echoed request, a malformed answer) may hold it, so
// every text that reaches a log line or an error passes through redact(), which replaces the key
// and every fragment of it of at least 8 bytes (the whole key, when it is shorter) with
// "[redacted]". Hosted APIs that quote a key back show a few characters of each end, which stay.
std::string LlmClient::redact(std::string_view text) const {
  if (key_.empty() || text.empty()) return std::string(text);
  const size_t frag = std::min<size_t>(8, key_.size());
  std::vector<bool> hit(text.size(), false);
  for (size_t i = 0; i + frag <= text.size(); ++i) {
    for (size_t j = 0; j + frag <= key_.size(); ++j) {
      if (text.compare(i, frag, key_, j, frag) == 0) {
        std::fill(hit.begin() + static_cast<std::ptrdiff_t>(i), hit.begin() + static_cast<std::ptrdiff_t>(i + frag), true);
        break;
      }
    }
  }
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (!hit[i]) {
      out += text[i++];
      continue;
    }
    out += "[redacted]";
    while (i < text.size() && hit[i]) ++i;
  }
  return out;
}

void LlmClient::log(std::string_view line) const {
  if (log_) log_(redact(line));
}

LlmSpend LlmClient::spend() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spend_;
}

Status LlmClient::budget_status() const {
  const LlmSpend s = spend();
  const uint64_t tokens = s.input_tokens + s.output_tokens;
  if (config_.max_total_tokens > 0 && tokens >= config_.max_total_tokens) {
    return out_of_range("llm: token budget spent: " + std::to_string(tokens) + " of " +
                        std::to_string(config_.max_total_tokens) + " tokens used (llm.max_total_tokens)");
  }
  if (config_.max_cost_usd > 0 && s.cost_usd >= config_.max_cost_usd) {
    return out_of_range("llm: cost budget spent: " + fmt_usd(s.cost_usd) + " of " + fmt_usd(config_.max_cost_usd) +
                        " used (llm.max_cost_usd)");
  }
  return Status();
}

// Note [Budgets]
// Checked before every HTTP request (retries too) and accounted after every answer, under mu_.
// Tokens are what the API reports (Anthropic's cache reads and writes count as input); a server
// that reports none is charged 4 bytes a token of the request body and the answer, so a budget
// still ends. Cost = input tokens x input price + output tokens x output price, per million.
void LlmClient::account(const TokenUsage& usage) {
  std::lock_guard<std::mutex> lock(mu_);
  spend_.input_tokens += usage.input_tokens;
  spend_.output_tokens += usage.output_tokens;
  spend_.cost_usd += config_.cost_usd(usage);
}

double LlmClientConfig::cost_usd(const TokenUsage& usage) const {
  return static_cast<double>(usage.input_tokens) * input_usd_per_million / 1e6 +
         static_cast<double>(usage.output_tokens) * output_usd_per_million / 1e6;
}

void LlmClient::cancel() {
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    cancelled_.store(true);
  }
  cancel_cv_.notify_all();
}

void LlmClient::interrupt() {
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
  }
  cancel_cv_.notify_all();
}

bool LlmClient::wait_for_retry(uint32_t ms, const std::atomic<bool>* abandon) {
  std::unique_lock<std::mutex> lock(cancel_mu_);
  return !cancel_cv_.wait_for(lock, std::chrono::milliseconds(ms),
                              [&] { return cancelled_.load() || (abandon != nullptr && abandon->load()); });
}

LlmClient::Attempt LlmClient::post(const std::string& url, const std::string& body, const std::atomic<bool>* abandon) {
  Attempt a;
  EasyHandle h(curl_easy_init());
  if (!h) {
    a.code = CURLE_FAILED_INIT;
    a.transport_error = "libcurl could not create a handle";
    return a;
  }
  HeaderList headers;
  auto add_header = [&](const std::string& line) {
    curl_slist* next = curl_slist_append(headers.get(), line.c_str());
    if (next != nullptr) {
      (void)headers.release();
      headers.reset(next);
    }
  };
  add_header("Content-Type: application/json");
  add_header(config_.stream ? "Accept: text/event-stream, application/json" : "Accept: application/json");
  add_header("Expect:");   // no 100-continue round trip before the body
  if (config_.api == ChatApi::kAnthropic) {
    add_header("anthropic-version: 2023-06-01");
    if (!key_.empty()) add_header("x-api-key: " + key_);
  } else if (!key_.empty()) {
    add_header("Authorization: Bearer " + key_);
  }

  std::pair<std::string, bool> sink;
  char errbuf[CURL_ERROR_SIZE] = {};
  CURL* c = h.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.request_timeout_ms));
  if (config_.stream) {   // Note [Streamed answers]: silence for stream_idle_timeout_ms ends the attempt
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(std::max<uint32_t>(1, config_.stream_idle_timeout_ms / 1000)));
  }
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "kforge/" KFORGE_VERSION_STRING);
  if (loopback_) curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &write_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &on_progress);
  CancelFlags flags{&cancelled_, abandon};
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &flags);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);

  a.code = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  a.body = std::move(sink.first);
  a.oversized = sink.second;
  if (a.code != CURLE_OK) a.transport_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(a.code);
  if (a.code == CURLE_OK && retryable_status(a.status)) a.retry_after_ms = retry_after_ms(c);
  return a;
}

StatusOr<ChatResponse> LlmClient::complete(const ChatRequest& request, const std::atomic<bool>* abandon) {
  // The header promises no exceptions; what could still throw here is allocation.
  try {
    return complete_or_throw(request, abandon);
  } catch (const std::exception& e) {
    return internal_error(redact(std::string("llm: ") + e.what()));
  }
}

StatusOr<ChatResponse> LlmClient::complete_or_throw(const ChatRequest& request, const std::atomic<bool>* abandon) {
  if (request.messages.empty()) return invalid_argument("llm: a chat request needs at least one message");
  const std::string body = request_body(config_, request);
  const std::string what = "llm: POST " + endpoint_;
  uint32_t attempts = 0;
  const CancelFlags stop{&cancelled_, abandon};
  for (;;) {
    if (stop.any()) return unavailable(what + ": cancelled");
    if (Status b = budget_status(); !b.ok()) return b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++spend_.requests;
    }
    ++attempts;
    const auto started = std::chrono::steady_clock::now();
    Attempt a = post(endpoint_, body, abandon);
    const auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();

    // What failed, and whether another try may go differently.
    std::string failure;
    bool retry = false;
    if (a.code == CURLE_ABORTED_BY_CALLBACK && stop.any()) return unavailable(what + ": cancelled");
    if (a.code == CURLE_WRITE_ERROR && a.oversized) {
      failure = "the response is larger than " + std::to_string(kMaxResponseBytes >> 20) + " MiB";
    } else if (a.code == CURLE_OPERATION_TIMEDOUT && config_.stream && took_ms + 500 < config_.request_timeout_ms) {
      failure = "no byte of the stream for " + std::to_string(config_.stream_idle_timeout_ms / 1000) +
                " s (llm.stream_idle_timeout_ms " + std::to_string(config_.stream_idle_timeout_ms) + ")";
      retry = true;
    } else if (a.code == CURLE_OPERATION_TIMEDOUT) {
      failure = "timed out after " + std::to_string(took_ms) + " ms (llm.request_timeout_ms " +
                std::to_string(config_.request_timeout_ms) + ")";
      retry = true;
    } else if (a.code != CURLE_OK) {
      failure = std::string(curl_easy_strerror(a.code)) + ": " + one_line(a.transport_error);
      retry = retryable_transport(a.code);
    } else if (a.status < 200 || a.status > 299) {
      failure = "HTTP " + std::to_string(a.status) + ": " + one_line(api_error_message(a.body));
      retry = retryable_status(a.status);
    } else {
      StatusOr<ChatResponse> r = parse_any_body(config_.api, config_.stream, a.body);
      if (!r.ok() && r.status().code() == StatusCode::kUnavailable) {   // a stream cut short, or an error event
        failure = r.status().message();
        retry = true;
      } else if (!r.ok()) {
        return invalid_argument(redact(what + ": malformed answer " + (config_.stream ? "stream: " : "body: ") +
                                       r.status().message() + " (starts: " + one_line(a.body, 120) + ")"));
      } else {
        if (r->usage.estimated) {
          r->usage.input_tokens = static_cast<uint64_t>(std::ceil(static_cast<double>(body.size()) / kBytesPerEstimatedToken));
          r->usage.output_tokens = static_cast<uint64_t>(std::ceil(static_cast<double>(r->text.size()) / kBytesPerEstimatedToken));
        }
        r->attempts = attempts;
        // The answer is returned and stored (a candidate's source): the key must not ride along.
        r->text = redact(r->text);
        r->stop_reason = redact(one_line(r->stop_reason, 64));
        account(r->usage);
        const LlmSpend s = spend();
        log("llm: answer from " + config_.model + " in " + std::to_string(took_ms) + " ms: " +
            std::to_string(r->usage.input_tokens) + " input + " + std::to_string(r->usage.output_tokens) + " output tokens" +
            (r->usage.estimated ? " (estimated)" : "") + (r->truncated ? ", cut off at max_tokens" : "") + "; spent " +
            std::to_string(s.input_tokens + s.output_tokens) + " tokens, " + fmt_usd(s.cost_usd));
        return r;
      }
    }

    if (!retry) return invalid_argument(redact(what + ": " + failure));
    if (attempts > config_.max_retries) {
      return unavailable(redact(what + ": " + failure + " (gave up after " + std::to_string(attempts) +
                                (attempts == 1 ? " attempt)" : " attempts)")));
    }
    uint32_t wait_ms = 0;
    if (a.retry_after_ms >= 0) {
      if (a.retry_after_ms > config_.max_backoff_ms) {
        return unavailable(redact(what + ": " + failure + "; the server asks to wait " +
                                  fmt_seconds(static_cast<uint32_t>(std::min<int64_t>(a.retry_after_ms, UINT32_MAX))) +
                                  " before retrying, more than llm.max_backoff_ms (" + std::to_string(config_.max_backoff_ms) +
                                  ")"));
      }
      wait_ms = static_cast<uint32_t>(a.retry_after_ms);
    } else {
      const uint32_t shift = std::min<uint32_t>(attempts - 1, 31);
      const uint64_t full = std::min<uint64_t>(config_.max_backoff_ms, uint64_t{config_.initial_backoff_ms} << shift);
      uint64_t r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // splitmix64: jitter needs no quality, only independence between clients.
        uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        r = z ^ (z >> 31);
      }
      const uint64_t half = full / 2;
      wait_ms = static_cast<uint32_t>(full - half + (half > 0 ? r % (half + 1) : 0));
    }
    log(what + ": " + failure + "; retry " + std::to_string(attempts) + " of " + std::to_string(config_.max_retries) +
        " in " + fmt_seconds(wait_ms) + (a.retry_after_ms >= 0 ? " (as the server asked)" : ""));
    if (!wait_for_retry(wait_ms, abandon)) return unavailable(what + ": cancelled");
  }
}

}  // namespace kforge::llm

// LlmClient: one chat completion at a time from a language model server, for LlmProposer. Two
// wire APIs over libcurl: OpenAI-compatible chat completions (POST {base_url}/v1/chat/completions,
// `Authorization: Bearer <key>`; vLLM, llama.cpp's server, Ollama and hosted services speak it)
// and Anthropic messages (POST {base_url}/v1/messages, `x-api-key: <key>`,
// `anthropic-version: 2023-06-01`). Torch-free.
//
//   LlmClientConfig c;
//   c.api = ChatApi::kAnthropic; c.base_url = "https://api.anthropic.com"; c.model = "...";
//   c.api_key_env = "ANTHROPIC_API_KEY";            // the variable's NAME; the key stays there
//   c.max_cost_usd = 5; c.input_usd_per_million = 3; c.output_usd_per_million = 15;
//   StatusOr<std::unique_ptr<LlmClient>> client = LlmClient::create(c, [](std::string_view l) { log(l); });
//   if (!client.ok()) return client.status();        // names the bad field: "llm.base_url: ..."
//   StatusOr<ChatResponse> r = (*client)->complete({.system = "...", .messages = {{ChatRole::kUser, "..."}}});
//   if (r.ok()) use(r->text, r->usage);
//
// Promises:
// - The API key is read once, in create(), from the environment variable that api_key_env names,
//   and is only ever written into the one request header that carries it. It never appears in a
//   log line, an error message or anything the client returns: every text that came from the
//   server passes through redaction first (Note [Key redaction] in llm_client.cc). No variable,
//   or an empty one: requests go without a key (local servers need none), said once in the log.
//   The answer's text is redacted too, so a server that echoes the key cannot plant it in a
//   candidate's source.
// - complete() never throws. An error names what went wrong: the HTTP status with the API's own
//   error message, a timeout, a connection failure, a malformed or oversized body, a spent budget.
// - Streaming (Note [Streamed answers]): with config.stream the answer is asked for as server-sent
//   events and read once complete; a stream cut short or carrying an error event is retried, and
//   one silent for stream_idle_timeout_ms ends the attempt.
// - Retries (Note [Retries]): 429, 5xx, timeouts and failed connections are retried up to
//   max_retries times with exponential backoff and jitter; a Retry-After (or retry-after-ms)
//   header is honoured, and one that asks for more than max_backoff_ms ends the retries with an
//   error saying so. Other 4xx answers and malformed bodies are never retried.
// - Budgets (Note [Budgets]): before every HTTP request the spent tokens and cost are checked
//   against max_total_tokens and max_cost_usd; a spent budget is an error naming that budget, and
//   no request is sent. Usage is accounted after each answer (as the API reports it; estimated at
//   4 bytes a token when it reports none). Thread-safe: several threads may call complete() at
//   once; a budget can then be overrun by the answers already in flight when it ran out.
// - Redirects are never followed (they could carry the key to another host), and only http and
//   https are spoken. A loopback base_url never goes through a proxy.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge::llm {

// Where the client's log lines go (one line per call, no trailing newline). Called from every
// thread that calls complete(), so it must be thread-safe.
using LogSink = std::function<void(std::string_view)>;

enum class ChatApi : uint8_t { kOpenAi = 0, kAnthropic = 1 };
std::string_view chat_api_name(ChatApi api) noexcept;          // "openai", "anthropic"
StatusOr<ChatApi> chat_api_from_name(std::string_view name);

struct TokenUsage;

struct LlmClientConfig {
  ChatApi api = ChatApi::kOpenAi;
  // Scheme, host, optional port and path prefix, with or without the "/v1" most providers document
  // (the client adds "/v1/chat/completions" or "/v1/messages" to the root): "http://127.0.0.1:8000",
  // "https://api.openai.com/v1", "https://api.anthropic.com". No credentials, query or fragment.
  std::string base_url;
  std::string model;
  // The NAME of the environment variable that holds the key ("OPENAI_API_KEY"); empty: no key.
  std::string api_key_env;
  uint32_t max_tokens = 8192;             // the answer's limit, sent with every request (1..1000000)
  double temperature = 0.7;               // 0..2
  uint32_t request_timeout_ms = 300000;   // one HTTP request, connect to last byte (1..3600000)
  // Note [Streamed answers] in llm_client.cc: ask for server-sent events, and end an attempt that
  // receives nothing for stream_idle_timeout_ms (1000..3600000). A server that answers with one
  // JSON body anyway is read as such.
  bool stream = false;
  uint32_t stream_idle_timeout_ms = 300000;
  uint32_t max_retries = 4;               // retries after the first attempt (0..100)
  uint32_t initial_backoff_ms = 1000;     // the first retry's delay before jitter (1..3600000)
  uint32_t max_backoff_ms = 60000;        // no delay is longer (>= initial_backoff_ms, <= 3600000)
  // Budgets over the client's life; 0 means unlimited.
  uint64_t max_total_tokens = 0;          // input + output tokens
  double max_cost_usd = 0;
  double input_usd_per_million = 0;       // prices, for the cost budget (>= 0; both 0: a free,
  double output_usd_per_million = 0;      // local server, and the cost budget never binds)

  // The first bad field, named as in the daemon's configuration: "llm.max_backoff_ms: 10 is less
  // than llm.initial_backoff_ms (1000)".
  Status validate() const;
  // What `usage` costs at these prices: input tokens x input price + output tokens x output
  // price, per million (the client's budget, and the proposer's per-signature spend).
  double cost_usd(const TokenUsage& usage) const;
};

enum class ChatRole : uint8_t { kUser = 0, kAssistant = 1 };

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
};

struct ChatRequest {
  std::string system;                  // the system prompt (may be empty)
  std::vector<ChatMessage> messages;   // at least one; the first from the user
};

struct TokenUsage {
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  bool estimated = false;              // the API reported none: 4 bytes a token
};

struct ChatResponse {
  std::string text;                    // the answer's text blocks, concatenated
  TokenUsage usage;
  std::string stop_reason;             // as the API says it: "stop", "length", "end_turn", ...
  bool truncated = false;              // the answer stopped at max_tokens
  uint32_t attempts = 0;               // HTTP requests this call made
};

// What the client has spent so far.
struct LlmSpend {
  uint64_t requests = 0;               // HTTP requests sent (retries included)
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  double cost_usd = 0;
};

class LlmClient {
 public:
  // Validates `config`, reads the key from the environment, and logs the configuration (never the
  // key) in one line.
  static StatusOr<std::unique_ptr<LlmClient>> create(LlmClientConfig config, LogSink log);
  ~LlmClient();
  LlmClient(const LlmClient&) = delete;
  LlmClient& operator=(const LlmClient&) = delete;

  // One answer to `request`, with the retries and budget checks above. Blocks for as long as that
  // takes (at most (max_retries + 1) requests of request_timeout_ms plus the backoffs). A non-null
  // `abandon` that becomes true ends this call as cancel() would (within about a second; a backoff
  // wait at once after interrupt()), and no other.
  StatusOr<ChatResponse> complete(const ChatRequest& request, const std::atomic<bool>* abandon = nullptr);

  // OK while both budgets have something left; else the error complete() would return, naming
  // the budget ("llm: token budget spent: 1100 of 1000 tokens used").
  Status budget_status() const;
  bool budget_exhausted() const { return !budget_status().ok(); }
  LlmSpend spend() const;

  // Ends every complete() in flight (its request is aborted, its backoff wait cut short) and makes
  // later calls fail at once. For the daemon's shutdown.
  void cancel();
  // Wakes every backoff wait so that calls whose `abandon` flag was set end now.
  void interrupt();

  const LlmClientConfig& config() const noexcept { return config_; }
  // The URL requests go to (base_url's root + "/v1/chat/completions" or "/v1/messages").
  const std::string& endpoint() const noexcept { return endpoint_; }
  // Whether a key was found in the environment (never the key).
  bool has_key() const noexcept { return !key_.empty(); }
  // `text` with the key, and every fragment of it of 8 bytes or more, replaced by "[redacted]"
  // (Note [Key redaction]). For callers that log what came back from the server (a model's answer).
  std::string redact(std::string_view text) const;

 private:
  LlmClient(LlmClientConfig config, LogSink log, std::string key);

  struct Attempt;   // one HTTP exchange (llm_client.cc)
  StatusOr<ChatResponse> complete_or_throw(const ChatRequest& request, const std::atomic<bool>* abandon);
  Attempt post(const std::string& url, const std::string& body, const std::atomic<bool>* abandon);
  void log(std::string_view line) const;
  // Waits `ms` unless cancel() (or `abandon`, after interrupt()) comes first; false when cancelled.
  bool wait_for_retry(uint32_t ms, const std::atomic<bool>* abandon);
  void account(const TokenUsage& usage);

  const LlmClientConfig config_;
  const LogSink log_;
  const std::string key_;              // never logged, never in a message (Note [Key redaction])
  const std::string endpoint_;         // base_url + "/v1/chat/completions" or "/v1/messages"
  const bool loopback_;                // base_url's host is 127.0.0.1, ::1 or localhost

  mutable std::mutex mu_;              // guards spend_, rng_state_
  LlmSpend spend_;
  uint64_t rng_state_ = 0;             // jitter (splitmix64)

  std::atomic<bool> cancelled_{false};
  std::mutex cancel_mu_;
  std::condition_variable cancel_cv_;
};

}  // namespace kforge::llm

// LlmClient and LlmProposer over real HTTP. The test process runs a scripted language-model server
// on 127.0.0.1 (an ephemeral port, cpp-httplib) that speaks both wire APIs, answers each request
// with the next scripted reply, and records every request it got, so each test says what the model
// answers and then checks what kforge sent and made of it. Nothing of ours is mocked: the client
// talks HTTP through libcurl, the proposer builds real prompts and parses real answers into
// KernelSpecs that must pass validate() and resolve().
//
// Synchronization is through the server's own state (its request log and a condition variable),
// never sleeps: a "slow" reply is one the server holds until the test releases it.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/kernel_spec.h"
#include "runtime/op_catalog.h"
#include "runtime/op_signature.h"
#include "search_daemon/proposers/llm/kernel_answer.h"
#include "search_daemon/proposers/llm/llm_client.h"
#include "search_daemon/proposers/llm/llm_prompt.h"
#include "search_daemon/proposers/llm/llm_proposer.h"
#include "search_daemon/proposers/templates/template_proposer.h"
#include "search_daemon/search/search_strategy.h"
#include "search_daemon/search/search_tree.h"


using namespace kforge;
using namespace kforge::llm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using search::Move;
using search::Outcome;
using search::ProposalRequest;
using search::SearchTree;

namespace {

// Generous: these bound how long a failing test takes to fail, and how much a loaded machine may
// delay a retry beyond the wait it was asked for.
constexpr auto kArrival = 10s;
constexpr auto kSchedulingSlack = 3s;

// ---- the scripted server ------------------------------------------------------------------------

struct Reply {
  using Headers = std::vector<std::pair<std::string, std::string>>;
  Reply() = default;
  Reply(int s, std::string b, Headers h = {}, bool held = false)
      : status(s), body(std::move(b)), headers(std::move(h)), hold(held) {}

  int status = 200;
  std::string body;
  Headers headers;
  bool hold = false;   // answered only after release(): a server slower than any timeout
};

struct Received {
  std::string path;
  httplib::Headers headers;
  std::string body;
  Clock::time_point at;

  bool has_header(const std::string& name) const { return headers.find(name) != headers.end(); }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  json json_body() const { return json::parse(body); }
  // Everything the model was told: system prompt and messages.
  std::string prompt_text() const {
    const json j = json_body();
    std::string s = j.value("system", std::string());
    for (const json& m : j.at("messages")) s += "\n" + m.at("content").get<std::string>();
    return s;
  }
};

class ScriptedLlmServer {
 public:
  ScriptedLlmServer() {
    auto handler = [this](const httplib::Request& req, httplib::Response& res) { serve(req, res); };
    server_.Post("/v1/chat/completions", handler);
    server_.Post("/v1/messages", handler);
    server_.Get("/ready", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // The accept loop answers only once it runs, so after this stop() cannot miss it.
    httplib::Client probe("127.0.0.1", port_);
    probe.set_connection_timeout(std::chrono::seconds(10));
    auto r = probe.Get("/ready");
    REQUIRE(r);
    REQUIRE(r->status == 200);
  }
  ~ScriptedLlmServer() {
    release();
    server_.stop();
    thread_.join();
  }
  ScriptedLlmServer(const ScriptedLlmServer&) = delete;
  ScriptedLlmServer& operator=(const ScriptedLlmServer&) = delete;

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  void push(Reply r) {
    std::lock_guard<std::mutex> lock(mu_);
    script_.push_back(std::move(r));
  }
  std::vector<Received> received() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_.size();
  }
  size_t unused_replies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return script_.size();
  }
  bool wait_for_requests(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kArrival, [&] { return received_.size() >= n; });
  }
  // Lets every held reply (and any later one) go.
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  void serve(const httplib::Request& req, httplib::Response& res) {
    Reply r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      received_.push_back(Received{req.path, req.headers, req.body, Clock::now()});
      if (script_.empty()) {
        r = Reply{500, R"({"error": {"message": "the test scripted no reply for this request"}})", {}, false};
      } else {
        r = std::move(script_.front());
        script_.pop_front();
      }
      cv_.notify_all();
      if (r.hold) cv_.wait(lock, [&] { return released_; });
    }
    res.status = r.status;
    for (const auto& [k, v] : r.headers) res.set_header(k, v);
    const bool events = r.body.rfind("data:", 0) == 0 || r.body.rfind("event:", 0) == 0;
    res.set_content(r.body, events ? "text/event-stream" : "application/json");
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Reply> script_;
  std::vector<Received> received_;
  bool released_ = false;
};

// ---- answers as the two APIs send them ------------------------------------------------------------

std::string openai_body(const std::string& text, uint64_t in = 1000, uint64_t out = 500, const char* finish = "stop") {
  return json{{"id", "chatcmpl-1"},
              {"object", "chat.completion"},
              {"model", "test-model"},
              {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}, {"finish_reason", finish}}}},
              {"usage", {{"prompt_tokens", in}, {"completion_tokens", out}, {"total_tokens", in + out}}}}
      .dump();
}

std::string anthropic_body(const std::string& text, uint64_t in = 1000, uint64_t out = 500,
                           const char* stop = "end_turn") {
  return json{{"id", "msg_1"},
              {"type", "message"},
              {"role", "assistant"},
              {"model", "test-model"},
              {"content", {{{"type", "text"}, {"text", text}}}},
              {"stop_reason", stop},
              {"usage", {{"input_tokens", in}, {"output_tokens", out}}}}
      .dump();
}

std::string answer_body(ChatApi api, const std::string& text, uint64_t in = 1000, uint64_t out = 500) {
  return api == ChatApi::kOpenAi ? openai_body(text, in, out) : anthropic_body(text, in, out);
}

// The same answers as server-sent events, the text in three deltas; `complete` false: the stream
// stops before its last events (a dropped connection).
std::string openai_stream(const std::string& text, uint64_t in = 1000, uint64_t out = 500, bool complete = true) {
  std::string s;
  auto event = [&](const json& j) { s += "data: " + j.dump() + "\n\n"; };
  const size_t third = text.size() / 3;
  const std::string parts[] = {text.substr(0, third), text.substr(third, third), text.substr(2 * third)};
  event({{"id", "c1"}, {"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}}}});
  for (const std::string& p : parts) {
    event({{"id", "c1"}, {"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", {{"content", p}}}, {"finish_reason", nullptr}}}}});
    if (!complete) return s;
  }
  event({{"id", "c1"}, {"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "stop"}}}}});
  event({{"id", "c1"}, {"object", "chat.completion.chunk"}, {"choices", json::array()}, {"usage", {{"prompt_tokens", in}, {"completion_tokens", out}}}});
  return s + "data: [DONE]\n\n";
}

std::string anthropic_stream(const std::string& text, uint64_t in = 1000, uint64_t out = 500, bool complete = true) {
  std::string s;
  auto event = [&](const char* name, const json& j) { s += std::string("event: ") + name + "\ndata: " + j.dump() + "\n\n"; };
  event("message_start", {{"type", "message_start"}, {"message", {{"id", "msg_1"}, {"type", "message"}, {"role", "assistant"}, {"content", json::array()}, {"usage", {{"input_tokens", in}, {"output_tokens", 1}}}}}});
  event("content_block_start", {{"type", "content_block_start"}, {"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  s += ": keep-alive comment\n\n";
  event("ping", {{"type", "ping"}});
  const size_t half = text.size() / 2;
  event("content_block_delta", {{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", text.substr(0, half)}}}});
  if (!complete) return s;
  event("content_block_delta", {{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", text.substr(half)}}}});
  event("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
  event("message_delta", {{"type", "message_delta"}, {"delta", {{"stop_reason", "end_turn"}}}, {"usage", {{"output_tokens", out}}}});
  event("message_stop", {{"type", "message_stop"}});
  return s;
}

std::string answer_stream(ChatApi api, const std::string& text, uint64_t in = 1000, uint64_t out = 500, bool complete = true) {
  return api == ChatApi::kOpenAi ? openai_stream(text, in, out, complete) : anthropic_stream(text, in, out, complete);
}

std::string api_error(const std::string& message, const char* type = "invalid_request_error") {
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump();
}

// ---- the key, the log -------------------------------------------------------------------------------

constexpr const char* kKeyEnv = "KFORGE_TEST_LLM_KEY";

// A fresh key per process, in the environment the client reads it from.
const std::string& test_key() {
  static const std::string key = [] {
    std::random_device rd;
    std::string k = "sk-kforge-test-";
    for (int i = 0; i < 32; ++i) k += "0123456789abcdef"[rd() % 16];
    ::setenv(kKeyEnv, k.c_str(), 1);
    return k;
  }();
  return key;
}

// True when `text` holds the key or any 8-byte piece of it (what Note [Key redaction] promises).
bool leaks_key(const std::string& text) {
  const std::string& k = test_key();
  for (size_t j = 0; j + 8 <= k.size(); ++j) {
    if (text.find(k.substr(j, 8)) != std::string::npos) return true;
  }
  return false;
}

class LogCapture {
 public:
  LogSink sink() {
    return [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
    };
  }
  std::string all() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (const std::string& l : lines_) s += l + "\n";
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

LlmClientConfig config_for(const ScriptedLlmServer& s, ChatApi api) {
  (void)test_key();
  LlmClientConfig c;
  c.api = api;
  c.base_url = s.base_url();
  c.model = "test-model";
  c.api_key_env = kKeyEnv;
  c.max_tokens = 4096;
  c.temperature = 0.5;
  c.request_timeout_ms = 10000;
  c.max_retries = 2;
  c.initial_backoff_ms = 1;
  c.max_backoff_ms = 5000;
  return c;
}

std::shared_ptr<LlmClient> make_client(const LlmClientConfig& c, LogCapture& log) {
  StatusOr<std::unique_ptr<LlmClient>> client = LlmClient::create(c, log.sink());
  INFO(client.status().message());
  REQUIRE(client.ok());
  return std::shared_ptr<LlmClient>(std::move(*client));
}

ChatRequest hello() { return ChatRequest{"be brief", {ChatMessage{ChatRole::kUser, "hello"}}}; }

// ---- signatures and kernels -------------------------------------------------------------------------

TensorMeta contiguous(DType dt, DeviceType dev, std::vector<int64_t> sizes) { return contiguous_tensor(dt, dev, std::move(sizes)); }

OpSignature cuda_softmax() {
  return OpSignature{"aten::_softmax", "",
                     {Arg::tensor(contiguous(DType::kFloat32, DeviceType::kCuda, {64, 1000})), Arg::integer(-1),
                      Arg::boolean(false)},
                     Target{Backend::kCuda, "sm_90"}};
}

OpSignature cpu_layer_norm() {
  return OpSignature{"aten::native_layer_norm", "",
                     {Arg::tensor(contiguous(DType::kFloat32, DeviceType::kCpu, {64, 512})), Arg::int_list({512}),
                      Arg::tensor(contiguous(DType::kFloat32, DeviceType::kCpu, {512})),
                      Arg::tensor(contiguous(DType::kFloat32, DeviceType::kCpu, {512})), Arg::real(1e-5)},
                     Target{Backend::kCpu, "x86_64"}};
}

constexpr const char* kSoftmaxSource = R"(extern "C" __global__ void softmax_rows(const float* x, float* y, long long cols) {
  __shared__ float red[256];
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  float m = -__int_as_float(0x7f800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float s = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  s = red[0];
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / s;
}
)";

constexpr const char* kSoftmaxPlan =
    R"({"summary": "one block per row, shared-memory max and sum\nthis second line is not part of the label",
 "entry_points": ["softmax_rows"],
 "outputs": [{"like": 0}],
 "launches": [{"entry": "softmax_rows", "grid": ["numel0 / size0_1"], "block": [256],
               "args": [{"input": 0}, {"output": 0}, {"size": "size0_1", "type": "int64"}]}]})";

// `text` with its first `from` replaced by `to`; `from` must be there (a test edit that misses
// would silently test the unedited text).
std::string edited(std::string text, std::string_view from, std::string_view to) {
  const size_t at = text.find(from);
  INFO("editing: '" << from << "' not found");
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string fenced(const std::string& tag, const std::string& body) {
  return "```" + tag + "\n" + body + (body.empty() || body.back() == '\n' ? "" : "\n") + "```\n";
}

std::string softmax_answer(const std::string& source = kSoftmaxSource, const std::string& plan = kSoftmaxPlan) {
  return "Here is a kernel that keeps each row in one block.\n\n" + fenced("cuda", source) + "\n" +
         fenced("json", plan) + "\nIt reads each row twice.";
}

// What kSoftmaxSource + kSoftmaxPlan must parse into.
KernelSpec expected_softmax_spec() {
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = kSoftmaxSource;
  s.entry_points = {"softmax_rows"};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "softmax_rows";
  l.grid = {"numel0 / size0_1", "1", "1"};
  l.block = {"256", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("size0_1", ValueType::kInt64)};
  s.plan.launches = {l};
  return s;
}

ProposalRequest request_for(const OpSignature& sig, const SearchTree& tree, uint64_t parent) {
  ProposalRequest r;
  r.signature = &sig;
  r.tree = &tree;
  r.parent = parent;
  r.max_moves = 4;
  r.roofline.baseline_ns = 12000;
  r.roofline.bytes = 512000;
  r.roofline.flops = 320000;
  r.roofline.bandwidth_bytes_per_s = 4.0e12;
  return r;
}

Outcome compile_error(const std::string& log) {
  Outcome o;
  o.status = eval::EvalStatus::kCompileError;
  o.message = "compile error";
  o.build_log = log;
  return o;
}

}  // namespace

// ---- configuration ----------------------------------------------------------------------------------

TEST_CASE("llm config: validation names the bad field, and never quotes what may be a key") {
  LlmClientConfig good;
  good.base_url = "http://127.0.0.1:8000";
  good.model = "m";
  REQUIRE(good.validate().ok());

  struct Bad {
    const char* field;
    std::function<void(LlmClientConfig&)> spoil;
  };
  const std::vector<Bad> cases = {
      {"llm.base_url", [](LlmClientConfig& c) { c.base_url = ""; }},
      {"llm.base_url", [](LlmClientConfig& c) { c.base_url = "127.0.0.1:8000"; }},
      {"llm.base_url", [](LlmClientConfig& c) { c.base_url = "ftp://example.com"; }},
      {"llm.base_url", [](LlmClientConfig& c) { c.base_url = "https://user:secret@example.com"; }},
      {"llm.base_url", [](LlmClientConfig& c) { c.base_url = "https://example.com/?key=1"; }},
      {"llm.model", [](LlmClientConfig& c) { c.model = ""; }},
      {"llm.api_key_env", [](LlmClientConfig& c) { c.api_key_env = "sk-live-0123456789abcdef"; }},
      {"llm.max_tokens", [](LlmClientConfig& c) { c.max_tokens = 0; }},
      {"llm.temperature", [](LlmClientConfig& c) { c.temperature = 3; }},
      {"llm.request_timeout_ms", [](LlmClientConfig& c) { c.request_timeout_ms = 0; }},
      {"llm.max_retries", [](LlmClientConfig& c) { c.max_retries = 1000; }},
      {"llm.initial_backoff_ms", [](LlmClientConfig& c) { c.initial_backoff_ms = 0; }},
      {"llm.max_backoff_ms", [](LlmClientConfig& c) { c.max_backoff_ms = c.initial_backoff_ms - 1; }},
      {"llm.max_cost_usd", [](LlmClientConfig& c) { c.max_cost_usd = -1; }},
      {"llm.input_usd_per_million", [](LlmClientConfig& c) { c.input_usd_per_million = -3; }},
      {"llm.output_usd_per_million", [](LlmClientConfig& c) { c.output_usd_per_million = std::nan(""); }},
  };
  for (const Bad& b : cases) {
    LlmClientConfig c = good;
    b.spoil(c);
    const Status s = c.validate();
    INFO(b.field << ": " << s.message());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().rfind(b.field, 0) == 0);
    CHECK(s.message().find("secret") == std::string::npos);
    CHECK(s.message().find("sk-live") == std::string::npos);
    LogCapture log;
    CHECK_FALSE(LlmClient::create(c, log.sink()).ok());
  }
  // The root or the /v1 form providers document: the same endpoint.
  for (const auto& [api, base, want] : std::vector<std::tuple<ChatApi, std::string, std::string>>{
           {ChatApi::kOpenAi, "https://example.com", "https://example.com/v1/chat/completions"},
           {ChatApi::kOpenAi, "https://example.com/v1", "https://example.com/v1/chat/completions"},
           {ChatApi::kOpenAi, "https://example.com/v1/", "https://example.com/v1/chat/completions"},
           {ChatApi::kOpenAi, "https://example.com/api/v1", "https://example.com/api/v1/chat/completions"},
           {ChatApi::kOpenAi, "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1/chat/completions"},
           {ChatApi::kAnthropic, "https://example.com/v1", "https://example.com/v1/messages"}}) {
    LlmClientConfig c = good;
    c.api = api;
    c.base_url = base;
    LogCapture log;
    StatusOr<std::unique_ptr<LlmClient>> client = LlmClient::create(c, log.sink());
    REQUIRE(client.ok());
    CHECK((*client)->endpoint() == want);
  }
  // kforged's defaults: a cost budget and no prices (a free local server). Accepted, and said.
  LlmClientConfig free_local = good;
  free_local.max_cost_usd = 20;
  LogCapture log;
  REQUIRE(LlmClient::create(free_local, log.sink()).ok());
  CHECK(log.all().find("no prices set: nothing costs") != std::string::npos);

  CHECK(chat_api_from_name("anthropic").value() == ChatApi::kAnthropic);
  CHECK(chat_api_from_name("openai").value() == ChatApi::kOpenAi);
  CHECK_FALSE(chat_api_from_name("gemini").ok());
}

// ---- a good answer ---------------------------------------------------------------------------------

TEST_CASE("llm proposer: a good kernel answer becomes a valid KernelSpec over either API") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  INFO("api " << chat_api_name(api));
  ScriptedLlmServer server;
  server.push(Reply{200, answer_body(api, softmax_answer())});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, api), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  REQUIRE(proposer.supports(sig));

  const std::vector<Move> moves = proposer.propose(request_for(sig, tree, 0));

  INFO(log.all());
  REQUIRE(moves.size() == 1);
  const Move& m = moves[0];
  CHECK(m.spec == expected_softmax_spec());
  CHECK(m.spec.validate().ok());
  CHECK(m.spec.resolve(sig).ok());
  CHECK(m.proposer == "llm");
  CHECK(m.label == "llm: one block per row, shared-memory max and sum");
  CHECK(m.prior == kLlmPrior);
  // Note [LLM provenance]: the conversation that wrote it, and what it cost.
  const json origin = json::parse(m.origin);
  CHECK(origin.at("model") == "test-model");
  CHECK(origin.at("api") == std::string(chat_api_name(api)));
  CHECK(origin.at("prompt_kind") == "first");
  CHECK(origin.at("format_repairs") == 0);
  REQUIRE(origin.at("messages").size() == 3);
  CHECK(origin.at("messages")[0].at("role") == "system");
  CHECK(origin.at("messages")[1].at("content").get<std::string>().find(sig.to_string()) != std::string::npos);
  CHECK(origin.at("messages")[2].at("role") == "assistant");
  CHECK(origin.at("messages")[2].at("content") == softmax_answer());
  CHECK(origin.at("answer_tokens").at("input") == 1000);
  CHECK(origin.at("answer_tokens").at("output") == 500);
  CHECK(origin.at("signature_spend").at("answers") == 1);
  CHECK(origin.at("signature_spend").at("output_tokens") == 500);
  CHECK_FALSE(leaks_key(m.origin));

  // What went over the wire: the endpoint and headers of that API, the configured model and
  // limits, and a first-candidate prompt that carries the operator, the signature and the plan's
  // names.
  REQUIRE(server.count() == 1);
  const Received r = server.received()[0];
  const json body = r.json_body();
  CHECK(body.at("model") == "test-model");
  CHECK(body.at("max_tokens") == 4096);
  CHECK(body.at("temperature") == 0.5);
  if (api == ChatApi::kOpenAi) {
    CHECK(r.path == "/v1/chat/completions");
    CHECK(body.at("messages")[0].at("role") == "system");
    CHECK(body.at("messages")[1].at("role") == "user");
    CHECK_FALSE(body.contains("system"));
  } else {
    CHECK(r.path == "/v1/messages");
    CHECK(r.header("anthropic-version") == "2023-06-01");
    CHECK(body.at("system").get<std::string>().find("NVRTC") != std::string::npos);
    CHECK(body.at("messages").size() == 1);
    CHECK(body.at("messages")[0].at("role") == "user");
  }
  const std::string prompt = r.prompt_text();
  CHECK(prompt.find(sig.to_string()) != std::string::npos);
  CHECK(prompt.find("aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor") != std::string::npos);
  CHECK(prompt.find("contiguous strides (even when self is not contiguous)") != std::string::npos);
  CHECK(prompt.find("numel0=64000") != std::string::npos);
  CHECK(prompt.find("size0_1=1000") != std::string::npos);
  CHECK(prompt.find("sm_90") != std::string::npos);
  CHECK(prompt.find("extern \"C\" __global__") != std::string::npos);
  CHECK(prompt.find("No candidate exists yet") != std::string::npos);
  // The roofline: 512000 bytes at 4 TB/s is a 0.128 us floor under PyTorch's 12 us.
  CHECK(prompt.find("512000 bytes") != std::string::npos);
  CHECK(prompt.find("0.13 us") != std::string::npos);
  CHECK(prompt.find("12.00 us") != std::string::npos);
}

TEST_CASE("llm proposer: a CPU signature gets the CPU kernel ABI, quoted from its header") {
  const OpSignature sig = cpu_layer_norm();
  SearchTree tree;
  const Prompt p = build_prompt(request_for(sig, tree, 0));
  CHECK(p.kind == PromptKind::kFirst);
  CHECK(p.chat.system.find("typedef struct kforge_cpu_block") != std::string::npos);
  CHECK(p.chat.system.find("KFORGE_CPU_ABI_VERSION") != std::string::npos);
  CHECK(p.chat.system.find("```cpp") != std::string::npos);
  CHECK(p.chat.system.find("NVRTC") == std::string::npos);
  const std::string& u = p.chat.messages.at(0).content;
  CHECK(u.find("Outputs 1 and 2 (mean, rstd)") != std::string::npos);
  CHECK(u.find("argument 4: float 1.0000000000000001e-05") != std::string::npos);
  CHECK(u.find("len1=1") != std::string::npos);
  CHECK(u.find("arg1_0=512") != std::string::npos);
}

// ---- repairs and improvements -------------------------------------------------------------------

TEST_CASE("llm proposer: a node that did not compile is expanded with a repair prompt carrying its compile log") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  // The first answer does not compile (blockDimx); the repair fixes it.
  const std::string broken = edited(kSoftmaxSource, "blockDim.x / 2", "blockDimx / 2");
  const std::string broken_plan =
      R"({"summary": "shared-memory rows", "entry_points": ["softmax_rows"], "outputs": [{"like": 0}],
          "launches": [{"entry": "softmax_rows", "grid": ["numel0 / size0_1"], "block": [256],
                        "args": [{"input": 0}, {"output": 0}, {"size": "size0_1"}]}]})";
  server.push(Reply{200, answer_body(api, softmax_answer(broken, broken_plan))});
  server.push(Reply{200, answer_body(api, softmax_answer())});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, api), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;

  std::vector<Move> first = proposer.propose(request_for(sig, tree, 0));
  REQUIRE(first.size() == 1);
  const uint64_t bad = tree.add(0, first[0]);
  const std::string compiler_log =
      "kernel.cu(9): error: identifier \"blockDimx\" is undefined\n1 error detected in the compilation of \"kernel.cu\".";
  tree.set_outcome(bad, compile_error(compiler_log));

  std::vector<Move> repaired = proposer.propose(request_for(sig, tree, bad));

  INFO(log.all());
  REQUIRE(repaired.size() == 1);
  CHECK(repaired[0].spec == expected_softmax_spec());
  REQUIRE(server.count() == 2);
  const std::string prompt = server.received()[1].prompt_text();
  CHECK(prompt.find("did not compile") != std::string::npos);
  CHECK(prompt.find(compiler_log) != std::string::npos);   // the compile log, verbatim
  CHECK(prompt.find("blockDimx / 2") != std::string::npos);   // the broken source
  CHECK(prompt.find("\"summary\": \"shared-memory rows\"") != std::string::npos);   // its plan
  CHECK(prompt.find("Fix it") != std::string::npos);
  CHECK(build_prompt(request_for(sig, tree, bad)).kind == PromptKind::kRepair);
}

TEST_CASE("llm proposer: a node that failed a check is repaired with the check and its detail") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body(softmax_answer())});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  KernelSpec wrong = expected_softmax_spec();
  wrong.source = edited(wrong.source, "expf(xr[c] - m) / s", "expf(xr[c]) / s");
  const uint64_t bad = tree.add(0, Move{wrong, "llm", "llm: no max subtraction", kLlmPrior});
  Outcome o;
  o.status = eval::EvalStatus::kVerifyFailed;
  o.failed_check = "accuracy";
  o.message = "trial 'large': max abs error 1 at [3, 17] (PyTorch's 1.2e-07)";
  tree.set_outcome(bad, o);

  std::vector<Move> repaired = proposer.propose(request_for(sig, tree, bad));

  INFO(log.all());
  REQUIRE(repaired.size() == 1);
  const std::string prompt = server.received().at(0).prompt_text();
  CHECK(prompt.find("failed verification") != std::string::npos);
  CHECK(prompt.find("Failed check: accuracy") != std::string::npos);
  CHECK(prompt.find(o.message) != std::string::npos);
  CHECK(prompt.find("expf(xr[c]) / s") != std::string::npos);
  CHECK(prompt.find("llm: no max subtraction") != std::string::npos);
}

TEST_CASE("llm proposer: a measured node is expanded with its results, and what was tried from it") {
  ScriptedLlmServer server;
  const std::string faster = edited(kSoftmaxSource, "float s = 0;", "float s = 0.0f;");
  server.push(Reply{200, openai_body(softmax_answer(faster))});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  const uint64_t good = tree.add(0, Move{expected_softmax_spec(), "llm", "llm: shared-memory rows", kLlmPrior});
  Outcome o;
  o.status = eval::EvalStatus::kMeasured;
  o.speedup = 1.25;
  o.baseline_ns = 12000;
  o.candidate_ns = 9600;
  o.noise_band = 0.03;
  o.significant = true;
  tree.set_outcome(good, o);
  KernelSpec tried = expected_softmax_spec();
  tried.plan.launches[0].block = {"128", "1", "1"};
  tried.source = edited(tried.source, "red[256]", "red[128]");
  tree.add(good, Move{tried, "llm", "llm: 128 threads per row", kLlmPrior});

  std::vector<Move> moves = proposer.propose(request_for(sig, tree, good));

  INFO(log.all());
  REQUIRE(moves.size() == 1);
  const std::string prompt = server.received().at(0).prompt_text();
  CHECK(prompt.find("speedup 1.250x (PyTorch 12.00 us, this kernel 9.60 us)") != std::string::npos);
  CHECK(prompt.find("Write a faster kernel") != std::string::npos);
  CHECK(prompt.find("Already proposed from here") != std::string::npos);
  CHECK(prompt.find("- llm: 128 threads per row: not evaluated yet") != std::string::npos);
}

TEST_CASE("llm prompt: PyTorch's time is the worker's measurement once there is one, the hook's mean before") {
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  ProposalRequest r = request_for(sig, tree, 0);
  r.roofline.baseline_ns = 78860120;   // the hook's mean, cold first calls included
  std::string u = build_prompt(r).chat.messages.at(0).content;
  CHECK(u.find("saw PyTorch's kernel take 78860.12 us per call on average") != std::string::npos);
  CHECK(u.find("the worker has not timed it yet") != std::string::npos);
  // Three measured candidates: the worker timed PyTorch's kernel at 3.21, 3.30 and 3.25 ms.
  const double baselines[] = {3210000, 3300000, 3250000};
  for (double b : baselines) {
    KernelSpec spec = expected_softmax_spec();
    spec.source += "// " + std::to_string(b) + "\n";   // three kernels, not one
    const uint64_t id = tree.add(0, Move{spec, "template", "template: rows " + std::to_string(b), 1});
    Outcome o;
    o.status = eval::EvalStatus::kMeasured;
    o.speedup = 1.1;
    o.baseline_ns = b;
    o.candidate_ns = b / 1.1;
    o.baseline_spread = 0.04;
    o.candidate_spread = 0.02;
    o.noise_band = 0.03;
    o.significant = true;
    tree.set_outcome(id, o);
  }
  u = build_prompt(request_for(sig, tree, 0)).chat.messages.at(0).content;
  INFO(u);
  CHECK(u.find("PyTorch's kernel takes 3250.00 us per call, as the worker measured it (median of 3 timings in this "
               "search, from 3210.00 to 3300.00 us") != std::string::npos);
  CHECK(u.find("78860") == std::string::npos);
  // The floor is an estimate, against the measured time.
  CHECK(u.find("takes about 0.13 us (about 25390.6x less than PyTorch's time)") != std::string::npos);
  CHECK(u.find("an estimate, not a bound") != std::string::npos);
  CHECK(u.find("no kernel can take less") == std::string::npos);
}

TEST_CASE("llm prompt: results carry their spread, and every prompt names the tree's best kernel") {
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  KernelSpec best = expected_softmax_spec();
  best.source = edited(best.source, "red[256]", "red[256] /* best */");
  const uint64_t a = tree.add(0, Move{best, "llm", "llm: the best one", kLlmPrior});
  const uint64_t b = tree.add(0, Move{expected_softmax_spec(), "template", "template: a slower one", 1});
  for (const auto& [id, speedup] : {std::pair{a, 2.0}, std::pair{b, 1.2}}) {
    Outcome o;
    o.status = eval::EvalStatus::kMeasured;
    o.speedup = speedup;
    o.baseline_ns = 12000;
    o.candidate_ns = 12000 / speedup;
    o.baseline_spread = 0.05;
    o.candidate_spread = 0.025;
    o.noise_band = 0.03;
    o.significant = true;
    tree.set_outcome(id, o);
  }
  // A first candidate from the root: the best kernel's results, source and plan.
  std::string u = build_prompt(request_for(sig, tree, 0)).chat.messages.at(0).content;
  CHECK(u.find("## Best kernel found so far in this search\n\"llm: the best one\" (proposed by llm): speedup 2.000x "
               "(PyTorch 12.00 us (runs spread 5.0%), this kernel 6.00 us (runs spread 2.5%))") != std::string::npos);
  CHECK(u.find("red[256] /* best */") != std::string::npos);
  // Improving the slower one: the best's results, not its code.
  u = build_prompt(request_for(sig, tree, b)).chat.messages.at(0).content;
  CHECK(u.find("\"llm: the best one\" (proposed by llm): speedup 2.000x") != std::string::npos);
  CHECK(u.find("red[256] /* best */") == std::string::npos);
  // Improving the best itself: no such section.
  u = build_prompt(request_for(sig, tree, a)).chat.messages.at(0).content;
  CHECK(u.find("## Best kernel found so far") == std::string::npos);
}

TEST_CASE("llm prompt: the device's facts, and the accuracy bound as numbers once PyTorch's error was measured") {
  const OpSignature sig = cpu_layer_norm();
  SearchTree tree;
  ProposalRequest r = request_for(sig, tree, 0);
  r.roofline.device_facts = "CPU: Test CPU (x86_64-avx2). The worker runs PyTorch's kernel and every candidate with 1 thread "
                            "pinned to 1 core (0).";
  std::string u = build_prompt(r).chat.messages.at(0).content;
  CHECK(u.find("## Device\nCPU: Test CPU (x86_64-avx2). The worker runs") != std::string::npos);
  CHECK(u.find("## Accuracy") == std::string::npos);   // nothing verified yet
  KernelSpec spec;
  spec.backend = Backend::kCpu;
  spec.language = SourceLanguage::kCpp;
  spec.source = "extern \"C\" void k(const void*, void* const*) {}";
  spec.entry_points = {"k"};
  const uint64_t id = tree.add(0, Move{spec, "template", "template: x", 1});
  Outcome o;
  o.status = eval::EvalStatus::kVerifyFailed;
  o.failed_check = "accuracy";
  o.torch_max_abs_error = 2.5e-7;
  o.torch_rel_error = 1e-7;
  tree.set_outcome(id, o);
  u = build_prompt(request_for(sig, tree, 0)).chat.messages.at(0).content;
  INFO(u);
  CHECK(u.find("PyTorch's kernel was off the float64 reference by at most 2.5e-07 (max abs) and 1e-07 (relative L2). "
               "A candidate may be off by at most 2x that plus 9.54e-07 x max|reference| (max abs) and 1.15e-06 "
               "(relative L2)") != std::string::npos);
}

TEST_CASE("llm prompt: a compile error's message that is in its log appears once") {
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  const uint64_t bad = tree.add(0, Move{expected_softmax_spec(), "llm", "llm: broken", kLlmPrior});
  const std::string log = "kernel.cu(9): error: identifier \"blockDimx\" is undefined\n1 error detected";
  Outcome o = compile_error(log);
  o.message = "kernel.cu(9): error: identifier \"blockDimx\" is undefined";
  tree.set_outcome(bad, o);
  const std::string u = build_prompt(request_for(sig, tree, bad)).chat.messages.at(0).content;
  size_t n = 0;
  for (size_t at = u.find(o.message); at != std::string::npos; at = u.find(o.message, at + 1)) ++n;
  CHECK(n == 1);
}

// ---- answers that must be rejected --------------------------------------------------------------

TEST_CASE("llm proposer: malformed and truncated answers are rejected with the reason, never a crash") {
  struct Case {
    const char* what;
    std::string answer;
    const char* reason;   // a part of the logged rejection
  };
  const std::string bad_plan_json = edited(kSoftmaxPlan, "\"size\": \"size0_1\",", "\"size\": \"size0_1\"");   // no comma
  const std::string unknown_field = edited(kSoftmaxPlan, "\"launches\"", "\"launch\"");
  const std::string bad_type = edited(kSoftmaxPlan, "\"int64\"", "\"long\"");
  const std::string bad_expr = edited(kSoftmaxPlan, "numel0 / size0_1", "numel0 / (size0_1");
  const std::string unresolvable = edited(kSoftmaxPlan, "numel0 / size0_1", "size0_7");
  const std::string too_many_threads = edited(kSoftmaxPlan, "[256]", "[2048]");
  const std::string three_outputs = edited(kSoftmaxPlan, "[{\"like\": 0}]", "[{\"like\": 0}, {\"like\": 0}, {\"like\": 0}]");
  const std::string wrong_entry = edited(edited(kSoftmaxPlan, "[\"softmax_rows\"]", "[\"softmax_row\"]"),
                                         "\"entry\": \"softmax_rows\"", "\"entry\": \"softmax_row\"");
  const std::string whole = softmax_answer();

  const std::vector<Case> cases = {
      {"no blocks", "I would use one block per row and warp shuffles.", "no fenced blocks"},
      {"no json block", "Sure.\n" + fenced("cuda", kSoftmaxSource), "missing the ```json block"},
      {"no source block", fenced("json", kSoftmaxPlan), "missing the ```cuda source block"},
      {"two source blocks", fenced("cuda", kSoftmaxSource) + fenced("cuda", kSoftmaxSource) + fenced("json", kSoftmaxPlan),
       "found 2 source blocks"},
      {"cut off inside the json block", whole.substr(0, whole.find("\"launches\"")),
       "truncated answer: the ```json block opened on line"},
      {"cut off inside the source", whole.substr(0, whole.find("__syncthreads")),
       "truncated answer: the ```cuda block opened on line 3 is never closed"},
      {"json syntax error", softmax_answer(kSoftmaxSource, bad_plan_json), "syntax error at line 5"},
      {"unknown field", softmax_answer(kSoftmaxSource, unknown_field), "json.launch: unknown field"},
      {"bad argument type", softmax_answer(kSoftmaxSource, bad_type),
       "json.launches[0].args[2].type: unknown type 'long'"},
      {"bad launch expression", softmax_answer(kSoftmaxSource, bad_expr), "invalid plan: launches[0].grid[0]"},
      {"size the signature lacks", softmax_answer(kSoftmaxSource, unresolvable), "does not resolve"},
      {"too many threads", softmax_answer(kSoftmaxSource, too_many_threads), "does not resolve"},
      {"wrong output count", softmax_answer(kSoftmaxSource, three_outputs), "returns 1 tensor; the plan allocates 3"},
      {"entry point not in the source", softmax_answer(kSoftmaxSource, wrong_entry),
       "entry point 'softmax_row' does not appear in the source"},
      {"plan not an object", softmax_answer(kSoftmaxSource, "[1, 2, 3]"), "json: expected an object, got array"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.what) {
      ScriptedLlmServer server;
      for (int i = 0; i < 3; ++i) server.push(Reply{200, openai_body(c.answer)});   // the answer, then 2 repairs
      LogCapture log;
      LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink());
      const OpSignature sig = cuda_softmax();
      SearchTree tree;
      const std::vector<Move> moves = proposer.propose(request_for(sig, tree, 0));
      INFO(log.all());
      CHECK(moves.empty());
      REQUIRE(server.count() == 3);
      CHECK(log.all().find("llm: answer rejected for node 0") != std::string::npos);
      CHECK(log.all().find(c.reason) != std::string::npos);
      CHECK(log.all().find("(format repair 2 of 2)") != std::string::npos);
      // Each repair turn carried the answer and why it was rejected.
      const json first = server.received()[0].json_body().at("messages");
      const json last = server.received()[2].json_body().at("messages");
      REQUIRE(last.size() == first.size() + 4);
      CHECK(last[last.size() - 2].at("role") == "assistant");
      CHECK(last.back().at("content").get<std::string>().find(c.reason) != std::string::npos);
    }
  }
}

TEST_CASE("llm proposer: a malformed answer gets a format-repair turn, and the repaired answer is the move") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  const std::string bad_plan = edited(kSoftmaxPlan, "\"size\": \"size0_1\",", "\"size\": \"size0_1\"");   // no comma
  const std::string malformed = softmax_answer(kSoftmaxSource, bad_plan);
  server.push(Reply{200, answer_body(api, malformed)});
  server.push(Reply{200, answer_body(api, softmax_answer())});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, api), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;

  const std::vector<Move> moves = proposer.propose(request_for(sig, tree, 0));

  INFO(log.all());
  REQUIRE(moves.size() == 1);
  CHECK(moves[0].spec == expected_softmax_spec());
  REQUIRE(server.count() == 2);
  const json first = server.received()[0].json_body().at("messages");
  const json second = server.received()[1].json_body().at("messages");
  // The same conversation, with the answer and the reason appended.
  CHECK(second.size() == first.size() + 2);
  CHECK(second[second.size() - 3] == first.back());
  CHECK(second[second.size() - 2].at("role") == "assistant");
  CHECK(second[second.size() - 2].at("content").get<std::string>() == malformed);
  const std::string repair = second.back().at("content").get<std::string>();
  CHECK(repair.find("Your answer could not be used: ") == 0);
  CHECK(repair.find("syntax error at line 5") != std::string::npos);
  CHECK(repair.find("exactly one ```cuda block") != std::string::npos);
  CHECK(log.all().find("after 1 format repair)") != std::string::npos);
  // The provenance keeps the whole conversation: the rejected answer and the repair turn too.
  const json origin = json::parse(moves[0].origin);
  CHECK(origin.at("format_repairs") == 1);
  CHECK(origin.at("messages").size() == 5);
  CHECK(origin.at("signature_spend").at("answers") == 2);
}

TEST_CASE("llm proposer: an answer cut off at max_tokens is rejected as such, over either API") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  const std::string whole = softmax_answer();
  const std::string cut = whole.substr(0, whole.size() / 2);
  server.push(Reply{200, api == ChatApi::kOpenAi ? openai_body(cut, 100, 4096, "length")
                                                 : anthropic_body(cut, 100, 4096, "max_tokens")});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, api), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  CHECK(proposer.propose(request_for(sig, tree, 0)).empty());
  INFO(log.all());
  CHECK(log.all().find("cut off at max_tokens (4096") != std::string::npos);
}

TEST_CASE("llm proposer: an answer that repeats a kernel already in the tree is dropped") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body(softmax_answer())});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  const uint64_t id = tree.add(0, Move{expected_softmax_spec(), "template", "softmax rows", 0.5});
  CHECK(proposer.propose(request_for(sig, tree, 0)).empty());
  CHECK(log.all().find("repeats the kernel of node " + std::to_string(id)) != std::string::npos);
}

TEST_CASE("llm proposer: a bad request or an unknown operator sends nothing") {
  ScriptedLlmServer server;
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink());
  OpSignature sig = cuda_softmax();
  SearchTree tree;
  ProposalRequest r = request_for(sig, tree, 7);   // no node 7
  CHECK(proposer.propose(r).empty());
  r.parent = 0;
  r.tree = nullptr;
  CHECK(proposer.propose(r).empty());
  OpSignature mm = sig;
  mm.op = "aten::mm";
  CHECK_FALSE(proposer.supports(mm));
  CHECK(proposer.propose(request_for(mm, tree, 0)).empty());
  CHECK(server.count() == 0);
  CHECK(log.all().find("node 7 is not in the tree") != std::string::npos);
}

// ---- requests in the background (Note [LLM requests in the background]) ---------------------------

namespace {

// What a search's on_ready tells it, for tests to wait on.
struct Wakes {
  std::mutex mu;
  std::condition_variable cv;
  int count = 0;
  std::function<void()> callback() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu);
      ++count;
      cv.notify_all();
    };
  }
  bool wait_for(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kArrival, [&] { return count >= n; });
  }
};

// A softmax answer whose kernel differs from the others by a comment (a distinct spec).
std::string numbered_softmax_answer(int n) {
  return softmax_answer("// answer " + std::to_string(n) + "\n" + kSoftmaxSource);
}

LlmProposerOptions in_background(size_t concurrent, size_t per_search) {
  LlmProposerOptions o;
  o.concurrent_requests = concurrent;
  o.requests_per_search = per_search;
  return o;
}

}  // namespace

TEST_CASE("llm proposer in the background: propose() returns at once, one request per node, the search's limit holds") {
  ScriptedLlmServer server;
  for (int i = 0; i < 3; ++i) server.push(Reply{200, openai_body(numbered_softmax_answer(i)), {}, /*hold=*/true});
  LogCapture log;
  LlmProposer proposer(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink(), in_background(4, 2));
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  const uint64_t a = tree.add(0, Move{expected_softmax_spec(), "template", "softmax rows", 0.5});
  Outcome done;
  done.status = eval::EvalStatus::kMeasured;
  done.speedup = 1.3;
  done.significant = true;
  tree.set_outcome(a, done);
  KernelSpec narrower = expected_softmax_spec();
  narrower.plan.launches[0].block = {"128", "1", "1"};
  const uint64_t b = tree.add(0, Move{narrower, "template", "softmax rows 128", 0.5});
  tree.set_outcome(b, done);
  Wakes wakes;
  auto ask = [&](uint64_t parent, bool& pending, bool& retry) {
    ProposalRequest r = request_for(sig, tree, parent);
    pending = false;
    retry = false;
    r.pending = &pending;
    r.retry_later = &retry;
    r.on_ready = wakes.callback();
    return r;
  };
  bool pending = false;
  bool retry = false;

  // From the root: nothing yet, work started; the model holds its answer.
  const auto t0 = Clock::now();
  CHECK(proposer.propose(ask(0, pending, retry)).empty());
  CHECK(pending);
  CHECK(Clock::now() - t0 < 2s);
  REQUIRE(server.wait_for_requests(1));
  // The same node again: still working, no second request.
  CHECK(proposer.propose(ask(0, pending, retry)).empty());
  CHECK(pending);
  // Another node: a second request.
  CHECK(proposer.propose(ask(a, pending, retry)).empty());
  CHECK(pending);
  REQUIRE(server.wait_for_requests(2));
  // A third node: past the search's limit of 2, nothing is started, and the caller is to ask again.
  CHECK(proposer.propose(ask(b, pending, retry)).empty());
  CHECK(pending);
  CHECK(proposer.requests_in_flight() == 2);
  CHECK(server.count() == 2);
  // Collecting before the answers are in gives nothing, and says the work goes on.
  CHECK(proposer.collect(ask(0, pending, retry)).empty());
  CHECK(pending);

  server.release();
  REQUIRE(wakes.wait_for(2));
  std::vector<Move> from_root = proposer.collect(ask(0, pending, retry));
  CHECK_FALSE(pending);
  std::vector<Move> from_a = proposer.collect(ask(a, pending, retry));
  CHECK_FALSE(pending);
  REQUIRE(from_root.size() == 1);
  REQUIRE(from_a.size() == 1);
  CHECK(from_root[0].proposer == "llm");
  CHECK(from_root[0].spec.id() != from_a[0].spec.id());
  // The limit freed: the third node's request goes out now.
  CHECK(proposer.propose(ask(b, pending, retry)).empty());
  CHECK(pending);
  REQUIRE(wakes.wait_for(3));
  CHECK(proposer.collect(ask(b, pending, retry)).size() == 1);
  CHECK(server.count() == 3);
  CHECK(proposer.requests_in_flight() == 0);
  // Each request was built from its own node: the root's asks for a first kernel, a's and b's
  // for a faster one than theirs.
  const std::vector<Received> got = server.received();
  CHECK(got[0].prompt_text().find("block\": [128") == std::string::npos);
  CHECK(got[2].prompt_text().find("128") != std::string::npos);
}

TEST_CASE("llm proposer in the background: a search's end abandons its requests, and the destructor cancels those on the wire") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body(numbered_softmax_answer(1)), {}, /*hold=*/true});
  server.push(Reply{200, openai_body(numbered_softmax_answer(2)), {}, /*hold=*/true});
  LogCapture log;
  auto client = make_client(config_for(server, ChatApi::kOpenAi), log);
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  Wakes wakes;
  bool pending = false;
  {
    LlmProposer proposer(client, log.sink(), in_background(2, 2));
    ProposalRequest r = request_for(sig, tree, 0);
    r.pending = &pending;
    r.on_ready = wakes.callback();
    CHECK(proposer.propose(r).empty());
    REQUIRE(server.wait_for_requests(1));
    // The search ends while the model is still writing: the request is abandoned without waiting
    // for the answer (the server still holds it), and nothing of it reaches the search.
    proposer.release(sig);
    const auto until = Clock::now() + kArrival;
    while (proposer.requests_in_flight() > 0 && Clock::now() < until) std::this_thread::sleep_for(10ms);
    REQUIRE(proposer.requests_in_flight() == 0);
    pending = false;
    CHECK(proposer.collect(r).empty());
    CHECK_FALSE(pending);
    CHECK(wakes.count == 0);   // an abandoned request wakes nobody
    CHECK(log.all().find("its request for node 0 is abandoned") != std::string::npos);
    server.release();
    // The client is not cancelled for anyone else: the next search's request goes out and is answered.
    ProposalRequest again = request_for(sig, tree, 0);
    again.pending = &pending;
    again.on_ready = wakes.callback();
    CHECK(proposer.propose(again).empty());
    REQUIRE(wakes.wait_for(1));
    CHECK(proposer.collect(again).size() == 1);
  }
  // A request held by the server when the proposer goes: the destructor returns in bounded time.
  ScriptedLlmServer slow;
  slow.push(Reply{200, openai_body(numbered_softmax_answer(3)), {}, /*hold=*/true});
  auto slow_client = make_client(config_for(slow, ChatApi::kOpenAi), log);
  const auto t0 = Clock::now();
  {
    LlmProposer proposer(slow_client, log.sink(), in_background(2, 2));
    ProposalRequest r = request_for(sig, tree, 0);
    r.pending = &pending;
    CHECK(proposer.propose(r).empty());
    REQUIRE(slow.wait_for_requests(1));
  }
  CHECK(Clock::now() - t0 < kArrival);
  slow.release();
}

TEST_CASE("MCTS with templates and a background LLM: template candidates go out while the model writes, its answer next") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body(numbered_softmax_answer(1)), {}, /*hold=*/true});
  for (int i = 2; i < 12; ++i) server.push(Reply{200, openai_body(numbered_softmax_answer(i)), {}, /*hold=*/true});
  LogCapture log;
  LlmProposer llm(make_client(config_for(server, ChatApi::kOpenAi), log), log.sink(), in_background(2, 1));
  search::TemplateProposer templates;
  const OpSignature sig = cuda_softmax();
  REQUIRE(templates.supports(sig));
  Wakes wakes;
  search::SearchTask task{sig, search::Roofline{}, wakes.callback()};
  search::StrategyOptions options;
  options.max_evaluations = 40;
  auto s = search::make_strategy("mcts", task, {&templates, &llm}, options);
  REQUIRE(s != nullptr);

  const auto t0 = Clock::now();
  std::vector<search::Candidate> first = s->next_candidates(4);
  CHECK(Clock::now() - t0 < 2s);   // nobody waited for the model
  REQUIRE_FALSE(first.empty());
  for (const search::Candidate& c : first) CHECK(c.move.proposer == "template");
  CHECK(s->awaiting_proposals());
  REQUIRE(server.wait_for_requests(1));
  Outcome measured;
  measured.status = eval::EvalStatus::kMeasured;
  measured.speedup = 1.1;
  measured.significant = true;
  std::vector<std::pair<uint64_t, Outcome>> results;
  for (const search::Candidate& c : first) results.emplace_back(c.node, measured);
  s->notify_results(results);
  // More template work while the answer is still being written.
  std::vector<search::Candidate> second = s->next_candidates(2);
  REQUIRE_FALSE(second.empty());
  for (const search::Candidate& c : second) CHECK(c.move.proposer == "template");

  server.release();
  REQUIRE(wakes.wait_for(1));
  std::vector<search::Candidate> third = s->next_candidates(1);
  REQUIRE(third.size() == 1);
  CHECK(third[0].move.proposer == "llm");
  CHECK(s->tree().node(third[0].node).parent == 0);
  INFO(log.all());
}

// ---- retries, errors, timeouts ------------------------------------------------------------------

TEST_CASE("llm client: a 429 is retried after the wait Retry-After asks for, then succeeds") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  server.push(Reply{429, api_error("rate limited, slow down", "rate_limit_error"), {{"Retry-After", "1"}}});
  server.push(Reply{200, answer_body(api, "hello back", 10, 3)});
  LogCapture log;
  auto client = make_client(config_for(server, api), log);   // initial backoff 1 ms: only Retry-After waits

  StatusOr<ChatResponse> r = client->complete(hello());

  INFO(log.all());
  REQUIRE(r.ok());
  CHECK(r->text == "hello back");
  CHECK(r->attempts == 2);
  CHECK(r->usage.input_tokens == 10);
  CHECK(r->usage.output_tokens == 3);
  const std::vector<Received> got = server.received();
  REQUIRE(got.size() == 2);
  const auto gap = got[1].at - got[0].at;
  CHECK(gap >= 1s);
  CHECK(gap < 1s + kSchedulingSlack);
  CHECK(log.all().find("HTTP 429: rate limited, slow down (rate_limit_error); retry 1 of 2 in 1.00 s (as the server asked)") !=
        std::string::npos);
}

TEST_CASE("llm client: a Retry-After longer than max_backoff_ms ends the retries with an error saying so") {
  ScriptedLlmServer server;
  server.push(Reply{503, api_error("overloaded", "overloaded_error"), {{"Retry-After", "3600"}}});
  LogCapture log;
  auto client = make_client(config_for(server, ChatApi::kAnthropic), log);
  const auto t0 = Clock::now();
  StatusOr<ChatResponse> r = client->complete(hello());
  REQUIRE_FALSE(r.ok());
  CHECK(Clock::now() - t0 < kSchedulingSlack);
  CHECK(r.status().message().find("HTTP 503: overloaded (overloaded_error)") != std::string::npos);
  CHECK(r.status().message().find("asks to wait 3600.00 s") != std::string::npos);
  CHECK(server.count() == 1);
}

TEST_CASE("llm client: 5xx past max_retries is an error naming the status and the API's message") {
  ScriptedLlmServer server;
  for (int i = 0; i < 3; ++i) server.push(Reply{500, api_error("upstream exploded", "api_error")});
  server.push(Reply{200, openai_body("too late")});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.max_retries = 2;
  auto client = make_client(c, log);

  StatusOr<ChatResponse> r = client->complete(hello());

  REQUIRE_FALSE(r.ok());
  const std::string m = r.status().message();
  INFO(m);
  CHECK(m.find("POST " + server.base_url() + "/v1/chat/completions") != std::string::npos);
  CHECK(m.find("HTTP 500: upstream exploded (api_error)") != std::string::npos);
  CHECK(m.find("gave up after 3 attempts") != std::string::npos);
  CHECK(server.count() == 3);   // the first try and two retries, no more
  CHECK(server.unused_replies() == 1);
  CHECK(client->spend().requests == 3);
}

TEST_CASE("llm client: other 4xx answers are never retried") {
  ScriptedLlmServer server;
  server.push(Reply{404, R"({"error": "model 'test-model' not found"})"});   // Ollama's shape
  server.push(Reply{200, openai_body("never asked for")});
  LogCapture log;
  auto client = make_client(config_for(server, ChatApi::kOpenAi), log);
  StatusOr<ChatResponse> r = client->complete(hello());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("HTTP 404: model 'test-model' not found") != std::string::npos);
  CHECK(server.count() == 1);
}

TEST_CASE("llm client: a malformed answer body is an error naming what is wrong, not retried") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  server.push(Reply{200, "<html>502 Bad Gateway</html>"});
  server.push(Reply{200, R"({"choices": [], "content": "not an array"})"});
  LogCapture log;
  auto client = make_client(config_for(server, api), log);
  StatusOr<ChatResponse> a = client->complete(hello());
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("malformed answer body: not JSON") != std::string::npos);
  CHECK(a.status().message().find("<html>502 Bad Gateway</html>") != std::string::npos);
  StatusOr<ChatResponse> b = client->complete(hello());
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find(api == ChatApi::kOpenAi ? "choices: missing or empty" : "content: missing or not an array") !=
        std::string::npos);
  CHECK(server.count() == 2);
}

TEST_CASE("llm client: a server slower than the timeout is an error, in bounded time") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("late"), {}, /*hold=*/true});
  server.push(Reply{200, openai_body("late"), {}, /*hold=*/true});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.request_timeout_ms = 300;
  c.max_retries = 1;
  auto client = make_client(c, log);

  const auto t0 = Clock::now();
  StatusOr<ChatResponse> r = client->complete(hello());
  const auto took = Clock::now() - t0;

  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("timed out after") != std::string::npos);
  CHECK(r.status().message().find("llm.request_timeout_ms 300") != std::string::npos);
  CHECK(r.status().message().find("gave up after 2 attempts") != std::string::npos);
  CHECK(server.count() == 2);                         // timeouts are retried
  CHECK(took >= 600ms);                               // two whole timeouts
  CHECK(took < 600ms + kSchedulingSlack);
  server.release();
}

TEST_CASE("llm client: cancel() ends a request in flight and every later one") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("late"), {}, /*hold=*/true});
  LogCapture log;
  auto client = make_client(config_for(server, ChatApi::kOpenAi), log);
  auto pending = std::async(std::launch::async, [&] { return client->complete(hello()); });
  REQUIRE(server.wait_for_requests(1));
  client->cancel();
  REQUIRE(pending.wait_for(kArrival) == std::future_status::ready);
  StatusOr<ChatResponse> r = pending.get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("cancelled") != std::string::npos);
  CHECK_FALSE(client->complete(hello()).ok());
  CHECK(server.count() == 1);
  server.release();
}

// ---- streamed answers (Note [Streamed answers]) ----------------------------------------------------

TEST_CASE("llm client: a streamed answer is read from its events, with its usage, over either API") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  const std::string text = softmax_answer();
  server.push(Reply{200, answer_stream(api, text, 1234, 567)});
  LogCapture log;
  LlmClientConfig c = config_for(server, api);
  c.stream = true;
  auto client = make_client(c, log);
  StatusOr<ChatResponse> r = client->complete(hello());
  INFO(log.all());
  REQUIRE(r.ok());
  CHECK(r->text == text);
  CHECK(r->usage.input_tokens == 1234);
  CHECK(r->usage.output_tokens == 567);
  CHECK_FALSE(r->usage.estimated);
  CHECK_FALSE(r->truncated);
  CHECK(r->stop_reason == (api == ChatApi::kOpenAi ? "stop" : "end_turn"));
  const Received got = server.received().at(0);
  CHECK(got.json_body().at("stream") == true);
  if (api == ChatApi::kOpenAi) CHECK(got.json_body().at("stream_options").at("include_usage") == true);
  CHECK(got.header("Accept").find("text/event-stream") != std::string::npos);
  CHECK(log.all().find("streamed (idle timeout 300.00 s)") != std::string::npos);
}

TEST_CASE("llm client: a stream cut short or carrying an error event is retried, and a server that does not stream is read as JSON") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  ScriptedLlmServer server;
  const std::string text = softmax_answer();
  server.push(Reply{200, answer_stream(api, text, 1000, 500, /*complete=*/false)});
  server.push(Reply{200, "event: error\ndata: " + json{{"type", "error"}, {"error", {{"type", "overloaded_error"}, {"message", "Overloaded"}}}}.dump() + "\n\n"});
  server.push(Reply{200, answer_body(api, text)});   // no stream at all
  LogCapture log;
  LlmClientConfig c = config_for(server, api);
  c.stream = true;
  auto client = make_client(c, log);
  StatusOr<ChatResponse> r = client->complete(hello());
  INFO(log.all());
  REQUIRE(r.ok());
  CHECK(r->text == text);
  CHECK(r->attempts == 3);
  CHECK(log.all().find("the stream ended before the answer was complete") != std::string::npos);
  CHECK(log.all().find("the stream carried an error: Overloaded") != std::string::npos);
}

TEST_CASE("llm client: a stream whose data is not JSON is a malformed answer, not retried") {
  ScriptedLlmServer server;
  server.push(Reply{200, "data: {\"choices\": [\n\n"});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.stream = true;
  auto client = make_client(c, log);
  StatusOr<ChatResponse> r = client->complete(hello());
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("malformed answer stream: event 1: data is not JSON") != std::string::npos);
  CHECK(server.count() == 1);
}

TEST_CASE("llm client: a silent stream ends at the idle timeout, long before the request timeout") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_stream("late"), {}, /*hold=*/true});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.stream = true;
  c.stream_idle_timeout_ms = 1000;
  c.request_timeout_ms = 60000;
  c.max_retries = 0;
  auto client = make_client(c, log);
  const auto t0 = Clock::now();
  StatusOr<ChatResponse> r = client->complete(hello());
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("no byte of the stream for 1 s (llm.stream_idle_timeout_ms 1000)") != std::string::npos);
  // libcurl averages the speed over its last 5 s, the request it sent included: the idle timeout
  // plus up to about 6 s, against the 60 s the whole request may take.
  CHECK(took >= 1s);
  CHECK(took < 1s + 6s + kSchedulingSlack);
  server.release();
}

// ---- budgets ---------------------------------------------------------------------------------------

TEST_CASE("llm client: no request is sent once the token budget is spent") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("one", 600, 500)});
  server.push(Reply{200, openai_body("two")});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.max_total_tokens = 1000;
  auto client = make_client(c, log);

  REQUIRE(client->complete(hello()).ok());
  CHECK(client->budget_exhausted());
  StatusOr<ChatResponse> r = client->complete(hello());

  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kOutOfRange);
  CHECK(r.status().message() == "llm: token budget spent: 1100 of 1000 tokens used (llm.max_total_tokens)");
  CHECK(server.count() == 1);
  CHECK(client->spend().requests == 1);
}

TEST_CASE("llm client: no request is sent once the cost budget is spent") {
  ScriptedLlmServer server;
  server.push(Reply{200, anthropic_body("one", 500, 200)});
  server.push(Reply{200, anthropic_body("two")});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kAnthropic);
  c.max_cost_usd = 0.01;
  c.input_usd_per_million = 10;    // 500 tokens: $0.005
  c.output_usd_per_million = 30;   // 200 tokens: $0.006
  auto client = make_client(c, log);

  REQUIRE(client->complete(hello()).ok());
  CHECK(client->spend().cost_usd == Approx(0.011));
  StatusOr<ChatResponse> r = client->complete(hello());

  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "llm: cost budget spent: $0.0110 of $0.0100 used (llm.max_cost_usd)");
  CHECK(server.count() == 1);
}

TEST_CASE("llm client: a server that reports no usage is charged an estimate, so budgets still end") {
  ScriptedLlmServer server;
  server.push(Reply{200, R"({"choices": [{"message": {"role": "assistant", "content": "0123456789abcdef"}, "finish_reason": "stop"}]})"});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.max_total_tokens = 10;
  auto client = make_client(c, log);
  StatusOr<ChatResponse> r = client->complete(hello());
  REQUIRE(r.ok());
  CHECK(r->usage.estimated);
  CHECK(r->usage.output_tokens == 4);   // 16 bytes
  CHECK(r->usage.input_tokens > 10);    // the request body, at 4 bytes a token
  CHECK(client->budget_exhausted());
}

TEST_CASE("llm proposer: stops proposing once its client's budget is spent") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body(softmax_answer(), 3000, 1000)});
  server.push(Reply{200, openai_body(softmax_answer())});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.max_total_tokens = 4000;
  LlmProposer proposer(make_client(c, log), log.sink());
  const OpSignature sig = cuda_softmax();
  SearchTree tree;

  std::vector<Move> first = proposer.propose(request_for(sig, tree, 0));
  REQUIRE(first.size() == 1);
  tree.add(0, first[0]);
  std::vector<Move> second = proposer.propose(request_for(sig, tree, 0));
  std::vector<Move> third = proposer.propose(request_for(sig, tree, 1));

  CHECK(second.empty());
  CHECK(third.empty());
  CHECK(server.count() == 1);
  const std::string said = log.all();
  const std::string line = "llm: no more proposals: llm: token budget spent: 4000 of 4000 tokens used";
  CHECK(said.find(line) != std::string::npos);
  CHECK(said.find(line) == said.rfind(line));   // once, not once per expansion
}

// ---- the key ------------------------------------------------------------------------------------

TEST_CASE("llm client: the key goes in the API's own header and nowhere else") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("hi")});
  server.push(Reply{200, anthropic_body("hi")});
  LogCapture log;
  REQUIRE(make_client(config_for(server, ChatApi::kOpenAi), log)->complete(hello()).ok());
  REQUIRE(make_client(config_for(server, ChatApi::kAnthropic), log)->complete(hello()).ok());

  const std::vector<Received> got = server.received();
  REQUIRE(got.size() == 2);
  CHECK(got[0].header("Authorization") == "Bearer " + test_key());
  CHECK_FALSE(got[0].has_header("x-api-key"));
  CHECK(got[1].header("x-api-key") == test_key());
  CHECK_FALSE(got[1].has_header("Authorization"));
  for (const Received& r : got) CHECK_FALSE(leaks_key(r.body));
  CHECK_FALSE(leaks_key(log.all()));
  CHECK(log.all().find("key from $KFORGE_TEST_LLM_KEY") != std::string::npos);
}

TEST_CASE("llm client: a key the server echoes back never reaches a log line or an error") {
  const ChatApi api = GENERATE(ChatApi::kOpenAi, ChatApi::kAnthropic);
  const std::string& key = test_key();
  ScriptedLlmServer server;
  // A 401 quoting the whole key, retried 5xx bodies holding it raw (they are logged), a 200 whose
  // malformed body holds it, an answer that repeats it, and one that puts it in a rejected plan.
  server.push(Reply{401, api_error("Incorrect API key provided: " + key + ".", "authentication_error")});
  server.push(Reply{500, "internal error while handling key=" + key});
  server.push(Reply{502, "bad gateway; your key ends in ..." + key.substr(key.size() - 12)});
  server.push(Reply{500, "still broken " + key});
  server.push(Reply{200, "{\"echo\": \"" + key + "\""});
  server.push(Reply{200, answer_body(api, "your key is " + key + ", keep it safe")});
  const std::string plan = edited(kSoftmaxPlan, "\"int64\"", "\"" + key + "\"");
  server.push(Reply{200, answer_body(api, softmax_answer(kSoftmaxSource, plan))});
  LogCapture log;
  auto client = make_client(config_for(server, api), log);

  std::vector<std::string> errors;
  for (int i = 0; i < 3; ++i) {
    StatusOr<ChatResponse> r = client->complete(hello());
    REQUIRE_FALSE(r.ok());
    errors.push_back(r.status().message());
  }
  StatusOr<ChatResponse> echoed = client->complete(hello());
  REQUIRE(echoed.ok());
  CHECK(echoed->text == "your key is [redacted], keep it safe");
  LlmProposerOptions no_repairs;   // one rejected answer is enough here
  no_repairs.format_repairs = 0;
  LlmProposer proposer(client, log.sink(), no_repairs);
  const OpSignature sig = cuda_softmax();
  SearchTree tree;
  CHECK(proposer.propose(request_for(sig, tree, 0)).empty());

  INFO(log.all());
  CHECK(server.count() == 7);
  CHECK(errors[0].find("HTTP 401: Incorrect API key provided: [redacted]. (authentication_error)") != std::string::npos);
  CHECK(errors[1].find("HTTP 500: body: still broken [redacted]") != std::string::npos);
  CHECK(errors[2].find("malformed answer body") != std::string::npos);
  CHECK(log.all().find("key=[redacted]") != std::string::npos);
  CHECK(log.all().find("unknown type '[redacted]") != std::string::npos);
  for (const std::string& e : errors) CHECK_FALSE(leaks_key(e));
  CHECK_FALSE(leaks_key(log.all()));
}

TEST_CASE("llm client: a key is trimmed of surrounding whitespace, and one with control characters is refused") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("hi")});
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.api_key_env = "KFORGE_TEST_LLM_PADDED_KEY";
  ::setenv(c.api_key_env.c_str(), ("  " + test_key() + "\n").c_str(), 1);
  REQUIRE(make_client(c, log)->complete(hello()).ok());
  CHECK(server.received().at(0).header("Authorization") == "Bearer " + test_key());

  ::setenv(c.api_key_env.c_str(), (test_key() + "\r\nX-Injected: 1").c_str(), 1);
  StatusOr<std::unique_ptr<LlmClient>> bad = LlmClient::create(c, log.sink());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "llm.api_key_env: $KFORGE_TEST_LLM_PADDED_KEY holds control characters, which no API key has");
  ::unsetenv(c.api_key_env.c_str());
  CHECK_FALSE(leaks_key(log.all()));
}

TEST_CASE("llm client: without a key in the environment, requests go without one") {
  ScriptedLlmServer server;
  server.push(Reply{200, openai_body("local")});
  server.push(Reply{200, anthropic_body("local")});
  ::unsetenv("KFORGE_TEST_LLM_NO_SUCH_KEY");
  LogCapture log;
  LlmClientConfig c = config_for(server, ChatApi::kOpenAi);
  c.api_key_env = "KFORGE_TEST_LLM_NO_SUCH_KEY";
  auto openai = make_client(c, log);
  CHECK_FALSE(openai->has_key());
  REQUIRE(openai->complete(hello()).ok());
  c.api = ChatApi::kAnthropic;
  c.api_key_env = "";
  REQUIRE(make_client(c, log)->complete(hello()).ok());
  const std::vector<Received> got = server.received();
  REQUIRE(got.size() == 2);
  CHECK_FALSE(got[0].has_header("Authorization"));
  CHECK_FALSE(got[1].has_header("x-api-key"));
  CHECK(log.all().find("key from $KFORGE_TEST_LLM_NO_SUCH_KEY (not set: requests go without a key)") != std::string::npos);
  CHECK(log.all().find("no key") != std::string::npos);
}

// ---- the answer format ---------------------------------------------------------------------------

TEST_CASE("kernel answer: plan_json writes what parse_kernel_answer reads back") {
  const OpSignature sig = cpu_layer_norm();
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = "#include \"runtime/cpu_kernel_abi.h\"\nextern \"C\" void ln_rows(const kforge_cpu_block* b, void* const* p) {}\n"
             "extern \"C\" void ln_finish(const kforge_cpu_block* b, void* const* p) {}\n";
  s.entry_points = {"ln_rows", "ln_finish"};
  s.compile_options = {"-O3", "-march=native"};
  s.plan.scratch = {ScratchBuffer{"partials", "size0_0 * 16"}};
  s.plan.outputs = {OutputSpec::like(0), OutputSpec::explicit_layout(DType::kFloat32, {"size0_0", "1"}, {"1", "1"}),
                    OutputSpec::like(0, DType::kFloat64)};
  Launch a;
  a.entry = "ln_rows";
  a.grid = {"size0_0", "2", "1"};
  a.block = {"1", "1", "1"};
  a.shared_mem_bytes = "size0_1 * 4";
  a.args = {ArgBinding::input(0),  ArgBinding::input(2), ArgBinding::scratch(0), ArgBinding::size("size0_1", ValueType::kInt32),
            ArgBinding::scalar(4, ValueType::kFloat64)};
  Launch b;
  b.entry = "ln_finish";
  b.grid = {"size0_0", "1", "1"};
  b.args = {ArgBinding::scratch(0), ArgBinding::output(0), ArgBinding::output(1), ArgBinding::output(2),
            ArgBinding::size("arg1_0")};
  s.plan.launches = {a, b};
  REQUIRE(s.validate().ok());

  const std::string text = "```cpp\n" + s.source + "```\n```json\n" + plan_json(s, "two passes") + "\n```\n";
  StatusOr<KernelAnswer> back = parse_kernel_answer(text, sig);
  INFO(text);
  INFO(back.status().message());
  REQUIRE(back.ok());
  CHECK(back->spec == s);
  CHECK(back->summary == "two passes");
}

TEST_CASE("prompts: every catalog operator is described with its schema and what each output is") {
  // The catalog is the only list (runtime/op_catalog.h); the prompt carries each entry's text.
  REQUIRE(catalog::operators().size() == catalog::kOperatorCount);
  for (const catalog::OpEntry& e : catalog::operators()) {
    INFO(e.qualified());
    CHECK(catalog::incomplete(e).empty());
    CHECK(e.schema.starts_with(e.qualified() + "("));
    CHECK(e.semantics.find("Output") != std::string_view::npos);
  }
  CHECK(catalog::find(OpSignature{"aten::add", "Scalar", {}, {}}) == nullptr);
}

TEST_CASE("kernel answer: a summary longer than a label's 120 bytes is cut on a character and says so") {
  const OpSignature sig = cuda_softmax();
  const std::string long_summary = std::string(118, 'x') + "\u00e9\u00e9 and more";   // é is 2 bytes: 118 + 2 = 120
  const std::string plan = edited(kSoftmaxPlan, R"("summary": "one block per row, shared-memory max and sum\nthis second line is not part of the label")",
                                   "\"summary\": \"" + long_summary + "\"");
  StatusOr<KernelAnswer> a = parse_kernel_answer(softmax_answer(kSoftmaxSource, plan), sig);
  REQUIRE(a.ok());
  CHECK(a->summary == std::string(118, 'x') + "\u00e9 [summary cut]");
}

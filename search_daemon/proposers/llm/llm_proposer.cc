#include "search_daemon/proposers/llm/llm_proposer.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/llm/kernel_answer.h"
#include "search_daemon/proposers/llm/llm_prompt.h"

namespace kforge::llm {

namespace {

using search::Move;
using search::Node;
using search::ProposalRequest;

// Note [LLM prior]
// A PUCT prior says how much the strategy should trust a move before it is evaluated. An LLM
// candidate is one answer out of a large, unenumerated space: it is often wrong (it does not
// compile, or fails a check), sometimes much better than anything a template reaches. 0.5 puts it
// in the middle: an LLM child is explored early but not ahead of a template move that its proposer
// rates highly, and it is fixed (not per prompt kind) because nothing measured yet says a repair
// is more or less likely to pay than an improvement. bench/ measures search efficiency; change it
// there, with numbers.

// Note [Format repairs]
// An answer that cannot become a candidate (no fenced blocks, a JSON syntax error, a plan that does
// not resolve for the signature, the wrong number of outputs, cut off at max_tokens, a kernel
// already in the tree) says nothing about whether the model's idea is good: it is a format
// problem, which the model fixes when told. So the answer goes back into the same conversation
// (its own text as the assistant's turn, then a user turn with the precise reason and the format:
// format_repair_message), up to options.format_repairs times, before that answer is given up. A
// real model's one JSON syntax error had ended a search: "ended after 0 evaluations: done: the
// search space is exhausted". Each turn is one more request against the client's budgets.

// Note [LLM provenance]
// A kernel a model wrote is audited by its conversation: Move::origin holds it as JSON, the
// journal keeps it with the node, and a published entry carries it as the blob kLlmProvenanceBlob
// (`kforge cache show` summarizes it; `--llm` prints it): {"api", "model", "prompt_kind",
// "format_repairs", "messages": [{"role": "system"|"user"|"assistant", "content"}...] (the whole
// conversation, the answer last), "answer_tokens": {"input", "output", "estimated"}, "signature_spend":
// {"answers", "input_tokens", "output_tokens", "cost_usd"} (every answer this proposer got for the
// signature until then, rejected ones and repairs included; the cost at the configured prices)}.
// No secret is in it: the key never enters a prompt, and answers are redacted by the client.

bool supported_dtype(DType d) {
  return d != DType::kComplex64 && d != DType::kComplex128 && d != DType::kFloat8E4M3FN && d != DType::kFloat8E5M2;
}

}  // namespace

LlmProposer::LlmProposer(std::shared_ptr<LlmClient> client, LogSink log, LlmProposerOptions options)
    : client_(std::move(client)), log_(std::move(log)), options_(std::move(options)) {
  if (!(options_.prior > 0 && options_.prior <= 1)) options_.prior = kLlmPrior;
  options_.answers_per_expansion = std::max<size_t>(1, options_.answers_per_expansion);
}

// A rejection quotes the model's answer, which may repeat whatever the server echoed, so the
// proposer's lines are redacted like the client's (Note [Key redaction] in llm_client.cc).
LlmSpend LlmProposer::add_spend(const OpSignature& sig, const TokenUsage& usage) {
  std::lock_guard<std::mutex> lock(spend_mu_);
  LlmSpend& s = spend_[sig.id()];
  ++s.requests;
  s.input_tokens += usage.input_tokens;
  s.output_tokens += usage.output_tokens;
  s.cost_usd += client_->config().cost_usd(usage);
  return s;
}

// Note [LLM provenance].
std::string LlmProposer::provenance(const ChatRequest& chat, const ChatResponse& answer, const std::string& kind,
                                    size_t repairs, const LlmSpend& spent) const {
  using nlohmann::json;
  const LlmClientConfig& k = client_->config();
  json messages = json::array();
  if (!chat.system.empty()) messages.push_back({{"role", "system"}, {"content", chat.system}});
  for (const ChatMessage& m : chat.messages) {
    messages.push_back({{"role", m.role == ChatRole::kUser ? "user" : "assistant"}, {"content", m.content}});
  }
  messages.push_back({{"role", "assistant"}, {"content", answer.text}});
  json j = {{"api", std::string(chat_api_name(k.api))},
            {"model", k.model},
            {"prompt_kind", kind},
            {"format_repairs", repairs},
            {"messages", std::move(messages)},
            {"answer_tokens", {{"input", answer.usage.input_tokens}, {"output", answer.usage.output_tokens}, {"estimated", answer.usage.estimated}}},
            {"signature_spend", {{"answers", spent.requests}, {"input_tokens", spent.input_tokens},
                                 {"output_tokens", spent.output_tokens}, {"cost_usd", spent.cost_usd}}}};
  return client_->redact(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

void LlmProposer::log(std::string_view line) const {
  if (!log_) return;
  if (client_) {
    log_(client_->redact(line));
  } else {
    log_(line);
  }
}

bool LlmProposer::supports(const OpSignature& sig) const {
  if (catalog::find(sig) == nullptr) return false;
  const DeviceType want = sig.target.backend == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu;
  for (const Arg& a : sig.args) {
    if (const auto* t = std::get_if<TensorMeta>(&a.value)) {
      if (!supported_dtype(t->dtype) || t->device != want) return false;
    } else if (std::holds_alternative<std::vector<TensorMeta>>(a.value)) {
      return false;   // no catalog operator takes a tensor list; the plan language cannot bind one
    }
  }
  return true;
}

// Note [LLM requests in the background]
// With options.concurrent_requests > 0, a request from a strategy (one that sets
// ProposalRequest::pending) does not wait for the model (Note [Asynchronous proposals] in
// proposer.h). propose() makes the same checks and builds the same prompt as the synchronous path,
// on the search's thread (the prompt reads the tree), copies what the conversation needs (the
// signature, the prompt, the specs already in the tree), queues it, and returns with *pending set.
// One of concurrent_requests threads holds the conversation (answers, checks, format repairs:
// converse(), exactly the synchronous path's) and files its moves under (signature, node); it then
// calls the request's on_ready, and the strategy's collect() takes them.
// Limits: one conversation per node at a time (a second request from the node waits for the first:
// its prompt would not know what the first one proposes), requests_per_search per signature (so one
// search cannot take every thread), concurrent_requests over all. A request past a limit sets
// *pending and queues nothing: the strategy asks again after something of its search finishes. The
// client's budget is checked before queueing (a spent budget queues nothing and is said once).
// A search that ended (release()) loses its queued conversations, and its running ones are
// abandoned: the client's call ends within about a second (LlmClient::complete's `abandon`), so
// the thread is free for other searches; an answer that arrived anyway is discarded (its tokens
// were spent and count in the client's and the signature's spend).

struct LlmProposer::Expansion {
  OpSignature signature;
  uint64_t parent = 0;
  uint64_t generation = 0;
  Prompt prompt;
  size_t answers = 1;
  std::map<KernelId, std::pair<uint64_t, std::string>> known;   // specs in the tree: node, label
  std::function<void()> on_ready;
  std::atomic<bool> abandoned{false};   // its search ended (release()): the client's call ends early

  Key key() const { return {signature.id(), parent}; }
  std::string where() const { return "node " + std::to_string(parent) + " of " + signature.to_string(); }
};

LlmProposer::~LlmProposer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    stopping_ = true;
    queue_.clear();
    threads.swap(threads_);
    // A conversation on the wire may wait minutes for the model: cut it short.
    if (running_ > 0 && client_) client_->cancel();
  }
  bg_cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

std::vector<Move> LlmProposer::propose(const ProposalRequest& request) {
  // proposer.h: never throws. What could (allocation, a library's exception) ends this expansion.
  try {
    if (options_.concurrent_requests > 0 && request.pending != nullptr) return propose_in_background(request);
    return propose_or_throw(request);
  } catch (const std::exception& e) {
    log(std::string("llm: no proposal: internal error: ") + e.what());
  } catch (...) {
    log("llm: no proposal: internal error");
  }
  return {};
}

std::shared_ptr<LlmProposer::Expansion> LlmProposer::prepare(const ProposalRequest& r) {
  if (r.signature == nullptr || r.tree == nullptr) {
    log("llm: no proposal: the request has no signature or no tree");
    return nullptr;
  }
  if (r.parent >= r.tree->size()) {
    log("llm: no proposal: node " + std::to_string(r.parent) + " is not in the tree (" +
        std::to_string(r.tree->size()) + " nodes)");
    return nullptr;
  }
  if (r.max_moves == 0) return nullptr;
  if (!supports(*r.signature)) {
    log("llm: no proposal: " + r.signature->to_string() + " is not an operator this proposer knows");
    return nullptr;
  }
  if (!client_) {
    log("llm: no proposal: no client");
    return nullptr;
  }
  if (Status b = client_->budget_status(); !b.ok()) {
    // Every later expansion meets the same spent budget: said once, not once per expansion.
    if (!budget_logged_.exchange(true)) log("llm: no more proposals: " + b.message());
    return nullptr;
  }
  auto e = std::make_shared<Expansion>();
  e->signature = *r.signature;
  e->parent = r.parent;
  e->prompt = build_prompt(r, options_.prompt);
  e->answers = std::min(r.max_moves, options_.answers_per_expansion);
  for (const Node& n : r.tree->nodes()) {
    if (!n.move.spec.source.empty()) e->known.emplace(n.spec_id, std::make_pair(n.id, n.move.label));
  }
  e->on_ready = r.on_ready;
  return e;
}

std::vector<Move> LlmProposer::propose_or_throw(const ProposalRequest& r) {
  std::shared_ptr<Expansion> e = prepare(r);
  if (!e) return {};
  Answered a = converse(*e);
  if (a.retry_later && r.retry_later != nullptr) *r.retry_later = true;   // Note [Retried proposals]
  return std::move(a.moves);
}

LlmProposer::Answered LlmProposer::converse(const Expansion& e) {
  Answered out;
  std::vector<Move>& moves = out.moves;
  const catalog::OpEntry* op = catalog::find(e.signature);
  const std::string kind(prompt_kind_name(e.prompt.kind));
  const std::string where = e.where();
  // Why an answer cannot be used (empty: it can, and `m` is its move).
  auto check = [&](const ChatResponse& answer, Move& m) -> std::string {
    if (answer.truncated) {
      return "the answer was cut off at max_tokens (" + std::to_string(client_->config().max_tokens) +
             ", stop reason '" + answer.stop_reason + "')";
    }
    StatusOr<KernelAnswer> parsed = parse_kernel_answer(answer.text, e.signature);
    if (!parsed.ok()) return parsed.status().message();
    if (op != nullptr && parsed->spec.plan.outputs.size() != op->outputs.size()) {
      return "outputs: " + op->qualified() + " returns " + std::to_string(op->outputs.size()) +
             (op->outputs.size() == 1 ? " tensor" : " tensors") + "; the plan allocates " +
             std::to_string(parsed->spec.plan.outputs.size());
    }
    const KernelId id = parsed->spec.id();
    if (auto same = e.known.find(id); same != e.known.end()) {
      return "it repeats the kernel of node " + std::to_string(same->second.first) + " (\"" + same->second.second + "\")";
    }
    if (std::any_of(moves.begin(), moves.end(), [&](const Move& x) { return x.spec.id() == id; })) {
      return "it repeats an answer of this expansion";
    }
    m.spec = std::move(parsed->spec);
    m.proposer = "llm";
    m.label = "llm: " + (parsed->summary.empty() ? std::string("(no summary)") : parsed->summary);
    m.prior = options_.prior;
    return {};
  };
  for (size_t i = 0; i < e.answers; ++i) {
    // Note [Format repairs]: one conversation per answer; a rejected answer is sent back with why.
    ChatRequest chat = e.prompt.chat;
    for (size_t turn = 0;; ++turn) {
      if (Status b = client_->budget_status(); !b.ok()) {
        if (!budget_logged_.exchange(true)) log("llm: no more proposals: " + b.message());
        return out;
      }
      if (e.abandoned.load()) return out;   // its search ended (release())
      StatusOr<ChatResponse> answer = client_->complete(chat, &e.abandoned);
      if (!answer.ok()) {
        if (e.abandoned.load()) return out;
        log("llm: no proposal for " + where + " (" + kind + "): " + answer.status().message());
        if (client_->budget_status().ok()) out.retry_later = true;   // Note [Retried proposals]
        return out;   // the next answer would meet the same server
      }
      const LlmSpend spent = add_spend(e.signature, answer->usage);
      Move m;
      const std::string why = check(*answer, m);
      if (why.empty()) {
        m.origin = provenance(chat, *answer, kind, turn, spent);
        log("llm: proposed for " + where + " (" + kind + (turn > 0 ? ", after " + std::to_string(turn) + " format repair" + (turn > 1 ? "s" : "") : std::string()) +
            "): " + m.label);
        moves.push_back(std::move(m));
        break;
      }
      log("llm: answer rejected for " + where + " (" + kind + "): " + why);
      if (turn == options_.format_repairs) {
        out.retry_later = true;   // Note [Retried proposals]
        break;
      }
      chat.messages.push_back(ChatMessage{ChatRole::kAssistant, answer->text});
      chat.messages.push_back(ChatMessage{ChatRole::kUser, format_repair_message(why, e.signature.target.backend)});
      log("llm: asking again for " + where + " (format repair " + std::to_string(turn + 1) + " of " +
          std::to_string(options_.format_repairs) + ")");
    }
  }
  return out;
}

std::vector<Move> LlmProposer::propose_in_background(const ProposalRequest& r) {
  std::vector<Move> moves;
  if (r.signature == nullptr || r.tree == nullptr) return propose_or_throw(r);   // logs why: nothing asked
  const Key key{r.signature->id(), r.parent};
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    if (ready_.count(key) != 0) return take_ready_locked(key, r);   // finished before anyone collected it
    const auto search = per_search_.find(key.first);
    if (outstanding_.count(key) != 0 || (search != per_search_.end() && search->second >= options_.requests_per_search)) {
      *r.pending = true;   // asked again once something of this search finishes
      return moves;
    }
    // Reserved before the prompt is built, so the limits hold; given back if nothing is asked.
    ++outstanding_[key];
    ++per_search_[key.first];
  }
  std::shared_ptr<Expansion> e;
  try {
    e = prepare(r);
  } catch (...) {
    e = nullptr;
  }
  std::lock_guard<std::mutex> lock(bg_mu_);
  if (!e || stopping_) {
    forget_locked(key);
    return moves;
  }
  e->generation = generation_[key.first];
  queue_.push_back(std::move(e));
  if (threads_.size() < options_.concurrent_requests && threads_.size() < queue_.size() + running_) {
    threads_.emplace_back([this] { serve(); });
  }
  bg_cv_.notify_one();
  *r.pending = true;
  return moves;
}

void LlmProposer::serve() {
  for (;;) {
    std::shared_ptr<Expansion> e;
    {
      std::unique_lock<std::mutex> lock(bg_mu_);
      bg_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      e = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      running_list_.push_back(e);
    }
    Answered a;
    try {
      a = converse(*e);
    } catch (const std::exception& ex) {
      log(std::string("llm: no proposal for " + e->where() + ": internal error: ") + ex.what());
    } catch (...) {
      log("llm: no proposal for " + e->where() + ": internal error");
    }
    bool stale = false;
    {
      std::lock_guard<std::mutex> lock(bg_mu_);
      --running_;
      running_list_.erase(std::find(running_list_.begin(), running_list_.end(), e));
      const Key key = e->key();
      forget_locked(key);
      stale = generation_[key.first] != e->generation;
      if (!stale) {
        Answered& r = ready_[key];
        for (Move& m : a.moves) r.moves.push_back(std::move(m));
        r.retry_later = r.retry_later || a.retry_later;
      }
    }
    if (stale) {
      log("llm: the search of " + e->signature.to_string() + " ended: its request for node " + std::to_string(e->parent) +
          (a.moves.empty() ? std::string(" is abandoned") : std::string("'s answer is dropped")));
      continue;
    }
    if (e->on_ready) {
      try {
        e->on_ready();
      } catch (...) {
        // proposer.h: on_ready does not throw; a search that cannot be woken polls
      }
    }
  }
}

std::vector<Move> LlmProposer::take_ready_locked(const Key& key, const ProposalRequest& r) {
  std::vector<Move> moves;
  if (auto done = ready_.find(key); done != ready_.end()) {
    moves = std::move(done->second.moves);
    if (done->second.retry_later && r.retry_later != nullptr) *r.retry_later = true;
    ready_.erase(done);
  }
  if (r.pending != nullptr && outstanding_.count(key) != 0) *r.pending = true;
  return moves;
}

void LlmProposer::forget_locked(const Key& key) {
  if (auto o = outstanding_.find(key); o != outstanding_.end() && --o->second == 0) outstanding_.erase(o);
  if (auto p = per_search_.find(key.first); p != per_search_.end() && --p->second == 0) per_search_.erase(p);
}

std::vector<Move> LlmProposer::collect(const ProposalRequest& r) {
  std::vector<Move> moves;
  if (r.signature == nullptr) return moves;
  try {
    const Key key{r.signature->id(), r.parent};
    std::lock_guard<std::mutex> lock(bg_mu_);
    moves = take_ready_locked(key, r);
  } catch (...) {
    moves.clear();
  }
  return moves;
}

void LlmProposer::release(const OpSignature& sig) {
  try {
    const SignatureId id = sig.id();
    std::lock_guard<std::mutex> lock(bg_mu_);
    ++generation_[id];
    for (auto it = ready_.begin(); it != ready_.end();) it = it->first.first == id ? ready_.erase(it) : std::next(it);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->signature.id() != id) {
        ++it;
        continue;
      }
      forget_locked((*it)->key());
      it = queue_.erase(it);
    }
    bool abandoned = false;
    for (const std::shared_ptr<Expansion>& e : running_list_) {
      if (e->signature.id() == id) {
        e->abandoned.store(true);
        abandoned = true;
      }
    }
    if (abandoned && client_) client_->interrupt();   // a backoff wait ends now, a transfer within a second
  } catch (...) {
    // proposer.h: never throws; what stays is dropped with the proposer
  }
}

size_t LlmProposer::requests_in_flight() const {
  std::lock_guard<std::mutex> lock(bg_mu_);
  return queue_.size() + running_;
}

}  // namespace kforge::llm

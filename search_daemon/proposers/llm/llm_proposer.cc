#include "search_daemon/proposers/llm/llm_proposer.h"

#include <algorithm>
#include <exception>
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

std::string short_node(const ProposalRequest& r) {
  return "node " + std::to_string(r.parent) + " of " + r.signature->to_string();
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

std::vector<Move> LlmProposer::propose(const ProposalRequest& request) {
  // proposer.h: never throws. What could (allocation, a library's exception) ends this expansion.
  try {
    return propose_or_throw(request);
  } catch (const std::exception& e) {
    log(std::string("llm: no proposal: internal error: ") + e.what());
  } catch (...) {
    log("llm: no proposal: internal error");
  }
  return {};
}

std::vector<Move> LlmProposer::propose_or_throw(const ProposalRequest& r) {
  std::vector<Move> moves;
  if (r.signature == nullptr || r.tree == nullptr) {
    log("llm: no proposal: the request has no signature or no tree");
    return moves;
  }
  if (r.parent >= r.tree->size()) {
    log("llm: no proposal: node " + std::to_string(r.parent) + " is not in the tree (" +
        std::to_string(r.tree->size()) + " nodes)");
    return moves;
  }
  if (r.max_moves == 0) return moves;
  if (!supports(*r.signature)) {
    log("llm: no proposal: " + r.signature->to_string() + " is not an operator this proposer knows");
    return moves;
  }
  if (!client_) {
    log("llm: no proposal: no client");
    return moves;
  }
  const catalog::OpEntry* op = catalog::find(*r.signature);
  const Prompt prompt = build_prompt(r, options_.prompt);
  const size_t answers = std::min(r.max_moves, options_.answers_per_expansion);
  const std::string kind(prompt_kind_name(prompt.kind));
  // Why an answer cannot be used (empty: it can, and `out` is its move).
  auto check = [&](const ChatResponse& answer, Move& out) -> std::string {
    if (answer.truncated) {
      return "the answer was cut off at max_tokens (" + std::to_string(client_->config().max_tokens) +
             ", stop reason '" + answer.stop_reason + "')";
    }
    StatusOr<KernelAnswer> parsed = parse_kernel_answer(answer.text, *r.signature);
    if (!parsed.ok()) return parsed.status().message();
    if (op != nullptr && parsed->spec.plan.outputs.size() != op->outputs.size()) {
      return "outputs: " + op->qualified() + " returns " + std::to_string(op->outputs.size()) +
             (op->outputs.size() == 1 ? " tensor" : " tensors") + "; the plan allocates " +
             std::to_string(parsed->spec.plan.outputs.size());
    }
    const KernelId id = parsed->spec.id();
    const auto& nodes = r.tree->nodes();
    auto same = std::find_if(nodes.begin(), nodes.end(), [&](const Node& n) { return n.spec_id == id; });
    if (same != nodes.end() && !same->move.spec.source.empty()) {
      return "it repeats the kernel of node " + std::to_string(same->id) + " (\"" + same->move.label + "\")";
    }
    if (std::any_of(moves.begin(), moves.end(), [&](const Move& m) { return m.spec.id() == id; })) {
      return "it repeats an answer of this expansion";
    }
    out.spec = std::move(parsed->spec);
    out.proposer = "llm";
    out.label = "llm: " + (parsed->summary.empty() ? std::string("(no summary)") : parsed->summary);
    out.prior = options_.prior;
    return {};
  };
  for (size_t i = 0; i < answers; ++i) {
    // Note [Format repairs]: one conversation per answer; a rejected answer is sent back with why.
    ChatRequest chat = prompt.chat;
    for (size_t turn = 0;; ++turn) {
      if (Status b = client_->budget_status(); !b.ok()) {
        // Every later expansion meets the same spent budget: said once, not once per expansion.
        if (!budget_logged_.exchange(true)) log("llm: no more proposals: " + b.message());
        return moves;
      }
      StatusOr<ChatResponse> answer = client_->complete(chat);
      if (!answer.ok()) {
        log("llm: no proposal for " + short_node(r) + " (" + kind + "): " + answer.status().message());
        if (r.retry_later != nullptr && client_->budget_status().ok()) *r.retry_later = true;   // Note [Retried proposals]
        return moves;   // the next answer would meet the same server
      }
      const LlmSpend spent = add_spend(*r.signature, answer->usage);
      Move m;
      const std::string why = check(*answer, m);
      if (why.empty()) {
        m.origin = provenance(chat, *answer, kind, turn, spent);
        log("llm: proposed for " + short_node(r) + " (" + kind + (turn > 0 ? ", after " + std::to_string(turn) + " format repair" + (turn > 1 ? "s" : "") : std::string()) +
            "): " + m.label);
        moves.push_back(std::move(m));
        break;
      }
      log("llm: answer rejected for " + short_node(r) + " (" + kind + "): " + why);
      if (turn == options_.format_repairs) {
        if (r.retry_later != nullptr) *r.retry_later = true;   // Note [Retried proposals]
        break;
      }
      chat.messages.push_back(ChatMessage{ChatRole::kAssistant, answer->text});
      chat.messages.push_back(ChatMessage{ChatRole::kUser, format_repair_message(why, r.signature->target.backend)});
      log("llm: asking again for " + short_node(r) + " (format repair " + std::to_string(turn + 1) + " of " +
          std::to_string(options_.format_repairs) + ")");
    }
  }
  return moves;
}

}  // namespace kforge::llm

#include "search_daemon/proposers/llm/llm_proposer.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <variant>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/llm/kernel_answer.h"

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
  for (size_t i = 0; i < answers; ++i) {
    if (Status b = client_->budget_status(); !b.ok()) {
      // Every later expansion meets the same spent budget: said once, not once per expansion.
      if (!budget_logged_.exchange(true)) log("llm: no more proposals: " + b.message());
      break;
    }
    StatusOr<ChatResponse> answer = client_->complete(prompt.chat);
    if (!answer.ok()) {
      log("llm: no proposal for " + short_node(r) + " (" + std::string(prompt_kind_name(prompt.kind)) +
          "): " + answer.status().message());
      break;   // the next answer would meet the same server
    }
    const std::string rejected = "llm: answer rejected for " + short_node(r) + " (" +
                                 std::string(prompt_kind_name(prompt.kind)) + "): ";
    if (answer->truncated) {
      log(rejected + "the answer was cut off at max_tokens (" + std::to_string(client_->config().max_tokens) +
          ", stop reason '" + answer->stop_reason + "')");
      continue;
    }
    StatusOr<KernelAnswer> parsed = parse_kernel_answer(answer->text, *r.signature);
    if (!parsed.ok()) {
      log(rejected + parsed.status().message());
      continue;
    }
    if (op != nullptr && parsed->spec.plan.outputs.size() != op->outputs.size()) {
      log(rejected + "outputs: " + op->qualified() + " returns " + std::to_string(op->outputs.size()) +
          (op->outputs.size() == 1 ? " tensor" : " tensors") + "; the plan allocates " +
          std::to_string(parsed->spec.plan.outputs.size()));
      continue;
    }
    const KernelId id = parsed->spec.id();
    const auto& nodes = r.tree->nodes();
    auto same = std::find_if(nodes.begin(), nodes.end(), [&](const Node& n) { return n.spec_id == id; });
    if (same != nodes.end() && !same->move.spec.source.empty()) {
      log(rejected + "it repeats the kernel of node " + std::to_string(same->id));
      continue;
    }
    if (std::any_of(moves.begin(), moves.end(), [&](const Move& m) { return m.spec.id() == id; })) {
      log(rejected + "it repeats an answer of this expansion");
      continue;
    }
    Move m;
    m.spec = std::move(parsed->spec);
    m.proposer = "llm";
    m.label = "llm: " + (parsed->summary.empty() ? std::string("(no summary)") : parsed->summary);
    m.prior = options_.prior;
    log("llm: proposed for " + short_node(r) + " (" + std::string(prompt_kind_name(prompt.kind)) + "): " + m.label);
    moves.push_back(std::move(m));
  }
  return moves;
}

}  // namespace kforge::llm

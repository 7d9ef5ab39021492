// LlmProposer: the Proposer whose moves a language model writes. Expanding a node asks the model
// (through LlmClient) for a kernel: a first one from the root, a faster one from a measured node, a
// repair from a node that failed to compile, was rejected, failed a check, faulted or timed out
// (llm_prompt.h says what each prompt carries). The answer is parsed into a KernelSpec
// (kernel_answer.h) and checked against the signature; anything wrong is logged with its reason and
// yields no move. Torch-free.
//
//   StatusOr<std::unique_ptr<LlmClient>> c = LlmClient::create(config, log);
//   LlmProposer llm(std::shared_ptr<LlmClient>(std::move(*c)), log);
//   ProposalRequest req{&sig, &tree, parent_id, /*max_moves=*/4, seed, roofline};
//   for (Move& m : llm.propose(req)) tree.add(parent_id, std::move(m));
//
// Promises (beyond proposer.h's):
// - One model answer per move; options.answers_per_expansion (at most max_moves) answers per
//   propose() call, one after the other. An answer that cannot be used (below) is sent back to the
//   model with the reason, in the same conversation, up to options.format_repairs times (Note
//   [Format repairs]); only then does that answer yield no move.
// - propose() returns no move, with one log line saying why, when: the request is incomplete, the
//   operator is not in the catalog, the client's budget is spent (then no request is sent at all,
//   and the line comes once per proposer, not once per expansion),
//   the client fails (HTTP error, timeout, ...), the answer was cut off at max_tokens, the answer
//   does not parse or its plan does not validate or resolve for the signature, it allocates a
//   different number of outputs than the operator returns, or it repeats a kernel already in the
//   tree.
// - Every move has proposer "llm", label "llm: <first line of the answer's summary>" and the prior
//   options.prior (Note [LLM prior] in llm_proposer.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "search_daemon/proposers/llm/llm_client.h"
#include "search_daemon/proposers/llm/llm_prompt.h"
#include "search_daemon/proposers/proposer.h"

namespace kforge::llm {

// Note [LLM prior] in llm_proposer.cc says why.
inline constexpr double kLlmPrior = 0.5;

struct LlmProposerOptions {
  size_t answers_per_expansion = 1;   // answers per propose(), capped by max_moves
  // Note [Format repairs] in llm_proposer.cc: turns that send a rejected answer back with why.
  size_t format_repairs = 2;
  double prior = kLlmPrior;           // in (0, 1]
  PromptLimits prompt;
};

class LlmProposer final : public search::Proposer {
 public:
  // `client` may be shared by the proposers of several searches (it is thread-safe).
  LlmProposer(std::shared_ptr<LlmClient> client, LogSink log, LlmProposerOptions options = {});

  std::string_view name() const override { return "llm"; }
  // Catalog operators (llm_prompt.h) on tensors of real or integer dtypes (no complex, no float8).
  bool supports(const OpSignature& sig) const override;
  std::vector<search::Move> propose(const search::ProposalRequest& request) override;

 private:
  std::vector<search::Move> propose_or_throw(const search::ProposalRequest& request);
  void log(std::string_view line) const;
  // Counts an answer against its signature's spend; the spend so far (Note [LLM provenance]).
  LlmSpend add_spend(const OpSignature& sig, const TokenUsage& usage);
  std::string provenance(const ChatRequest& chat, const ChatResponse& answer, const std::string& kind, size_t repairs,
                         const LlmSpend& spent) const;

  std::shared_ptr<LlmClient> client_;
  LogSink log_;
  LlmProposerOptions options_;
  std::atomic<bool> budget_logged_{false};
  std::mutex spend_mu_;
  std::map<SignatureId, LlmSpend> spend_;   // per signature: answers, tokens and cost (LlmSpend::requests = answers)
};

}  // namespace kforge::llm

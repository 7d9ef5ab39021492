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
// With options.concurrent_requests > 0 and a request that sets ProposalRequest::pending, propose()
// does not wait for the model (Note [Asynchronous proposals] in proposer.h, Note [LLM requests in
// the background] in llm_proposer.cc): it builds the prompt, queues the conversation for one of the
// proposer's own threads, and returns; collect() returns the moves once the answer is in.
//
// Promises (beyond proposer.h's):
// - One model answer per move; options.answers_per_expansion (at most max_moves) answers per
//   expansion, one after the other. An answer that cannot be used (below) is sent back to the
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
// - In the background: at most options.concurrent_requests conversations run at once over all
//   searches, at most options.requests_per_search are queued or running for one signature, and at
//   most one for one node; past those limits propose() sets *pending and starts nothing. Each
//   finished conversation calls its request's on_ready once. release(sig) drops sig's queued
//   conversations and collected-but-unclaimed moves, and abandons its running ones (their
//   requests end within about a second; an answer that arrives anyway is discarded). The destructor waits for running conversations, cancelling the client's requests
//   (LlmClient::cancel) when any is running.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
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
  // Note [LLM requests in the background]: conversations run at once on the proposer's threads (0:
  // none; propose() waits for the model), and queued or running per signature.
  size_t concurrent_requests = 0;
  size_t requests_per_search = 2;
};

class LlmProposer final : public search::Proposer {
 public:
  // `client` may be shared by the proposers of several searches (it is thread-safe).
  LlmProposer(std::shared_ptr<LlmClient> client, LogSink log, LlmProposerOptions options = {});
  ~LlmProposer() override;
  LlmProposer(const LlmProposer&) = delete;
  LlmProposer& operator=(const LlmProposer&) = delete;

  std::string_view name() const override { return "llm"; }
  // Catalog operators (llm_prompt.h) on tensors of real or integer dtypes (no complex, no float8).
  bool supports(const OpSignature& sig) const override;
  std::vector<search::Move> propose(const search::ProposalRequest& request) override;
  std::vector<search::Move> collect(const search::ProposalRequest& request) override;
  void release(const OpSignature& sig) override;

  // Conversations queued or running now (for tests and the daemon's status).
  size_t requests_in_flight() const;

 private:
  // One expansion's conversation, everything it needs copied out of the request (the tree is the
  // search's, read on the search's thread only).
  struct Expansion;
  struct Answered {
    std::vector<search::Move> moves;
    bool retry_later = false;
  };
  using Key = std::pair<SignatureId, uint64_t>;   // signature, parent node

  std::vector<search::Move> propose_or_throw(const search::ProposalRequest& request);
  // The checks of propose() and the prompt; null (with a log line) when nothing may be asked.
  std::shared_ptr<Expansion> prepare(const search::ProposalRequest& request);
  // The conversation: answers, checks, format repairs. Blocks on the model.
  Answered converse(const Expansion& e);
  std::vector<search::Move> propose_in_background(const search::ProposalRequest& request);
  void serve();   // a background thread's loop
  // With bg_mu_ held: the moves finished for `key` (and their retry flag into request.retry_later),
  // *request.pending set while more is outstanding for it; one conversation of `key` finished or
  // dropped (the counts below, entries erased at zero so that they stay bounded).
  std::vector<search::Move> take_ready_locked(const Key& key, const search::ProposalRequest& request);
  void forget_locked(const Key& key);
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

  // Note [LLM requests in the background].
  mutable std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  std::deque<std::shared_ptr<Expansion>> queue_;
  std::map<Key, size_t> outstanding_;          // queued or running, per node
  std::map<SignatureId, size_t> per_search_;   // queued or running, per signature
  std::map<Key, Answered> ready_;              // finished, not yet collected
  std::map<SignatureId, uint64_t> generation_; // bumped by release(): later answers are stale
  size_t running_ = 0;
  std::vector<std::shared_ptr<Expansion>> running_list_;   // the running_ conversations
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kforge::llm

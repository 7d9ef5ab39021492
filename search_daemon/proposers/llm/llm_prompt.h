// The prompts LlmProposer sends: the chat request for expanding one node of a search tree, with
// what the operator computes (the catalog's schema and semantics text, runtime/op_catalog.h:
// outputs and their layouts exactly as PyTorch returns them). Pure functions of their inputs, so
// the tests (and a GUI showing "what the model was asked") see exactly what goes on the wire.
// Torch-free.
//
//   Prompt p = build_prompt(request);                       // request.tree and .signature set
//   client.complete(p.chat);
//
// A prompt has two parts. The system message: the rules every candidate must meet (the worker's
// checks), the backend (CUDA: NVRTC, extern "C" __global__ device code only, no headers; CPU: the C
// ABI of runtime/cpu_kernel_abi.h, quoted from the header itself), the launch-plan language and the
// answer format of kernel_answer.h. The user message: the operator's semantics, the signature with
// its arguments and named sizes, the roofline, and the task, one of
//   kFirst   expanding the root (PyTorch's kernel): write a first candidate;
//   kImprove the parent was measured (or verified): its source, plan and results, make it faster;
//   kRepair  the parent failed (compile error, rejection, failed check, fault, timeout): its source,
//            plan and what went wrong (compile log, failed check and detail), fix it.
// Both improve and repair list the candidates already tried from that parent, so a second
// expansion of one node asks for something else.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/op_signature.h"
#include "search_daemon/proposers/llm/llm_client.h"
#include "search_daemon/proposers/proposer.h"

namespace kforge::llm {

enum class PromptKind : uint8_t { kFirst = 0, kImprove = 1, kRepair = 2 };
std::string_view prompt_kind_name(PromptKind k) noexcept;   // "first", "improve", "repair"

struct PromptLimits {
  size_t max_source_bytes = 64u << 10;   // a longer parent source is cut (and the prompt says so)
  size_t max_log_bytes = 4096;           // of a compile log or failure detail
  size_t max_siblings = 8;               // candidates already tried from the parent, listed
};

struct Prompt {
  PromptKind kind = PromptKind::kFirst;
  ChatRequest chat;
};

// The request to expand request.parent. Preconditions: request.signature and request.tree are set
// and request.parent is a node of the tree (LlmProposer checks them).
Prompt build_prompt(const search::ProposalRequest& request, const PromptLimits& limits = {});

// The user turn that sends a rejected answer back (Note [Format repairs] in llm_proposer.cc): why
// it could not be used, and the answer format again.
std::string format_repair_message(std::string_view why, Backend backend);

}  // namespace kforge::llm

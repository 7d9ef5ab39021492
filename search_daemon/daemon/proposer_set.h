// ProposerSet: the proposers kforged's configuration asks for ([proposers] templates, [llm]),
// built once at start-up and shared by every search (proposers are thread-safe).
//
//   StatusOr<ProposerSet> p = make_proposers(config, log);
//   Daemon d(config, p->pointers());
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "search_daemon/daemon/daemon_config.h"
#include "search_daemon/proposers/proposer.h"

namespace kforge::daemon {

struct ProposerSet {
  std::vector<std::unique_ptr<search::Proposer>> owned;
  std::vector<search::Proposer*> pointers() const {
    std::vector<search::Proposer*> p;
    for (const auto& o : owned) p.push_back(o.get());
    return p;
  }
};

// Errors name the setting that cannot be honoured (an LLM API key variable that is unset, ...).
StatusOr<ProposerSet> make_proposers(const DaemonConfig& config, std::function<void(const std::string&)> log);

}  // namespace kforge::daemon

#include "search_daemon/daemon/proposer_set.h"

#include "search_daemon/proposers/llm/llm_client.h"
#include "search_daemon/proposers/llm/llm_proposer.h"
#include "search_daemon/proposers/templates/template_proposer.h"

namespace kforge::daemon {

StatusOr<ProposerSet> make_proposers(const DaemonConfig& config, std::function<void(const std::string&)> log) {
  ProposerSet set;
  if (config.templates) set.owned.push_back(std::make_unique<search::TemplateProposer>());
  if (config.llm.enabled) {
    llm::LlmClientConfig c;
    KFORGE_ASSIGN_OR_RETURN(c.api, llm::chat_api_from_name(config.llm.api));
    c.base_url = config.llm.base_url;
    c.model = config.llm.model;
    c.api_key_env = config.llm.api_key_env;
    c.max_tokens = config.llm.max_tokens;
    c.temperature = config.llm.temperature;
    c.request_timeout_ms = config.llm.timeout_ms;
    c.stream = config.llm.stream;
    c.stream_idle_timeout_ms = config.llm.stream_idle_timeout_ms;
    c.max_retries = config.llm.max_retries;
    c.max_total_tokens = config.llm.max_total_tokens;
    c.max_cost_usd = config.llm.max_cost_usd;
    c.input_usd_per_million = config.llm.price_input_per_mtok;
    c.output_usd_per_million = config.llm.price_output_per_mtok;
    auto sink = [log](std::string_view line) {   // the client's and proposer's lines begin "llm: "
      if (log) log(std::string(line));
    };
    StatusOr<std::unique_ptr<llm::LlmClient>> client = llm::LlmClient::create(c, sink);
    if (!client.ok()) return invalid_argument("[llm]: " + client.status().message());
    llm::LlmProposerOptions options;
    options.concurrent_requests = config.llm.concurrent_requests;
    options.requests_per_search = config.llm.requests_per_search;
    set.owned.push_back(
        std::make_unique<llm::LlmProposer>(std::shared_ptr<llm::LlmClient>(std::move(*client)), sink, options));
  }
  return set;
}

}  // namespace kforge::daemon

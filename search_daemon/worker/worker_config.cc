#include "search_daemon/worker/worker_config.h"

#include <charconv>

namespace kforge::eval {

StatusOr<WorkerConfig> WorkerConfig::from_env(const Lookup& env) {
  WorkerConfig c;
  if (std::optional<std::string> t = env("KFORGE_WORKER_CPU_THREADS"); t && !t->empty()) {
    uint32_t n = 0;
    auto [end, ec] = std::from_chars(t->data(), t->data() + t->size(), n);
    if (ec != std::errc() || end != t->data() + t->size() || n < 1 || n > 4096) {
      return invalid_argument("KFORGE_WORKER_CPU_THREADS=" + *t + ": expected 1..4096");
    }
    c.cpu_threads = n;
  }
  if (std::optional<std::string> cpus = env("KFORGE_WORKER_CPUS")) {
    if (!cpus->empty() && cpus->find_first_not_of("0123456789,") != std::string::npos) {
      return invalid_argument("KFORGE_WORKER_CPUS=" + *cpus + ": expected a list of core numbers (\"0,1\")");
    }
    c.cpus = *cpus;
  }
  if (std::optional<std::string> off = env("KFORGE_WORKER_NO_CUPTI"); off && !off->empty() && *off != "0") c.cupti = false;
  if (std::optional<std::string> cxx = env("KFORGE_CXX"); cxx && !cxx->empty()) c.cxx = *cxx;
  if (std::optional<std::string> p = env("KFORGE_WORKER_PROFILE"); p && !p->empty() && *p != "0") c.profile = true;
  return c;
}

std::string WorkerConfig::to_string() const {
  return "cpu_threads=" + (cpu_threads > 0 ? std::to_string(cpu_threads) : std::string("default")) +
         " cpus=" + (cpus.empty() ? std::string("(not pinned)") : cpus) + " cupti=" + (cupti ? "on" : "off") +
         " cxx=" + cxx + (profile ? " profile=on" : "");
}

}  // namespace kforge::eval

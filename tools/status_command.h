// `kforge status`: what the running kforged is doing: attached processes, each signature with its
// search state, budgets spent, best speedups so far. Asks the daemon over its ROUTER socket (one
// JSON request, one JSON reply; Note [Daemon messages] in search_daemon/daemon/daemon.h).
//
//   kforge status [--json] [--endpoint E] [--timeout-ms N]
//
// Exit codes: 0 answered, 2 usage error, 3 no daemon answered within the timeout (the message says
// which endpoint was tried and how to start one).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_status_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kforge

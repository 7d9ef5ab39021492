// `kforge status`: what the running kforged is doing: attached processes, each signature with its
// search state, budgets spent, best speedups so far. Asks the daemon over its ROUTER socket (one
// JSON request, one JSON reply: runtime/control_message.h).
//
//   kforge status [--json] [--limit N] [--endpoint E] [--server-key K] [--timeout-ms N]
//
// The table shows the 50 signatures with the largest time shares (--limit N for another number),
// --json every signature unless --limit is given; both say how many there are in all.
// Exit codes: 0 answered, 1 the daemon refused the request, 2 usage error, 3 no daemon answered
// within the timeout (the message says which endpoint was tried and how to start one), 4 a daemon
// runs at that ipc:// endpoint (it holds the endpoint's lock) but did not answer in time: busy.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_status_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kforge

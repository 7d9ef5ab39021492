// The `kforge` command line, as a library function so tests run exactly what ships.
//
//   std::ostringstream out, err;
//   int rc = kforge::run_cli({"kforge", "--version"}, out, err);   // rc 0, out "kforge 0.1.0 ..."
//
// Exit codes: 0 success, 1 the command ran and found a failure (a self-test failed), 2 usage
// error (unknown command or flag; the message names it), 3 the needed resource is unavailable
// here (no GPU for `selftest cuda`).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_cli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

}  // namespace kforge

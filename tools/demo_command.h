// `kforge demo`: a small model built in code, run under kforge end to end (see kDemoUsage in
// demo_command.cc and share/kforge/demo.py).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_demo_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kforge

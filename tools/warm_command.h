// `kforge warm [options] -- CMD ARGS...`: fills the kernel cache in staging (see kWarmUsage in
// warm_command.cc and docs/REFERENCE.md "kforge warm").
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_warm_command(const std::vector<std::string>& args, const std::string& cache_dir, std::ostream& out,
                     std::ostream& err);

}  // namespace kforge

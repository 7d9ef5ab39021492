// `kforge cache ...`: inspect and manage the kernel cache (list, show, verify, remove, gc,
// export/import bundles, keygen, disable/enable, pin/unpin). Keys may be abbreviated to a unique
// prefix of at least 4 hex digits, like git. Exit codes as in cli.h; `verify` exits 1 when it
// finds a bad file, naming each.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

// argv[0] is "cache"'s first argument (the subcommand). `cache_dir` overrides the location rules
// when non-empty (from --cache-dir).
int run_cache_command(const std::vector<std::string>& args, const std::string& cache_dir, std::ostream& out,
                      std::ostream& err);

}  // namespace kforge

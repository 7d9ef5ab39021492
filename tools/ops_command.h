// `kforge ops`: what the operator catalog (runtime/op_catalog.h) covers, per operator: its schema,
// the backends kernels are searched on (its template families'), how the hook intercepts it (a
// typed interceptor from the catalog's list), its template families, whether the LLM proposer has
// its semantics, its in-place and out= variants, the cost model and each argument's role and range.
//
//   kforge ops [--json]
//
// Exit codes: 0, or 2 for a usage error.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

int run_ops_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kforge

// libFuzzer target for the launch expression language (runtime/launch_expr.h).
//
// Checks, for arbitrary text: LaunchExpr::parse() returns (never throws, crashes, recurses
// without bound or trips a sanitizer) with a reason on failure; a parsed expression keeps its
// text, parses again to the same names, and evaluates to exactly the same value, or fails with
// exactly the same message, by name (a size map) and by slot position (bind() + BoundExpr).
//
//   fuzz_launch_expr -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/launch_expr
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/launch_expr.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view text, const std::string& detail) {
  std::fprintf(stderr, "fuzz_launch_expr: %s\n  text: %.*s\n  %s\n", what, static_cast<int>(text.size()),
               text.data(), detail.c_str());
  std::abort();
}

// The names of a 2-d tensor argument and two scalars (as OpSignature::named_sizes() gives them),
// plus the int64 extremes and zero so that overflow and division paths are reachable.
const kforge::SizeMap& sizes() {
  static const kforge::SizeMap m{
      {"ndim0", 2},      {"numel0", 205852672}, {"size0_0", 4096},    {"size0_1", 50257},
      {"stride0_0", 50257}, {"stride0_1", 1},   {"arg1", -1},         {"arg2", 0},
      {"len3", 3},       {"arg3_0", 7},         {"arg3_1", -7},       {"arg3_2", 3037000500},
      {"big", std::numeric_limits<int64_t>::max()}, {"small", std::numeric_limits<int64_t>::min()}};
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kforge::LaunchExpr;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kforge::StatusOr<LaunchExpr> e = LaunchExpr::parse(text);
  if (!e.ok()) {
    if (e.status().message().empty()) fail("rejected without a reason", text, "");
    return 0;
  }
  if (e->text() != text) fail("text() differs from the input", text, e->text());
  kforge::StatusOr<LaunchExpr> again = LaunchExpr::parse(e->text());
  if (!again.ok() || again->names() != e->names()) fail("parsing is not deterministic", text, "");

  // The map's names in its order, so an unknown-name error lists the same names both ways.
  static const std::vector<std::string> slot_names = [] {
    std::vector<std::string> v;
    for (const auto& [k, val] : sizes()) v.push_back(k);
    return v;
  }();
  static const std::vector<int64_t> slots = [] {
    std::vector<int64_t> v;
    for (const auto& [k, val] : sizes()) v.push_back(val);
    return v;
  }();

  kforge::StatusOr<int64_t> by_name = e->evaluate(sizes());
  kforge::StatusOr<kforge::BoundExpr> bound = e->bind(slot_names);
  if (!bound.ok()) {
    if (by_name.ok()) fail("bind failed but named evaluation succeeded", text, bound.status().message());
    if (bound.status().message() != by_name.status().message()) {
      fail("bind and named evaluation fail differently", text,
           bound.status().message() + "\n  vs\n  " + by_name.status().message());
    }
    return 0;
  }
  kforge::StatusOr<int64_t> by_slot = bound->evaluate(slots);
  if (by_name.ok() != by_slot.ok()) {
    fail("named and bound evaluation disagree on success", text,
         by_name.ok() ? by_slot.status().message() : by_name.status().message());
  }
  if (by_name.ok()) {
    if (*by_name != *by_slot) {
      fail("named and bound evaluation disagree", text,
           std::to_string(*by_name) + " != " + std::to_string(*by_slot));
    }
  } else {
    if (by_name.status().message() != by_slot.status().message()) {
      fail("named and bound evaluation fail differently", text,
           by_name.status().message() + "\n  vs\n  " + by_slot.status().message());
    }
    if (by_name.status().code() != by_slot.status().code()) fail("error codes differ", text, "");
  }
  return 0;
}

// The compile-option allow-lists (compile_options.h).
#include "search_daemon/worker/compile_options.h"

#include <algorithm>
#include <initializer_list>

namespace kforge {

namespace {

bool all_of_chars(std::string_view s, std::string_view allowed_extra) {
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           allowed_extra.find(c) != std::string_view::npos;
  });
}

bool is_identifier(std::string_view s) {
  return !s.empty() && !(s[0] >= '0' && s[0] <= '9') && all_of_chars(s, "_");
}

bool starts_with_any(std::string_view s, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return s.substr(0, p.size()) == p; });
}

}  // namespace

std::optional<std::string> refuse_cpu_option(std::string_view o) {
  if (o == "-O0" || o == "-O1" || o == "-O2" || o == "-O3" || o == "-Os") return std::nullopt;
  if (o.substr(0, 7) == "-march=" || o.substr(0, 7) == "-mtune=") {
    std::string_view v = o.substr(7);
    if (v == "native") {
      return "the object would depend on the build host's CPU, which the cache key does not cover; name the "
             "architecture instead";
    }
    if (!v.empty() && all_of_chars(v, "-_.+")) return std::nullopt;
    return "not a CPU name";
  }
  if (o.substr(0, 5) == "-std=") {
    std::string_view v = o.substr(5);
    std::string_view lang = v.substr(0, v.substr(0, 3) == "gnu" ? 5 : 3);
    std::string_view year = v.substr(lang.size());
    if ((lang == "c++" || lang == "gnu++") &&
        (year == "11" || year == "14" || year == "17" || year == "20" || year == "23" || year == "26" ||
         year == "1z" || year == "2a" || year == "2b" || year == "2c")) {
      return std::nullopt;
    }
    return "not a C++ standard (c++XX or gnu++XX)";
  }
  if (o.substr(0, 2) == "-D" || o.substr(0, 2) == "-U") {
    std::string_view rest = o.substr(2);
    std::string_view name = o[1] == 'D' ? rest.substr(0, rest.find('=')) : rest;
    if (!is_identifier(name)) return "not a macro name";
    // The value travels as one argv element (no shell), so only control characters are a concern.
    if (std::any_of(rest.begin(), rest.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      return "control characters in the macro";
    }
    return std::nullopt;
  }
  if (o.substr(0, 2) == "-f") {
    const std::string_view body = o.substr(2);
    const bool negative = body.substr(0, 3) == "no-";
    const std::string_view feature = negative ? body.substr(3) : body;
    const std::string_view name = feature.substr(0, feature.find('='));
    const std::string_view value = feature.size() > name.size() ? feature.substr(name.size() + 1) : std::string_view();
    if (name.empty() || !all_of_chars(name, "-+") || !all_of_chars(value, "-_.,+:")) {
      // No '/' in a value: a -f option cannot name a path outside the build directory.
      return "not a -f<feature>[=value] switch";
    }
    if (starts_with_any(name, {"plugin", "dump", "profile", "auto-profile", "use-ld", "ld-path"})) {
      return "loads or writes files outside the compile";
    }
    // Note [Idle workers] in evaluator/worker_process.h: one compile is one job. GCC runs LTO's
    // back end as parallel jobs (-flto=auto, =N, =jobserver, and plain -flto since GCC 11 picks
    // a count itself); a kernel is one source file, so LTO brings it nothing anyway.
    if (!negative && name == "lto" && value != "1") {
      return "runs link-time optimization as parallel jobs on the serving host's cores, and a kernel is one "
             "file (LTO gains nothing); -flto=1 if it must";
    }
    if (!negative && starts_with_any(name, {"fast-math", "unsafe-math-optimizations", "finite-math-only",
                                            "associative-math", "reciprocal-math", "cx-limited-range",
                                            "cx-fortran-rules"})) {
      return "changes floating-point results, and kforge does not trade accuracy for speed";
    }
    if (negative && starts_with_any(name, {"signed-zeros", "honor-nans", "honor-infinities"})) {
      return "changes floating-point results, and kforge does not trade accuracy for speed";
    }
    return std::nullopt;
  }
  return "not on the allow-list (-O0..-O3, -Os, -march=, -mtune=, -f<feature>, -fno-<feature>, -D<name>[=value], "
         "-U<name>, -std=c++XX)";
}

std::optional<std::string> refuse_cuda_option(std::string_view o) {
  std::string_view bare = o.substr(0, 2) == "--" ? o.substr(2) : o.substr(0, 1) == "-" ? o.substr(1) : o;
  if (bare == "use_fast_math" || bare == "ftz=true" || bare == "prec-div=false" || bare == "prec-sqrt=false") {
    return "changes floating-point results, and kforge does not trade accuracy for speed";
  }
  return std::nullopt;
}

}  // namespace kforge

#include "tools/hook_summary.h"

#include <algorithm>
#include <cstdio>

#include "runtime/file_io.h"

namespace kforge {

using namespace file_io;   // NOLINT: read_file, list_names, ensure_dir, io_error

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxSummaryBytes = 64u << 20;
constexpr double kMinSamples = 4;

double num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string str(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

uint32_t RunSummary::active() const {
  uint32_t n = 0;
  for (const Kernel& k : kernels) n += k.states.count("active") != 0 ? 1 : 0;
  return n;
}

RunSummary read_run_summary(const std::string& dir) {
  RunSummary s;
  StatusOr<std::vector<std::string>> names = list_names(dir);
  if (!names.ok()) {
    s.problems.push_back(names.status().message());
    return s;
  }
  std::map<std::string, size_t> kernel_index;   // signature + entry -> kernels[i]
  std::map<std::string, bool> seen_signature;
  for (const std::string& name : *names) {
    if (name.rfind("kforge-summary-", 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".json") continue;
    const std::string path = dir + "/" + name;
    StatusOr<std::string> text = read_file(path, kMaxSummaryBytes);
    if (!text.ok()) {
      s.problems.push_back(text.status().message());
      continue;
    }
    const json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("signatures") || !j["signatures"].is_array()) {
      s.problems.push_back(path + ": not a kforge summary");
      continue;
    }
    ++s.processes;
    if (j.contains("ab") && j["ab"].is_object()) s.ab.push_back(j["ab"]);
    s.wall_s = std::max(s.wall_s, num(j, "wall_s"));
    if (s.mode.empty()) s.mode = str(j, "mode");
    if (j.contains("swap") && j["swap"].is_object() && s.cache_dir.empty()) s.cache_dir = str(j["swap"], "cache_dir");
    for (const json& sig : j["signatures"]) {
      if (!sig.is_object()) continue;
      const std::string op = str(sig, "op");
      const std::string text_sig = str(sig, "signature");
      const double calls = num(sig, "calls");
      const double sampled = num(sig, "sampled_calls");
      // One sample is usually the signature's first call (allocation, warm-up): no estimate.
      const double mean = sampled >= kMinSamples ? num(sig, "sampled_ns") / sampled : 0;
      RunSummary::Op& o = s.ops[op];
      o.calls += static_cast<uint64_t>(calls);
      o.time_ns += calls * mean;
      s.op_time_ns += calls * mean;
      if (!seen_signature[text_sig]) {
        seen_signature[text_sig] = true;
        ++o.signatures;
        ++s.signatures;
      }
      const std::string entry = str(sig, "entry");
      if (entry.empty()) continue;
      const std::string key = text_sig + "\n" + entry;
      auto [it, fresh] = kernel_index.emplace(key, s.kernels.size());
      if (fresh) {
        s.kernels.push_back({});
        s.kernels.back().op = op;
        s.kernels.back().signature = text_sig;
        s.kernels.back().entry = entry;
        s.kernels.back().backend = str(sig, "backend");
      }
      RunSummary::Kernel& k = s.kernels[it->second];
      ++k.states[str(sig, "state")];
      if (const std::string r = str(sig, "reason"); !r.empty()) k.reason = r;
      const auto active_calls = static_cast<uint64_t>(num(sig, "active_calls"));
      const double pt = num(sig, "pytorch_median_ns"), en = num(sig, "entry_median_ns");
      if (pt > 0 && en > 0 && (k.pytorch_median_ns == 0 || active_calls >= k.active_calls)) {
        k.pytorch_median_ns = pt;
        k.entry_median_ns = en;
      }
      k.active_calls += active_calls;
      if (pt > 0 && en > 0) k.saved_ns += static_cast<double>(active_calls) * (pt - en);
    }
  }
  for (const RunSummary::Kernel& k : s.kernels) s.saved_ns += k.saved_ns;
  std::sort(s.kernels.begin(), s.kernels.end(),
            [](const RunSummary::Kernel& a, const RunSummary::Kernel& b) { return a.saved_ns > b.saved_ns; });
  return s;
}

void print_run_summary(const RunSummary& s, std::ostream& out) {
  if (s.processes == 0) {
    out << "  no hooked process left a summary (did the program use torch? `KFORGE_LOG=1` shows what the hook does)\n";
    for (const std::string& p : s.problems) out << "  " << p << "\n";
    return;
  }
  uint64_t calls = 0;
  for (const auto& [name, o] : s.ops) calls += o.calls;
  out << "  operators seen: " << s.ops.size() << " (" << s.signatures << " signatures, " << calls << " calls";
  if (s.op_time_ns > 0) out << ", about " << human_duration_ns(s.op_time_ns) << " in their kernels";
  out << ")";
  if (s.processes > 1) out << " in " << s.processes << " processes";
  out << "\n";
  std::vector<std::pair<std::string, RunSummary::Op>> ops(s.ops.begin(), s.ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.time_ns > b.second.time_ns; });
  char line[512];
  for (size_t i = 0; i < ops.size() && i < 8; ++i) {
    std::snprintf(line, sizeof line, "    %-28s %10llu calls %12s\n", ops[i].first.c_str(),
                  static_cast<unsigned long long>(ops[i].second.calls),
                  ops[i].second.time_ns > 0 ? human_duration_ns(ops[i].second.time_ns).c_str() : "-");
    out << line;
  }
  if (ops.size() > 8) out << "    ... and " << ops.size() - 8 << " more\n";
  std::map<std::string, uint32_t> by_state;
  for (const RunSummary::Kernel& k : s.kernels) {
    for (const auto& [state, n] : k.states) by_state[state] += n > 0 ? 1 : 0;
  }
  out << "  kernels from the cache: " << s.kernels.size();
  if (!s.kernels.empty()) {
    out << " (";
    bool first = true;
    for (const auto& [state, n] : by_state) {
      out << (first ? "" : ", ") << n << " " << (state == "no_win" ? "no win in this process" : state);
      first = false;
    }
    out << ")";
  }
  out << "\n";
  for (size_t i = 0; i < s.kernels.size() && i < 10; ++i) {
    const RunSummary::Kernel& k = s.kernels[i];
    std::string states;
    for (const auto& [state, n] : k.states) states += (states.empty() ? "" : "/") + state;
    std::string speed = "-";
    if (k.pytorch_median_ns > 0 && k.entry_median_ns > 0) {
      char b[64];
      std::snprintf(b, sizeof b, "%.2fx", k.pytorch_median_ns / k.entry_median_ns);
      speed = b;
    }
    std::snprintf(line, sizeof line, "    %-8s %7s  saved %10s  %s  %s\n", states.c_str(), speed.c_str(),
                  k.saved_ns > 0 ? human_duration_ns(k.saved_ns).c_str() : "-", k.entry.substr(0, 12).c_str(),
                  k.signature.c_str());
    out << line;
    if (!k.reason.empty()) out << "             " << k.reason << "\n";
  }
  if (s.kernels.size() > 10) out << "    ... and " << s.kernels.size() - 10 << " more\n";
  out << "  estimated kernel time saved: " << (s.saved_ns > 0 ? human_duration_ns(s.saved_ns) : std::string("none"));
  if (s.saved_ns > 0 && s.wall_s > 0) {
    std::snprintf(line, sizeof line,
                  " in a %.1f s run (the same calls with PyTorch's kernels would have taken this much longer; "
                  "an estimate from in-process timings)",
                  s.wall_s);
    out << line;
  }
  out << "\n";
  for (const std::string& p : s.problems) out << "  (" << p << ")\n";
}

nlohmann::json run_summary_json(const RunSummary& s) {
  json ops = json::object();
  for (const auto& [name, o] : s.ops) ops[name] = {{"calls", o.calls}, {"time_ns", o.time_ns}, {"signatures", o.signatures}};
  json kernels = json::array();
  for (const RunSummary::Kernel& k : s.kernels) {
    kernels.push_back({{"op", k.op}, {"signature", k.signature}, {"entry", k.entry}, {"backend", k.backend},
                       {"states", k.states}, {"reason", k.reason}, {"active_calls", k.active_calls},
                       {"pytorch_median_ns", k.pytorch_median_ns}, {"entry_median_ns", k.entry_median_ns},
                       {"saved_ns", k.saved_ns}});
  }
  return {{"processes", s.processes}, {"wall_s", s.wall_s}, {"mode", s.mode}, {"cache_dir", s.cache_dir},
          {"signatures", s.signatures}, {"op_time_ns", s.op_time_ns}, {"saved_ns", s.saved_ns},
          {"operators", ops}, {"kernels", kernels}, {"problems", s.problems}};
}

}  // namespace kforge

#include "tools/cache_commands.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "cache/bundle.h"
#include "cache/cache_dir.h"
#include "cache/entry_json.h"
#include "cache/store.h"
#include "runtime/human_units.h"

namespace kforge {

namespace {

using json = nlohmann::ordered_json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr std::string_view kCacheUsage =
    "usage: kforge [--cache-dir DIR] cache <subcommand> [options]\n"
    "\n"
    "  ls [--json]                          every entry: key, operator, shapes, target, state, speedup\n"
    "  show KEY [--json] [--llm]            signature, environment, source, launch plan, verification,\n"
    "                                       timings, provenance, state; a kernel a model wrote: the\n"
    "                                       model, tokens and cost (--llm: the whole conversation)\n"
    "  verify [--json]                      check every file; exit 1 and name each bad one\n"
    "  rm KEY...                            remove entries\n"
    "  gc --max-size SIZE                   remove least recently used unpinned entries down to SIZE\n"
    "                                       (bytes, or with K/M/G suffix), then unreferenced files\n"
    "  export FILE [KEY...] [--sign SECRET] write entries (all if no KEY) to a bundle, optionally signed\n"
    "  import FILE [--trusted-key PUBLIC] [--require-signature]\n"
    "                                       import a bundle; with a trusted key it must be signed by it\n"
    "  keygen SECRET PUBLIC                 make an Ed25519 key pair for signing bundles\n"
    "  disable KEY [--reason TEXT]          stop using an entry\n"
    "  enable KEY                           use an entry again (also after quarantine)\n"
    "  pin KEY / unpin KEY                  keep an entry through gc, or not\n"
    "\n"
    "KEY is an entry key or a unique prefix of it (at least 4 hex digits).\n";

int usage(std::ostream& err, const std::string& what) {
  err << "kforge cache: " << what << "\n\n" << kCacheUsage;
  return kExitUsage;
}

int fail(std::ostream& err, const Status& s) {
  err << "kforge cache: " << s.message() << "\n";
  return kExitFailed;
}

// Splits argv into positional arguments and --flags (with values where the flag takes one).
struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;   // "--json" -> ""
};

bool parse(const std::vector<std::string>& args, size_t first, const std::vector<std::string>& with_value,
           const std::vector<std::string>& without_value, Parsed* p, std::string* error) {
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      p->positional.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (std::find(with_value.begin(), with_value.end(), name) != with_value.end()) {
      if (!inline_value) {
        if (i + 1 >= args.size()) {
          *error = "option " + name + " needs a value";
          return false;
        }
        value = args[++i];
      }
      p->options[name] = value;
    } else if (std::find(without_value.begin(), without_value.end(), name) != without_value.end() && !inline_value) {
      p->options[name] = "";
    } else {
      *error = "unknown option '" + a + "' for 'cache " + args[0] + "'";
      return false;
    }
  }
  return true;
}

StatusOr<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return invalid_argument("empty size");
  size_t pos = 0;
  uint64_t value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    uint64_t digit = static_cast<uint64_t>(text[pos] - '0');
    if (__builtin_mul_overflow(value, 10u, &value) || __builtin_add_overflow(value, digit, &value)) {
      return out_of_range("size '" + text + "' is too large");
    }
    ++pos;
  }
  if (pos == 0) return invalid_argument("size '" + text + "' does not start with a number");
  std::string suffix = text.substr(pos);
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "KiB" || suffix == "k") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB") mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB") mult = 1ull << 40;
  else return invalid_argument("size '" + text + "' has an unknown unit '" + suffix + "' (use K, M, G or T)");
  uint64_t bytes;
  if (__builtin_mul_overflow(value, mult, &bytes)) return out_of_range("size '" + text + "' is too large");
  return bytes;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lluB", static_cast<unsigned long long>(b));
  else if (b < (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(b) / 1024);
  else if (b < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(b) / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1fG", static_cast<double>(b) / (1 << 30));
  return buf;
}

std::string format_time(int64_t unix_ms) {
  if (unix_ms <= 0) return "never";
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

std::string format_speedup(const Timings& t) {
  if (t.candidate_ns <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", t.speedup());
  return buf;
}

StatusOr<Store> open_store(const std::string& cache_dir) {
  std::string path = cache_dir;
  if (path.empty()) {
    KFORGE_ASSIGN_OR_RETURN(CacheDir::Resolved r, CacheDir::resolve_path(process_env()));
    if (!r.warning.empty()) std::fprintf(stderr, "kforge: %s\n", r.warning.c_str());
    path = r.path;
  }
  KFORGE_ASSIGN_OR_RETURN(CacheDir dir, CacheDir::open(path));
  return Store::open(dir.path());
}

int cmd_ls(Store& store, const Parsed& p, std::ostream& out, std::ostream& err) {
  if (!p.positional.empty()) return usage(err, "'cache ls' takes no arguments");
  auto keys = store.list();
  if (!keys.ok()) return fail(err, keys.status());
  std::vector<StoredEntry> entries;
  std::vector<std::pair<std::string, std::string>> bad;
  for (const EntryKey& k : *keys) {
    auto e = store.load(k);
    if (e.ok()) entries.push_back(std::move(*e));
    else bad.emplace_back(k.hex(), e.status().message());
  }
  std::sort(entries.begin(), entries.end(), [](const StoredEntry& a, const StoredEntry& b) {
    return a.signature.op != b.signature.op ? a.signature.op < b.signature.op : a.key < b.key;
  });
  if (p.options.count("--json")) {
    json list = json::array();
    for (const StoredEntry& e : entries) {
      list.push_back(entry_summary_json(e));
      list.back()["no_win"] = no_wins_json(no_wins(store, e.key));
    }
    json unreadable = json::array();
    for (const auto& [k, why] : bad) unreadable.push_back(json{{"key", k}, {"error", why}});
    out << json{{"cache_dir", store.root()}, {"entries", list}, {"unreadable", unreadable}}.dump(2) << "\n";
    return bad.empty() ? kExitOk : kExitFailed;
  }
  if (entries.empty() && bad.empty()) {
    out << "cache " << store.root() << " is empty\n";
    return kExitOk;
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-12s  %-11s  %-8s  %-3s  %7s  %-20s  %s\n", "KEY", "TARGET", "STATE", "PIN",
                "SPEEDUP", "LAST USE", "SIGNATURE");
  out << line;
  for (const StoredEntry& e : entries) {
    std::string target = std::string(backend_name(e.environment.backend)) + ":" + e.environment.arch;
    std::snprintf(line, sizeof line, "%-12s  %-11s  %-8s  %-3s  %7s  %-20s  ", e.key.hex().substr(0, 12).c_str(),
                  target.c_str(), std::string(entry_state_name(e.status.state)).c_str(), e.status.pinned ? "yes" : "",
                  format_speedup(e.timings).c_str(), format_time(e.status.last_use_unix_ms).c_str());
    out << line << e.signature.to_string() << "\n";
    for (const Store::NoWinRecord& r : no_wins(store, e.key)) out << "              " << describe_no_win(r) << "\n";
  }
  out << entries.size() << " entries in " << store.root() << "\n";
  for (const auto& [k, why] : bad) err << "kforge cache: unreadable entry " << k << ": " << why << "\n";
  return bad.empty() ? kExitOk : kExitFailed;
}

std::string describe_binding(const ArgBinding& b) {
  switch (b.kind) {
    case ArgBinding::Kind::kInput: return "input " + std::to_string(b.index);
    case ArgBinding::Kind::kOutput: return "output " + std::to_string(b.index);
    case ArgBinding::Kind::kScratch: return "scratch " + std::to_string(b.index);
    case ArgBinding::Kind::kSize: return std::string(value_type_name(b.type)) + " " + b.expr;
    case ArgBinding::Kind::kScalar:
      return std::string(value_type_name(b.type)) + " scalar arg " + std::to_string(b.index);
    case ArgBinding::Kind::kTensorValue:
      return std::string(value_type_name(b.type)) + " value of tensor arg " + std::to_string(b.index);
  }
  return "?";
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

void print_plan(const KernelSpec& spec, std::ostream& out) {
  for (size_t i = 0; i < spec.plan.scratch.size(); ++i) {
    out << "  scratch " << i << " " << spec.plan.scratch[i].name << ": " << spec.plan.scratch[i].bytes << " bytes\n";
  }
  for (size_t i = 0; i < spec.plan.outputs.size(); ++i) {
    const OutputSpec& o = spec.plan.outputs[i];
    out << "  output " << i << ": ";
    if (o.layout == OutputSpec::Layout::kInPlace) {
      out << "input " << o.input << ", written in place";
    } else if (o.layout == OutputSpec::Layout::kLikeInput) {
      out << "empty_like(input " << o.input << ")";
      if (o.dtype) out << " as " << dtype_name(*o.dtype);
    } else {
      out << (o.dtype ? std::string(dtype_name(*o.dtype)) : std::string("?")) << " sizes [" << join(o.sizes, ", ")
          << "] strides [" << join(o.strides, ", ") << "]";
    }
    out << "\n";
  }
  for (size_t i = 0; i < spec.plan.launches.size(); ++i) {
    const Launch& l = spec.plan.launches[i];
    out << "  launch " << i << ": " << l.entry << " grid (" << l.grid[0] << ", " << l.grid[1] << ", " << l.grid[2]
        << ") block (" << l.block[0] << ", " << l.block[1] << ", " << l.block[2] << ") shared " << l.shared_mem_bytes
        << "\n";
    std::vector<std::string> args;
    for (const ArgBinding& b : l.args) args.push_back(describe_binding(b));
    out << "    args: " << join(args, "; ") << "\n";
  }
}

// Note [LLM provenance] (llm_proposer.cc): the entry's conversation blob, parsed; null when it has
// none, an error when it cannot be read or parsed.
StatusOr<json> llm_provenance(const Store& store, const StoredEntry& s) {
  for (const BlobRef& b : s.blobs) {
    if (b.name != kLlmProvenanceBlob) continue;
    KFORGE_ASSIGN_OR_RETURN(std::string bytes, store.read_blob(b));
    json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return invalid_argument("blob " + std::string(kLlmProvenanceBlob) + " of entry " + s.key.hex() + " is not a JSON object");
    }
    return j;
  }
  return json(nullptr);
}

std::string llm_summary(const json& j) {
  const json& t = j.value("answer_tokens", json::object());
  const json& sp = j.value("signature_spend", json::object());
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s (%s), %s prompt, %llu format repair(s), answer %llu input + %llu output tokens%s; the signature's "
                "search had spent %llu answers, %llu tokens, $%.4f by then",
                j.value("model", std::string("?")).c_str(), j.value("api", std::string("?")).c_str(),
                j.value("prompt_kind", std::string("?")).c_str(), j.value("format_repairs", 0ull),
                t.value("input", 0ull), t.value("output", 0ull), t.value("estimated", false) ? " (estimated)" : "",
                sp.value("answers", 0ull), sp.value("input_tokens", 0ull) + sp.value("output_tokens", 0ull),
                sp.value("cost_usd", 0.0));
  return buf;
}

int cmd_show(Store& store, const Parsed& p, std::ostream& out, std::ostream& err) {
  if (p.positional.size() != 1) return usage(err, "'cache show' needs exactly one KEY");
  auto key = store.resolve_prefix(p.positional[0]);
  if (!key.ok()) return fail(err, key.status());
  auto e = store.load(*key);
  if (!e.ok()) return fail(err, e.status());
  const StoredEntry& s = *e;
  StatusOr<json> llm = llm_provenance(store, s);
  if (!llm.ok()) return fail(err, llm.status());
  if (p.options.count("--llm")) {
    if (llm->is_null()) {
      out << "entry " << s.key.hex() << " was not written by a language model (provenance: " << s.provenance.proposer << ")\n";
      return kExitOk;
    }
    if (p.options.count("--json")) {
      out << llm->dump(2) << "\n";
      return kExitOk;
    }
    out << "llm: " << llm_summary(*llm) << "\n";
    for (const json& m : llm->value("messages", json::array())) {
      out << "\n--- " << m.value("role", std::string("?")) << " ---\n" << m.value("content", std::string());
      out << "\n";
    }
    return kExitOk;
  }
  if (p.options.count("--json")) {
    json j = entry_summary_json(s);
    j["no_win"] = no_wins_json(no_wins(store, s.key));
    j["environment"] = s.environment.to_string();
    j["source"] = s.spec.source;
    j["entry_points"] = s.spec.entry_points;
    j["compile_options"] = s.spec.compile_options;
    json blobs = json::array();
    for (const BlobRef& b : s.blobs) blobs.push_back(json{{"name", b.name}, {"sha256", b.sha256_hex}, {"size", b.size}});
    j["blobs"] = blobs;
    j["verification"] = json{{"passed", s.verification.passed},
                             {"trials", s.verification.trials},
                             {"max_abs_error", s.verification.max_abs_error},
                             {"rel_error", s.verification.rel_error},
                             {"torch_max_abs_error", s.verification.torch_max_abs_error},
                             {"torch_rel_error", s.verification.torch_rel_error},
                             {"details", s.verification.details}};
    j["timings"] = json{{"baseline_ns", s.timings.baseline_ns}, {"candidate_ns", s.timings.candidate_ns},
                        {"spread", s.timings.spread}, {"runs", s.timings.runs}};
    j["provenance"] = json{{"proposer", s.provenance.proposer}, {"search_id", s.provenance.search_id},
                           {"kforge_version", s.provenance.kforge_version},
                           {"created_unix_ms", s.provenance.created_unix_ms}, {"host", s.provenance.host}};
    if (!llm->is_null()) {   // the summary; --llm --json gives the conversation
      json summary = *llm;
      summary.erase("messages");
      j["llm"] = summary;
    }
    out << j.dump(2) << "\n";
    return kExitOk;
  }
  out << "key:          " << s.key.hex() << "\n";
  out << "signature:    " << s.signature.to_string() << "\n";
  out << "environment:  " << s.environment.to_string() << "\n";
  out << "state:        " << entry_state_name(s.status.state);
  if (!s.status.reason.empty()) out << " (" << s.status.reason << ")";
  if (s.status.pinned) out << ", pinned";
  for (const Store::NoWinRecord& r : no_wins(store, s.key)) out << "; " << describe_no_win(r);
  out << "\nlast use:     " << format_time(s.status.last_use_unix_ms) << "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.0f ns (PyTorch) -> %.0f ns, speedup %s, spread ±%.1f%%, %u runs",
                s.timings.baseline_ns, s.timings.candidate_ns, format_speedup(s.timings).c_str(),
                s.timings.spread * 100, s.timings.runs);
  out << "timings:      " << buf << "\n";
  std::snprintf(buf, sizeof buf, "%s, %u trials, max abs err %.3g (PyTorch %.3g), rel err %.3g (PyTorch %.3g)",
                s.verification.passed ? "passed" : "FAILED", s.verification.trials, s.verification.max_abs_error,
                s.verification.torch_max_abs_error, s.verification.rel_error, s.verification.torch_rel_error);
  out << "verification: " << buf << "\n";
  if (!s.verification.details.empty()) out << "              " << s.verification.details << "\n";
  out << "provenance:   " << s.provenance.proposer;
  if (!s.provenance.search_id.empty()) out << ", search " << s.provenance.search_id;
  out << ", kforge " << s.provenance.kforge_version << ", " << format_time(s.provenance.created_unix_ms);
  if (!s.provenance.host.empty()) out << " on " << s.provenance.host;
  out << "\n";
  if (!llm->is_null()) out << "llm:          " << llm_summary(*llm) << " (--llm: the conversation)\n";
  out << "kernel:       " << backend_name(s.spec.backend) << " (" << source_language_name(s.spec.language)
      << "), entry points " << join(s.spec.entry_points, ", ");
  if (!s.spec.compile_options.empty()) out << ", options " << join(s.spec.compile_options, " ");
  out << "\n";
  for (const BlobRef& b : s.blobs) {
    out << "blob:         " << b.name << " " << human_bytes(b.size) << " sha256 " << b.sha256_hex << "\n";
  }
  out << "launch plan:\n";
  print_plan(s.spec, out);
  out << "source:\n" << s.spec.source;
  if (s.spec.source.empty() || s.spec.source.back() != '\n') out << "\n";
  return kExitOk;
}

int cmd_verify(Store& store, const Parsed& p, std::ostream& out, std::ostream& err) {
  if (!p.positional.empty()) return usage(err, "'cache verify' takes no arguments");
  auto keys = store.list();
  auto problems = store.verify_all();
  if (!problems.ok()) return fail(err, problems.status());
  if (p.options.count("--json")) {
    json list = json::array();
    for (const CacheProblem& pr : *problems) {
      list.push_back(json{{"path", pr.path}, {"problem", pr.what}, {"key", pr.key ? pr.key->hex() : ""}});
    }
    out << json{{"cache_dir", store.root()}, {"entries", keys.ok() ? keys->size() : 0}, {"problems", list}}.dump(2)
        << "\n";
  } else {
    for (const CacheProblem& pr : *problems) err << "BAD " << pr.path << ": " << pr.what << "\n";
    out << (keys.ok() ? keys->size() : 0) << " entries checked in " << store.root() << ", " << problems->size()
        << " problem" << (problems->size() == 1 ? "" : "s") << "\n";
  }
  return problems->empty() ? kExitOk : kExitFailed;
}

int for_each_key(Store& store, const std::vector<std::string>& prefixes, std::ostream& err,
                 const std::function<Status(const EntryKey&)>& fn) {
  // Resolve every key first: a typo in the third key must not leave the first two changed.
  std::vector<EntryKey> keys;
  for (const std::string& prefix : prefixes) {
    auto k = store.resolve_prefix(prefix);
    if (!k.ok()) return fail(err, k.status());
    keys.push_back(*k);
  }
  for (const EntryKey& k : keys) {
    Status s = fn(k);
    if (!s.ok()) return fail(err, s);
  }
  return kExitOk;
}

}  // namespace

int run_cache_command(const std::vector<std::string>& args, const std::string& cache_dir, std::ostream& out,
                      std::ostream& err) {
  if (args.empty()) return usage(err, "no subcommand given");
  const std::string& sub = args[0];
  if (sub == "help" || sub == "--help") {
    out << kCacheUsage;
    return kExitOk;
  }
  static const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> kFlags = {
      {"ls", {{}, {"--json"}}},
      {"show", {{}, {"--json", "--llm"}}},
      {"verify", {{}, {"--json"}}},
      {"rm", {{}, {}}},
      {"gc", {{"--max-size"}, {}}},
      {"export", {{"--sign"}, {}}},
      {"import", {{"--trusted-key"}, {"--require-signature"}}},
      {"keygen", {{}, {}}},
      {"disable", {{"--reason"}, {}}},
      {"enable", {{}, {}}},
      {"pin", {{}, {}}},
      {"unpin", {{}, {}}},
  };
  auto flags = kFlags.find(sub);
  if (flags == kFlags.end()) return usage(err, "unknown subcommand '" + sub + "'");
  Parsed p;
  std::string error;
  if (!parse(args, 1, flags->second.first, flags->second.second, &p, &error)) return usage(err, error);

  if (sub == "keygen") {
    if (p.positional.size() != 2) return usage(err, "'cache keygen' needs SECRET and PUBLIC file paths");
    auto key = SigningKey::generate();
    if (!key.ok()) return fail(err, key.status());
    if (Status s = key->save(p.positional[0]); !s.ok()) return fail(err, s);
    if (Status s = key->public_key.save(p.positional[1]); !s.ok()) return fail(err, s);
    out << "wrote secret key " << p.positional[0] << " (mode 0600) and public key " << p.positional[1]
        << " (fingerprint " << key->public_key.fingerprint() << ")\n";
    return kExitOk;
  }

  auto store = open_store(cache_dir);
  if (!store.ok()) return fail(err, store.status());

  if (sub == "ls") return cmd_ls(*store, p, out, err);
  if (sub == "show") return cmd_show(*store, p, out, err);
  if (sub == "verify") return cmd_verify(*store, p, out, err);
  if (sub == "rm") {
    if (p.positional.empty()) return usage(err, "'cache rm' needs at least one KEY");
    int rc = for_each_key(*store, p.positional, err, [&](const EntryKey& k) {
      KFORGE_RETURN_IF_ERROR(store->remove(k));
      out << "removed " << k.hex() << "\n";
      return Status();
    });
    return rc;
  }
  if (sub == "disable" || sub == "enable" || sub == "pin" || sub == "unpin") {
    if (p.positional.empty()) return usage(err, "'cache " + sub + "' needs at least one KEY");
    return for_each_key(*store, p.positional, err, [&](const EntryKey& k) {
      if (sub == "disable") {
        auto it = p.options.find("--reason");
        KFORGE_RETURN_IF_ERROR(store->set_state(k, EntryState::kDisabled,
                                                it != p.options.end() ? it->second : std::string("disabled by user")));
      } else if (sub == "enable") {
        KFORGE_RETURN_IF_ERROR(store->set_state(k, EntryState::kActive, ""));
      } else {
        KFORGE_RETURN_IF_ERROR(store->set_pinned(k, sub == "pin"));
      }
      static const std::map<std::string, std::string> kDone = {
          {"disable", "disabled"}, {"enable", "enabled"}, {"pin", "pinned"}, {"unpin", "unpinned"}};
      out << kDone.at(sub) << " " << k.hex() << "\n";
      return Status();
    });
  }
  if (sub == "gc") {
    auto it = p.options.find("--max-size");
    if (it == p.options.end()) return usage(err, "'cache gc' needs --max-size SIZE");
    if (!p.positional.empty()) return usage(err, "'cache gc' takes no positional arguments");
    auto cap = parse_size(it->second);
    if (!cap.ok()) return usage(err, "--max-size: " + cap.status().message());
    auto r = store->gc(*cap);
    if (!r.ok()) return fail(err, r.status());
    out << "gc: " << human_bytes(r->bytes_before) << " -> " << human_bytes(r->bytes_after) << ", removed "
        << r->removed.size() << " entries, " << r->blobs_removed << " unreferenced blobs, " << r->tmp_removed
        << " abandoned temporary files, " << r->trial_markers_removed << " trial markers of entries that are gone, "
        << r->no_win_records_removed << " no-win records of processes that are gone\n";
    return kExitOk;
  }
  if (sub == "export") {
    if (p.positional.empty()) return usage(err, "'cache export' needs a FILE");
    std::vector<EntryKey> keys;
    for (size_t i = 1; i < p.positional.size(); ++i) {
      auto k = store->resolve_prefix(p.positional[i]);
      if (!k.ok()) return fail(err, k.status());
      keys.push_back(*k);
    }
    std::optional<SigningKey> key;
    if (auto it = p.options.find("--sign"); it != p.options.end()) {
      auto loaded = SigningKey::load(it->second);
      if (!loaded.ok()) return fail(err, loaded.status());
      key = std::move(*loaded);
    }
    auto r = export_bundle(*store, keys, p.positional[0], key ? &*key : nullptr);
    if (!r.ok()) return fail(err, r.status());
    out << "exported " << r->entries << " entries to " << p.positional[0] << " (" << human_bytes(r->file_bytes)
        << (r->signed_bundle ? ", signed by " + key->public_key.fingerprint() : std::string(", unsigned")) << ")\n";
    return kExitOk;
  }
  if (sub == "import") {
    if (p.positional.size() != 1) return usage(err, "'cache import' needs exactly one FILE");
    ImportOptions opts;
    if (auto it = p.options.find("--trusted-key"); it != p.options.end()) {
      auto pub = PublicKey::load(it->second);
      if (!pub.ok()) return fail(err, pub.status());
      opts.trusted_key = *pub;
    }
    opts.require_signature = p.options.count("--require-signature") > 0;
    if (opts.require_signature && !opts.trusted_key) {
      return usage(err, "--require-signature needs --trusted-key PUBLIC: a signature is only worth the key it is checked against");
    }
    auto r = import_bundle(*store, p.positional[0], opts);
    if (!r.ok()) return fail(err, r.status());
    out << "imported " << r->entries_imported << " entries (" << r->entries_identical << " already present) from "
        << p.positional[0];
    if (r->signature_checked) out << ", signature by " << r->signer_fingerprint << " checked";
    else if (!r->signer_fingerprint.empty()) out << ", signed by " << r->signer_fingerprint << " (signer not trusted: no --trusted-key given)";
    else out << ", unsigned";
    out << "\n";
    return kExitOk;
  }
  return usage(err, "unknown subcommand '" + sub + "'");
}

}  // namespace kforge

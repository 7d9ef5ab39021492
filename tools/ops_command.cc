#include "tools/ops_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/templates/kernel_template.h"

namespace kforge {

namespace {

using json = nlohmann::ordered_json;

std::string_view output_rule_name(catalog::OutputRule r) {
  switch (r) {
    case catalog::OutputRule::kLikeInput0: return "like_input0";
    case catalog::OutputRule::kBroadcast: return "broadcast";
    case catalog::OutputRule::kNormRowStats: return "norm_row_stats";
    case catalog::OutputRule::kGroupStats: return "group_stats";
    case catalog::OutputRule::kBatchNormSaved: return "batch_norm_saved";
    case catalog::OutputRule::kReduced: return "reduced";
    case catalog::OutputRule::kGatheredRows: return "gathered_rows";
    case catalog::OutputRule::kCudnnSaved: return "cudnn_saved";
    case catalog::OutputRule::kCudnnReserve: return "cudnn_reserve";
    case catalog::OutputRule::kConcat: return "concat";
    case catalog::OutputRule::kSelf: return "self (in place)";
    case catalog::OutputRule::kConverted: return "converted";
    case catalog::OutputRule::kIndexReduced: return "index_reduced (int64)";
    case catalog::OutputRule::kResized2d: return "resized_2d";
    case catalog::OutputRule::kPooled2d: return "pooled_2d";
    case catalog::OutputRule::kPooled2dIndices: return "pooled_2d_indices (int64)";
  }
  return "?";
}

// The hook's typed interceptor for `e`: the at::_ops name the catalog's list gives it.
std::string interceptor_of(const catalog::OpEntry& e) {
  std::string found;
#define KFORGE_OPS_TYPED(base) \
  if (e.name == "aten::" #base && e.overload.empty()) found = "at::_ops::" #base;
#define KFORGE_OPS_TYPED_OVERLOAD(base, ov) \
  if (e.name == "aten::" #base && e.overload == #ov) found = "at::_ops::" #base "_" #ov;
  KFORGE_CATALOG_OPERATORS(KFORGE_OPS_TYPED, KFORGE_OPS_TYPED_OVERLOAD)
#undef KFORGE_OPS_TYPED
#undef KFORGE_OPS_TYPED_OVERLOAD
  return found.empty() ? "boxed" : "typed (" + found + ")";
}

// The out variant's interceptor (Note [Out variants] in interposer/hook/swap_call.cc).
std::string out_interceptor_of(const catalog::OpEntry& e) {
  if (e.out_variant.empty()) return "";
  if (catalog::out_variant_intercepted(e.out_variant)) return "typed, served by this operator's entries";
  if (e.out_variant == catalog::kOutVariantNotIntercepted) {
    return "not intercepted: " + std::string(catalog::kOutVariantNotInterceptedWhy);
  }
  return "not intercepted";
}

json entry_json(const catalog::OpEntry& e) {
  json families = json::array();
  json backends = json::array();
  for (std::string_view f : e.template_families) {
    const search::templates::KernelTemplate* t = search::templates::find_template(f);
    const std::string backend = t == nullptr ? "missing" : std::string(backend_name(t->backend()));
    families.push_back({{"family", f}, {"backend", backend}});
    if (t != nullptr && std::find(backends.begin(), backends.end(), backend) == backends.end()) backends.push_back(backend);
  }
  json args = json::array();
  for (const catalog::ArgDecl& a : e.args) {
    json j{{"name", a.name}, {"role", catalog::arg_role_name(a.role)}, {"range", catalog::input_range_name(a.range)}};
    if (a.range == catalog::InputRange::kIndex) j["bound"] = {{"arg", a.index_arg}, {"dim", a.index_dim}};
    if (a.gathered) j["gathered"] = true;
    args.push_back(j);
  }
  json outputs = json::array();
  for (const catalog::OutputDecl& o : e.outputs) outputs.push_back({{"name", o.name}, {"rule", output_rule_name(o.rule)}});
  const std::string why = catalog::incomplete(e);
  return json{{"operator", e.qualified()},
              {"schema", e.schema},
              {"backends", backends},
              {"interceptor", interceptor_of(e)},
              {"template_families", families},
              {"no_templates_reason", e.no_templates_reason},
              {"llm_semantics", !e.semantics.empty()},
              {"inplace", e.inplace},
              {"out_variant", e.out_variant},
              {"out_interceptor", out_interceptor_of(e)},
              {"flops_per_element", e.flops_per_element},
              {"args", args},
              {"outputs", outputs},
              {"complete", why.empty()},
              {"incomplete", why}};
}

std::string joined(const json& list, const char* key) {
  std::string s;
  for (const json& x : list) s += (s.empty() ? "" : ", ") + (key ? x[key].get<std::string>() : x.get<std::string>());
  return s.empty() ? "-" : s;
}

}  // namespace

int run_ops_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  bool as_json = false;
  for (const std::string& a : args) {
    if (a == "--json") {
      as_json = true;
    } else if (a == "-h" || a == "--help") {
      out << "usage: kforge ops [--json]\n\nThe operator catalog: per operator its backends, the hook's interceptor, the\n"
             "template families, the LLM's semantics and the in-place/out variants.\n";
      return 0;
    } else {
      err << "kforge ops: unknown option '" << a << "' (usage: kforge ops [--json])\n";
      return 2;
    }
  }
  json all = json::array();
  for (const catalog::OpEntry& e : catalog::operators()) all.push_back(entry_json(e));
  if (as_json) {
    out << all.dump(2) << "\n";
    return 0;
  }
  out << all.size() << " operators in the catalog (runtime/op_catalog.h):\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-26s %-10s %-36s %-4s %s\n", "operator", "searched", "hook interceptor", "LLM",
                "template families");
  out << line;
  for (const json& j : all) {
    std::snprintf(line, sizeof line, "  %-26s %-10s %-36s %-4s %s\n", j["operator"].get<std::string>().c_str(),
                  joined(j["backends"], nullptr).c_str(), j["interceptor"].get<std::string>().c_str(),
                  j["llm_semantics"].get<bool>() ? "yes" : "no", joined(j["template_families"], "family").c_str());
    out << line;
    if (!j["complete"].get<bool>()) out << "      incomplete: " << j["incomplete"].get<std::string>() << "\n";
  }
  size_t outs = 0, served = 0;
  std::string unserved;
  for (const catalog::OpEntry& e : catalog::operators()) {
    if (e.out_variant.empty()) continue;
    ++outs;
    if (catalog::out_variant_intercepted(e.out_variant)) {
      ++served;
    } else {
      unserved += (unserved.empty() ? "" : ", ") + std::string(e.out_variant) + " (" + out_interceptor_of(e) + ")";
    }
  }
  out << "out= variants intercepted and served by their operator's entries: " << served << " of " << outs
      << (unserved.empty() ? std::string() : "; " + unserved) << "\n";
  out << "(kforge ops --json: schemas, in-place and out= variants, the cost model, each argument's role and input range)\n";
  return 0;
}

}  // namespace kforge

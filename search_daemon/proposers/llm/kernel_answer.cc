#include "search_daemon/proposers/llm/kernel_answer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge::llm {

namespace {

using nlohmann::json;

// A model's answer longer than this is not read (a source block is at most kMaxKernelSourceBytes).
constexpr size_t kMaxAnswerBytes = 2 * kMaxKernelSourceBytes;
constexpr size_t kMaxSummaryBytes = 120;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A quoted excerpt of something the model wrote, safe for a one-line message.
std::string quote(std::string_view s, size_t max = 48) {
  std::string out = "'";
  for (char c : s.substr(0, max)) out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  if (s.size() > max) out += "...";
  return out + "'";
}

// ---- fenced blocks -------------------------------------------------------------------------------

struct Fence {
  std::string tag;      // the info string's first word, lowercased ("cuda", "json", "")
  std::string body;
  size_t line = 0;      // 1-based line of the opening fence
};

// Every ``` block, in order. An opening fence is a line that starts with ``` (after up to three
// spaces); it closes at the next line that holds only backticks (at least three).
StatusOr<std::vector<Fence>> fenced_blocks(std::string_view text) {
  std::vector<Fence> out;
  std::optional<Fence> open;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    ++line_no;
    std::string_view lead = line;
    for (int i = 0; i < 3 && !lead.empty() && lead.front() == ' '; ++i) lead.remove_prefix(1);
    const bool fence = lead.substr(0, 3) == "```";
    if (open) {
      const std::string_view t = trim(line);
      if (fence && t.find_first_not_of('`') == std::string_view::npos) {
        out.push_back(std::move(*open));
        open.reset();
      } else {
        open->body.append(line);
        open->body += '\n';
      }
    } else if (fence) {
      Fence f;
      f.line = line_no;
      // The info string after the backticks; its first word is the tag ("cuda", "json").
      std::string_view info = lead.substr(std::min(lead.size(), lead.find_first_not_of('`')));
      info = trim(info);
      info = info.substr(0, info.find_first_of(" \t{"));
      for (char c : info) f.tag += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      open = std::move(f);
    }
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  if (open) {
    return invalid_argument("truncated answer: the ```" + open->tag + " block opened on line " +
                            std::to_string(open->line) + " is never closed");
  }
  return out;
}

// ---- JSON with field paths -----------------------------------------------------------------------

// Errors name the JSON path ("json.launches[0].grid[1]") of the bad value.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const json& value() const { return j_; }
  const std::string& path() const { return path_; }
  Status error(std::string_view what) const { return invalid_argument(path_ + ": " + std::string(what)); }

  Reader at(size_t i) const { return Reader(j_[i], path_ + "[" + std::to_string(i) + "]"); }
  std::optional<Reader> member(const char* name) const {
    auto it = j_.find(name);
    if (it == j_.end()) return std::nullopt;
    return Reader(*it, path_ + "." + name);
  }
  StatusOr<Reader> required(const char* name) const {
    std::optional<Reader> m = member(name);
    if (!m) return invalid_argument(path_ + "." + name + ": missing");
    return *m;
  }

  Status expect_object(std::initializer_list<std::string_view> allowed) const {
    if (!j_.is_object()) return error("expected an object, got " + std::string(j_.type_name()));
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        std::string names;
        for (std::string_view a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
        return invalid_argument(path_ + "." + it.key() + ": unknown field (expected " + names + ")");
      }
    }
    return Status();
  }
  StatusOr<size_t> array(size_t min, size_t max) const {
    if (!j_.is_array()) return error("expected an array, got " + std::string(j_.type_name()));
    if (j_.size() < min || j_.size() > max) {
      return error(std::to_string(j_.size()) + " items; expected " +
                   (min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max)));
    }
    return j_.size();
  }
  StatusOr<std::string> string() const {
    if (!j_.is_string()) return error("expected a string, got " + std::string(j_.type_name()));
    return j_.get<std::string>();
  }
  StatusOr<uint32_t> index() const {
    if (!j_.is_number_integer()) return error("expected a non-negative integer, got " + std::string(j_.type_name()));
    const auto v = j_.get<int64_t>();
    if (v < 0 || v > 1000000) return error(std::to_string(v) + " is not a valid index");
    return static_cast<uint32_t>(v);
  }
  // A launch expression: a string, or an integer the model did not quote.
  StatusOr<std::string> expr() const {
    if (j_.is_string()) return j_.get<std::string>();
    if (j_.is_number_integer()) return std::to_string(j_.get<int64_t>());
    return error("expected a launch expression (string or integer), got " + std::string(j_.type_name()));
  }
  StatusOr<std::vector<std::string>> strings(size_t max) const {
    KFORGE_ASSIGN_OR_RETURN(size_t n, array(0, max));
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      KFORGE_ASSIGN_OR_RETURN(std::string s, at(i).string());
      out.push_back(std::move(s));
    }
    return out;
  }
  StatusOr<std::vector<std::string>> exprs(size_t min, size_t max) const {
    KFORGE_ASSIGN_OR_RETURN(size_t n, array(min, max));
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      KFORGE_ASSIGN_OR_RETURN(std::string s, at(i).expr());
      out.push_back(std::move(s));
    }
    return out;
  }
  StatusOr<DType> dtype() const {
    KFORGE_ASSIGN_OR_RETURN(std::string s, string());
    StatusOr<DType> d = dtype_from_name(s);
    if (!d.ok()) return error("unknown dtype " + quote(s) + " (float32, float64, float16, bfloat16, int64, ...)");
    return *d;
  }

 private:
  const json& j_;
  std::string path_;
};

StatusOr<std::array<std::string, 3>> dims(const Reader& r) {
  KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> v, r.exprs(1, 3));
  std::array<std::string, 3> out{"1", "1", "1"};
  std::copy(v.begin(), v.end(), out.begin());
  return out;
}

StatusOr<ValueType> value_type(const Reader& r, std::initializer_list<ValueType> allowed) {
  KFORGE_ASSIGN_OR_RETURN(std::string s, r.string());
  std::string names;
  for (ValueType t : allowed) {
    if (s == value_type_name(t)) return t;
    names += (names.empty() ? "" : ", ") + std::string(value_type_name(t));
  }
  return r.error("unknown type " + quote(s) + " (expected " + names + ")");
}

StatusOr<ArgBinding> read_arg(const Reader& r) {
  if (!r.value().is_object()) return r.error("expected an object such as {\"input\": 0}");
  for (const char* kind : {"input", "output", "scratch"}) {
    if (std::optional<Reader> m = r.member(kind)) {
      KFORGE_RETURN_IF_ERROR(r.expect_object({kind}));
      KFORGE_ASSIGN_OR_RETURN(uint32_t i, m->index());
      if (kind[0] == 'i') return ArgBinding::input(i);
      if (kind[0] == 'o') return ArgBinding::output(i);
      return ArgBinding::scratch(i);
    }
  }
  if (std::optional<Reader> m = r.member("size")) {
    KFORGE_RETURN_IF_ERROR(r.expect_object({"size", "type"}));
    KFORGE_ASSIGN_OR_RETURN(std::string e, m->expr());
    ValueType t = ValueType::kInt64;
    if (std::optional<Reader> ty = r.member("type")) {
      KFORGE_ASSIGN_OR_RETURN(t, value_type(*ty, {ValueType::kInt64, ValueType::kInt32}));
    }
    return ArgBinding::size(std::move(e), t);
  }
  if (std::optional<Reader> m = r.member("scalar")) {
    KFORGE_RETURN_IF_ERROR(r.expect_object({"scalar", "type"}));
    KFORGE_ASSIGN_OR_RETURN(uint32_t i, m->index());
    KFORGE_ASSIGN_OR_RETURN(Reader ty, r.required("type"));
    KFORGE_ASSIGN_OR_RETURN(ValueType t, value_type(ty, {ValueType::kInt64, ValueType::kInt32, ValueType::kFloat64,
                                                         ValueType::kFloat32, ValueType::kBool}));
    return ArgBinding::scalar(i, t);
  }
  if (std::optional<Reader> m = r.member("value")) {
    KFORGE_RETURN_IF_ERROR(r.expect_object({"value", "type"}));
    KFORGE_ASSIGN_OR_RETURN(uint32_t i, m->index());
    KFORGE_ASSIGN_OR_RETURN(Reader ty, r.required("type"));
    KFORGE_ASSIGN_OR_RETURN(ValueType t, value_type(ty, {ValueType::kInt64, ValueType::kInt32, ValueType::kFloat64,
                                                         ValueType::kFloat32, ValueType::kBool}));
    return ArgBinding::tensor_value(i, t);
  }
  return r.error("expected one of {\"input\": i}, {\"output\": k}, {\"scratch\": k}, {\"size\": expr}, "
                 "{\"scalar\": i, \"type\": t}, {\"value\": i, \"type\": t}");
}

StatusOr<OutputSpec> read_output(const Reader& r) {
  if (std::optional<Reader> in_place = r.member("in_place")) {
    KFORGE_RETURN_IF_ERROR(r.expect_object({"in_place"}));
    KFORGE_ASSIGN_OR_RETURN(uint32_t i, in_place->index());
    return OutputSpec::in_place(i);
  }
  if (std::optional<Reader> like = r.member("like")) {
    KFORGE_RETURN_IF_ERROR(r.expect_object({"like", "dtype"}));
    KFORGE_ASSIGN_OR_RETURN(uint32_t i, like->index());
    std::optional<DType> dt;
    if (std::optional<Reader> d = r.member("dtype")) {
      KFORGE_ASSIGN_OR_RETURN(DType v, d->dtype());
      dt = v;
    }
    return OutputSpec::like(i, dt);
  }
  KFORGE_RETURN_IF_ERROR(r.expect_object({"dtype", "sizes", "strides"}));
  KFORGE_ASSIGN_OR_RETURN(Reader d, r.required("dtype"));
  KFORGE_ASSIGN_OR_RETURN(DType dt, d.dtype());
  KFORGE_ASSIGN_OR_RETURN(Reader sz, r.required("sizes"));
  KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> sizes, sz.exprs(0, kMaxTensorRank));
  KFORGE_ASSIGN_OR_RETURN(Reader st, r.required("strides"));
  KFORGE_ASSIGN_OR_RETURN(std::vector<std::string> strides, st.exprs(sizes.size(), sizes.size()));
  return OutputSpec::explicit_layout(dt, std::move(sizes), std::move(strides));
}

StatusOr<Launch> read_launch(const Reader& r) {
  KFORGE_RETURN_IF_ERROR(r.expect_object({"entry", "grid", "block", "shared_mem_bytes", "args"}));
  Launch l;
  KFORGE_ASSIGN_OR_RETURN(Reader entry, r.required("entry"));
  KFORGE_ASSIGN_OR_RETURN(l.entry, entry.string());
  KFORGE_ASSIGN_OR_RETURN(Reader grid, r.required("grid"));
  KFORGE_ASSIGN_OR_RETURN(l.grid, dims(grid));
  KFORGE_ASSIGN_OR_RETURN(Reader block, r.required("block"));
  KFORGE_ASSIGN_OR_RETURN(l.block, dims(block));
  if (std::optional<Reader> smem = r.member("shared_mem_bytes")) {
    KFORGE_ASSIGN_OR_RETURN(l.shared_mem_bytes, smem->expr());
  }
  KFORGE_ASSIGN_OR_RETURN(Reader args, r.required("args"));
  KFORGE_ASSIGN_OR_RETURN(size_t n, args.array(0, kMaxLaunchArgs));
  for (size_t i = 0; i < n; ++i) {
    KFORGE_ASSIGN_OR_RETURN(ArgBinding b, read_arg(args.at(i)));
    l.args.push_back(std::move(b));
  }
  return l;
}

struct PlanBlock {
  std::string summary;
  std::vector<std::string> entry_points;
  std::vector<std::string> compile_options;
  LaunchPlan plan;
};

StatusOr<PlanBlock> read_plan(const json& j) {
  const Reader r(j, "json");
  KFORGE_RETURN_IF_ERROR(
      r.expect_object({"summary", "entry_points", "compile_options", "scratch", "outputs", "launches"}));
  PlanBlock p;
  if (std::optional<Reader> s = r.member("summary")) {
    KFORGE_ASSIGN_OR_RETURN(std::string text, s->string());
    std::string_view first = trim(std::string_view(text).substr(0, text.find('\n')));
    if (first.size() <= kMaxSummaryBytes) {
      p.summary = std::string(first);
    } else {   // cut on a UTF-8 boundary, and said (the label and every prompt that lists it show it)
      size_t n = kMaxSummaryBytes;
      while (n > 0 && (static_cast<unsigned char>(first[n]) & 0xC0) == 0x80) --n;
      p.summary = std::string(first.substr(0, n)) + " [summary cut]";
    }
  }
  KFORGE_ASSIGN_OR_RETURN(Reader eps, r.required("entry_points"));
  KFORGE_ASSIGN_OR_RETURN(p.entry_points, eps.strings(kMaxEntryPoints));
  if (std::optional<Reader> opts = r.member("compile_options")) {
    KFORGE_ASSIGN_OR_RETURN(p.compile_options, opts->strings(kMaxCompileOptions));
  }
  if (std::optional<Reader> scratch = r.member("scratch")) {
    KFORGE_ASSIGN_OR_RETURN(size_t n, scratch->array(0, kMaxScratchBuffers));
    for (size_t i = 0; i < n; ++i) {
      const Reader b = scratch->at(i);
      KFORGE_RETURN_IF_ERROR(b.expect_object({"name", "bytes"}));
      ScratchBuffer sb;
      KFORGE_ASSIGN_OR_RETURN(Reader name, b.required("name"));
      KFORGE_ASSIGN_OR_RETURN(sb.name, name.string());
      KFORGE_ASSIGN_OR_RETURN(Reader bytes, b.required("bytes"));
      KFORGE_ASSIGN_OR_RETURN(sb.bytes, bytes.expr());
      p.plan.scratch.push_back(std::move(sb));
    }
  }
  KFORGE_ASSIGN_OR_RETURN(Reader outs, r.required("outputs"));
  KFORGE_ASSIGN_OR_RETURN(size_t n_out, outs.array(1, kMaxOutputs));
  for (size_t i = 0; i < n_out; ++i) {
    KFORGE_ASSIGN_OR_RETURN(OutputSpec o, read_output(outs.at(i)));
    p.plan.outputs.push_back(std::move(o));
  }
  KFORGE_ASSIGN_OR_RETURN(Reader launches, r.required("launches"));
  KFORGE_ASSIGN_OR_RETURN(size_t n_l, launches.array(1, kMaxLaunches));
  for (size_t i = 0; i < n_l; ++i) {
    KFORGE_ASSIGN_OR_RETURN(Launch l, read_launch(launches.at(i)));
    p.plan.launches.push_back(std::move(l));
  }
  return p;
}

// Line and column (1-based) of byte `offset` in `text`.
std::string line_col(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

bool is_ident_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

// `name` occurs in `source` as a whole identifier.
bool mentions(std::string_view source, std::string_view name) {
  for (size_t at = source.find(name); at != std::string_view::npos; at = source.find(name, at + 1)) {
    const bool left = at == 0 || !is_ident_char(source[at - 1]);
    const bool right = at + name.size() == source.size() || !is_ident_char(source[at + name.size()]);
    if (left && right) return true;
  }
  return false;
}

std::vector<std::string> dims_json(const std::array<std::string, 3>& d) {
  // Trailing 1s are dropped, as a person would write them.
  size_t n = 3;
  while (n > 1 && d[n - 1] == "1") --n;
  return std::vector<std::string>(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace

std::string_view source_fence_tag(Backend backend) noexcept { return backend == Backend::kCuda ? "cuda" : "cpp"; }

StatusOr<KernelAnswer> parse_kernel_answer(std::string_view text, const OpSignature& sig) {
  if (text.size() > kMaxAnswerBytes) {
    return invalid_argument("the answer is " + std::to_string(text.size()) + " bytes, over the " +
                            std::to_string(kMaxAnswerBytes) + " read");
  }
  KFORGE_ASSIGN_OR_RETURN(std::vector<Fence> blocks, fenced_blocks(text));
  const std::string_view want = source_fence_tag(sig.target.backend);
  const Fence* source = nullptr;
  const Fence* plan = nullptr;
  size_t n_source = 0, n_plan = 0;
  for (const Fence& f : blocks) {
    if (f.tag == "json") {
      ++n_plan;
      plan = &f;
    } else {
      ++n_source;
      source = &f;
    }
  }
  if (blocks.empty()) {
    return invalid_argument("no fenced blocks: the answer must hold one ```" + std::string(want) +
                            " source block and one ```json block");
  }
  if (n_source == 0) return invalid_argument("missing the ```" + std::string(want) + " source block");
  if (n_source > 1) {
    return invalid_argument("found " + std::to_string(n_source) + " source blocks; expected exactly one ```" +
                            std::string(want) + " block");
  }
  if (n_plan == 0) return invalid_argument("missing the ```json block (entry points and launch plan)");
  if (n_plan > 1) return invalid_argument("found " + std::to_string(n_plan) + " ```json blocks; expected exactly one");

  json j;
  try {
    j = json::parse(plan->body);
  } catch (const json::parse_error& e) {
    // nlohmann's byte is one past the offending character.
    const size_t at = e.byte > 0 ? e.byte - 1 : 0;
    std::string what = e.what();
    if (const size_t colon = what.rfind(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return invalid_argument("json block (line " + std::to_string(plan->line) + " of the answer): syntax error at " +
                            line_col(plan->body, at) + " of the block: " + what);
  }
  KFORGE_ASSIGN_OR_RETURN(PlanBlock p, read_plan(j));

  KernelAnswer a;
  a.summary = std::move(p.summary);
  KernelSpec& s = a.spec;
  s.backend = sig.target.backend;
  s.language = sig.target.backend == Backend::kCuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  s.source = source->body;
  s.entry_points = std::move(p.entry_points);
  s.compile_options = std::move(p.compile_options);
  s.plan = std::move(p.plan);
  if (Status v = s.validate(); !v.ok()) return invalid_argument("invalid plan: " + v.message());
  for (const std::string& ep : s.entry_points) {
    if (!mentions(s.source, ep)) {
      return invalid_argument("entry point " + quote(ep) + " does not appear in the source block");
    }
  }
  if (StatusOr<ResolvedLaunchPlan> r = s.resolve(sig); !r.ok()) {
    return invalid_argument("the plan does not resolve for " + sig.to_string() + ": " + r.status().message());
  }
  return a;
}

std::string plan_json(const KernelSpec& spec, std::string_view summary) {
  using ojson = nlohmann::ordered_json;
  // In the order and shape the prompt's example uses: one top-level field per line, each launch on
  // its own line.
  std::vector<std::pair<std::string, std::string>> fields;
  auto compact = [](const ojson& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (!summary.empty()) fields.emplace_back("summary", compact(ojson(std::string(summary))));
  fields.emplace_back("entry_points", compact(ojson(spec.entry_points)));
  if (!spec.compile_options.empty()) fields.emplace_back("compile_options", compact(ojson(spec.compile_options)));
  if (!spec.plan.scratch.empty()) {
    ojson scratch = ojson::array();
    for (const ScratchBuffer& b : spec.plan.scratch) scratch.push_back({{"name", b.name}, {"bytes", b.bytes}});
    fields.emplace_back("scratch", compact(scratch));
  }
  ojson outputs = ojson::array();
  for (const OutputSpec& o : spec.plan.outputs) {
    ojson out = ojson::object();
    if (o.layout == OutputSpec::Layout::kInPlace) {
      out["in_place"] = o.input;
    } else if (o.layout == OutputSpec::Layout::kLikeInput) {
      out["like"] = o.input;
      if (o.dtype) out["dtype"] = std::string(dtype_name(*o.dtype));
    } else {
      out["dtype"] = o.dtype ? std::string(dtype_name(*o.dtype)) : std::string("float32");
      out["sizes"] = o.sizes;
      out["strides"] = o.strides;
    }
    outputs.push_back(out);
  }
  fields.emplace_back("outputs", compact(outputs));
  std::string launches = "[";
  for (size_t i = 0; i < spec.plan.launches.size(); ++i) {
    const Launch& l = spec.plan.launches[i];
    ojson args = ojson::array();
    for (const ArgBinding& b : l.args) {
      switch (b.kind) {
        case ArgBinding::Kind::kInput: args.push_back({{"input", b.index}}); break;
        case ArgBinding::Kind::kOutput: args.push_back({{"output", b.index}}); break;
        case ArgBinding::Kind::kScratch: args.push_back({{"scratch", b.index}}); break;
        case ArgBinding::Kind::kSize:
          args.push_back({{"size", b.expr}, {"type", std::string(value_type_name(b.type))}});
          break;
        case ArgBinding::Kind::kScalar:
          args.push_back({{"scalar", b.index}, {"type", std::string(value_type_name(b.type))}});
          break;
        case ArgBinding::Kind::kTensorValue:
          args.push_back({{"value", b.index}, {"type", std::string(value_type_name(b.type))}});
          break;
      }
    }
    ojson launch = {{"entry", l.entry}, {"grid", dims_json(l.grid)}, {"block", dims_json(l.block)}};
    if (l.shared_mem_bytes != "0") launch["shared_mem_bytes"] = l.shared_mem_bytes;
    launch["args"] = args;
    launches += (i ? ",\n   " : "") + compact(launch);
  }
  fields.emplace_back("launches", launches + "]");
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    out += (i ? ",\n \"" : "\"") + fields[i].first + "\": " + fields[i].second;
  }
  return out + "}";
}

}  // namespace kforge::llm

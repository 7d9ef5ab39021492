#include "search_daemon/proposers/templates/kernel_template.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <tuple>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

std::string Knob::value_text(int64_t v) const {
  if (categorical()) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] == v) return names[i];
    }
  }
  return std::to_string(v);
}

std::vector<FamilyFactory>& mutable_registry() {
  static auto* r = new std::vector<FamilyFactory>();   // filled by static initializers; never freed
  return *r;
}

FamilyRegistration::FamilyRegistration(std::initializer_list<FamilyFactory> factories) {
  for (FamilyFactory f : factories) mutable_registry().push_back(f);
}

const std::vector<FamilyFactory>& registered_families() { return mutable_registry(); }

namespace {

struct Library {
  std::vector<std::unique_ptr<KernelTemplate>> owned;
  std::vector<const KernelTemplate*> view;
};

// Where the catalog names a family: (CPU after CUDA, the operator's position in the catalog, the
// family's position in its entry). A family no entry names comes last (the catalog test fails).
std::tuple<int, size_t, size_t> catalog_order(const KernelTemplate& t) {
  const std::span<const catalog::OpEntry> ops = catalog::operators();
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& names = ops[i].template_families;
    for (size_t k = 0; k < names.size(); ++k) {
      if (names[k] == t.family()) return {t.backend() == Backend::kCpu ? 1 : 0, i, k};
    }
  }
  return {2, ops.size(), 0};
}

const Library& library() {
  static const Library lib = [] {
    Library l;
    for (FamilyFactory make : registered_families()) l.owned.push_back(make());
    std::stable_sort(l.owned.begin(), l.owned.end(),
                     [](const auto& a, const auto& b) { return catalog_order(*a) < catalog_order(*b); });
    for (const auto& t : l.owned) l.view.push_back(t.get());
    return l;
  }();
  return lib;
}

bool in_domain(const Knob& k, int64_t v) { return std::find(k.values.begin(), k.values.end(), v) != k.values.end(); }

}  // namespace

std::span<const KernelTemplate* const> template_library() { return library().view; }

const KernelTemplate* find_template(std::string_view family) {
  for (const KernelTemplate* t : template_library()) {
    if (t->family() == family) return t;
  }
  return nullptr;
}

std::vector<const KernelTemplate*> templates_for(const OpSignature& sig) {
  std::vector<const KernelTemplate*> out;
  for (const KernelTemplate* t : template_library()) {
    if (t->backend() == sig.target.backend && t->applies(sig)) out.push_back(t);
  }
  return out;
}

bool is_valid(const KernelTemplate& t, const OpSignature& sig, std::span<const int64_t> values) {
  const std::vector<Knob>& knobs = t.knobs();
  if (values.size() != knobs.size()) return false;
  for (size_t i = 0; i < knobs.size(); ++i) {
    if (!in_domain(knobs[i], values[i])) return false;
  }
  if (t.backend() != sig.target.backend || !t.applies(sig) || !t.valid(sig, values)) return false;
  // The launch limits (grid, block, shared memory, int32 ranges) are the plan's to check.
  const KernelSpec spec = t.instantiate(sig, values);
  return spec.validate().ok() && spec.resolve(sig).ok();
}

std::vector<TemplateConfig> enumerate_space(const OpSignature& sig, const KernelTemplate& t) {
  std::vector<TemplateConfig> out;
  if (t.backend() != sig.target.backend || !t.applies(sig)) return out;
  const std::vector<Knob>& knobs = t.knobs();
  std::vector<size_t> index(knobs.size(), 0);
  std::vector<int64_t> values(knobs.size());
  while (true) {
    for (size_t i = 0; i < knobs.size(); ++i) values[i] = knobs[i].values[index[i]];
    if (is_valid(t, sig, values)) out.push_back(TemplateConfig{std::string(t.family()), values});
    // Odometer, last knob fastest: lexicographic order of the indices.
    size_t k = knobs.size();
    while (k > 0) {
      --k;
      if (++index[k] < knobs[k].values.size()) break;
      index[k] = 0;
      if (k == 0) return out;
    }
    if (knobs.empty()) return out;
  }
}

std::vector<TemplateConfig> enumerate_space(const OpSignature& sig) {
  std::vector<TemplateConfig> out;
  for (const KernelTemplate* t : templates_for(sig)) {
    std::vector<TemplateConfig> part = enumerate_space(sig, *t);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<TemplateConfig> neighbours(const OpSignature& sig, const TemplateConfig& c) {
  std::vector<TemplateConfig> out;
  const KernelTemplate* t = find_template(c.family);
  if (t == nullptr || c.values.size() != t->knobs().size()) return out;
  const std::vector<Knob>& knobs = t->knobs();
  for (size_t k = 0; k < knobs.size(); ++k) {
    const std::vector<int64_t>& dom = knobs[k].values;
    const auto at = std::find(dom.begin(), dom.end(), c.values[k]);
    if (at == dom.end()) return {};
    const size_t here = static_cast<size_t>(at - dom.begin());
    TemplateConfig n = c;
    auto try_value = [&](size_t i) {
      n.values[k] = dom[i];
      if (!is_valid(*t, sig, n.values)) return false;
      out.push_back(n);
      return true;
    };
    if (knobs[k].categorical()) {
      for (size_t i = 0; i < dom.size(); ++i) {
        if (i != here) try_value(i);
      }
    } else {
      for (size_t i = here; i-- > 0;) {
        if (try_value(i)) break;
      }
      for (size_t i = here + 1; i < dom.size(); ++i) {
        if (try_value(i)) break;
      }
    }
  }
  return out;
}

std::string label(const KernelTemplate& t, const TemplateConfig& c) {
  const std::vector<Knob>& knobs = t.knobs();
  std::string s(t.family());
  size_t first = 0;
  if (!knobs.empty() && knobs[0].categorical() && !c.values.empty()) {
    s += "." + knobs[0].value_text(c.values[0]);
    first = 1;
  }
  for (size_t k = first; k < knobs.size() && k < c.values.size(); ++k) {
    s += " " + knobs[k].name + "=" + knobs[k].value_text(c.values[k]);
  }
  return s;
}

namespace {

std::optional<int64_t> knob_value(const Knob& k, std::string_view text) {
  if (k.categorical()) {
    for (size_t i = 0; i < k.names.size(); ++i) {
      if (k.names[i] == text) return k.values[i];
    }
    return std::nullopt;
  }
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !in_domain(k, v)) return std::nullopt;
  return v;
}

std::vector<std::string_view> split_spaces(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = std::min(s.find(' ', i), s.size());
    if (j == i) return {};   // empty token: not a label this library writes
    out.push_back(s.substr(i, j - i));
    i = j + 1;
    if (i == s.size()) return {};   // trailing space
  }
  return out;
}

}  // namespace

std::optional<TemplateConfig> parse_label(std::string_view text) {
  const std::vector<std::string_view> tokens = split_spaces(text);
  if (tokens.empty()) return std::nullopt;
  for (const KernelTemplate* t : template_library()) {
    const std::vector<Knob>& knobs = t->knobs();
    const std::string_view fam = t->family();
    const std::string_view head = tokens[0];
    TemplateConfig c{std::string(fam), {}};
    size_t first = 0;
    if (!knobs.empty() && knobs[0].categorical()) {
      if (head.size() <= fam.size() + 1 || head.substr(0, fam.size()) != fam || head[fam.size()] != '.') continue;
      const std::optional<int64_t> v = knob_value(knobs[0], head.substr(fam.size() + 1));
      if (!v) continue;
      c.values.push_back(*v);
      first = 1;
    } else if (head != fam) {
      continue;
    }
    if (tokens.size() != 1 + knobs.size() - first) continue;
    bool ok = true;
    for (size_t k = first; k < knobs.size() && ok; ++k) {
      const std::string_view tok = tokens[1 + k - first];
      const size_t eq = tok.find('=');
      ok = eq != std::string_view::npos && tok.substr(0, eq) == knobs[k].name;
      std::optional<int64_t> v;
      if (ok) v = knob_value(knobs[k], tok.substr(eq + 1));
      ok = ok && v.has_value();
      if (ok) c.values.push_back(*v);
    }
    if (ok) return c;
  }
  return std::nullopt;
}

}  // namespace kforge::search::templates

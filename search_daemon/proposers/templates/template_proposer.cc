#include "search_daemon/proposers/templates/template_proposer.h"

#include <algorithm>
#include <set>
#include <utility>

namespace kforge::search {

using templates::KernelTemplate;
using templates::TemplateConfig;

namespace {

double clamp_prior(double p) { return std::clamp(p, 1e-6, 1.0); }

struct Ranked {
  TemplateConfig config;
  const KernelTemplate* family = nullptr;
  double prior = 0;
};

// Highest prior first; ties keep the enumeration order (stable), so the result is deterministic.
std::vector<Ranked> ranked(const OpSignature& sig, std::vector<TemplateConfig> configs) {
  std::vector<Ranked> out;
  out.reserve(configs.size());
  for (TemplateConfig& c : configs) {
    const KernelTemplate* t = templates::find_template(c.family);
    if (t == nullptr) continue;
    const double p = clamp_prior(t->prior(sig, c.values));
    out.push_back(Ranked{std::move(c), t, p});
  }
  std::stable_sort(out.begin(), out.end(), [](const Ranked& a, const Ranked& b) { return a.prior > b.prior; });
  return out;
}

// The values of a configuration's categorical knobs: which variant of the family it is.
std::vector<int64_t> variant_of(const Ranked& r) {
  std::vector<int64_t> v;
  const std::vector<templates::Knob>& knobs = r.family->knobs();
  for (size_t k = 0; k < knobs.size(); ++k) {
    if (knobs[k].categorical()) v.push_back(r.config.values[k]);
  }
  return v;
}

std::set<KernelId> specs_in(const SearchTree* tree) {
  std::set<KernelId> ids;
  if (tree == nullptr) return ids;
  for (const Node& n : tree->nodes()) ids.insert(n.spec_id);
  return ids;
}

// Moves for `order`, skipping specs already in the tree (or already taken), at most max_moves.
std::vector<Move> take_moves(const OpSignature& sig, const std::vector<Ranked>& order, const SearchTree* tree,
                             size_t max_moves) {
  std::set<KernelId> seen = specs_in(tree);
  std::vector<Move> out;
  for (const Ranked& r : order) {
    if (out.size() >= max_moves) break;
    Move m{r.family->instantiate(sig, r.config.values), std::string(TemplateProposer::kName),
           templates::label(*r.family, r.config), r.prior};
    if (!seen.insert(m.spec.id()).second) continue;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

std::set<std::string> TemplateProposer::families_of(const std::vector<std::string>& labels) {
  std::set<std::string> out;
  for (const std::string& l : labels) {
    if (std::optional<TemplateConfig> c = templates::parse_label(l)) out.insert(c->family);
  }
  return out;
}

std::vector<TemplateConfig> TemplateProposer::space(const OpSignature& sig) const {
  std::vector<TemplateConfig> all = templates::enumerate_space(sig);
  if (!families_.empty()) std::erase_if(all, [&](const TemplateConfig& c) { return !families_.contains(c.family); });
  return all;
}

bool TemplateProposer::supports(const OpSignature& sig) const { return !space(sig).empty(); }

std::vector<Move> TemplateProposer::propose(const ProposalRequest& request) {
  if (request.signature == nullptr || request.max_moves == 0) return {};
  const OpSignature& sig = *request.signature;
  if (request.parent != 0) {
    if (request.tree == nullptr || request.parent >= request.tree->size()) return {};
    const std::optional<TemplateConfig> here = config_of(sig, request.tree->node(request.parent).move);
    if (!here) return {};
    return take_moves(sig, ranked(sig, templates::neighbours(sig, *here)), request.tree, request.max_moves);
  }
  // The root: the best configuration of each variant first, so the first expansion already spans
  // the algorithms; then everything else by prior, so a root expanded again keeps giving new ones.
  const std::vector<Ranked> all = ranked(sig, space(sig));
  std::vector<Ranked> order;
  std::vector<Ranked> rest;
  std::set<std::pair<std::string, std::vector<int64_t>>> variants;
  for (const Ranked& r : all) {
    (variants.insert({r.config.family, variant_of(r)}).second ? order : rest).push_back(r);
  }
  order.insert(order.end(), rest.begin(), rest.end());
  return take_moves(sig, order, request.tree, request.max_moves);
}

std::optional<Move> TemplateProposer::sample(const OpSignature& sig, std::mt19937_64& rng) {
  const std::vector<TemplateConfig> configs = space(sig);
  if (configs.empty()) return std::nullopt;
  // Uniform without modulo bias: reject the lowest 2^64 mod n values.
  const uint64_t n = configs.size();
  const uint64_t threshold = (0 - n) % n;
  uint64_t r = rng();
  while (r < threshold) r = rng();
  StatusOr<Move> m = move_for(sig, configs[r % n]);
  if (!m.ok()) return std::nullopt;
  return std::move(*m);
}

StatusOr<Move> TemplateProposer::move_for(const OpSignature& sig, const TemplateConfig& config) {
  const KernelTemplate* t = templates::find_template(config.family);
  if (t == nullptr) return invalid_argument("no template family '" + config.family + "'");
  if (!templates::is_valid(*t, sig, config.values)) {
    return invalid_argument(templates::label(*t, config) + " is not a valid configuration for " + sig.to_string());
  }
  return Move{t->instantiate(sig, config.values), std::string(kName), templates::label(*t, config),
              clamp_prior(t->prior(sig, config.values))};
}

std::optional<TemplateConfig> TemplateProposer::config_of(const OpSignature& sig, const Move& move) {
  if (move.proposer != kName) return std::nullopt;
  std::optional<TemplateConfig> c = templates::parse_label(move.label);
  if (!c) return std::nullopt;
  const KernelTemplate* t = templates::find_template(c->family);
  if (t == nullptr || !templates::is_valid(*t, sig, c->values)) return std::nullopt;
  if (!(t->instantiate(sig, c->values) == move.spec)) return std::nullopt;
  return c;
}

}  // namespace kforge::search

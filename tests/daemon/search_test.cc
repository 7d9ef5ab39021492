// The search tree (search_daemon/search/search_tree.h): what an evaluation tells the search
// (outcome_of), what it is worth (reward, Note [Reward]), and the tree every strategy grows: dense
// ids, one node per kernel spec, lineage, best().
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "search_daemon/search/search_tree.h"

using namespace kforge;
using namespace kforge::search;
using eval::EvalStatus;

namespace {

using Knobs = std::vector<int>;

// A valid CPU spec whose identity is its knobs (and `variant`, for specs that differ otherwise).
KernelSpec knob_spec(const Knobs& k, const std::string& variant = "") {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = "extern \"C\" void k(const void*, void* const*) {}\n" + variant;
  s.entry_points = {"k"};
  for (size_t i = 0; i < k.size(); ++i) s.compile_options.push_back("-DK" + std::to_string(i) + "=" + std::to_string(k[i]));
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0)};
  s.plan.launches = {l};
  return s;
}

std::string label_of(const Knobs& k) {
  std::string l = "k=";
  for (size_t i = 0; i < k.size(); ++i) l += (i ? "," : "") + std::to_string(k[i]);
  return l;
}

Move knob_move(const Knobs& k, double prior = 0.5, const std::string& variant = "") {
  return Move{knob_spec(k, variant), "template", label_of(k) + variant, prior};
}

Outcome measured(double speedup, bool significant = true) {
  Outcome o;
  o.status = EvalStatus::kMeasured;
  o.speedup = speedup;
  o.significant = significant;
  o.noise_band = 0.02;
  o.baseline_ns = 1000;
  o.candidate_ns = 1000 / speedup;
  return o;
}

Outcome failed(EvalStatus s, std::string message = "") {
  Outcome o;
  o.status = s;
  o.message = std::move(message);
  if (s == EvalStatus::kCompileError) o.build_log = "error: " + o.message;
  if (s == EvalStatus::kVerifyFailed) o.failed_check = "accuracy";
  return o;
}

}  // namespace

// ---- the vocabulary ---------------------------------------------------------------------------

TEST_CASE("outcome_of keeps what steers the search and caps the logs at kMaxOutcomeLog", "[search][tree]") {
  eval::EvalResult r;
  r.status = EvalStatus::kMeasured;
  r.timing.speedup = 1.7;
  r.timing.noise_band = 0.03;
  r.timing.significant = true;
  r.timing.baseline_median_ns = 1700;
  r.timing.candidate_median_ns = 1000;
  r.verify.failed_check = "";
  r.message = "ok";
  // A 3-byte UTF-8 character straddles the cap: it is dropped whole, never cut.
  r.build_log = std::string(kMaxOutcomeLog - 1, 'x') + "\xe2\x82\xac" + std::string(100, 'y');
  const Outcome o = outcome_of(r);
  CHECK(o.status == EvalStatus::kMeasured);
  CHECK(o.speedup == 1.7);
  CHECK(o.noise_band == 0.03);
  CHECK(o.significant);
  CHECK(o.baseline_ns == 1700);
  CHECK(o.candidate_ns == 1000);
  CHECK(o.message == "ok");
  CHECK(o.build_log == std::string(kMaxOutcomeLog - 1, 'x'));
  CHECK(o.improves());

  r.status = EvalStatus::kVerifyFailed;
  r.verify.failed_check = "nan_inf_positions";
  r.message = "trial large: NaN at 17";
  const Outcome f = outcome_of(r);
  CHECK(f.failed_check == "nan_inf_positions");
  CHECK(f.message == "trial large: NaN at 17");
  CHECK_FALSE(f.measured());
  CHECK_FALSE(f.improves());
}

TEST_CASE("reward follows Note [Reward]: ln(speedup) when measured, fixed penalties for failures", "[search][tree]") {
  CHECK(reward(measured(1.5)) == Approx(std::log(1.5)));
  CHECK(reward(measured(0.5)) == Approx(std::log(0.5)));
  // Inside the noise band: no better, no worse than PyTorch's kernel.
  CHECK(reward(measured(1.01, false)) == 0);
  CHECK(reward(measured(0.99, false)) == 0);
  // A correct kernel is never worth less than one that crashes.
  CHECK(reward(measured(0.01)) == kRewardFault);
  CHECK(reward(measured(std::nan(""))) == 0);
  CHECK(reward(measured(0)) == 0);
  CHECK(reward(failed(EvalStatus::kCompileError)) == -0.5);
  CHECK(reward(failed(EvalStatus::kRejected)) == -0.7);
  CHECK(reward(failed(EvalStatus::kVerifyFailed)) == -1.0);
  CHECK(reward(failed(EvalStatus::kFault)) == -1.5);
  CHECK(reward(failed(EvalStatus::kTimeout)) == -1.5);
  CHECK(reward(failed(EvalStatus::kWorkerError)) == 0);
  Outcome v;
  v.status = EvalStatus::kVerified;
  CHECK(reward(v) == 0);
}

TEST_CASE("SearchTree: dense ids, one node per spec, lineage from the root", "[search][tree]") {
  SearchTree t;
  REQUIRE(t.size() == 1);
  CHECK(t.node(0).parent == 0);
  CHECK(t.evaluated() == 0);

  const uint64_t a = t.add(0, knob_move({1}));
  const uint64_t b = t.add(a, knob_move({2}));
  const uint64_t c = t.add(a, knob_move({3}));
  CHECK(a == 1);
  CHECK(b == 2);
  CHECK(c == 3);
  CHECK(t.node(a).children == std::vector<uint64_t>{b, c});
  CHECK(t.lineage(b) == std::vector<uint64_t>{0, a, b});
  CHECK(t.lineage(0) == std::vector<uint64_t>{0});
  CHECK(t.lineage(99).empty());

  // The same spec proposed again, from anywhere, is the node that already holds it.
  CHECK(t.add(c, knob_move({1}, 0.9)) == a);
  CHECK(t.size() == 4);
  CHECK(t.node(c).children.empty());
  CHECK(t.find(knob_spec({2}).id()) == b);
  CHECK_FALSE(t.find(knob_spec({4}).id()));

  // Outcomes: the root has none; a replaced outcome is still one evaluation.
  CHECK_FALSE(t.set_outcome(0, measured(2)));
  CHECK_FALSE(t.set_outcome(42, measured(2)));
  CHECK(t.set_outcome(b, failed(EvalStatus::kFault)));
  CHECK(t.set_outcome(b, measured(1.2)));
  CHECK(t.evaluated() == 1);
  CHECK(t.node(b).outcome->speedup == 1.2);

  // A parent that does not exist: the move goes under the root rather than crash.
  const uint64_t d = t.add(1000, knob_move({5}));
  CHECK(t.node(d).parent == 0);
}

TEST_CASE("SearchTree::best is the fastest significant speedup above 1, the earliest on a tie", "[search][tree]") {
  SearchTree t;
  CHECK(t.best() == nullptr);
  const uint64_t slow = t.add(0, knob_move({1}));
  const uint64_t noise = t.add(0, knob_move({2}));
  const uint64_t broken = t.add(0, knob_move({3}));
  t.set_outcome(slow, measured(0.8));
  t.set_outcome(noise, measured(1.6, false));
  t.set_outcome(broken, failed(EvalStatus::kVerifyFailed));
  CHECK(t.best() == nullptr);   // nothing beats PyTorch's kernel beyond the noise

  const uint64_t good = t.add(0, knob_move({4}));
  const uint64_t better = t.add(good, knob_move({5}));
  const uint64_t tie = t.add(good, knob_move({6}));
  t.set_outcome(good, measured(1.2));
  t.set_outcome(better, measured(1.4));
  t.set_outcome(tie, measured(1.4));
  REQUIRE(t.best() != nullptr);
  CHECK(t.best()->id == better);
}

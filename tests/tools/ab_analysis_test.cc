// kforge warm's end-to-end A/B: how the windows of the last run become ratios (Note [End-to-end
// A/B], Note [Idle windows]).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "tools/ab_analysis.h"

using kforge::AbResult;
using kforge::analyse_ab;
using nlohmann::json;

namespace {
// One process's windows: label, calls, nanoseconds.
json process(const json& windows) {
  return json{{"window_ms", 250}, {"entries", json::array({json{{"signature_id", "e1"}, {"entry", "k1"}}})},
              {"windows", windows}};
}
}  // namespace

TEST_CASE("each window pairs with the all window before it, else after it, and rates are calls per time") {
  // all 200 calls / 1 s; none 100 calls / 1 s (2x); all; e1 150 / 1 s; then an e1 window after an
  // all that follows it.
  const AbResult r = analyse_ab({process(json::array({json::array({"all", 200, 1e9}), json::array({"none", 100, 1e9}),
                                                      json::array({"all", 300, 1e9}), json::array({"e1", 200, 1e9}),
                                                      json::array({"none", 150, 1e9}), json::array({"all", 300, 1e9})}))});
  REQUIRE(r.by_label.at("none").pairs == 2);
  // none #1 pairs with all before it (200/100 = 2); none #2 has e1 before it, so pairs with the all after (300/150 = 2).
  CHECK(r.by_label.at("none").median == Approx(2.0));
  CHECK(r.by_label.at("e1").pairs == 1);
  CHECK(r.by_label.at("e1").median == Approx(1.5));
  CHECK(r.entry_of.at("e1") == "k1");
  CHECK(r.seconds == Approx(6.0));
  CHECK(r.idle_windows == 0);
}

TEST_CASE("a window without a call (the program not stepping) is dropped, and no pair spans it") {
  // The last all window is the program's teardown: no call. Before the fix it paired with the none
  // window before it and gave a ratio of 0.
  const AbResult r = analyse_ab({process(json::array({json::array({"all", 200, 1e9}), json::array({"none", 100, 1e9}),
                                                      json::array({"all", 200, 1e9}), json::array({"none", 100, 1e9}),
                                                      json::array({"e1", 100, 1e9}), json::array({"all", 0, 1e9})}))});
  REQUIRE(r.by_label.at("none").pairs == 2);
  CHECK(r.by_label.at("none").low == Approx(2.0));
  CHECK(r.by_label.at("none").median == Approx(2.0));
  CHECK(r.by_label.count("e1") == 0);   // its only neighbour all window was idle
  CHECK(r.idle_windows == 1);
  CHECK(r.seconds == Approx(6.0));

  // An idle window between two stepping ones: they are not adjacent.
  const AbResult gap = analyse_ab({process(json::array({json::array({"e1", 100, 1e9}), json::array({"all", 0, 1e9}),
                                                        json::array({"none", 100, 1e9})}))});
  CHECK(gap.by_label.empty());
  CHECK(gap.idle_windows == 1);
}

TEST_CASE("malformed windows are skipped, not trusted") {
  const AbResult r = analyse_ab({process(json::array({json::array({"all", 200}), json::array({1, 2, 3}),
                                                      json::array({"all", 200, 0}), json::array({"all", 200, 1e9}),
                                                      json::array({"none", "x", 1e9}), json::array({"none", 100, 1e9})})),
                                 json::object()});
  REQUIRE(r.by_label.at("none").pairs == 1);
  CHECK(r.by_label.at("none").median == Approx(2.0));
}

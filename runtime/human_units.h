// Durations as people read them, for every message, table and report kforge prints
// ("2.35 us", "14.1 ms", "1.20 s"): three significant digits, the unit chosen by magnitude.
#pragma once

#include <string>

namespace kforge {

// ns <= 0 or not finite: "-".
std::string human_duration_ns(double ns);

}  // namespace kforge

#include "runtime/human_units.h"

#include <cmath>
#include <cstdio>
#include <iterator>

namespace kforge {

std::string human_duration_ns(double ns) {
  if (!(ns > 0) || !std::isfinite(ns)) return "-";
  static constexpr struct {
    double scale;
    const char* unit;
  } kUnits[] = {{1, "ns"}, {1e3, "us"}, {1e6, "ms"}, {1e9, "s"}};
  size_t u = 0;
  // Pick the unit after rounding to three digits, so 999.7 ns reads "1.00 us", not "1000 ns".
  while (u + 1 < std::size(kUnits) && ns / kUnits[u].scale >= 999.5) ++u;
  const double v = ns / kUnits[u].scale;
  const int decimals = u == 0 ? 0 : v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, kUnits[u].unit);
  return buf;
}

}  // namespace kforge

// A line chart as a PNG file, with no image library: `kforge warm`'s "best speedup over time per
// signature" chart.
//
//   ChartSeries s{"1", {{0, 1.0}, {90, 1.8}, {400, 2.4}}};   // (x, y) points, drawn as steps
//   Status st = write_step_chart_png("chart.png", {s}, "min", "x");
//
// Axis labels and the legend are numbers only (a built-in 5x7 font of digits and a few letters):
// the series are numbered, and the report that embeds the chart says which signature each
// number is. The PNG is 8-bit indexed colour, compressed with stored (uncompressed) deflate blocks:
// a few hundred KB, readable by every viewer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace kforge {

struct ChartSeries {
  std::string label;                             // shown in the legend (digits, '.', 'x')
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
};

// x in the unit `x_unit` (e.g. "min"), y a ratio (labels end in `y_unit`, e.g. "x").
Status write_step_chart_png(const std::string& path, const std::vector<ChartSeries>& series, const std::string& x_unit,
                            const std::string& y_unit);

// The PNG encoding of an 8-bit indexed image (exposed for its test).
std::string encode_indexed_png(int width, int height, const std::vector<uint8_t>& pixels,
                               const std::vector<std::array<uint8_t, 3>>& palette);

}  // namespace kforge

#include "runtime/human_units.h"

#include <catch2/catch.hpp>

#include <limits>

namespace kforge {
namespace {

TEST_CASE("human_duration_ns: three significant digits, the unit by magnitude", "[human_units]") {
  CHECK(human_duration_ns(1) == "1 ns");
  CHECK(human_duration_ns(999) == "999 ns");
  CHECK(human_duration_ns(2346) == "2.35 us");
  CHECK(human_duration_ns(23'460) == "23.5 us");
  CHECK(human_duration_ns(234'600) == "235 us");
  CHECK(human_duration_ns(14'100'000) == "14.1 ms");
  CHECK(human_duration_ns(1.2e9) == "1.20 s");
  CHECK(human_duration_ns(3600e9) == "3600 s");
}

TEST_CASE("human_duration_ns: a value that rounds up to 1000 takes the next unit", "[human_units]") {
  CHECK(human_duration_ns(999.7) == "1.00 us");
  CHECK(human_duration_ns(999'600) == "1.00 ms");
  CHECK(human_duration_ns(9'996) == "10.0 us");
}

TEST_CASE("human_duration_ns: nothing measured reads as a dash", "[human_units]") {
  CHECK(human_duration_ns(0) == "-");
  CHECK(human_duration_ns(-5) == "-");
  CHECK(human_duration_ns(std::numeric_limits<double>::quiet_NaN()) == "-");
  CHECK(human_duration_ns(std::numeric_limits<double>::infinity()) == "-");
}

}  // namespace
}  // namespace kforge

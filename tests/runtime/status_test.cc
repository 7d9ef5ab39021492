// Status and StatusOr: errors are values that carry their code and message unchanged.
#include <catch2/catch.hpp>

#include "runtime/status.h"

using namespace kforge;

TEST_CASE("Status: default is ok and prints as ok") {
  Status s;
  CHECK(s.ok());
  CHECK(s.to_string() == "ok");
}

TEST_CASE("Status: an error keeps its code and message") {
  Status s = invalid_argument("bad token at column 3");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.to_string() == "invalid_argument: bad token at column 3");
}

TEST_CASE("StatusOr: holds either a value or an error, never an ok status without a value") {
  StatusOr<int> v = 42;
  REQUIRE(v.ok());
  CHECK(*v == 42);
  StatusOr<int> e = not_found("no such size 'numel9'");
  CHECK_FALSE(e.ok());
  CHECK(e.status().code() == StatusCode::kNotFound);
  // Building from an ok Status is a programming error; it must not masquerade as success.
  StatusOr<int> bogus = Status();
  CHECK_FALSE(bogus.ok());
  CHECK(bogus.status().code() == StatusCode::kInternal);
}

namespace {
Status fails_at(int step, int* reached) {
  for (int i = 0; i < 3; ++i) {
    *reached = i;
    KFORGE_RETURN_IF_ERROR(i == step ? out_of_range("step " + std::to_string(i)) : Status());
  }
  return Status();
}
}  // namespace

TEST_CASE("KFORGE_RETURN_IF_ERROR returns the first error and stops") {
  int reached = -1;
  Status s = fails_at(1, &reached);
  CHECK(reached == 1);
  CHECK(s.message() == "step 1");
  CHECK(fails_at(7, &reached).ok());
  CHECK(reached == 2);
}

// The kforge CLI: exit codes and messages are part of its interface (scripts depend on them).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <sstream>

#include "runtime/version.h"
#include "tools/cli.h"

using namespace kforge;

namespace {
struct Run {
  int rc;
  std::string out, err;
};
Run run(std::vector<std::string> args) {
  args.insert(args.begin(), "kforge");
  std::ostringstream out, err;
  int rc = run_cli(args, out, err);
  return {rc, out.str(), err.str()};
}
}  // namespace

TEST_CASE("kforge --version prints one line starting with the release") {
  Run r = run({"--version"});
  CHECK(r.rc == 0);
  CHECK(r.out.rfind(std::string("kforge ") + KFORGE_VERSION_STRING + " (wire protocol 1, format 1)", 0) == 0);
  CHECK(r.err.empty());
}

TEST_CASE("kforge version --json is machine-readable") {
  Run r = run({"version", "--json"});
  REQUIRE(r.rc == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["kforge_version"] == KFORGE_VERSION_STRING);
  CHECK(j["wire_version"] == 1);
}

TEST_CASE("unknown commands and options are usage errors (exit 2) that name the culprit") {
  Run r = run({"frobnicate"});
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown command 'frobnicate'"));
  CHECK_THAT(r.err, Catch::Contains("usage: kforge"));
  r = run({"env", "--yaml"});
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown option '--yaml' for 'env'"));
  r = run({"selftest", "opencl"});
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown selftest 'opencl'"));
  CHECK(run({}).rc == 2);
}

TEST_CASE("kforge env --json reports every section, whether or not a GPU is present") {
  Run r = run({"env", "--json"});
  REQUIRE(r.rc == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["cpu_environment"]["backend"] == "cpu");
  CHECK(j["cpu_environment"]["key"].get<std::string>().size() == 32);
  REQUIRE(j.contains("cuda_driver"));
  if (!j["cuda_driver"]["available"].get<bool>()) {
    CHECK_FALSE(j["cuda_driver"]["error"].get<std::string>().empty());
  }
  // This machine has the CUDA toolkit, so NVRTC must be found here.
  CHECK(j["nvrtc"]["available"] == true);
  CHECK(j.contains("cache_dir"));
}

TEST_CASE("kforge selftest cuda: PASS with a GPU, exit 3 with a reason without one") {
  Run r = run({"selftest", "cuda"});
  if (r.rc == 0) {
    CHECK_THAT(r.out, Catch::Contains("selftest cuda: PASS"));
  } else {
    CHECK(r.rc == 3);
    CHECK_THAT(r.err, Catch::Contains("UNAVAILABLE"));
  }
}

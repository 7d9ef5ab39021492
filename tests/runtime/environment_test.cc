// Environment: the half of a cache key that is not the signature. These tests pin down what the
// cache relies on: every field takes part in the key, the encoding is canonical and stable, a
// decoded environment is the one that was encoded, and a miss can be explained field by field.
#include <catch2/catch.hpp>

#include <sys/utsname.h>

#include <functional>
#include <set>
#include <utility>

#include "runtime/cuda_environment.h"
#include "runtime/environment.h"
#include "runtime/msgpack_codec.h"

using namespace kforge;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

Environment h200() {
  Environment e;
  e.backend = Backend::kCuda;
  e.arch = "sm_90";
  e.device_model = "NVIDIA H200";
  e.driver_version = 13000;
  e.nvrtc_version = 12080;
  e.compiler = "";
  e.torch_version = "2.9.0+cu130";
  return e;
}

Environment cpu() {
  Environment e;
  e.backend = Backend::kCpu;
  e.arch = "x86_64-avx2";
  e.device_model = "AMD EPYC 9654 96-Core Processor";
  e.compiler = "g++ 12.2.0";
  e.torch_version = "2.9.0+cpu";
  return e;
}

std::string bytes_of(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += static_cast<char>(c);
  return s;
}

}  // namespace

TEST_CASE("Environment: encode/decode round-trips exactly, for CUDA and CPU") {
  for (const Environment& e : {h200(), cpu(), Environment{}}) {
    const std::string bytes = e.encode();
    auto back = Environment::decode(bytes);
    REQUIRE(back.ok());
    CHECK(*back == e);
    CHECK(back->encode() == bytes);
    CHECK(back->key() == e.key());
  }
}

TEST_CASE("Environment: the encoding is pinned byte for byte (changing it invalidates every cache)") {
  // [format_version, backend, arch, device_model, driver_version, nvrtc_version, compiler, torch]
  Environment e = h200();
  e.torch_version = "2.9.0";
  std::string want = bytes_of({0x98, 0x01, 0x01, 0xa5}) + "sm_90" + bytes_of({0xab}) + "NVIDIA H200" +
                     bytes_of({0xcd, 0x32, 0xc8, 0xcd, 0x2f, 0x30, 0xa0, 0xa5}) + "2.9.0";
  CHECK(e.encode() == want);
  CHECK(e.key() == hash128(want));
  CHECK(kFormatVersion == 1);
}

TEST_CASE("Environment: the key changes when any single field changes") {
  // A field left out of the key would let a kernel built for one environment load in another.
  const std::vector<std::pair<const char*, std::function<void(Environment&)>>> mutations = {
      {"backend", [](Environment& e) { e.backend = Backend::kCpu; }},
      {"arch", [](Environment& e) { e.arch = "sm_100"; }},
      {"device_model", [](Environment& e) { e.device_model = "NVIDIA H100 80GB HBM3"; }},
      {"driver_version", [](Environment& e) { e.driver_version = 12080; }},
      {"nvrtc_version", [](Environment& e) { e.nvrtc_version = 12090; }},
      {"compiler", [](Environment& e) { e.compiler = "clang++ 14"; }},
      {"torch_version", [](Environment& e) { e.torch_version = "2.9.1+cu130"; }},
      {"format_version", [](Environment& e) { e.format_version = kFormatVersion + 1; }},
  };
  const Environment base = h200();
  std::set<SignatureId> keys{base.key()};
  for (const auto& [name, mutate] : mutations) {
    Environment e = base;
    mutate(e);
    INFO("field " << name);
    CHECK(e.key() != base.key());
    CHECK(e != base);
    CHECK(e.differences(base).size() == 1);
    keys.insert(e.key());
  }
  CHECK(keys.size() == mutations.size() + 1);
  // Moving text between two string fields must not collide either.
  Environment a = base, b = base;
  a.arch = "sm_90";
  a.device_model = "X";
  b.arch = "sm_90X";
  b.device_model = "";
  CHECK(a.key() != b.key());
}

TEST_CASE("Environment: differences() lists exactly the mismatching fields, in field order") {
  const Environment entry = h200();
  CHECK(entry.differences(entry).empty());

  Environment host = entry;
  host.driver_version = 12080;
  CHECK_THAT(host.differences(entry), Equals(std::vector<std::string>{"driver_version: 12080 != 13000"}));

  host = entry;
  host.backend = Backend::kCpu;
  host.arch = "sm_80";
  host.nvrtc_version = 12040;
  host.compiler = "g++ \"12\"";
  host.torch_version = "";
  host.format_version = 2;
  CHECK_THAT(host.differences(entry),
             Equals(std::vector<std::string>{
                 "backend: cpu != cuda",
                 "arch: \"sm_80\" != \"sm_90\"",
                 "nvrtc_version: 12040 != 12080",
                 "compiler: \"g++ \\\"12\\\"\" != \"\"",
                 "torch_version: \"\" != \"2.9.0+cu130\"",
                 "format_version: 2 != 1",
             }));

  host = entry;
  host.device_model = "NVIDIA H100\n";
  CHECK_THAT(host.differences(entry),
             Equals(std::vector<std::string>{"device_model: \"NVIDIA H100\\x0a\" != \"NVIDIA H200\""}));
}

TEST_CASE("Environment: to_string names every field") {
  CHECK(h200().to_string() ==
        "backend=cuda arch=\"sm_90\" device_model=\"NVIDIA H200\" driver_version=13000 "
        "nvrtc_version=12080 compiler=\"\" torch_version=\"2.9.0+cu130\" format_version=1");
}

TEST_CASE("Environment: the nested codec form is byte-identical to encode()") {
  // Manifests embed environments; an embedded one must hash like a stand-alone one.
  const Environment e = cpu();
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  codec::pack(pk, e);
  CHECK(std::string(buf.data(), buf.size()) == e.encode());

  msgpack::object_handle oh = msgpack::unpack(buf.data(), buf.size());
  auto back = codec::read_environment(codec::Reader(oh.get(), "manifest.environment"));
  REQUIRE(back.ok());
  CHECK(*back == e);
}

TEST_CASE("Environment: decode rejects malformed input with a reason naming the field") {
  const std::string good = h200().encode();

  SECTION("truncated at every byte offset") {
    for (size_t n = 0; n < good.size(); ++n) {
      auto r = Environment::decode(std::string_view(good).substr(0, n));
      INFO("prefix of " << n << " bytes");
      CHECK_FALSE(r.ok());
    }
  }
  SECTION("a field of the wrong type") {
    // driver_version as the string "13000"
    std::string bad = bytes_of({0x98, 0x01, 0x01, 0xa5}) + "sm_90" + bytes_of({0xab}) + "NVIDIA H200" +
                      bytes_of({0xa5}) + "13000" + bytes_of({0xcd, 0x2f, 0x30, 0xa0, 0xa5}) + "2.9.0";
    auto r = Environment::decode(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == "environment.driver_version: expected integer, got string");
  }
  SECTION("an unknown backend") {
    std::string bad = good;
    bad[2] = 0x02;
    auto r = Environment::decode(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == "environment.backend: value 2 outside [0, 1]");
  }
  SECTION("a negative driver version") {
    std::string bad = bytes_of({0x98, 0x01, 0x01, 0xa5}) + "sm_90" + bytes_of({0xa0, 0xff, 0x00, 0xa0, 0xa0});
    auto r = Environment::decode(bad);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Contains("environment.driver_version: value -1 outside"));
  }
  SECTION("wrong arity, and a newer format with a different layout") {
    std::string short_env = bytes_of({0x97, 0x01, 0x01, 0xa0, 0xa0, 0x00, 0x00, 0xa0});
    auto r = Environment::decode(short_env);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == "environment: expected 8 elements, got 7");

    std::string future = bytes_of({0x99, 0x02, 0x01, 0xa0, 0xa0, 0x00, 0x00, 0xa0, 0xa0, 0xc0});
    r = Environment::decode(future);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() ==
          "environment: environment format version 2 is not readable by this build (format version 1)");
  }
  SECTION("not an array, trailing bytes, empty input") {
    CHECK_FALSE(Environment::decode(bytes_of({0xa3}) + "abc").ok());
    CHECK_FALSE(Environment::decode(good + bytes_of({0x00})).ok());
    CHECK_FALSE(Environment::decode("").ok());
  }
  SECTION("an over-long string") {
    Environment e = h200();
    e.device_model.assign(kMaxEnvironmentString + 1, 'x');
    CHECK_FALSE(Environment::decode(e.encode()).ok());
  }
}

TEST_CASE("cpu_host_environment: describes this host's CPU backend and leaves the compiler to the worker") {
  const Environment e = cpu_host_environment("2.9.0+cpu");
  struct utsname u {};
  REQUIRE(uname(&u) == 0);
  CHECK(e.backend == Backend::kCpu);
  CHECK(e.arch.rfind(u.machine, 0) == 0);
#if defined(__x86_64__)
  // Some ISA level is always present on the x86-64 hosts kforge supports.
  CHECK((e.arch == "x86_64-avx512f" || e.arch == "x86_64-avx2" || e.arch == "x86_64-sse4.2"));
#endif
  CHECK(e.driver_version == 0);
  CHECK(e.nvrtc_version == 0);
  CHECK(e.compiler.empty());
  CHECK(e.torch_version == "2.9.0+cpu");
  CHECK(e.format_version == kFormatVersion);
  CHECK(e.device_model.size() <= kMaxEnvironmentString);
  // Stable within the host: the same call gives the same key.
  CHECK(cpu_host_environment("2.9.0+cpu").key() == e.key());
  auto back = Environment::decode(e.encode());
  REQUIRE(back.ok());
  CHECK(*back == e);
}

TEST_CASE("parse_cuda_arch reads what cuda_arch_name writes, and nothing else", "[environment]") {
  int major = 0, minor = 0;
  CHECK(parse_cuda_arch("sm_90", major, minor));
  CHECK((major == 9 && minor == 0));
  CHECK(parse_cuda_arch("sm_100", major, minor));
  CHECK((major == 10 && minor == 0));
  CHECK(parse_cuda_arch("sm_86", major, minor));
  CHECK((major == 8 && minor == 6));
  for (auto [ma, mi] : {std::pair{7, 5}, std::pair{9, 0}, std::pair{12, 1}}) {
    REQUIRE(parse_cuda_arch(cuda_arch_name(ma, mi), major, minor));
    CHECK((major == ma && minor == mi));
  }
  for (const char* bad : {"", "sm_", "sm_9", "compute_90", "x86_64-avx2", "sm_90a", "sm_9x"}) {
    INFO(bad);
    CHECK_FALSE(parse_cuda_arch(bad, major, minor));
  }
}

// The CPU import policy: what a candidate's shared object may import before it can ever be
// dlopen'ed into a user's process. Objects are compiled here by the host's C++ compiler; the
// reader must also survive any bytes at all (truncated, mutated, hostile), answering with errors.
#include <catch2/catch.hpp>

#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "search_daemon/worker/cpu_symbol_policy.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

using TempDir = kforge::test_support::TempDir;

std::string compile_shared_object(const std::string& source, const std::string& extra_flags = "") {
  TempDir t{"kforge-symbol-policy"};
  const fs::path src = t.path / "k.cc", so = t.path / "k.so", log = t.path / "log";
  std::ofstream(src) << source;
  const std::string cmd = "c++ -std=c++17 -O2 -shared -fPIC -o " + so.string() + " " + src.string() + " " +
                          extra_flags + " >" + log.string() + " 2>&1";
  INFO(cmd);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    FAIL(ss.str());
  }
  std::ifstream in(so, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> imports_of(const std::string& image) {
  StatusOr<std::vector<std::string>> bad = forbidden_imports(image);
  INFO(bad.status().to_string());
  REQUIRE(bad.ok());
  return *bad;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

constexpr const char* kMathKernel = R"(
#include <math.h>
#include <string.h>
extern "C" void softplus(const float* x, float* y, long n, double* d) {
  for (long i = 0; i < n; ++i) y[i] = log1pf(expf(x[i])) + tanhf(x[i]) * sqrtf(fabsf(x[i]));
  d[0] = pow(d[1], d[2]) + erf(d[3]) + fmod(d[4], 3.0);
  memcpy(d + 5, d, 5 * sizeof(double));
}
)";

// A small object whose copies the robustness tests mangle.
const std::string& small_object() {
  static const std::string image = compile_shared_object(kMathKernel);
  return image;
}

}  // namespace

TEST_CASE("symbol policy: a kernel that uses only math and mem* imports nothing forbidden") {
  CHECK(imports_of(small_object()).empty());
}

TEST_CASE("symbol policy: a kernel that starts a thread imports the thread start, directly or via libstdc++") {
  SECTION("pthread_create") {
    const std::vector<std::string> bad = imports_of(compile_shared_object(R"(
#include <pthread.h>
static void* work(void* p) { *(int*)p = 1; return nullptr; }
extern "C" void run(int* out) { pthread_t t; pthread_create(&t, nullptr, work, out); pthread_join(t, nullptr); }
)"));
    CHECK(bad == std::vector<std::string>{"pthread_create", "pthread_join"});
  }
  SECTION("std::thread") {
    // libstdc++ starts the thread (std::thread::_M_start_thread), so that is the import, along
    // with operator new for the thread's state.
    const std::vector<std::string> bad = imports_of(compile_shared_object(R"(
#include <thread>
extern "C" void run(int* out) { std::thread t([out] { *out = 1; }); t.join(); }
)", "-pthread"));
    CHECK(contains(bad, "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE"));
    CHECK(contains(bad, "_Znwm"));
    CHECK(std::is_sorted(bad.begin(), bad.end()));
    CHECK(std::adjacent_find(bad.begin(), bad.end()) == bad.end());
  }
}

TEST_CASE("symbol policy: a kernel that prints imports printf (or the puts it became)") {
  const std::vector<std::string> bad = imports_of(compile_shared_object(R"(
#include <stdio.h>
extern "C" void hello(int x) { printf("hello %d\n", x); puts("bye"); }
)"));
  CHECK((contains(bad, "printf") || contains(bad, "puts")));
}

TEST_CASE("symbol policy: a weak reference counts like any other, since ld.so binds it when it can") {
  const std::vector<std::string> bad = imports_of(compile_shared_object(R"(
extern "C" int system(const char*) __attribute__((weak));
extern "C" int maybe(const char* c) { return system ? system(c) : 0; }
)"));
  CHECK(bad == std::vector<std::string>{"system"});
}

TEST_CASE("symbol policy: a library other than libc, libm, libstdc++ and libgcc_s is reported as needed") {
  TempDir t{"kforge-symbol-policy"};
  const fs::path dep = t.path / "libkforge_test_dep.so";
  const std::string cmd = "echo 'extern \"C\" int dep() { return 1; }' | c++ -x c++ -shared -fPIC "
                          "-Wl,-soname,libkforge_test_dep.so.1 -o " + dep.string() + " -";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::vector<std::string> bad = imports_of(compile_shared_object(
      "extern \"C\" int dep(); extern \"C\" int f() { return dep(); }", "-L" + t.path.string() + " -lkforge_test_dep"));
  CHECK(bad == std::vector<std::string>{"dep", "needs libkforge_test_dep.so.1"});
}

TEST_CASE("symbol policy: the allowed set holds the math library and mem*, sorted") {
  const std::vector<std::string>& allowed = allowed_cpu_imports();
  CHECK(std::is_sorted(allowed.begin(), allowed.end()));
  for (const char* name : {"expf", "exp", "sqrtf", "tanhf", "sincosf", "memcpy", "memset", "memmove", "__stack_chk_fail"}) {
    CHECK(contains(allowed, name));
  }
  for (const char* name : {"malloc", "free", "pthread_create", "fopen", "printf", "dlopen", "system", "fork"}) {
    CHECK(!contains(allowed, name));
  }
}

TEST_CASE("symbol policy: every truncation of a real object is an error, never a crash") {
  const std::string& image = small_object();
  size_t errors = 0;
  for (size_t n = 0; n < image.size(); ++n) {
    if (!forbidden_imports(std::string_view(image).substr(0, n)).ok()) ++errors;
  }
  // The section headers sit at the end of the file, so every prefix loses some of them.
  CHECK(errors == image.size());
}

TEST_CASE("symbol policy: random bytes and randomly mutated objects give answers, never crashes") {
  std::mt19937_64 rng(20240607);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 200; ++i) {
    std::string noise(static_cast<size_t>(rng() % 4096), '\0');
    for (char& c : noise) c = static_cast<char>(byte(rng));
    if (i % 2 == 0 && noise.size() >= 4) std::memcpy(noise.data(), ELFMAG, SELFMAG);
    CHECK(!forbidden_imports(noise).ok());
  }
  const std::string& image = small_object();
  size_t ok = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = image;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      // Mostly the headers, where the offsets live; sometimes anywhere.
      const size_t where = rng() % 4 == 0 ? rng() % m.size() : (rng() % 2 == 0 ? rng() % 64 : m.size() - 1 - rng() % 2048);
      m[where] = static_cast<char>(byte(rng));
    }
    const auto s = forbidden_imports(m);
    if (s.ok()) {
      ++ok;
    } else {
      CHECK(!s.status().message().empty());   // a refusal always says why
    }
  }
  // Both outcomes occur: flips that miss what the policy reads leave an allowed object, flips in
  // the headers make one that is refused. A loop where one side never happened would prove less.
  INFO(ok << " of 3000 mutants were still readable");
  CHECK(ok > 0);
  CHECK(ok < 3000);
}

TEST_CASE("symbol policy: a symbol table shortened in its section header cannot hide an import") {
  // The loader reads DT_SYMTAB and resolves whatever the relocations name; cutting the section
  // header's sh_size to the null symbol alone would hide every import from a section-only reader.
  std::string image = compile_shared_object(R"(
#include <stdlib.h>
extern "C" void* grab(size_t n) { return malloc(n); }
)");
  REQUIRE(contains(imports_of(image), "malloc"));
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  bool patched = false;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    const size_t at = eh.e_shoff + i * sizeof(Elf64_Shdr);
    std::memcpy(&sh, image.data() + at, sizeof sh);
    if (sh.sh_type != SHT_DYNSYM) continue;
    sh.sh_size = sizeof(Elf64_Sym);
    std::memcpy(image.data() + at, &sh, sizeof sh);
    patched = true;
  }
  REQUIRE(patched);
  StatusOr<std::vector<std::string>> bad = forbidden_imports(image);
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("relocation"));
}

TEST_CASE("symbol policy: objects that are not ELF64 shared objects for x86-64 or aarch64 are errors") {
  std::string image = small_object();
  SECTION("an executable") {
    image[offsetof(Elf64_Ehdr, e_type)] = ET_EXEC;
  }
  SECTION("another machine") {
    image[offsetof(Elf64_Ehdr, e_machine)] = static_cast<char>(EM_RISCV);
  }
  SECTION("big-endian") {
    image[EI_DATA] = ELFDATA2MSB;
  }
  SECTION("32-bit") {
    image[EI_CLASS] = ELFCLASS32;
  }
  StatusOr<std::vector<std::string>> bad = forbidden_imports(image);
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::StartsWith("not a readable ELF64 shared object"));
}

// Cache location rules and the safety checks on the directory kernels are loaded from.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "cache/cache_dir.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
namespace fs = std::filesystem;

namespace {

EnvLookup table(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

using TempDir = kforge::test_support::TempDir;

}  // namespace

TEST_CASE("CacheDir: KFORGE_CACHE_DIR wins, then XDG_CACHE_HOME, then HOME") {
  auto r = CacheDir::resolve_path(table({{"KFORGE_CACHE_DIR", "/a/b"}, {"XDG_CACHE_HOME", "/x"}, {"HOME", "/h"}}));
  REQUIRE(r.ok());
  CHECK(r->path == "/a/b");
  CHECK(r->source == "KFORGE_CACHE_DIR");
  r = CacheDir::resolve_path(table({{"XDG_CACHE_HOME", "/x"}, {"HOME", "/h"}}));
  REQUIRE(r.ok());
  CHECK(r->path == "/x/kforge");
  r = CacheDir::resolve_path(table({{"HOME", "/h"}}));
  REQUIRE(r.ok());
  CHECK(r->path == "/h/.cache/kforge");
  // Empty and relative XDG values are ignored, as the XDG spec says.
  r = CacheDir::resolve_path(table({{"XDG_CACHE_HOME", "rel"}, {"HOME", "/h"}, {"KFORGE_CACHE_DIR", ""}}));
  REQUIRE(r.ok());
  CHECK(r->path == "/h/.cache/kforge");
  // ... but an empty KFORGE_CACHE_DIR is said, not silently the default.
  CHECK(r->warning == "KFORGE_CACHE_DIR is set but empty; using /h/.cache/kforge (from HOME)");
  r = CacheDir::resolve_path(table({{"HOME", "/h"}}));
  REQUIRE(r.ok());
  CHECK(r->warning.empty());
}

TEST_CASE("CacheDir: a relative KFORGE_CACHE_DIR is a configuration error, not a guess") {
  auto r = CacheDir::resolve_path(table({{"KFORGE_CACHE_DIR", "cache"}}));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("KFORGE_CACHE_DIR must be an absolute path"));
}

TEST_CASE("CacheDir: open creates the directory and its parents, the directory itself 0700") {
  TempDir t{"kforge-cache-test"};
  fs::path p = t.path / "deep" / "er" / "kforge";
  auto d = CacheDir::open(p.string());
  REQUIRE(d.ok());
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(CacheDir::open(p.string() + "/").ok());  // idempotent, trailing slash tolerated
}

TEST_CASE("CacheDir: a symbolic link is refused even if it points to a good directory") {
  TempDir t{"kforge-cache-test"};
  fs::create_directory(t.path / "real");
  fs::permissions(t.path / "real", fs::perms::owner_all, fs::perm_options::replace);
  fs::create_directory_symlink(t.path / "real", t.path / "link");
  auto d = CacheDir::open((t.path / "link").string());
  REQUIRE_FALSE(d.ok());
  CHECK_THAT(d.status().message(), Catch::Contains("symbolic link"));
}

TEST_CASE("CacheDir: a group- or world-writable directory is refused with the fix") {
  TempDir t{"kforge-cache-test"};
  fs::path p = t.path / "open";
  fs::create_directory(p);
  fs::permissions(p, fs::perms::all, fs::perm_options::replace);
  auto d = CacheDir::open(p.string());
  REQUIRE_FALSE(d.ok());
  CHECK_THAT(d.status().message(), Catch::Contains("writable by group or others (mode 0777)"));
  CHECK_THAT(d.status().message(), Catch::Contains("chmod 700"));
}

TEST_CASE("CacheDir: a regular file at the path is refused") {
  TempDir t{"kforge-cache-test"};
  fs::path p = t.path / "file";
  { FILE* f = std::fopen(p.c_str(), "w"); REQUIRE(f); std::fclose(f); }
  auto d = CacheDir::open(p.string());
  REQUIRE_FALSE(d.ok());
  CHECK_THAT(d.status().message(), Catch::Contains("not a directory"));
}

TEST_CASE("CacheDir: a directory owned by another user is refused") {
  TempDir t{"kforge-cache-test"};
  fs::path p = t.path / "theirs";
  fs::create_directory(p);
  fs::permissions(p, fs::perms::owner_all, fs::perm_options::replace);
  if (::geteuid() != 0) {
    // Only root can hand a directory to another user; as non-root use a root-owned one.
    struct stat st {};
    REQUIRE(::stat("/", &st) == 0);
    REQUIRE(st.st_uid == 0);
    p = "/";
  } else {
    REQUIRE(::chown(p.c_str(), 65534, 65534) == 0);
  }
  auto d = CacheDir::open(p.string() == "/" ? std::string("/") : p.string());
  REQUIRE_FALSE(d.ok());
  CHECK_THAT(d.status().message(), Catch::Contains("owned by uid"));
}

// TempDir: a fresh private directory for one test, removed with everything in it at scope exit.
// Every test that needs a scratch directory uses this one.
//
//   TempDir t("kforge-worker-test");
//   write(t.path / "cache" / "x");
//   Store::open(t / "cache");                  // the path of a name inside, as a string
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kforge::test_support {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "kforge-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(std::string_view name) const { return (path / name).string(); }
};

}  // namespace kforge::test_support

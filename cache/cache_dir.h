// Where the kernel cache lives, and the checks that make it safe to load code from there.
//
//   StatusOr<CacheDir> dir = CacheDir::open(CacheDir::resolve_path(EnvLookup::process()));
//   if (!dir.ok()) log_once(dir.status());        // names the path and what was wrong
//
// Location: $KFORGE_CACHE_DIR, else $XDG_CACHE_HOME/kforge, else ~/.cache/kforge. open() creates
// the directory with mode 0700 and refuses a directory that is a symbolic link, is owned by
// another user, or is writable by group or others: kernels in it are run inside users' processes.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/status.h"

namespace kforge {

// Reads environment variables; tests pass their own table instead of mutating the process's.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup process_env();

class CacheDir {
 public:
  // Which path the rules above choose; `source` says which rule (for `kforge env`).
  struct Resolved {
    std::string path;
    std::string source;   // "KFORGE_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "passwd"
    // Non-empty when a variable was set to something that is no value ("KFORGE_CACHE_DIR is set
    // but empty; using ..."): the caller prints it once.
    std::string warning;
  };
  static StatusOr<Resolved> resolve_path(const EnvLookup& env);

  // Creates missing parents (0755, as mkdir -p) and the cache directory itself (0700), then
  // checks ownership, type and permissions of the final directory.
  static StatusOr<CacheDir> open(const std::string& path);

  const std::string& path() const noexcept { return path_; }

 private:
  static StatusOr<Resolved> resolve_default(const EnvLookup& env);   // the rules after KFORGE_CACHE_DIR
  explicit CacheDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace kforge

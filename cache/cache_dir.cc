#include "cache/cache_dir.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kforge {

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<CacheDir::Resolved> CacheDir::resolve_path(const EnvLookup& env) {
  auto nonempty = [&](const char* name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && !v->empty()) return v;
    return std::nullopt;
  };
  if (auto v = nonempty("KFORGE_CACHE_DIR")) {
    if ((*v)[0] != '/') return invalid_argument("KFORGE_CACHE_DIR must be an absolute path, got '" + *v + "'");
    return Resolved{*v, "KFORGE_CACHE_DIR", ""};
  }
  StatusOr<Resolved> r = resolve_default(env);
  if (r.ok() && env("KFORGE_CACHE_DIR")) {   // set, but to nothing: say so, then the default
    r->warning = "KFORGE_CACHE_DIR is set but empty; using " + r->path + " (from " + r->source + ")";
  }
  return r;
}

StatusOr<CacheDir::Resolved> CacheDir::resolve_default(const EnvLookup& env) {
  auto nonempty = [&](const char* name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && !v->empty()) return v;
    return std::nullopt;
  };
  // The XDG spec says relative values are invalid and must be ignored.
  if (auto v = nonempty("XDG_CACHE_HOME"); v && (*v)[0] == '/') return Resolved{*v + "/kforge", "XDG_CACHE_HOME", ""};
  if (auto v = nonempty("HOME"); v && (*v)[0] == '/') return Resolved{*v + "/.cache/kforge", "HOME", ""};
  struct passwd pw {};
  struct passwd* result = nullptr;
  char buf[4096];
  if (getpwuid_r(geteuid(), &pw, buf, sizeof buf, &result) == 0 && result != nullptr && pw.pw_dir != nullptr &&
      pw.pw_dir[0] == '/') {
    return Resolved{std::string(pw.pw_dir) + "/.cache/kforge", "passwd", ""};
  }
  return not_found("no cache directory: set KFORGE_CACHE_DIR (neither XDG_CACHE_HOME nor HOME is set)");
}

namespace {

Status errno_status(const std::string& what, const std::string& path, int err) {
  return unavailable(what + " " + path + ": " + std::strerror(err));
}

Status make_parents(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("cannot create", prefix, errno);
  }
  return Status();
}

}  // namespace

StatusOr<CacheDir> CacheDir::open(const std::string& path) {
  if (path.empty() || path[0] != '/') return invalid_argument("cache directory must be an absolute path, got '" + path + "'");
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  KFORGE_RETURN_IF_ERROR(make_parents(p));
  if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST) return errno_status("cannot create cache directory", p, errno);
  struct stat st {};
  // lstat, not stat: a symlink planted at the cache path could point kforge at someone else's code.
  if (::lstat(p.c_str(), &st) != 0) return errno_status("cannot stat cache directory", p, errno);
  if (S_ISLNK(st.st_mode)) return invalid_argument("cache directory " + p + " is a symbolic link; refusing to use it");
  if (!S_ISDIR(st.st_mode)) return invalid_argument("cache path " + p + " exists and is not a directory");
  if (st.st_uid != ::geteuid()) {
    return invalid_argument("cache directory " + p + " is owned by uid " + std::to_string(st.st_uid) +
                            ", not by this user (uid " + std::to_string(::geteuid()) + ")");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return invalid_argument("cache directory " + p + " is writable by group or others (mode " + mode +
                            "); run: chmod 700 " + p);
  }
  return CacheDir(p);
}

}  // namespace kforge

#include "tools/install_layout.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "runtime/file_io.h"

namespace kforge {

namespace {

constexpr const char kHookPrefix[] = "libkforge_hook-torch";
constexpr const char kHookSuffix[] = ".so";

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::vector<std::string> InstallLayout::hook_torch_versions() const {
  std::vector<std::string> out;
  DIR* d = ::opendir(hook_dir.c_str());
  if (d == nullptr) return out;
  const size_t pre = std::strlen(kHookPrefix), suf = std::strlen(kHookSuffix);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > pre + suf && name.compare(0, pre, kHookPrefix) == 0 &&
        name.compare(name.size() - suf, suf, kHookSuffix) == 0) {
      out.push_back(name.substr(pre, name.size() - pre - suf));
    }
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string InstallLayout::hook_for(const std::string& torch_major_minor) const {
  return hook_dir + "/" + kHookPrefix + torch_major_minor + kHookSuffix;
}

StatusOr<InstallLayout> find_install_layout(const std::string& exe) {
  std::string self = exe;
  if (self.empty()) {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return not_found(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
    self.assign(buf, static_cast<size_t>(n));
  }
  InstallLayout l;
  l.kforge = self;
  const std::string dir = dir_of(self);
  const std::string parent = dir_of(dir);
  if (base_of(dir) == "bin") {
    l.bundle = true;
    l.root = parent;
    l.kforged = parent + "/bin/kforged";
    l.worker = parent + "/bin/kforge-worker";
    l.preload = parent + "/lib/libkforge_preload.so";
    l.hook_dir = parent + "/lib";
    l.share = parent + "/share/kforge";
  } else if (base_of(dir) == "tools") {
    l.root = parent;
    l.kforged = parent + "/search_daemon/kforged";
    l.worker = parent + "/search_daemon/kforge-worker";
    l.preload = parent + "/interposer/libkforge_preload.so";
    l.hook_dir = parent + "/interposer/hook";
    l.share = parent + "/share/kforge";
  } else {
    return not_found("cannot tell where kforge's files are: " + self +
                     " is neither <bundle>/bin/kforge nor <build>/tools/kforge");
  }
  return l;
}

}  // namespace kforge

// Where kforge's own files are, found from the running `kforge` executable, so the commands that
// start programs and daemons (`run`, `warm`, `demo`, `doctor`) need no configuration.
//
//   StatusOr<InstallLayout> l = find_install_layout();
//   if (!l.ok()) { err << l.status().message(); return 125; }
//   setenv("LD_PRELOAD", l->preload.c_str(), 1);
//
// Two layouts, told apart by the executable's directory:
//   bundle      <root>/bin/kforge: <root>/lib/libkforge_preload.so, the hooks in <root>/lib,
//               <root>/bin/kforged, <root>/bin/kforge-worker, <root>/share/kforge
//   build tree  <build>/tools/kforge: <build>/interposer/libkforge_preload.so, the hooks in
//               <build>/interposer/hook, <build>/search_daemon/{kforged,kforge-worker},
//               <build>/share/kforge (copied there by CMake)
// Every path is absolute; a file that is missing is reported by the command that needs it (a
// bundle without a daemon can still `run --no-daemon`).
#pragma once

#include <string>
#include <vector>

#include "runtime/status.h"

namespace kforge {

struct InstallLayout {
  std::string root;         // the bundle root or the build directory
  bool bundle = false;
  std::string kforge;       // this executable
  std::string kforged;
  std::string worker;       // kforge-worker
  std::string preload;      // libkforge_preload.so
  std::string hook_dir;     // where libkforge_hook-torch<major>.<minor>.so are
  std::string share;        // share/kforge: the demo model, documentation

  // The torch versions ("2.11") this install has a hook for, from the hook files' names.
  std::vector<std::string> hook_torch_versions() const;
  // <hook_dir>/libkforge_hook-torch<version>.so
  std::string hook_for(const std::string& torch_major_minor) const;
};

// From /proc/self/exe (or `exe` when given, for tests).
StatusOr<InstallLayout> find_install_layout(const std::string& exe = "");

}  // namespace kforge

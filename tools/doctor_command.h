// `kforge doctor`: checks that this host can run kforge, one line per check, each problem with the
// exact fix. Nothing is changed on the host: the cache directory is only probed (a temporary file
// created and removed), the daemon only asked for its status.
//
//   kforge [--cache-dir DIR] doctor [--json] [--python P] [--endpoint E]
//
// Checks, in order:
//   install      kforge's own files (tools/install_layout.h): kforged, kforge-worker, the preload
//                shim (an ELF shared object), the hook directory and its hooks
//   python       P (else $KFORGE_PYTHON, else python3: the workers' default, workers.python) runs
//                and imports torch
//   torch hook   a hook for that torch's <major>.<minor> exists, and the shim loads it into that
//                python (LD_PRELOAD, as `kforge run` does); else the torch versions there are hooks for
//   worker       libkforge_worker-torch<major>.<minor>.so loads into that python (as the launcher does)
//   cuda / gpu / nvrtc / cupti
//                the driver (version), each GPU (name, arch), NVRTC (version), CUPTI (in the torch
//                process, as the worker finds it); no GPU is a warning: CPU backend only
//   cache dir    the directory the hook would use (--cache-dir, $KFORGE_CACHE_DIR, ...): exists or
//                can be created, owned by this user, 0700, no symbolic link, writable, free space
//   daemon       the endpoint the hook would use (--endpoint, $KFORGE_DAEMON_ENDPOINT, the default):
//                a kforged answers, its version is this kforge's, its cache directory is the hook's;
//                no daemon is a warning
// Text: "ok    <check>: <detail>", "warn  ...", "FAIL  ..." and a "      fix: ..." line under each
// problem. --json: an array of {"check", "status" ("ok", "warn", "fail"), "detail", "fix"}.
// Exit: 0 nothing failed (warnings allowed), 1 something failed, 2 usage error.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kforge {

// `args` are the arguments after "doctor"; the global --cache-dir arrives as KFORGE_CACHE_DIR.
int run_doctor_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kforge

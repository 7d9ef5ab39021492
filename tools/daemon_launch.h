// Finding the host's kforged, or starting one, for `kforge run`, `warm` and `demo`.
//
//   StatusOr<DaemonHandle> d = ensure_daemon(layout, {.endpoint = e, .cache_dir = c}, err);
//   if (!d.ok()) ...;                    // names what failed, with the tail of the daemon's log
//   d->status                            // its `kforge status --json` object
//
// Note [Starting the daemon]
// One daemon serves a host (it holds <endpoint>.lock). If one answers a status request at the
// endpoint, it is used as it is, whatever it was started with; its cache directory is compared
// with the one the program will use (a mismatch means the program never loads what it finds, so
// the caller says so). Otherwise kforge starts `kforged` from its own install, in a new session
// (a terminal's Ctrl-C for the program does not reach it), stdin from /dev/null, its log appended
// to <state dir>/kforged.log, and waits until it answers (at most `start_timeout_ms`). It keeps
// running after the program exits: it is the host's daemon, and what it searches for is what the
// next run gets. A daemon that exits while starting is reported with its exit status and the last
// lines of its log. Only ipc:// endpoints are started here: a tcp:// daemon is another host's.
#pragma once

#include <nlohmann/json.hpp>
#include <sys/types.h>

#include <ostream>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "tools/install_layout.h"

namespace kforge {

struct DaemonRequest {
  std::string endpoint;          // empty: the hooks' default endpoint
  std::string server_key;        // tcp:// only
  std::string cache_dir;         // empty: the cache rules; passed to a daemon started here
  std::string state_dir;         // empty: the daemon's default; passed to a daemon started here
  std::vector<std::string> extra_args;   // more kforged arguments for a daemon started here
  int start_timeout_ms = 20000;
};

struct DaemonHandle {
  std::string endpoint;
  pid_t pid = 0;
  bool started_here = false;
  std::string log_path;          // when started here
  nlohmann::json status;         // the daemon's status reply
};

// The endpoint the hooks use by default ($KFORGE_DAEMON_ENDPOINT, else the XDG rule).
std::string resolve_daemon_endpoint(const std::string& given);

// The daemon's status, or why none answered (kUnavailable: none at the endpoint).
StatusOr<nlohmann::json> query_daemon_status(const std::string& endpoint, const std::string& server_key,
                                             int timeout_ms);

StatusOr<DaemonHandle> ensure_daemon(const InstallLayout& layout, const DaemonRequest& request, std::ostream& err);

// The default state directory kforged uses ($XDG_STATE_HOME/kforge, ~/.local/state/kforge).
std::string default_state_dir();

}  // namespace kforge

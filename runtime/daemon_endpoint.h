// Where kforged listens and hooks and the CLI connect, and the one check that makes an ipc://
// socket safe to use. Shared by the hook, the daemon and the CLI, so all three agree.
//
//   std::string e = default_daemon_endpoint(getenv("XDG_RUNTIME_DIR") ?: "", getuid());
//   // ipc:///run/user/1000/kforge/daemon.sock, else ipc:///tmp/kforge-1000/daemon.sock
//   KFORGE_RETURN_IF_ERROR(secure_ipc_directory(e));   // before bind or connect
#pragma once

#include <string>
#include <string_view>

#include "runtime/status.h"

namespace kforge {

// The default endpoint for the given XDG_RUNTIME_DIR (empty or relative: unset) and uid.
std::string default_daemon_endpoint(std::string_view xdg_runtime_dir, unsigned uid);

// For an ipc:// endpoint, makes sure the socket's directory is this user's and private: creates it
// (0700) if missing, and refuses a symlink, another owner, or any group/other permission, naming the
// path and the problem (and the fix). Otherwise a local user who created, say, /tmp/kforge-<uid>
// first would receive a process's reports and inputs, or serve it kernels. tcp:// endpoints are not
// checked here (they need CURVE keys).
Status secure_ipc_directory(std::string_view endpoint);

// TCP. kforged serves tcp:// only with CURVE (daemon.curve_secret_key_file); a client (the hook,
// `kforge status`) then needs the daemon's CURVE public key, 40 z85 characters, which
// `kforged --curve-keygen FILE` prints, and makes a throwaway key pair of its own per connection.
//
// Whether `key` is a z85 CURVE key (40 characters of the Z85 alphabet). The message names `what`
// ("KFORGE_DAEMON_SERVER_KEY").
Status check_curve_key(std::string_view key, std::string_view what);
// A client's endpoint and server key together (`server_key` as given: surrounding whitespace, a
// file's newline, is dropped): tcp:// needs a valid key, ipc:// takes none. Returns the key to use,
// empty for ipc://; the error names `key_what`.
StatusOr<std::string> client_server_key(std::string_view endpoint, std::string_view server_key, std::string_view key_what);

}  // namespace kforge

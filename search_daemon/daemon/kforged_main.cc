// kforged: the search daemon. Thin main(): configuration, the proposers, the Daemon.
//
//   kforged [--config FILE] [--set SECTION.KEY=VALUE]... [--endpoint E] [--http 127.0.0.1:7878] ...
//   kforged --help | --help-config
//   kforged --curve-keygen FILE     a CURVE key pair for tcp://: the secret key to FILE (0600), the
//                                   public key (clients' KFORGE_DAEMON_SERVER_KEY) to stdout
//
// Exit status: 0 after SIGTERM/SIGINT, 2 for a bad configuration (one line names the key), 1 when
// it cannot start (the reason on stderr).
#include <cstdio>
#include <string>
#include <vector>

#include "cache/cache_dir.h"
#include "runtime/transport.h"
#include "search_daemon/daemon/daemon.h"
#include "search_daemon/daemon/daemon_config.h"
#include "search_daemon/daemon/proposer_set.h"

namespace {

constexpr const char* kUsage = R"(usage: kforged [--config FILE] [options]
  --config FILE            TOML configuration (also $KFORGE_DAEMON_CONFIG); kforged --help-config lists every key
  --set SECTION.KEY=VALUE  any key, overriding the file
  --endpoint E             ROUTER endpoint for hooks and the CLI (default: the hooks' default)
  --http HOST:PORT         /metrics and /api/status on 127.0.0.1 ("" = off)
  --cache-dir DIR          the kernel cache      --state-dir DIR   search journals
  --devices LIST           cpu,cuda:0,... or auto   --cpu-slots N   CPU workers
  --strategy S             mcts, greedy or random   --max-evaluations N   per signature
  --templates on|off       --llm on|off              --min-calls N   --seed N
  --worker PATH            kforge-worker            --worker-python PATH   python3 with torch
  --log-format text|json
kforged --curve-keygen FILE  writes a new CURVE secret key to FILE (0600, never overwritten) and
                             prints its public key: serve tcp:// with daemon.curve_secret_key_file=FILE,
                             clients set KFORGE_DAEMON_SERVER_KEY (hooks) or --server-key (kforge status)
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--help-config") {
      std::fputs(kforge::daemon::daemon_config_reference().c_str(), stdout);
      return 0;
    }
  }
  if (!args.empty() && args[0] == "--curve-keygen") {
    if (args.size() != 2) {
      std::fprintf(stderr, "kforged: --curve-keygen takes one argument, the secret key file to create\n");
      return 2;
    }
    kforge::StatusOr<std::string> public_key = kforge::transport::generate_curve_key_file(args[1]);
    if (!public_key.ok()) {
      std::fprintf(stderr, "kforged: %s\n", public_key.status().message().c_str());
      return 1;
    }
    std::printf("%s\n", public_key->c_str());
    return 0;
  }
  kforge::StatusOr<kforge::daemon::DaemonConfig> config = kforge::daemon::load_daemon_config(args, kforge::process_env());
  if (!config.ok()) {
    std::fprintf(stderr, "kforged: %s\n", config.status().message().c_str());
    return 2;
  }
  kforge::StatusOr<kforge::daemon::ProposerSet> proposers = kforge::daemon::make_proposers(
      *config, [format = config->log_format](const std::string& line) {
        kforge::daemon::write_log_line(format, "info", line);
      });
  if (!proposers.ok()) {
    std::fprintf(stderr, "kforged: %s\n", proposers.status().message().c_str());
    return 2;
  }
  kforge::daemon::Daemon daemon(*config, proposers->pointers());
  if (kforge::Status s = daemon.start(); !s.ok()) {
    daemon.log("error", "cannot start: " + s.message());
    return 1;
  }
  return daemon.run();
}

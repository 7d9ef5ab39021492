// kforged's configuration: a TOML file and flags (flags win), every bad value one clear error that
// names the key, and defaults that follow the hooks' (the same endpoint without any setting).
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "search_daemon/daemon/daemon_config.h"

using namespace kforge;
using namespace kforge::daemon;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kEnv = env_of({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"HOME", "/home/u"}});

}  // namespace

TEST_CASE("daemon config: no file, no flags: the hooks' endpoint, events beside it, XDG state") {
  StatusOr<DaemonConfig> c = load_daemon_config({}, kEnv);
  REQUIRE(c.ok());
  CHECK(c->endpoint == "ipc:///run/user/1000/kforge/daemon.sock");
  CHECK(c->events_endpoint == "ipc:///run/user/1000/kforge/events.sock");
  CHECK(c->state_dir == "/home/u/.local/state/kforge");
  CHECK(c->strategy == "mcts");
  CHECK(c->devices == std::vector<std::string>{"auto"});
  CHECK(c->templates);
  CHECK_FALSE(c->llm.enabled);
  // KFORGE_DAEMON_ENDPOINT moves both, as it moves the hooks.
  StatusOr<DaemonConfig> moved = load_daemon_config({}, env_of({{"KFORGE_DAEMON_ENDPOINT", "ipc:///tmp/k/d.sock"}, {"HOME", "/h"}}));
  REQUIRE(moved.ok());
  CHECK(moved->endpoint == "ipc:///tmp/k/d.sock");
  CHECK(moved->events_endpoint == "ipc:///tmp/k/events.sock");
}

TEST_CASE("daemon config: a TOML file sets every section, and flags override it") {
  const char* toml = R"(
[daemon]
http = "127.0.0.1:7878"
state_dir = "/var/lib/kforge"
log_format = "json"
[workers]
devices = ["cuda:0", "cpu"]
cpu_slots = 2
[search]
strategy = "greedy"
max_evaluations_per_signature = 12
min_time_share = 0.01
[llm]
enabled = true
api = "anthropic"
base_url = "http://127.0.0.1:9000"
model = "m"
api_key_env = "ANTHROPIC_API_KEY"
max_cost_usd = 5
)";
  StatusOr<DaemonConfig> c = parse_daemon_config(toml, "k.toml", kEnv);
  INFO(c.status().to_string());
  REQUIRE(c.ok());
  CHECK(c->http == "127.0.0.1:7878");
  CHECK(c->state_dir == "/var/lib/kforge");
  CHECK(c->devices == std::vector<std::string>{"cuda:0", "cpu"});
  CHECK(c->cpu_slots == 2);
  CHECK(c->strategy == "greedy");
  CHECK(c->max_evaluations_per_signature == 12);
  CHECK(c->min_time_share == Approx(0.01));
  CHECK(c->llm.enabled);
  CHECK(c->llm.api == "anthropic");
  CHECK(c->llm.api_key_env == "ANTHROPIC_API_KEY");
  CHECK(c->llm.max_cost_usd == Approx(5));
  // The resolved configuration names the key's variable, never a key.
  CHECK_THAT(c->to_string(), Catch::Contains("llm.api_key_env=\"ANTHROPIC_API_KEY\""));

  StatusOr<DaemonConfig> f = load_daemon_config({"--strategy", "random", "--set", "search.max_evaluations_per_signature=3",
                                                 "--devices", "cpu", "--llm", "off"}, kEnv);
  REQUIRE(f.ok());
  CHECK(f->strategy == "random");
  CHECK(f->max_evaluations_per_signature == 3);
  CHECK(f->devices == std::vector<std::string>{"cpu"});
}

TEST_CASE("daemon config: workers.priority is idle unless a host that only searches says normal") {
  // Note [Idle workers]: by default the search never competes with the serving processes.
  StatusOr<DaemonConfig> d = load_daemon_config({}, kEnv);
  REQUIRE(d.ok());
  CHECK(d->worker_priority == eval::WorkerPriority::kIdle);
  CHECK_THAT(d->to_string(), Catch::Contains("workers.priority=\"idle\""));
  StatusOr<DaemonConfig> t = parse_daemon_config("[workers]\npriority = \"normal\"\n", "k.toml", kEnv);
  INFO(t.status().to_string());
  REQUIRE(t.ok());
  CHECK(t->worker_priority == eval::WorkerPriority::kNormal);
  StatusOr<DaemonConfig> f = load_daemon_config({"--set", "workers.priority=normal"}, kEnv);
  REQUIRE(f.ok());
  CHECK(f->worker_priority == eval::WorkerPriority::kNormal);
  StatusOr<DaemonConfig> bad = load_daemon_config({"--set", "workers.priority=low"}, kEnv);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("workers.priority=\"low\": expected idle or normal"));
}

TEST_CASE("daemon config: every bad value is one error naming the key and what is allowed") {
  struct Bad {
    const char* toml;
    const char* says;
  };
  const Bad bad = GENERATE(
      Bad{"[search]\nstrategy = \"annealing\"", "search.strategy: expected one of mcts, greedy, random"},
      Bad{"[search]\nmax_evaluations_per_signature = -3", "search.max_evaluations_per_signature: expected a non-negative integer"},
      Bad{"[search]\nmax_evaluations_per_signature = 0", "search.max_evaluations_per_signature: expected a value in [1,"},
      Bad{"[search]\nstrategi = \"mcts\"", "search.strategi: unknown key"},
      Bad{"[daemon]\nhttp = \"0.0.0.0:80\"", "only 127.0.0.1, ::1 or localhost"},
      Bad{"[daemon]\nendpoint = \"http://x\"", "daemon.endpoint: expected an ipc:// or tcp:// endpoint"},
      Bad{"[daemon]\nendpoint = \"tcp://0.0.0.0:5555\"\nevents_endpoint = \"tcp://0.0.0.0:5556\"", "needs CURVE keys"},
      Bad{"[workers]\ndevices = [\"gpu0\"]", "expected cpu, cuda:<N> or auto"},
      Bad{"[llm]\nenabled = true\nmodel = \"m\"", "llm.base_url: required when llm.enabled"},
      Bad{"[llm]\napi_key_env = \"sk-abc123-secret\"", "the NAME of an environment variable"},
      Bad{"[proposers]\ntemplates = false", "no proposer is enabled"},
      Bad{"[search\nstrategy = 1", "k.toml:1:"},
      // TOML syntax errors name the key (or the section) as well as the line and column.
      Bad{"[search]\nmin_calls = 12x\n", "k.toml:2:"},
      Bad{"[search]\nmin_calls = 12x\n", ": search.min_calls: "},
      Bad{"[daemon]\nlog_format = text\n", ": daemon.log_format: "},
      Bad{"[workers]\ncpu_slots = 1\n[search]\nseed = \"unterminated\n", "k.toml:4:"},
      Bad{"[workers]\ncpu_slots = 1\n[search]\nseed = \"unterminated\n", ": search.seed: "},
      Bad{"[search\nstrategy = 1", "k.toml:1:8: [search: "},
      Bad{"strategy = \"mcts\"", "expected a [section]"});
  StatusOr<DaemonConfig> c = parse_daemon_config(bad.toml, "k.toml", kEnv);
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains(bad.says));
}

TEST_CASE("daemon config: bad flags name the flag, and a missing file is an error naming it") {
  StatusOr<DaemonConfig> a = load_daemon_config({"--strategy", "tabu"}, kEnv);
  REQUIRE_FALSE(a.ok());
  CHECK_THAT(a.status().message(), Catch::Contains("--strategy search.strategy=\"tabu\": expected one of"));
  StatusOr<DaemonConfig> b = load_daemon_config({"--frobnicate", "1"}, kEnv);
  REQUIRE_FALSE(b.ok());
  CHECK_THAT(b.status().message(), Catch::Contains("unknown option --frobnicate"));
  StatusOr<DaemonConfig> c = load_daemon_config({"--config", "/nonexistent/kforged.toml"}, kEnv);
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains("/nonexistent/kforged.toml"));
}

TEST_CASE("daemon config: the reference lists every key with its default, and parses back") {
  const std::string ref = daemon_config_reference();
  for (const char* key : {"[daemon]", "endpoint", "[workers]", "cpu_slots", "[search]", "c_puct", "[llm]", "api_key_env"}) {
    CHECK_THAT(ref, Catch::Contains(key));
  }
  // Every line is a comment or a section: the reference itself is a valid (empty) configuration.
  CHECK(parse_daemon_config(ref, "reference", kEnv).ok());
}

// fy-forwarder: the guest side of ADR-0034. See docs/fy-forwarder.md.
#include <sys/resource.h>
#include <uv.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/args.h"
#include "core/log.h"
#include "core/loop.h"
#include "forwarder/config.h"
#include "forwarder/control_client.h"
#include "forwarder/forwarder.h"

namespace {

constexpr const char* kUsage = R"(usage: fy-forwarder --config FILE [--log-level LEVEL]
       fy-forwarder --check-config --config FILE
       fy-forwarder --probe [--control PATH | --config FILE] [--timeout-ms N]
                    [--require-bridge]

fy-forwarder stamps every connection a container or a walled VM principal
makes to foldyard's egress proxy with who made it (ADR-0034), and is the only
way to the proxy from inside the VM. It runs as root.

  --config FILE      the TOML configuration (docs/fy-forwarder.md)
  --check-config     validate the configuration and exit
  --log-level LEVEL  debug, info, warn, error or off (overrides log_level)
  --probe            the liveness probe: ask a running forwarder for its
                     status line; exit 0 when it is serving, 1 when not
  --control PATH     the control socket to probe (default: the config's, or
                     /run/fy-forwarder/control.sock)
  --timeout-ms N     how long the probe waits for an answer (default 2000)
  --require-bridge   the probe also fails unless the bridge listener serves
                     a namespace now (bridge=listening): for a supervisor that
                     knows bridge containers are running
  --help, --version

Signals: SIGTERM/SIGINT stop (live connections are reset), SIGHUP re-reads
the key file. Exit codes: 0 stopped cleanly or probe ok; 1 probe not serving
or a runtime failure; 2 usage or configuration error; 3 cannot serve at start
(key, listeners, control socket).
)";

int usage_error(const std::string& msg) {
  fprintf(stderr, "fy-forwarder: %s\nRun fy-forwarder --help for usage.\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, control, log_level;
  bool check = false, probe = false, require_bridge = false;
  int timeout_ms = 2000;
  fy::ArgParser p;
  p.stop("--help,-h")
      .stop("--version")
      .value("--config", &config_path, "a file")
      .value("--control", &control, "a path")
      .value("--log-level", &log_level, "a level")
      .value(
          "--timeout-ms",
          [&](const std::string& v) -> fy::ArgParser::Refusal {
            timeout_ms = atoi(v.c_str());
            if (timeout_ms <= 0) return "--timeout-ms must be a positive number";
            return std::nullopt;
          },
          "a number")
      .flag("--check-config", &check)
      .flag("--probe", &probe)
      .flag("--require-bridge", &require_bridge)
      .reject_positionals();
  fy::ParsedArgs args = p.parse(argc, argv);
  if (args.stopped_at == "--help") {
    fputs(kUsage, stdout);
    return 0;
  }
  if (args.stopped_at == "--version") {
    puts("fy-forwarder 0.1.0 (stamp format v=1)");
    return 0;
  }
  if (args.problem) {
    const fy::ArgProblem& e = *args.problem;
    switch (e.kind) {
      case fy::ArgProblem::Kind::needs_value:
        return usage_error(e.option + " needs " + e.message);
      case fy::ArgProblem::Kind::bad_value:
        return usage_error(e.message);
      case fy::ArgProblem::Kind::no_value:
      case fy::ArgProblem::Kind::unknown:
        return usage_error("unknown argument '" + e.option + "'");
    }
  }

  if (probe) {
    if (control.empty() && !config_path.empty()) {
      auto cfg = fy::fwd::load_config(config_path);
      if (!cfg) {
        fprintf(stderr, "fy-forwarder: %s\n", cfg.error().message.c_str());
        return 2;
      }
      control = cfg->control_socket;
    }
    if (control.empty()) control = "/run/fy-forwarder/control.sock";
    auto r = fy::fwd::control_query(control, "status", timeout_ms);
    if (!r) {
      printf("fail %s\n", r.error().message.c_str());
      return 1;
    }
    bool ok = r->rfind("ok ", 0) == 0;
    if (ok && require_bridge && r->find(" bridge=listening:") == std::string::npos) {
      // Serving what it can see, but no bridge namespace: with bridge
      // containers running, the forwarder cannot see theirs.
      size_t at = r->find(" bridge=");
      std::string state =
          at == std::string::npos ? "off" : r->substr(at + 8, r->find(' ', at + 8) - at - 8);
      printf("fail the bridge listener serves no namespace (bridge=%s): %s | %s\n", state.c_str(),
             state == "off" ? "no [bridge] is configured"
             : state.rfind("absent:never-found", 0) == 0
                 ? "no network namespace has appeared at [bridge] netns since the forwarder "
                   "started. If bridge containers are running, it cannot see their namespace: "
                   "check the path (rootless podman's own mount namespace is reached through "
                   "/proc/<pause pid>/root/<path>) and the unit's sandboxing (ProtectHome=yes "
                   "hides /run/user)"
                 : "there is no network namespace at [bridge] netns now (no bridge container "
                   "is running?)",
             r->c_str() + 3);
      return 1;
    }
    printf("%s\n", r->c_str());
    return ok ? 0 : 1;
  }

  if (config_path.empty()) return usage_error("--config FILE is required");
  auto cfg = fy::fwd::load_config(config_path);
  if (!cfg) {
    fprintf(stderr, "fy-forwarder: configuration refused:\n%s\n", cfg.error().message.c_str());
    return 2;
  }
  if (check) {
    printf("fy-forwarder: %s is valid\n", config_path.c_str());
    return 0;
  }
  fy::log::Level level = cfg->log_level;
  if (!log_level.empty()) {
    auto l = fy::log::parse_level(log_level);
    if (!l) return usage_error("--log-level must be debug, info, warn, error or off");
    level = *l;
  }
  fy::log::init("fy-forwarder", level);

  // Every connection holds two sockets and up to two pipes.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = 0;
  {
    fy::fwd::Forwarder fw(std::move(*cfg));
    if (auto r = fw.start(&loop); !r) {
      fy::log::error("cannot serve: {}", r.error().message);
      fw.stop();
      uv_run(&loop, UV_RUN_DEFAULT);
      rc = 3;
    } else {
      uv_run(&loop, UV_RUN_DEFAULT);
      if (!fw.stopping()) rc = 1;
      fy::log::info("stopped");
    }
    // Before the forwarder goes: no handle may outlive the memory it lives in.
    if (fy::uv::close_all_and_drain(&loop) != 0) fy::log::warn("the event loop did not close");
  }
  return rc;
}

// fy-dnsfwd: the guest's DNS forwarder (docs/fy-dnsfwd.md). Thin main: flags,
// config, the log file, signals; the loop is wall/dnsfwd/server.h's.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/loop.h"
#include "wall/dnsfwd/config.h"
#include "wall/dnsfwd/server.h"

namespace {

constexpr const char* kUsage =
    "usage: fy-dnsfwd --config FILE [--check] [--log-level LEVEL]\n"
    "       fy-dnsfwd --check-allow FILE\n"
    "       fy-dnsfwd --help | --version\n"
    "\n"
    "The guest's DNS forwarder: the machine wall redirects the walled principals'\n"
    "port 53 (udp and tcp) to it. It passes only well-formed standard queries for\n"
    "names the policy could allow (`allow`), bounds their size and rate per source,\n"
    "answers REFUSED for other names, drops what is not DNS, and writes one JSON\n"
    "line a query naming who asked. Runs as root (it joins the namespaces its\n"
    "[[listen]] entries name).\n"
    "\n"
    "  --config FILE      the TOML config (docs/fy-dnsfwd.md)\n"
    "  --check            read and check the config, then exit (0 = good)\n"
    "  --check-allow FILE read and check an allow file (allow_file's format), exit:\n"
    "                     0 good, 3 refused (each bad line as FILE:line)\n"
    "  --log-level LEVEL  diagnostics on stderr: debug, info (default), warn, error\n"
    "\n"
    "SIGHUP re-reads the config and its allow_file: the allow list, the rate and\n"
    "the limits change at once, queries in flight carry on; a bad config is\n"
    "refused and the running one kept (an error line says why).\n"
    "\n"
    "Exit: 0 stopped by SIGTERM/SIGINT or --check passed; 2 usage; 3 bad config;\n"
    "4 a listener or upstream could not be opened (nothing is served).\n";

uv_signal_t g_sigterm, g_sigint, g_sighup;
std::string g_config;

}  // namespace

int main(int argc, char** argv) {
  std::string config, check_allow;
  bool check = false;
  fy::log::Level level = fy::log::Level::info;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fputs(kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      puts("fy-dnsfwd 0.1");
      return 0;
    } else if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--check") {
      check = true;
    } else if (a == "--check-allow" && i + 1 < argc) {
      check_allow = argv[++i];
    } else if (a == "--log-level" && i + 1 < argc) {
      auto l = fy::log::parse_level(argv[++i]);
      if (!l) {
        fprintf(stderr, "✗ --log-level: '%s' is not one of debug, info, warn, error\n", argv[i]);
        return 2;
      }
      level = *l;
    } else {
      fprintf(stderr, "✗ unknown or incomplete option '%s' — see fy-dnsfwd --help\n", a.c_str());
      return 2;
    }
  }
  if (!check_allow.empty()) {
    // The allow file alone, with the daemon's own reader: what the guest's
    // install (fy-machine dns-allow's forced command) runs before it moves a
    // new list in, so a list the daemon would refuse on SIGHUP is never
    // installed.
    auto names = fy::dnsfwd::read_allow_file(check_allow);
    if (!names) {
      fprintf(stderr, "✗ %s\n", names.error().message.c_str());
      return 3;
    }
    printf("✓ %s: %zu allowed suffix(es)\n", check_allow.c_str(), names->size());
    return 0;
  }
  if (config.empty()) {
    fprintf(stderr, "✗ --config FILE is required — see fy-dnsfwd --help\n");
    return 2;
  }
  fy::log::init("fy-dnsfwd", level);
  auto cfg = fy::dnsfwd::read_config_file(config);
  if (!cfg) {
    fprintf(stderr, "✗ %s\n", cfg.error().message.c_str());
    return 3;
  }
  if (check) {
    printf("✓ %s: %zu listener(s), %zu upstream(s), %zu allowed suffix(es)\n", config.c_str(),
           cfg->listen.size(), cfg->upstream.size(), cfg->policy.allow.size());
    return 0;
  }
  int log_fd = 1;
  if (cfg->log != "-") {
    log_fd = open(cfg->log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (log_fd < 0) {
      fprintf(stderr, "✗ cannot open the query log %s: %s — make its directory, or log = \"-\"\n",
              cfg->log.c_str(), strerror(errno));
      return 4;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = 0;
  {
    fy::dnsfwd::Server srv(&loop, std::move(*cfg), log_fd);
    auto st = srv.start();
    if (!st) {
      fprintf(stderr, "✗ %s\n", st.error().message.c_str());
      srv.close();
      rc = 4;
    } else {
      uv_signal_init(&loop, &g_sigterm);
      uv_signal_init(&loop, &g_sigint);
      uv_signal_init(&loop, &g_sighup);
      g_sigterm.data = g_sigint.data = g_sighup.data = &srv;
      g_config = config;
      auto stop = [](uv_signal_t* s, int) {
        static_cast<fy::dnsfwd::Server*>(s->data)->close();
        uv_close(reinterpret_cast<uv_handle_t*>(&g_sigterm), nullptr);
        uv_close(reinterpret_cast<uv_handle_t*>(&g_sigint), nullptr);
        uv_close(reinterpret_cast<uv_handle_t*>(&g_sighup), nullptr);
      };
      uv_signal_start(&g_sigterm, stop, SIGTERM);
      uv_signal_start(&g_sigint, stop, SIGINT);
      uv_signal_start(&g_sighup, [](uv_signal_t* s, int) {
        auto* server = static_cast<fy::dnsfwd::Server*>(s->data);
        auto next = fy::dnsfwd::read_config_file(g_config);
        if (!next) {
          fy::log::error("reload refused, the running config kept: {}", next.error().message);
          return;
        }
        size_t n = next->policy.allow.size();
        double rate = next->policy.rate;
        std::string kept = server->reload(std::move(*next));
        fy::log::info("reloaded {}: {} allowed suffix(es), rate {}", g_config, n, rate);
        if (!kept.empty()) {
          fy::log::warn("reload: {} changed but is kept as it runs — restart fy-dnsfwd to apply it",
                        kept);
        }
      }, SIGHUP);
      fy::log::info("ready");
      uv_run(&loop, UV_RUN_DEFAULT);
      const auto& s = srv.stats();
      fy::log::info("stopped: forwarded {} answered {} refused {} malformed {} rate-limited {} "
                    "too-large {} upstream-timeouts {} upstream-bad {} upstream-tcp {}",
                    s.forwarded, s.answered, s.refused, s.malformed, s.rate_limited, s.too_large,
                    s.upstream_timeouts, s.upstream_bad, s.upstream_tcp);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  fy::uv::close_all_and_drain(&loop);
  return rc;
}

// fy-sockfilter: the gVisor socket filter (docs/fy-sockfilter.md).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/log.h"
#include "src/filter.h"
#include "src/probe.h"

namespace {

using namespace fy;

constexpr const char* kUsage = R"(usage: fy-sockfilter [OPTIONS] <upstream.sock> <listen.sock>
       fy-sockfilter --probe <filtered.sock> [--image IMAGE] [--runtime NAME]

Serves <listen.sock> in front of the podman API socket <upstream.sock> (one
whose default runtime is runsc): every request is parsed and re-emitted, every
container create has its runtime-selecting fields stripped, and the other
doors that create containers are refused (docs/fy-sockfilter.md).

Options:
  --config FILE       a TOML file with a [sockfilter] table (upstream, listen,
                      owner, group, mode, create_body_max_kib, body_max_mib,
                      request_timeout_ms, body_idle_timeout_ms, body_timeout_s,
                      max_head_kib, stats, log_level); the arguments override
                      its paths
  --stats SOCK        serve the counters on the unix socket SOCK (mode 0600):
                      each connection gets them as Prometheus text, e.g.
                      curl --unix-socket SOCK http://x/metrics
  --owner USER        chown the listening socket to USER (name or uid)
  --group GROUP       chgrp the listening socket to GROUP (name or gid)
  --mode OCTAL        the socket's mode (default 0660)
  --log-level LEVEL   debug, info (default), warn, error
  --probe SOCK        create a throwaway container through SOCK asking for
                      crun, inspect its runtime, remove it: exit 0 only when
                      the engine ran it under --runtime (default runsc-fy)
  --image IMAGE       the probe's image (default localhost/bb:1)
  --runtime NAME      the runtime the probe requires (default runsc-fy)
  -h, --help, --version

Exit status: 0 stopped by SIGTERM/SIGINT (or the probe passed); 1 the probe
failed; 2 usage or configuration error; 3 cannot listen at start.
)";

int usage_error(const std::string& msg) {
  fprintf(stderr, "fy-sockfilter: %s\nRun fy-sockfilter --help for usage.\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fy::sockfilter;
  Config cfg;
  std::vector<std::string> pos;
  std::string config_path, owner, group, mode, level, probe, stats, image = "localhost/bb:1",
                                                       runtime = "runsc-fy";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "-h" || a == "--help") {
      fputs(kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      puts("fy-sockfilter 0.1.0");
      return 0;
    } else if (a == "--config" || a == "--owner" || a == "--group" || a == "--mode" ||
               a == "--log-level" || a == "--probe" || a == "--image" || a == "--runtime" ||
               a == "--stats") {
      const char* v = next();
      if (!v) return usage_error(a + " needs a value");
      if (a == "--config") config_path = v;
      else if (a == "--owner") owner = v;
      else if (a == "--group") group = v;
      else if (a == "--mode") mode = v;
      else if (a == "--log-level") level = v;
      else if (a == "--probe") probe = v;
      else if (a == "--image") image = v;
      else if (a == "--stats") stats = v;
      else runtime = v;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error("unknown option " + a);
    } else {
      pos.push_back(a);
    }
  }
  if (!probe.empty()) {
    if (!pos.empty()) return usage_error("--probe takes no other arguments");
    fy::log::init("fy-sockfilter", fy::log::Level::info);
    return run_probe(probe, image, runtime);
  }
  if (!config_path.empty()) {
    auto c = load_config(config_path, cfg);
    if (!c) {
      fprintf(stderr, "fy-sockfilter: %s\n", c.error().message.c_str());
      return 2;
    }
    cfg = *c;
  }
  if (pos.size() == 2) {
    cfg.upstream = pos[0];
    cfg.listen = pos[1];
  } else if (!pos.empty() || cfg.upstream.empty() || cfg.listen.empty()) {
    fprintf(stderr, "usage: fy-sockfilter <upstream.sock> <listen.sock>\n");
    return 2;
  }
  if (!owner.empty()) {
    auto u = resolve_user(owner);
    if (!u) return usage_error(u.error().message);
    cfg.owner = *u;
  }
  if (!group.empty()) {
    auto g = resolve_group(group);
    if (!g) return usage_error(g.error().message);
    cfg.group = *g;
  }
  if (!mode.empty()) {
    char* end = nullptr;
    unsigned long m = strtoul(mode.c_str(), &end, 8);
    if (*end != 0 || m > 0777) return usage_error("--mode must be octal, e.g. 0660");
    cfg.mode = static_cast<unsigned>(m);
  }
  if (!level.empty()) cfg.log_level = level;
  if (!stats.empty()) cfg.stats = stats;
  auto lv = fy::log::parse_level(cfg.log_level);
  if (!lv) return usage_error("--log-level is one of debug, info, warn, error");
  fy::log::init("fy-sockfilter", *lv);
  return serve(cfg);
}

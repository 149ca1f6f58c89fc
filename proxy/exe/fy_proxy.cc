// fy-proxy: foldyard's host-side egress proxy. See docs/fy-proxy.md.
#include <signal.h>
#include <sys/resource.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "core/loop.h"
#include "proxy/config.h"
#include "proxy/server/server.h"

int main(int argc, char** argv) {
  auto config = fy::proxy::parse_args(argc, argv);
  if (!config) {
    if (config.error().code == fy::Errc::closed) {
      fputs(config.error().message.c_str(), stdout);
      return 0;
    }
    fprintf(stderr, "fy-proxy: %s\n", config.error().message.c_str());
    return 2;
  }
  fy::log::init("fy-proxy", config->log_level);
  signal(SIGPIPE, SIG_IGN);
  // Hold as many sockets as the hard limit allows; Server::start() fits
  // --max-connections into what this limit holds (and says so).
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlim_t soft = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      fy::log::warn("cannot raise the open-file limit from {} to the hard limit {}: {}",
                    static_cast<uint64_t>(soft), static_cast<uint64_t>(rl.rlim_max),
                    strerror(errno));
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = 0;
  {
    fy::proxy::Server server(&loop, *config);
    auto started = server.start();
    if (!started) {
      fy::log::error("{}", started.error().message);
      rc = started.error().code == fy::Errc::refused ? 3 : 1;
      fy::uv::close_all_and_drain(&loop);
      return rc;
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    fy::log::info("exited cleanly");
  }
  if (fy::uv::close_all_and_drain(&loop) != 0) fy::log::warn("event loop did not close cleanly");
  return rc;
}

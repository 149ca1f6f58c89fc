// fy-wall's command line: `fy-wall <command> <wall> [options]`. The whole
// program is run_cli so that main stays a line; it prints to the given
// streams and returns the exit code.
#pragma once

#include <cstdio>

namespace fy::wall {

// Exit codes, documented in --help and docs/fy-wall.md.
enum Exit : int {
  kExitOk = 0,            // done; status: every table present and as rendered
  kExitNotEnforcing = 1,  // status: a table is absent or differs
  kExitUsage = 2,         // unknown command, wall or option
  kExitBadInput = 3,      // a bad config or flag value
  kExitSystem = 4,        // the kernel, netlink, permissions, a missing cgroup
};

int run_cli(int argc, char** argv, FILE* out, FILE* err);

}  // namespace fy::wall

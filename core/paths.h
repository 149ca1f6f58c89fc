// Where the daemons keep their files by default, and making those
// directories on a machine where nothing exists yet.
//
// One rule for every binary and for scripts/run (scripts/serve asks
// fy-proxy --print-state-dir rather than repeating it): the state home is
// $XDG_STATE_HOME when it is an absolute path (the XDG spec says a relative
// one is ignored), else $HOME/.local/state, else the passwd entry's home
// directory + /.local/state. Under sudo, Debian's sudoers (env_reset) sets
// HOME to the target user's home and drops XDG_STATE_HOME, so `sudo
// scripts/run` and `sudo fy-netlog` both resolve to /root/.local/state.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "core/result.h"

namespace fy {

// The state home as above; empty when neither variable nor passwd names one.
std::string state_home();

// fy-proxy's default state directory: <state home>/foldyard/egress
// (/var/lib/foldyard/egress when there is no state home at all).
std::string default_proxy_state_dir();

// Makes `dir` and every missing parent; the last component gets `mode`,
// parents 0755 (as `mkdir -p` would; both under the umask). Returns the directories it made,
// outermost first (empty when all existed). A component that exists but is not a directory, or that
// cannot be made, is an Errc::io error whose message names that path and the reason; the caller
// adds the flag that picks another place.
Result<std::vector<std::string>> make_dirs(const std::string& dir, mode_t mode);

}  // namespace fy

// The environment fy-compose sends to the guest, computed on the host.
// Pure: no I/O; the caller passes the host's environment in.
//
// What is sent (wall-lifecycle-filter.md section 4, the seed's "The env"):
//   - the allow-list of _host_passthrough: TERM COLORTERM NO_COLOR FORCE_COLOR
//     LANG TZ WORKTREE WT_OFFSET and the prefixes LC_ COMPOSE_ PODMAN_ BUILDAH_
//     FOLDYARD_, minus any name declared in host.env (the secrets);
//   - the names [project].compose_env lists, even from host.env: each one
//     present is counted as a widening;
//   - what the host computed (COMPOSE_PROJECT_NAME, ...), then DOCKER_HOST and
//     CONTAINER_HOST, both set to the guest-side socket.
// What is never sent, whatever asks for it (host_only): the names that only
// describe the host: PATH HOME USER LOGNAME SHELL TMPDIR XDG_*, the engine
// connection (DOCKER_HOST CONTAINER_HOST CONTAINER_CONNECTION DOCKER_CONTEXT
// DOCKER_CONFIG DOCKER_CERT_PATH DOCKER_TLS_VERIFY CONTAINER_SSHKEY
// CONTAINER_PASSPHRASE), the containers config files (CONTAINERS_CONF*,
// CONTAINERS_REGISTRIES_CONF*, CONTAINERS_STORAGE_CONF) and REGISTRY_AUTH_FILE,
// plus PODMAN_COMPOSE_PROVIDER (the guest runs only the payload's client).
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::compose {

using Env = std::map<std::string, std::string>;

struct EnvInput {
  Env host;                             // the host's environment
  std::set<std::string> host_env_names; // names declared in host.env
  std::vector<std::string> compose_env; // [project].compose_env
  std::string guest_socket;             // unix:///... as the guest sees it
  Env computed;                         // set by the host (project name, ports...)
};

struct EnvPlan {
  Env env;                              // exactly what the request carries
  std::vector<std::string> widenings;   // compose_env names sent, in order
};

// True for a name that describes only the host and is never sent.
bool host_only(std::string_view name);

// Fails (invalid_argument) on an empty or non-unix guest socket, on a
// compose_env or computed name that is host-only, and on a name that is not a
// valid environment name.
Result<EnvPlan> plan_env(const EnvInput& in);

}  // namespace fy::compose

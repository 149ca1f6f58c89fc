// The request one fy-compose call sends, the stdin `python3 -I -` reads in
// the guest, and the answers read back. Pure: no I/O.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "env.h"

namespace fy::compose {

struct Request {
  std::vector<std::string> argv;   // podman-compose's arguments after -f/-p
  std::vector<std::string> files;  // absolute -f paths, as the guest resolves them
  std::string project;             // the project asked about (-p)
  Env env;                         // from plan_env
  std::string cwd;                 // absolute; must exist in the guest
  double wait_s = 6.0;             // how long the runner waits for a -f file
  std::string answer;              // "" (relay), "services" or "config"
};

std::string request_json(const Request& r);

// The whole stdin: the bootstrap, then one `_fy_boot(...)` call carrying the
// zip (base64, in 76-column lines), its size and sha256, and the request.
std::string guest_script(std::string_view bootstrap, std::string_view zip,
                         std::string_view zip_sha256, const Request& r);

// fy-machine's `ssh-target --json`: {"config": path, "host": alias, ...}.
struct SshTarget {
  std::string config;
  std::string host;
};
Result<SshTarget> parse_ssh_target(std::string_view json);

// The runner's answer line for `project`: the last line of a successful
// call's stdout, {"fy-compose-answer": kind, "project": p, "body": ...}.
// Refused when the kind or the project is not the one asked about (the guest
// is box-influenced: it may answer for another project). Returns the body as
// JSON text. Never call it on a failed call's stdout.
Result<std::string> parse_answer(std::string_view stdout_text, std::string_view kind,
                                 std::string_view project);

// `podman ps --format json` from the engine: the id of the one running
// container whose compose labels name `project` and `service`. Containers of
// any other project are ignored whatever their names say.
Result<std::string> pick_container(std::string_view ps_json, std::string_view project,
                                   std::string_view service);

std::string base64(std::string_view bytes, size_t line = 0);

}  // namespace fy::compose

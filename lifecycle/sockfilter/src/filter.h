// fy-sockfilter's event loop: a unix listener in front of the engine socket,
// one upstream connection per client connection. Each connection parses
// every request (llhttp, strict), asks route.h and rewrite.h what to do, and
// re-emits it with canonical framing; responses are relayed as they come,
// parsed only to find where they end and whether the engine switched to a raw
// stream (a 101, or a final response with no framing: attach without
// Upgrade). Requests are handled one at a time: the next one is parsed only
// after the engine has answered the last, so a hijacked connection never has
// a request the filter judged as HTTP in flight behind it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/result.h"

namespace fy::sockfilter {

struct Config {
  std::string upstream;                 // the engine's socket (runsc default)
  std::string listen;                   // the filtered socket the box holds
  std::optional<uid_t> owner;           // chown of the listener (default: unchanged)
  std::optional<gid_t> group;
  unsigned mode = 0660;
  uint64_t create_body_max = 1 << 20;   // bytes; a larger create body gets 413
  uint64_t body_max = 4ull << 30;       // other request bodies (build contexts, image loads): 413
  uint64_t request_timeout_ms = 30000;  // a head, or a create's body, must be whole by then: 408
  uint64_t body_idle_timeout_ms = 300000;  // other bodies: at most this long without a byte: 408
  uint64_t body_timeout_ms = 3600000;   // other bodies: whole within this from their head: 408
  std::string stats;                    // the counters' unix socket (0600); empty: none
  uint64_t max_head = 65536;            // bytes of a request head: 431 above
  std::string log_level = "info";
};

// Reads a TOML config file ([sockfilter] keys named like Config's members,
// see docs/fy-sockfilter.md). Every problem is reported, file:line:col.
Result<Config> load_config(const std::string& path, Config base);

// Resolves a user or group name (or a number).
Result<uid_t> resolve_user(const std::string& name);
Result<gid_t> resolve_group(const std::string& name);

// Binds the listener and serves until SIGTERM or SIGINT. Returns the exit
// code: 0 after a signal, 3 when the listener cannot be set up.
int serve(const Config& cfg);

}  // namespace fy::sockfilter

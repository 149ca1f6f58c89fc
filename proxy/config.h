// fy-proxy's start-up configuration: flags, optionally a TOML file
// (--config), defaults. Everything here is fixed for the life of the process;
// what changes live is the policy (policy/policy.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/result.h"

namespace fy::proxy {

struct Limits {
  size_t max_head_bytes = 64 * 1024;
  size_t max_headers = 100;
  uint32_t max_connections = 16384;
  uint64_t head_timeout_ms = 10'000;            // a started head must complete (408); also
                                                // a CONNECT's TLS setup, a blind tunnel's
                                                // first byte (server/deadline.h)
  uint64_t idle_timeout_ms = 60'000;            // keep-alive wait for the next request
  uint64_t connect_timeout_ms = 10'000;         // upstream connect (+ TLS) (504)
  uint64_t io_timeout_ms = 300'000;             // no byte either way during an exchange (504)
  uint64_t tunnel_idle_timeout_ms = 3'600'000;  // no byte either way in a tunnel
  uint64_t drain_timeout_ms = 10'000;   // SIGTERM: how long open work may finish
  uint64_t minter_timeout_ms = 30'000;  // a minter that has not answered is killed
};

struct Config {
  std::string listen = "127.0.0.1:8088";
  std::string admin = "127.0.0.1:0";  // "off" disables
  std::string state_dir;              // default: $XDG_STATE_HOME/foldyard/egress
  std::string policy_file;            // default: <state>/policy.toml (created in learn mode)
  bool policy_explicit = false;       // given by flag/config: never created, fails closed
  std::string netlog_file;            // default: <state>/logs/egress.jsonl
  uint64_t netlog_max_bytes = 5 * 1024 * 1024;
  int netlog_backups = 5;
  std::string port_file;
  std::string system_roots = "/etc/ssl/certs/ca-certificates.crt";
  std::string upstream_ca;  // extra PEM bundle trusted for origins
  std::string stamp_key_file;
  std::vector<std::pair<std::string, std::string>> resolve;  // host -> IP literal
  // "host:port" -> "ip:port": where to connect instead (tests, pinning)
  std::vector<std::pair<std::string, std::string>> connect_to;
  std::string host_env_file;      // the secrets of static/github-app rules: FY_INJECT_<SWITCH>=...
  std::string build_tokens_file;  // build secrets: {"tokens": {"<sha256>": "<expiry>"}}
  size_t cert_cache = 1024;
  uint64_t learn_window_ms = 3600 * 1000;  // first-start learn window
  log::Level log_level = log::Level::info;
  Limits limits;
};

// How many clients fit in the open-file limit (RLIMIT_NOFILE): one descriptor
// each, beyond a reserve kept back for everything else: stdio, the event loop,
// the listeners and their spares, the Network Log and its rotation, policy
// watches, admin requests, DNS lookups, credential minters (32 plus 1/16 of
// the limit). A client's origin takes a second descriptor when it dials; a
// dial that would eat into the reserve is answered 503
// (Server::descriptors_short), so idle clients can be held by the thousand
// and the proxy's own files never run short. Clients past `max_connections`
// are answered 503 while descriptors remain to answer them.
struct ConnectionBudget {
  uint32_t max_connections = 0;  // what the proxy admits: min(configured, what fits)
  uint64_t reserve = 0;          // descriptors kept back from clients
  uint64_t nofile_needed = 0;    // the open-file limit that would admit `configured`
  bool lowered = false;          // max_connections < configured
};
ConnectionBudget connection_budget(uint64_t nofile, uint32_t configured);

// Parses argv (and the --config file it names). On --help / --version the
// returned error has code Errc::closed and the text to print.
Result<Config> parse_args(int argc, char** argv);
std::string usage();

}  // namespace fy::proxy

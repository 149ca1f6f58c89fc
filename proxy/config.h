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
  uint64_t head_timeout_ms = 10'000;        // a started head must complete (408)
  uint64_t idle_timeout_ms = 60'000;        // keep-alive wait for the next request
  uint64_t connect_timeout_ms = 10'000;     // upstream connect (+ TLS) (504)
  uint64_t io_timeout_ms = 300'000;         // no byte either way during an exchange (504)
  uint64_t tunnel_idle_timeout_ms = 3'600'000;  // no byte either way in a tunnel
  uint64_t tls_handshake_timeout_ms = 10'000;
  uint64_t drain_timeout_ms = 10'000;       // SIGTERM: how long open work may finish
  uint64_t minter_timeout_ms = 30'000;      // a minter that has not answered is killed
};

struct Config {
  std::string listen = "127.0.0.1:8088";
  std::string admin = "127.0.0.1:0";  // "off" disables
  std::string state_dir;               // default: $XDG_STATE_HOME/foldyard/egress
  std::string policy_file;             // default: <state>/policy.toml (created in learn mode)
  bool policy_explicit = false;        // given by flag/config: never created, fails closed
  std::string netlog_file;             // default: <state>/logs/egress.jsonl
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

// Parses argv (and the --config file it names). On --help / --version the
// returned error has code Errc::closed and the text to print.
Result<Config> parse_args(int argc, char** argv);
std::string usage();

}  // namespace fy::proxy

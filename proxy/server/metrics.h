// Counters an operator reads at the admin endpoint (/metrics, Prometheus text
// format). Every degraded path bumps one. Loop thread only.
#pragma once

#include <cstdint>
#include <string>

#include "proxy/server/deadline.h"

namespace fy::proxy {

struct Metrics {
  // Connections.
  uint64_t connections_accepted = 0;
  uint64_t connections_refused_limit = 0;  // over --max-connections: answered 503
  uint64_t connections_closed_by_policy = 0;
  uint64_t accept_failures = 0;  // accept(2) failed (EMFILE...): accepting paused briefly
  uint64_t dials_out_of_files = 0;  // an origin dial found no descriptor left: 503
  // Requests by outcome.
  uint64_t requests = 0;            // every request head parsed (CONNECT included)
  uint64_t responses_forwarded = 0; // a response from the origin reached the client
  uint64_t refused_allowlist = 0;   // 403 by the allowlist
  uint64_t refused_claim = 0;       // 403: Host names another host
  uint64_t would_block = 0;         // observe/learn: would have been refused
  uint64_t bad_requests = 0;        // 400/431/501/505 answered by the proxy
  uint64_t head_timeouts = 0;       // 408
  // Deadlines that ran out, by deadline.h's phase (fy_timeouts_total{phase}).
  uint64_t timeouts[kPhaseCount] = {};
  uint64_t upstream_errors = 0;     // 502/504 or a failed tunnel
  uint64_t tunnels = 0;             // passthrough and opaque tunnels opened
  uint64_t upgrades = 0;            // 101 Switching Protocols relayed
  // Bytes (after TLS).
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  // TLS.
  uint64_t tls_client_handshakes = 0;
  uint64_t tls_client_handshake_failures = 0;
  uint64_t tls_origin_handshakes = 0;
  uint64_t tls_origin_verify_failures = 0;
  // Policy.
  uint64_t reloads = 0;
  uint64_t reload_failures = 0;
  // Credentials (issue 3).
  uint64_t injected = 0;
  uint64_t mint_failures = 0;   // requests answered 502 for a failed mint
  uint64_t held = 0;            // dummies answered 401
  uint64_t scoped_out = 0;      // credentials not for who asked: answered 401 ([scope])
  uint64_t overlaps = 0;        // answered 502 for overlapping rules
  uint64_t replays = 0;         // re-issued after a 401
  uint64_t builds = 0;          // connections that proved a build secret
  uint64_t proxy_auth_challenges = 0;  // 407s
  // Stamps (ADR-0034).
  uint64_t stamps_valid = 0;
  uint64_t stamps_invalid = 0;
  uint64_t stamps_replayed = 0;
  uint64_t unattributed = 0;
  uint64_t refused_unattributed = 0;  // attribution = "require"
  uint64_t stamp_key_reloads = 0;     // a reload installed a changed key
  uint64_t stamp_key_reload_failures = 0;  // a reload could not read the key: old one kept
};

}  // namespace fy::proxy

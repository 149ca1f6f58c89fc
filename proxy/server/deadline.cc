#include "proxy/server/deadline.h"

namespace fy::proxy {

Deadline next_deadline(const ConnTimes& t, const Limits& lim) {
  if (t.deferred) return {Phase::deferred, 0};
  Deadline d;
  auto consider = [&](Phase p, uint64_t at) {
    if (d.phase == Phase::none || at < d.at_ms) d = {p, at};
  };
  if (t.attempt_start) consider(Phase::next_address, t.attempt_start + kAttemptMs);
  switch (t.mode) {
    case ConnMode::http:
      if (t.dial_start) consider(Phase::connect, t.dial_start + lim.connect_timeout_ms);
      if (t.exchange) {
        // The exchange's silence clock starts at the connect and when a
        // credential arrives (both touch last_io).
        if (!t.waiting_credential && !t.dial_start)
          consider(Phase::exchange, t.last_io + lim.io_timeout_ms);
      } else if (t.head_start) {
        consider(Phase::head, t.head_start + lim.head_timeout_ms);
      } else {
        consider(Phase::idle, t.last_io + lim.idle_timeout_ms);
      }
      break;
    case ConnMode::hello:
      if (t.connect_port == 443)
        consider(Phase::hello, t.setup_start + lim.head_timeout_ms);
      else
        consider(Phase::opaque_probe, t.setup_start + kOpaqueSilenceMs);
      break;
    case ConnMode::handshake:
      consider(Phase::handshake, t.setup_start + lim.head_timeout_ms);
      break;
    case ConnMode::tunnel:
      if (t.dial_start) consider(Phase::connect, t.dial_start + lim.connect_timeout_ms);
      if (t.blind_waiting && t.origin_ready)
        consider(Phase::first_bytes, t.origin_ready + lim.head_timeout_ms);
      consider(Phase::tunnel_idle, t.last_io + lim.tunnel_idle_timeout_ms);
      break;
    case ConnMode::lingering:
      consider(Phase::linger, t.mode_start + kLingerMs);
      break;
  }
  return d;
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::none: return "none";
    case Phase::deferred: return "deferred";
    case Phase::next_address: return "next_address";
    case Phase::connect: return "connect";
    case Phase::exchange: return "exchange";
    case Phase::head: return "head";
    case Phase::idle: return "idle";
    case Phase::hello: return "hello";
    case Phase::opaque_probe: return "opaque_probe";
    case Phase::handshake: return "handshake";
    case Phase::first_bytes: return "first_bytes";
    case Phase::tunnel_idle: return "tunnel_idle";
    case Phase::linger: return "linger";
  }
  return "?";
}

}  // namespace fy::proxy

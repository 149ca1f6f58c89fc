// Every wait of a client connection and the deadline that bounds it, in one
// table. Connection::arm_timer() asks next_deadline() when its one timer must
// fire; handle_timer() asks again when it fires and acts on the phase named.
// Pure: no loop, no I/O (tests/unit/proxy/deadline_test.cc). docs/fy-proxy.md,
// "Deadlines", lists the same rows for the operator.
//
//   state      wait                                   deadline                       phase
//   any        work queued for the next loop turn     at once                        deferred
//   dialling   this address, while others remain      attempt + 2 s                  next_address
//   dialling   DNS + connect (+ origin TLS)           dial start + --connect-timeout connect
//   http       an exchange: any byte either way       last byte + --io-timeout       exchange
//              (not while a credential is minted: the store ends that within
//              --minter-timeout; not while dialling: `connect` bounds that)
//   http       a request head that has started        its first byte + --head-timeout head
//   http       the next request (none started)        last byte + --idle-timeout     idle
//   hello      after a CONNECT to :443, its first     the 200 + --head-timeout       hello
//              bytes (a ClientHello, or HTTP)
//   hello      the same on another port: silence      the 200 + 1 s                  opaque_probe
//              means a server-speaks-first protocol (then: a blind tunnel)
//   handshake  the client's TLS handshake             the 200 + --head-timeout       handshake
//   tunnel     a blind tunnel's first byte from the   origin connected +             first_bytes
//              origin (passthrough, opaque)           --head-timeout
//   tunnel     any byte either way                    last byte + --tunnel-idle      tunnel_idle
//   lingering  the client's EOF after an answer       answer + 2 s                   linger
#pragma once

#include <cstdint>

#include "proxy/config.h"

namespace fy::proxy {

enum class ConnMode : uint8_t { http, hello, handshake, tunnel, lingering };

enum class Phase : uint8_t {
  none,  // nothing due (only while a credential is minted and nothing dials)
  deferred,
  next_address,
  connect,
  exchange,
  head,
  idle,
  hello,
  opaque_probe,
  handshake,
  first_bytes,
  tunnel_idle,
  linger,
};
inline constexpr int kPhaseCount = static_cast<int>(Phase::linger) + 1;

inline constexpr uint64_t kLingerMs = 2000;
inline constexpr uint64_t kOpaqueSilenceMs = 1000;
inline constexpr uint64_t kAttemptMs = 2000;  // per address, when more remain

// What the table reads of a connection (uv_now milliseconds; 0 = not set).
struct ConnTimes {
  ConnMode mode = ConnMode::http;
  bool deferred = false;            // a failure or a pipelined request waits for the next turn
  bool exchange = false;            // an exchange is in flight
  bool waiting_credential = false;  // its head waits for a minted credential
  uint64_t dial_start = 0;          // an origin is being dialled since
  uint64_t attempt_start = 0;       // the current address's connect, when others remain
  uint64_t head_start = 0;          // the first byte of a request head not yet complete
  uint64_t last_io = 0;             // the last byte read from either side
  uint64_t mode_start = 0;          // when hello, tunnel or lingering began
  uint64_t setup_start = 0;         // the CONNECT's 200 (hello and handshake count from it)
  uint16_t connect_port = 0;        // the CONNECT's port
  bool blind_waiting = false;       // a passthrough or opaque tunnel whose origin sent nothing
  uint64_t origin_ready = 0;        // when that tunnel's origin connected
};

struct Deadline {
  Phase phase = Phase::none;
  uint64_t at_ms = 0;  // due when uv_now >= at_ms
};

// The earliest deadline that applies to `t` (ties: the first row above wins).
Deadline next_deadline(const ConnTimes& t, const Limits& lim);

// "hello", "handshake", ...: the label of fy_timeouts_total{phase=...}.
const char* phase_name(Phase p);

}  // namespace fy::proxy

// The deadline table (proxy/server/deadline.h): which deadline bounds a
// connection in each state, decided without a loop.
#include <doctest/doctest.h>

#include "proxy/server/deadline.h"

using fy::proxy::ConnMode;
using fy::proxy::ConnTimes;
using fy::proxy::Deadline;
using fy::proxy::Limits;
using fy::proxy::next_deadline;
using fy::proxy::Phase;

namespace {

Limits limits() {
  Limits l;
  l.head_timeout_ms = 2'000;
  l.idle_timeout_ms = 60'000;
  l.connect_timeout_ms = 10'000;
  l.io_timeout_ms = 300'000;
  l.tunnel_idle_timeout_ms = 3'600'000;
  return l;
}

}  // namespace

TEST_CASE("a CONNECT's setup is bounded by --head-timeout from its 200") {
  ConnTimes t;
  t.mode = ConnMode::hello;
  t.setup_start = t.mode_start = 1'000;
  t.last_io = 1'000;
  t.connect_port = 443;
  Deadline d = next_deadline(t, limits());
  CHECK(d.phase == Phase::hello);
  CHECK(d.at_ms == 3'000);
  // The handshake counts from the same 200, not from the ClientHello.
  t.mode = ConnMode::handshake;
  t.mode_start = 2'500;
  t.last_io = 2'500;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::handshake);
  CHECK(d.at_ms == 3'000);
  // Another port: a second of silence, then a blind tunnel.
  t.mode = ConnMode::hello;
  t.connect_port = 5432;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::opaque_probe);
  CHECK(d.at_ms == 2'000);
}

TEST_CASE(
    "a blind tunnel waits --head-timeout for its origin's first byte, then the idle timeout") {
  ConnTimes t;
  t.mode = ConnMode::tunnel;
  t.mode_start = t.last_io = 2'000;
  t.dial_start = 2'000;
  t.blind_waiting = true;
  // Dialling: the connect timeout.
  Deadline d = next_deadline(t, limits());
  CHECK(d.phase == Phase::connect);
  CHECK(d.at_ms == 12'000);
  // Connected: the first byte.
  t.dial_start = 0;
  t.origin_ready = t.last_io = 2'100;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::first_bytes);
  CHECK(d.at_ms == 4'100);
  // The origin spoke: only silence ends it now.
  t.blind_waiting = false;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::tunnel_idle);
  CHECK(d.at_ms == 2'100 + 3'600'000);
}

TEST_CASE("http: head, idle, exchange and connect") {
  ConnTimes t;
  t.last_io = 500;
  CHECK(next_deadline(t, limits()).phase == Phase::idle);
  t.head_start = 700;
  Deadline d = next_deadline(t, limits());
  CHECK(d.phase == Phase::head);
  CHECK(d.at_ms == 2'700);
  t.head_start = 0;
  t.exchange = true;
  t.dial_start = 800;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::connect);  // the silence clock waits for the connect
  CHECK(d.at_ms == 10'800);
  t.dial_start = 0;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::exchange);
  CHECK(d.at_ms == 300'500);
  // A credential wait: the store bounds it, nothing here is due.
  t.waiting_credential = true;
  CHECK(next_deadline(t, limits()).phase == Phase::none);
  // Unless an address does not answer while others remain.
  t.dial_start = 800;
  t.attempt_start = 900;
  d = next_deadline(t, limits());
  CHECK(d.phase == Phase::next_address);
  CHECK(d.at_ms == 2'900);
}

TEST_CASE("deferred work runs at once; lingering ends after 2 s") {
  ConnTimes t;
  t.deferred = true;
  CHECK(next_deadline(t, limits()).phase == Phase::deferred);
  t.deferred = false;
  t.mode = ConnMode::lingering;
  t.mode_start = 100;
  Deadline d = next_deadline(t, limits());
  CHECK(d.phase == Phase::linger);
  CHECK(d.at_ms == 2'100);
}

TEST_CASE("every state but a credential wait has a deadline") {
  // Walk the states with every combination of the flags: only a credential
  // wait with no dial may leave the timer stopped.
  for (int m = 0; m <= static_cast<int>(ConnMode::lingering); ++m)
    for (int bits = 0; bits < 64; ++bits) {
      ConnTimes t;
      t.mode = static_cast<ConnMode>(m);
      t.exchange = bits & 1;
      t.waiting_credential = bits & 2;
      t.dial_start = (bits & 4) ? 10 : 0;
      t.head_start = (bits & 8) ? 20 : 0;
      t.blind_waiting = bits & 16;
      t.origin_ready = (bits & 32) ? 30 : 0;
      t.connect_port = 443;
      t.last_io = t.mode_start = t.setup_start = 5;
      Deadline d = next_deadline(t, limits());
      bool credential_wait =
          t.mode == ConnMode::http && t.exchange && t.waiting_credential && !t.dial_start;
      CAPTURE(m);
      CAPTURE(bits);
      CHECK((d.phase == Phase::none) == credential_wait);
      if (d.phase != Phase::none) CHECK(d.at_ms <= 5 + 3'600'000);
    }
}

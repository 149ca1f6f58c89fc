// Loop-level test helpers: a loop of the test's own, a bounded run, and a
// connected pair of Streams over a real loopback TCP connection (a listener of
// the helper's own, closed once the pair is made, so Stream is tested without
// proxy/server's Listener).
#pragma once

#include <doctest/doctest.h>
#include <uv.h>

#include <functional>
#include <string>

#include "proxy/io/stream.h"

namespace fy::test {

// Records what a Stream reports. `then_*` hooks run inside the callback.
struct Recorder : proxy::StreamHandler {
  std::string data;
  int reads = 0, eofs = 0, errors = 0, readies = 0, drains = 0, shutdowns = 0, closes = 0;
  Errc kind = Errc::internal;
  std::string detail;
  size_t queued_at_drain = SIZE_MAX;
  std::function<void(proxy::Stream&)> then_eof, then_error, then_read;

  void on_read(proxy::Stream& s, const ChunkRef&, const char* p, size_t n) override {
    ++reads;
    data.append(p, n);
    if (then_read) then_read(s);
  }
  void on_eof(proxy::Stream& s) override {
    ++eofs;
    if (then_eof) then_eof(s);
  }
  void on_error(proxy::Stream& s, Errc k, const std::string& d) override {
    ++errors;
    kind = k;
    detail = d;
    if (then_error) then_error(s);
  }
  void on_ready(proxy::Stream&) override { ++readies; }
  void on_drain(proxy::Stream& s) override {
    ++drains;
    queued_at_drain = s.queued();
  }
  void on_shutdown(proxy::Stream&) override { ++shutdowns; }
  void on_closed(proxy::Stream&) override { ++closes; }
};

// Runs `loop` until `done()` holds or `ms` pass; returns done(). done() is
// asked after every loop turn and at least every 10 ms (a timer of the
// helper's own, closed before it returns; its close callback runs on a later
// turn).
inline bool run_until(uv_loop_t* loop, const std::function<bool()>& done, uint64_t ms = 5000) {
  struct Tick {
    uint64_t until;
    bool expired = false;
  } tick{uv_now(loop) + ms};
  uv_timer_t timer;
  uv_timer_init(loop, &timer);
  timer.data = &tick;
  uv_timer_start(&timer, [](uv_timer_t* t) {
    auto* k = static_cast<Tick*>(t->data);
    if (uv_now(t->loop) >= k->until) k->expired = true;
  }, 10, 10);
  while (!done() && !tick.expired) uv_run(loop, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);  // runs the timer's close callback
  return done();
}

// Runs the loop for `ms` whatever happens (to show that nothing does).
inline void run_for(uv_loop_t* loop, uint64_t ms) {
  run_until(loop, [] { return false; }, ms);
}

// A loopback listener on 127.0.0.1:<ephemeral>.
struct TestListener {
  uv_tcp_t tcp;
  sockaddr_in addr{};
  std::function<void(uv_stream_t*)> on_accept;

  void open(uv_loop_t* loop) {
    REQUIRE(uv_tcp_init(loop, &tcp) == 0);
    tcp.data = this;
    REQUIRE(uv_ip4_addr("127.0.0.1", 0, &addr) == 0);
    REQUIRE(uv_tcp_bind(&tcp, reinterpret_cast<const sockaddr*>(&addr), 0) == 0);
    REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&tcp), 16, [](uv_stream_t* s, int status) {
              REQUIRE(status == 0);
              static_cast<TestListener*>(s->data)->on_accept(s);
            }) == 0);
    int len = sizeof addr;
    REQUIRE(uv_tcp_getsockname(&tcp, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&addr); }
  void close() { uv_close(reinterpret_cast<uv_handle_t*>(&tcp), nullptr); }
};

// A connected pair: `client` connected (on_ready seen) to `server` (accepted,
// not reading). Both are heap Streams; end them with close_and_delete().
struct StreamPair {
  proxy::Stream* client = nullptr;
  proxy::Stream* server = nullptr;
};

inline StreamPair connect_pair(uv_loop_t* loop, Recorder& client_rec, Recorder& server_rec) {
  StreamPair p;
  TestListener l;
  l.on_accept = [&](uv_stream_t* s) {
    p.server = new proxy::Stream(loop, &server_rec);
    REQUIRE(p.server->accept_from(s) == 0);
  };
  l.open(loop);
  p.client = new proxy::Stream(loop, &client_rec);
  REQUIRE(p.client->connect(l.sa()) == 0);
  int readies = client_rec.readies;
  REQUIRE(run_until(loop, [&] { return p.server && client_rec.readies == readies + 1; }));
  l.close();
  uv_run(loop, UV_RUN_NOWAIT);
  return p;
}

}  // namespace fy::test

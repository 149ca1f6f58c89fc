// Tunnel (proxy/server/tunnel.h) on a loop of its own: a client and an origin
// over real loopback TCP connections, the proxy's two Streams in between
// handled by a Relay that feeds the Tunnel their events and applies what it
// returns, as the Connection does (it is the owner the Tunnel leaves the
// pauses and the close to). Each case ends with every Stream freed and
// uv_loop_close() == 0.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "core/buffer.h"
#include "proxy/io/stream.h"
#include "proxy/netlog/error_kind.h"
#include "proxy/server/tunnel.h"
#include "tests/unit/proxy/loop_util.h"

using fy::ChunkPool;
using fy::ChunkRef;
using fy::Errc;
using fy::proxy::Stream;
using fy::proxy::StreamHandler;
using fy::proxy::Tunnel;
using fy::proxy::TunnelKind;
using fy::test::connect_pair;
using fy::test::Recorder;
using fy::test::run_for;
using fy::test::run_until;
using fy::test::StreamPair;

namespace {

// The Connection's part, for the proxy's client and origin Streams: pauses
// the side the Tunnel says, resumes it on the other's drain, ends on
// finished() or an error (an origin's error in the row's words, a client's
// none, as Connection::origin_failed and on_error do).
struct Relay : StreamHandler {
  Tunnel t;
  Stream* client = nullptr;
  Stream* origin = nullptr;
  bool connecting = false;
  int client_pauses = 0, origin_pauses = 0;
  int finished = 0, ended = 0;
  bool shut_at_finish = false;  // both shutdowns were done when finished() first held

  void check_finished() {
    if (finished || !t.finished(*client, origin)) return;
    ++finished;
    shut_at_finish = client->shutdown_done() && origin->shutdown_done();
  }
  void on_read(Stream& s, const ChunkRef& c, const char* p, size_t n) override {
    if (&s == client) {
      if (t.from_client(origin, connecting, c, p, n)) {
        ++client_pauses;
        client->pause();
      }
    } else if (t.from_origin(*client, c, p, n)) {
      ++origin_pauses;
      origin->pause();
    }
  }
  void on_eof(Stream& s) override {
    if (&s == client) {
      t.client_eof(origin);
    } else {
      t.origin_eof(*client);
    }
    check_finished();
  }
  void on_error(Stream& s, Errc kind, const std::string& detail) override {
    if (&s == origin) t.end_with(fy::netlog::error_text(fy::netlog::error_kind_of(kind), detail));
    ++ended;
  }
  void on_ready(Stream&) override {}
  void on_drain(Stream& s) override {
    if (&s == client) {
      if (origin) origin->resume();
    } else {
      client->resume();
    }
  }
  void on_shutdown(Stream&) override { check_finished(); }
  void on_closed(Stream&) override {}
};

// A case's own loop; finish() runs it dry and checks that every Stream is
// freed and every handle closed.
struct Rig {
  uv_loop_t loop;
  uint64_t live0 = Stream::live();
  Rig() { REQUIRE(uv_loop_init(&loop) == 0); }
  void finish() {
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
    CHECK(uv_loop_close(&loop) == 0);
  }
};

// The far client and the far origin, each reading, and the proxy's two
// Streams between them handled by `relay`.
struct Ends {
  Recorder peer_client, peer_origin, unused_a, unused_b;
  StreamPair down;  // client: the far client; server: the proxy's client Stream
  StreamPair up;    // client: the proxy's origin Stream; server: the far origin

  void open_client(uv_loop_t* loop, Relay& relay) {
    down = connect_pair(loop, peer_client, unused_a);
    down.server->set_handler(&relay);
    relay.client = down.server;
    down.client->start_reading();
    down.server->start_reading();
  }
  void open_origin(uv_loop_t* loop, Relay& relay) {
    up = connect_pair(loop, unused_b, peer_origin);
    up.client->set_handler(&relay);
    relay.origin = up.client;
    up.client->start_reading();
    up.server->start_reading();
  }
  void open(uv_loop_t* loop, Relay& relay) {
    open_client(loop, relay);
    open_origin(loop, relay);
  }
  void close() {
    for (Stream* s : {down.client, down.server, up.client, up.server})
      if (s) s->close_and_delete();
  }
};

ChunkRef chunk_of(std::string_view s, const char** p) {
  ChunkRef c = ChunkPool::alloc();
  REQUIRE(s.size() <= fy::Chunk::kSize);
  memcpy(c->data(), s.data(), s.size());
  *p = c->data();
  return c;
}

}  // namespace

TEST_CASE("tunnel: bytes both ways, each way counted, and the counts in a CONNECT's row") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.set_start(1'700'000'000'000, uv_now(&loop));
    relay.t.open(TunnelKind::passthrough);
    Ends ends;
    ends.open(&loop, relay);

    ends.down.client->write("sixteen bytes up");
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.data == "sixteen bytes up"; }));
    ends.up.server->write("four");
    ends.up.server->write(" down");
    REQUIRE(run_until(&loop, [&] { return ends.peer_client.data == "four down"; }));
    CHECK(relay.t.up() == 16);
    CHECK(relay.t.down() == 9);
    CHECK(relay.client_pauses == 0);
    CHECK(relay.origin_pauses == 0);
    CHECK(!relay.t.finished(*relay.client, relay.origin));

    fy::netlog::Row exchange;
    exchange.host = "not.this.one";
    exchange.bytes_up = 1000;
    fy::netlog::Row row = relay.t.row(uv_now(&loop) + 7, "", exchange, "example.com");
    CHECK(row.ts_ms == 1'700'000'000'000);
    CHECK(row.duration_ms >= 7);
    CHECK(row.bytes_up == 16);
    CHECK(row.bytes_down == 9);
    CHECK(row.method == "CONNECT");
    CHECK(row.host == "example.com");
    CHECK(row.passthrough);
    CHECK(row.tls == "passthrough");
    CHECK(row.status == 0);
    CHECK(row.error.empty());
    CHECK(relay.ended == 0);
    ends.close();
  }
  rig.finish();
}

TEST_CASE("tunnel: a FIN each way is passed on as a shutdown, bytes still flow the other way, and "
          "the tunnel is finished only once both are done") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::opaque);
    Ends ends;
    ends.open(&loop, relay);

    // The client's FIN reaches the origin, after the bytes before it.
    ends.down.client->write("last words");
    ends.down.client->shutdown();
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.eofs == 1; }));
    CHECK(ends.peer_origin.data == "last words");
    CHECK(ends.peer_client.eofs == 0);
    run_for(&loop, 20);
    CHECK(relay.finished == 0);  // half-closed: the origin may still answer

    ends.up.server->write("answer after the client's FIN");
    REQUIRE(run_until(&loop, [&] { return ends.peer_client.data.size() == 29; }));
    CHECK(ends.peer_client.data == "answer after the client's FIN");
    CHECK(relay.finished == 0);

    // The origin's FIN reaches the client; then both shutdowns are done.
    ends.up.server->shutdown();
    REQUIRE(run_until(&loop, [&] { return ends.peer_client.eofs == 1; }));
    REQUIRE(run_until(&loop, [&] { return relay.finished == 1; }));
    CHECK(relay.shut_at_finish);
    CHECK(relay.t.up() == 10);
    CHECK(relay.t.down() == 29);
    CHECK(relay.ended == 0);
    ends.close();
  }
  rig.finish();
}

TEST_CASE("tunnel: both shutdowns done is not the end while one side has not sent its FIN") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::opaque);
    Ends ends;
    ends.open(&loop, relay);
    relay.client->shutdown();  // the client's side shut, its FIN not yet seen
    REQUIRE(run_until(&loop, [&] { return ends.peer_client.eofs == 1; }));
    ends.down.client->shutdown();  // the client's FIN: the origin is shut too
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.eofs == 1; }));
    REQUIRE(run_until(&loop, [&] { return relay.origin->shutdown_done(); }));
    CHECK(relay.client->shutdown_done());
    run_for(&loop, 30);
    CHECK(relay.finished == 0);  // the origin has not said it is done sending
    ends.up.server->shutdown();
    REQUIRE(run_until(&loop, [&] { return relay.finished == 1; }));
    ends.close();
  }
  rig.finish();
}

TEST_CASE("tunnel: bytes read before the origin connects are held, within the write queue's "
          "bound, and written first when it connects") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::passthrough, "hello");  // a ClientHello read in the hello mode
    relay.connecting = true;
    Ends ends;
    ends.open_client(&loop, relay);
    ends.down.client->write(", origin");
    REQUIRE(run_until(&loop, [&] { return relay.t.up() == 8; }));
    CHECK(relay.client_pauses == 0);

    ends.open_origin(&loop, relay);
    relay.connecting = false;
    CHECK(relay.t.origin_connected(*relay.origin));  // written, the queue has room
    CHECK(!relay.t.origin_connected(*relay.origin));  // nothing held any more
    ends.down.client->write("; and after");
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.data.size() == 24; }));
    CHECK(ends.peer_origin.data == "hello, origin; and after");
    CHECK(relay.t.up() == 19);  // what the client sent through the tunnel; "hello" was the hello's
    ends.close();
  }
  rig.finish();

  // Held past Stream::kHighWater: the client is to pause.
  Tunnel t;
  t.open(TunnelKind::opaque);
  std::string block(fy::Chunk::kSize, 'x');
  const char* p = nullptr;
  ChunkRef c = chunk_of(block, &p);
  size_t held = 0;
  while (held + block.size() <= Stream::kHighWater) {
    CHECK(!t.from_client(nullptr, true, c, p, block.size()));
    held += block.size();
  }
  CHECK(t.from_client(nullptr, true, c, p, 1));
  // Neither connected nor connecting: counted, dropped, no pause.
  Tunnel u;
  u.open(TunnelKind::opaque);
  CHECK(!u.from_client(nullptr, false, c, p, block.size()));
  CHECK(u.up() == block.size());
}

TEST_CASE("tunnel: a client that does not read pauses the origin until it drains; every byte "
          "arrives and is counted") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::opaque);
    Ends ends;
    ends.open(&loop, relay);
    ends.down.client->pause();  // the far client reads nothing for now
    std::string block(fy::Chunk::kSize, 'y');
    size_t sent = 0;
    // Until the kernel's buffers and then the proxy's client queue fill.
    while (relay.origin_pauses == 0 && sent < (size_t{64} << 20)) {
      ends.up.server->write(block);
      sent += block.size();
      run_until(&loop, [&] { return ends.up.server->queued() == 0 || relay.origin_pauses > 0; },
                200);
    }
    REQUIRE(relay.origin_pauses == 1);
    CHECK(relay.client->above_high());
    CHECK(relay.origin->paused());
    ends.down.client->resume();
    REQUIRE(run_until(&loop, [&] { return ends.peer_client.data.size() == sent; }, 20000));
    CHECK(relay.t.down() == sent);
    CHECK(relay.t.up() == 0);
    ends.close();
  }
  rig.finish();
}

TEST_CASE("tunnel: an origin reset ends it with the reset kind in the row; a client reset keeps "
          "the connection's fallback error") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::passthrough);
    Ends ends;
    ends.open(&loop, relay);
    ends.down.client->write("abc");
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.data == "abc"; }));
    ends.up.server->close_reset();
    REQUIRE(run_until(&loop, [&] { return relay.ended == 1; }));
    fy::netlog::Row row = relay.t.row(uv_now(&loop), "ECONNREFUSED: an earlier address", {}, "h");
    CHECK(fy::netlog::parse_error_kind(row.error) == fy::netlog::ErrorKind::reset);
    CHECK(row.error.rfind("reset: ", 0) == 0);
    CHECK(row.bytes_up == 3);
    CHECK(row.bytes_down == 0);
    CHECK(!relay.t.finished(*relay.client, relay.origin));
    REQUIRE(run_until(&loop, [&] { return ends.peer_origin.closes == 1; }));
    delete ends.up.server;  // closed by close_reset, its close callback run
    ends.up.server = nullptr;
    ends.close();
  }
  rig.finish();

  Rig rig2;
  uv_loop_t& loop2 = rig2.loop;
  {
    Relay relay;
    relay.t.open(TunnelKind::opaque);
    Ends ends;
    ends.open(&loop2, relay);
    ends.down.client->close_reset();
    REQUIRE(run_until(&loop2, [&] { return relay.ended == 1; }));
    fy::netlog::Row row = relay.t.row(uv_now(&loop2), "ECONNREFUSED: an earlier address", {}, "h");
    CHECK(row.error == "ECONNREFUSED: an earlier address");
    CHECK(row.tls == "opaque");
    // The connection ended it (a policy close, say): its words win.
    relay.t.end_with("closed: the policy no longer allows it");
    CHECK(relay.t.row(0, "ECONNREFUSED: x", {}, "h").error ==
          "closed: the policy no longer allows it");
    REQUIRE(run_until(&loop2, [&] { return ends.peer_client.closes == 1; }));
    delete ends.down.client;
    ends.down.client = nullptr;
    ends.close();
  }
  rig2.finish();
}

TEST_CASE("tunnel: an upgrade's row is its request's, with the 101 and the exchange's bytes "
          "added to the tunnel's") {
  Tunnel t;
  t.set_start(1'700'000'000'500, 1000);
  t.open(TunnelKind::upgrade);
  std::string data(300, 'z');
  const char* p = nullptr;
  ChunkRef c = chunk_of(data, &p);
  CHECK(!t.from_client(nullptr, false, c, p, 120));  // no origin: counted only
  fy::netlog::Row ex;
  ex.method = "GET";
  ex.host = "ws.example.com";
  ex.path = "/chat";
  ex.ua = "probe/1";
  ex.bytes_up = 200;
  ex.bytes_down = 129;
  fy::netlog::Row row = t.row(1250, "", ex, "ws.example.com:443");
  CHECK(row.ts_ms == 1'700'000'000'500);
  CHECK(row.duration_ms == 250);
  CHECK(row.method == "GET");
  CHECK(row.host == "ws.example.com");
  CHECK(row.path == "/chat");
  CHECK(row.ua == "probe/1");
  CHECK(row.status == 101);
  CHECK(row.bytes_up == 320);
  CHECK(row.bytes_down == 129);
  CHECK(!row.passthrough);
  CHECK(row.tls.empty());  // the connection's fill_row says how the client reached it
}

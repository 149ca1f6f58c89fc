// OriginDialer (proxy/server/origin_dialer.h) on a loop of its own: real
// loopback sockets (a bound port that does not listen refuses), real
// getaddrinfo, a real OriginPool. Each case ends with every Stream freed and
// uv_loop_close() == 0.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "proxy/io/stream.h"
#include "proxy/server/origin_dialer.h"
#include "proxy/server/origin_pool.h"
#include "tests/unit/proxy/loop_util.h"

using fy::Errc;
using fy::proxy::DialFailure;
using fy::proxy::DialOwner;
using fy::proxy::OriginDialer;
using fy::proxy::OriginPool;
using fy::proxy::Stream;
using fy::test::connect_pair;
using fy::test::Recorder;
using fy::test::run_for;
using fy::test::run_until;
using fy::test::StreamPair;
using fy::test::TestListener;
using How = OriginDialer::How;

namespace {

// What the dialer tells its owner.
struct Owner : DialOwner {
  bool spare = true;
  int dialed = 0, failed = 0;
  Stream* got = nullptr;
  DialFailure failure;
  bool descriptor_spare() override { return spare; }
  void on_dialed(Stream& s) override {
    ++dialed;
    got = &s;
  }
  void on_dial_failed(DialFailure f) override {
    ++failed;
    failure = std::move(f);
  }
  bool told() const { return dialed + failed > 0; }
};

// 127.0.0.1:<ephemeral>, bound and not listening: a connect is refused.
struct RefusedPort {
  uv_tcp_t tcp;
  sockaddr_in addr{};
  void open(uv_loop_t* loop) {
    REQUIRE(uv_tcp_init(loop, &tcp) == 0);
    REQUIRE(uv_ip4_addr("127.0.0.1", 0, &addr) == 0);
    REQUIRE(uv_tcp_bind(&tcp, reinterpret_cast<const sockaddr*>(&addr), 0) == 0);
    int len = sizeof addr;
    REQUIRE(uv_tcp_getsockname(&tcp, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  }
  void close() { uv_close(reinterpret_cast<uv_handle_t*>(&tcp), nullptr); }
};

sockaddr_storage storage(const sockaddr_in& in) {
  sockaddr_storage ss{};
  memcpy(&ss, &in, sizeof in);
  return ss;
}

// A listener that accepts into Streams of its own (the origin's side);
// `accepted` is the latest.
struct Origin {
  TestListener l;
  Recorder rec;
  Stream* accepted = nullptr;
  std::vector<Stream*> all;
  void open(uv_loop_t* loop) {
    l.on_accept = [this, loop](uv_stream_t* s) {
      accepted = new Stream(loop, &rec);
      REQUIRE(accepted->accept_from(s) == 0);
      accepted->start_reading();
      all.push_back(accepted);
    };
    l.open(loop);
  }
  void close() {
    for (Stream* s : all) s->close_and_delete();
    l.close();
  }
};

// A case's own loop; finish() runs it dry and checks that every Stream is
// freed and every handle closed.
struct Rig {
  uv_loop_t loop;
  uint64_t live0 = Stream::live();
  Rig() { REQUIRE(uv_loop_init(&loop) == 0); }
  void finish() {
    uv_run(&loop, UV_RUN_DEFAULT);  // every close callback, every cancelled lookup
    CHECK(Stream::live() == live0);
    CHECK(uv_loop_close(&loop) == 0);
  }
};

// A target with known addresses.
OriginDialer::Target to(std::string host, uint16_t port, std::vector<sockaddr_storage> addrs) {
  OriginDialer::Target t;
  t.dest = {std::move(host), port};
  t.port = port;
  t.addrs = std::move(addrs);
  return t;
}

}  // namespace

TEST_CASE("origin dialer: a refused address, then a listening one: connected on the second, the "
          "Stream handed over with its events") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    RefusedPort refused;
    refused.open(&loop);
    Origin origin;
    origin.open(&loop);
    Owner owner;
    Recorder events;
    OriginDialer d(&loop, nullptr, owner, events);
    OriginDialer::Target t = to("127.0.0.1", ntohs(origin.l.addr.sin_port),
                               {storage(refused.addr), storage(origin.l.addr)});
    OriginDialer::Started st = d.start(t);
    CHECK(st.how == How::connecting);
    CHECK(d.dialling());
    CHECK(d.dial_started() != 0);
    CHECK(d.attempt_started() != 0);  // another address remains
    CHECK(owner.dialed == 0);         // never from inside start()

    REQUIRE(run_until(&loop, [&] { return owner.told(); }));
    CHECK(owner.dialed == 1);
    CHECK(owner.failed == 0);
    CHECK(!d.dialling());
    CHECK(d.dial_started() == 0);
    CHECK(d.attempt_started() == 0);
    CHECK(d.last_error() == "ECONNREFUSED: connection refused");  // the first address's, kept for the owner
    REQUIRE(owner.got != nullptr);
    CHECK(owner.got->connected());

    // The connected Stream reports to `events` now, not to the dialer.
    REQUIRE(run_until(&loop, [&] { return origin.accepted != nullptr; }));
    origin.accepted->write("HTTP/1.1 200 OK\r\n");
    REQUIRE(run_until(&loop, [&] { return events.data == "HTTP/1.1 200 OK\r\n"; }));
    owner.got->close_and_delete();
    origin.close();
    refused.close();
  }
  rig.finish();
}

TEST_CASE("origin dialer: the attempt clock: next_address() moves on and the last address has no "
          "attempt deadline") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Origin a, b;
    a.open(&loop);
    b.open(&loop);
    Owner owner;
    Recorder events;
    OriginDialer d(&loop, nullptr, owner, events);
    OriginDialer::Target t = to("127.0.0.1", 1, {storage(a.l.addr), storage(b.l.addr)});
    REQUIRE(d.start(t).how == How::connecting);
    CHECK(d.attempt_started() != 0);
    // The owner's deadline table said the first address had its 2 s.
    OriginDialer::Started st = d.next_address();
    CHECK(st.how == How::connecting);
    CHECK(d.last_error() == "no answer within 2 s");
    CHECK(d.attempt_started() == 0);  // the last one: the connect deadline bounds it
    CHECK(d.dial_started() != 0);
    REQUIRE(run_until(&loop, [&] { return owner.told() && b.accepted != nullptr; }));
    CHECK(owner.dialed == 1);
    // The abandoned attempt is closed (loopback may have completed it).
    if (a.accepted) REQUIRE(run_until(&loop, [&] { return a.rec.eofs + a.rec.errors == 1; }));
    run_for(&loop, 50);
    CHECK(owner.dialed == 1);
    CHECK(owner.failed == 0);
    owner.got->close_and_delete();
    a.close();
    b.close();
  }
  rig.finish();
}

TEST_CASE("origin dialer: a dead DNS name fails later with Errc::dns, no Stream left") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Owner owner;
    Recorder events;
    OriginDialer d(&loop, nullptr, owner, events);
    OriginDialer::Target t = to("fy13d-dead.invalid", 80, {});
    REQUIRE(d.start(t).how == How::connecting);
    CHECK(d.dialling());  // the Stream is made before the lookup (bytes may queue on it)
    REQUIRE(run_until(&loop, [&] { return owner.told(); }, 20000));
    CHECK(owner.failed == 1);
    CHECK(owner.failure.kind == Errc::dns);
    CHECK(owner.failure.detail.starts_with("fy13d-dead.invalid does not resolve ("));
    CHECK(!owner.failure.at_once);
    CHECK(!d.dialling());
    CHECK(Stream::live() == rig.live0);
  }
  rig.finish();
}

TEST_CASE("origin dialer: pooled reuse: an idle pooled connection is handed over at once, to "
          "`events`; without use_pool it is left in the pool") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    OriginPool pool(&loop);
    Recorder c_rec, s_rec;
    StreamPair p = connect_pair(&loop, c_rec, s_rec);
    pool.put("origin.example:80", p.client);
    Owner owner;
    Recorder events;
    OriginDialer d(&loop, &pool, owner, events);
    RefusedPort refused;
    refused.open(&loop);

    OriginDialer::Target t = to("origin.example", 80, {storage(refused.addr)});
    REQUIRE(d.start(t).how == How::connecting);  // not from the pool
    CHECK(pool.size() == 1);
    REQUIRE(run_until(&loop, [&] { return owner.told(); }));
    CHECK(owner.failed == 1);
    CHECK(owner.failure.kind == Errc::connect);
    CHECK(!owner.failure.at_once);

    t.use_pool = true;
    OriginDialer::Started st = d.start(t);
    CHECK(st.how == How::pooled);
    CHECK(st.pooled == p.client);
    CHECK(pool.size() == 0);
    CHECK(pool.reused() == 1);
    CHECK(!d.dialling());
    CHECK(d.dial_started() == 0);
    CHECK(d.last_error().empty());
    p.server->write("x");
    REQUIRE(run_until(&loop, [&] { return events.data == "x"; }));
    CHECK(c_rec.reads == 0);
    CHECK(owner.dialed == 0);  // a pooled origin is the return value, not a callback
    st.pooled->close_and_delete();
    p.server->close_and_delete();
    refused.close();
    pool.close();
  }
  rig.finish();
}

TEST_CASE("origin dialer: no descriptor to spare fails at once (out_of_files), with no Stream") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Origin origin;
    origin.open(&loop);
    Owner owner;
    owner.spare = false;
    Recorder events;
    OriginDialer d(&loop, nullptr, owner, events);
    OriginDialer::Target t = to("127.0.0.1", 1, {storage(origin.l.addr)});
    OriginDialer::Started st = d.start(t);
    CHECK(st.how == How::failed_now);
    CHECK(st.failure.kind == Errc::io);
    CHECK(st.failure.out_of_files);
    CHECK(st.failure.at_once);
    CHECK(st.failure.detail == "no file descriptor to spare for the origin");
    CHECK(!d.dialling());
    CHECK(Stream::live() == rig.live0 + 1);  // the one being closed
    d.cancel();
    CHECK(d.dial_started() == 0);
    run_for(&loop, 50);
    CHECK(!owner.told());
    CHECK(origin.accepted == nullptr);
    origin.close();
  }
  rig.finish();
}

TEST_CASE("origin dialer: cancelled while connecting (or destroyed): no callback, the Stream "
          "freed") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Origin origin;
    origin.open(&loop);
    Owner owner;
    Recorder events;
    OriginDialer::Target t = to("127.0.0.1", 1, {storage(origin.l.addr)});
    {
      OriginDialer d(&loop, nullptr, owner, events);
      REQUIRE(d.start(t).how == How::connecting);
      d.cancel();
      CHECK(!d.dialling());
      CHECK(d.dial_started() == 0);
      d.cancel();  // idempotent
      run_for(&loop, 100);  // the connect callback (UV_ECANCELED) reaches nobody
      CHECK(!owner.told());
    }
    {
      OriginDialer d(&loop, nullptr, owner, events);
      REQUIRE(d.start(t).how == How::connecting);
    }  // destroyed with the connect in flight
    run_for(&loop, 100);
    CHECK(!owner.told());
    CHECK(events.readies + events.errors + events.closes == 0);
    CHECK(Stream::live() == rig.live0 + origin.all.size());  // the origin's side only
    origin.close();
  }
  rig.finish();
}

TEST_CASE("origin dialer: cancelled while resolving (or destroyed): the lookup outlives it and "
          "its callback reaches nobody") {
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    Owner owner;
    Recorder events;
    // /etc/hosts: answered (or cancelled) on the threadpool.
    OriginDialer::Target t = to("localhost", 1, {});
    OriginDialer d(&loop, nullptr, owner, events);
    REQUIRE(d.start(t).how == How::connecting);
    d.cancel();
    CHECK(!d.dialling());
    uv_run(&loop, UV_RUN_DEFAULT);  // until the lookup's callback has run
    CHECK(!owner.told());

    auto* gone = new OriginDialer(&loop, nullptr, owner, events);
    REQUIRE(gone->start(t).how == How::connecting);
    delete gone;  // with the lookup in flight
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(!owner.told());
  }
  rig.finish();
}

TEST_CASE("origin dialer: what the owner queued on a Stream whose address refused reaches the "
          "next address, with its shutdown") {
  // A request head written while connecting (the connection does so) must
  // not go with the Stream that failed: before, the fallback's fresh Stream
  // started empty and the origin never saw the request (a 504 after the
  // I/O timeout for a host whose first address refuses).
  Rig rig;
  uv_loop_t& loop = rig.loop;
  {
    RefusedPort refused, refused2;
    refused.open(&loop);
    refused2.open(&loop);
    Origin origin;
    origin.open(&loop);
    Owner owner;
    Recorder events;
    OriginDialer d(&loop, nullptr, owner, events);
    OriginDialer::Target t = to("127.0.0.1", ntohs(origin.l.addr.sin_port),
                               {storage(refused.addr), storage(refused2.addr), storage(origin.l.addr)});
    REQUIRE(d.start(t).how == How::connecting);
    REQUIRE(d.stream() != nullptr);
    d.stream()->write("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    d.stream()->shutdown();
    REQUIRE(run_until(&loop, [&] { return owner.told(); }));
    REQUIRE(owner.dialed == 1);
    REQUIRE(run_until(&loop, [&] { return origin.accepted != nullptr && origin.rec.eofs > 0; }));
    CHECK(origin.rec.data == "GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(owner.got->bytes_out() == 27);
    owner.got->close_and_delete();
    origin.close();
    refused.close();
    refused2.close();
  }
  rig.finish();
}

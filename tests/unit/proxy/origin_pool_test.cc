// OriginPool (proxy/server/origin_pool.h) on a loop of its own, holding real
// loopback connections.
#include <doctest/doctest.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "proxy/io/stream.h"
#include "proxy/server/origin_pool.h"
#include "tests/unit/proxy/loop_util.h"

using fy::proxy::OriginPool;
using fy::proxy::Stream;
using fy::test::connect_pair;
using fy::test::Recorder;
using fy::test::run_for;
using fy::test::run_until;
using fy::test::StreamPair;

namespace {

// Origin-side connections: `client` is what the proxy would pool, `server`
// stands for the origin.
struct Origins {
  uv_loop_t* loop;
  std::vector<std::unique_ptr<Recorder>> recs;
  std::deque<StreamPair> pairs;  // references stay valid as it grows
  StreamPair& make() {
    recs.push_back(std::make_unique<Recorder>());
    auto* c = recs.back().get();
    recs.push_back(std::make_unique<Recorder>());
    auto* s = recs.back().get();
    pairs.push_back(connect_pair(loop, *c, *s));
    pairs.back().server->start_reading();
    return pairs.back();
  }
  void close_servers() {
    for (auto& p : pairs)
      if (p.server) p.server->close_and_delete();
    pairs.clear();
  }
};

}  // namespace

TEST_CASE("origin pool: put and take by key; take hands the stream to its new owner") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    OriginPool pool(&loop);
    Origins o{&loop};
    auto& a = o.make();
    auto& b = o.make();
    pool.put("a.example:80", a.client);
    pool.put("b.example:80", b.client);
    CHECK(pool.size() == 2);
    CHECK(pool.take("c.example:80", nullptr) == nullptr);
    CHECK(pool.size() == 2);

    Recorder owner;
    Stream* got = pool.take("a.example:80", &owner);
    CHECK(got == a.client);
    CHECK(pool.size() == 1);
    CHECK(pool.reused() == 1);
    CHECK(pool.take("a.example:80", &owner) == nullptr);  // one was kept, one taken
    // The taken stream reports to its new owner, not to the pool.
    a.server->write("HTTP/1.1 200 OK\r\n");
    REQUIRE(run_until(&loop, [&] { return owner.data == "HTTP/1.1 200 OK\r\n"; }));
    CHECK(pool.size() == 1);
    got->close_and_delete();

    Stream* got_b = pool.take("b.example:80", &owner);
    CHECK(got_b == b.client);
    CHECK(pool.size() == 0);
    got_b->close_and_delete();
    o.close_servers();
    pool.close();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("origin pool: one past the per-key limit is closed, not kept and not counted as full; "
          "one past max_total is") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    OriginPool pool(&loop, /*per_key=*/1);
    Origins o{&loop};
    auto& a1 = o.make();
    auto& a2 = o.make();
    pool.put("a:80", a1.client);
    pool.put("a:80", a2.client);  // refused: closed and freed
    CHECK(pool.size() == 1);
    CHECK(pool.full() == 0);
    // The refused one is closed: its origin sees the end.
    auto* a2_server_rec = o.recs[3].get();
    REQUIRE(run_until(&loop, [&] { return a2_server_rec->eofs == 1; }));
    CHECK(o.recs[1]->eofs == 0);  // the kept one is not touched
    CHECK(Stream::live() == live0 + 3);

    pool.set_max_total(1);
    auto& b = o.make();
    pool.put("b:80", b.client);  // refused: the pool as a whole is full
    CHECK(pool.size() == 1);
    CHECK(pool.full() == 1);
    REQUIRE(run_until(&loop, [&] { return o.recs[5]->eofs == 1; }));

    CHECK(pool.take("a:80", nullptr) == a1.client);
    CHECK(pool.take("b:80", nullptr) == nullptr);
    a1.client->close_and_delete();
    o.close_servers();
    pool.close();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("origin pool: an idle connection the origin closes, or that reads a stray byte, is "
          "dropped and freed") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    OriginPool pool(&loop);
    Origins o{&loop};
    auto& a = o.make();
    auto& b = o.make();
    auto& c = o.make();
    a.client->pause();  // put() resumes and reads, so an end is seen
    pool.put("k:80", a.client);
    pool.put("k:80", b.client);
    pool.put("k:80", c.client);
    CHECK(pool.size() == 3);

    a.server->close_and_delete();  // FIN
    a.server = nullptr;
    REQUIRE(run_until(&loop, [&] { return pool.size() == 2; }));
    b.server->write("x");  // a byte nobody asked for
    REQUIRE(run_until(&loop, [&] { return pool.size() == 1; }));
    CHECK(Stream::live() == live0 + 3);  // both pooled ends freed, and a's origin

    // What is left is the one that stayed quiet.
    Recorder owner;
    CHECK(pool.take("k:80", &owner) == c.client);
    CHECK(pool.take("k:80", &owner) == nullptr);
    c.client->close_and_delete();
    o.close_servers();
    pool.close();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("origin pool: clear() closes every idle connection (a reload); close() refuses more") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    OriginPool pool(&loop);
    Origins o{&loop};
    pool.put("a:80", o.make().client);
    pool.put("a:80", o.make().client);
    pool.put("b:80", o.make().client);
    CHECK(pool.size() == 3);
    pool.clear();
    CHECK(pool.size() == 0);
    CHECK(pool.take("a:80", nullptr) == nullptr);
    CHECK(pool.take("b:80", nullptr) == nullptr);
    REQUIRE(run_until(&loop, [&] { return Stream::live() == live0 + 3; }));
    REQUIRE(run_until(&loop, [&] {
      return o.recs[1]->eofs == 1 && o.recs[3]->eofs == 1 && o.recs[5]->eofs == 1;
    }));

    // Usable after a clear; after close() a put is refused (and not "full").
    pool.put("a:80", o.make().client);
    CHECK(pool.size() == 1);
    pool.close();
    CHECK(pool.size() == 0);
    pool.put("a:80", o.make().client);
    CHECK(pool.size() == 0);
    CHECK(pool.full() == 0);
    o.close_servers();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("origin pool: an idle connection is kept at most idle_ms") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    OriginPool pool(&loop, 16, /*idle_ms=*/50);
    Origins o{&loop};
    pool.put("a:80", o.make().client);
    CHECK(pool.size() == 1);
    REQUIRE(run_until(&loop, [&] { return pool.size() == 0; }, 2000));
    REQUIRE(run_until(&loop, [&] { return o.recs[1]->eofs == 1; }));
    CHECK(pool.take("a:80", nullptr) == nullptr);
    o.close_servers();
    pool.close();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

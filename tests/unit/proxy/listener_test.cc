// The accept loop's Listener (proxy/server/admin.h) on a loop of its own.
#include <doctest/doctest.h>

#include <string>

#include "proxy/io/stream.h"
#include "proxy/server/admin.h"
#include "tests/unit/proxy/loop_util.h"

using fy::errc_name;
using fy::proxy::Listener;
using fy::proxy::Stream;
using fy::test::Recorder;
using fy::test::run_until;

namespace {

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  uv_ip4_addr("127.0.0.1", port, &a);
  return a;
}

}  // namespace

TEST_CASE("listener: accepts a real connection, then close() stops it for good and frees its "
          "handles") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Recorder srv_rec;
    Stream* accepted = nullptr;
    int errors = 0;
    Listener l(
        &loop, 16,
        [&](uv_stream_t* s) {
          accepted = new Stream(&loop, &srv_rec);
          REQUIRE(accepted->accept_from(s) == 0);
        },
        [&](int) { ++errors; });
    auto port = l.listen("127.0.0.1:0");
    REQUIRE(port);
    CHECK(*port > 0);
    CHECK_FALSE(l.paused());

    Recorder cli_rec;
    auto* client = new Stream(&loop, &cli_rec);
    sockaddr_in addr = loopback(*port);
    REQUIRE(client->connect(reinterpret_cast<const sockaddr*>(&addr)) == 0);
    REQUIRE(run_until(&loop, [&] { return accepted && cli_rec.readies == 1; }));
    // It is the client's connection: bytes go through.
    accepted->start_reading();
    client->write("hello");
    REQUIRE(run_until(&loop, [&] { return srv_rec.data == "hello"; }));
    CHECK(errors == 0);

    l.close();
    l.close();  // idempotent
    uv_run(&loop, UV_RUN_NOWAIT);
    // The socket is gone (its spare descriptor too): a new connect is refused.
    Recorder late_rec;
    auto* late = new Stream(&loop, &late_rec);
    late_rec.then_error = [](Stream& s) { s.close_and_delete(); };
    REQUIRE(late->connect(reinterpret_cast<const sockaddr*>(&addr)) == 0);
    REQUIRE(run_until(&loop, [&] { return late_rec.errors == 1; }));
    CHECK(std::string(errc_name(late_rec.kind)) == errc_name(fy::Errc::connect));
    CHECK(late_rec.readies == 0);
    // An accepted connection outlives its listener.
    client->write(" again");
    REQUIRE(run_until(&loop, [&] { return srv_rec.data == "hello again"; }));

    client->close_and_delete();
    accepted->close_and_delete();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(Stream::live() == live0);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("listener: a busy endpoint is an error from listen(), and close() still frees it") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    Listener a(&loop, 16, [](uv_stream_t*) {}, [](int) {});
    auto port = a.listen("127.0.0.1:0");
    REQUIRE(port);
    Listener b(&loop, 16, [](uv_stream_t*) {}, [](int) {});
    auto again = b.listen("127.0.0.1:" + std::to_string(*port));
    CHECK_FALSE(again);
    a.close();
    b.close();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

// Exchange (proxy/server/exchange.h) on its own: the row's lifecycle (begun,
// handed over, written once), what each step records, the error body it
// captures, and the connection's fields (ConnFields) the finished row takes.
// No loop: the exchange owns no handle.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>

#include "proxy/netlog/row.h"
#include "proxy/server/exchange.h"

using fy::netlog::Attribution;
using fy::netlog::Row;
using fy::proxy::ConnFields;
using fy::proxy::Exchange;
using RowState = Exchange::RowState;

namespace {

ConnFields plain_conn() {
  ConnFields f;
  f.conn = 7;
  f.peer = "10.0.0.2:4000";
  return f;
}

}  // namespace

TEST_CASE("exchange: no row until begun; begun, the row is finished once") {
  Exchange ex;
  CHECK_FALSE(ex.active());
  CHECK(ex.finish(plain_conn(), 1000, 50) == nullptr);  // nothing begun: nothing to write

  ex.begin("GET", 1000, 40);
  CHECK(ex.active());
  CHECK(ex.state() == RowState::begun);
  CHECK(ex.start_ms() == 40);
  ex.set_host("example.com");
  ex.set_path("/a");
  ex.add_up(12);
  ex.add_down(30);
  ex.set_status(204);
  const Row* row = ex.finish(plain_conn(), 9999, 55);
  REQUIRE(row != nullptr);
  CHECK(row->method == "GET");
  CHECK(row->ts_ms == 1000);  // the begin's, not the finish's
  CHECK(row->duration_ms == 15);
  CHECK(row->host == "example.com");
  CHECK(row->path == "/a");
  CHECK(row->bytes_up == 12);
  CHECK(row->bytes_down == 30);
  CHECK(row->status == 204);
  CHECK(row->conn == 7);
  CHECK(row->peer == "10.0.0.2:4000");
  CHECK(row->tls == "plain");
  // Written: no longer active, and the row stays readable.
  CHECK_FALSE(ex.active());
  CHECK(ex.state() == RowState::written);
  CHECK(ex.row().status == 204);
  // A second finish (a late close after the response) writes nothing.
  CHECK(ex.finish(plain_conn(), 9999, 60) == nullptr);
  CHECK(ex.state() == RowState::written);

  // The next exchange starts from nothing.
  ex.begin("", 2000, 60);
  CHECK(ex.active());
  CHECK(ex.row().host.empty());
  CHECK(ex.row().status == 0);
  CHECK(ex.row().bytes_up == 0);
  CHECK(ex.row().method.empty());
  ex.reset();
  CHECK(ex.state() == RowState::none);
  CHECK(ex.finish(plain_conn(), 1, 1) == nullptr);
}

TEST_CASE("exchange: a CONNECT's row handed over is never written") {
  Exchange ex;
  ex.begin("CONNECT", 1000, 10);
  ex.set_host("example.com:443");
  ex.hand_over();
  CHECK_FALSE(ex.active());
  CHECK(ex.state() == RowState::handed);
  CHECK(ex.row().host == "example.com:443");  // still read by the tunnel's row
  CHECK(ex.finish(plain_conn(), 1000, 20) == nullptr);
}

TEST_CASE("exchange: the finished row's tls") {
  ConnFields outside = plain_conn();
  ConnFields inside = plain_conn();
  inside.in_connect = true;
  inside.tls_mode = "decrypted";
  inside.sni = "api.example.com";

  SUBCASE("plain outside a CONNECT, decrypted for https outside one") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    CHECK(ex.finish(outside, 1, 1)->tls == "plain");
    ex.begin("GET", 1, 1);
    ex.kind = fy::policy::Kind::https;
    CHECK(ex.finish(outside, 1, 1)->tls == "decrypted");
  }
  SUBCASE("the CONNECT's mode and its sni inside one") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    const Row* row = ex.finish(inside, 1, 1);
    CHECK(row->tls == "decrypted");
    CHECK(row->sni == "api.example.com");
  }
  SUBCASE("a blocked row names no tls, inside or outside") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    ex.kind = fy::policy::Kind::https;
    ex.set_blocked();
    const Row* row = ex.finish(outside, 1, 1);
    CHECK(row->blocked);
    CHECK(row->tls.empty());
    ex.begin("GET", 1, 1);
    ex.set_blocked();
    CHECK(ex.finish(inside, 1, 1)->tls.empty());
  }
}

TEST_CASE("exchange: the row's ts defaults to the finish when it had none") {
  Exchange ex;
  ex.begin("GET", 0, 5);
  CHECK(ex.finish(plain_conn(), 4242, 5)->ts_ms == 4242);
}

TEST_CASE("exchange: an answer's status, bytes and (for >= 400) its body") {
  Exchange ex;
  ex.begin("GET", 1, 1);
  ex.add_down(5);
  ex.answered(403, 100, "refused   by\n the allowlist ");
  CHECK(ex.row().status == 403);
  CHECK(ex.row().bytes_down == 105);
  CHECK(ex.row().error_body == "refused by the allowlist");

  ex.begin("GET", 1, 1);
  ex.answered(200, 10, "fine");
  CHECK(ex.row().status == 200);
  CHECK(ex.row().error_body.empty());
}

TEST_CASE("exchange: the error body captured from a response") {
  SUBCASE("a 4xx in identity encoding: captured, bounded, collapsed at the end") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    ex.response_head(404);
    CHECK(ex.response_started);
    CHECK(ex.row().status == 404);
    ex.decide_capture(404, std::nullopt);
    ex.body_bytes("not   ");
    ex.body_bytes(" found");
    CHECK(ex.row().error_body == "not    found");  // raw until the response ends
    ex.response_complete();
    CHECK(ex.row().error_body == "not found");

    ex.begin("GET", 1, 1);
    ex.decide_capture(500, std::string_view("Identity"));
    ex.body_bytes(std::string(fy::netlog::kMaxErrorBody + 100, 'x'));
    ex.body_bytes("more");
    CHECK(ex.row().error_body.size() == fy::netlog::kMaxErrorBody);
  }
  SUBCASE("not below 400, not compressed") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    ex.decide_capture(302, std::nullopt);
    ex.body_bytes("moved");
    CHECK(ex.row().error_body.empty());

    ex.begin("GET", 1, 1);
    ex.decide_capture(500, std::string_view("gzip"));
    ex.body_bytes("\x1f\x8b");
    CHECK(ex.row().error_body.empty());
  }
  SUBCASE("a replaced 401's bytes do not stay") {
    Exchange ex;
    ex.begin("GET", 1, 1);
    ex.decide_capture(401, std::nullopt);
    ex.body_bytes("bad token");
    ex.discard_captured();
    CHECK(ex.row().error_body.empty());
  }
}

TEST_CASE("conn fields: the stamp's fields only when attributed") {
  ConnFields f = plain_conn();
  f.src = "machine-a";
  f.net = "net-1";
  f.who = "agent";
  f.boot = "boot-9";
  f.seq = 3;
  f.build_marker = true;

  Row row;
  f.attribution = Attribution::unattributed;
  f.fill(row);
  CHECK(row.attribution == Attribution::unattributed);
  CHECK(row.src.empty());
  CHECK(row.seq == 0);
  CHECK(row.build);

  Row row2;
  row2.tls = "passthrough";  // a row's own tls stands
  f.attribution = Attribution::attributed;
  f.fill(row2);
  CHECK(row2.tls == "passthrough");
  CHECK(row2.src == "machine-a");
  CHECK(row2.net == "net-1");
  CHECK(row2.who == "agent");
  CHECK(row2.boot == "boot-9");
  CHECK(row2.seq == 3);
}

// Unit tests for the proxy's HTTP parsing and head rewriting.
#include <doctest/doctest.h>

#include <string>

#include "core/text.h"
#include "proxy/http/parser.h"
#include "proxy/http/rewrite.h"

using namespace fy::http;

namespace {

struct Parsed {
  bool ok = false;
  ParseError err;
  Head head;
};

// Scans and parses one request head from `text`; returns what follows in `rest`.
Parsed parse_request(Parser& p, const Limits& lim, const std::string& text, std::string* rest = nullptr) {
  Parsed out;
  HeadScanner scan(lim);
  size_t used = 0;
  auto st = scan.scan(text, &used, &out.err);
  if (st != HeadScanner::Status::complete) return out;
  static std::string keep;
  keep = text.substr(0, used);
  out.ok = p.parse_head(keep, &out.head, &out.err) && check_request_framing(out.head, &out.err);
  if (rest) *rest = text.substr(used);
  return out;
}

int refusal(const std::string& text) {
  Limits lim;
  Parser p(HTTP_REQUEST, lim);
  Parsed r = parse_request(p, lim, text);
  if (r.ok) return 0;
  return r.err.status;
}

}  // namespace

TEST_CASE("a plain request head parses with views into the head") {
  Limits lim;
  Parser p(HTTP_REQUEST, lim);
  auto r = parse_request(p, lim,
                         "GET http://a.test/x?y=1 HTTP/1.1\r\nHost: a.test\r\nX-Empty:\r\n"
                         "User-Agent: t/1  \r\n\r\n");
  REQUIRE(r.ok);
  CHECK(r.head.method == "GET");
  CHECK(r.head.target == "http://a.test/x?y=1");
  CHECK(r.head.headers.size() == 3);
  CHECK(r.head.get("x-empty") == std::string_view(""));
  CHECK(r.head.get("user-agent") == std::string_view("t/1"));
  CHECK(p.message_complete());
}

TEST_CASE("smuggling vectors are refused") {
  // CL + TE
  CHECK(refusal("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
                "Transfer-Encoding: chunked\r\n\r\n") == 400);
  // Duplicate Content-Length, equal and different
  CHECK(refusal("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
                "Content-Length: 3\r\n\r\n") == 400);
  CHECK(refusal("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
                "Content-Length: 4\r\n\r\n") == 400);
  // obs-fold
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: 1\r\n 2\r\n\r\n") == 400);
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: 1\r\n\t2\r\n\r\n") == 400);
  // Bare LF anywhere, bare CR
  CHECK(refusal("GET http://a.test/ HTTP/1.1\nHost: a.test\r\n\r\n") == 400);
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a.test\n\r\n") == 400);
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\n") == 400);
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a\rb.test\r\n\r\n") == 400);
  // TE other than chunked, or repeated
  CHECK(refusal("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, "
                "chunked\r\n\r\n") != 0);
  CHECK(refusal("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
                "Transfer-Encoding: chunked\r\n\r\n") != 0);
  // Two Host headers, space before the colon, NUL
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n") == 400);
  CHECK(refusal("GET http://a.test/ HTTP/1.1\r\nHost : a.test\r\n\r\n") == 400);
  CHECK(refusal(std::string("GET http://a.test/ HTTP/1.1\r\nHost: a\0.test\r\n\r\n", 44)) == 400);
  // Not HTTP/1
  CHECK(refusal("GET http://a.test/ HTTP/2.0\r\nHost: a.test\r\n\r\n") != 0);
  CHECK(refusal("get http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n") == 400);
}

TEST_CASE("head limits answer 431") {
  Limits lim;
  lim.max_head_bytes = 1024;
  lim.max_headers = 10;
  HeadScanner scan(lim);
  size_t used;
  ParseError err;
  std::string big = "GET http://a.test/ HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n";
  CHECK(scan.scan(big, &used, &err) == HeadScanner::Status::error);
  CHECK(err.status == 431);

  std::string many = "GET http://a.test/ HTTP/1.1\r\n";
  for (int i = 0; i < 11; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  many += "\r\n";
  Parser p(HTTP_REQUEST, lim);
  auto r = parse_request(p, lim, many);
  CHECK_FALSE(r.ok);
  CHECK(r.err.status == 431);
}

TEST_CASE("the head scanner finds the end across reads") {
  Limits lim;
  HeadScanner scan(lim);
  size_t used = 0;
  ParseError err;
  CHECK(scan.scan("GET / HTTP/1.1\r", &used, &err) == HeadScanner::Status::need_more);
  CHECK(scan.scan("\nHost: a\r\n\r", &used, &err) == HeadScanner::Status::need_more);
  CHECK(scan.scan("\nBODY", &used, &err) == HeadScanner::Status::complete);
  CHECK(used == 1);
}

TEST_CASE("bodies stop exactly at the end of the message") {
  Limits lim;
  Parser p(HTTP_REQUEST, lim);
  std::string rest;
  auto r = parse_request(p, lim,
                         "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: "
                         "chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET http://a.test/ HTTP/1.1\r\n",
                         &rest);
  REQUIRE(r.ok);
  CHECK(r.head.chunked);
  std::string body;
  p.on_body = [&](std::string_view b) { body += b; };
  ParseError err;
  auto used = p.parse_body(rest.data(), 4, &err);  // split mid-chunk
  REQUIRE(used);
  CHECK(*used == 4);
  auto used2 = p.parse_body(rest.data() + 4, rest.size() - 4, &err);
  REQUIRE(used2);
  CHECK(p.message_complete());
  CHECK(body == "hello");
  CHECK(rest.substr(4 + *used2) == "GET http://a.test/ HTTP/1.1\r\n");

  // A malformed chunk size is a framing error.
  Parser q(HTTP_REQUEST, lim);
  auto r2 = parse_request(q, lim,
                          "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: "
                          "chunked\r\n\r\nzz\r\n",
                          &rest);
  REQUIRE(r2.ok);
  CHECK_FALSE(q.parse_body(rest.data(), rest.size(), &err).has_value());
}

TEST_CASE("a refused trailer field ends the body with a 400, even split across reads") {
  Limits lim;
  const std::string head =
      "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n";
  auto run = [&](const std::string& body, size_t split, ParseError* err) {
    Parser p(HTTP_REQUEST, lim);
    p.refuse_trailer = [](std::string_view n) { return fy::iequals(n, "fy-stamp"); };
    std::string rest;
    REQUIRE(parse_request(p, lim, head + body, &rest).ok);
    auto a = p.parse_body(rest.data(), split, err);
    if (!a) return false;
    auto b = p.parse_body(rest.data() + split, rest.size() - split, err);
    return b.has_value() && p.message_complete();
  };
  const std::string stamped = "5\r\nhello\r\n0\r\nX-A: 1\r\nFY-STAMP: v=1\r\n\r\n";
  for (size_t split : {size_t{1}, size_t{14}, size_t{24}, size_t{27}, stamped.size() - 1}) {
    ParseError err;
    CHECK_FALSE(run(stamped, split, &err));
    CHECK(err.status == 400);
    CHECK(err.reason.find("trailer section carries a FY-STAMP field") != std::string::npos);
  }
  // Other trailers, and a longer name that starts the same, pass.
  ParseError err;
  CHECK(run("5\r\nhello\r\n0\r\nX-A: 1\r\nFy-Stamp-Not: 2\r\n\r\n", 20, &err));
  CHECK(run(std::string("0\r\n") + std::string(200, 'a') + ": 1\r\n\r\n", 7, &err));
}

TEST_CASE("responses: HEAD, 204 and 304 carry no body; the parser moves on") {
  Limits lim;
  Parser p(HTTP_RESPONSE, lim);
  ParseError err;
  Head h;
  p.expect_response_to(HTTP_HEAD);
  REQUIRE(p.parse_head("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", &h, &err));
  CHECK(p.message_complete());
  p.next_message();
  p.expect_response_to(HTTP_GET);
  REQUIRE(p.parse_head("HTTP/1.1 204 No Content\r\n\r\n", &h, &err));
  CHECK(h.status == 204);
  CHECK(p.message_complete());
  p.next_message();
  REQUIRE(p.parse_head("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", &h, &err));
  CHECK(p.message_complete());
  p.next_message();
  REQUIRE(p.parse_head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", &h, &err));
  CHECK_FALSE(p.message_complete());
  auto used = p.parse_body("okHTTP", 6, &err);
  REQUIRE(used);
  CHECK(*used == 2);
  CHECK(p.message_complete());
}

TEST_CASE("responses: 100 Continue, then the final response") {
  Limits lim;
  Parser p(HTTP_RESPONSE, lim);
  ParseError err;
  Head h;
  REQUIRE(p.parse_head("HTTP/1.1 100 Continue\r\n\r\n", &h, &err));
  CHECK(h.status == 100);
  CHECK(p.message_complete());
  p.next_message();
  REQUIRE(p.parse_head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", &h, &err));
  CHECK(h.status == 200);
}

TEST_CASE("close-delimited response bodies end at EOF") {
  Limits lim;
  Parser p(HTTP_RESPONSE, lim);
  ParseError err;
  Head h;
  REQUIRE(p.parse_head("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", &h, &err));
  CHECK(p.body_until_eof());
  CHECK_FALSE(h.keep_alive);
  REQUIRE(p.parse_body("abc", 3, &err) == std::optional<size_t>(3));
  CHECK(p.finish());
  CHECK(p.message_complete());
}

TEST_CASE("request heads are rewritten for the origin") {
  Limits lim;
  Parser p(HTTP_REQUEST, lim);
  auto r = parse_request(p, lim,
                         "GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive, "
                         "X-Hop, Content-Length\r\nX-Hop: 1\r\nProxy-Authorization: Basic eA==\r\n"
                         "Fy-Stamp: v=1\r\nFY-STAMP: v=2\r\nAuthorization: Bearer dummy\r\n"
                         "Accept: */*\r\n\r\n");
  REQUIRE(r.ok);
  RequestOut out;
  out.method = "GET";
  out.target = "/x";
  out.host = "a.test";
  out.set.emplace_back("Authorization", "Bearer real");
  std::string head;
  build_request_head(head, r.head, out);
  CHECK(head ==
        "GET /x HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nAuthorization: Bearer real\r\n\r\n");
}

TEST_CASE("an upgrade keeps Upgrade and says Connection: upgrade") {
  Limits lim;
  Parser p(HTTP_REQUEST, lim);
  auto r = parse_request(p, lim,
                         "GET http://a.test/ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\nSec-WebSocket-Key: k\r\n\r\n");
  REQUIRE(r.ok);
  CHECK(r.head.upgrade);
  RequestOut out;
  out.method = "GET";
  out.target = "/ws";
  out.upgrade = true;
  std::string head;
  build_request_head(head, r.head, out);
  CHECK(head ==
        "GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n"
        "Connection: upgrade\r\n\r\n");
}

// ---------------------------------------------------------------------------
// The would_block rate limit and the connection budget (proxy/server, proxy/config).

#include "proxy/config.h"
#include "proxy/server/server.h"

TEST_CASE("would_block: one row per key per 60 s on the caller's clock") {
  fy::proxy::WouldBlockLimiter lim;
  const int64_t w = 7;
  CHECK(lim.allow("a.test:443", 1'000, w));
  CHECK_FALSE(lim.allow("a.test:443", 1'001, w));
  CHECK_FALSE(lim.allow("a.test:443", 60'999, w));  // 59.999 s later
  CHECK(lim.allow("a.test:443", 61'000, w));        // 60 s later
  CHECK_FALSE(lim.allow("a.test:443", 61'001, w));
  // A new observation window reports every key again.
  CHECK(lim.allow("a.test:443", 61'002, w + 1));
  // A clock that steps back reports the key rather than silencing it.
  CHECK(lim.allow("a.test:443", 10, w + 1));
  CHECK_FALSE(lim.allow("a.test:443", 11, w + 1));
}

TEST_CASE("would_block: a flood of new keys evicts the oldest, never every key") {
  fy::proxy::WouldBlockLimiter lim;
  using L = fy::proxy::WouldBlockLimiter;
  const int64_t w = 1;
  auto key = [](size_t i) { return "k" + std::to_string(i) + ".test:443"; };
  // 4096 keys fill the map, one per millisecond.
  for (size_t i = 0; i < L::kMaxKeys; ++i) REQUIRE(lim.allow(key(i), static_cast<int64_t>(i), w));
  CHECK(lim.size() == L::kMaxKeys);
  // The 4097th makes room by forgetting the oldest (k0) only.
  int64_t t = 10'000;
  CHECK(lim.allow(key(L::kMaxKeys), t, w));
  CHECK(lim.size() == L::kMaxKeys);
  // Keys seen within their 60 s stay limited: the flood reset nobody else.
  CHECK_FALSE(lim.allow(key(1), t, w));
  CHECK_FALSE(lim.allow(key(L::kMaxKeys / 2), t, w));
  CHECK_FALSE(lim.allow(key(L::kMaxKeys - 1), t, w));
  CHECK_FALSE(lim.allow(key(L::kMaxKeys), t + 1, w));
  // The evicted one may be reported again (it was the oldest report); it
  // makes room by evicting k1, now the oldest.
  CHECK(lim.allow(key(0), t, w));
  CHECK(lim.size() == L::kMaxKeys);
  CHECK_FALSE(lim.allow(key(2), t, w));
  // Another 100 new keys evict the 100 oldest (k2..k101), in order.
  for (size_t i = 0; i < 100; ++i) CHECK(lim.allow("new" + std::to_string(i), t, w));
  CHECK(lim.size() == L::kMaxKeys);
  CHECK_FALSE(lim.allow(key(102), t, w));
  CHECK_FALSE(lim.allow(key(200), t, w));
  CHECK(lim.allow(key(101), t, w));  // evicted: reported again, evicting k102
  CHECK(lim.allow(key(102), t, w));
  CHECK_FALSE(lim.allow(key(104), t, w));
  // 60 s after its report each key may be reported again; expired keys are
  // forgotten, so the map shrinks instead of evicting live ones.
  CHECK(lim.allow(key(2000), 2000 + L::kIntervalMs, w));
  CHECK(lim.size() < L::kMaxKeys);
  CHECK_FALSE(lim.allow(key(2000), 2000 + L::kIntervalMs + 1, w));
  CHECK_FALSE(lim.allow(key(L::kMaxKeys), t + L::kIntervalMs - 1, w));
  CHECK(lim.allow(key(L::kMaxKeys), t + L::kIntervalMs, w));
  // Long after every report, a fresh start: all forgotten but the one just made.
  CHECK(lim.allow("late.test:443", t + 10 * L::kIntervalMs, w));
  CHECK(lim.size() == 1);
}

TEST_CASE("connection budget: one descriptor a client beyond a reserve") {
  using fy::proxy::connection_budget;
  auto b = connection_budget(64, 16384);
  CHECK(b.lowered);
  CHECK(b.reserve == 32 + 64 / 16);
  CHECK(b.max_connections == 64 - b.reserve);
  // 20,000 descriptors hold the default 16,384 idle clients; their origins are
  // bounded at dial time (Server::descriptors_short), not here.
  b = connection_budget(20000, 16384);
  CHECK_FALSE(b.lowered);
  CHECK(b.max_connections == 16384);
  b = connection_budget(16000, 16384);
  CHECK(b.lowered);
  CHECK(b.max_connections == 16000 - 32 - 16000 / 16);
  CHECK(b.nofile_needed > 16384);
  // nofile_needed is exactly the smallest limit that admits the configured count.
  auto at = connection_budget(b.nofile_needed, 16384);
  CHECK_FALSE(at.lowered);
  CHECK(at.max_connections == 16384);
  CHECK(connection_budget(b.nofile_needed - 1, 16384).lowered);
  // Plenty of descriptors: the configured limit stands.
  b = connection_budget(1 << 20, 16384);
  CHECK_FALSE(b.lowered);
  CHECK(b.max_connections == 16384);
  CHECK(connection_budget(~uint64_t{0}, 1'000'000).max_connections == 1'000'000);
  // Too few to serve anyone.
  CHECK(connection_budget(20, 100).max_connections == 0);
  CHECK(connection_budget(0, 1).nofile_needed == 35);
  CHECK(connection_budget(35, 1).max_connections == 1);
}

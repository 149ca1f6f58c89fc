// Http1ClientCodec (proxy/server/client_http1.h) on its own, through the
// ClientCodec interface: heads across reads, parse and framing outcomes,
// bodies to their end, the stash of pipelined bytes and its bound, the
// replay's turns, the keep-alive decision, and the exact bytes it encodes
// for the client (answers, the 407, a CONNECT's 200, a forwarded response
// head). No loop: the codec owns no handle.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <string_view>

#include "core/buffer.h"
#include "proxy/http/answers.h"
#include "proxy/http/parser.h"
#include "proxy/server/client_http1.h"

using fy::ChunkPool;
using fy::ChunkRef;
using fy::http::Head;
using fy::http::Limits;
using fy::http::ParseError;
using fy::proxy::ClientCodec;
using fy::proxy::Http1ClientCodec;
using Status = ClientCodec::HeadRead::Status;
using Parsed = ClientCodec::Parsed;

namespace {

const Limits& limits() {
  static Limits l;
  return l;
}

// Reads and parses one head; REQUIREs it is whole.
Parsed read_one(ClientCodec& c, std::string_view bytes, ParseError* err, size_t* used = nullptr) {
  ClientCodec::HeadRead r = c.read_head(bytes);
  REQUIRE(r.status == Status::head);
  if (used) *used = r.used;
  return c.parse_head(r.head, err);
}

ChunkRef chunk_with(std::string_view s) {
  ChunkRef c = ChunkPool::alloc();
  memcpy(c->data(), s.data(), s.size());
  return c;
}

}  // namespace

TEST_CASE("http1 codec: a head whole, a head across reads, one too large") {
  Http1ClientCodec codec(limits());
  ClientCodec& c = codec;
  CHECK_FALSE(c.head_started());
  std::string one = "GET http://example.com/a HTTP/1.1\r\nHost: example.com\r\n\r\n";
  ParseError err;
  size_t used = 0;
  std::string two = one + "GET /next";  // the head's views are into it
  CHECK(read_one(c, two, &err, &used) == Parsed::ok);
  CHECK(used == one.size());  // the pipelined bytes are not the head's
  CHECK(c.head().method == "GET");
  CHECK(c.head().target == "http://example.com/a");
  CHECK(c.request_complete());
  c.next_request();

  ClientCodec::HeadRead r = c.read_head("GET http://example.com/b HTTP/1.1\r\nHo");
  CHECK(r.status == Status::need_more);
  CHECK(c.head_started());
  r = c.read_head("st: example.com\r\n\r\n");
  REQUIRE(r.status == Status::head);
  CHECK(c.parse_head(r.head, &err) == Parsed::ok);
  CHECK(c.head().target == "http://example.com/b");
  c.next_request();
  CHECK_FALSE(c.head_started());

  r = c.read_head("GET / HTTP/1.1\r\nX: " + std::string(limits().max_head_bytes + 10, 'a'));
  CHECK(r.status == Status::error);
  CHECK(r.error.status == 431);
}

TEST_CASE("http1 codec: unparsed and badly framed heads") {
  Http1ClientCodec c(limits());
  ParseError err;
  CHECK(read_one(c, "\x01\x02 nonsense HTTP/1.1\r\n\r\n", &err) == Parsed::unparsed);
  CHECK(err.status >= 400);
  c.restart();
  err = {};
  CHECK(read_one(c, "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
                 &err) == Parsed::bad_framing);
  CHECK(err.status == 400);
  CHECK(c.head().get("host") == std::string_view("a.example"));  // read, but refused
}

TEST_CASE("http1 codec: keep-alive as the head says, and not past a client's EOF") {
  Http1ClientCodec c(limits());
  ParseError err;
  REQUIRE(read_one(c, "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", &err) ==
          Parsed::ok);
  CHECK(c.keeps_alive(false));
  CHECK_FALSE(c.keeps_alive(true));  // closed, nothing more to serve
  ChunkRef ch = chunk_with("GET http://a.example/2 HTTP/1.1\r\n\r\n");
  CHECK_FALSE(c.stash(ch, ch->data(), 10));
  CHECK(c.keeps_alive(true));  // closed, but a pipelined request waits
  c.drop_stash();
  c.next_request();

  REQUIRE(read_one(c, "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
                   &err) == Parsed::ok);
  CHECK_FALSE(c.keeps_alive(false));

  Http1ClientCodec old(limits());  // (llhttp reads nothing after a close)
  REQUIRE(read_one(old, "GET http://a.example/ HTTP/1.0\r\nHost: a.example\r\n\r\n", &err) ==
          Parsed::ok);
  CHECK_FALSE(old.keeps_alive(false));
}

TEST_CASE("http1 codec: a body to its end, a malformed one, a stamp in a trailer") {
  Http1ClientCodec c(limits());
  ParseError err;
  REQUIRE(read_one(c, "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\n",
                   &err) == Parsed::ok);
  CHECK_FALSE(c.request_complete());
  std::string rest = "helloGET ";
  ClientCodec::BodyRead b = c.read_body(rest.data(), rest.size());
  CHECK(b.ok);
  CHECK(b.used == 5);
  CHECK(c.request_complete());
  c.next_request();

  REQUIRE(read_one(c, "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n",
                   &err) == Parsed::ok);
  std::string bad = "zz\r\n";
  b = c.read_body(bad.data(), bad.size());
  CHECK_FALSE(b.ok);
  c.restart();

  REQUIRE(read_one(c, "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n",
                   &err) == Parsed::ok);
  std::string trailer = "1\r\nx\r\n0\r\nFy-Stamp: forged\r\n\r\n";
  b = c.read_body(trailer.data(), trailer.size());
  CHECK_FALSE(b.ok);  // it would go on unstripped
  CHECK(b.error.status == 400);
}

TEST_CASE("http1 codec: a kept head survives its read bytes") {
  Http1ClientCodec c(limits());
  std::string head = "GET http://a.example/kept HTTP/1.1\r\nHost: a.example\r\nX-A: b\r\n\r\n";
  ChunkRef ch = chunk_with(head);
  ParseError err;
  REQUIRE(read_one(c, std::string_view(ch->data(), head.size()), &err) == Parsed::ok);
  c.keep_head();
  c.keep_head();  // once kept, kept
  memset(ch->data(), 'z', head.size());  // the chunk is reused
  CHECK(c.head().method == "GET");
  CHECK(c.head().target == "http://a.example/kept");
  CHECK(c.head().get("x-a") == std::string_view("b"));
}

TEST_CASE("http1 codec: the stash keeps order, and says when it is over its bound") {
  Http1ClientCodec c(limits());
  CHECK_FALSE(c.pipelined());
  ChunkRef a = chunk_with("abcdef");
  CHECK_FALSE(c.stash(a, a->data() + 1, 2));  // "bc"
  CHECK_FALSE(c.stash(a, a->data() + 4, 2));  // "ef"
  CHECK(c.pipelined());
  std::vector<fy::Slice> s = c.take_stash();
  REQUIRE(s.size() == 2);
  CHECK(std::string_view(s[0].data(), s[0].len) == "bc");
  CHECK(std::string_view(s[1].data(), s[1].len) == "ef");
  CHECK_FALSE(c.pipelined());

  // The bound counts bytes, not slices, and starts over after take_stash().
  size_t left = Http1ClientCodec::kMaxStash;
  while (left > 0) {
    ChunkRef ch = ChunkPool::alloc();
    size_t take = std::min(left, fy::Chunk::kSize);
    CHECK_FALSE(c.stash(ch, ch->data(), take));
    left -= take;
  }
  ChunkRef one = chunk_with("x");
  CHECK(c.stash(one, one->data(), 1));
  (void)c.take_stash();
  CHECK_FALSE(c.stash(one, one->data(), 1));
  c.drop_stash();
  CHECK_FALSE(c.pipelined());
}

TEST_CASE("http1 codec: the replay's turns") {
  Http1ClientCodec c(limits());
  c.schedule_replay();
  CHECK_FALSE(c.replay_pending());  // nothing waits
  ChunkRef ch = chunk_with("GET ");
  CHECK_FALSE(c.stash(ch, ch->data(), 4));
  c.schedule_replay();
  CHECK(c.replay_pending());
  CHECK_FALSE(c.client_drained());  // not blocked: nothing to do

  CHECK_FALSE(c.replay_turn(/*client_full=*/true));
  CHECK_FALSE(c.replay_pending());
  CHECK(c.replay_blocked());
  CHECK(c.client_drained());  // pending again: the owner arms its timer
  CHECK(c.replay_pending());
  CHECK_FALSE(c.replay_blocked());
  CHECK_FALSE(c.client_drained());

  CHECK(c.replay_turn(false));
  CHECK_FALSE(c.replay_pending());
  CHECK_FALSE(c.replay_blocked());
}

TEST_CASE("http1 codec: an answer, kept alive and closing") {
  Http1ClientCodec codec(limits());
  const ClientCodec& c = codec;
  fy::answers::Reply r{502, "no\n"};
  CHECK(c.encode_answer(r, /*close=*/false) ==
        "HTTP/1.1 502 Bad Gateway\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        "Content-Length: 3\r\n"
        "\r\n"
        "no\n");
  CHECK(c.encode_answer(r, /*close=*/true) ==
        "HTTP/1.1 502 Bad Gateway\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        "Content-Length: 3\r\n"
        "Connection: close\r\n"
        "\r\n"
        "no\n");
  // The reply's content type, and the catalogue's texts as they are.
  fy::answers::Reply j{401, "{}", fy::answers::kJson};
  CHECK(c.encode_answer(j, false) ==
        "HTTP/1.1 401 Unauthorized\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 2\r\n"
        "\r\n"
        "{}");
  fy::answers::Reply bad = fy::answers::bad_head(431, "too big");
  std::string out = c.encode_answer(bad, true);
  CHECK(out.starts_with("HTTP/1.1 431 "));
  CHECK(out.ends_with("Connection: close\r\n\r\n" + bad.body));
  CHECK(r.body == "no\n");  // the reply is not consumed
}

TEST_CASE("http1 codec: the 407 asks for the build's credential") {
  Http1ClientCodec codec(limits());
  const ClientCodec& c = codec;
  fy::answers::Reply r = fy::answers::build_challenge("git.test:443");
  std::string length = std::to_string(r.body.size());
  std::string head =
      "HTTP/1.1 407 Proxy Authentication Required\r\n"
      "Content-Type: text/plain; charset=utf-8\r\n"
      "Content-Length: " +
      length + "\r\n" + "Proxy-Authenticate: Basic realm=\"foldyard build\"\r\n";
  CHECK(c.encode_challenge(r, false) == head + "\r\n" + r.body);
  CHECK(c.encode_challenge(r, true) == head + "Connection: close\r\n\r\n" + r.body);
}

TEST_CASE("http1 codec: a CONNECT's 200") {
  Http1ClientCodec codec(limits());
  const ClientCodec& c = codec;
  CHECK(c.encode_connect_established() == "HTTP/1.1 200 Connection established\r\n\r\n");
}

TEST_CASE("http1 codec: the origin's response head, rewritten for the client") {
  Http1ClientCodec codec(limits());
  const ClientCodec& c = codec;
  Limits lim;
  fy::http::Parser p(HTTP_RESPONSE, lim);
  ParseError err;
  Head h;
  REQUIRE(
      p.parse_head("HTTP/1.1 200 Fine\r\n"
                   "Content-Length: 2\r\n"
                   "Connection: keep-alive, X-Hop\r\n"
                   "Keep-Alive: timeout=5\r\n"
                   "X-Hop: 1\r\n"
                   "Fy-Stamp: v=1\r\n"
                   "X-End: 2\r\n"
                   "\r\n",
                   &h, &err));
  std::string kept = "HTTP/1.1 200 Fine\r\nContent-Length: 2\r\nX-End: 2\r\n";
  CHECK(c.encode_response_head(h, /*close=*/false, /*upgrade=*/false) == kept + "\r\n");
  CHECK(c.encode_response_head(h, /*close=*/true, false) == kept + "Connection: close\r\n\r\n");

  fy::http::Parser p101(HTTP_RESPONSE, lim);
  Head up;
  REQUIRE(
      p101.parse_head("HTTP/1.1 101 Switching Protocols\r\n"
                      "Upgrade: websocket\r\n"
                      "Connection: Upgrade\r\n"
                      "\r\n",
                      &up, &err));
  CHECK(c.encode_response_head(up, false, /*upgrade=*/true) ==
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: upgrade\r\n"
        "\r\n");
}

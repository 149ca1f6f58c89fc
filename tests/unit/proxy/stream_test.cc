// Stream (proxy/io/stream.h) on a loop of its own, over real loopback TCP:
// flow control at the watermarks, pause/resume, FIN, RST, connect failures,
// close_and_delete and the live() count.
#include <doctest/doctest.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <memory>
#include <optional>
#include <string>

#include "core/clock.h"
#include "proxy/io/stream.h"
#include "proxy/tls/ca.h"
#include "proxy/tls/context.h"
#include "tests/unit/proxy/loop_util.h"

using fy::errc_name;
using fy::proxy::Stream;
using fy::test::connect_pair;
using fy::test::Recorder;
using fy::test::run_for;
using fy::test::run_until;

namespace {

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 251) % 26);
  return s;
}

// TLS between two Streams: a throwaway CA (the proxy's own CertAuthority in a
// temporary directory) signs the server's leaf for 127.0.0.1, and the client
// trusts that CA. The server starts TLS with the first bytes it reads (the
// ClientHello), as a decrypting connection does.
struct Tls {
  std::string dir;
  std::unique_ptr<fy::tls::CertAuthority> ca;
  bssl::UniquePtr<SSL_CTX> server_ctx, client_ctx;
  CRYPTO_BUFFER* leaf = nullptr;
  Tls() {
    char tmpl[] = "/tmp/fy-stream-tls.XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    bool created = false;
    auto made = fy::tls::CertAuthority::load_or_create(dir, 8, &created);
    REQUIRE(made);
    CHECK(created);
    ca = std::move(*made);
    auto l = ca->leaf_for("127.0.0.1", fy::wall_ms());
    REQUIRE(l);
    leaf = *l;
    auto sc = fy::tls::make_server_context();
    REQUIRE(sc);
    server_ctx = std::move(*sc);
    fy::tls::ClientTrust trust;
    trust.system_roots = "";
    trust.extra_bundle = ca->cert_path();
    auto cc = fy::tls::make_client_context(trust);
    REQUIRE(cc);
    client_ctx = std::move(*cc);
  }
  ~Tls() {
    std::string cmd = "rm -rf '" + dir + "'";
    (void)system(cmd.c_str());
  }
};

struct TlsServer : Recorder {
  Tls* tls = nullptr;
  void on_read(Stream& s, const fy::ChunkRef& c, const char* p, size_t n) override {
    if (!s.is_tls()) {
      s.start_tls_server(tls->server_ctx.get(), tls->leaf, tls->ca->ca_der(), tls->ca->leaf_key(),
                         std::string_view(p, n));
      return;
    }
    Recorder::on_read(s, c, p, n);
  }
};

}  // namespace

TEST_CASE("stream: bytes both ways, and a write below the high watermark never drains") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    CHECK(Stream::live() == live0 + 2);
    CHECK(p.client->connected());
    CHECK(p.server->connected());
    CHECK(s.readies == 0);  // a plain accepted stream is ready without on_ready
    p.server->start_reading();
    p.client->start_reading();
    p.client->write("ping");
    CHECK_FALSE(p.client->above_high());
    REQUIRE(run_until(&loop, [&] { return s.data == "ping"; }));
    p.server->write("pong");
    REQUIRE(run_until(&loop, [&] { return c.data == "pong"; }));
    CHECK(p.client->bytes_out() == 4);
    CHECK(p.client->bytes_in() == 4);
    CHECK(p.server->peer_address().rfind("127.0.0.1:", 0) == 0);
    CHECK(c.drains == 0);  // never above the high watermark
    CHECK(s.drains == 0);
    p.client->close_and_delete();
    p.server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(Stream::live() == live0);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: a write past the high watermark is above_high until the peer reads, then "
          "on_drain comes once at or below the low one") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    // Small kernel buffers so the queue, not the socket, holds the bytes.
    int small = 16 * 1024;
    REQUIRE(setsockopt(p.client->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    REQUIRE(setsockopt(p.server->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
    // One uv_write carries at most kMaxIov chunks, so the queue falls in
    // steps: this size leaves 2 * kLowWater (between the marks) after the
    // first write completes, where a drain would be too early.
    const size_t n = fy::WriteQueue::kMaxIov * fy::Chunk::kSize + 2 * Stream::kLowWater;
    static_assert(2 * Stream::kLowWater < Stream::kHighWater);
    std::string big = pattern(n);
    p.client->write(big);
    CHECK(p.client->above_high());
    CHECK(p.client->queued() > Stream::kHighWater);
    // The server does not read: the queue stays above, no drain.
    run_for(&loop, 100);
    CHECK(p.client->above_high());
    CHECK(c.drains == 0);
    p.server->start_reading();
    REQUIRE(run_until(&loop, [&] { return c.drains == 1; }));
    CHECK(c.queued_at_drain <= Stream::kLowWater);
    REQUIRE(run_until(&loop, [&] { return s.data.size() == n; }));
    CHECK(s.data == big);  // in order, nothing lost or repeated
    CHECK(c.drains == 1);  // once per crossing
    CHECK(p.client->queued() == 0);
    CHECK(p.client->bytes_out() == n);
    CHECK(p.server->bytes_in() == n);
    p.client->close_and_delete();
    p.server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(Stream::live() == live0);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: pause() delivers nothing until resume(), which delivers what waited") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    p.server->start_reading();
    p.server->pause();
    CHECK(p.server->paused());
    p.server->start_reading();  // a paused stream does not start reading
    p.client->write("held");
    run_for(&loop, 100);
    CHECK(s.reads == 0);
    p.server->resume();
    CHECK_FALSE(p.server->paused());
    REQUIRE(run_until(&loop, [&] { return s.data == "held"; }));
    p.client->close_and_delete();
    p.server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: shutdown() sends what is queued, then FIN: the peer's on_eof, once") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    std::string at_eof;
    s.then_eof = [&](Stream&) { at_eof = s.data; };
    p.server->start_reading();
    p.client->write("last words");
    p.client->shutdown();
    CHECK(p.client->write_shut());
    REQUIRE(run_until(&loop, [&] { return s.eofs == 1 && c.shutdowns == 1; }));
    CHECK(at_eof == "last words");  // every byte before the end
    CHECK(p.server->eof_seen());
    CHECK(p.client->shutdown_done());
    CHECK(s.errors == 0);
    CHECK(c.errors == 0);
    // The half-closed server can still answer.
    p.client->start_reading();
    p.server->write("reply");
    REQUIRE(run_until(&loop, [&] { return c.data == "reply"; }));
    run_for(&loop, 20);
    CHECK(s.eofs == 1);
    p.client->close_and_delete();
    p.server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: a peer's RST (SO_LINGER 0) is on_error with Errc::reset, not on_eof") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    s.then_error = [](Stream& st) { st.close_and_delete(); };
    p.server->start_reading();
    p.client->close_reset();  // uv_tcp_close_reset: SO_LINGER 0, then close
    CHECK(p.client->closing());
    REQUIRE(run_until(&loop, [&] { return s.errors == 1; }));
    CHECK(std::string(errc_name(s.kind)) == errc_name(fy::Errc::reset));
    CHECK(s.eofs == 0);
    // close_reset is a close: the client's handler is told on_closed, once.
    REQUIRE(run_until(&loop, [&] { return c.closes == 1; }));
    delete p.client;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(Stream::live() == live0);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: a connect to a closed port is on_error with Errc::connect, never on_ready") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    // A port that was just bound and closed: nothing listens there.
    fy::test::TestListener l;
    l.on_accept = [](uv_stream_t*) {};
    l.open(&loop);
    sockaddr_in addr = l.addr;
    l.close();
    uv_run(&loop, UV_RUN_NOWAIT);
    Recorder c;
    auto* st = new Stream(&loop, &c);
    c.then_error = [](Stream& s) { s.close_and_delete(); };
    REQUIRE(st->connect(reinterpret_cast<const sockaddr*>(&addr)) == 0);
    REQUIRE(run_until(&loop, [&] { return c.errors == 1; }));
    CHECK(std::string(errc_name(c.kind)) == errc_name(fy::Errc::connect));
    CHECK(c.readies == 0);
    CHECK(c.closes == 0);  // close_and_delete detached the handler
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: close_and_delete frees once, called twice, from a callback or with bytes "
          "queued; live() returns to where it started") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Recorder c, s;
    auto p = connect_pair(&loop, c, s);
    CHECK(Stream::live() == live0 + 2);
    // Twice before the loop turns: one close, one free (ASan sees a second).
    p.client->close_and_delete();
    p.client->close_and_delete();
    CHECK(Stream::live() == live0 + 2);  // counted until the close callback
    // From inside the server's on_eof (the client's close is a FIN).
    s.then_eof = [](Stream& st) { st.close_and_delete(); };
    p.server->start_reading();
    REQUIRE(run_until(&loop, [&] { return Stream::live() == live0; }));
    CHECK(s.eofs == 1);
    CHECK(c.closes == 0);  // detached: no callback after close_and_delete
    CHECK(s.closes == 0);

    // With bytes queued past the high watermark: they are dropped.
    Recorder c2, s2;
    auto q = connect_pair(&loop, c2, s2);
    int small = 16 * 1024;
    setsockopt(q.client->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    q.client->write(pattern(2 * Stream::kHighWater));
    CHECK(q.client->queued() > 0);
    q.client->close_and_delete();
    q.server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(Stream::live() == live0);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: TLS between two Streams with a throwaway CA: both ready, bytes both ways, "
          "close_notify is the peer's on_eof") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Tls tls;
    TlsServer s;
    s.tls = &tls;
    Recorder c;
    Stream* server = nullptr;
    fy::test::TestListener l;
    l.on_accept = [&](uv_stream_t* st) {
      server = new Stream(&loop, &s);
      REQUIRE(server->accept_from(st) == 0);
      server->start_reading();
    };
    l.open(&loop);
    auto* client = new Stream(&loop, &c);
    client->set_tls_client(tls.client_ctx.get(), "127.0.0.1");
    client->write("early");  // before the handshake: held, then sent encrypted
    REQUIRE(client->connect(l.sa()) == 0);
    REQUIRE(run_until(&loop, [&] { return c.readies == 1 && s.readies == 1; }));
    l.close();
    CHECK(client->tls_established());
    CHECK(server->tls_established());
    CHECK_FALSE(client->verify_failure());
    REQUIRE(run_until(&loop, [&] { return s.data == "early"; }));
    server->write("answer");
    REQUIRE(run_until(&loop, [&] { return c.data == "answer"; }));
    CHECK(client->bytes_out() == 5);  // plaintext counted once
    client->shutdown();
    REQUIRE(run_until(&loop, [&] { return s.eofs == 1; }));
    CHECK(s.errors == 0);
    CHECK(c.errors == 0);
    client->close_and_delete();
    server->close_and_delete();
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(Stream::live() == live0);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("stream: a certificate for another name is Errc::tls with a typed verify failure") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  uint64_t live0 = Stream::live();
  {
    Tls tls;
    TlsServer s;
    s.tls = &tls;
    s.then_error = [](Stream& st) { st.close_and_delete(); };
    s.then_eof = [](Stream& st) { st.close_and_delete(); };
    Recorder c;
    fy::test::TestListener l;
    l.on_accept = [&](uv_stream_t* st) {
      auto* server = new Stream(&loop, &s);
      REQUIRE(server->accept_from(st) == 0);
      server->start_reading();
    };
    l.open(&loop);
    auto* client = new Stream(&loop, &c);
    client->set_tls_client(tls.client_ctx.get(), "origin.example");
    std::optional<fy::proxy::TlsVerifyFailure> seen;
    c.then_error = [&](Stream& st) {
      seen = st.verify_failure();
      st.close_and_delete();
    };
    REQUIRE(client->connect(l.sa()) == 0);
    REQUIRE(run_until(&loop, [&] { return c.errors == 1; }));
    l.close();
    CHECK(std::string(errc_name(c.kind)) == errc_name(fy::Errc::tls));
    CHECK(c.readies == 0);
    REQUIRE(seen);
    CHECK(seen->code == X509_V_ERR_HOSTNAME_MISMATCH);
    CHECK(seen->reason == X509_verify_cert_error_string(X509_V_ERR_HOSTNAME_MISMATCH));
    CHECK(c.detail == "certificate verify failed: " + seen->reason);
    CHECK(s.readies == 0);
    REQUIRE(run_until(&loop, [&] { return Stream::live() == live0; }));
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

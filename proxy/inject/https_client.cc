#include "proxy/inject/https_client.h"

#include <netdb.h>

#include <cstring>

#include "core/loop.h"
#include "proxy/http/parser.h"
#include "proxy/io/stream.h"

namespace fy::inject {

// Owns itself: freed once `done` has run (or the call was cancelled) and every
// handle it opened is closed.
class HttpsCall final : public proxy::StreamHandler {
 public:
  HttpsCall(uv_loop_t* loop, SSL_CTX* ctx, HttpsRequest req,
            std::function<void(Result<HttpsResponse>)> done)
      : loop_(loop), ctx_(ctx), req_(std::move(req)), done_(std::move(done)),
        reader_(limits_), parser_(HTTP_RESPONSE, limits_) {
    uv_timer_init(loop, &timer_);
    timer_.data = this;
    parser_.on_body = [this](std::string_view b) {
      if (resp_.body.size() < (1 << 20)) resp_.body.append(b);
    };
  }

  void start(const std::string& ip, uint16_t port) {
    uv_timer_start(&timer_, [](uv_timer_t* t) {
      static_cast<HttpsCall*>(t->data)->finish(make_error(Errc::timeout, "no answer within {} s",
          static_cast<HttpsCall*>(t->data)->req_.timeout_ms / 1000));
    }, req_.timeout_ms, 0);
    if (!ip.empty()) {
      sockaddr_storage ss;
      socklen_t len;
      make_sockaddr(ip, port, &ss, &len);
      int rc = connect(reinterpret_cast<sockaddr*>(&ss));
      if (rc != 0) defer_failure(make_error(Errc::connect, "{}", uv::error_string(rc)));
      return;
    }
    dns_.data = this;
    port_ = port;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = uv_getaddrinfo(loop_, &dns_, on_resolved, req_.dest.host.c_str(), nullptr, &hints);
    if (rc != 0) {
      dns_pending_ = false;
      defer_failure(make_error(Errc::dns, "{}: {}", req_.dest.host, uv::error_string(rc)));
      return;
    }
    dns_pending_ = true;
  }

  void cancel() {
    done_ = nullptr;
    finish(make_error(Errc::closed, "cancelled"));
  }

  void on_read(proxy::Stream&, const ChunkRef&, const char* p, size_t n) override {
    if (finished_) return;
    while (n > 0) {
      if (!head_done_) {
        size_t used = 0;
        http::ParseError err;
        std::string_view text;
        auto st = reader_.feed(std::string_view(p, n), &used, &text, &err);
        if (st == http::HeadScanner::Status::error) return finish(make_error(Errc::parse, "{}", err.reason));
        if (st == http::HeadScanner::Status::need_more) return;
        p += used;
        n -= used;
        http::Head h;
        if (!parser_.parse_head(text, &h, &err)) return finish(make_error(Errc::parse, "{}", err.reason));
        resp_.status = h.status;
        head_done_ = true;
        if (parser_.message_complete()) return finish(std::move(resp_));
        continue;
      }
      http::ParseError err;
      auto used = parser_.parse_body(p, n, &err);
      if (!used) return finish(make_error(Errc::parse, "{}", err.reason));
      p += *used;
      n -= *used;
      if (parser_.message_complete()) return finish(std::move(resp_));
    }
  }
  void on_eof(proxy::Stream&) override {
    if (head_done_ && parser_.finish()) return finish(std::move(resp_));
    finish(make_error(Errc::closed, "the server closed the connection before answering"));
  }
  void on_error(proxy::Stream&, Errc kind, const std::string& detail) override {
    finish(Error{kind, detail});
  }
  void on_ready(proxy::Stream& s) override {
    std::string out = req_.method + " " + req_.path + " HTTP/1.1\r\nHost: " + req_.dest.key(443) +
                      "\r\nConnection: close\r\nContent-Length: " + std::to_string(req_.body.size()) +
                      "\r\n";
    for (auto& [k, v] : req_.headers) out += k + ": " + v + "\r\n";
    out += "\r\n" + req_.body;
    s.write(out);
  }
  void on_closed(proxy::Stream&) override {
    stream_closed_ = true;
    maybe_free();
  }

 private:
  static void on_resolved(uv_getaddrinfo_t* req, int status, addrinfo* res) {
    auto* self = static_cast<HttpsCall*>(req->data);
    self->dns_pending_ = false;
    if (self->finished_) {
      if (res) uv_freeaddrinfo(res);
      self->maybe_free();
      return;
    }
    if (status != 0 || !res) {
      if (res) uv_freeaddrinfo(res);
      return self->finish(make_error(Errc::dns, "{} does not resolve ({})", self->req_.dest.host,
                                     uv_strerror(status)));
    }
    sockaddr_storage ss{};
    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(self->port_);
    uv_freeaddrinfo(res);
    int rc = self->connect(reinterpret_cast<sockaddr*>(&ss));
    if (rc != 0) self->finish(make_error(Errc::connect, "{}", uv::error_string(rc)));
  }

  int connect(const sockaddr* sa) {
    stream_ = new proxy::Stream(loop_, this);
    stream_->set_tls_client(ctx_, req_.dest.host);
    return stream_->connect(sa);
  }

  void defer_failure(Error e) {
    // Never call back from inside https_request(): report on the next turn.
    deferred_ = std::move(e);
    uv_timer_start(&timer_, [](uv_timer_t* t) {
      auto* self = static_cast<HttpsCall*>(t->data);
      self->finish(std::move(self->deferred_));
    }, 0, 0);
  }

  void finish(Result<HttpsResponse> r) {
    if (finished_) return;
    finished_ = true;
    auto done = std::move(done_);
    done_ = nullptr;
    if (stream_) {
      stream_->close();
    } else {
      stream_closed_ = true;
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), [](uv_handle_t* h) {
      auto* self = static_cast<HttpsCall*>(h->data);
      self->timer_closed_ = true;
      self->maybe_free();
    });
    if (done) done(std::move(r));
  }

  void maybe_free() {
    if (finished_ && stream_closed_ && timer_closed_ && !dns_pending_) {
      delete stream_;
      delete this;
    }
  }

  uv_loop_t* loop_;
  SSL_CTX* ctx_;
  HttpsRequest req_;
  std::function<void(Result<HttpsResponse>)> done_;
  http::Limits limits_;
  http::HeadReader reader_;
  http::Parser parser_;
  bool head_done_ = false;
  HttpsResponse resp_;
  uv_timer_t timer_;
  uv_getaddrinfo_t dns_;
  uint16_t port_ = 0;
  proxy::Stream* stream_ = nullptr;
  Error deferred_;
  bool finished_ = false;
  bool stream_closed_ = false;
  bool timer_closed_ = false;
  bool dns_pending_ = false;
};

HttpsCall* https_request(uv_loop_t* loop, SSL_CTX* ctx, const Resolver& resolve, HttpsRequest req,
                         std::function<void(Result<HttpsResponse>)> done) {
  auto [ip, port] = resolve(req.dest);
  auto* call = new HttpsCall(loop, ctx, std::move(req), std::move(done));
  call->start(ip, port);
  return call;
}

void https_cancel(HttpsCall* call) { call->cancel(); }

}  // namespace fy::inject

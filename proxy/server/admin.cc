#include "proxy/server/admin.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/loop.h"
#include "core/net.h"
#include "proxy/http/parser.h"
#include "proxy/http/rewrite.h"
#include "proxy/io/stream.h"
#include "proxy/server/server.h"

namespace fy::proxy {
namespace {

// One admin request: read a head, answer, close. Frees itself when closed.
class AdminConn final : public StreamHandler {
 public:
  AdminConn(Server& srv, uv_loop_t* loop) : srv_(srv), stream_(loop, this), reader_(limits_) {}

  void start(uv_stream_t* listener) {
    if (stream_.accept_from(listener) != 0) {
      stream_.close();
      return;
    }
    stream_.start_reading();
  }

  void on_read(Stream&, const ChunkRef&, const char* p, size_t n) override {
    if (answered_) return;
    size_t used = 0;
    http::ParseError err;
    std::string_view text;
    auto st = reader_.feed(std::string_view(p, n), &used, &text, &err);
    if (st == http::HeadScanner::Status::need_more) return;
    if (st == http::HeadScanner::Status::error) {
      reply(err.status, err.reason + "\n", "text/plain");
      return;
    }
    http::Parser parser(HTTP_REQUEST, limits_);
    http::Head head;
    if (!parser.parse_head(text, &head, &err)) {
      reply(err.status, err.reason + "\n", "text/plain");
      return;
    }
    std::string_view target = head.target;
    if (head.method_id != HTTP_GET && head.method_id != HTTP_HEAD) {
      reply(405, "only GET is served here\n", "text/plain");
    } else if (target == "/metrics") {
      reply(200, srv_.render_metrics(), "text/plain; version=0.0.4");
    } else if (target == "/healthz" || target == "/") {
      reply(200, srv_.health(), "text/plain");
    } else {
      reply(404, "unknown path: try /healthz or /metrics\n", "text/plain");
    }
  }
  void on_eof(Stream&) override { stream_.close(); }
  void on_error(Stream&, Errc, const std::string&) override { stream_.close(); }
  void on_ready(Stream&) override {}
  void on_shutdown(Stream&) override { stream_.close(); }
  void on_closed(Stream&) override { delete this; }

 private:
  void reply(int status, std::string body, const char* type) {
    answered_ = true;
    http::Answer a;
    a.status = status;
    a.body = std::move(body);
    a.content_type = type;
    a.close = true;
    std::string out;
    http::build_answer(out, a);
    stream_.write(out);
    stream_.shutdown();
  }

  Server& srv_;
  http::Limits limits_;
  Stream stream_;
  http::HeadReader reader_;
  bool answered_ = false;
};

}  // namespace

Result<int> bind_and_listen(uv_tcp_t* tcp, const std::string& endpoint, int backlog,
                            uv_connection_cb cb) {
  std::string host = endpoint;
  uint16_t port = 0;
  size_t colon = endpoint.rfind(':');
  if (colon != std::string::npos) {
    host = endpoint.substr(0, colon);
    port = static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1)));
  }
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  sockaddr_storage ss;
  socklen_t len;
  if (!make_sockaddr(host, port, &ss, &len))
    return make_error(Errc::invalid_argument, "{} is not an IP address and port", endpoint);
  int rc = uv_tcp_bind(tcp, reinterpret_cast<const sockaddr*>(&ss), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(tcp), backlog, cb);
  if (rc != 0) {
    return make_error(Errc::io, "cannot listen on {}: {}{}", endpoint, uv::error_string(rc),
                      rc == UV_EADDRINUSE ? " — another process holds the port; stop it or pick "
                                            "another with --listen"
                                          : "");
  }
  sockaddr_storage bound;
  int blen = sizeof bound;
  uv_tcp_getsockname(tcp, reinterpret_cast<sockaddr*>(&bound), &blen);
  return static_cast<int>(sockaddr_port(reinterpret_cast<sockaddr*>(&bound)));
}

Listener::Listener(uv_loop_t* loop, int backlog, AcceptFn on_accept, ErrorFn on_error,
                   uint64_t pause_ms)
    : loop_(loop),
      backlog_(backlog),
      on_accept_(std::move(on_accept)),
      on_error_(std::move(on_error)),
      pause_ms_(pause_ms) {
  uv_tcp_init(loop_, &tcp_);
  tcp_.data = this;
  tcp_open_ = true;
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
}

Listener::~Listener() {
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

Result<int> Listener::listen(const std::string& endpoint) {
  auto port = bind_and_listen(&tcp_, endpoint, backlog_, on_connection);
  if (!port) return port;
  state_ = State::listening;
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&tcp_), &fd) == 0)
    spare_fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (spare_fd_ < 0)
    log::warn("listener {}: cannot keep a spare descriptor ({}); a failing accept will not pause",
              endpoint, strerror(errno));
  return port;
}

void Listener::on_connection(uv_stream_t* s, int status) {
  auto* self = static_cast<Listener*>(s->data);
  if (status == 0) {
    self->on_accept_(s);
    return;
  }
  // The callback may close the listener (a drain); pause only if it did not.
  self->on_error_(status);
  if (self->state_ == State::listening) self->pause();
}

void Listener::on_tcp_closed(uv_handle_t* h) {
  static_cast<Listener*>(h->data)->tcp_open_ = false;
}

void Listener::pause() {
  if (spare_fd_ < 0) return;  // closing the handle would close the socket itself
  state_ = State::paused;
  // uv_close closes the handle's descriptor at once, which also ends libuv's
  // accept loop; the spare keeps the socket listening.
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), on_tcp_closed);
  uv_timer_start(&timer_, on_resume, pause_ms_, 0);
}

void Listener::on_resume(uv_timer_t* t) {
  auto* self = static_cast<Listener*>(t->data);
  if (self->state_ != State::paused) return;
  // The socket moves into a new handle; a new spare is taken first, and while
  // none can be had (still out of descriptors) the pause goes on.
  int next = self->tcp_open_ ? -1 : ::fcntl(self->spare_fd_, F_DUPFD_CLOEXEC, 0);
  if (next < 0) {
    uv_timer_start(&self->timer_, on_resume, self->pause_ms_, 0);
    return;
  }
  uv_tcp_init(self->loop_, &self->tcp_);
  self->tcp_.data = self;
  self->tcp_open_ = true;
  int rc = uv_tcp_open(&self->tcp_, self->spare_fd_);
  if (rc == 0) {
    self->spare_fd_ = next;
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&self->tcp_), self->backlog_, on_connection);
    if (rc == 0) {
      self->state_ = State::listening;
      return;
    }
    // The handle owns the socket now: keep the new spare and retry.
  } else {
    ::close(next);
  }
  log::warn("listener: cannot resume accepting ({}); retrying in {} ms", uv::error_string(rc),
            self->pause_ms_);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->tcp_), on_tcp_closed);
  uv_timer_start(&self->timer_, on_resume, self->pause_ms_, 0);
}

void Listener::close() {
  if (state_ == State::closed) return;
  state_ = State::closed;
  uv::close(&timer_, nullptr);
  if (tcp_open_) uv::close(&tcp_, on_tcp_closed);
  if (spare_fd_ >= 0) {
    ::close(spare_fd_);
    spare_fd_ = -1;
  }
}

Admin::Admin(Server& srv, uv_loop_t* loop)
    : srv_(srv),
      listener_(
          loop, 64,
          [this, loop](uv_stream_t* s) {
            auto* conn = new AdminConn(srv_, loop);
            conn->start(s);
          },
          [this](int status) { srv_.accept_failed("admin", status); }) {}

Admin::~Admin() = default;

Result<int> Admin::listen(const std::string& endpoint) {
  return listener_.listen(endpoint);
}

void Admin::close() {
  listener_.close();
}

}  // namespace fy::proxy

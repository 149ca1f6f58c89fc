#include "proxy/server/admin.h"

#include <fmt/format.h>

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

Admin::Admin(Server& srv, uv_loop_t* loop) : srv_(srv) {
  uv_tcp_init(loop, &tcp_);
  tcp_.data = this;
  open_ = true;
}

Admin::~Admin() = default;

Result<int> Admin::listen(const std::string& endpoint) {
  return bind_and_listen(&tcp_, endpoint, 64, on_connection);
}

void Admin::on_connection(uv_stream_t* s, int status) {
  if (status < 0) return;
  auto* self = static_cast<Admin*>(s->data);
  auto* conn = new AdminConn(self->srv_, s->loop);
  conn->start(s);
}

void Admin::close() {
  if (!open_) return;
  open_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), nullptr);
}

}  // namespace fy::proxy

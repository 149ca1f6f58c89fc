#include "src/filter.h"

#include <grp.h>
#include <llhttp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/config.h"
#include "core/log.h"
#include "src/http.h"
#include "src/rewrite.h"
#include "src/route.h"
#include "src/stats.h"

namespace fy::sockfilter {
namespace {

constexpr std::string_view kPrefix = "foldyard socket filter: ";
constexpr std::string_view kUnreachable = "foldyard socket filter: upstream engine socket unreachable";
constexpr std::string_view kUnparseable = "foldyard socket filter: unparseable create body refused";
constexpr size_t kHighWater = 4 << 20;  // a side's write queue: stop reading the other side
constexpr size_t kLowWater = 1 << 20;   // resume under this

struct Server;

// One client connection and its own upstream connection. Owns both pipes and
// its timer by value; close() starts uv_close on each, and the object deletes
// itself in the last close callback. Callbacks that may call close() check
// closing_ before touching the handles again.
class Conn {
 public:
  Conn(Server* s, uint64_t id);
  ~Conn();
  uv_pipe_t* client() { return &client_; }
  void start();
  // Starts closing both sides; the object deletes itself once every handle
  // is closed. Safe to call more than once.
  void close();

 private:
  enum class State { head, body, wait_response, raw };
  struct WriteReq {
    uv_write_t req;
    std::string data;
    Conn* conn;
    bool to_client;
  };

  // Writes `data` to a side. Upstream writes before the connect completes wait
  // in pending_up_.
  // The bytes are copied only when they cannot be written at once.
  void write_client(std::string_view data);
  void write_upstream(std::string_view data);
  void write(uv_pipe_t* p, std::string_view data, bool to_client);
  void flow();  // applies the watermarks to both sides' reading

  void drive();                    // parses what in_ holds, as far as the state allows
  bool parse_head();               // state head: a whole head in in_ -> decided
  void parse_body();               // state body: feeds in_ to llhttp
  void request_done();             // the request went upstream whole
  void refuse(int status, std::string_view reason, std::string text, std::string_view code);
  void arm_body_timer();  // the idle bound, or what is left of the whole-body bound
  void go_raw();
  void on_upstream_data(const char* p, size_t n);
  void on_upstream_eof();
  void on_client_eof();
  void arm_timer(uint64_t ms);
  void on_timer();
  void maybe_finish_raw();
  void close_after_flush();
  void linger();

  static void on_alloc(uv_handle_t*, size_t, uv_buf_t* b);
  static void on_client_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b);
  static void on_upstream_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b);
  static void on_connect(uv_connect_t* r, int status);
  static void on_write(uv_write_t* r, int status);
  static void on_closed(uv_handle_t* h);

  // llhttp request callbacks
  static int rq_url(llhttp_t* p, const char* at, size_t n);
  static int rq_field(llhttp_t* p, const char* at, size_t n);
  static int rq_value(llhttp_t* p, const char* at, size_t n);
  static int rq_value_done(llhttp_t* p);
  static int rq_headers_done(llhttp_t* p);
  static int rq_body(llhttp_t* p, const char* at, size_t n);
  static int rq_done(llhttp_t* p);
  // llhttp response callbacks
  static int rs_headers_done(llhttp_t* p);
  static int rs_done(llhttp_t* p);

  Server* server_;
  uint64_t id_;
  uv_pipe_t client_{};
  uv_pipe_t upstream_{};
  uv_timer_t timer_{};
  uv_connect_t connect_req_{};
  uv_shutdown_t shut_client_{}, shut_up_{};
  int handles_ = 0;
  bool closing_ = false;

  State state_ = State::head;
  std::string in_;  // client bytes not yet parsed (or not yet relayed in raw)
  llhttp_settings_t rq_settings_{}, rs_settings_{};
  llhttp_t rq_{}, rs_{};
  RequestHead head_;
  bool in_headers_ = false;  // request llhttp is in the head (not trailers)
  bool new_field_ = true;
  bool head_done_ = false, msg_done_ = false;
  bool body_error_ = false;
  bool trailer_error_ = false;  // the request's trailer section has a field
  Action action_ = Action::pass;
  bool chunked_out_ = false;
  std::string create_body_;
  uint64_t body_seen_ = 0;
  uint64_t body_deadline_ = 0;  // uv_now by which a forwarded body must be whole (0: none)
  bool request_forwarded_ = false;  // head sent upstream for the current request
  bool response_started_ = false;
  int resp_status_ = 0;
  bool resp_raw_ = false, resp_final_done_ = false, resp_keep_alive_ = true;

  bool up_connected_ = false, up_failed_ = false;
  std::string pending_up_;
  bool client_eof_ = false, up_eof_ = false;
  bool shut_client_done_ = false, shut_up_done_ = false;
  bool shut_client_sent_ = false, shut_up_sent_ = false;
  bool closing_after_flush_ = false, lingering_ = false;
  int writes_client_ = 0, writes_up_ = 0;
  bool reading_client_ = false, reading_up_ = false;
  uint64_t requests_ = 0;
};

struct Server {
  uv_loop_t* loop;
  Config cfg;
  uv_pipe_t listener{};
  uv_signal_t sigterm{}, sigint{};
  uint64_t next_id = 1;
  uv_pipe_t stats_listener{};
  bool stats_on = false;
  Stats stats;
  std::unordered_set<Conn*> conns;  // live connections, closed on stop
};

Conn* of(uv_handle_t* h) { return static_cast<Conn*>(h->data); }
Conn* of_parser(llhttp_t* p) { return static_cast<Conn*>(p->data); }

Conn::~Conn() { server_->conns.erase(this); }

Conn::Conn(Server* s, uint64_t id) : server_(s), id_(id) {
  s->conns.insert(this);
  uv_pipe_init(s->loop, &client_, 0);
  uv_pipe_init(s->loop, &upstream_, 0);
  uv_timer_init(s->loop, &timer_);
  handles_ = 3;
  client_.data = upstream_.data = timer_.data = this;
  llhttp_settings_init(&rq_settings_);
  rq_settings_.on_url = rq_url;
  rq_settings_.on_header_field = rq_field;
  rq_settings_.on_header_value = rq_value;
  rq_settings_.on_header_value_complete = rq_value_done;
  rq_settings_.on_headers_complete = rq_headers_done;
  rq_settings_.on_body = rq_body;
  rq_settings_.on_message_complete = rq_done;
  llhttp_init(&rq_, HTTP_REQUEST, &rq_settings_);
  rq_.data = this;
  llhttp_settings_init(&rs_settings_);
  rs_settings_.on_headers_complete = rs_headers_done;
  rs_settings_.on_message_complete = rs_done;
  llhttp_init(&rs_, HTTP_RESPONSE, &rs_settings_);
  rs_.data = this;
}

void Conn::start() {
  connect_req_.data = this;
  uv_pipe_connect(&connect_req_, &upstream_, server_->cfg.upstream.c_str(), on_connect);
  uv_read_start(reinterpret_cast<uv_stream_t*>(&client_), on_alloc, on_client_read);
  reading_client_ = true;
}

void Conn::on_alloc(uv_handle_t*, size_t, uv_buf_t* b) {
  static thread_local char buf[65536];
  b->base = buf;
  b->len = sizeof buf;
}

void Conn::on_connect(uv_connect_t* r, int status) {
  Conn* c = static_cast<Conn*>(r->data);
  if (c->closing_) return;
  if (status < 0) {
    c->up_failed_ = true;
    log::warn("c{} upstream {}: {}", c->id_, c->server_->cfg.upstream, uv_strerror(status));
    // Answered as soon as there is a request to answer (or now, when one is
    // already waiting).
    if (c->request_forwarded_ || !c->in_.empty() || c->state_ != State::head) {
      c->refuse(400, "Bad Request", std::string(kUnreachable), "upstream_unreachable");
    }
    return;
  }
  c->up_connected_ = true;
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->upstream_), on_alloc, on_upstream_read);
  c->reading_up_ = true;
  if (!c->pending_up_.empty()) {
    std::string p;
    p.swap(c->pending_up_);
    c->write(&c->upstream_, std::move(p), false);
  }
  c->flow();
}

void Conn::write_client(std::string_view data) {
  if (data.empty()) return;
  write(&client_, data, true);
}

void Conn::write_upstream(std::string_view data) {
  if (data.empty() || up_failed_) return;
  if (!up_connected_) {
    pending_up_.append(data);
    return;
  }
  write(&upstream_, data, false);
}

void Conn::write(uv_pipe_t* p, std::string_view data, bool to_client) {
  // Nothing queued on that side: try the write now. A whole write needs no
  // request (and spares libuv's POLLOUT re-arm, an epoll_ctl per message);
  // what is left goes through uv_write, behind nothing, so order is kept.
  if ((to_client ? writes_client_ : writes_up_) == 0) {
    uv_buf_t b0 = uv_buf_init(const_cast<char*>(data.data()), static_cast<unsigned>(data.size()));
    int n = uv_try_write(reinterpret_cast<uv_stream_t*>(p), &b0, 1);
    if (n == static_cast<int>(data.size())) {
      flow();
      return;
    }
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n != UV_EAGAIN) {
      close();
      return;
    }
  }
  auto* w = new WriteReq{{}, std::string(data), this, to_client};
  w->req.data = w;
  uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(p), &b, 1, on_write);
  if (rc < 0) {
    delete w;
    close();
    return;
  }
  (to_client ? writes_client_ : writes_up_)++;
  flow();
}

void Conn::on_write(uv_write_t* r, int status) {
  auto* w = static_cast<WriteReq*>(r->data);
  Conn* c = w->conn;
  (w->to_client ? c->writes_client_ : c->writes_up_)--;
  delete w;
  if (c->closing_) return;
  if (status < 0) {
    c->close();
    return;
  }
  if (c->closing_after_flush_ && c->writes_client_ == 0) {
    c->linger();
    return;
  }
  c->flow();
}

void Conn::flow() {
  if (closing_) return;
  auto qsize = [](uv_pipe_t* p) {
    return uv_stream_get_write_queue_size(reinterpret_cast<uv_stream_t*>(p));
  };
  size_t up_q = qsize(&upstream_) + pending_up_.size();
  size_t cl_q = qsize(&client_);
  // Stop reading the client when the upstream side is backed up, or when a
  // request waits for its response and the next ones pile up in in_.
  if (closing_after_flush_) return;
  bool want_client = !client_eof_ &&
                     (reading_client_ ? up_q < kHighWater : up_q < kLowWater) &&
                     !(state_ == State::wait_response && in_.size() > kHighWater) &&
                     !(state_ == State::head && in_.size() > server_->cfg.max_head + 4);
  if (want_client != reading_client_) {
    if (want_client) {
      uv_read_start(reinterpret_cast<uv_stream_t*>(&client_), on_alloc, on_client_read);
    } else {
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&client_));
    }
    reading_client_ = want_client;
  }
  if (up_connected_) {
    bool want_up = !up_eof_ && (reading_up_ ? cl_q < kHighWater : cl_q < kLowWater);
    if (want_up != reading_up_) {
      if (want_up) {
        uv_read_start(reinterpret_cast<uv_stream_t*>(&upstream_), on_alloc, on_upstream_read);
      } else {
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&upstream_));
      }
      reading_up_ = want_up;
    }
  }
}

void Conn::on_client_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
  Conn* c = of(reinterpret_cast<uv_handle_t*>(s));
  if (c->closing_) return;
  if (n < 0) {
    if (n == UV_EOF) {
      c->on_client_eof();
    } else {
      c->close();
    }
    return;
  }
  if (n == 0) return;
  if (c->state_ == State::raw) {
    c->write_upstream(std::string_view(b->base, static_cast<size_t>(n)));
    return;
  }
  if (c->closing_after_flush_) return;  // lingering: what the client still sends is dropped
  if (c->state_ == State::head && c->in_.empty()) c->arm_timer(c->server_->cfg.request_timeout_ms);
  if (c->state_ == State::body && c->action_ == Action::pass) c->arm_body_timer();
  c->in_.append(b->base, static_cast<size_t>(n));
  c->drive();
}

void Conn::on_client_eof() {
  client_eof_ = true;
  reading_client_ = false;
  if (closing_after_flush_) {
    if (lingering_) close();
    return;
  }
  if (state_ == State::raw) {
    if (!shut_up_sent_ && up_connected_) {
      shut_up_sent_ = true;
      shut_up_.data = this;
      uv_shutdown(&shut_up_, reinterpret_cast<uv_stream_t*>(&upstream_), [](uv_shutdown_t* r, int) {
        Conn* c = static_cast<Conn*>(r->data);
        c->shut_up_done_ = true;
        c->maybe_finish_raw();
      });
    }
    return;
  }
  // Mid-request, or idle: nothing more will come. A request waiting for its
  // response gets it first.
  if (state_ == State::wait_response) return;
  if (state_ == State::body || !in_.empty()) {
    close();
    return;
  }
  close_after_flush();
}

void Conn::maybe_finish_raw() {
  if (closing_) return;
  if (client_eof_ && up_eof_ && (shut_up_done_ || !up_connected_) && shut_client_done_) close();
}

void Conn::close_after_flush() {
  if (closing_ || closing_after_flush_) return;
  closing_after_flush_ = true;
  uv_timer_stop(&timer_);
  if (writes_client_ == 0) linger();
}

// Our last bytes are written: half-close, and drain what the client still
// sends for a moment. Closing a unix socket with unread data resets the peer,
// which would lose the answer just written.
void Conn::linger() {
  if (closing_ || lingering_) return;
  lingering_ = true;
  if (client_eof_) {
    close();
    return;
  }
  shut_client_.data = this;
  if (uv_shutdown(&shut_client_, reinterpret_cast<uv_stream_t*>(&client_), [](uv_shutdown_t*, int) {}) != 0) {
    close();
    return;
  }
  if (!reading_client_) {
    uv_read_start(reinterpret_cast<uv_stream_t*>(&client_), on_alloc, on_client_read);
    reading_client_ = true;
  }
  uv_timer_start(&timer_, [](uv_timer_t* t) { of(reinterpret_cast<uv_handle_t*>(t))->close(); }, 1000, 0);
}

void Conn::arm_timer(uint64_t ms) {
  if (ms == 0) return;
  uv_timer_start(&timer_, [](uv_timer_t* t) { of(reinterpret_cast<uv_handle_t*>(t))->on_timer(); },
                 ms, 0);
}

void Conn::arm_body_timer() {
  uint64_t ms = server_->cfg.body_idle_timeout_ms;
  if (body_deadline_) {
    uint64_t now = uv_now(server_->loop);
    uint64_t left = body_deadline_ > now ? body_deadline_ - now : 1;
    if (ms == 0 || left < ms) ms = left;
  }
  arm_timer(ms);
}

void Conn::on_timer() {
  if (closing_) return;
  if (state_ == State::head && !in_.empty()) {
    refuse(408, "Request Timeout",
           std::string(kPrefix) + "the request head did not arrive whole within " +
               std::to_string(server_->cfg.request_timeout_ms) + " ms",
           "head_timeout");
  } else if (state_ == State::body) {
    const char* which = action_ != Action::pass ? "request_timeout_ms"
                        : body_deadline_ && uv_now(server_->loop) >= body_deadline_
                            ? "body_timeout_s"
                            : "body_idle_timeout_ms";
    if (response_started_) {
      server_->stats.refused("body_timeout");
      log::info("c{} {} {}: the request body did not arrive in time ({}); closing", id_,
                head_.method, head_.target.substr(0, 200), which);
      close();
      return;
    }
    refuse(408, "Request Timeout",
           std::string(kPrefix) + "the request body did not arrive in time (" + which + ")",
           "body_timeout");
  }
}

void Conn::refuse(int status, std::string_view reason, std::string text, std::string_view code) {
  if (closing_ || closing_after_flush_) return;
  server_->stats.refused(code);
  log::info("c{} {} {} -> {} {}", id_, head_.method.empty() ? "-" : head_.method,
            head_.target.substr(0, 200), status, text);
  if (response_started_) {  // too late for an answer of our own
    close();
    return;
  }
  write_client(answer(status, reason, text + "\n", true));
  close_after_flush();
}

void Conn::drive() {
  while (!closing_ && !closing_after_flush_) {
    if (state_ == State::head) {
      if (in_.empty()) {
        uv_timer_stop(&timer_);
        if (client_eof_) close_after_flush();
        return;
      }
      // A head that began while the last request waited for its answer is
      // timed from now.
      if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&timer_))) {
        arm_timer(server_->cfg.request_timeout_ms);
      }
      if (!parse_head()) return;
    } else if (state_ == State::body) {
      parse_body();
      return;
    } else {
      return;  // wait_response or raw
    }
  }
}

// llhttp's spans arrive in pieces only when the head spans execute calls; the
// head is executed whole here, so each callback appends.
int Conn::rq_url(llhttp_t* p, const char* at, size_t n) {
  Conn* c = of_parser(p);
  if (c->in_headers_) c->head_.target.append(at, n);
  return 0;
}
int Conn::rq_field(llhttp_t* p, const char* at, size_t n) {
  Conn* c = of_parser(p);
  if (!c->in_headers_) {
    // A field in a chunked body's trailer section: Go reads it into
    // Request.Trailer, the filter forwards none, so the request is refused.
    c->trailer_error_ = true;
    return HPE_USER;
  }
  if (c->new_field_) {
    c->head_.headers.push_back({});
    c->new_field_ = false;
  }
  c->head_.headers.back().name.append(at, n);
  return 0;
}
int Conn::rq_value(llhttp_t* p, const char* at, size_t n) {
  Conn* c = of_parser(p);
  if (c->in_headers_ && !c->head_.headers.empty()) c->head_.headers.back().value.append(at, n);
  return 0;
}
int Conn::rq_value_done(llhttp_t* p) {
  Conn* c = of_parser(p);
  c->new_field_ = true;
  if (c->in_headers_ && !c->head_.headers.empty()) {
    std::string& v = c->head_.headers.back().value;
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  }
  return 0;
}
int Conn::rq_headers_done(llhttp_t* p) {
  Conn* c = of_parser(p);
  c->in_headers_ = false;
  c->head_done_ = true;
  c->head_.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
  c->head_.major = p->http_major;
  c->head_.minor = p->http_minor;
  c->head_.chunked = (p->flags & F_CHUNKED) != 0;
  if (p->flags & F_CONTENT_LENGTH) c->head_.content_length = p->content_length;
  c->head_.keep_alive = llhttp_should_keep_alive(p) != 0;
  return HPE_PAUSED;  // decided by parse_head before any body byte is read
}
int Conn::rq_body(llhttp_t* p, const char* at, size_t n) {
  Conn* c = of_parser(p);
  c->body_seen_ += n;
  if (c->action_ == Action::pass) {
    const uint64_t max = c->server_->cfg.body_max;
    if (max && c->body_seen_ > max) {
      c->body_error_ = true;
      return HPE_USER;
    }
    if (c->chunked_out_) {
      std::string chunk = chunk_size_line(n);
      chunk.append(at, n).append("\r\n");
      c->write_upstream(std::move(chunk));
    } else {
      c->write_upstream(std::string_view(at, n));
    }
  } else {
    if (c->body_seen_ > c->server_->cfg.create_body_max) {
      c->body_error_ = true;
      return HPE_USER;
    }
    c->create_body_.append(at, n);
  }
  return 0;
}
int Conn::rq_done(llhttp_t* p) {
  of_parser(p)->msg_done_ = true;
  return HPE_PAUSED;
}

bool Conn::parse_head() {
  const Config& cfg = server_->cfg;
  if (in_.size() >= 4 && in_.compare(0, 4, "PRI ") == 0) {
    // HTTP/2 with prior knowledge (podman 6 serves h2c on its unix socket).
    refuse(400, "Bad Request", std::string(kPrefix) + "the HTTP/2 preface is refused: speak HTTP/1.1",
           "http2");
    return false;
  }
  size_t end = in_.find("\r\n\r\n");
  if (end == std::string::npos) {
    // A bare-LF head never gets its CRLFCRLF: refuse it as soon as it shows.
    if (auto bad = check_raw_head(std::string_view(in_).substr(0, std::min<size_t>(in_.size(), cfg.max_head)));
        bad && bad->find("bare LF") != std::string::npos) {
      refuse(400, "Bad Request", std::string(kPrefix) + *bad, "head_malformed");
      return false;
    }
    if (in_.size() > cfg.max_head) {
      refuse(431, "Request Header Fields Too Large",
             std::string(kPrefix) + "the request head is larger than " + std::to_string(cfg.max_head) +
                 " bytes",
             "head_too_large");
    }
    return false;
  }
  size_t head_len = end + 4;
  if (head_len > cfg.max_head) {
    refuse(431, "Request Header Fields Too Large",
           std::string(kPrefix) + "the request head is larger than " + std::to_string(cfg.max_head) +
               " bytes",
           "head_too_large");
    return false;
  }
  if (auto bad = check_raw_head(std::string_view(in_).substr(0, head_len))) {
    refuse(400, "Bad Request", std::string(kPrefix) + *bad, "head_malformed");
    return false;
  }
  head_.reset();
  in_headers_ = true;
  new_field_ = true;
  head_done_ = msg_done_ = body_error_ = trailer_error_ = false;
  create_body_.clear();
  body_seen_ = 0;
  request_forwarded_ = response_started_ = false;
  resp_status_ = 0;
  resp_raw_ = resp_final_done_ = false;
  resp_keep_alive_ = true;
  llhttp_errno_t rc = llhttp_execute(&rq_, in_.data(), head_len);
  if (rc != HPE_PAUSED || !head_done_) {
    const char* why = llhttp_get_error_reason(&rq_);
    refuse(400, "Bad Request",
           std::string(kPrefix) + "malformed request head: " + (why ? why : llhttp_errno_name(rc)),
           "head_malformed");
    return false;
  }
  size_t used = static_cast<size_t>(llhttp_get_error_pos(&rq_) - in_.data());
  in_.erase(0, used);
  requests_++;
  if (auto bad = check_head(head_)) {
    std::string_view code = bad->find("HTTP/2") != std::string::npos     ? "http2"
                            : bad->find("HTTP/1.0") != std::string::npos ? "te_http10"
                                                                         : "framing";
    refuse(400, "Bad Request", std::string(kPrefix) + *bad, code);
    return false;
  }
  if (up_failed_) {
    refuse(400, "Bad Request", std::string(kUnreachable), "upstream_unreachable");
    return false;
  }
  // podman sends a request to its gRPC server when any Content-Type value
  // matches: all of them are judged.
  std::string ct;
  for (const Header& h : head_.headers) {
    if (h.name.size() == 12 && fold(h.name) == "content-type") {
      if (!ct.empty()) ct += ", ";
      ct += h.value;
    }
  }
  Route r = classify(head_.method, head_.target, head_.has_body(), ct);
  action_ = r.action;
  server_->stats.requests[static_cast<int>(r.klass)]++;
  if (r.action == Action::refuse) {
    refuse(400, "Bad Request", std::string(kPrefix) + r.reason, r.code);
    return false;
  }
  llhttp_resume(&rq_);
  if (action_ == Action::pass) {
    if (cfg.body_max && head_.content_length && *head_.content_length > cfg.body_max) {
      refuse(413, "Content Too Large",
             std::string(kPrefix) + "the request body is larger than body_max (" +
                 std::to_string(cfg.body_max) + " bytes)",
             "body_too_large");
      return false;
    }
    chunked_out_ = head_.chunked;
    write_upstream(emit_head(head_, head_.chunked, head_.content_length, false));
    request_forwarded_ = true;
    uv_timer_stop(&timer_);
    body_deadline_ = 0;
    if (head_.has_body()) {
      if (cfg.body_timeout_ms) body_deadline_ = uv_now(server_->loop) + cfg.body_timeout_ms;
      arm_body_timer();
    }
  } else {
    if (head_.content_length && *head_.content_length > cfg.create_body_max) {
      refuse(413, "Content Too Large",
             std::string(kPrefix) + "the create body is larger than create_body_max (" +
                 std::to_string(cfg.create_body_max) + " bytes)",
             "create_too_large");
      return false;
    }
    // The filter reads the whole body before the engine sees any of it, so
    // it answers the client's Expect itself (and drops it upstream).
    if (head_.expects_continue() && head_.has_body() && head_.minor == 1) {
      write_client("HTTP/1.1 100 Continue\r\n\r\n");
    }
  }
  state_ = State::body;
  return true;
}

void Conn::parse_body() {
  if (in_.empty() && !msg_done_) {
    // A request without a body completes at once.
    llhttp_errno_t rc0 = llhttp_execute(&rq_, in_.data(), 0);
    (void)rc0;
  }
  if (!msg_done_ && !in_.empty()) {
    llhttp_errno_t rc = llhttp_execute(&rq_, in_.data(), in_.size());
    if (closing_) return;
    if (rc == HPE_PAUSED) {
      size_t used = static_cast<size_t>(llhttp_get_error_pos(&rq_) - in_.data());
      in_.erase(0, used);
    } else if (rc == HPE_OK) {
      in_.clear();
    } else if (trailer_error_) {
      // The last chunk is never sent: the engine sees a body that does not
      // end, then the connection's close.
      if (request_forwarded_) {
        server_->stats.refused("trailer");
        log::info("c{} {} {}: a trailer field in the chunked body; closing", id_, head_.method,
                  head_.target.substr(0, 200));
        close();
        return;
      }
      refuse(400, "Bad Request",
             std::string(kPrefix) +
                 "a chunked body's trailer section has a field; the filter forwards no trailer "
                 "fields, send the request without them",
             "trailer");
      return;
    } else if (body_error_) {
      if (action_ == Action::pass) {
        refuse(413, "Content Too Large",
               std::string(kPrefix) + "the request body is larger than body_max (" +
                   std::to_string(server_->cfg.body_max) + " bytes)",
               "body_too_large");
      } else {
        refuse(413, "Content Too Large",
               std::string(kPrefix) + "the create body is larger than create_body_max (" +
                   std::to_string(server_->cfg.create_body_max) + " bytes)",
               "create_too_large");
      }
      return;
    } else if (rc == HPE_PAUSED_UPGRADE) {
      // A request with Upgrade: llhttp stops after it; HTTP goes on until the
      // engine answers 101 (go_raw), so the parser starts over.
      size_t used = static_cast<size_t>(llhttp_get_error_pos(&rq_) - in_.data());
      in_.erase(0, used);
    } else {
      const char* why = llhttp_get_error_reason(&rq_);
      if (request_forwarded_) {
        close();
        return;
      }
      refuse(400, "Bad Request",
             std::string(kPrefix) + "malformed request body framing: " + (why ? why : ""),
             "framing");
      return;
    }
  }
  if (!msg_done_) {
    // No body framing and nothing more: llhttp completes a body-less request
    // inside the head's execute; otherwise wait for more bytes.
    if (!head_.has_body()) msg_done_ = true;
    else return;
  }
  request_done();
}

void Conn::request_done() {
  llhttp_reset(&rq_);  // also clears an Upgrade request's pause: HTTP goes on
  if (action_ == Action::pass) {
    if (chunked_out_) write_upstream(kLastChunk);
  } else {
    Family f = action_ == Action::create_libpod ? Family::libpod : Family::compat;
    Rewrite rw = rewrite_create(create_body_, f);
    if (!rw.ok) {
      refuse(400, "Bad Request", std::string(kUnparseable) + ": " + rw.error, "create_unparseable");
      return;
    }
    server_->stats.creates_rewritten++;
    for (int i = 0; i < kStrippedKinds; ++i) {
      server_->stats.stripped[i] += static_cast<uint64_t>(rw.by_kind[i]);
    }
    if (rw.stripped > 0) {
      log::info("c{} {} {}: stripped {} runtime-selecting field(s)", id_, head_.method,
                head_.target.substr(0, 200), rw.stripped);
    }
    std::string out = emit_head(head_, false, rw.body.size(), true);
    out.append(rw.body);
    write_upstream(std::move(out));
    request_forwarded_ = true;
  }
  uv_timer_stop(&timer_);
  create_body_.clear();
  create_body_.shrink_to_fit();
  state_ = resp_final_done_ ? State::head : State::wait_response;
  if (state_ == State::head) drive();
  flow();
}

int Conn::rs_headers_done(llhttp_t* p) {
  Conn* c = of_parser(p);
  int st = p->status_code;
  c->resp_status_ = st;
  if (st == 101) {
    c->resp_raw_ = true;
    return HPE_PAUSED;
  }
  if (st >= 100 && st < 200) return 1;  // relayed; the final response follows
  if (c->head_.method == "HEAD" || st == 204 || st == 304) return 1;
  if (!(p->flags & (F_CHUNKED | F_CONTENT_LENGTH))) {
    // No framing: the body runs to EOF (attach without Upgrade), so the
    // engine has switched the connection to a raw stream.
    c->resp_raw_ = true;
    return HPE_PAUSED;
  }
  return 0;
}

int Conn::rs_done(llhttp_t* p) {
  Conn* c = of_parser(p);
  if (c->resp_status_ >= 100 && c->resp_status_ < 200) return 0;
  c->resp_final_done_ = true;
  c->resp_keep_alive_ = llhttp_should_keep_alive(p) != 0;
  return HPE_PAUSED;
}

void Conn::on_upstream_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
  Conn* c = of(reinterpret_cast<uv_handle_t*>(s));
  if (c->closing_) return;
  if (n < 0) {
    if (n == UV_EOF) {
      c->on_upstream_eof();
    } else {
      c->close();
    }
    return;
  }
  if (n > 0) c->on_upstream_data(b->base, static_cast<size_t>(n));
}

void Conn::on_upstream_data(const char* p, size_t n) {
  if (state_ == State::raw) {
    write_client(std::string_view(p, n));
    return;
  }
  if (!request_forwarded_) {
    // The engine speaks before it was asked: nothing to relay it to.
    log::warn("c{} the engine sent {} bytes with no request outstanding; closing", id_, n);
    close();
    return;
  }
  response_started_ = true;
  const char* cur = p;
  size_t left = n;
  while (left > 0) {
    llhttp_errno_t rc = llhttp_execute(&rs_, cur, left);
    if (rc == HPE_OK) break;
    if (rc != HPE_PAUSED) {
      log::warn("c{} the engine's response does not parse: {}", id_, llhttp_errno_name(rc));
      write_client(std::string_view(p, static_cast<size_t>(cur - p)));
      close_after_flush();
      return;
    }
    const char* stop = llhttp_get_error_pos(&rs_);
    size_t used = static_cast<size_t>(stop - cur);
    cur = stop;
    left -= used;
    if (resp_raw_) {
      // Everything after the switching head is the stream's.
      write_client(std::string_view(p, n));
      go_raw();
      return;
    }
    // A final response is whole.
    write_client(std::string_view(p, static_cast<size_t>(cur - p)));
    p = cur;
    n = left;
    llhttp_reset(&rs_);
    resp_final_done_ = false;
    if (left > 0) {
      log::warn("c{} the engine sent {} bytes after its response; closing", id_, left);
      close_after_flush();
      return;
    }
    if (!resp_keep_alive_ || !head_.keep_alive) {
      close_after_flush();
      return;
    }
    if (state_ == State::wait_response) {
      state_ = State::head;
      request_forwarded_ = false;
      response_started_ = false;
      drive();
    } else {
      // The engine answered before the request's body ended (an early
      // error): the rest of the body still goes up, then the next request.
      resp_final_done_ = true;
    }
    flow();
    return;
  }
  write_client(std::string_view(p, n));
}

void Conn::go_raw() {
  state_ = State::raw;
  uv_timer_stop(&timer_);
  log::debug("c{} raw stream after {} {}", id_, resp_status_, head_.target.substr(0, 200));
  if (!in_.empty()) {
    std::string rest;
    rest.swap(in_);
    write_upstream(std::move(rest));
  }
  if (client_eof_) {
    client_eof_ = false;
    on_client_eof();
  }
  flow();
  if (!reading_client_ && !client_eof_) {
    uv_read_start(reinterpret_cast<uv_stream_t*>(&client_), on_alloc, on_client_read);
    reading_client_ = true;
  }
}

void Conn::on_upstream_eof() {
  up_eof_ = true;
  reading_up_ = false;
  if (state_ == State::raw) {
    if (!shut_client_sent_) {
      shut_client_sent_ = true;
      shut_client_.data = this;
      uv_shutdown(&shut_client_, reinterpret_cast<uv_stream_t*>(&client_), [](uv_shutdown_t* r, int) {
        Conn* c = static_cast<Conn*>(r->data);
        c->shut_client_done_ = true;
        c->maybe_finish_raw();
      });
    }
    return;
  }
  if (request_forwarded_ && !response_started_) {
    refuse(400, "Bad Request", std::string(kUnreachable), "upstream_unreachable");
    return;
  }
  close_after_flush();
}

void Conn::close() {
  if (closing_) return;
  closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&client_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&upstream_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), on_closed);
}

void Conn::on_closed(uv_handle_t* h) {
  Conn* c = of(h);
  if (--c->handles_ == 0) delete c;
}

void on_connection(uv_stream_t* l, int status) {
  Server* s = static_cast<Server*>(l->data);
  if (status < 0) {
    log::warn("accept: {}", uv_strerror(status));
    return;
  }
  s->stats.connections++;
  Conn* c = new Conn(s, s->next_id++);
  if (uv_accept(l, reinterpret_cast<uv_stream_t*>(c->client())) != 0) {
    c->close();
    return;
  }
  c->start();
}

// One reader of the stats socket: it gets the counters as they are when it
// connects, then a half-close; the handle closes on the reader's EOF (or after
// 2 s), so the text is never lost to a reset from unread request bytes. Owns
// its pipe and timer; deleted in the last close callback.
struct StatsConn {
  uv_pipe_t pipe{};
  uv_timer_t timer{};
  uv_write_t write_req{};
  uv_shutdown_t shut{};
  std::string text;
  int handles = 2;
  bool closing = false;

  void close() {
    if (closing) return;
    closing = true;
    auto done = [](uv_handle_t* h) {
      auto* sc = static_cast<StatsConn*>(h->data);
      if (--sc->handles == 0) delete sc;
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe), done);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), done);
  }
};

void on_stats_connection(uv_stream_t* l, int status) {
  Server* s = static_cast<Server*>(l->data);
  if (status < 0) return;
  auto* sc = new StatsConn;
  uv_pipe_init(s->loop, &sc->pipe, 0);
  uv_timer_init(s->loop, &sc->timer);
  sc->pipe.data = sc->timer.data = sc->write_req.data = sc->shut.data = sc;
  if (uv_accept(l, reinterpret_cast<uv_stream_t*>(&sc->pipe)) != 0) {
    sc->close();
    return;
  }
  std::string body = s->stats.render();
  sc->text = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  uv_buf_t b = uv_buf_init(sc->text.data(), static_cast<unsigned>(sc->text.size()));
  uv_write(&sc->write_req, reinterpret_cast<uv_stream_t*>(&sc->pipe), &b, 1,
           [](uv_write_t* w, int st) {
             auto* c = static_cast<StatsConn*>(w->data);
             if (c->closing) return;
             if (st < 0 || uv_shutdown(&c->shut, reinterpret_cast<uv_stream_t*>(&c->pipe),
                                       [](uv_shutdown_t*, int) {}) != 0) {
               c->close();
             }
           });
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&sc->pipe),
      [](uv_handle_t*, size_t, uv_buf_t* out) {
        static thread_local char buf[4096];
        *out = uv_buf_init(buf, sizeof buf);
      },
      [](uv_stream_t* st, ssize_t n, const uv_buf_t*) {
        if (n < 0) static_cast<StatsConn*>(st->data)->close();
      });
  uv_timer_start(&sc->timer, [](uv_timer_t* t) { static_cast<StatsConn*>(t->data)->close(); },
                 2000, 0);
}

}  // namespace

Result<uid_t> resolve_user(const std::string& name) {
  char* end = nullptr;
  unsigned long v = strtoul(name.c_str(), &end, 10);
  if (!name.empty() && end && *end == 0) return static_cast<uid_t>(v);
  struct passwd* pw = getpwnam(name.c_str());
  if (!pw) return make_error(Errc::not_found, "no user named '{}': give an existing user or a uid", name);
  return pw->pw_uid;
}

Result<gid_t> resolve_group(const std::string& name) {
  char* end = nullptr;
  unsigned long v = strtoul(name.c_str(), &end, 10);
  if (!name.empty() && end && *end == 0) return static_cast<gid_t>(v);
  struct group* gr = getgrnam(name.c_str());
  if (!gr) return make_error(Errc::not_found, "no group named '{}': give an existing group or a gid", name);
  return gr->gr_gid;
}

Result<Config> load_config(const std::string& path, Config base) {
  auto doc = cfg::Doc::load_file(path);
  if (!doc) return std::move(doc).take_error();
  cfg::Table root = doc->root();
  if (auto t = root.table("sockfilter")) {
    if (auto v = t->string("upstream")) base.upstream = *v;
    if (auto v = t->string("listen")) base.listen = *v;
    if (auto v = t->string("owner")) {
      auto u = resolve_user(*v);
      if (!u) t->error("owner", u.error().message);
      else base.owner = *u;
    }
    if (auto v = t->string("group")) {
      auto g = resolve_group(*v);
      if (!g) t->error("group", g.error().message);
      else base.group = *g;
    }
    if (auto v = t->string("mode")) {
      char* end = nullptr;
      unsigned long m = strtoul(v->c_str(), &end, 8);
      if (v->empty() || *end != 0 || m > 0777) t->error("mode", "mode must be octal, e.g. \"0660\"");
      else base.mode = static_cast<unsigned>(m);
    }
    if (auto v = t->integer("create_body_max_kib", 1, 1 << 20)) base.create_body_max = *v * 1024;
    if (auto v = t->integer("body_max_mib", 1, 1 << 20)) base.body_max = *v * 1024 * 1024;
    if (auto v = t->integer("body_timeout_s", 1, 7 * 86400)) base.body_timeout_ms = *v * 1000;
    if (auto v = t->string("stats")) base.stats = *v;
    if (auto v = t->integer("request_timeout_ms", 100, 3600000)) base.request_timeout_ms = *v;
    if (auto v = t->integer("body_idle_timeout_ms", 100, 86400000)) base.body_idle_timeout_ms = *v;
    if (auto v = t->integer("max_head_kib", 1, 1024)) base.max_head = *v * 1024;
    if (auto v = t->string("log_level")) {
      if (!log::parse_level(*v)) t->error("log_level", "log_level is one of debug, info, warn, error");
      else base.log_level = *v;
    }
    t->finish();
  }
  root.finish();
  auto ok = doc->result();
  if (!ok) return Error(ok.error());
  return base;
}

int serve(const Config& cfg) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  signal(SIGPIPE, SIG_IGN);
  Server s{&loop, cfg};
  uv_pipe_init(&loop, &s.listener, 0);
  s.listener.data = &s;
  unlink(cfg.listen.c_str());
  int rc = uv_pipe_bind(&s.listener, cfg.listen.c_str());
  if (rc == 0) rc = chmod(cfg.listen.c_str(), cfg.mode) == 0 ? 0 : uv_translate_sys_error(errno);
  if (rc == 0 && (cfg.owner || cfg.group)) {
    rc = chown(cfg.listen.c_str(), cfg.owner ? *cfg.owner : static_cast<uid_t>(-1),
               cfg.group ? *cfg.group : static_cast<gid_t>(-1)) == 0
             ? 0
             : uv_translate_sys_error(errno);
  }
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&s.listener), 128, on_connection);
  if (rc != 0) {
    log::error("cannot listen on {}: {} (is the directory there and writable, and the owner/group "
               "valid?)", cfg.listen, uv_strerror(rc));
    uv_close(reinterpret_cast<uv_handle_t*>(&s.listener), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 3;
  }
  if (!cfg.stats.empty()) {
    uv_pipe_init(&loop, &s.stats_listener, 0);
    s.stats_listener.data = &s;
    s.stats_on = true;
    unlink(cfg.stats.c_str());
    int src = uv_pipe_bind(&s.stats_listener, cfg.stats.c_str());
    if (src == 0) src = chmod(cfg.stats.c_str(), 0600) == 0 ? 0 : uv_translate_sys_error(errno);
    if (src == 0) {
      src = uv_listen(reinterpret_cast<uv_stream_t*>(&s.stats_listener), 16, on_stats_connection);
    }
    if (src != 0) {
      log::error("cannot listen on the stats socket {}: {} (is the directory there and writable?)",
                 cfg.stats, uv_strerror(src));
      uv_close(reinterpret_cast<uv_handle_t*>(&s.listener), nullptr);
      uv_close(reinterpret_cast<uv_handle_t*>(&s.stats_listener), nullptr);
      uv_run(&loop, UV_RUN_DEFAULT);
      uv_loop_close(&loop);
      unlink(cfg.listen.c_str());
      return 3;
    }
  }
  log::info("serving {} -> {} (mode {:o}){}", cfg.listen, cfg.upstream, cfg.mode,
            cfg.stats.empty() ? "" : ", counters on " + cfg.stats);
  auto stop = [](uv_signal_t* sig, int) {
    Server* sv = static_cast<Server*>(sig->data);
    uint64_t refused = 0, stripped = 0;
    for (const auto& [code, n] : sv->stats.refusals) refused += n;
    for (uint64_t n : sv->stats.stripped) stripped += n;
    log::info("stopping: {} creates rewritten, {} fields stripped, {} refusals",
              sv->stats.creates_rewritten, stripped, refused);
    uv_stop(sv->loop);
  };
  uv_signal_init(&loop, &s.sigterm);
  uv_signal_init(&loop, &s.sigint);
  s.sigterm.data = s.sigint.data = &s;
  uv_signal_start(&s.sigterm, stop, SIGTERM);
  uv_signal_start(&s.sigint, stop, SIGINT);
  uv_run(&loop, UV_RUN_DEFAULT);
  // Stopped: every connection and handle closed, the loop run until they are.
  unlink(cfg.listen.c_str());
  if (s.stats_on) {
    unlink(cfg.stats.c_str());
    uv_close(reinterpret_cast<uv_handle_t*>(&s.stats_listener), nullptr);
  }
  std::vector<Conn*> live(s.conns.begin(), s.conns.end());
  for (Conn* c : live) c->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&s.listener), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s.sigterm), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s.sigint), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0) log::warn("the loop still had handles at exit");
  return 0;
}

}  // namespace fy::sockfilter

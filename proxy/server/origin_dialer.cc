#include "proxy/server/origin_dialer.h"

#include <netdb.h>

#include <fmt/format.h>

#include <cstring>

#include "core/loop.h"
#include "proxy/server/origin_pool.h"

namespace fy::proxy {

// A lookup outlives its dialer when the dialer is cancelled (or destroyed)
// first: cancel() clears `dialer`, and the callback then only frees it.
struct OriginDialer::Dns {
  uv_getaddrinfo_t req;
  OriginDialer* dialer = nullptr;
  static void on_done(uv_getaddrinfo_t* req, int status, struct addrinfo* res) {
    auto* q = static_cast<Dns*>(req->data);
    if (q->dialer) {
      q->dialer->dns_ = nullptr;
      q->dialer->on_resolved(status, res);
    }
    if (res) uv_freeaddrinfo(res);
    delete q;
  }
};

OriginDialer::OriginDialer(uv_loop_t* loop, OriginPool* pool, DialOwner& owner,
                           StreamHandler& events)
    : loop_(loop), pool_(pool), owner_(owner), events_(events) {}

OriginDialer::~OriginDialer() { cancel(); }

OriginDialer::Started OriginDialer::start(const Target& t) {
  cancel();
  Started out;
  if (!t.tls && t.use_pool && pool_) {
    if (Stream* pooled = pool_->take(t.dest.authority(), &events_)) {
      last_error_.clear();
      out.how = How::pooled;
      out.pooled = pooled;
      return out;
    }
  }
  target_ = t;
  addrs_.swap(target_.addrs);
  next_ = 0;
  last_error_.clear();
  // Made before the lookup: the owner may queue a request head on it while
  // the name resolves.
  stream_ = new_stream();
  start_ms_ = uv_now(loop_);
  if (!addrs_.empty()) {
    if (!connect_next(&out.failure)) out.how = How::failed_now;
    return out;
  }
  auto* q = new Dns;
  q->dialer = this;
  q->req.data = q;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  int rc = uv_getaddrinfo(loop_, &q->req, Dns::on_done, t.dest.host.c_str(), nullptr, &hints);
  if (rc != 0) {
    delete q;
    // stream() stays until cancel(), as the connection has always had it
    // (bytes queued on it are dropped with it).
    out.how = How::failed_now;
    out.failure.kind = Errc::dns;
    out.failure.detail = uv::error_string(rc);
    out.failure.at_once = true;
    return out;
  }
  dns_ = q;
  return out;
}

OriginDialer::Started OriginDialer::next_address() {
  Started out;
  last_error_ = "no answer within 2 s";  // kAttemptMs; the Network Log's text
  fall_back();
  if (!connect_next(&out.failure)) out.how = How::failed_now;
  return out;
}

void OriginDialer::cancel() {
  if (dns_) {
    dns_->dialer = nullptr;
    uv_cancel(reinterpret_cast<uv_req_t*>(&dns_->req));
    dns_ = nullptr;
  }
  drop_stream();
  addrs_.clear();
  next_ = 0;
  start_ms_ = 0;
  unsent_.clear();
  unsent_shut_ = false;
}

uint64_t OriginDialer::attempt_started() const {
  if (start_ms_ && attempt_ms_ && stream_ && !stream_->connected() && next_ < addrs_.size())
    return attempt_ms_;
  return 0;
}

Stream* OriginDialer::new_stream() {
  auto* s = new Stream(loop_, this);
  if (target_.tls)
    s->set_tls_client(target_.tls_ctx, target_.dest.host, target_.sessions,
                      target_.dest.authority());
  return s;
}

void OriginDialer::drop_stream() {
  if (stream_) {
    stream_->close_and_delete();
    stream_ = nullptr;
  }
}

void OriginDialer::fall_back() {
  if (stream_) {
    unsent_ += stream_->take_unsent();
    unsent_shut_ = unsent_shut_ || stream_->write_shut();
  }
  drop_stream();
}

void OriginDialer::fail(DialFailure f) {
  drop_stream();
  owner_.on_dial_failed(std::move(f));  // may dispose of this dialer's owner
}

void OriginDialer::on_resolved(int status, addrinfo* res) {
  if (status != 0 || !res) {
    DialFailure f;
    f.kind = Errc::dns;
    f.detail = fmt::format("{} does not resolve ({})", target_.dest.host, uv_strerror(status));
    fail(std::move(f));
    return;
  }
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    sockaddr_storage ss{};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(target_.port);  // same offset in v6
    addrs_.push_back(ss);
    if (addrs_.size() >= 8) break;
  }
  if (addrs_.empty()) {
    DialFailure f;
    f.kind = Errc::dns;
    f.detail = target_.dest.host + " has no IPv4 or IPv6 address";
    fail(std::move(f));
    return;
  }
  DialFailure f;
  if (!connect_next(&f)) fail(std::move(f));
}

bool OriginDialer::connect_next(DialFailure* f) {
  // Tries the addresses in order: one that fails at once (no route, a
  // refused family) moves on to the next; one that does not answer within
  // kAttemptMs moves on too while others remain (the owner's deadline
  // table, then next_address()).
  while (next_ < addrs_.size()) {
    if (!stream_) stream_ = new_stream();
    const auto* sa = reinterpret_cast<const sockaddr*>(&addrs_[next_++]);
    // Asked with the new Stream counted: a dial that would eat into the
    // descriptor reserve is refused as if the kernel had (UV_EMFILE).
    bool spare = owner_.descriptor_spare();
    int rc = spare ? stream_->connect(sa) : UV_EMFILE;
    if (rc == 0) {
      attempt_ms_ = uv_now(loop_);
      // What the owner had queued on a Stream that failed: queued here until
      // this one connects, in the order written.
      if (!unsent_.empty()) stream_->write(unsent_);
      if (unsent_shut_) stream_->shutdown();
      unsent_.clear();
      unsent_shut_ = false;
      return true;
    }
    if (rc == UV_EMFILE || rc == UV_ENFILE) {
      // Out of descriptors: the proxy's own condition, not the origin's, and
      // no other address fares better.
      drop_stream();
      f->kind = Errc::io;
      f->out_of_files = true;
      f->at_once = true;
      f->detail = spare ? fmt::format("out of file descriptors ({})", uv::error_string(rc))
                        : std::string("no file descriptor to spare for the origin");
      return false;
    }
    last_error_ = fmt::format("{}: {}", sockaddr_string(sa), uv::error_string(rc));
    fall_back();  // what was queued (a request head written while resolving) goes on
  }
  f->kind = Errc::connect;
  f->detail = last_error_;
  f->at_once = true;
  return false;
}

// ---------------------------------------------------------------------------
// The Stream being dialled

void OriginDialer::on_ready(Stream& s) {
  stream_ = nullptr;
  start_ms_ = 0;
  s.set_handler(&events_);
  owner_.on_dialed(s);
}

void OriginDialer::on_error(Stream& s, Errc kind, const std::string& detail) {
  if (kind == Errc::connect && next_ < addrs_.size()) {
    last_error_ = detail;
    fall_back();
    DialFailure f;
    if (!connect_next(&f)) fail(std::move(f));
    return;
  }
  DialFailure f;
  f.kind = kind;
  f.detail = detail;
  f.verify = s.verify_failure();  // read before the Stream goes
  fail(std::move(f));
}

void OriginDialer::on_read(Stream& s, const ChunkRef& c, const char* p, size_t n) {
  events_.on_read(s, c, p, n);
}
void OriginDialer::on_eof(Stream& s) { events_.on_eof(s); }
void OriginDialer::on_drain(Stream& s) { events_.on_drain(s); }
void OriginDialer::on_shutdown(Stream& s) { events_.on_shutdown(s); }

}  // namespace fy::proxy

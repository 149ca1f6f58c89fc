#include "proxy/io/stream.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cassert>
#include <vector>

#include "core/loop.h"
#include "core/net.h"
#include "proxy/tls/context.h"
#include "proxy/tls/session_cache.h"

namespace fy::proxy {
namespace {

// The write queue's front as libuv buffers (the queue itself is pure).
size_t peek_bufs(const WriteQueue& q, uv_buf_t* bufs) {
  iovec v[WriteQueue::kMaxIov];
  size_t n = q.peek(v, WriteQueue::kMaxIov);
  for (size_t i = 0; i < n; ++i)
    bufs[i] = uv_buf_init(static_cast<char*>(v[i].iov_base), v[i].iov_len);
  return n;
}

Errc classify(int uv_err) {
  switch (uv_err) {
    case UV_ECONNRESET:
    case UV_EPIPE:
    case UV_ECONNABORTED: return Errc::reset;
    case UV_ETIMEDOUT: return Errc::timeout;
    default: return Errc::io;
  }
}

// While a read callback runs, writes only queue; the streams written to are
// flushed once when the outermost read callback returns, so a response head
// and the body bytes that came with it leave in one writev.
//
// Coalescing (on while the loop's owner calls flush_held() before each poll,
// set_read_coalescing): a read that filled its buffer is followed at once by
// another read of the same socket (libuv reads until a short read), so the
// flush is held over up to kCoalesceReads such reads and what they produced
// leaves in one write of up to 256 KiB instead of four of 64 KiB (fewer
// segments for the peer to take in: the forwarder behind fy-proxy spends
// 15-25 % less CPU per GiB; docs/bench-proxy.md). A short read, a read that
// ends or pauses the reading, and the owner's flush_held() each end the hold;
// a small answer is a short read and is never held.
//
// A held stream may be closed before the flush: its close callback takes it
// off the list, so the list never holds a freed Stream.
constexpr uint8_t kCoalesceReads = 4;
int g_read_depth = 0;
bool g_coalesce = false;
std::vector<Stream*> g_deferred;

}  // namespace

void Stream::set_read_coalescing(bool on) {
  g_coalesce = on;
  if (!on) flush_deferred();
}

void Stream::flush_held() {
  if (g_read_depth == 0) flush_deferred();
}

void Stream::flush_deferred() {
  while (!g_deferred.empty()) {
    std::vector<Stream*> batch;
    batch.swap(g_deferred);
    for (Stream* s : batch) {
      s->flush_deferred_ = false;
      s->flush();
    }
  }
}

Stream::Stream(uv_loop_t* loop, StreamHandler* handler) : handler_(handler) {
  uv_tcp_init(loop, &tcp_);
  tcp_.data = this;
  ++live_;
}

Stream::~Stream() { assert(closed_ && "a Stream must be closed before it is freed"); }

int Stream::fd() const {
  uv_os_fd_t fd = -1;
  uv_fileno(reinterpret_cast<const uv_handle_t*>(&tcp_), &fd);
  return fd;
}

int Stream::accept_from(uv_stream_t* server) {
  int rc = uv_accept(server, reinterpret_cast<uv_stream_t*>(&tcp_));
  if (rc == 0) {
    connected_ = true;
    uv_tcp_nodelay(&tcp_, 1);
  }
  return rc;
}

std::string Stream::peer_address() const {
  sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&tcp_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return sockaddr_string(reinterpret_cast<const sockaddr*>(&ss));
}

void Stream::set_tls_client(SSL_CTX* ctx, const std::string& verify_name,
                            tls::SessionCache* sessions, const std::string& session_key) {
  assert(!ssl_);
  ssl_ = SSL_new(ctx);
  rbio_ = BIO_new(BIO_s_mem());
  wbio_ = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(rbio_, -1);
  SSL_set_bio(ssl_, rbio_, wbio_);
  SSL_set_connect_state(ssl_);
  if (is_ipv4_literal(verify_name) || is_ipv6_literal(verify_name)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), verify_name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl_, verify_name.c_str());
    X509_VERIFY_PARAM_set1_host(SSL_get0_param(ssl_), verify_name.c_str(), verify_name.size());
  }
  if (sessions) sessions->prepare(ssl_, session_key);
}

int Stream::connect(const sockaddr* addr) {
  connecting_ = true;
  int rc = uv_tcp_connect(&creq_, &tcp_, addr, on_connect_cb);
  if (rc != 0) connecting_ = false;
  return rc;
}

bool Stream::start_tls_server(SSL_CTX* ctx, CRYPTO_BUFFER* leaf, CRYPTO_BUFFER* ca, EVP_PKEY* key,
                              std::string_view hello) {
  assert(!ssl_);
  ssl_ = SSL_new(ctx);
  CRYPTO_BUFFER* chain[2] = {leaf, ca};
  if (!ssl_ || !SSL_set_chain_and_key(ssl_, chain, 2, key, nullptr)) {
    fail(Errc::tls, tls::last_error());
    return false;
  }
  rbio_ = BIO_new(BIO_s_mem());
  wbio_ = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(rbio_, -1);
  SSL_set_bio(ssl_, rbio_, wbio_);
  SSL_set_accept_state(ssl_);
  tls_server_ = true;
  if (!hello.empty()) BIO_write(rbio_, hello.data(), static_cast<int>(hello.size()));
  return pump_tls();
}

void Stream::start_reading() {
  if (reading_ || paused_ || closing_ || eof_) return;
  if (uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp_), on_alloc, on_read_cb) == 0)
    reading_ = true;
}

void Stream::pause() {
  paused_ = true;
  if (reading_) {
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp_));
    reading_ = false;
  }
}

void Stream::resume() {
  if (!paused_) return;
  paused_ = false;
  if (closing_) return;
  // Deliver what TLS decrypted (or still holds) while paused.
  if (ssl_ && tls_done_ && (SSL_pending(ssl_) > 0 || BIO_pending(rbio_) > 0)) {
    if (!pump_tls()) return;
  }
  start_reading();
}

void Stream::on_alloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* s = static_cast<Stream*>(h->data);
  // Reuse the read chunk when nobody else holds it; else use its tail when
  // there is room; else take a fresh chunk from the pool.
  if (s->rchunk_ && s->rchunk_.unique()) {
    s->roff_ = 0;
  } else if (!s->rchunk_ || Chunk::kSize - s->roff_ < 2048) {
    s->rchunk_ = ChunkPool::alloc();
    s->roff_ = 0;
  }
  *buf = uv_buf_init(s->rchunk_->data() + s->roff_,
                     static_cast<unsigned>(Chunk::kSize - s->roff_));
}

void Stream::on_read_cb(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
  auto* s = static_cast<Stream*>(st->data);
  ++g_read_depth;
  struct Done {
    bool hold = false;
    ~Done() {
      if (--g_read_depth == 0 && !hold) flush_deferred();
    }
  } done;
  bool filled = nread > 0 && static_cast<size_t>(nread) == buf->len;
  if (nread > 0) {
    if (s->ssl_) {
      s->handle_tls_wire(buf->base, static_cast<size_t>(nread));
    } else {
      s->handle_plain(buf->base, static_cast<size_t>(nread));
    }
  } else if (nread == UV_EOF) {
    s->eof_ = true;
    s->deliver_eof();
  } else if (nread < 0) {
    s->fail(classify(static_cast<int>(nread)), uv::error_string(static_cast<int>(nread)));
  }
  // An idle connection holds no chunk.
  if (!s->closing_ && s->rchunk_ && s->rchunk_.unique()) {
    s->rchunk_.reset();
    s->roff_ = 0;
  }
  // Hold the flush only when libuv reads this socket again straight away.
  if (g_coalesce && filled && s->reading_ && !s->closing_ && ++s->held_reads_ < kCoalesceReads) {
    done.hold = true;
  } else {
    s->held_reads_ = 0;
  }
}

void Stream::handle_plain(const char* p, size_t n) {
  bytes_in_ += n;
  roff_ += n;
  ChunkRef hold = rchunk_;  // the handler may close (and reset rchunk_ in on_closed)
  handler_->on_read(*this, hold, p, n);
}

void Stream::handle_tls_wire(const char* p, size_t n) {
  BIO_write(rbio_, p, static_cast<int>(n));
  pump_tls();
}

bool Stream::pump_tls() {
  if (in_pump_ || closing_) return !closing_;
  in_pump_ = true;
  struct Guard {
    bool& flag;
    ~Guard() { flag = false; }
  } guard{in_pump_};

  if (!tls_done_) {
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl_);
    take_tls_output();
    flush();
    if (closing_) return false;
    if (rc != 1) {
      int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return true;
      std::string detail;
      long v = tls_server_ ? X509_V_OK : SSL_get_verify_result(ssl_);
      if (v != X509_V_OK) {
        verify_failure_ = TlsVerifyFailure{v, X509_verify_cert_error_string(v)};
        detail = "certificate verify failed: " + verify_failure_->reason;
      } else {
        detail = tls::last_error();
      }
      fail(Errc::tls, detail);
      return false;
    }
    tls_done_ = true;
    if (!backlog_.empty()) {
      std::string pending;
      pending.swap(backlog_);
      bytes_out_ -= pending.size();  // write() counts them again
      write(pending);
      if (closing_) return false;
    }
    if (handler_) handler_->on_ready(*this);
    if (closing_) return false;
  }
  while (!paused_ && !closing_) {
    if (rchunk_ && rchunk_.unique()) {
      roff_ = 0;
    } else if (!rchunk_ || Chunk::kSize - roff_ < 2048) {
      rchunk_ = ChunkPool::alloc();
      roff_ = 0;
    }
    char* buf = rchunk_->data() + roff_;
    ERR_clear_error();
    int n = SSL_read(ssl_, buf, static_cast<int>(Chunk::kSize - roff_));
    if (n > 0) {
      bytes_in_ += static_cast<uint64_t>(n);
      roff_ += static_cast<size_t>(n);
      ChunkRef hold = rchunk_;
      if (handler_) handler_->on_read(*this, hold, buf, static_cast<size_t>(n));
      continue;
    }
    int err = SSL_get_error(ssl_, n);
    if (err == SSL_ERROR_WANT_READ) break;
    if (err == SSL_ERROR_ZERO_RETURN) {
      eof_ = true;
      deliver_eof();
      break;
    }
    fail(Errc::tls, tls::last_error());
    return false;
  }
  if (!closing_) {
    take_tls_output();
    flush();
  }
  return !closing_;
}

std::string Stream::take_unsent() {
  std::string s;
  if (connected_) return s;
  if (ssl_) {
    s.swap(backlog_);  // out_ holds TLS records only, and none before the connect
  } else {
    iovec v[WriteQueue::kMaxIov];
    while (!out_.empty()) {
      size_t n = out_.peek(v, WriteQueue::kMaxIov), taken = 0;
      for (size_t i = 0; i < n; ++i) {
        s.append(static_cast<const char*>(v[i].iov_base), v[i].iov_len);
        taken += v[i].iov_len;
      }
      out_.consume(taken);
    }
  }
  bytes_out_ -= s.size();
  return s;
}

void Stream::take_tls_output() {
  const uint8_t* data;
  size_t len;
  if (!wbio_ || !BIO_mem_contents(wbio_, &data, &len) || len == 0) return;
  out_.push_copy(reinterpret_cast<const char*>(data), len);
  BIO_reset(wbio_);
}

void Stream::write(const ChunkRef& c, const char* p, size_t n) {
  if (closing_ || n == 0) return;
  if (ssl_) return write(std::string_view(p, n));
  bytes_out_ += n;
  out_.push(c, p, n);
  if (queued() > kHighWater) was_above_high_ = true;
  flush();
}

void Stream::write(std::string_view s) {
  if (closing_ || s.empty()) return;
  bytes_out_ += s.size();
  if (ssl_) {
    if (!tls_done_) {
      // Encrypted once the handshake completes (see pump_tls). Counted in
      // queued(), so a writer that outruns the handshake is paused.
      backlog_.append(s);
      if (queued() > kHighWater) was_above_high_ = true;
      return;
    }
    while (!s.empty()) {
      ERR_clear_error();
      int n = SSL_write(ssl_, s.data(), static_cast<int>(std::min<size_t>(s.size(), 1 << 20)));
      if (n <= 0) {
        fail(Errc::tls, tls::last_error());
        return;
      }
      s.remove_prefix(static_cast<size_t>(n));
    }
    take_tls_output();
  } else {
    out_.push_copy(s);
  }
  if (out_.bytes() > kHighWater) was_above_high_ = true;
  flush();
}

void Stream::flush() {
  if (writing_ || closing_ || !connected_) return;
  if (g_read_depth > 0) {
    if (!flush_deferred_) {
      flush_deferred_ = true;
      g_deferred.push_back(this);
    }
    return;
  }
  if (out_.empty()) {
    maybe_finish_shutdown();
    return;
  }
  uv_buf_t bufs[WriteQueue::kMaxIov];
  size_t n = peek_bufs(out_, bufs);
  auto* st = reinterpret_cast<uv_stream_t*>(&tcp_);
  int w = uv_try_write(st, bufs, static_cast<unsigned>(n));
  if (w > 0) {
    out_.consume(static_cast<size_t>(w));
  } else if (w < 0 && w != UV_EAGAIN) {
    fail(classify(w), uv::error_string(w));
    return;
  }
  if (!out_.empty()) {
    n = peek_bufs(out_, bufs);
    in_flight_ = 0;
    for (size_t i = 0; i < n; ++i) in_flight_ += bufs[i].len;
    writing_ = true;
    int rc = uv_write(&wreq_, st, bufs, static_cast<unsigned>(n), on_write_cb);
    if (rc != 0) {
      writing_ = false;
      fail(classify(rc), uv::error_string(rc));
      return;
    }
    return;
  }
  if (was_above_high_ && queued() <= kLowWater) {
    was_above_high_ = false;
    if (handler_) handler_->on_drain(*this);
    if (closing_) return;
  }
  maybe_finish_shutdown();
}

void Stream::on_write_cb(uv_write_t* req, int status) {
  auto* s = static_cast<Stream*>(req->handle->data);
  s->writing_ = false;
  if (s->closing_) return;  // the queue is dropped in on_close_cb
  if (status < 0) {
    s->fail(classify(status), uv::error_string(status));
    return;
  }
  s->out_.consume(s->in_flight_);
  s->in_flight_ = 0;
  if (s->was_above_high_ && s->queued() <= kLowWater) {
    s->was_above_high_ = false;
    if (s->handler_) s->handler_->on_drain(*s);
    if (s->closing_) return;
  }
  s->flush();
}

void Stream::on_connect_cb(uv_connect_t* req, int status) {
  auto* s = static_cast<Stream*>(req->handle->data);
  s->connecting_ = false;
  if (s->closing_) return;
  if (status < 0) {
    s->fail(Errc::connect, uv::error_string(status));
    return;
  }
  s->connected_ = true;
  uv_tcp_nodelay(&s->tcp_, 1);
  s->start_reading();
  if (s->ssl_) {
    s->pump_tls();  // sends the ClientHello; on_ready comes with the handshake
    return;
  }
  if (s->handler_) s->handler_->on_ready(*s);
  if (!s->closing_) s->flush();
}

void Stream::shutdown() {
  if (shut_requested_ || closing_) return;
  shut_requested_ = true;
  if (ssl_ && tls_done_) {
    SSL_shutdown(ssl_);  // queues close_notify
    take_tls_output();
  }
  flush();
}

void Stream::maybe_finish_shutdown() {
  if (!shut_requested_ || shut_sent_ || writing_ || !out_.empty() || closing_ || !connected_)
    return;
  shut_sent_ = true;
  uv_shutdown(&sreq_, reinterpret_cast<uv_stream_t*>(&tcp_), on_shutdown_cb);
}

void Stream::on_shutdown_cb(uv_shutdown_t* req, int) {
  auto* s = static_cast<Stream*>(req->handle->data);
  s->shut_done_ = true;
  if (s->closing_) return;
  if (s->handler_) s->handler_->on_shutdown(*s);
}

void Stream::deliver_eof() {
  if (eof_delivered_) return;
  eof_delivered_ = true;
  if (reading_) {
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp_));
    reading_ = false;
  }
  if (handler_ && !closing_) handler_->on_eof(*this);
}

void Stream::fail(Errc kind, const std::string& detail) {
  if (closing_) return;
  if (handler_) {
    handler_->on_error(*this, kind, detail);
  } else {
    close();
  }
}

void Stream::close() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), on_close_cb);
}

void Stream::close_reset() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  if (uv_tcp_close_reset(&tcp_, on_close_cb) != 0)
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), on_close_cb);
}

void Stream::close_and_delete() {
  handler_ = nullptr;
  delete_on_close_ = true;
  close();
}

void Stream::on_close_cb(uv_handle_t* h) {
  auto* s = static_cast<Stream*>(h->data);
  s->closed_ = true;
  --live_;
  if (s->flush_deferred_) {
    std::erase(g_deferred, s);
    s->flush_deferred_ = false;
  }
  s->out_.clear();
  s->rchunk_.reset();
  if (s->ssl_) {
    SSL_free(s->ssl_);  // frees the BIOs too
    s->ssl_ = nullptr;
  }
  if (s->delete_on_close_) {
    delete s;
    return;
  }
  if (s->handler_) s->handler_->on_closed(*s);
}

}  // namespace fy::proxy

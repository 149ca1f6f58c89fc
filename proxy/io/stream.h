// One side of a proxied connection: a TCP socket (libuv owns the fd),
// optionally carrying TLS over memory BIOs, with an outgoing queue and
// watermark flow control. The client side and the origin side of every
// connection are each one Stream; the HTTP logic lives in the handler.
//
// Ownership and lifetime:
//  - A Stream is owned by its handler (or by itself after close_and_delete()).
//  - Its uv_tcp_t is embedded; the Stream's memory may be freed only after
//    on_closed() has been delivered (libuv's rule). ~Stream asserts that.
//  - close() is the one kill point; callbacks stop once it is called, except
//    on_closed(), which always comes, from the loop, after close().
//
// Re-entrancy: on_read/on_eof/on_error/on_ready/on_drain are delivered from
// libuv callbacks, and from resume() when TLS holds decrypted bytes that were
// not delivered while paused. A handler may call any method from inside a
// callback, including close(); the Stream checks for that after every call.
#pragma once

#include <openssl/base.h>
#include <uv.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/buffer.h"
#include "core/result.h"

namespace fy::tls {
class SessionCache;
}

namespace fy::proxy {

class Stream;

// An origin's certificate that the proxy refused in the handshake, typed:
// the X509 verify result and its text. Read it from Stream::verify_failure()
// in on_error rather than matching the detail's text.
struct TlsVerifyFailure {
  long code = 0;       // X509_V_ERR_*
  std::string reason;  // X509_verify_cert_error_string(code)
};

class StreamHandler {
 public:
  virtual ~StreamHandler() = default;
  // Plaintext from the peer, living in `chunk`: keep a ChunkRef (e.g. by
  // queueing the range on another Stream) to use the bytes after the call.
  virtual void on_read(Stream& s, const ChunkRef& chunk, const char* p, size_t n) = 0;
  // The peer has finished sending (TCP FIN or TLS close_notify).
  virtual void on_eof(Stream& s) = 0;
  // A connect, read, write or TLS failure. `kind` is Errc::connect, reset,
  // tls, io. A certificate the proxy refused is Errc::tls with
  // s.verify_failure() set (read it, never the detail's text, which is
  // "certificate verify failed: <reason>" for a log line).
  virtual void on_error(Stream& s, Errc kind, const std::string& detail) = 0;
  // Client role: connected (and TLS established when set). Server role: TLS
  // established after start_tls_server().
  virtual void on_ready(Stream& s) = 0;
  // The write queue fell to the low watermark after having passed the high one.
  virtual void on_drain(Stream& s) {}
  // shutdown() completed: everything queued was written and FIN was sent.
  virtual void on_shutdown(Stream& s) {}
  virtual void on_closed(Stream& s) = 0;
};

class Stream {
 public:
  static constexpr size_t kHighWater = 256 * 1024;
  static constexpr size_t kLowWater = 64 * 1024;

  Stream(uv_loop_t* loop, StreamHandler* handler);
  ~Stream();
  // Write coalescing across consecutive full reads (stream.cc, "Coalescing"):
  // only for a loop whose owner calls flush_held() before every poll (a
  // uv_prepare handle). Off by default; turning it off flushes what is held.
  static void set_read_coalescing(bool on);
  static void flush_held();
  // Streams made and not yet closed, process-wide (each holds at most one
  // descriptor; the loop thread only): what the descriptor budget counts.
  static uint64_t live() { return live_; }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Server side: accepts a pending connection of `server` into this stream.
  int accept_from(uv_stream_t* server);
  // Client side: TLS to the origin, verified for `verify_name` (a host name
  // or IP literal); call before connect(). With `sessions`, a session for
  // `session_key` is offered and a new one stored there.
  void set_tls_client(SSL_CTX* ctx, const std::string& verify_name,
                      tls::SessionCache* sessions = nullptr, const std::string& session_key = {});
  int connect(const sockaddr* addr);
  // Decrypting a client: TLS server with this certificate chain; `hello` is
  // the bytes already read (the ClientHello), fed to TLS first.
  bool start_tls_server(SSL_CTX* ctx, CRYPTO_BUFFER* leaf, CRYPTO_BUFFER* ca, EVP_PKEY* key,
                        std::string_view hello);

  void start_reading();
  void pause();
  void resume();
  bool paused() const { return paused_; }

  void write(const ChunkRef& c, const char* p, size_t n);  // zero-copy unless TLS
  void write(std::string_view s);                          // copied
  // Sends FIN (after close_notify for TLS) once everything queued is written.
  void shutdown();
  // Stops everything and closes the handle; queued bytes are dropped.
  void close();
  // Closes with a TCP RST.
  void close_reset();
  // Detaches the handler and frees itself once closed.
  void close_and_delete();
  // Hands the stream to another handler (the origin pool and back).
  void set_handler(StreamHandler* h) { handler_ = h; }

  // Before the stream connected (so nothing of it reached the wire): the
  // plaintext queued on it, taken out (uncounted in bytes_out()). A dial
  // falling back to another address carries it to the next Stream. "" once
  // connected.
  std::string take_unsent();
  // Bytes written and not yet sent, plaintext waiting for the handshake included.
  size_t queued() const { return out_.bytes() + backlog_.size(); }
  bool above_high() const { return queued() > kHighWater; }
  bool closing() const { return closing_; }
  bool is_tls() const { return ssl_ != nullptr; }
  bool tls_established() const { return tls_done_; }
  bool eof_seen() const { return eof_; }
  bool connected() const { return connected_; }
  bool write_shut() const { return shut_requested_; }
  bool shutdown_done() const { return shut_done_; }
  // "ip:port" of the peer, "" when unknown.
  std::string peer_address() const;
  // The fd, for socket options (SO_LINGER, TCP_NODELAY).
  int fd() const;

  // Set when the origin handshake failed on the certificate (client role).
  const std::optional<TlsVerifyFailure>& verify_failure() const { return verify_failure_; }

  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t bytes_out() const { return bytes_out_; }

  void* user = nullptr;  // owner's tag

 private:
  static inline uint64_t live_ = 0;
  static void on_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void on_read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_write_cb(uv_write_t* req, int status);
  static void on_connect_cb(uv_connect_t* req, int status);
  static void on_shutdown_cb(uv_shutdown_t* req, int status);
  static void on_close_cb(uv_handle_t* h);

  void handle_plain(const char* p, size_t n);
  void handle_tls_wire(const char* p, size_t n);
  // Runs the handshake and decrypts what TLS holds, delivering plaintext
  // until paused or closed. Returns false when the stream was closed.
  bool pump_tls();
  void take_tls_output();  // wbio -> out_
  void flush();
  static void flush_deferred();  // see g_read_depth in stream.cc
  void fail(Errc kind, const std::string& detail);
  void deliver_eof();
  void maybe_finish_shutdown();

  uv_tcp_t tcp_;
  uv_write_t wreq_;
  uv_connect_t creq_;
  uv_shutdown_t sreq_;
  StreamHandler* handler_;
  ChunkRef rchunk_;
  size_t roff_ = 0;
  WriteQueue out_;
  size_t in_flight_ = 0;  // bytes handed to uv_write, not yet called back
  bool writing_ = false;
  bool reading_ = false;
  bool paused_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool delete_on_close_ = false;
  bool eof_ = false;
  bool eof_delivered_ = false;
  bool shut_requested_ = false;
  bool shut_sent_ = false;
  bool shut_done_ = false;
  bool was_above_high_ = false;
  bool connecting_ = false;
  bool connected_ = false;  // accepted, or connect() completed
  bool in_pump_ = false;
  bool flush_deferred_ = false;  // on the list of streams to flush after the read callback
  uint8_t held_reads_ = 0;       // consecutive full reads whose flush was held

  // TLS over memory BIOs (owned by ssl_).
  SSL* ssl_ = nullptr;
  BIO* rbio_ = nullptr;
  BIO* wbio_ = nullptr;
  std::string backlog_;  // plaintext written before the handshake completed
  bool tls_server_ = false;
  bool tls_done_ = false;
  std::optional<TlsVerifyFailure> verify_failure_;

  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

}  // namespace fy::proxy

// The origin side of a connection, up to a connected Stream: the pool lookup,
// the DNS request, the address list and its iteration, the attempt clock, the
// connect (and origin TLS handshake) of each address, and the last connect
// error. nghttpx's DownstreamConnection up to its connect; what the
// connection then does with the origin (requests, responses, tunnels, the
// pool on retirement) stays the connection's.
//
// Ownership (one owner per handle):
//  - The dialer owns its getaddrinfo request and the Stream it is dialling
//    (stream()), from start() until it hands the connected one over
//    (DialOwner::on_dialed) or the dial fails or is cancelled.
//  - A getaddrinfo request may outlive the dialer: cancel() (and the
//    destructor) detach it, and its callback, which libuv always runs later
//    (UV_ECANCELED or the answer), then only frees it.
//  - A Stream being dialled is closed with close_and_delete() on a fallback,
//    a failure or cancel(): its handler is detached at once, so its connect
//    callback, which libuv runs later (UV_ECANCELED), reaches nobody.
//
// Callbacks: never from inside start(), next_address() or cancel() (what
// fails at once is their return value). Later, from the loop, exactly one of
// on_dialed / on_dial_failed per start(), unless cancel() (or another
// start()) came first; after cancel() none. The owner may call any method,
// cancel() and start() included, from inside a callback.
//
// While dialling, the Stream's events that are not the dial's own (on_read,
// on_eof, on_drain, on_shutdown: e.g. an origin's FIN during its TLS
// handshake) are passed on to `events`, the owner's StreamHandler, as if it
// owned the Stream; the owner may queue bytes on stream() (a request head
// written while connecting). A fallback to the next address starts a fresh
// Stream and carries over what was queued on the failed one (none of it
// reached the wire: it never connected), a shutdown() asked included.
#pragma once

#include <uv.h>

#include <optional>
#include <string>
#include <vector>

#include "core/net.h"
#include "core/result.h"
#include "proxy/io/stream.h"

namespace fy::tls {
class SessionCache;
}

namespace fy::proxy {

class OriginPool;

// A dial that failed for good.
struct DialFailure {
  Errc kind = Errc::connect;  // dns, connect, tls, reset, io (out of descriptors), closed
  std::string detail;
  std::optional<TlsVerifyFailure> verify;  // the origin's certificate was refused
  bool out_of_files = false;  // no descriptor to spare: the proxy's condition, not the origin's
  // No connect was in flight: every remaining address failed as it was
  // tried, or getaddrinfo could not start. Reported by the owner on a later
  // turn, never from inside the request handling that dialled.
  bool at_once = false;
};

// What the connection implements for its dialer.
class DialOwner {
 public:
  virtual ~DialOwner() = default;
  // Whether a descriptor may go to an origin now (false: the connect is
  // refused as if the kernel had, UV_EMFILE).
  virtual bool descriptor_spare() = 0;
  // Connected (TLS established when asked). `s` is the owner's from here on,
  // its handler the `events` handler the dialer was made with.
  virtual void on_dialed(Stream& s) = 0;
  // Failed: no Stream is left, the dialer is idle (last_error() still reads).
  virtual void on_dial_failed(DialFailure f) = 0;
};

class OriginDialer final : public StreamHandler {
 public:
  // `pool` may be null (no pooled reuse). `events` receives the dialled
  // Stream's other events, and every event once it is handed over.
  OriginDialer(uv_loop_t* loop, OriginPool* pool, DialOwner& owner, StreamHandler& events);
  ~OriginDialer() override;  // cancel()
  OriginDialer(const OriginDialer&) = delete;
  OriginDialer& operator=(const OriginDialer&) = delete;

  struct Target {
    HostPort dest;  // the pool's key (authority), DNS name, TLS verify name
    bool tls = false;
    // An idle pooled cleartext connection to `dest` may serve (never for TLS).
    bool use_pool = false;
    // Known addresses (an IP literal, --resolve, --connect-to) are dialled
    // in order; none: `dest.host` is resolved (at most 8, IPv4 and IPv6),
    // each address with `port`.
    std::vector<sockaddr_storage> addrs;
    uint16_t port = 0;
    SSL_CTX* tls_ctx = nullptr;               // with tls
    tls::SessionCache* sessions = nullptr;    // with tls: resumption
  };
  enum class How : uint8_t { connecting, pooled, failed_now };
  struct Started {
    How how = How::connecting;
    Stream* pooled = nullptr;  // pooled: the caller's now, its handler `events`
    DialFailure failure;       // failed_now (at_once set)
  };
  // Starts a dial (cancelling one in flight). connecting: resolving or
  // connecting, the outcome comes by callback.
  Started start(const Target& t);
  // The current address had its attempt (attempt_started()): move on to the
  // next. connecting or failed_now, as start().
  Started next_address();
  // Stops the dial in flight, if any; no callback after. Idempotent.
  void cancel();

  // The Stream being dialled, for the owner to queue bytes on (or pause);
  // null when not dialling (also during nothing but an at-once failure).
  Stream* stream() const { return stream_; }
  bool dialling() const { return stream_ != nullptr; }
  // uv_now when this dial started; 0 once connected, pooled, or cancelled.
  // (After an at-once failure it stays set until cancel(), as the owner's
  // deadline table has always read it.)
  uint64_t dial_started() const { return start_ms_; }
  // When the current address's connect began, while another address
  // remains and it has not connected; else 0. deadline.h adds kAttemptMs.
  uint64_t attempt_started() const;
  // The last connect error of this dial ("" when none yet); start() clears
  // it, cancel() does not.
  const std::string& last_error() const { return last_error_; }

  // StreamHandler, for the Stream being dialled.
  void on_read(Stream& s, const ChunkRef& c, const char* p, size_t n) override;
  void on_eof(Stream& s) override;
  void on_error(Stream& s, Errc kind, const std::string& detail) override;
  void on_ready(Stream& s) override;
  void on_drain(Stream& s) override;
  void on_shutdown(Stream& s) override;
  void on_closed(Stream&) override {}  // never: dialled Streams close detached

 private:
  struct Dns;
  void on_resolved(int status, struct addrinfo* res);
  Stream* new_stream();
  // Tries the addresses from next_ on; false when every one failed at once
  // (`failure` says why).
  bool connect_next(DialFailure* failure);
  void drop_stream();
  // drop_stream() on a fallback to the next address: what the owner queued
  // on the Stream that did not connect is kept for the next one
  // (connect_next writes it).
  void fall_back();
  void fail(DialFailure f);

  uv_loop_t* loop_;
  OriginPool* pool_;
  DialOwner& owner_;
  StreamHandler& events_;
  Target target_;
  Stream* stream_ = nullptr;
  Dns* dns_ = nullptr;
  std::vector<sockaddr_storage> addrs_;
  size_t next_ = 0;
  uint64_t start_ms_ = 0;
  uint64_t attempt_ms_ = 0;
  std::string last_error_;
  std::string unsent_;        // fall_back()'s, for the next connecting Stream
  bool unsent_shut_ = false;  // and the owner's shutdown() with it
};

}  // namespace fy::proxy

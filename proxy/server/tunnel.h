// The tunnel role of a connection: the byte relay both ways for a CONNECT
// passed through, an opaque tunnel, or an upgrade after a 101, and the one
// Network Log row it ends with (its start, its byte counts each way, its
// error). What the proxy decided before (admission, the dial) and what ends
// the connection stay the Connection's.
//
// Why a value type with relay steps, not a class that owns the event flow
// (as OriginDialer does for its dial):
//  - The Connection stays the StreamHandler of both Streams. The dialer hands
//    the origin over with the Connection as its handler, the client Stream's
//    close callback is the Connection's release, and every read is counted
//    (metrics, the idle clock) before any role sees it. A Tunnel handler
//    would re-route both Streams on entry and back on close: a second place
//    that decides when the connection ends.
//  - Pausing is the Connection's bitmask, shared with reasons that are not
//    the tunnel's (a stash paused before a 101 is resumed as the upgrade
//    starts; an upload paused before it is resumed by the origin's drain).
//    The relay says when the reading side must pause; the owner applies it.
// So a Tunnel is the state (kind, clock, counters, the bytes held while the
// origin connects, the error) and the steps of the relay. Each step acts only
// on the Streams it is given (writes, shutdowns) and returns what the owner
// must do; none calls back, closes, frees or pauses anything itself.
//
// Lifetimes: the Tunnel owns no handle and keeps no Stream between calls. A
// write may still fail at once and tell the Stream's handler (the owner)
// from inside the step, as Stream::write always may; the owner may then close
// and retire that Stream, which stays allocated until its close callback, so
// the step's reading of it afterwards (above_high()) is safe, and so is the
// pause a step may then ask for (Stream::pause on a closing Stream, whose
// reading close() already stopped, only sets a flag).
//
// Half-closes are read from the Streams (Stream::eof_seen(), set as on_eof
// is reported), not kept twice: a client FIN that came before a 101 counts
// for the upgrade's tunnel too, and (as before) does not shut the origin.
#pragma once

#include <cstdint>
#include <string>

#include "core/buffer.h"
#include "proxy/io/stream.h"
#include "proxy/netlog/row.h"

namespace fy::proxy {

enum class TunnelKind : uint8_t { none, passthrough, opaque, upgrade };

class Tunnel {
 public:
  // The row's start: the CONNECT's (set at its 200, before the first bytes
  // decide) or the upgrade request's. `wall_ms`: the row's ts; `start_ms`:
  // uv_now, its duration counts from it.
  void set_start(int64_t wall_ms, uint64_t start_ms) {
    start_wall_ = wall_ms;
    start_ms_ = start_ms;
  }
  // Relaying from here on. `held`: client bytes already read (a ClientHello),
  // written when the origin connects (origin_connected()).
  void open(TunnelKind kind, std::string held = {});
  TunnelKind kind() const { return kind_; }
  // The row's tls field of a passthrough or opaque tunnel (the Connection's
  // tls_mode_ for its other rows).
  static const char* tls_mode(TunnelKind kind);

  // Client bytes, counted up and written to `origin` when it is connected;
  // while it `connecting`, held (the same bound as a write queue); with
  // neither, counted and dropped. True: pause reading the client until the
  // origin drains (or origin_connected() says so).
  [[nodiscard]] bool from_client(Stream* origin, bool connecting, const ChunkRef& c, const char* p,
                                 size_t n);
  // Origin bytes, counted down and written to `client`. True: pause reading
  // the origin until the client drains.
  [[nodiscard]] bool from_origin(Stream& client, const ChunkRef& c, const char* p, size_t n);
  // The origin connected: the held bytes are written. True: the client,
  // paused for them, may read again.
  [[nodiscard]] bool origin_connected(Stream& origin);
  // A FIN from one side goes to the other as a shutdown (after what is
  // queued). `origin` null: not dialled, nothing to shut.
  void client_eof(Stream* origin);
  void origin_eof(Stream& client);
  // Both FINs seen and both shutdowns done: the tunnel is over; the owner
  // closes (and writes row()).
  bool finished(const Stream& client, const Stream* origin) const;

  // The connection ended the tunnel (its origin failed, a setup phase ran
  // out, the policy closed it): the row's error, in the Network Log's words.
  void end_with(std::string error) { error_ = std::move(error); }
  uint64_t up() const { return up_; }
  uint64_t down() const { return down_; }

  // The tunnel's row, before the connection's fields (Connection::fill_row).
  // `fallback_error`: the row's error when the connection set none (the
  // dialer's last connect error, as it always has been). An upgrade's row
  // takes `exchange`'s method, host, path and ua and adds its bytes (the
  // request and the 101); a CONNECT's names `connect_key`.
  netlog::Row row(uint64_t now_ms, const std::string& fallback_error, const netlog::Row& exchange,
                  const std::string& connect_key) const;

 private:
  TunnelKind kind_ = TunnelKind::none;
  int64_t start_wall_ = 0;
  uint64_t start_ms_ = 0;
  uint64_t up_ = 0, down_ = 0;
  std::string held_;
  std::string error_;
};

}  // namespace fy::proxy

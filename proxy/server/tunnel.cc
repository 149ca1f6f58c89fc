#include "proxy/server/tunnel.h"

#include <utility>

namespace fy::proxy {

void Tunnel::open(TunnelKind kind, std::string held) {
  kind_ = kind;
  held_ = std::move(held);
}

const char* Tunnel::tls_mode(TunnelKind kind) {
  return kind == TunnelKind::passthrough ? "passthrough" : "opaque";
}

bool Tunnel::from_client(Stream* origin, bool connecting, const ChunkRef& c, const char* p,
                         size_t n) {
  up_ += n;
  if (origin) {
    origin->write(c, p, n);
    return origin->above_high();
  }
  if (connecting) {
    // Never an upgrade (its origin answered the 101): kept until
    // origin_connected().
    held_.append(p, n);
    return held_.size() > Stream::kHighWater;
  }
  return false;
}

bool Tunnel::from_origin(Stream& client, const ChunkRef& c, const char* p, size_t n) {
  down_ += n;
  client.write(c, p, n);
  return client.above_high();
}

bool Tunnel::origin_connected(Stream& origin) {
  if (held_.empty()) return false;
  origin.write(held_);
  held_.clear();
  return !origin.above_high();
}

void Tunnel::client_eof(Stream* origin) {
  if (origin) origin->shutdown();
}

void Tunnel::origin_eof(Stream& client) {
  client.shutdown();
}

bool Tunnel::finished(const Stream& client, const Stream* origin) const {
  if (!client.eof_seen() || !origin || !origin->eof_seen()) return false;
  return client.shutdown_done() && origin->shutdown_done();
}

netlog::Row Tunnel::row(uint64_t now_ms, const std::string& fallback_error,
                        const netlog::Row& exchange, const std::string& connect_key) const {
  netlog::Row row;
  row.ts_ms = start_wall_;
  row.host = kind_ == TunnelKind::upgrade ? exchange.host : connect_key;
  row.duration_ms = static_cast<int64_t>(now_ms - start_ms_);
  row.bytes_up = up_;
  row.bytes_down = down_;
  row.error = error_.empty() ? fallback_error : error_;
  if (kind_ == TunnelKind::upgrade) {
    row.method = exchange.method;
    row.path = exchange.path;
    row.status = 101;
    row.ua = exchange.ua;
    row.bytes_up += exchange.bytes_up;
    row.bytes_down += exchange.bytes_down;
  } else {
    row.method = "CONNECT";
    row.passthrough = true;
    row.tls = tls_mode(kind_);
  }
  return row;
}

}  // namespace fy::proxy

// The exchange role of a connection: one request and its response, and the
// one Network Log row it ends with. The row is the exchange's: it is begun
// here, the connection records what happened through the steps below
// (status, bytes, the error, blocked, held, overlap, scoped, the captured
// error body) and the exchange produces the finished row, once.
//
// The cut follows tunnel.h's: state as values, steps that change only this
// object. The exchange owns no handle and writes nowhere; the connection
// appends the finished row to the Network Log, and it supplies its own
// fields (peer, attribution, the stamp's) as ConnFields at the end.
//
// The row's lifecycle:
//   none ──begin()──▶ begun ──finish()──▶ written
//                       └──hand_over()──▶ handed (a CONNECT: its tunnel, or
//                                          its requests, write their rows)
// begin() starts a new exchange from any state (everything is reset);
// finish() produces the row only from begun; from any other state it gives
// nothing, so the row is written at most once whoever calls it again (a late
// close after a completed response does).
//
// The HTTP specifics (parsing, framing, keep-alive) are the client codec's
// and the connection's; nothing here depends on HTTP/1's parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/net.h"
#include "proxy/netlog/row.h"
#include "proxy/policy/pattern.h"
#include "proxy/server/credential_flow.h"

namespace fy::proxy {

// The connection's fields of every row it writes (an exchange's, its
// tunnel's, a would_block row). Views: valid while the row is filled.
struct ConnFields {
  uint64_t conn = 0;
  std::string_view peer;
  bool build_marker = false;  // the connection presented the build marker
  bool in_connect = false;    // the rows are of requests inside a CONNECT
  std::string_view tls_mode;  // the CONNECT's ("decrypted", "plain", ...)
  std::string_view sni;
  netlog::Attribution attribution = netlog::Attribution::none;
  std::string_view src, net, who, boot;  // the stamp's, read only when attributed
  uint64_t seq = 0;

  // Writes them into `row`; its tls only when the row has none of its own
  // (then the CONNECT's mode, or "plain" outside one).
  void fill(netlog::Row& row) const;
};

class Exchange {
 public:
  enum class RowState : uint8_t { none, begun, handed, written };

  // A new exchange (everything reset) and its row: `method` as the client
  // sent it ("" when no head could be read), `wall_ms` the row's ts,
  // `now_ms` (uv_now) where its duration counts from.
  void begin(std::string_view method, int64_t wall_ms, uint64_t now_ms);
  // Back to no exchange at all (the one in flight is over).
  void reset() { *this = Exchange{}; }
  // A row is begun and not yet written or handed over.
  bool active() const { return state_ == RowState::begun; }
  RowState state() const { return state_; }
  uint64_t start_ms() const { return start_ms_; }

  // The row's fields as the exchange has them so far. Read by the tunnel of
  // an upgrade and the would_block row; written only by roles that set
  // fields of their own on it (CredentialFlow) and through the steps below.
  const netlog::Row& row() const { return row_; }
  netlog::Row& row_for_roles() { return row_; }

  // What the request names and carries.
  void set_host(std::string key) { row_.host = std::move(key); }
  void set_path(std::string path) { row_.path = std::move(path); }
  void set_ua(std::string ua) { row_.ua = std::move(ua); }
  void add_up(uint64_t n) { row_.bytes_up += n; }
  void add_down(uint64_t n) { row_.bytes_down += n; }
  // "<kind>: <detail>", the Network Log's words (a later one replaces it).
  void set_error(std::string error) { row_.error = std::move(error); }
  // Refused by the allowlist (or challenged): the row names no tls.
  void set_blocked() { row_.blocked = true; }
  void set_held(std::string axis) { row_.held = std::move(axis); }
  void set_overlap() { row_.overlap = true; }
  void set_scoped(std::string rule) { row_.scoped = std::move(rule); }
  void set_status(int status) { row_.status = status; }

  // The proxy answered itself: `status`, `bytes` written to the client, and
  // for a status >= 400 its body as the row's error_body (collapsed).
  void answered(int status, uint64_t bytes, std::string_view body);

  // The origin's final response head (`status`) is being forwarded.
  void response_head(int status) {
    row_.status = status;
    response_started = true;
  }
  bool response_started = false;
  // Whether the response body is captured as the row's error_body: for a
  // status >= 400 in identity encoding (`content_encoding` absent or
  // "identity"), never for a request that carried an injected credential
  // (origins echo what they were sent; the log must never hold a token).
  void decide_capture(int status, std::optional<std::string_view> content_encoding);
  // Response body bytes: appended while capturing, up to kMaxErrorBody.
  void body_bytes(std::string_view b);
  // The response ended: a captured body is collapsed as the log wants it.
  void response_complete();
  // A replaced 401 (its bytes go nowhere): nothing of it stays captured.
  void discard_captured() { row_.error_body.clear(); }

  // A CONNECT answered 200: this row is not written (the tunnel's, or the
  // rows of the requests inside, follow). row() stays readable.
  void hand_over() {
    if (state_ == RowState::begun) state_ = RowState::handed;
  }

  // The finished row, with `conn`'s fields, its duration to `now_ms` and a
  // ts of `wall_ms` when it had none; nullptr (nothing to write) unless a
  // row is begun. The row stays readable (row()) until the next begin().
  [[nodiscard]] const netlog::Row* finish(const ConnFields& conn, int64_t wall_ms, uint64_t now_ms);

  // The exchange's facts, set by the connection as it judges and forwards.
  bool upgrade = false;
  bool close_after = false;
  bool origin_reuse = true;
  bool reused_origin = false;  // sent on a kept-alive origin connection
  bool retried = false;
  bool body_sent = false;      // some request body bytes went upstream
  std::string sent_head;       // kept until the response head, for one retry
  HostPort dest;
  policy::Kind kind = policy::Kind::cleartext;
  std::string target;  // origin-form, as the client sent it
  // Injection, the kept body and the 401 replay (credential_flow.h).
  CredentialFlow cred;

 private:
  RowState state_ = RowState::none;
  netlog::Row row_;
  uint64_t start_ms_ = 0;
  bool capture_body_ = false;
};

}  // namespace fy::proxy

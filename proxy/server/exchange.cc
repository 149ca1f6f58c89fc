#include "proxy/server/exchange.h"

#include "core/text.h"

namespace fy::proxy {

void ConnFields::fill(netlog::Row& row) const {
  row.conn = conn;
  row.peer = std::string(peer);
  if (build_marker) row.build = true;
  if (row.tls.empty()) row.tls = in_connect ? std::string(tls_mode) : "plain";
  if (!sni.empty()) row.sni = std::string(sni);
  row.attribution = attribution;
  if (attribution == netlog::Attribution::attributed) {
    row.src = std::string(src);
    row.net = std::string(net);
    row.who = std::string(who);
    row.seq = seq;
    row.boot = std::string(boot);
  }
}

void Exchange::begin(std::string_view method, int64_t wall_ms, uint64_t now_ms) {
  reset();
  state_ = RowState::begun;
  start_ms_ = now_ms;
  row_.ts_ms = wall_ms;
  row_.method = std::string(method);
}

void Exchange::answered(int status, uint64_t bytes, std::string_view body) {
  row_.status = status;
  row_.bytes_down += bytes;
  if (status >= 400) row_.error_body = netlog::collapse_whitespace(body, netlog::kMaxErrorBody);
}

void Exchange::decide_capture(int status, std::optional<std::string_view> content_encoding) {
  if (status >= 400 && !cred.injected())
    capture_body_ = !content_encoding || iequals(*content_encoding, "identity");
}

void Exchange::body_bytes(std::string_view b) {
  if (capture_body_ && row_.error_body.size() < netlog::kMaxErrorBody)
    row_.error_body.append(b.substr(0, netlog::kMaxErrorBody - row_.error_body.size()));
}

void Exchange::response_complete() {
  if (!row_.error_body.empty())
    row_.error_body = netlog::collapse_whitespace(row_.error_body, netlog::kMaxErrorBody);
}

const netlog::Row* Exchange::finish(const ConnFields& conn, int64_t wall_ms, uint64_t now_ms) {
  // Only from begun: a row already written (or handed over, or never begun)
  // gives nothing, so a late second call cannot write a second row. That
  // happens: a client resumed from inside a completed response can deliver a
  // malformed body chunk, whose close writes the exchange's row again.
  if (state_ != RowState::begun) return nullptr;
  state_ = RowState::written;
  netlog::Row& row = row_;
  if (row.ts_ms == 0) row.ts_ms = wall_ms;
  row.duration_ms = static_cast<int64_t>(now_ms - start_ms_);
  if (row.tls.empty() && !conn.in_connect && kind == policy::Kind::https) row.tls = "decrypted";
  conn.fill(row);
  if (row.blocked) row.tls.clear();  // a refused request names no tls, whatever fill() chose
  return &row_;
}

}  // namespace fy::proxy

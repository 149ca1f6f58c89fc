#include "proxy/netlog/row.h"

#include "core/clock.h"
#include "core/json.h"

namespace fy::netlog {

std::string_view truncate_utf8(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  // Step back over continuation bytes so a sequence is never split.
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::string collapse_whitespace(std::string_view s, size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max));
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      continue;
    }
    if (space) {
      out += ' ';
      space = false;
    }
    out += c;
    if (out.size() > max) break;  // one byte over: truncate_utf8 then cuts between characters
  }
  return std::string(truncate_utf8(out, max));
}

void append_json(std::string& out, const Row& r) {
  JsonObject o(out);
  o.str("ts", iso8601_utc(r.ts_ms, /*millis=*/true));
  o.unum("conn", r.conn);
  o.str("method", r.method);
  o.str("host", r.host);
  o.str("path", truncate_utf8(r.path, kMaxPath));
  o.num("status", r.status);
  o.boolean("injected", r.injected);
  o.boolean("replayed", r.replayed);
  if (!r.ua.empty()) o.str("ua", truncate_utf8(r.ua, kMaxUa));
  if (!r.error_body.empty()) o.str("error_body", truncate_utf8(r.error_body, kMaxErrorBody));
  if (r.passthrough) o.boolean("passthrough", true);
  if (r.blocked) o.boolean("blocked", true);
  if (r.would_block) o.boolean("would_block", true);
  if (r.build) o.boolean("build", true);
  if (!r.held.empty()) o.str("held", r.held);
  if (!r.scoped.empty()) o.str("scoped", r.scoped);
  if (r.mint_failed) o.boolean("mint_failed", true);
  if (r.overlap) o.boolean("overlap", true);
  if (!r.rule.empty()) o.str("rule", r.rule);
  if (!r.tls.empty()) o.str("tls", r.tls);
  if (!r.sni.empty()) o.str("sni", r.sni);
  o.unum("bytes_up", r.bytes_up);
  o.unum("bytes_down", r.bytes_down);
  if (r.duration_ms >= 0) o.num("duration_ms", r.duration_ms);
  if (!r.error.empty()) o.str("error", r.error);
  if (!r.peer.empty()) o.str("peer", r.peer);
  switch (r.attribution) {
    case Attribution::none: break;
    case Attribution::attributed:
      o.str("src", r.src);
      o.str("net", r.net);
      if (!r.who.empty()) o.str("who", r.who);
      o.unum("seq", r.seq);
      o.str("boot", r.boot);
      break;
    case Attribution::unattributed: o.boolean("unattributed", true); break;
  }
  o.close();
  out += '\n';
}

}  // namespace fy::netlog

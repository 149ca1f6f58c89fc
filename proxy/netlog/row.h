// One row of the Network Log: the record of one exchange, one tunnel, one
// refusal or one upstream failure. Rows are JSON objects, one per line; the
// field list and meanings are specified in docs/netlog.md, which is the
// contract fy-netlog and every other reader rely on.
#pragma once

#include <cstdint>
#include <string>

namespace fy::netlog {

enum class Attribution : uint8_t {
  none,          // no stamp key configured: attribution is not expected
  attributed,    // a valid forwarder stamp was bound to the connection
  unattributed,  // a key is configured but the connection had no valid stamp
};

struct Row {
  int64_t ts_ms = 0;  // when the request (or tunnel, or refusal) began
  uint64_t conn = 0;  // the proxy's connection id
  std::string peer;   // the TCP peer of the client connection
  std::string method;
  std::string host;  // destination key: "host" on the default port, else "host:port"
  std::string path;  // <= 200 chars, credential parameters redacted
  int status = 0;    // 0 for tunnels and would_block rows
  bool injected = false;
  bool replayed = false;
  std::string ua;          // <= 120 chars, only when present
  std::string error_body;  // status >= 400: <= 1024 chars, whitespace collapsed
  bool passthrough = false;
  bool blocked = false;
  bool would_block = false;
  bool build = false;
  bool mint_failed = false;
  bool overlap = false;
  std::string held;  // the held dummy's axis, "" when not held
  std::string rule;  // id of the injection rule applied (never its value)
  std::string scoped;  // [scope]: the rule whose credential was not for who asked (401)
  std::string tls;   // "decrypted" | "passthrough" | "plain" | "" (refused before TLS)
  std::string sni;   // the ClientHello's server name, when one was seen
  uint64_t bytes_up = 0;    // bytes from the client (heads and bodies, after TLS)
  uint64_t bytes_down = 0;  // bytes to the client
  int64_t duration_ms = -1;
  std::string error;  // a failure, "<kind>: <detail>"; the kinds: error_kind.h

  Attribution attribution = Attribution::none;
  std::string src, net, who, boot;  // the stamp's fields when attributed
  uint64_t seq = 0;
};

// Appends the row as one JSON line (with the trailing '\n').
void append_json(std::string& out, const Row& row);

// Truncation limits of the reference.
inline constexpr size_t kMaxPath = 200;
inline constexpr size_t kMaxUa = 120;
inline constexpr size_t kMaxErrorBody = 1024;

// Collapses runs of whitespace to one space and trims, then cuts to `max`.
std::string collapse_whitespace(std::string_view s, size_t max);
// Cuts to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view truncate_utf8(std::string_view s, size_t max);

}  // namespace fy::netlog

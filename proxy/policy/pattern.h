// Host patterns of the allowlist and the passthrough list, with the
// reference's semantics:
//   exact      "api.example.com"   case-insensitive, trailing dot ignored
//   wildcard   "*.example.com"     any depth of subdomain, never the bare domain
//   with port  "host:8443", "*.example.com:8443", "[2001:db8::1]:443"
// A bare pattern (no port) covers CONNECT :443 and cleartext :80 only; a
// pattern with a port covers exactly that port. IPv4 and IPv6 literals are
// judged like hosts (IPv6 written in brackets); no CIDR, schemes or paths.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace fy::policy {

struct Pattern {
  std::string host;     // normalized; for a wildcard, the suffix after "*."
  bool wildcard = false;
  uint16_t port = 0;    // 0: bare
  std::string text;     // as written, for messages

  // The canonical form: "host", "*.suffix", "host:port", "[v6]:port".
  std::string canonical() const;
};

// `allow_port`: false for passthrough entries, which name hosts only.
Result<Pattern> parse_pattern(std::string_view text, bool allow_port);

// What a destination is judged as.
enum class Kind : uint8_t {
  connect,    // a CONNECT target
  https,      // a request decrypted inside a CONNECT
  cleartext,  // an absolute-form http:// request
};

// The port a bare pattern covers for this kind.
inline uint16_t default_port(Kind k) { return k == Kind::cleartext ? 80 : 443; }

// A set of patterns with constant-time exact lookups and a walk over the
// parent domains for wildcards.
class PatternSet {
 public:
  void add(const Pattern& p);
  bool empty() const { return exact_.empty() && suffix_.empty(); }
  size_t size() const { return count_; }
  // Does any pattern cover (host, port) judged as `kind`?
  bool covers(std::string_view host, uint16_t port, Kind kind) const;
  // Does any pattern name `host`, whatever its port? (passthrough)
  bool names_host(std::string_view host) const;

 private:
  static bool ports_cover(const std::vector<uint16_t>& ports, uint16_t port, Kind kind);
  std::unordered_map<std::string, std::vector<uint16_t>> exact_;
  std::unordered_map<std::string, std::vector<uint16_t>> suffix_;
  size_t count_ = 0;
};

}  // namespace fy::policy

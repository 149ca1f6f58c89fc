// Host names, authorities and socket addresses. Every policy decision keys on a
// normalized host: ASCII lower case, no trailing root dot, IPv6 in canonical
// textual form without brackets.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.h"

namespace fy {

struct HostPort {
  std::string host;  // normalized; IPv6 without brackets
  uint16_t port = 0;

  bool is_ipv6() const { return host.find(':') != std::string::npos; }
  // "host:port", "[v6]:port".
  std::string authority() const;
  // "host" when port == default_port, else authority(): the Network Log's key.
  std::string key(uint16_t default_port) const;
  bool operator==(const HostPort&) const = default;
};

bool is_ipv4_literal(std::string_view s);
bool is_ipv6_literal(std::string_view s);  // without brackets

// Lower-cases, drops one trailing '.', canonicalizes IPv6. Refuses what cannot
// be a host: empty, bad characters, a label over 63 bytes, over 253 bytes.
Result<std::string> normalize_host(std::string_view host);

// Parses "host", "host:port", "[v6]", "[v6]:port". A missing port takes
// `default_port`; default_port 0 means the port is required.
Result<HostPort> parse_authority(std::string_view s, uint16_t default_port);

// "1.2.3.4", "::1" for AF_INET / AF_INET6 socket addresses.
std::string sockaddr_ip(const sockaddr* sa);
uint16_t sockaddr_port(const sockaddr* sa);
std::string sockaddr_string(const sockaddr* sa);  // "1.2.3.4:80", "[::1]:80"

// Fills `out` for a numeric IP literal; false when `ip` is not one.
bool make_sockaddr(std::string_view ip, uint16_t port, sockaddr_storage* out, socklen_t* len);

}  // namespace fy

#include "core/net.h"

#include <arpa/inet.h>

#include <cstring>

#include "core/text.h"

namespace fy {

std::string HostPort::authority() const {
  if (is_ipv6()) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string HostPort::key(uint16_t default_port) const {
  if (port == default_port) return is_ipv6() ? "[" + host + "]" : host;
  return authority();
}

bool is_ipv4_literal(std::string_view s) {
  if (s.empty() || s.size() > 15) return false;
  char buf[16];
  memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  in_addr a;
  return inet_pton(AF_INET, buf, &a) == 1;
}

bool is_ipv6_literal(std::string_view s) {
  if (s.empty() || s.size() > 45) return false;
  char buf[46];
  memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  in6_addr a;
  return inet_pton(AF_INET6, buf, &a) == 1;
}

Result<std::string> normalize_host(std::string_view host) {
  if (host.empty()) return make_error(Errc::invalid_argument, "the host is empty");
  if (host.find(':') != std::string_view::npos) {
    char buf[46];
    if (host.size() > 45) return make_error(Errc::invalid_argument, "'{}' is not a host", host);
    memcpy(buf, host.data(), host.size());
    buf[host.size()] = '\0';
    in6_addr a;
    if (inet_pton(AF_INET6, buf, &a) != 1)
      return make_error(Errc::invalid_argument, "'{}' is not an IPv6 address", host);
    char out[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a, out, sizeof out);
    return std::string(out);
  }
  if (host.back() == '.') host.remove_suffix(1);
  if (host.empty() || host.size() > 253)
    return make_error(Errc::invalid_argument, "'{}' is not a host name", host);
  std::string out;
  out.reserve(host.size());
  size_t label = 0;
  for (char c : host) {
    char l = ascii_lower(c);
    if (l == '.') {
      if (label == 0)
        return make_error(Errc::invalid_argument, "'{}' has an empty label", host);
      label = 0;
    } else if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-' || l == '_') {
      if (++label > 63)
        return make_error(Errc::invalid_argument, "'{}' has a label over 63 characters", host);
    } else {
      return make_error(Errc::invalid_argument,
                        "'{}' is not a host name (byte 0x{:02x} is not allowed)", host,
                        static_cast<unsigned char>(c));
    }
    out += l;
  }
  return out;
}

Result<HostPort> parse_authority(std::string_view s, uint16_t default_port) {
  std::string_view host = s;
  std::string_view port;
  bool has_port = false;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos)
      return make_error(Errc::invalid_argument, "'{}' opens '[' without closing it", s);
    host = s.substr(1, close - 1);
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':')
        return make_error(Errc::invalid_argument, "'{}' has text after ']'", s);
      port = rest.substr(1);
      has_port = true;
    }
    if (!is_ipv6_literal(host))
      return make_error(Errc::invalid_argument, "'{}' is not an IPv6 address", host);
  } else {
    size_t colon = s.rfind(':');
    if (colon != std::string_view::npos) {
      if (s.find(':') != colon)
        return make_error(Errc::invalid_argument,
                          "'{}' looks like an IPv6 address: write it in brackets, [{}]:port", s,
                          s);
      host = s.substr(0, colon);
      port = s.substr(colon + 1);
      has_port = true;
    }
  }
  HostPort hp;
  auto h = normalize_host(host);
  if (!h) return std::move(h).take_error();
  hp.host = std::move(*h);
  if (has_port) {
    auto p = parse_u64(port);
    if (!p || *p < 1 || *p > 65535)
      return make_error(Errc::invalid_argument, "'{}' has a port outside 1-65535", s);
    hp.port = static_cast<uint16_t>(*p);
  } else {
    if (default_port == 0) return make_error(Errc::invalid_argument, "'{}' needs a port", s);
    hp.port = default_port;
  }
  return hp;
}

std::string sockaddr_ip(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
      inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

uint16_t sockaddr_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

std::string sockaddr_string(const sockaddr* sa) {
  std::string ip = sockaddr_ip(sa);
  if (ip.find(':') != std::string::npos) return "[" + ip + "]:" + std::to_string(sockaddr_port(sa));
  return ip + ":" + std::to_string(sockaddr_port(sa));
}

bool make_sockaddr(std::string_view ip, uint16_t port, sockaddr_storage* out, socklen_t* len) {
  memset(out, 0, sizeof *out);
  std::string s(ip);
  auto* s4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, s.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, s.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

}  // namespace fy

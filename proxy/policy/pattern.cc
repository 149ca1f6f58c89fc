#include "proxy/policy/pattern.h"

#include <algorithm>

#include "core/net.h"
#include "core/text.h"

namespace fy::policy {

std::string Pattern::canonical() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (wildcard) h = "*." + h;
  if (port) h += ":" + std::to_string(port);
  return h;
}

Result<Pattern> parse_pattern(std::string_view text, bool allow_port) {
  Pattern p;
  p.text = std::string(text);
  std::string_view s = trim_ows(text);
  if (s.empty()) return make_error(Errc::invalid_argument, "an empty host pattern");
  if (s.find("://") != std::string_view::npos || s.find('/') != std::string_view::npos)
    return make_error(Errc::invalid_argument,
                      "'{}' is not a host pattern: write the host only (no scheme or path), "
                      "e.g. api.example.com, *.example.com or api.example.com:8443",
                      text);
  if (s.substr(0, 2) == "*.") {
    p.wildcard = true;
    s.remove_prefix(2);
  } else if (s.find('*') != std::string_view::npos) {
    return make_error(Errc::invalid_argument,
                      "'{}': a wildcard is only allowed as a leading '*.', e.g. *.example.com",
                      text);
  }
  bool has_port = s.front() == '[' ? s.find("]:") != std::string_view::npos
                                   : s.find(':') != std::string_view::npos;
  auto hp = parse_authority(s, /*default_port=*/443);
  if (!hp) {
    return make_error(Errc::invalid_argument, "'{}' is not a host pattern: {}", text,
                      hp.error().message);
  }
  if (has_port && !allow_port)
    return make_error(Errc::invalid_argument,
                      "'{}': a passthrough entry names a host, not a port; drop ':{}'", text,
                      hp->port);
  p.port = has_port ? hp->port : 0;
  p.host = hp->host;
  bool v6 = p.host.find(':') != std::string::npos;
  if (v6 && p.wildcard)
    return make_error(Errc::invalid_argument, "'{}': an IPv6 address cannot be a wildcard", text);
  if (!v6 && p.host.find('.') == std::string::npos)
    return make_error(Errc::invalid_argument,
                      "'{}' needs at least one dot: a pattern names a public host such as "
                      "example.com",
                      text);
  if (p.wildcard && is_ipv4_literal(p.host))
    return make_error(Errc::invalid_argument, "'{}': an IP address cannot be a wildcard", text);
  return p;
}

void PatternSet::add(const Pattern& p) {
  auto& ports = (p.wildcard ? suffix_ : exact_)[p.host];
  if (std::find(ports.begin(), ports.end(), p.port) == ports.end()) {
    ports.push_back(p.port);
    ++count_;
  }
}

bool PatternSet::ports_cover(const std::vector<uint16_t>& ports, uint16_t port, Kind kind) {
  for (uint16_t p : ports) {
    if (p == port) return true;
    if (p == 0 && port == default_port(kind)) return true;
  }
  return false;
}

bool PatternSet::covers(std::string_view host, uint16_t port, Kind kind) const {
  if (!exact_.empty()) {
    auto it = exact_.find(std::string(host));
    if (it != exact_.end() && ports_cover(it->second, port, kind)) return true;
  }
  if (suffix_.empty() || host.find(':') != std::string_view::npos) return false;
  // "a.b.example.com" is covered by "*.b.example.com", "*.example.com", "*.com".
  size_t dot = host.find('.');
  while (dot != std::string_view::npos) {
    std::string_view parent = host.substr(dot + 1);
    auto it = suffix_.find(std::string(parent));
    if (it != suffix_.end() && ports_cover(it->second, port, kind)) return true;
    dot = host.find('.', dot + 1);
  }
  return false;
}

bool PatternSet::names_host(std::string_view host) const {
  if (exact_.count(std::string(host))) return true;
  if (host.find(':') != std::string_view::npos) return false;
  size_t dot = host.find('.');
  while (dot != std::string_view::npos) {
    if (suffix_.count(std::string(host.substr(dot + 1)))) return true;
    dot = host.find('.', dot + 1);
  }
  return false;
}

}  // namespace fy::policy

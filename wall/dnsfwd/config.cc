#include "wall/dnsfwd/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/config.h"
#include "core/netns_path.h"

namespace fy::dnsfwd {
namespace {

std::optional<HostPort> address(cfg::Table& t, std::string_view key, std::string_view v) {
  auto hp = parse_authority(v, 53);
  if (!hp || (!is_ipv4_literal(hp->host) && !is_ipv6_literal(hp->host))) {
    t.error(key, fmt::format("'{}' is not an IP address with an optional port — write e.g. "
                             "\"192.168.5.3\" or \"127.42.0.53:53\"",
                             v));
    return std::nullopt;
  }
  return *hp;
}

}  // namespace

Result<Config> parse_config(std::string_view text, const std::string& path) {
  auto doc = cfg::Doc::parse(text, path);
  if (!doc) return std::move(doc).take_error();
  Config c;
  c.path = path;
  cfg::Table root = doc->root();
  if (auto v = root.strings("upstream")) {
    for (const std::string& s : *v) {
      if (auto hp = address(root, "upstream", s)) c.upstream.push_back(*hp);
    }
    if (v->empty()) root.error("upstream", "is empty — name the resolver the VM uses, e.g. [\"192.168.5.3\"]");
  } else if (!root.has("upstream")) {
    root.error("", "upstream is required: the resolver the VM uses (its resolv.conf's, or "
                   "Lima's 192.168.5.3)");
  }
  if (auto v = root.strings("allow")) {
    for (const std::string& s : *v) {
      auto n = normalize_host(s);
      if (!n || is_ipv4_literal(*n) || is_ipv6_literal(*n)) {
        root.error("allow", fmt::format("'{}' is not a host name suffix — write e.g. "
                                        "\"github.com\" (it allows the name and every name below)",
                                        s));
      } else {
        c.policy.allow.push_back(*n);
      }
    }
  }
  if (auto v = root.string("allow_file")) {
    if (v->empty() || (*v)[0] != '/') {
      root.error("allow_file", fmt::format("'{}' is not an absolute path — write e.g. "
                                           "\"/etc/fy/dnsfwd-allow.txt\"", *v));
    } else {
      c.allow_file = *v;
    }
  }
  if (auto v = root.string("log")) c.log = *v;
  if (auto v = root.real("rate", 0.1, 100000)) c.policy.rate = *v;
  if (auto v = root.real("burst", 1, 1000000)) c.policy.burst = *v;
  if (auto v = root.integer("max_query", 17, static_cast<int64_t>(wall::dns::kMaxQuery)))
    c.policy.max_query = static_cast<size_t>(*v);
  if (auto v = root.integer("max_sources", 1, 1 << 20)) c.policy.max_sources = static_cast<size_t>(*v);
  if (auto v = root.integer("timeout_ms", 50, 60000)) c.timeout_ms = static_cast<uint32_t>(*v);
  if (auto v = root.integer("max_pending", 1, 60000)) c.max_pending = static_cast<uint32_t>(*v);
  if (auto v = root.integer("max_tcp_clients", 1, 100000))
    c.max_tcp_clients = static_cast<uint32_t>(*v);
  if (auto v = root.integer("tcp_idle_ms", 100, 600000)) c.tcp_idle_ms = static_cast<uint32_t>(*v);
  if (auto v = root.boolean("log_uid")) c.log_uid = *v;
  auto ls = root.tables("listen");
  if (ls.empty() && !root.has("listen")) {
    root.error("", "at least one [[listen]] is required: where the wall's redirect sends "
                   "port 53 (e.g. address = \"127.42.0.53\")");
  }
  for (cfg::Table& l : ls) {
    Listen out;
    if (auto v = l.string("address")) {
      if (auto hp = address(l, "address", *v)) out.address = *hp;
    } else {
      l.error("", "[[listen]] needs address, e.g. \"127.42.0.53\"");
    }
    if (auto v = l.string("netns")) out.netns = *v;
    if (auto v = l.string("name")) out.name = *v;
    if (out.name.empty()) out.name = out.netns.empty() ? "vm" : out.netns;
    out.redirect = !out.netns.empty();
    if (auto v = l.boolean("redirect")) {
      if (*v && out.netns.empty()) {
        l.error("redirect", "needs netns: the VM's own namespace is redirected by the wall "
                            "([machine] dns_forwarder), not by fy-dnsfwd");
      }
      out.redirect = *v;
    }
    if (auto v = l.boolean("follow")) {
      if (*v && out.netns.empty()) {
        l.error("follow", "needs netns: the namespace to follow (e.g. "
                          "\"/run/user/1000/netns/rootless-netns\")");
      }
      out.follow = *v;
    }
    if (!out.netns.empty()) {
      std::string why = netns_path_problem(out.netns);
      if (out.netns.find('*') != std::string::npos && !out.follow)
        why = "a '*' names a namespace that comes and goes: it needs follow = true";
      if (!why.empty()) l.error("netns", why);
    }
    if (auto v = l.string("mount_ns_pid_file")) {
      if (!out.follow)
        l.error("mount_ns_pid_file", "needs follow = true and netns: a namespace bound in "
                                     "another process's mount namespace comes and goes with it");
      else if (v->empty() || (*v)[0] != '/')
        l.error("mount_ns_pid_file", "must be an absolute path");
      out.mount_ns_pid_file = *v;
    }
    if (out.redirect && (out.address.host.rfind("127.", 0) == 0 || out.address.host == "::1")) {
      l.error("address", fmt::format("{} is a loopback address, which a bridge's redirect "
                                     "cannot send containers to (the kernel drops them as "
                                     "martians) — listen on the bridge's address, e.g. "
                                     "\"10.89.0.1:5353\", or set redirect = false",
                                     out.address.host));
    }
    l.finish();
    c.listen.push_back(std::move(out));
  }
  root.finish();
  FY_TRY(doc->result());
  return c;
}

namespace {

Result<std::string> slurp(const std::string& path, const char* what) {
  FILE* f = fopen(path.c_str(), "re");
  if (!f) {
    return make_error(Errc::not_found, "cannot read {} {}: {} — {}", what, path, strerror(errno),
                      std::string_view(what) == "the config"
                          ? "write one (docs/fy-dnsfwd.md)"
                          : "render it from the proxy's policy with fy-dnsfwd-allow, or drop "
                            "allow_file");
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1 << 20)) text.append(buf, n);
  fclose(f);
  return text;
}

}  // namespace

Result<std::vector<std::string>> parse_allow_file(std::string_view text, const std::string& path) {
  std::vector<std::string> out;
  std::string errors;
  size_t line = 0;
  while (!text.empty()) {
    ++line;
    size_t nl = text.find('\n');
    std::string_view l = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ' || l.back() == '\t')) l.remove_suffix(1);
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
    if (l.empty() || l[0] == '#') continue;
    auto h = normalize_host(l);
    if (!h || is_ipv4_literal(*h) || is_ipv6_literal(*h)) {
      if (!errors.empty()) errors += "\n";
      errors += fmt::format("{}:{}: '{}' is not a host name suffix — one name a line, e.g. "
                            "github.com (re-render the file with fy-dnsfwd-allow)",
                            path, line, l);
      continue;
    }
    out.push_back(std::move(*h));
  }
  if (!errors.empty()) return make_error(Errc::invalid_argument, "{}", errors);
  return out;
}

Result<std::vector<std::string>> read_allow_file(const std::string& path) {
  auto text = slurp(path, "the allow file");
  if (!text) return std::move(text).take_error();
  if (text->size() >= (1 << 20))
    return make_error(Errc::invalid_argument,
                      "{}: 1 MiB or more — an allow list is one host name a line; re-render it with "
                      "fy-dnsfwd-allow",
                      path);
  return parse_allow_file(*text, path);
}

Result<Config> read_config_file(const std::string& path) {
  auto text = slurp(path, "the config");
  if (!text) return std::move(text).take_error();
  auto c = parse_config(*text, path);
  if (!c || c->allow_file.empty()) return c;
  auto names = read_allow_file(c->allow_file);
  if (!names) return std::move(names).take_error();
  for (std::string& n : *names) c->policy.allow.push_back(std::move(n));
  return c;
}

std::string needs_restart(const Config& running, const Config& next) {
  std::vector<std::string> what;
  auto addrs = [](const std::vector<HostPort>& v) {
    std::vector<std::string> o;
    for (const HostPort& h : v) o.push_back(h.authority());
    return o;
  };
  std::vector<std::string> a, b;
  auto key = [](const Listen& l) {
    return l.address.authority() + "|" + l.netns + "|" + l.mount_ns_pid_file + "|" + l.name +
           (l.follow ? "|follow" : "") +
           (l.redirect ? "|redirect" : "");
  };
  for (const Listen& l : running.listen) a.push_back(key(l));
  for (const Listen& l : next.listen) b.push_back(key(l));
  if (a != b) what.push_back("[[listen]]");
  if (addrs(running.upstream) != addrs(next.upstream)) what.push_back("upstream");
  if (running.log != next.log) what.push_back("log");
  return fmt::format("{}", fmt::join(what, ", "));
}

}  // namespace fy::dnsfwd

#include "forwarder/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "core/config.h"
#include "core/net.h"
#include "core/netns_path.h"
#include "core/text.h"
#include "forwarder/head.h"

namespace fy::fwd {

Result<UidRange> parse_uid_range(std::string_view s) {
  size_t dash = s.find('-');
  auto lo = parse_u64(s.substr(0, dash));
  auto hi = dash == std::string_view::npos ? lo : parse_u64(s.substr(dash + 1));
  if (!lo || !hi || *lo > *hi || *hi > UINT32_MAX - 1)
    return make_error(Errc::invalid_argument,
                      "'{}' is not a uid or an inclusive uid range like \"100000-165535\"", s);
  return UidRange{static_cast<uint32_t>(*lo), static_cast<uint32_t>(*hi)};
}

Result<std::pair<uint16_t, uint16_t>> parse_port_range(std::string_view s) {
  size_t dash = s.find('-');
  auto lo = parse_u64(s.substr(0, dash));
  auto hi = dash == std::string_view::npos ? lo : parse_u64(s.substr(dash + 1));
  if (!lo || !hi || *lo < 1 || *hi > 65535 || *lo > *hi)
    return make_error(Errc::invalid_argument,
                      "'{}' is not a port or an inclusive port range like \"41000-41089\" "
                      "(1-65535, low end first)",
                      s);
  return std::pair<uint16_t, uint16_t>{static_cast<uint16_t>(*lo), static_cast<uint16_t>(*hi)};
}

std::string format_ports(const std::vector<PortRule>& rules, std::string_view sep) {
  std::vector<uint16_t> ps;
  ps.reserve(rules.size());
  for (const PortRule& r : rules) ps.push_back(r.port);
  std::sort(ps.begin(), ps.end());
  std::string out;
  for (size_t i = 0; i < ps.size();) {
    size_t j = i;
    while (j + 1 < ps.size() && ps[j + 1] == ps[j] + 1) ++j;
    if (!out.empty()) out += sep;
    out += std::to_string(ps[i]);
    if (j > i) out += "-" + std::to_string(ps[j]);
    i = j + 1;
  }
  return out;
}

Result<Config> parse_config(std::string_view text, const std::string& path) {
  auto doc = cfg::Doc::parse(text, path);
  if (!doc) return std::move(doc).take_error();
  Config c;
  c.path = path;
  cfg::Table root = doc->root();

  if (auto v = root.string("key_file"))
    c.key_file = *v;
  else
    root.error("", "key_file is required: the 64-hex-character stamp key, mode 0600");
  if (auto v = root.string("state_dir")) c.state_dir = *v;
  if (auto v = root.string("control_socket")) c.control_socket = *v;
  if (auto v = root.string("boot_id_file")) c.boot_id_file = *v;
  if (auto v = root.string("log_level")) {
    auto l = log::parse_level(*v);
    if (!l)
      root.error("log_level", "is not one of debug, info, warn, error, off");
    else
      c.log_level = *l;
  }
  if (c.control_socket.empty()) c.control_socket = c.state_dir + "/control.sock";

  if (auto up = root.table("upstream")) {
    if (auto v = up->string("host")) {
      if (!is_ipv4_literal(*v) && !is_ipv6_literal(*v))
        up->error("host",
                  "is not an IP address: give the host gateway's address as the VM "
                  "sees it, e.g. \"192.168.5.2\"");
      else
        c.upstream_host = *v;
    } else {
      up->error("", "[upstream] needs host: the host gateway's IP address");
    }
    if (auto v = up->integer("connect_timeout_ms", 50, 60000)) c.connect_timeout_ms = *v;
    if (auto v = up->integer("redials", 0, 64)) c.redials = *v;
    if (auto v = up->integer("rst_wait_ms", 0, 600000)) c.rst_wait_ms = *v;
    up->finish();
  } else {
    root.error("", "the [upstream] table is required (host = the host gateway's address)");
  }

  // Each [[port]] is one port (port = N) or an inclusive range of them
  // (ports = "LO-HI", fy-wall's spelling of a band), expanded to one PortRule
  // per port. A port given twice, alone or in a range, is refused where it
  // is given again, naming the table that gave it first.
  auto ports = root.tables("port");
  std::vector<std::string> first_at;  // per c.ports entry: where its [[port]] is
  for (auto& t : ports) {
    bool stamp = true;
    if (auto v = t.boolean("stamp")) stamp = *v;
    const bool has_port = t.has("port"), has_range = t.has("ports");
    uint32_t lo = 0, hi = 0;
    std::string key = has_range ? "ports" : "port";
    if (has_port && has_range) {
      t.error("",
              "has both port and ports: give one port (port = 41000) or one range "
              "(ports = \"41000-41089\")");
      t.type_of("port");
      t.type_of("ports");
    } else if (has_range) {
      if (auto v = t.string("ports")) {
        auto r = parse_port_range(*v);
        if (!r)
          t.error("ports", r.error().message);
        else
          lo = r->first, hi = r->second;
      }
    } else if (auto v = t.integer("port", 1, 65535)) {
      lo = hi = static_cast<uint32_t>(*v);
    } else if (!has_port) {
      t.error("", "needs port = 1..65535 (one port) or ports = \"LO-HI\" (a range)");
    }
    t.finish();
    if (!lo) continue;
    if (c.ports.size() + (hi - lo + 1) > kMaxPorts) {
      t.error(key, fmt::format("would make {} ports in all; at most {} can be served (each is a "
                               "listening socket per worker in each namespace followed)",
                               c.ports.size() + (hi - lo + 1), kMaxPorts));
      continue;
    }
    const std::string here = t.where(key);
    bool clash = false;
    for (size_t i = 0; i < c.ports.size() && !clash; ++i) {
      if (c.ports[i].port < lo || c.ports[i].port > hi) continue;
      clash = true;
      if (lo == hi)
        t.error(key, fmt::format("is listed twice: {} is already given at {}", lo, first_at[i]));
      else
        t.error(key, fmt::format("{}-{} overlaps port {}, already given at {}: list each port "
                                 "once (the bands must not overlap)",
                                 lo, hi, c.ports[i].port, first_at[i]));
    }
    if (clash) continue;
    for (uint32_t p = lo; p <= hi; ++p) {
      c.ports.push_back(PortRule{static_cast<uint16_t>(p), stamp});
      first_at.push_back(here);
    }
  }
  if (ports.empty())
    root.error("", "at least one [[port]] is required: the daemon ports the forwarder serves");

  if (auto lim = root.table("limits")) {
    if (auto v = lim->integer("head_bytes", 1024, 65536)) c.max_head_bytes = *v;
    if (auto v = lim->integer("headers", 1, Head::kMaxHeaders)) c.max_headers = *v;
    if (auto v = lim->integer("head_timeout_ms", 100, 600000)) c.head_timeout_ms = *v;
    if (auto v = lim->integer("half_closed_timeout_ms", 100, 3600000))
      c.half_closed_timeout_ms = *v;
    if (auto v = lim->integer("connections", 1, 1000000)) c.max_connections = *v;
    if (auto v = lim->integer("pipe_size", 0, 16 * 1024 * 1024)) c.pipe_size = *v;
    if (auto v = lim->integer("bulk_pipes", 0, 100000)) c.bulk_pipes = *v;
    if (auto v = lim->integer("workers", 0, 64)) c.workers = *v;
    if (auto v = lim->integer("pump_budget_kib", 0, 1024 * 1024)) c.pump_budget = *v * 1024;
    lim->finish();
  }

  if (auto b = root.table("bridge")) {
    c.bridge.enabled = true;
    if (auto v = b->string("netns")) c.bridge.netns = *v;
    if (auto v = b->string("netns_pid_file")) c.bridge.netns_pid_file = *v;
    if (c.bridge.netns.empty() == c.bridge.netns_pid_file.empty())
      b->error("",
               "[bridge] needs exactly one of netns (a namespace path to follow) or "
               "netns_pid_file (a file naming a process in the namespace)");
    if (!c.bridge.netns.empty()) {
      std::string why = netns_path_problem(c.bridge.netns);
      if (!why.empty()) b->error("netns", why);
    }
    if (auto v = b->string("mount_ns_pid_file")) {
      c.bridge.mount_ns_pid_file = *v;
      if (c.bridge.netns.empty())
        b->error("mount_ns_pid_file",
                 "needs netns: the path of the namespace in that process's mount namespace");
      else if (v->empty() || (*v)[0] != '/')
        b->error("mount_ns_pid_file", "must be an absolute path");
    }
    if (auto v = b->string("listen")) c.bridge.listen = *v;
    if (!is_ipv4_literal(c.bridge.listen) && !is_ipv6_literal(c.bridge.listen))
      b->error("listen", "is not an IP address (use \"0.0.0.0\" for every bridge)");
    if (auto v = b->string("net")) c.bridge.net = *v;
    if (auto v = b->integer("poll_ms", 10, 60000)) c.bridge.poll_ms = *v;
    if (auto v = b->string("watch")) {
      if (*v == "events")
        c.bridge.watch_events = true;
      else if (*v == "poll")
        c.bridge.watch_events = false;
      else
        b->error("watch", "is not \"events\" (inotify + mount events + poll) or \"poll\"");
    }
    if (auto v = b->boolean("redirect")) c.bridge.redirect = *v;
    if (c.bridge.redirect && !c.upstream_host.empty()) {
      // The redirect rewrites the destination within the upstream's family;
      // the listener must be reachable in it ("::" also takes IPv4).
      bool up6 = is_ipv6_literal(c.upstream_host);
      bool l6 = is_ipv6_literal(c.bridge.listen);
      if (up6 != l6 && !(l6 && c.bridge.listen == "::"))
        b->error("listen", fmt::format("is an IPv{} address but [upstream] host is IPv{}: the "
                                       "redirect cannot send connections to it. Listen on an "
                                       "IPv{} address (or \"::\"), or set redirect = false and "
                                       "redirect some other way",
                                       l6 ? 6 : 4, up6 ? 6 : 4, up6 ? 6 : 4));
      // A DNAT to loopback in prerouting is dropped as a martian: containers
      // would hang on SYN retries instead of reaching the listener.
      const std::string& l = c.bridge.listen;
      if (l.rfind("127.", 0) == 0 || l == "::1")
        b->error("listen", "is a loopback address, which the redirect cannot send a bridge's "
                           "connections to (the kernel drops them as martians). Listen on \"" +
                               std::string(l6 ? "::" : "0.0.0.0") +
                               "\" or a bridge's address");
    }
    if (c.bridge.net != "auto") {
      bool ok = !c.bridge.net.empty() && c.bridge.net.size() <= 64;
      for (char ch : c.bridge.net)
        ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-');
      if (!ok) b->error("net", "must be \"auto\" or 1-64 of [A-Za-z0-9_.-] (the stamp's net)");
    }
    b->finish();
  }

  if (auto vm = root.table("vm")) {
    c.vm.enabled = true;
    if (auto v = vm->string("listen")) c.vm.listen = *v;
    if (!is_ipv4_literal(c.vm.listen) && !is_ipv6_literal(c.vm.listen))
      vm->error("listen", "is not an IP address");
    if (auto v = vm->strings("walled_uids")) {
      for (const auto& s : *v) {
        auto r = parse_uid_range(s);
        if (!r)
          vm->error("walled_uids", r.error().message);
        else
          c.vm.walled_uids.push_back(*r);
      }
    }
    if (c.vm.walled_uids.empty())
      vm->error("",
                "[vm] needs walled_uids: the VM user and its container subuid range, "
                "e.g. [\"1000\", \"100000-165535\"]");
    if (auto v = vm->string("attribution")) {
      if (*v == "bpf")
        c.vm.attribution = AttributionMode::bpf;
      else if (*v == "proc")
        c.vm.attribution = AttributionMode::proc;
      else
        vm->error("attribution", "is not \"bpf\" or \"proc\"");
    }
    if (auto v = vm->integer("attribution_timeout_ms", 10, 60000)) c.vm.attribution_timeout_ms = *v;
    if (auto v = vm->string("cgroup_root")) c.vm.cgroup_root = *v;
    vm->finish();
  }
  if (!c.bridge.enabled && !c.vm.enabled)
    root.error("", "neither [bridge] nor [vm] is configured: nothing would listen");
  if (c.bridge.enabled && c.vm.enabled && c.bridge.listen == c.vm.listen &&
      c.bridge.netns.empty() && c.bridge.netns_pid_file.empty())
    root.error("", "[bridge] and [vm] listen on the same address");

  root.finish();
  FY_TRY(doc->result());
  return c;
}

Result<Config> load_config(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f)
    return make_error(errno == ENOENT ? Errc::not_found : Errc::io, "{}: cannot be read: {}", path,
                      strerror(errno));
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  fclose(f);
  return parse_config(text, path);
}

}  // namespace fy::fwd

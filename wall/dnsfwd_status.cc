#include "wall/dnsfwd_status.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdio>

namespace fy::wall {
namespace {

std::string slurp(const char* path) {
  std::string text;
  FILE* f = fopen(path, "re");
  if (!f) return text;
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (16 << 20)) text.append(buf, n);
  fclose(f);
  return text;
}

}  // namespace

std::optional<DnsfwdTarget> dnsfwd_target(std::string_view listing) {
  size_t chain = listing.find("chain dns_redirect {");
  if (chain == std::string_view::npos) return std::nullopt;
  std::string_view rest = listing.substr(chain);
  rest = rest.substr(0, rest.find('}'));
  constexpr std::string_view kTo = "dnat ip to ";
  size_t at = rest.find(kTo);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view a = rest.substr(at + kTo.size());
  a = a.substr(0, a.find_first_of(" \t\n"));
  DnsfwdTarget t;
  size_t colon = a.find(':');
  t.addr = std::string(a.substr(0, colon));
  if (colon != std::string_view::npos) {
    std::string_view p = a.substr(colon + 1);
    uint16_t port = 0;
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec == std::errc() && ptr == p.data() + p.size() && port) t.port = port;
  }
  if (t.addr.empty()) return std::nullopt;
  return t;
}

DnsfwdStatus dnsfwd_status(const DnsfwdTarget& t, const std::vector<Listener>& listeners) {
  DnsfwdStatus s;
  std::vector<std::string> who;
  for (const Listener& l : listeners) {
    if (l.port != t.port || (l.addr != t.addr && l.addr != "0.0.0.0")) continue;
    bool& seen = l.proto == "udp" ? s.udp : s.tcp;
    if (l.proto != "udp" && l.proto != "tcp") continue;
    seen = true;
    who.push_back(fmt::format("{} {}:{} uid {}", l.proto, l.addr, l.port, l.uid));
  }
  const std::string where = fmt::format("{}:{}", t.addr, t.port);
  if (s.ok()) {
    s.line = fmt::format("fy-dnsfwd: listening on {} ({})", where, fmt::join(who, ", "));
  } else {
    s.line = fmt::format(
        "fy-dnsfwd: NOT LISTENING on {} ({}) — the walled principals' port 53 is redirected "
        "there and fails (closed); start fy-dnsfwd (`systemctl start fy-dnsfwd`) or check its "
        "[[listen]] address",
        where,
        !s.udp && !s.tcp ? std::string("neither udp nor tcp") : s.udp ? "no tcp" : "no udp");
  }
  return s;
}

bool print_dnsfwd_status(FILE* out, Nft& nft) {
  auto live = nft.list({"inet", kMachineTable}, true);
  if (!live || !*live) return true;  // the table's own line says it is absent
  auto t = dnsfwd_target(**live);
  if (!t) return true;
  std::vector<Listener> all;
  for (auto [file, proto] : {std::pair{"/proc/net/udp", "udp"}, std::pair{"/proc/net/tcp", "tcp"}}) {
    for (Listener& l : parse_proc_net_listeners(slurp(file), proto, false)) all.push_back(std::move(l));
  }
  DnsfwdStatus s = dnsfwd_status(*t, all);
  fmt::print(out, "{}\n", s.line);
  return s.ok();
}

}  // namespace fy::wall

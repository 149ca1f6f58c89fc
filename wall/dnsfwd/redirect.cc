#include "wall/dnsfwd/redirect.h"

#include "core/nft.h"

#include <fmt/format.h>

namespace fy::dnsfwd {
std::string bridge_redirect_ruleset(const Listen& l) {
  const bool v6 = l.address.is_ipv6();
  const char* fam = v6 ? "ip6" : "ip";
  std::string to = v6 ? fmt::format("[{}]:{}", l.address.host, l.address.port)
                      : fmt::format("{}:{}", l.address.host, l.address.port);
  return fmt::format(
      "table {0} {1} {{}}\n"
      "delete table {0} {1}\n"
      "table {0} {1} {{\n"
      "  chain prerouting {{\n"
      "    type nat hook prerouting priority dstnat; policy accept;\n"
      "    udp dport 53 dnat to {2}\n"
      "    tcp dport 53 dnat to {2}\n"
      "  }}\n"
      "}}\n",
      fam, kRedirectTable, to);
}

Result<void> install_bridge_redirect(const Listen& l) {
  // core's wrapper probes the netlink socket first: libnftables exit()s when
  // it cannot open one.
  auto ctx = nft::Ctx::open();
  if (!ctx) {
    return make_error(Errc::io, "cannot talk to nf_tables in {} ({}): is nf_tables in this "
                      "kernel?", l.netns, ctx.error().message);
  }
  nft::Reply r = ctx->run(bridge_redirect_ruleset(l));
  if (r.ok) return {};
  return make_error(Errc::refused,
                    "the kernel refused table {} {} in {} (nothing was changed): {} — or set "
                    "redirect = false on this [[listen]] and redirect port 53 some other way",
                    l.address.is_ipv6() ? "ip6" : "ip", kRedirectTable, l.netns,
                    r.err.empty() ? "libnftables gave no message" : r.err);
}

}  // namespace fy::dnsfwd

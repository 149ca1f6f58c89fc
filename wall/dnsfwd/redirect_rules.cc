// bridge_redirect_ruleset (redirect.h): the pure half of the bridge
// redirect, in the pure library so its doctest links without libnftables.
#include <fmt/format.h>

#include "wall/dnsfwd/redirect.h"

namespace fy::dnsfwd {

std::string bridge_redirect_ruleset(const Listen& l) {
  const bool v6 = l.address.is_ipv6();
  const char* fam = v6 ? "ip6" : "ip";
  // A wildcard listener (0.0.0.0, ::) is reached by `redirect to :port`: the
  // address of the interface the query came in on (each bridge's gateway,
  // whatever podman numbered it), which the wildcard socket holds.
  const bool any = l.address.host == "0.0.0.0" || l.address.host == "::";
  std::string to = any  ? fmt::format("redirect to :{}", l.address.port)
                   : v6 ? fmt::format("dnat to [{}]:{}", l.address.host, l.address.port)
                        : fmt::format("dnat to {}:{}", l.address.host, l.address.port);
  return fmt::format(
      "table {0} {1} {{}}\n"
      "delete table {0} {1}\n"
      "table {0} {1} {{\n"
      "  chain prerouting {{\n"
      "    type nat hook prerouting priority dstnat; policy accept;\n"
      "    udp dport 53 {2}\n"
      "    tcp dport 53 {2}\n"
      "  }}\n"
      "}}\n",
      fam, kRedirectTable, to);
}

}  // namespace fy::dnsfwd

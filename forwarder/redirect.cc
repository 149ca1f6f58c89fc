#include "forwarder/redirect.h"

#include <fmt/format.h>
#include "core/net.h"
#include "core/nft.h"

namespace fy::fwd {
namespace {

bool wildcard(const std::string& ip) {
  return ip == "0.0.0.0" || ip == "::";
}

}  // namespace

const char* redirect_family(const Config& cfg) {
  return is_ipv6_literal(cfg.upstream_host) ? "ip6" : "ip";
}

std::string redirect_ruleset(const Config& cfg) {
  const char* fam = redirect_family(cfg);
  // One set for every port, a band as an interval ("41000-41089"): one rule
  // whatever the number of ports.
  const std::string ports = format_ports(cfg.ports, ", ");
  std::string to =
      wildcard(cfg.bridge.listen) ? std::string("redirect") : "dnat to " + cfg.bridge.listen;
  return fmt::format(
      "table {0} {1} {{}}\n"
      "delete table {0} {1}\n"
      "table {0} {1} {{\n"
      "  chain prerouting {{\n"
      "    type nat hook prerouting priority dstnat; policy accept;\n"
      "    {0} daddr {2} tcp dport {{ {3} }} {4}\n"
      "  }}\n"
      "}}\n",
      fam, kRedirectTable, cfg.upstream_host, ports, to);
}

Result<void> install_redirect(const Config& cfg) {
  // A context's netlink socket belongs to the namespace it was made in: make
  // it here, on the namespace's thread, and free it before leaving. open()
  // probes first, so a want of descriptors leaves this namespace unserved
  // (and retried) instead of libnftables exit()ing the forwarder; and it keeps
  // the socket below FD_SETSIZE however many the forwarder holds (core/nft.h).
  auto ctx = nft::Ctx::open();
  if (!ctx) return std::move(ctx).take_error();
  nft::Reply r = ctx->run(redirect_ruleset(cfg));
  if (r.ok) return {};
  std::string err = nft::condense(r.err);
  if (err.empty()) err = "libnftables gave no message";
  return make_error(Errc::refused, "the kernel refused table {} {} (nothing was changed): {}",
                    redirect_family(cfg), kRedirectTable, err);
}

}  // namespace fy::fwd

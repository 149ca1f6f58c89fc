#include "wall/dnsfwd/redirect.h"

#include "core/nft.h"

#include <fmt/format.h>

namespace fy::dnsfwd {
Result<void> install_bridge_redirect(const Listen& l) {
  // core's wrapper probes the netlink socket first (libnftables exit()s when
  // it cannot open one), and runs libnftables where its socket is numbered
  // below FD_SETSIZE however many clients fy-dnsfwd holds (core/nft.h).
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

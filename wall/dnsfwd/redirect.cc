// libnftables.h defines _GNU_SOURCE itself; g++ already has.
#undef _GNU_SOURCE
#include <nftables/libnftables.h>

#include "wall/dnsfwd/redirect.h"

#include <fmt/format.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace fy::dnsfwd {
namespace {

struct CtxFree {
  void operator()(nft_ctx* c) const noexcept { nft_ctx_free(c); }
};

}  // namespace

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
  // libnftables exit()s when it cannot open its netlink socket: try one first.
  int probe = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (probe < 0) {
    return make_error(Errc::io, "cannot open a netfilter netlink socket in {} ({}): is nf_tables "
                      "in this kernel?", l.netns, strerror(errno));
  }
  ::close(probe);
  std::unique_ptr<nft_ctx, CtxFree> ctx(nft_ctx_new(NFT_CTX_DEFAULT));
  if (!ctx) return make_error(Errc::io, "libnftables could not open a netlink socket");
  if (nft_ctx_buffer_output(ctx.get()) != 0 || nft_ctx_buffer_error(ctx.get()) != 0)
    return make_error(Errc::internal, "libnftables could not buffer its output");
  std::string text = bridge_redirect_ruleset(l);
  int rc = nft_run_cmd_from_buffer(ctx.get(), text.c_str());
  std::string err = nft_ctx_get_error_buffer(ctx.get());
  (void)nft_ctx_get_output_buffer(ctx.get());
  if (rc == 0) return {};
  while (!err.empty() && err.back() == '\n') err.pop_back();
  return make_error(Errc::refused,
                    "the kernel refused table {} {} in {} (nothing was changed): {} — or set "
                    "redirect = false on this [[listen]] and redirect port 53 some other way",
                    l.address.is_ipv6() ? "ip6" : "ip", kRedirectTable, l.netns,
                    err.empty() ? "libnftables gave no message" : err);
}

}  // namespace fy::dnsfwd

// libnftables.h defines _GNU_SOURCE itself; g++ already has.
#undef _GNU_SOURCE
#include <nftables/libnftables.h>

#include "forwarder/redirect.h"

#include <fmt/format.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <memory>
#include <string_view>
#include <vector>

#include "core/net.h"

namespace fy::fwd {
namespace {

struct CtxFree {
  void operator()(nft_ctx* c) const noexcept { nft_ctx_free(c); }
};

bool wildcard(const std::string& ip) {
  return ip == "0.0.0.0" || ip == "::";
}

// nft's error buffer, one "file:line:col: Error: what" line per problem, each
// followed by the offending input and a caret line: keep the distinct "what"s.
std::string condense(std::string_view err) {
  std::vector<std::string> out;
  while (!err.empty()) {
    size_t nl = err.find('\n');
    std::string_view line = err.substr(0, nl);
    err.remove_prefix(nl == std::string_view::npos ? err.size() : nl + 1);
    size_t at = line.find("Error: ");
    if (at == std::string_view::npos) continue;
    std::string what(line.substr(at + 7));
    bool seen = false;
    for (const auto& o : out) seen = seen || o == what;
    if (!seen) out.push_back(std::move(what));
  }
  std::string s;
  for (const auto& o : out) s += (s.empty() ? "" : "; ") + o;
  return s;
}

}  // namespace

const char* redirect_family(const Config& cfg) {
  return is_ipv6_literal(cfg.upstream_host) ? "ip6" : "ip";
}

std::string redirect_ruleset(const Config& cfg) {
  const char* fam = redirect_family(cfg);
  std::string ports;
  for (const PortRule& p : cfg.ports) ports += (ports.empty() ? "" : ", ") + std::to_string(p.port);
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
  // it here, on the namespace's thread, and free it before leaving.
  //
  // libnftables exit()s the process when it cannot open its netlink socket
  // (EMFILE, ENOMEM, no nfnetlink): try one first, so that such a failure
  // leaves this namespace unserved (and retried) instead of ending every
  // connection the forwarder holds.
  int probe = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (probe < 0)
    return make_error(Errc::io,
                      "cannot open a netfilter netlink socket ({}); is nf_tables in this kernel, "
                      "and has the forwarder descriptors to spare?",
                      strerror(errno));
  ::close(probe);
  std::unique_ptr<nft_ctx, CtxFree> ctx(nft_ctx_new(NFT_CTX_DEFAULT));
  if (!ctx)
    return make_error(Errc::io,
                      "libnftables could not open a netlink socket (is nf_tables in this kernel?)");
  if (nft_ctx_buffer_output(ctx.get()) != 0 || nft_ctx_buffer_error(ctx.get()) != 0)
    return make_error(Errc::internal, "libnftables could not buffer its output");
  std::string text = redirect_ruleset(cfg);
  int rc = nft_run_cmd_from_buffer(ctx.get(), text.c_str());
  std::string err = condense(nft_ctx_get_error_buffer(ctx.get()));
  (void)nft_ctx_get_output_buffer(ctx.get());
  if (rc == 0) return {};
  if (err.empty()) err = "libnftables gave no message";
  return make_error(Errc::refused, "the kernel refused table {} {} (nothing was changed): {}",
                    redirect_family(cfg), kRedirectTable, err);
}

}  // namespace fy::fwd

// libnftables.h defines _GNU_SOURCE itself; g++ already has.
#undef _GNU_SOURCE
#include <nftables/libnftables.h>

#include "core/nft.h"

#include <linux/netlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/fd.h"

namespace fy::nft {
namespace {

std::string trim_trailing(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

void CtxFree::operator()(nft_ctx* c) const noexcept {
  nft_ctx_free(c);
}

Result<Ctx> Ctx::open() {
  {
    Fd probe(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER));
    if (!probe)
      return make_error(Errc::io,
                        "cannot open a netfilter netlink socket ({}) — is nf_tables in this "
                        "kernel, and has the process descriptors to spare?",
                        std::strerror(errno));
  }
  std::unique_ptr<nft_ctx, CtxFree> ctx(nft_ctx_new(NFT_CTX_DEFAULT));
  if (!ctx)
    return make_error(Errc::io,
                      "libnftables could not open a netlink socket — is the nf_tables module "
                      "available in this kernel?");
  if (nft_ctx_buffer_output(ctx.get()) != 0 || nft_ctx_buffer_error(ctx.get()) != 0)
    return make_error(Errc::internal, "libnftables could not buffer its output");
  return Ctx(std::move(ctx));
}

Reply Ctx::run(const std::string& text, bool dry_run, bool stateless) {
  nft_ctx_set_dry_run(ctx_.get(), dry_run);
  nft_ctx_output_set_flags(ctx_.get(), stateless ? NFT_CTX_OUTPUT_STATELESS : 0);
  int rc = nft_run_cmd_from_buffer(ctx_.get(), text.c_str());
  nft_ctx_set_dry_run(ctx_.get(), false);
  Reply r;
  r.ok = rc == 0;
  r.out = nft_ctx_get_output_buffer(ctx_.get());  // also drains it for the next command
  r.err = trim_trailing(nft_ctx_get_error_buffer(ctx_.get()));
  return r;
}

bool not_permitted(std::string_view err) {
  return err.find("Operation not permitted") != std::string_view::npos;
}

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

}  // namespace fy::nft

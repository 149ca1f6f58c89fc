// libnftables, owned: the one wrapper fy-wall and fy-forwarder share.
//
// It is a library of its own (fycore_nft, core/meson.build), not part of
// core's base, so that only the two binaries that change rulesets link
// libnftables; fy-proxy, fy-netlog and the lifecycle subprojects do not.
//
// The probe: libnftables exit()s the process when nft_ctx_new cannot open its
// netlink socket (EMFILE, ENOMEM, no nfnetlink in the kernel). open() tries
// such a socket first and answers Errc::io when it cannot be had, so a daemon
// that asks for a context leaves one namespace unserved (and retries) instead
// of ending every connection it holds. A socket that opens in the probe and
// fails a moment later in libnftables is a race left open: nothing outside
// libnftables can close it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"

struct nft_ctx;

namespace fy::nft {

struct CtxFree {
  void operator()(nft_ctx* c) const noexcept;
};

// What one command did: `ok` is libnftables' verdict; `out` what it listed;
// `err` its error buffer with trailing blank lines and spaces trimmed.
struct Reply {
  bool ok = false;
  std::string out;
  std::string err;
};

class Ctx {
 public:
  // A context whose netlink socket talks to the calling thread's network
  // namespace (make it on the thread that entered the namespace). Output and
  // errors are buffered, never printed. Errc::io when no netfilter netlink
  // socket can be opened (see the probe above).
  static Result<Ctx> open();

  // Runs `text` as one batch: the kernel commits all of it or none of it.
  // With dry_run the kernel validates the batch and nothing is committed;
  // stateless omits counter values from listings.
  Reply run(const std::string& text, bool dry_run = false, bool stateless = false);

 private:
  explicit Ctx(std::unique_ptr<nft_ctx, CtxFree> ctx) : ctx_(std::move(ctx)) {}
  std::unique_ptr<nft_ctx, CtxFree> ctx_;
};

// True when nft's error text says the kernel refused for want of
// CAP_NET_ADMIN.
bool not_permitted(std::string_view err);

// nft's error buffer, one "file:line:col: Error: what" line per problem, each
// followed by the offending input and a caret line: the distinct "what"s,
// joined with "; " (for a one-line log message).
std::string condense(std::string_view err);

}  // namespace fy::nft

// The bridge namespace's redirect (ADR-0034: "the forwarder's table redirects
// gateway-port traffic to it"). Containers keep dialling the proxy URL they
// are given, the host gateway's daemon ports; this table, in the followed
// namespace, sends those connections to the bridge listener there, keeping
// the port:
//
//   table ip fy_forwarder_redirect {
//     chain prerouting {
//       type nat hook prerouting priority dstnat; policy accept;
//       ip daddr 192.168.5.2 tcp dport { 42600, 42700 } redirect
//     }
//   }
//
// (A port band is one interval of the set: `{ 41000-41089, 41100-41189 }`.)
//
// `redirect` sends a connection to the address of the interface it came in on
// (the bridge's), which a wildcard listener holds; a listener bound to one
// address gets `dnat to <that address>` instead. The family (ip, ip6) is the
// upstream host's.
//
// Podman re-creates the namespace after every teardown, so nothing installed
// once can last: the forwarder installs the table into every namespace it
// follows, before that namespace counts as served. The table is replaced whole
// in one transaction (add, delete, define), so installing it again — a
// restarted forwarder following the same namespace — never duplicates a rule,
// and a table of that name edited by hand is made exactly this again. It is
// left in place when the forwarder stops: a stopped forwarder then means an
// immediate reset for the containers (nothing listens where they are sent),
// not a connection that goes elsewhere.
#pragma once

#include <string>

#include "core/result.h"
#include "forwarder/config.h"

namespace fy::fwd {

inline constexpr const char* kRedirectTable = "fy_forwarder_redirect";

// "ip" or "ip6": the upstream host's family.
const char* redirect_family(const Config& cfg);
// The whole transaction for `cfg`.
std::string redirect_ruleset(const Config& cfg);
// Commits redirect_ruleset(cfg) in the calling thread's network namespace
// (call it inside run_in_netns). All of it or none of it is applied; the error
// carries nft's own messages. Safe at any descriptor count: core's nft::Ctx
// keeps libnftables' socket below FD_SETSIZE (core/nft.h).
Result<void> install_redirect(const Config& cfg);

}  // namespace fy::fwd

// The bridge namespace's :53 redirect (docs/fy-dnsfwd.md, "The bridge
// namespace"). The machine wall's dns_redirect sends the VM namespace's
// walled port 53 to fy-dnsfwd; containers on the rootless bridge send theirs
// from another namespace, where that rule never runs. So fy-dnsfwd, when it
// opens a [[listen]] with a netns and `redirect` (the default there),
// installs in that namespace, as fy-forwarder installs its daemon-port
// redirect (forwarder/redirect.h):
//
//   table ip fy_dnsfwd_redirect {
//     chain prerouting {
//       type nat hook prerouting priority dstnat; policy accept;
//       udp dport 53 dnat to 10.89.0.1:5353
//       tcp dport 53 dnat to 10.89.0.1:5353
//     }
//   }
//
// Every container's port 53, to aardvark on the gateway, a LAN host or a
// public resolver, meets fy-dnsfwd's bridge listener; conntrack un-NATs the
// answer, so the container sees the address it asked answer. fy-dnsfwd's own
// packets never pass prerouting there (its upstream sockets are in the VM's
// namespace), nor do aardvark's (output). The table is replaced whole in one
// transaction, so a restart never duplicates a rule, and is left in place
// when fy-dnsfwd stops: DNS then meets a closed port (fails closed), not the
// destination asked.
#pragma once

#include <string>

#include "core/result.h"
#include "wall/dnsfwd/config.h"

namespace fy::dnsfwd {

inline constexpr const char* kRedirectTable = "fy_dnsfwd_redirect";

// The whole transaction for the listener `l` (pure).
std::string bridge_redirect_ruleset(const Listen& l);
// Commits it in the calling thread's network namespace: all or nothing; the
// error carries nft's own message. Safe at any descriptor count (core/nft.h).
Result<void> install_bridge_redirect(const Listen& l);

}  // namespace fy::dnsfwd

// The bridge listener's judgement of where a connection came from (issue 19).
//
// The stamp's `net` is the interface the connection arrived on, as the kernel
// recorded it in the accepted socket (read_ingress_ifindex, forwarder/netns.h),
// never the interface holding the address the client dialled: with a wildcard
// listener a client on one bridge can dial another bridge's address, and that
// address named the other bridge. And a connection is stamped only when its
// source address lies in a prefix of that interface: a source the interface
// does not route (an address of another bridge's subnet, or one the namespace
// itself holds) would otherwise be stamped as `src` on `net` where nothing of
// that address lives.
//
// Pure: the caller looks the interface up (IfaceMap, under its lock) and
// passes what it found.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace fy::fwd {

// One address of a link as an rtnetlink address message gives it: `local` is
// the link's own address (IFA_LOCAL), `net`/`len` the prefix it routes on the
// link (IFA_ADDRESS / ifa_prefixlen: the same address except on a
// point-to-point link, where it is the peer's).
struct IfPrefix {
  int family = 0;  // AF_INET or AF_INET6
  std::array<uint8_t, 16> local{};
  std::array<uint8_t, 16> net{};
  uint8_t len = 0;
  bool operator==(const IfPrefix&) const = default;
};

// A link of the bridge namespace as the interface map holds it.
struct IfLink {
  std::string name;
  std::vector<IfPrefix> prefixes;
};

enum class IngressVerdict : uint8_t {
  ok,
  no_ifindex,      // the kernel gave no ingress interface for the socket
  unknown_link,    // no link with that ifindex (gone, or never seen after a re-read)
  outside_prefix,  // the source is in none of the link's prefixes
  own_address,     // the source is one of the namespace's own addresses on the link
};

// `link` is the ingress link (nullptr when none has `ifindex`), `peer` the
// accepted socket's peer (IPv4-mapped IPv6 is taken as IPv4).
IngressVerdict judge_ingress(int ifindex, const IfLink* link, const sockaddr* peer);

// "10.89.0.1/24, fd00::1/64": a link's prefixes for a message.
std::string describe_prefixes(const IfLink& link);

// The sentence a refused client and the log get (after "refused: "), for a
// verdict other than ok.
std::string ingress_refusal(IngressVerdict v, int ifindex, const IfLink* link,
                            const std::string& src);

}  // namespace fy::fwd

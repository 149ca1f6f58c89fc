// Network namespaces: identity, sockets made inside another namespace, the
// ingress interface of an accepted socket, and the map of links a bridge
// listener stamps as `net`.
//
// A namespace is identified by its nsfs inode (dev, ino). While the forwarder
// holds a socket in a namespace, that namespace stays alive, so its inode
// cannot be reused: a different inode at the watched path is always a new
// namespace, and the same inode is always the one already served.
#pragma once

#include <linux/netlink.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "core/fd.h"
#include "core/netns_path.h"
#include "forwarder/ingress.h"

namespace fy::fwd {

// NsId, NsHandle and open_netns() are core's (core/netns_path.h), shared with
// fy-dnsfwd.
using fy::NsHandle;
using fy::NsId;
using fy::open_netns;

// The namespace the calling thread is in.
Result<NsId> own_netns();

// Runs `fn` on a short-lived thread that has joined the namespace `ns_fd`,
// and waits for it. The calling thread's namespace never changes, so the
// forwarder's upstream connections always leave from its own namespace.
Result<void> run_in_netns(int ns_fd, const std::function<Result<void>()>& fn);

// A non-blocking listening TCP socket on ip:port in the calling thread's
// namespace, with SO_REUSEADDR, IP_FREEBIND (the bridge address may not exist
// yet when a new namespace appears) and TCP_NODELAY (which accepted sockets
// inherit). `group`: SO_REUSEPORT, one of a group of sockets on the same
// address (one per worker), among which the kernel spreads connections. The
// error for a port in use is Errc::refused.
Result<Fd> listen_tcp(const std::string& ip, uint16_t port, int backlog,
                            bool group = false);
// Fails (Errc::refused) when something listens on ip:port already: a bind
// without SO_REUSEPORT, which no listener on the port lets through. A group
// would otherwise join another process's group of the same uid silently.
Result<void> check_port_free(const std::string& ip, uint16_t port);

// The ingress interface of accepted TCP sockets (issue 19). The kernel
// records it in the child socket when the handshake completes
// (tcp_v4_syn_recv_sock: mc_index = inet_iif(skb); tcp_v6_syn_recv_sock:
// mcast_oif = the same, for native and IPv4-mapped children), from the packet
// that completed it; nothing a client sends later changes it. An IPv4 socket
// reports it through IP_PKTOPTIONS when IP_PKTINFO is set, which accepted
// sockets inherit from their listener; an IPv6 one through IPV6_MULTICAST_IF.
//
// Sets what a listener of `family` needs for read_ingress_ifindex on the
// sockets it accepts (IP_PKTINFO for AF_INET; nothing for AF_INET6).
Result<void> enable_ingress_ifindex(int listen_fd, int family);
// The accepted socket's ingress ifindex, or 0 when the kernel gave none.
int read_ingress_ifindex(int fd, int family);

// The links of one namespace (ifindex -> name and address prefixes), through
// rtnetlink sockets made inside it: one for dumps, one subscribed to link and
// address changes (made before the first dump, so nothing falls between). A
// change (a bridge renamed, removed or re-made, an address added or removed)
// is queued on the second socket by the time the call that made it returns
// (an IPv6 address after DAD, later; a tentative one takes no connections);
// every lookup first applies what is queued, in order, so a lookup after a
// change answers as the kernel would. (Applying a change the dump already held
// changes nothing: each message sets or removes one entry.) A dump only at the
// start, when a change could not be applied (the queue overflowed or ran long,
// an address on a link never seen), or on a miss. Datagrams from anyone but
// the kernel are dropped unread. Not thread-safe: the listener holds a lock
// around it.
class IfaceMap {
 public:
  // Must be called in the namespace (e.g. inside run_in_netns).
  Result<void> open();
  // The link with ifindex `index`, or nullptr when there is none. One
  // non-blocking recv a call, more only after changes; a dump as above (on a
  // miss at most every 10 ms). Valid until the next call.
  const IfLink* link(int index);
  // Dumps so far, the one in open() included (stats' iface_refreshes).
  uint64_t refreshes() const { return refreshes_; }

 private:
  Result<void> refresh();
  // refresh(), keeping stale_ and refresh_failed_; a failure leaves no map.
  void reread();
  // Drains the change socket, applying each message; false when one could
  // not be applied (or some were lost), so the map must be re-read.
  bool catch_up();
  // Applies one change message to links_; false if it cannot.
  bool apply(const nlmsghdr* nh);
  Fd nl_;
  Fd events_;  // RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
  std::unordered_map<int, IfLink> links_;  // by ifindex
  uint64_t last_refresh_ms_ = 0;
  uint64_t refreshes_ = 0;
  bool stale_ = false;           // a change could not be applied; not re-read since
  bool refresh_failed_ = false;  // the last re-read failed (retried every 10 ms)
  uint32_t nl_seq_ = 1;  // this socket's netlink sequence numbers
};

}  // namespace fy::fwd

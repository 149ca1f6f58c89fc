#include "forwarder/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/netlink.h>
#include <linux/nsfs.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/clock.h"
#include "core/net.h"

namespace fy::fwd {

Result<NsId> own_netns() {
  struct stat st;
  if (stat("/proc/thread-self/ns/net", &st) != 0)
    return make_error(Errc::io, "/proc/thread-self/ns/net: {}", strerror(errno));
  return NsId{st.st_dev, st.st_ino};
}

Result<void> run_in_netns(int ns_fd, const std::function<Result<void>()>& fn) {
  Result<void> out = make_error(Errc::internal, "namespace thread did not run");
  std::thread t([&] {
    if (setns(ns_fd, CLONE_NEWNET) != 0) {
      out = make_error(Errc::permission,
                       "cannot enter the network namespace: {} (fy-forwarder needs root)",
                       strerror(errno));
      return;
    }
    out = fn();
  });
  t.join();
  return out;
}

namespace {

Result<Fd> bound_socket(const std::string& ip, uint16_t port, bool group) {
  sockaddr_storage ss;
  socklen_t len;
  if (!make_sockaddr(ip, port, &ss, &len))
    return make_error(Errc::invalid_argument, "'{}' is not an IP address", ip);
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(Errc::io, "socket: {}", strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (group && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
    return make_error(Errc::io, "SO_REUSEPORT: {}", strerror(errno));
  if (ss.ss_family == AF_INET) {
    setsockopt(fd.get(), IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
  } else {
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_FREEBIND, &one, sizeof one);
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    return make_error(errno == EADDRINUSE ? Errc::refused : Errc::io, "cannot bind {}: {}",
                      sockaddr_string(reinterpret_cast<sockaddr*>(&ss)), strerror(errno));
  return fd;
}

}  // namespace

Result<Fd> listen_tcp(const std::string& ip, uint16_t port, int backlog, bool group) {
  auto fd = bound_socket(ip, port, group);
  if (!fd) return fd;
  // Accepted sockets inherit TCP_NODELAY from the listener: one setsockopt
  // here instead of one per connection.
  int one = 1;
  setsockopt(fd->get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::listen(fd->get(), backlog) != 0)
    return make_error(Errc::io, "listen on {}:{}: {}", ip, port, strerror(errno));
  return fd;
}

Result<void> check_port_free(const std::string& ip, uint16_t port) {
  auto fd = bound_socket(ip, port, false);
  if (!fd) return std::move(fd).take_error();
  return {};
}

namespace {

// How many change datagrams one lookup applies at most; past that the map is
// re-read instead (a burst of changes, or a flood), and the rest stays queued.
constexpr int kMaxChangeDatagrams = 256;
// The change socket's receive buffer: room for a few hundred link messages
// (each charged at 4 KiB or more) between two bridge connections.
constexpr int kChangeBuffer = 4 << 20;

// Receives one datagram: its real length (MSG_TRUNC), or -1 with errno.
// *kernel is false for one another process sent to the socket (a holder of
// CAP_NET_ADMIN over the namespace can), which the caller must not read.
ssize_t recv_datagram(int fd, char* buf, size_t size, int flags, bool* kernel) {
  while (true) {
    sockaddr_nl from{};
    socklen_t len = sizeof from;
    ssize_t n =
        ::recvfrom(fd, buf, size, flags | MSG_TRUNC, reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0 && errno == EINTR) continue;
    *kernel = len >= sizeof from && from.nl_family == AF_NETLINK && from.nl_pid == 0;
    return n;
  }
}

// Walks the messages of one datagram of `n` bytes (n <= the buffer's size).
template <typename Fn>
void each_message(char* buf, ssize_t n, Fn&& fn) {
  int left = static_cast<int>(n);
  for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, left); nh = NLMSG_NEXT(nh, left))
    if (!fn(nh)) return;
}

// An address message's ifindex and prefix: the link's own address (IFA_LOCAL,
// else IFA_ADDRESS) and the prefix it routes (IFA_ADDRESS, else IFA_LOCAL;
// they differ only on point-to-point links). false for a message too short,
// an attribute too short for its family, or no address.
bool prefix_of(const nlmsghdr* nh, int* index, IfPrefix* out) {
  if (nh->nlmsg_len < NLMSG_SPACE(sizeof(ifaddrmsg))) return false;
  auto* ifa = static_cast<const ifaddrmsg*>(NLMSG_DATA(nh));
  size_t want = ifa->ifa_family == AF_INET ? 4 : ifa->ifa_family == AF_INET6 ? 16 : 0;
  if (!want) return false;
  int len = static_cast<int>(nh->nlmsg_len - NLMSG_SPACE(sizeof(ifaddrmsg)));
  const void* local = nullptr;
  const void* address = nullptr;
  for (auto* a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (RTA_PAYLOAD(a) < want) continue;
    if (a->rta_type == IFA_LOCAL) local = RTA_DATA(a);
    if (a->rta_type == IFA_ADDRESS) address = RTA_DATA(a);
  }
  if (!local && !address) return false;
  *out = IfPrefix{};
  out->family = ifa->ifa_family;
  std::memcpy(out->local.data(), local ? local : address, want);
  std::memcpy(out->net.data(), address ? address : local, want);
  out->len = ifa->ifa_prefixlen;
  *index = static_cast<int>(ifa->ifa_index);
  return true;
}

// A link message's ifinfomsg, or nullptr when too short.
const ifinfomsg* link_of(const nlmsghdr* nh) {
  if (nh->nlmsg_len < NLMSG_SPACE(sizeof(ifinfomsg))) return nullptr;
  return static_cast<const ifinfomsg*>(NLMSG_DATA(nh));
}

// A link message's IFLA_IFNAME (NUL-terminated within the attribute), or
// nullptr.
const char* link_name(const nlmsghdr* nh) {
  const ifinfomsg* ifi = link_of(nh);
  if (!ifi) return nullptr;
  int len = static_cast<int>(nh->nlmsg_len - NLMSG_SPACE(sizeof(ifinfomsg)));
  for (auto* a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (a->rta_type != IFLA_IFNAME) continue;
    auto* name = static_cast<const char*>(RTA_DATA(a));
    size_t n = RTA_PAYLOAD(a);
    return n > 1 && std::memchr(name, 0, n) && name[0] ? name : nullptr;
  }
  return nullptr;
}

// Sends one dump request and hands every reply message to `each`.
Result<void> nl_dump(int fd, uint16_t type, uint32_t seq,
                     const std::function<void(const nlmsghdr*)>& each) {
  struct {
    nlmsghdr nh;
    rtgenmsg g;
  } req{};
  req.nh.nlmsg_len = sizeof req;
  req.nh.nlmsg_type = type;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.nh.nlmsg_seq = seq;
  req.g.rtgen_family = AF_UNSPEC;
  if (::send(fd, &req, sizeof req, 0) != static_cast<ssize_t>(sizeof req))
    return make_error(Errc::io, "rtnetlink send: {}", strerror(errno));
  alignas(nlmsghdr) char buf[32768];
  // SO_RCVTIMEO bounds a kernel that does not answer; this, datagrams that
  // keep coming from elsewhere.
  const uint64_t deadline = mono_ms() + 2000;
  while (true) {
    if (mono_ms() > deadline) return make_error(Errc::io, "rtnetlink dump: no end within 2 s");
    bool kernel = false;
    ssize_t n = recv_datagram(fd, buf, sizeof buf, 0, &kernel);
    if (n < 0) return make_error(Errc::io, "rtnetlink recv: {}", strerror(errno));
    if (!kernel) continue;
    if (static_cast<size_t>(n) > sizeof buf)
      return make_error(Errc::io, "rtnetlink dump: a {}-byte reply does not fit", n);
    bool done = false;
    const char* failed = nullptr;
    each_message(buf, n, [&](const nlmsghdr* nh) {
      if (nh->nlmsg_seq != seq) return true;
      if (nh->nlmsg_type == NLMSG_DONE) done = true;
      if (nh->nlmsg_type == NLMSG_ERROR) failed = "rtnetlink dump failed";
      if (done || failed) return false;
      each(nh);
      return true;
    });
    if (failed) return make_error(Errc::io, "{}", failed);
    if (done) return {};
  }
}

}  // namespace

Result<void> IfaceMap::open() {
  nl_.reset(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!nl_) return make_error(Errc::io, "rtnetlink socket: {}", strerror(errno));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  if (::bind(nl_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return make_error(Errc::io, "rtnetlink bind: {}", strerror(errno));
  timeval tv{1, 0};
  setsockopt(nl_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // Subscribed before the first dump, so no change falls between the two.
  events_.reset(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
  if (!events_) return make_error(Errc::io, "rtnetlink socket: {}", strerror(errno));
  // Root may pass rmem_max; without the privilege the default stays (an
  // overflow only costs a dump).
  if (setsockopt(events_.get(), SOL_SOCKET, SO_RCVBUFFORCE, &kChangeBuffer, sizeof kChangeBuffer) !=
      0)
    setsockopt(events_.get(), SOL_SOCKET, SO_RCVBUF, &kChangeBuffer, sizeof kChangeBuffer);
  sockaddr_nl ev{};
  ev.nl_family = AF_NETLINK;
  ev.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (::bind(events_.get(), reinterpret_cast<sockaddr*>(&ev), sizeof ev) != 0)
    return make_error(Errc::io, "rtnetlink bind (link and address changes): {}", strerror(errno));
  return refresh();
}

bool IfaceMap::catch_up() {
  bool whole = true;
  alignas(nlmsghdr) char buf[16384];
  for (int i = 0; i < kMaxChangeDatagrams; ++i) {
    bool kernel = false;
    ssize_t n = recv_datagram(events_.get(), buf, sizeof buf, MSG_DONTWAIT, &kernel);
    if (n >= 0 && !kernel) continue;  // not the kernel's: dropped unread
    if (n < 0) {
      if (errno == ENOBUFS) {  // the queue overflowed: some changes were lost
        whole = false;
        continue;
      }
      return whole;  // EAGAIN: drained
    }
    if (static_cast<size_t>(n) > sizeof buf) {
      whole = false;  // cut off
      continue;
    }
    each_message(buf, n, [&](const nlmsghdr* nh) {
      if (!apply(nh)) whole = false;
      return true;
    });
  }
  // More queued than one lookup applies: re-read instead (what stays queued
  // is applied later, to a map that holds it already, and changes nothing).
  return false;
}

bool IfaceMap::apply(const nlmsghdr* nh) {
  switch (nh->nlmsg_type) {
    case RTM_NEWADDR:
    case RTM_DELADDR: {
      int index = 0;
      IfPrefix p;
      if (!prefix_of(nh, &index, &p)) {
        // Not an address this map can hold: nothing changes. Too short to
        // read: re-read.
        return nh->nlmsg_len >= NLMSG_SPACE(sizeof(ifaddrmsg));
      }
      auto it = links_.find(index);
      if (nh->nlmsg_type == RTM_DELADDR) {
        if (it != links_.end()) std::erase(it->second.prefixes, p);
        return true;
      }
      if (it == links_.end()) return false;  // a link not seen: re-read
      auto& ps = it->second.prefixes;
      if (std::find(ps.begin(), ps.end(), p) == ps.end()) ps.push_back(p);
      return true;
    }
    case RTM_NEWLINK:
    case RTM_DELLINK: {
      const ifinfomsg* ifi = link_of(nh);
      if (!ifi) return false;
      // AF_BRIDGE: a port joining, leaving or changing state; the link stays.
      if (ifi->ifi_family == AF_BRIDGE) return true;
      if (nh->nlmsg_type == RTM_DELLINK) {
        // Its addresses go with it (the kernel has sent RTM_DELADDR first).
        links_.erase(ifi->ifi_index);
        return true;
      }
      const char* name = link_name(nh);
      if (!name) return false;
      links_[ifi->ifi_index].name = name;  // new, or renamed
      return true;
    }
    default:
      return true;  // nothing the map holds
  }
}

void IfaceMap::reread() {
  refresh_failed_ = !refresh();
  stale_ = refresh_failed_;
  if (refresh_failed_) links_.clear();
}

Result<void> IfaceMap::refresh() {
  last_refresh_ms_ = mono_ms();
  ++refreshes_;
  uint32_t& seq = nl_seq_;
  std::unordered_map<int, IfLink> links;
  FY_TRY(nl_dump(nl_.get(), RTM_GETLINK, ++seq, [&](const nlmsghdr* nh) {
    const ifinfomsg* ifi = link_of(nh);
    if (nh->nlmsg_type != RTM_NEWLINK || !ifi) return;
    if (const char* name = link_name(nh)) links[ifi->ifi_index].name = name;
  }));
  FY_TRY(nl_dump(nl_.get(), RTM_GETADDR, ++seq, [&](const nlmsghdr* nh) {
    int index = 0;
    IfPrefix p;
    if (nh->nlmsg_type != RTM_NEWADDR || !prefix_of(nh, &index, &p)) return;
    // An address on a link the link dump did not have (made between the
    // two): the change socket brings both, in order.
    if (auto it = links.find(index); it != links.end()) it->second.prefixes.push_back(p);
  }));
  links_ = std::move(links);
  return {};
}

const IfLink* IfaceMap::link(int index) {
  // Changes are applied in order; the map is re-read only when one could not
  // be (lost to an overflow, an address on a link never seen). Until a
  // re-read succeeds the map is stale; a failed one leaves no map rather than
  // a stale one (every lookup misses, and the connection is refused) and is
  // retried at most every 10 ms, as a miss is.
  if (!catch_up()) stale_ = true;
  if (stale_ && (!refresh_failed_ || mono_ms() - last_refresh_ms_ >= 10)) reread();
  auto it = links_.find(index);
  if (it != links_.end()) return &it->second;
  if (!nl_ || mono_ms() - last_refresh_ms_ < 10) return nullptr;
  reread();
  it = links_.find(index);
  return it == links_.end() ? nullptr : &it->second;
}

Result<void> enable_ingress_ifindex(int listen_fd, int family) {
  if (family != AF_INET) return {};
  int one = 1;
  if (setsockopt(listen_fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) != 0)
    return make_error(Errc::io, "IP_PKTINFO on the bridge listener: {}", strerror(errno));
  return {};
}

int read_ingress_ifindex(int fd, int family) {
  if (family == AF_INET6) {
    int index = 0;
    socklen_t len = sizeof index;
    if (getsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &index, &len) != 0) return 0;
    return index > 0 ? index : 0;
  }
  // IP_PKTOPTIONS fills a control buffer as recvmsg would: one IP_PKTINFO
  // message whose ipi_ifindex is the socket's ingress interface.
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(int))];
  socklen_t len = sizeof buf;
  if (getsockopt(fd, IPPROTO_IP, IP_PKTOPTIONS, buf, &len) != 0) return 0;
  msghdr msg{};
  msg.msg_control = buf;
  msg.msg_controllen = len;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_PKTINFO ||
        c->cmsg_len < CMSG_LEN(sizeof(in_pktinfo)))
      continue;
    in_pktinfo info;
    std::memcpy(&info, CMSG_DATA(c), sizeof info);
    return info.ipi_ifindex > 0 ? info.ipi_ifindex : 0;
  }
  return 0;
}

}  // namespace fy::fwd

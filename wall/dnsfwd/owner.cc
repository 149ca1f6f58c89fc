#include "wall/dnsfwd/owner.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fy::dnsfwd {

SocketOwner::~SocketOwner() {
  if (fd_ >= 0) ::close(fd_);
}

Result<void> SocketOwner::open() {
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd_ < 0) return make_error(Errc::io, "sock_diag socket: {}", strerror(errno));
  timeval tv{0, 20000};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return ok();
}

namespace {

uint16_t port_of(const sockaddr* a) {
  return a->sa_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in*>(a)->sin_port)
                                 : ntohs(reinterpret_cast<const sockaddr_in6*>(a)->sin6_port);
}

void put_addr(uint32_t* out, const sockaddr* a) {
  if (a->sa_family == AF_INET)
    out[0] = reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr;
  else
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
}

}  // namespace

std::optional<uint32_t> SocketOwner::uid_of(int protocol, const sockaddr* addr,
                                            const sockaddr* peer) {
  if (fd_ < 0 || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return std::nullopt;
  if (peer && peer->sa_family == addr->sa_family) {
    if (auto u = exact(protocol, addr, peer)) return u;
  }
  return uid(protocol, addr);
}

std::optional<uint32_t> SocketOwner::exact(int protocol, const sockaddr* addr,
                                           const sockaddr* peer) {
  struct {
    nlmsghdr nh;
    inet_diag_req_v2 req;
  } msg{};
  msg.req.sdiag_family = static_cast<uint8_t>(addr->sa_family);
  msg.req.sdiag_protocol = static_cast<uint8_t>(protocol);
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (protocol == IPPROTO_UDP) {
    // udp_dump_one looks up the socket that would receive a datagram from
    // src:sport to dst:dport: the peer first, the socket's own address second.
    put_addr(msg.req.id.idiag_src, peer);
    msg.req.id.idiag_sport = htons(port_of(peer));
    put_addr(msg.req.id.idiag_dst, addr);
    msg.req.id.idiag_dport = htons(port_of(addr));
  } else {
    put_addr(msg.req.id.idiag_src, addr);
    msg.req.id.idiag_sport = htons(port_of(addr));
    put_addr(msg.req.id.idiag_dst, peer);
    msg.req.id.idiag_dport = htons(port_of(peer));
  }
  msg.nh.nlmsg_len = sizeof msg;
  msg.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nh.nlmsg_flags = NLM_F_REQUEST;
  return ask(&msg, sizeof msg, addr);
}

std::optional<uint32_t> SocketOwner::uid(int protocol, const sockaddr* addr) {
  if (fd_ < 0) return std::nullopt;
  const int family = addr->sa_family;
  uint16_t port;
  if (family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  else if (family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  else
    return std::nullopt;
  // sport >= port and sport <= port; a failed test jumps past the end (reject).
  struct {
    nlmsghdr nh;
    inet_diag_req_v2 req;
    rtattr rta;
    inet_diag_bc_op ops[4];
  } msg{};
  constexpr uint16_t kLen = sizeof msg.ops;
  msg.ops[0] = {INET_DIAG_BC_S_GE, 8, kLen + 4};  // ops are 4 bytes; a port takes two
  msg.ops[1] = {0, 0, port};
  msg.ops[2] = {INET_DIAG_BC_S_LE, 8, kLen - 8 + 4};  // 8 bytes remain here
  msg.ops[3] = {0, 0, port};
  msg.rta.rta_type = INET_DIAG_REQ_BYTECODE;
  msg.rta.rta_len = RTA_LENGTH(kLen);
  msg.req.sdiag_family = static_cast<uint8_t>(family);
  msg.req.sdiag_protocol = static_cast<uint8_t>(protocol);
  msg.req.idiag_states = ~0u;
  msg.nh.nlmsg_len = sizeof msg;
  msg.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  return ask(&msg, sizeof msg, addr);
}

std::optional<uint32_t> SocketOwner::ask(void* req, size_t len, const sockaddr* addr) {
  auto* nh0 = static_cast<nlmsghdr*>(req);
  nh0->nlmsg_seq = ++seq_;
  const int family = addr->sa_family;
  const uint16_t port = port_of(addr);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, req, len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return std::nullopt;
  const bool dump = nh0->nlmsg_flags & NLM_F_DUMP;
  std::optional<uint32_t> found;
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return found;  // timeout or error: what was seen so far
    for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, static_cast<size_t>(n));
         nh = NLMSG_NEXT(nh, n)) {
      if (nh->nlmsg_seq != seq_) continue;  // a late part of an earlier request
      if (nh->nlmsg_type == NLMSG_DONE || nh->nlmsg_type == NLMSG_ERROR) return found;
      if (nh->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      auto* d = static_cast<const inet_diag_msg*>(NLMSG_DATA(nh));
      if (ntohs(d->id.idiag_sport) != port) continue;
      bool same;
      if (family == AF_INET)
        same = d->id.idiag_src[0] == reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr;
      else
        same = std::memcmp(d->id.idiag_src, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr,
                           16) == 0;
      // A socket bound to the wildcard address sends from any local one.
      bool any = family == AF_INET ? d->id.idiag_src[0] == 0
                                   : (d->id.idiag_src[0] | d->id.idiag_src[1] |
                                      d->id.idiag_src[2] | d->id.idiag_src[3]) == 0;
      if (same || (any && !found)) found = d->idiag_uid;
      if (!dump) return found;  // one answer to an exact request
    }
  }
}

}  // namespace fy::dnsfwd

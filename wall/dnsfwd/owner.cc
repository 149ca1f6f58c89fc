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
  msg.nh.nlmsg_seq = ++seq_;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return std::nullopt;
  std::optional<uint32_t> found;
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return found;  // timeout or error: what was seen so far
    for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, static_cast<size_t>(n));
         nh = NLMSG_NEXT(nh, n)) {
      if (nh->nlmsg_seq != seq_) continue;  // a late part of an earlier dump
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
    }
  }
}

}  // namespace fy::dnsfwd

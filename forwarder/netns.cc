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

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/clock.h"
#include "core/net.h"

#ifndef NSFS_MAGIC
#define NSFS_MAGIC 0x6e736673
#endif

namespace fy::fwd {

Result<NsHandle> open_netns(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(errno == ENOENT ? Errc::not_found : Errc::io, "{} cannot be opened: {}", path,
                      strerror(errno));
  NsHandle h;
  h.fd.reset(fd);
  struct statfs sfs;
  if (fstatfs(fd, &sfs) != 0 || static_cast<unsigned long>(sfs.f_type) != NSFS_MAGIC)
    return make_error(Errc::not_found, "{} is not a namespace (not mounted yet?)", path);
  int type = ioctl(fd, NS_GET_NSTYPE);
  if (type != CLONE_NEWNET)
    return make_error(Errc::invalid_argument, "{} is a namespace but not a network namespace",
                      path);
  struct stat st;
  if (fstat(fd, &st) != 0) return make_error(Errc::io, "fstat {}: {}", path, strerror(errno));
  h.id = NsId{st.st_dev, st.st_ino};
  return h;
}

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

Result<UniqueFd> bound_socket(const std::string& ip, uint16_t port, bool group) {
  sockaddr_storage ss;
  socklen_t len;
  if (!make_sockaddr(ip, port, &ss, &len))
    return make_error(Errc::invalid_argument, "'{}' is not an IP address", ip);
  UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
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

Result<UniqueFd> listen_tcp(const std::string& ip, uint16_t port, int backlog, bool group) {
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
  sockaddr_nl ev{};
  ev.nl_family = AF_NETLINK;
  ev.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (::bind(events_.get(), reinterpret_cast<sockaddr*>(&ev), sizeof ev) != 0)
    return make_error(Errc::io, "rtnetlink bind (link and address changes): {}", strerror(errno));
  return refresh();
}

bool IfaceMap::changed() {
  bool any = false;
  alignas(nlmsghdr) char buf[8192];
  while (true) {
    ssize_t n = ::recv(events_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == ENOBUFS)) {
      any = true;  // what changed does not matter: the dump reads it all
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return any;
  }
}

namespace {

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
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::io, "rtnetlink recv: {}", strerror(errno));
    }
    for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, static_cast<size_t>(n));
         nh = NLMSG_NEXT(nh, n)) {
      if (nh->nlmsg_seq != seq) continue;
      if (nh->nlmsg_type == NLMSG_DONE) return {};
      if (nh->nlmsg_type == NLMSG_ERROR) return make_error(Errc::io, "rtnetlink dump failed");
      each(nh);
    }
  }
}

}  // namespace

Result<void> IfaceMap::refresh() {
  last_refresh_ms_ = mono_ms();
  uint32_t& seq = nl_seq_;
  std::unordered_map<int, std::string> names;
  FY_TRY(nl_dump(nl_.get(), RTM_GETLINK, ++seq, [&](const nlmsghdr* nh) {
    if (nh->nlmsg_type != RTM_NEWLINK) return;
    auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(nh));
    int len = static_cast<int>(IFLA_PAYLOAD(nh));
    for (auto* a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
      if (a->rta_type == IFLA_IFNAME) names[ifi->ifi_index] = static_cast<const char*>(RTA_DATA(a));
  }));
  std::unordered_map<std::string, std::string> by_ip;
  FY_TRY(nl_dump(nl_.get(), RTM_GETADDR, ++seq, [&](const nlmsghdr* nh) {
    if (nh->nlmsg_type != RTM_NEWADDR) return;
    auto* ifa = static_cast<const ifaddrmsg*>(NLMSG_DATA(nh));
    int len = static_cast<int>(IFA_PAYLOAD(nh));
    const void* local = nullptr;
    const void* address = nullptr;
    for (auto* a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
      if (a->rta_type == IFA_LOCAL) local = RTA_DATA(a);
      if (a->rta_type == IFA_ADDRESS) address = RTA_DATA(a);
    }
    const void* ip = local ? local : address;
    if (!ip) return;
    char text[INET6_ADDRSTRLEN] = "";
    inet_ntop(ifa->ifa_family, ip, text, sizeof text);
    auto it = names.find(static_cast<int>(ifa->ifa_index));
    if (it != names.end()) by_ip[text] = it->second;
  }));
  by_ip_ = std::move(by_ip);
  return {};
}

std::string IfaceMap::name_for(const std::string& ip) {
  // A failed re-read leaves no map rather than a stale one: lookups say
  // "unknown" until a miss re-reads it (at most every 10 ms).
  if (changed() && !refresh()) by_ip_.clear();
  auto it = by_ip_.find(ip);
  if (it != by_ip_.end()) return it->second;
  if (!nl_ || mono_ms() - last_refresh_ms_ < 10) return "";
  if (!refresh()) return "";
  it = by_ip_.find(ip);
  return it == by_ip_.end() ? "" : it->second;
}

pid_t read_pid_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char* end = nullptr;
  long v = strtol(buf, &end, 10);
  if (end == buf || v <= 0 || v > 4194304) return 0;
  while (*end == '\n' || *end == ' ') ++end;
  return *end ? 0 : static_cast<pid_t>(v);
}

}  // namespace fy::fwd

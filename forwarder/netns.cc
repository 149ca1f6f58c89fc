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

namespace {

// An address message's address as text ("10.89.0.1"): IFA_LOCAL, else
// IFA_ADDRESS (they differ only on point-to-point links); "" if it has none.
std::string addr_text(const nlmsghdr* nh) {
  auto* ifa = static_cast<const ifaddrmsg*>(NLMSG_DATA(nh));
  int len = static_cast<int>(IFA_PAYLOAD(nh));
  const void* local = nullptr;
  const void* address = nullptr;
  for (auto* a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (a->rta_type == IFA_LOCAL) local = RTA_DATA(a);
    if (a->rta_type == IFA_ADDRESS) address = RTA_DATA(a);
  }
  const void* ip = local ? local : address;
  char text[INET6_ADDRSTRLEN] = "";
  if (!ip || !inet_ntop(ifa->ifa_family, ip, text, sizeof text)) return "";
  return text;
}

// A link message's IFLA_IFNAME, or nullptr.
const char* link_name(const nlmsghdr* nh) {
  auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(nh));
  int len = static_cast<int>(IFLA_PAYLOAD(nh));
  for (auto* a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
    if (a->rta_type == IFLA_IFNAME) return static_cast<const char*>(RTA_DATA(a));
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

bool IfaceMap::catch_up() {
  bool whole = true;
  alignas(nlmsghdr) char buf[16384];
  while (true) {
    // MSG_TRUNC: the datagram's real length, so a cut-off one is seen as such.
    ssize_t n = ::recv(events_.get(), buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOBUFS) {  // the queue overflowed: some changes were lost
        whole = false;
        continue;
      }
      return whole;  // EAGAIN: drained
    }
    if (static_cast<size_t>(n) > sizeof buf) {
      whole = false;
      continue;
    }
    for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, static_cast<size_t>(n));
         nh = NLMSG_NEXT(nh, n))
      if (!apply(nh)) whole = false;
  }
}

bool IfaceMap::apply(const nlmsghdr* nh) {
  switch (nh->nlmsg_type) {
    case RTM_NEWADDR:
    case RTM_DELADDR: {
      if (nh->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) return false;
      int index = static_cast<int>(static_cast<const ifaddrmsg*>(NLMSG_DATA(nh))->ifa_index);
      std::string ip = addr_text(nh);
      if (ip.empty()) return false;
      if (nh->nlmsg_type == RTM_DELADDR) {
        // Only this link's: the same address may be on another one too (a
        // re-read on the next miss finds it there).
        auto it = by_ip_.find(ip);
        if (it != by_ip_.end() && it->second.index == index) by_ip_.erase(it);
        return true;
      }
      auto name = names_.find(index);
      if (name == names_.end()) return false;  // a link not seen: re-read
      by_ip_[ip] = Entry{index, name->second};
      return true;
    }
    case RTM_NEWLINK:
    case RTM_DELLINK: {
      if (nh->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) return false;
      auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(nh));
      // AF_BRIDGE: a port joining, leaving or changing state; the link stays.
      if (ifi->ifi_family == AF_BRIDGE) return true;
      if (nh->nlmsg_type == RTM_DELLINK) {
        names_.erase(ifi->ifi_index);
        std::erase_if(by_ip_, [&](const auto& kv) { return kv.second.index == ifi->ifi_index; });
        return true;
      }
      const char* name = link_name(nh);
      if (!name) return false;
      std::string& known = names_[ifi->ifi_index];
      if (known != name) {  // new, or renamed
        known = name;
        for (auto& [ip, e] : by_ip_)
          if (e.index == ifi->ifi_index) e.name = known;
      }
      return true;
    }
    default:
      return true;  // nothing the map holds
  }
}

Result<void> IfaceMap::refresh() {
  last_refresh_ms_ = mono_ms();
  ++refreshes_;
  uint32_t& seq = nl_seq_;
  std::unordered_map<int, std::string> names;
  FY_TRY(nl_dump(nl_.get(), RTM_GETLINK, ++seq, [&](const nlmsghdr* nh) {
    if (nh->nlmsg_type != RTM_NEWLINK) return;
    if (const char* name = link_name(nh))
      names[static_cast<const ifinfomsg*>(NLMSG_DATA(nh))->ifi_index] = name;
  }));
  std::unordered_map<std::string, Entry> by_ip;
  FY_TRY(nl_dump(nl_.get(), RTM_GETADDR, ++seq, [&](const nlmsghdr* nh) {
    if (nh->nlmsg_type != RTM_NEWADDR) return;
    std::string ip = addr_text(nh);
    int index = static_cast<int>(static_cast<const ifaddrmsg*>(NLMSG_DATA(nh))->ifa_index);
    auto it = names.find(index);
    if (!ip.empty() && it != names.end()) by_ip[ip] = Entry{index, it->second};
  }));
  names_ = std::move(names);
  by_ip_ = std::move(by_ip);
  return {};
}

std::string IfaceMap::name_for(const std::string& ip) {
  // Changes applied in order; a re-read only when one could not be (lost to
  // an overflow, a link never seen). A failed re-read leaves no map rather
  // than a stale one: lookups say "unknown" until a miss re-reads it (at most
  // every 10 ms).
  if (!catch_up() && !refresh()) by_ip_.clear();
  auto it = by_ip_.find(ip);
  if (it != by_ip_.end()) return it->second.name;
  if (!nl_ || mono_ms() - last_refresh_ms_ < 10) return "";
  if (!refresh()) return "";
  it = by_ip_.find(ip);
  return it == by_ip_.end() ? "" : it->second.name;
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

#include "forwarder/starts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/text.h"
#include "forwarder/attrib.h"
#include "core/fd.h"
#include "forwarder/netns.h"

namespace fy::fwd {
namespace {

bool ns_of(pid_t pid, dev_t* dev, ino_t* ino) {
  struct stat st {};
  std::string p = "/proc/" + std::to_string(pid) + "/ns/net";
  if (::stat(p.c_str(), &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

}  // namespace

bool Starts::valid_id(std::string_view id) {
  return id.size() >= 12 && id.size() <= 64 &&
         std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool parse_start_line(std::string_view line, std::string* id, pid_t* pid) {
  if (line.rfind("start ", 0) != 0) return false;
  line.remove_prefix(6);
  size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  std::string_view i = line.substr(0, sp), p = line.substr(sp + 1);
  auto v = parse_u64(p);
  if (!Starts::valid_id(i) || !v || *v == 0 || *v > 4194304) return false;
  *id = std::string(i);
  *pid = static_cast<pid_t>(*v);
  return true;
}

Result<size_t> Starts::record(std::string_view id, pid_t pid) {
  if (!valid_id(id)) return make_error(Errc::invalid_argument, "the id is not 12..64 hex digits");
  std::string path = "/proc/" + std::to_string(pid) + "/ns/net";
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return make_error(Errc::not_found, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return make_error(Errc::io, "cannot stat {}: {}", path, std::strerror(errno));
  // The claim against the kernel's record: a pid whose cgroup names a
  // container (libpod-<id>.scope, the walk the VM listener trusts) must be
  // that container. (A pid in no such scope, cgroups disabled, is taken on
  // the hook's word.)
  std::string cls = Attributor::classify_cgroup(Attributor::cgroup_of(pid));
  if (cls.rfind("container:", 0) == 0 && cls.compare(10, id.size(), id) != 0)
    return make_error(Errc::refused, "pid {} is in the cgroup of container {}, not {}", pid,
                      cls.substr(10, 12), id.substr(0, 12));
  // A container in the forwarder's own (the VM's) namespace, --network host,
  // holds no address of its own: recording the VM's would name it for them.
  if (auto own = own_netns(); own && own->dev == st.st_dev && own->ino == st.st_ino) return 0;
  std::vector<std::string> ips;
  auto r = run_in_netns(fd.get(), [&]() -> Result<void> {
    ifaddrs* ifa = nullptr;
    if (::getifaddrs(&ifa) != 0)
      return make_error(Errc::io, "getifaddrs: {}", std::strerror(errno));
    for (ifaddrs* i = ifa; i; i = i->ifa_next) {
      if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK)) continue;
      char buf[INET6_ADDRSTRLEN] = {};
      if (i->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      } else if (i->ifa_addr->sa_family == AF_INET6) {
        auto* a6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
        if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
        inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
      } else {
        continue;
      }
      if (ips.size() < 64) ips.emplace_back(buf);
    }
    ::freeifaddrs(ifa);
    return {};
  });
  if (!r) return std::move(r).take_error();
  std::lock_guard<std::mutex> g(mu_);
  if (by_ip_.size() + ips.size() > kMaxEntries) {
    // Past the bound: forget the entries whose namespace is gone first.
    for (auto it = by_ip_.begin(); it != by_ip_.end();) {
      dev_t d;
      ino_t n;
      if (!ns_of(it->second.pid, &d, &n) || d != it->second.dev || n != it->second.ino)
        it = by_ip_.erase(it);
      else
        ++it;
    }
    if (by_ip_.size() + ips.size() > kMaxEntries) by_ip_.clear();
  }
  for (const auto& ip : ips) {
    Entry e{std::string(id), pid, st.st_dev, st.st_ino, false};
    auto it = by_ip_.find(ip);
    if (it != by_ip_.end() && it->second.dev == e.dev && it->second.ino == e.ino &&
        it->second.id != e.id) {
      // A namespace shared by containers (a pod, --network container:): the
      // address names none of them alone; kept, so the share is remembered.
      it->second.shared = true;
      continue;
    }
    by_ip_[ip] = std::move(e);
  }
  ++recorded_;
  return ips.size();
}

std::string Starts::holder(const std::string& ip) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = by_ip_.find(ip);
  if (it == by_ip_.end()) return {};
  dev_t d;
  ino_t n;
  if (!ns_of(it->second.pid, &d, &n) || d != it->second.dev || n != it->second.ino) {
    by_ip_.erase(it);
    return {};
  }
  return it->second.shared ? std::string() : it->second.id;
}

size_t Starts::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return by_ip_.size();
}

uint64_t Starts::recorded() const {
  std::lock_guard<std::mutex> g(mu_);
  return recorded_;
}

}  // namespace fy::fwd

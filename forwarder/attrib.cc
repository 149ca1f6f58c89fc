#include "forwarder/attrib.h"

#include "forwarder/bpf/sock_owner.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netlink/idiag/idiagnl.h>
#include <netlink/idiag/msg.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/fd.h"
#include "forwarder/sock_owner_bpf.h"

namespace fy::fwd {

// ---------------------------------------------------------------------------
// The BPF recorder.

class BpfRecorder {
 public:
  using Owner = fy_owner;  // the map's value, as the BPF program writes it

  ~BpfRecorder() {
    for (bpf_link* l : links_) bpf_link__destroy(l);
    if (obj_) bpf_object__close(obj_);
  }

  Result<void> load(const std::string& cgroup_root) {
    libbpf_set_print([](libbpf_print_level level, const char* fmt, va_list args) -> int {
      if (level != LIBBPF_WARN) return 0;
      char buf[512];
      vsnprintf(buf, sizeof buf, fmt, args);
      log::warn("libbpf: {}", buf);
      return 0;
    });
    obj_ = bpf_object__open_mem(kSockOwnerBpf, sizeof kSockOwnerBpf, nullptr);
    if (!obj_) return make_error(Errc::io, "cannot open the BPF object: {}", strerror(errno));
    if (int rc = bpf_object__load(obj_); rc != 0)
      return make_error(Errc::io,
                        "cannot load the BPF recorder: {} (needs root and a kernel "
                        "with cgroup BPF)",
                        strerror(-rc));
    Fd cg(::open(cgroup_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cg)
      return make_error(Errc::not_found, "cgroup2 root {} cannot be opened: {}", cgroup_root,
                        strerror(errno));
    bpf_program* prog;
    bpf_object__for_each_program(prog, obj_) {
      bpf_link* link = bpf_program__attach_cgroup(prog, cg.get());
      if (!link)
        return make_error(Errc::io, "cannot attach {} to {}: {}", bpf_program__name(prog),
                          cgroup_root, strerror(errno));
      links_.push_back(link);
    }
    map_fd_ = bpf_object__find_map_fd_by_name(obj_, "fy_sock_owner");
    if (map_fd_ < 0) return make_error(Errc::internal, "the BPF object has no fy_sock_owner map");
    return {};
  }

  bool lookup(uint64_t cookie, Owner* out) const {
    return bpf_map_lookup_elem(map_fd_, &cookie, out) == 0;
  }

 private:
  bpf_object* obj_ = nullptr;
  std::vector<bpf_link*> links_;
  int map_fd_ = -1;
};

// ---------------------------------------------------------------------------

namespace {

struct NlSockDeleter {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};

// One sock_diag socket per thread-pool thread, in the forwarder's namespace.
nl_sock* diag_socket() {
  thread_local std::unique_ptr<nl_sock, NlSockDeleter> sock;
  if (!sock) {
    nl_sock* s = nl_socket_alloc();
    if (!s) return nullptr;
    if (nl_connect(s, NETLINK_SOCK_DIAG) < 0) {
      nl_socket_free(s);
      return nullptr;
    }
    nl_socket_disable_auto_ack(s);
    sock.reset(s);
  }
  return sock.get();
}

struct DiagReply {
  bool found = false;
  SockInfo info;
};

int on_diag_msg(nl_msg* msg, void* arg) {
  auto* out = static_cast<DiagReply*>(arg);
  nlmsghdr* nh = nlmsg_hdr(msg);
  if (nh->nlmsg_type != SOCK_DIAG_BY_FAMILY) return NL_SKIP;
  idiagnl_msg* m = nullptr;
  if (idiagnl_msg_parse(nh, &m) < 0 || !m) return NL_SKIP;
  out->info.inode = idiagnl_msg_get_inode(m);
  out->info.uid = idiagnl_msg_get_uid(m);
  idiagnl_msg_put(m);
  // libnl's object does not carry the cookie; it is in the fixed header.
  auto* raw = static_cast<const inet_diag_msg*>(nlmsg_data(nh));
  out->info.cookie = static_cast<uint64_t>(raw->id.idiag_cookie[0]) |
                     (static_cast<uint64_t>(raw->id.idiag_cookie[1]) << 32);
  out->found = true;
  return NL_OK;
}

std::string read_line_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

Attributor::Attributor(const VmConfig& cfg) : cfg_(cfg) {}
Attributor::~Attributor() = default;

bool Attributor::bpf_active() const {
  return bpf_ != nullptr;
}

Result<void> Attributor::start() {
  if (cfg_.attribution != AttributionMode::bpf) return {};
  std::string root = cfg_.cgroup_root == "auto" ? find_cgroup2_root() : cfg_.cgroup_root;
  if (root.empty())
    return make_error(Errc::not_found,
                      "no cgroup2 mount in /proc/self/mountinfo; set [vm] cgroup_root");
  auto rec = std::make_unique<BpfRecorder>();
  FY_TRY(rec->load(root));
  bpf_ = std::move(rec);
  log::info("attribution: BPF recorder attached at {}", root);
  return {};
}

Result<SockInfo> Attributor::find_socket(const AttribQuery& q) {
  nl_sock* sk = diag_socket();
  if (!sk) return make_error(Errc::io, "cannot open a sock_diag socket");
  inet_diag_req_v2 req{};
  req.sdiag_family = q.client.ss_family;
  req.sdiag_protocol = IPPROTO_TCP;
  req.idiag_states = ~0u;
  req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (q.client.ss_family == AF_INET) {
    auto* c = reinterpret_cast<const sockaddr_in*>(&q.client);
    auto* d = reinterpret_cast<const sockaddr_in*>(&q.dst);
    req.id.idiag_sport = c->sin_port;
    req.id.idiag_dport = d->sin_port;
    std::memcpy(req.id.idiag_src, &c->sin_addr, 4);
    std::memcpy(req.id.idiag_dst, &d->sin_addr, 4);
  } else if (q.client.ss_family == AF_INET6) {
    auto* c = reinterpret_cast<const sockaddr_in6*>(&q.client);
    auto* d = reinterpret_cast<const sockaddr_in6*>(&q.dst);
    req.id.idiag_sport = c->sin6_port;
    req.id.idiag_dport = d->sin6_port;
    std::memcpy(req.id.idiag_src, &c->sin6_addr, 16);
    std::memcpy(req.id.idiag_dst, &d->sin6_addr, 16);
  } else {
    return make_error(Errc::invalid_argument, "not an IP socket");
  }
  nl_msg* msg = nlmsg_alloc_simple(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST);
  if (!msg) return make_error(Errc::io, "out of memory");
  nlmsg_append(msg, &req, sizeof req, NLMSG_ALIGNTO);
  int rc = nl_send_auto(sk, msg);
  nlmsg_free(msg);
  if (rc < 0) return make_error(Errc::io, "sock_diag send: {}", nl_geterror(rc));
  DiagReply reply;
  nl_socket_modify_cb(sk, NL_CB_VALID, NL_CB_CUSTOM, on_diag_msg, &reply);
  rc = nl_recvmsgs_default(sk);
  if (!reply.found)
    return make_error(Errc::not_found,
                      "sock_diag has no client socket for this connection ({}); the client "
                      "closed, or conntrack rewrote its source port",
                      rc < 0 ? nl_geterror(rc) : "no reply");
  return reply.info;
}

pid_t Attributor::find_owner_proc(uint32_t inode) const {
  char want[32];
  int want_len = snprintf(want, sizeof want, "socket:[%u]", inode);
  Fd proc(::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!proc) return 0;
  DIR* d = fdopendir(::dup(proc.get()));
  if (!d) return 0;
  pid_t found = 0;
  char link[64];
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    struct stat st;
    if (fstatat(proc.get(), e->d_name, &st, 0) != 0) continue;
    if (!cfg_.walled(st.st_uid)) continue;
    char fdpath[300];
    snprintf(fdpath, sizeof fdpath, "%s/fd", e->d_name);
    int fdd = openat(proc.get(), fdpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fdd < 0) continue;
    DIR* fds = fdopendir(fdd);
    if (!fds) {
      ::close(fdd);
      continue;
    }
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] < '0' || f->d_name[0] > '9') continue;
      ssize_t n = readlinkat(fdd, f->d_name, link, sizeof link);
      if (n == want_len && std::memcmp(link, want, n) == 0) {
        found = static_cast<pid_t>(atoi(e->d_name));
        break;
      }
    }
    closedir(fds);
    if (found) break;
  }
  closedir(d);
  return found;
}

pid_t Attributor::find_owner_bpf(uint64_t cookie) const {
  if (!bpf_) return 0;
  BpfRecorder::Owner o;
  if (!bpf_->lookup(cookie, &o)) return 0;
  // The connecting process must still be there, under a walled uid.
  char path[32];
  snprintf(path, sizeof path, "/proc/%u", o.tgid);
  struct stat st;
  if (stat(path, &st) != 0 || !cfg_.walled(st.st_uid)) return 0;
  return static_cast<pid_t>(o.tgid);
}

std::string Attributor::cgroup_of(pid_t pid) {
  std::string text = read_line_file("/proc/" + std::to_string(pid) + "/cgroup");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
    if (line.substr(0, 3) == "0::") return std::string(line.substr(3));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return "";
}

std::string Attributor::classify_cgroup(std::string_view path) {
  while (!path.empty()) {
    if (path.front() == '/') {
      path.remove_prefix(1);
      continue;
    }
    size_t slash = path.find('/');
    std::string_view comp = path.substr(0, slash);
    constexpr std::string_view kLibpod = "libpod-";
    constexpr std::string_view kBuildah = "crun-buildah-";
    constexpr std::string_view kScope = ".scope";
    bool scope = comp.size() > kScope.size() && comp.substr(comp.size() - kScope.size()) == kScope;
    if (scope && comp.substr(0, kLibpod.size()) == kLibpod) {
      std::string_view id =
          comp.substr(kLibpod.size(), comp.size() - kLibpod.size() - kScope.size());
      if (is_hex64(id)) return "container:" + std::string(id);
    }
    if (scope && comp.substr(0, kBuildah.size()) == kBuildah) {
      std::string who = "build:";
      for (char c : comp.substr(0, 140)) {
        bool okc = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '.' || c == '-' || c == '@' || c == ':';
        who += okc ? c : '_';
      }
      return who;
    }
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash);
  }
  return "user";
}

bool Attributor::is_pasta(pid_t pid) {
  std::string comm = read_line_file("/proc/" + std::to_string(pid) + "/comm");
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm == "pasta" || comm == "passt" || comm.rfind("pasta.", 0) == 0 ||
         comm.rfind("passt.", 0) == 0;
}

Attribution Attributor::lookup(const AttribQuery& q) const {
  uint64_t t0 = mono_us();
  Attribution a;
  auto finish = [&]() -> Attribution {
    a.cost_us = mono_us() - t0;
    return a;
  };
  auto s = find_socket(q);
  if (!s) {
    a.why = s.error().message;
    return finish();
  }
  if (!cfg_.walled(s->uid)) {
    // Not a walled principal: the wall never redirects these, so one came here
    // on its own (root's tools, say). Recorded by uid, not refused.
    a.verdict = Attribution::Verdict::ok;
    a.via = Attribution::Via::uid;
    a.who = "uid:" + std::to_string(s->uid);
    return finish();
  }
  pid_t pid = find_owner_bpf(s->cookie);
  a.via = Attribution::Via::bpf;
  if (!pid) {
    pid = find_owner_proc(s->inode);
    a.via = Attribution::Via::proc;
  }
  if (!pid) {
    a.why = "no process of a walled uid holds the client socket (inode " +
            std::to_string(s->inode) + ")";
    return finish();
  }
  a.pid = pid;
  if (is_pasta(pid)) {
    a.verdict = Attribution::Verdict::refused_pasta;
    a.why = "the connection comes from a pasta helper (pid " + std::to_string(pid) +
            "): a --network pasta container; run it on a bridge network";
    return finish();
  }
  std::string cg = cgroup_of(pid);
  if (cg.empty()) {
    a.why = "cannot read the cgroup of pid " + std::to_string(pid);
    return finish();
  }
  a.verdict = Attribution::Verdict::ok;
  a.who = classify_cgroup(cg);
  return finish();
}

std::string find_cgroup2_root() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // "... <mount point> <options> - <fstype> <source> <super options>"
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    if (line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    size_t p = 0;
    for (int field = 0; field < 4 && p != std::string::npos; ++field) p = line.find(' ', p + 1);
    if (p == std::string::npos) continue;
    size_t e = line.find(' ', p + 1);
    return line.substr(p + 1, e - p - 1);
  }
  return "";
}

}  // namespace fy::fwd

// fy-fwd-attrib-cost: what attributing one VM-listener connection costs, with
// many sockets open (ADR-0034: "measure the lookup cost per connection with
// 10,000 sockets open"). Run it as root in a fresh network namespace:
//
//   unshare -n sh -c 'ip link set lo up && exec fy-fwd-attrib-cost --sockets 10000'
//
// A "holder" process of a walled uid (1000) in a plain cgroup keeps --sockets
// sockets open; then a "client" process of a container uid (100123) in a
// libpod-<id>.scope cgroup connects --connections times to a listener here.
// For each accepted connection the pieces of forwarder/attrib.h are timed:
// the sock_diag lookup, the BPF owner lookup, the /proc walk, and the whole
// lookup in bpf and in proc mode. Prints one JSON object.
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "forwarder/attrib.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPod =
    "libpod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope";

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void enter(const std::string& cg, uid_t uid) {
  FILE* f = fopen((cg + "/cgroup.procs").c_str(), "w");
  if (!f || fprintf(f, "%d", getpid()) < 0) _exit(90);
  fclose(f);
  if (setgroups(0, nullptr) || setgid(uid) || setuid(uid)) _exit(91);
}

struct Stat {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double pct(double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  }
};

}  // namespace

int main(int argc, char** argv) {
  int sockets = 10000, connections = 50;
  std::string root = "/sys/fs/cgroup/unified";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help") {
      puts(
          "usage: fy-fwd-attrib-cost [--sockets N] [--connections M] [--cgroup-root DIR]\n"
          "Run as root inside a fresh network namespace (see the source's header).");
      return 0;
    }
    if (a == "--sockets" && i + 1 < argc)
      sockets = atoi(argv[++i]);
    else if (a == "--connections" && i + 1 < argc)
      connections = atoi(argv[++i]);
    else if (a == "--cgroup-root" && i + 1 < argc)
      root = argv[++i];
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string base = root + "/fyf-attrib-" + std::to_string(getpid());
  std::string plain = base + "/plain.scope", pod = base + "/" + kPod;
  if (mkdir(base.c_str(), 0755) || mkdir(plain.c_str(), 0755) || mkdir(pod.c_str(), 0755)) {
    fprintf(stderr, "cannot make cgroups under %s: %s\n", root.c_str(), strerror(errno));
    return 1;
  }
  fy::fwd::VmConfig bpf_cfg;
  bpf_cfg.walled_uids = {{1000, 1000}, {100000, 165535}};
  bpf_cfg.attribution = fy::fwd::AttributionMode::bpf;
  bpf_cfg.cgroup_root = root;
  fy::fwd::VmConfig proc_cfg = bpf_cfg;
  proc_cfg.attribution = fy::fwd::AttributionMode::proc;
  fy::fwd::Attributor bpf(bpf_cfg), proc(proc_cfg);
  if (auto r = bpf.start(); !r) {
    fprintf(stderr, "BPF recorder: %s\n", r.error().message.c_str());
    return 1;
  }
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in la{};
  la.sin_family = AF_INET;
  la.sin_port = htons(42690);
  la.sin_addr.s_addr = htonl(0x7f2a0001);  // 127.42.0.1
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&la), sizeof la) || listen(lfd, 4096)) {
    perror("listen");
    return 1;
  }
  int ready[2], go[2];
  if (pipe(ready) || pipe(go)) return 1;
  // The holder first, so its pid comes before the client's in a /proc walk.
  pid_t holder = fork();
  if (holder == 0) {
    rlimit rl{static_cast<rlim_t>(sockets + 64), static_cast<rlim_t>(sockets + 64)};
    setrlimit(RLIMIT_NOFILE, &rl);
    enter(plain, 1000);
    for (int i = 0; i < sockets; ++i)
      if (socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) < 0) _exit(92);
    char c = 'h';
    if (write(ready[1], &c, 1) != 1) _exit(93);
    if (read(go[0], &c, 1) < 0) _exit(94);
    _exit(0);
  }
  char c;
  if (read(ready[0], &c, 1) != 1) {
    fprintf(stderr, "the socket holder failed (raise the hard RLIMIT_NOFILE?)\n");
    return 1;
  }
  pid_t client = fork();
  if (client == 0) {
    enter(pod, 100123);
    std::vector<int> fds;
    for (int i = 0; i < connections; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&la), sizeof la)) _exit(95);
      fds.push_back(fd);
    }
    char r = 'c';
    if (write(ready[1], &r, 1) != 1) _exit(96);
    if (read(go[0], &r, 1) < 0) _exit(97);
    _exit(0);
  }
  if (read(ready[0], &c, 1) != 1) {
    fprintf(stderr, "the client failed\n");
    return 1;
  }
  Stat diag, owner_bpf, walk, full_bpf, full_proc;
  int wrong = 0;
  std::string want = std::string("container:") + std::string(kPod).substr(7, 64);
  for (int i = 0; i < connections; ++i) {
    fy::fwd::AttribQuery q;
    socklen_t len = sizeof q.client;
    int fd = accept(lfd, reinterpret_cast<sockaddr*>(&q.client), &len);
    len = sizeof q.dst;
    getsockname(fd, reinterpret_cast<sockaddr*>(&q.dst), &len);
    auto t0 = Clock::now();
    auto s = fy::fwd::Attributor::find_socket(q);
    diag.add(us_since(t0));
    if (!s) {
      ++wrong;
      close(fd);
      continue;
    }
    t0 = Clock::now();
    pid_t b = bpf.find_owner_bpf(s->cookie);
    owner_bpf.add(us_since(t0));
    t0 = Clock::now();
    pid_t w = proc.find_owner_proc(s->inode);
    walk.add(us_since(t0));
    auto a = bpf.lookup(q);
    full_bpf.add(a.cost_us);
    auto p = proc.lookup(q);
    full_proc.add(p.cost_us);
    if (b != client || w != client || a.who != want || p.who != want ||
        a.via != fy::fwd::Attribution::Via::bpf || p.via != fy::fwd::Attribution::Via::proc)
      ++wrong;
    close(fd);
  }
  if (write(go[1], "xx", 2) != 2) return 1;
  waitpid(holder, nullptr, 0);
  waitpid(client, nullptr, 0);
  rmdir(pod.c_str());
  rmdir(plain.c_str());
  rmdir(base.c_str());
  printf(
      "{\"sockets\":%d,\"connections\":%d,\"wrong\":%d,"
      "\"sock_diag_us\":{\"p50\":%.1f,\"p99\":%.1f},"
      "\"bpf_owner_us\":{\"p50\":%.1f,\"p99\":%.1f},"
      "\"proc_walk_us\":{\"p50\":%.1f,\"p99\":%.1f},"
      "\"lookup_bpf_us\":{\"p50\":%.1f,\"p99\":%.1f},"
      "\"lookup_proc_us\":{\"p50\":%.1f,\"p99\":%.1f}}\n",
      sockets, connections, wrong, diag.pct(.5), diag.pct(.99), owner_bpf.pct(.5),
      owner_bpf.pct(.99), walk.pct(.5), walk.pct(.99), full_bpf.pct(.5), full_bpf.pct(.99),
      full_proc.pct(.5), full_proc.pct(.99));
  return wrong ? 1 : 0;
}

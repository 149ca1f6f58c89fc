#include "forwarder/listener.h"

#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/net.h"
#include "forwarder/worker.h"

namespace fy::fwd {

namespace {
constexpr int kBacklog = 4096;
// Held while a group is checked and bound, so two fy-forwarders starting at
// once cannot both find a port free and then share its group. (Best effort:
// without /run, the check alone.)
constexpr const char* kBindLock = "/run/fy-forwarder.bind.lock";
thread_local log::RateLimit g_accept_log(5, 1000);
}  // namespace

Result<std::unique_ptr<Listener>> Listener::open(const std::vector<Worker*>& workers,
                                                 const Config& cfg, ListenerKind kind, int ns_fd,
                                                 NsId ns, const std::string& ip,
                                                 const std::string& net) {
  std::unique_ptr<Listener> l(new Listener(ns));
  auto common = std::make_shared<Common>();
  common->kind = kind;
  common->net = net;
  common->family = is_ipv6_literal(ip) ? AF_INET6 : AF_INET;
  common->desc = is_ipv6_literal(ip) ? "[" + ip + "]:" : ip + ":";
  common->desc += format_ports(cfg.ports, ",");  // a band as "41000-41089"
  l->common_ = common;
  const bool group = workers.size() > 1;
  auto make = [&]() -> Result<void> {
    Fd lock;
    if (group) {
      lock.reset(::open(kBindLock, O_RDWR | O_CREAT | O_CLOEXEC, 0600));
      if (lock) ::flock(lock.get(), LOCK_EX);
    }
    for (const PortRule& rule : cfg.ports) {
      // A group binds with SO_REUSEPORT, which would join a group another
      // process of this uid holds on the port: look first.
      if (group) FY_TRY(check_port_free(ip, rule.port));
      for (Worker* w : workers) {
        auto fd = listen_tcp(ip, rule.port, kBacklog, group);
        if (!fd) return std::move(fd).take_error();
        if (kind == ListenerKind::bridge) FY_TRY(enable_ingress_ifindex(fd->get(), common->family));
        auto p = std::make_unique<Port>();
        p->common = common;
        p->ctx = &w->ctx();
        p->fd = std::move(*fd);
        p->rule = &rule;
        p->spare.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        l->ports_.emplace_back(w, std::move(p));
      }
    }
    // Every bridge listener judges where its connections came from (a fixed
    // net too: the source check guards `src`).
    if (kind == ListenerKind::bridge) FY_TRY(common->ifmap.open());
    return {};
  };
  if (ns_fd >= 0)
    FY_TRY(run_in_netns(ns_fd, make));
  else
    FY_TRY(make());
  // Only now, with the listener whole: a worker may accept from here on
  // (epoll_ctl on a worker's engine is safe from this thread).
  for (auto& [w, p] : l->ports_) {
    if (!w->ctx().engine->watch(p->fd.get(), EPOLLIN, p.get()))
      return make_error(Errc::io, "epoll: {}", strerror(errno));
  }
  return l;
}

uint64_t Listener::iface_refreshes() const {
  std::lock_guard<std::mutex> g(common_->ifmap_mu);
  return common_->ifmap.refreshes();
}

Listener::~Listener() {
  // A port may be handling an event on its worker right now: the worker
  // unwatches and closes it, between two of its own event batches.
  for (auto& [w, p] : ports_) {
    Port* port = p.release();
    w->post([port] {
      port->ctx->engine->disarm(port);
      port->ctx->engine->unwatch(port->fd.get());
      delete port;
    });
  }
}

void Listener::Port::out_of_fds() {
  if (spare) {
    // Make room for one accept, reset that client, take the spare back.
    spare.reset();
    int victim = ::accept4(fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (victim >= 0) {
      linger l{1, 0};
      setsockopt(victim, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      ::close(victim);
    }
    int err = errno;
    spare.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    // The next event resets the next client; or nobody was waiting.
    if (spare && (victim >= 0 || err == EAGAIN)) return;
  }
  // Someone else took the slot: nothing to reset with. Wait, unwatched.
  paused = true;
  ctx->engine->modify(fd.get(), 0, this);
  ctx->engine->arm(this, kPauseMs);
}

void Listener::Port::on_timer() {
  if (!spare) spare.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  paused = false;
  // EPOLL_CTL_MOD re-checks readiness: clients still waiting raise the event.
  ctx->engine->modify(fd.get(), EPOLLIN, this);
}

void Listener::Port::bridge_ingress(Accepted& a) {
  // The interface the connection arrived on, as the kernel recorded it in the
  // socket: not the one holding the address the client dialled (a client may
  // dial another bridge's address; the redirect's rewritten destination
  // names the ingress link only for what it redirected). One getsockopt a
  // connection, where the destination lookup took a getsockname.
  Common& co = *common;
  const int ifindex = read_ingress_ifindex(a.fd, co.family);
  const auto* peer = reinterpret_cast<const sockaddr*>(&a.peer);
  std::string name;
  {
    std::lock_guard<std::mutex> g(co.ifmap_mu);
    const IfLink* link = ifindex > 0 ? co.ifmap.link(ifindex) : nullptr;
    IngressVerdict v = judge_ingress(ifindex, link, peer);
    if (v != IngressVerdict::ok) {
      a.ingress_refusal = ingress_refusal(v, ifindex, link, sockaddr_ip(peer));
      return;  // not stamped: no net needed
    }
    name = link->name;
  }
  if (co.net != "auto") {
    a.net = co.net;
    return;
  }
  // Interface names may hold bytes the stamp's net may not.
  if (name.size() > 64) name.resize(64);
  for (char& ch : name)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_' || ch == '.' || ch == '-'))
      ch = '_';
  a.net = std::move(name);
}

void Listener::Port::accept_on() {
  if (paused) return;
  const Common& co = *common;
  for (int i = 0; i < 64; ++i) {
    Accepted a;
    socklen_t plen = sizeof a.peer;
    int cfd = ::accept4(fd.get(), reinterpret_cast<sockaddr*>(&a.peer), &plen,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      const int err = errno;
      ++ctx->counters.accept_errors;
      log::limited(
          g_accept_log, log::Level::error, "accept on {}: {}; connections are being reset.{}",
          co.desc, strerror(err),
          err == EMFILE   ? " Raise LimitNOFILE or lower [limits] connections."
          : err == ENFILE ? " The whole VM is out of file descriptors (fs.file-max)."
          : err == ENOBUFS || err == ENOMEM ? " The VM is short of memory."
                                            : "");
      if (err == EMFILE || err == ENFILE) out_of_fds();
      return;
    }
    // Forwarder-wide, reserved before the connection is made (the
    // Connection gives it back when it finishes), so workers accepting at
    // once never pass the limit together.
    if (ctx->shared->active.fetch_add(1, std::memory_order_relaxed) >=
        ctx->cfg->max_connections) {
      ctx->shared->active.fetch_sub(1, std::memory_order_relaxed);
      ++ctx->counters.over_limit;
      linger l{1, 0};
      setsockopt(cfd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      ::close(cfd);
      continue;
    }
    a.fd = cfd;
    a.rule = rule;
    a.kind = co.kind;
    if (co.kind == ListenerKind::vm) {
      a.net = "host";
      // The client's own view of where it connected: before the wall's
      // redirect if there was one (sock_diag needs the client's 4-tuple).
      socklen_t llen = sizeof a.local;
      getsockname(cfd, reinterpret_cast<sockaddr*>(&a.local), &llen);
      std::memcpy(&a.orig_dst, &a.local, sizeof a.local);
      socklen_t olen = sizeof a.orig_dst;
      if (a.local.ss_family == AF_INET) {
        sockaddr_in od{};
        olen = sizeof od;
        if (getsockopt(cfd, SOL_IP, SO_ORIGINAL_DST, &od, &olen) == 0)
          std::memcpy(&a.orig_dst, &od, sizeof od);
      } else {
        sockaddr_in6 od{};
        olen = sizeof od;
        if (getsockopt(cfd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &od, &olen) == 0)
          std::memcpy(&a.orig_dst, &od, sizeof od);
      }
    } else if (rule->stamp) {
      bridge_ingress(a);
    }
    auto* c = new Connection(ctx, std::move(a));
    c->start();
  }
}

}  // namespace fy::fwd

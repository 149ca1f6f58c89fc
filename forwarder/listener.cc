#include "forwarder/listener.h"

#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/net.h"

namespace fy::fwd {

namespace {
constexpr int kBacklog = 4096;
log::RateLimit g_accept_log(5, 1000);
}  // namespace

Result<std::unique_ptr<Listener>> Listener::open(RelayContext* ctx, ListenerKind kind, int ns_fd,
                                                 NsId ns, const std::string& ip,
                                                 const std::string& net) {
  std::unique_ptr<Listener> l(new Listener(ctx, kind, ns, ip, net));
  auto make = [&]() -> Result<void> {
    for (const PortRule& rule : ctx->cfg->ports) {
      auto fd = listen_tcp(ip, rule.port, kBacklog);
      if (!fd) return std::move(fd).take_error();
      auto p = std::make_unique<Port>();
      p->l = l.get();
      p->fd = std::move(*fd);
      p->rule = &rule;
      l->ports_.push_back(std::move(p));
    }
    if (kind == ListenerKind::bridge && net == "auto") FY_TRY(l->ifmap_.open());
    return {};
  };
  if (ns_fd >= 0)
    FY_TRY(run_in_netns(ns_fd, make));
  else
    FY_TRY(make());
  l->spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  for (auto& p : l->ports_) {
    if (!ctx->engine->watch(p->fd.get(), EPOLLIN, p.get()))
      return make_error(Errc::io, "epoll: {}", strerror(errno));
  }
  return l;
}

Listener::~Listener() {
  for (auto& p : ports_) ctx_->engine->unwatch(p->fd.get());
}

std::string Listener::describe() const {
  std::string s = is_ipv6_literal(ip_) ? "[" + ip_ + "]:" : ip_ + ":";
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ports_[i]->rule->port);
  }
  return s;
}

void Listener::accept_on(Port& p) {
  for (int i = 0; i < 64; ++i) {
    Accepted a;
    socklen_t plen = sizeof a.peer;
    int fd = ::accept4(p.fd.get(), reinterpret_cast<sockaddr*>(&a.peer), &plen,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      ++ctx_->counters.accept_errors;
      uint64_t suppressed = 0;
      if (g_accept_log.allow(mono_ms(), &suppressed))
        log::error(
            "accept on {}: {}; connections are being reset ({} similar lines "
            "suppressed). Raise LimitNOFILE or lower [limits] connections.",
            describe(), strerror(errno), suppressed);
      if ((errno == EMFILE || errno == ENFILE) && spare_) {
        // Make room for one accept, reset that client, keep the spare.
        spare_.reset();
        int victim = ::accept4(p.fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (victim >= 0) {
          linger l{1, 0};
          setsockopt(victim, SOL_SOCKET, SO_LINGER, &l, sizeof l);
          ::close(victim);
        }
        spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      }
      return;
    }
    if (ctx_->counters.active >= ctx_->cfg->max_connections) {
      ++ctx_->counters.over_limit;
      linger l{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      ::close(fd);
      continue;
    }
    // The local address matters only to the VM listener (the 4-tuple for
    // sock_diag) and to a bridge listener naming its network by interface:
    // one syscall a connection spared elsewhere.
    if (kind_ == ListenerKind::vm || net_ == "auto") {
      socklen_t llen = sizeof a.local;
      getsockname(fd, reinterpret_cast<sockaddr*>(&a.local), &llen);
    }
    a.fd = fd;
    a.rule = p.rule;
    a.kind = kind_;
    if (kind_ == ListenerKind::vm) {
      a.net = "host";
      // The client's own view of where it connected: before the wall's
      // redirect if there was one (sock_diag needs the client's 4-tuple).
      std::memcpy(&a.orig_dst, &a.local, sizeof a.local);
      socklen_t olen = sizeof a.orig_dst;
      if (a.local.ss_family == AF_INET) {
        sockaddr_in od{};
        olen = sizeof od;
        if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &od, &olen) == 0)
          std::memcpy(&a.orig_dst, &od, sizeof od);
      } else {
        sockaddr_in6 od{};
        olen = sizeof od;
        if (getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &od, &olen) == 0)
          std::memcpy(&a.orig_dst, &od, sizeof od);
      }
    } else if (net_ == "auto") {
      a.net = ifmap_.name_for(sockaddr_ip(reinterpret_cast<sockaddr*>(&a.local)));
      if (a.net.empty()) a.net = "unknown";
      // Interface names may hold bytes the stamp's net may not.
      if (a.net.size() > 64) a.net.resize(64);
      for (char& ch : a.net)
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
          ch = '_';
    } else {
      a.net = net_;
    }
    auto* c = new Connection(ctx_, std::move(a));
    c->start();
  }
}

}  // namespace fy::fwd

#include "wall/dnsfwd/server.h"

#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "core/clock.h"
#include "core/json.h"
#include "core/loop.h"
#include "core/net.h"
#include "core/netns_path.h"
#include "wall/dnsfwd/owner.h"
#include "wall/dnsfwd/redirect.h"

namespace fy::dnsfwd {

struct Server::Listener {
  Server* srv = nullptr;
  Listen cfg;
  std::string where;  // "127.42.0.53:53 (vm)"
  uv_udp_t udp{};
  uv_tcp_t tcp{};
  bool udp_open = false, tcp_open = false;  // opened, until its close callback ran
  SocketOwner owner;  // sock_diag in the listener's namespace
  // follow: the inode of the namespace it listens in (0: none yet), and when
  // a namespace it could not open there may be tried again.
  uint64_t ns_ino = 0;
  uint64_t failed_ino = 0, retry_ms = 0;
  // follow: a pattern that matches several entries, said once.
  LocateNotice unlocated;
};

struct Server::Upstream {
  Server* srv = nullptr;
  HostPort addr;
  std::string text;
  uv_udp_t udp{};
  bool open = false;
  uint64_t failures_logged_ms = 0;
};

struct Server::TcpClient {
  Server* srv = nullptr;
  Listener* l = nullptr;
  uint64_t id = 0;
  uv_tcp_t tcp{};
  uv_timer_t idle{};
  TcpFramer framer{wall::dns::kMaxQuery};
  sockaddr_storage peer{};
  sockaddr_storage orig_dst{};  // where the client connected, before the wall's DNAT
  int inflight = 0;
  UpConn* up = nullptr;  // the connection upstream its queries go on (not owned; see UpConn)
  uv::CloseCounter closes;
  bool closing = false;
  uint8_t rbuf[4096];
};

// A TCP connection upstream, carrying the queries of one client connection
// (RFC 7766's reuse and pipelining: each query framed, answers matched by
// their id, in any order). It is open while its client is (`owner`) or while
// it carries a query (`ids`); close_upconn() is called once neither holds.
// A connection that fails, or has a query time out, is retired: detached from
// its owner (the client's next query opens a new one), its other queries
// carried on or failed, and closed when it carries none.
struct Server::UpConn {
  Server* srv = nullptr;
  TcpClient* owner = nullptr;  // null once retired or its client has closed
  size_t upstream = 0;
  std::vector<uint16_t> ids;    // the queries it carries: keys in pending_
  std::vector<uint16_t> stale;  // its queries that timed out: a late answer is dropped
  uv_tcp_t tcp{};
  uv_connect_t connect{};
  TcpFramer framer{kTcpAnswerMax};
  bool reused = false;  // it has carried an answer
  bool connected = false;
  bool closing = false;
};

struct Server::Pending {
  Listener* l = nullptr;
  bool tcp = false;  // asked over TCP, so upstream over TCP too (`up`)
  UpConn* up = nullptr;
  bool resent = false;  // sent again on a fresh connection once (a reused one closed under it)
  sockaddr_storage client{};
  uint64_t conn = 0;
  uint16_t client_id = 0;
  std::vector<uint8_t> sent;  // the query as sent upstream (our id)
  wall::dns::Query q;
  size_t limit = 512;
  uint64_t start_us = 0;
  uint64_t deadline_ms = 0;
  size_t upstream = 0;
  std::string src;
  std::optional<uint32_t> uid;
};

namespace {

struct WriteReq {
  uv_write_t req{};
  std::vector<uint8_t> bytes;
};

// Writes `msg` on `s` as one DNS-over-TCP message (its two-byte length, then
// the bytes), from a copy freed when the write completes; the libuv error, or 0.
int write_framed(uv_stream_t* s, std::span<const uint8_t> msg) {
  auto* w = new WriteReq;
  w->bytes.reserve(msg.size() + 2);
  w->bytes.push_back(static_cast<uint8_t>(msg.size() >> 8));
  w->bytes.push_back(static_cast<uint8_t>(msg.size()));
  w->bytes.insert(w->bytes.end(), msg.begin(), msg.end());
  uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(w->bytes.data()), w->bytes.size());
  int rc = uv_write(&w->req, s, &b, 1,
                    [](uv_write_t* r, int) { delete reinterpret_cast<WriteReq*>(r); });
  if (rc != 0) delete w;
  return rc;
}

// Runs `fn` inside the network namespace at `path` ("" for the caller's own)
// on a short-lived thread, so this thread's namespace never changes: the
// upstream sockets are always the daemon's own. A thread `fn` starts, and so
// an nft::Ctx it opens, is in that namespace too (core/nft.h).
Result<void> in_netns(const std::string& path, const std::function<Result<void>()>& fn) {
  if (path.empty()) return fn();
  Result<void> out;
  std::thread t([&] {
    int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
      out = make_error(Errc::not_found, "cannot open the namespace {}: {} — start the VM's "
                       "network (or the rootless network namespace) first", path, strerror(errno));
      return;
    }
    int rc = setns(ns, CLONE_NEWNET);
    int err = errno;
    ::close(ns);
    if (rc != 0) {
      out = make_error(Errc::permission, "cannot join the namespace {}: {} — fy-dnsfwd runs "
                       "as root (CAP_SYS_ADMIN)", path, strerror(err));
      return;
    }
    out = fn();
  });
  t.join();
  return out;
}

// Makes a socket of `type` bound to `hp` inside the namespace `netns` (""
// for the caller's own).
Result<int> bound_socket(const std::string& netns, const HostPort& hp, int type) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (!make_sockaddr(hp.host, hp.port, &ss, &len))
    return make_error(Errc::invalid_argument, "{} is not an IP address", hp.host);
  int out = -1;
  FY_TRY(in_netns(netns, [&]() -> Result<void> {
    int fd = socket(ss.ss_family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return make_error(Errc::io, "socket: {}", strerror(errno));
    int one = 1;
    // TCP only: on UDP, SO_REUSEADDR would let a second socket share the port.
    if (type == SOCK_STREAM) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET) setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
    if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      int err = errno;
      ::close(fd);
      return make_error(err == EADDRINUSE ? Errc::refused : Errc::io,
                        "cannot bind {}: {} — {}", hp.authority(), strerror(err),
                        err == EADDRINUSE ? "another resolver holds the address; give fy-dnsfwd "
                                            "an address of its own (e.g. 127.42.0.53)"
                                          : "check the address exists in that namespace");
    }
    out = fd;
    return ok();
  }));
  return out;
}

// Installs the bridge redirect for `l` inside the namespace `ns_path` names
// (l.netns, or /proc/self/fd/N of one held open).
Result<void> redirect_in(const Listen& l, const std::string& ns_path) {
  auto out = in_netns(ns_path, [&] { return install_bridge_redirect(l); });
  if (!out)
    return make_error(out.error().code, "listen {}: {}", l.address.authority(),
                      out.error().message);
  return out;
}

std::string sa_text(const sockaddr* sa) { return sockaddr_string(sa); }

// Opens `owner`'s sock_diag socket inside `netns` ("" = here).
Result<void> open_owner(const std::string& netns, SocketOwner& owner) {
  return in_netns(netns, [&] { return owner.open(); });
}

}  // namespace

Server::Server(uv_loop_t* loop, Config cfg, int log_fd)
    : loop_(loop),
      cfg_(std::move(cfg)),
      log_fd_(log_fd),
      rate_(cfg_.policy.rate, cfg_.policy.burst, cfg_.policy.max_sources),
      rng_(std::random_device{}()),
      rbuf_(65536) {}

Server::~Server() { assert(!started_ || closed_); }

Result<void> Server::start() {
  started_ = true;
  uv_timer_init(loop_, &sweep_);
  sweep_.data = this;
  uv_timer_start(&sweep_, [](uv_timer_t* t) { static_cast<Server*>(t->data)->sweep(); }, 100, 100);
  for (const HostPort& hp : cfg_.upstream) {
    auto u = std::make_unique<Upstream>();
    u->srv = this;
    u->addr = hp;
    u->text = hp.authority();
    HostPort any{hp.is_ipv6() ? "::" : "0.0.0.0", 0};
    auto fd = bound_socket("", any, SOCK_DGRAM);
    if (!fd) return std::move(fd).take_error();
    uv_udp_init(loop_, &u->udp);
    u->udp.data = u.get();
    u->open = true;
    Upstream* raw = u.get();
    upstreams_.push_back(std::move(u));
    FY_TRY(uv::check(uv_udp_open(&raw->udp, *fd), "upstream socket"));
    sockaddr_storage ss{};
    socklen_t len;
    make_sockaddr(hp.host, hp.port, &ss, &len);
    int rc = uv_udp_connect(&raw->udp, reinterpret_cast<sockaddr*>(&ss));
    if (rc != 0) {
      return make_error(Errc::connect, "the upstream {}: {} — check the VM's route to its resolver",
                        raw->text, uv::error_string(rc));
    }
    FY_TRY(uv::check(
        uv_udp_recv_start(
            &raw->udp,
            [](uv_handle_t* h, size_t, uv_buf_t* b) {
              auto* s = static_cast<Upstream*>(h->data)->srv;
              *b = uv_buf_init(reinterpret_cast<char*>(s->rbuf_.data()), s->rbuf_.size());
            },
            [](uv_udp_t* h, ssize_t n, const uv_buf_t* b, const sockaddr* from, unsigned) {
              auto* up = static_cast<Upstream*>(h->data);
              up->srv->on_upstream(up, n, b, from);
            }),
        "upstream recv"));
  }
  for (const Listen& lc : cfg_.listen) {
    auto l = std::make_unique<Listener>();
    l->srv = this;
    l->cfg = lc;
    l->where = fmt::format("{} ({})", lc.address.authority(), lc.name);
    Listener* raw = l.get();
    listeners_.push_back(std::move(l));
    if (lc.follow) {
      follow(raw);
      if (!raw->ns_ino) {
        log::info("listen {}: waiting for the namespace {} (it appears with the first "
                  "container on the rootless bridge); until then that bridge's DNS meets the "
                  "VM's redirect", raw->where, lc.netns);
      }
      continue;
    }
    FY_TRY(open_listener(raw, lc.netns));
  }
  return ok();
}

Result<void> Server::open_listener(Listener* raw, const std::string& ns_path) {
  const Listen& lc = raw->cfg;
  auto ufd = bound_socket(ns_path, lc.address, SOCK_DGRAM);
  if (ufd && cfg_.log_uid) {
    if (auto o = open_owner(ns_path, raw->owner); !o)
      log::warn("listen {}: {} — its queries are logged without their uid", raw->where,
                o.error().message);
  }
  if (!ufd) return make_error(ufd.error().code, "listen {}: {}", raw->where, ufd.error().message);
  uv_udp_init(loop_, &raw->udp);
  raw->udp.data = raw;
  raw->udp_open = true;
  FY_TRY(uv::check(uv_udp_open(&raw->udp, *ufd), "listen udp"));
  FY_TRY(uv::check(
      uv_udp_recv_start(
          &raw->udp,
          [](uv_handle_t* h, size_t, uv_buf_t* b) {
            auto* s = static_cast<Listener*>(h->data)->srv;
            *b = uv_buf_init(reinterpret_cast<char*>(s->rbuf_.data()), s->rbuf_.size());
          },
          [](uv_udp_t* h, ssize_t n, const uv_buf_t* b, const sockaddr* from, unsigned fl) {
            auto* lst = static_cast<Listener*>(h->data);
            lst->srv->on_udp(lst, n, b, from, fl);
          }),
      "listen udp recv"));
  auto tfd = bound_socket(ns_path, lc.address, SOCK_STREAM);
  if (!tfd) return make_error(tfd.error().code, "listen {}: {}", raw->where, tfd.error().message);
  uv_tcp_init(loop_, &raw->tcp);
  raw->tcp.data = raw;
  raw->tcp_open = true;
  FY_TRY(uv::check(uv_tcp_open(&raw->tcp, *tfd), "listen tcp"));
  int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&raw->tcp), 128, [](uv_stream_t* s, int st) {
    auto* lst = static_cast<Listener*>(s->data);
    if (st == 0) lst->srv->on_accept(lst);
  });
  if (rc != 0) {
    return make_error(Errc::io, "listen {} tcp: {}", raw->where, uv::error_string(rc));
  }
  log::info("listening on {} udp+tcp", raw->where);
  if (lc.redirect) {
    FY_TRY(redirect_in(lc, ns_path));
    log::info("{}: port 53 redirected to {} (table ip {})", lc.netns, lc.address.authority(),
              kRedirectTable);
  }
  return ok();
}

void Server::close_listener(Listener* l) {
  // Its clients and the queries it waits on go with it (their sockets are
  // in the namespace that went); the object stays until sweep() finds
  // nothing pointing at it.
  std::vector<TcpClient*> cs;
  for (auto& [id, c] : clients_)
    if (c->l == l) cs.push_back(c);
  for (TcpClient* c : cs) close_client(c);
  for (auto it = pending_.begin(); it != pending_.end();)
    it = it->second.l == l ? erase_pending(it) : std::next(it);
  auto done_udp = [](uv_handle_t* h) { static_cast<Listener*>(h->data)->udp_open = false; };
  auto done_tcp = [](uv_handle_t* h) { static_cast<Listener*>(h->data)->tcp_open = false; };
  if (l->udp_open && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&l->udp)))
    uv_close(reinterpret_cast<uv_handle_t*>(&l->udp), done_udp);
  if (l->tcp_open && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&l->tcp)))
    uv_close(reinterpret_cast<uv_handle_t*>(&l->tcp), done_tcp);
}

Server::Listener* Server::retire_listener(Listener* l) {
  close_listener(l);
  auto fresh = std::make_unique<Listener>();
  fresh->srv = this;
  fresh->cfg = l->cfg;
  fresh->where = l->where;
  for (auto& slot : listeners_) {
    if (slot.get() != l) continue;
    retired_.push_back(std::move(slot));
    slot = std::move(fresh);
    return slot.get();
  }
  assert(false && "retire_listener: not one of listeners_");
  return l;
}

void Server::follow(Listener*& l) {
  // The namespace now at the path: its inode, or 0 when there is none (a
  // path podman left behind unmounted is a plain file, not a namespace; a
  // pause process not started yet; nothing matching the pattern).
  auto located = locate_netns(l->cfg.netns, l->cfg.mount_ns_pid_file);
  if (std::string several = l->unlocated.update(located); !several.empty())
    log::warn("listen {}: {}; the namespace is not followed until only one matches", l->where,
              several);
  Result<NsHandle> ns = located ? open_netns(*located) : Result<NsHandle>(located.error());
  uint64_t ino = ns ? static_cast<uint64_t>(ns->id.ino) : 0;
  if (ino == l->ns_ino || (ino != 0 && ino == l->failed_ino && mono_ms() < l->retry_ms)) return;
  if (l->ns_ino) {
    // The namespace it listened in went (or another took the path): the
    // listener is retired, a fresh one takes its place in listeners_.
    log::info("listen {}: the namespace {} (inode {}) {}", l->where, l->cfg.netns, l->ns_ino,
              ino ? "was made again: moving to the new one" : "went away: listener closed");
    l = retire_listener(l);
  }
  if (!ino) return;
  // The namespace is held open while its sockets and redirect are made, and
  // named through this descriptor, so every one of them is in the same one
  // even if the path is re-bound meanwhile.
  auto opened = open_listener(l, fmt::format("/proc/self/fd/{}", ns->fd.get()));
  if (!opened) {
    log::error("{} — tried again in 5 s, or when the namespace is made again",
               opened.error().message);
    l = retire_listener(l);  // what it opened is closed; the next try starts afresh
    l->failed_ino = ino;
    l->retry_ms = mono_ms() + 5000;
    return;
  }
  l->ns_ino = ino;
  log::info("listen {}: following the namespace {} (inode {}{})", l->where, l->cfg.netns, ino,
            *located == l->cfg.netns ? std::string() : ", at " + *located);
}

void Server::close() {
  if (closed_) return;
  closed_ = true;
  if (started_) uv::close(&sweep_, nullptr);
  for (auto& l : listeners_) close_listener(l.get());
  for (auto& u : upstreams_) {
    if (u->open) uv::close(&u->udp, nullptr);
  }
  std::vector<TcpClient*> cs;
  for (auto& [id, c] : clients_) cs.push_back(c);
  for (TcpClient* c : cs) close_client(c);
  for (auto it = pending_.begin(); it != pending_.end();) it = erase_pending(it);
}

std::string Server::reload(Config next) {
  std::string kept = needs_restart(cfg_, next);
  next.listen = std::move(cfg_.listen);
  next.upstream = std::move(cfg_.upstream);
  next.log = std::move(cfg_.log);
  rate_.set_limits(next.policy.rate, next.policy.burst, next.policy.max_sources);
  cfg_ = std::move(next);
  return kept;
}

void Server::on_udp(Listener* l, ssize_t n, const uv_buf_t* buf, const sockaddr* from,
                    unsigned) {
  if (n <= 0 || !from) {
    if (n < 0) log::warn("listen {} udp: {}", l->where, uv::error_string(static_cast<int>(n)));
    return;
  }
  std::span<const uint8_t> wire(reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(n));
  handle(l, false, from, nullptr, wire);
}

void Server::handle(Listener* l, bool tcp, const sockaddr* from, TcpClient* c,
                    std::span<const uint8_t> wire) {
  const std::string ip = sockaddr_ip(from);
  const std::string src = sa_text(from);
  Verdict v = judge(wire, ip, mono_ms(), cfg_.policy, rate_);
  switch (v.action) {
    case Action::drop: {
      if (std::strcmp(v.verdict, "rate-limited") == 0)
        ++stats_.rate_limited;
      else if (std::strcmp(v.verdict, "too-large") == 0)
        ++stats_.too_large;
      else
        ++stats_.malformed;
      uint64_t suppressed = 0;
      if (drop_log_.allow(mono_ms(), &suppressed)) {
        stats_.log_suppressed += suppressed;
        log_line(l->cfg.name, tcp, src, &v, v.parsed ? &v.query : nullptr, v.verdict, v.reason,
                 -1, "", -1);
      }
      // Not DNS (or not DNS we take): a TCP client is no DNS client; close it.
      if (tcp && c && std::strcmp(v.verdict, "rate-limited") != 0) close_client(c);
      return;
    }
    case Action::answer:
      ++stats_.refused;
      log_line(l->cfg.name, tcp, src, &v, &v.query, v.verdict, v.reason, 5, "", -1,
               asker_uid(l, tcp, from, c));
      reply_to(l, tcp, from, c ? c->id : 0, v.answer);
      return;
    case Action::forward:
      break;
  }
  if (pending_.size() >= cfg_.max_pending || upstreams_.empty()) {
    ++stats_.overloaded;
    auto a = wall::dns::local_answer(wire, v.query, 2);
    log_line(l->cfg.name, tcp, src, &v, &v.query, "overloaded", "too many queries upstream", 2,
             "", -1);
    reply_to(l, tcp, from, c ? c->id : 0, a);
    return;
  }
  uint16_t id;
  do {
    id = static_cast<uint16_t>(rng_());
  } while (pending_.count(id));
  Pending p;
  p.l = l;
  p.tcp = tcp;
  std::memcpy(&p.client, from,
              from->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  p.conn = c ? c->id : 0;
  p.client_id = v.query.id;
  p.sent.assign(wire.begin(), wire.end());
  p.sent[0] = static_cast<uint8_t>(id >> 8);
  p.sent[1] = static_cast<uint8_t>(id);
  p.q = std::move(v.query);
  p.limit = tcp ? kTcpAnswerMax : udp_answer_limit(wire, p.q);
  p.start_us = mono_us();
  p.deadline_ms = mono_ms() + cfg_.timeout_ms;
  p.upstream = next_upstream_++ % upstreams_.size();
  p.src = src;
  Upstream* u = upstreams_[p.upstream].get();
  if (!tcp) {
    uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(p.sent.data()), p.sent.size());
    int rc = uv_udp_try_send(&u->udp, &b, 1, nullptr);
    if (rc < 0) {
      ++stats_.upstream_bad;
      auto a = wall::dns::local_answer(wire, p.q, 2);
      log_line(l->cfg.name, tcp, src, nullptr, &p.q, "upstream-error",
               fmt::format("sending to {}: {}", u->text, uv::error_string(rc)), 2, u->text, -1);
      reply_to(l, tcp, from, p.conn, a);
      return;
    }
  }
  if (c) ++c->inflight;
  ++stats_.forwarded;
  // Asked while the query is upstream: the loop waits for the answer anyway.
  p.uid = asker_uid(l, tcp, from, c);
  auto it = pending_.emplace(id, std::move(p)).first;
  if (tcp) upstream_tcp(it, c);  // may answer SERVFAIL at once (a connect that fails now)
}

void Server::upstream_tcp(PendingIt it, TcpClient* client) {
  UpConn* c = client ? client->up : nullptr;
  if (c != nullptr) {
    carry(c, it);
    if (c->connected) send_query(c, it->second);  // else on_upconn_connect sends it
    return;
  }
  c = new UpConn;
  c->srv = this;
  c->upstream = it->second.upstream;
  c->owner = client;
  if (client) client->up = c;
  uv_tcp_init(loop_, &c->tcp);  // no socket yet: the connect makes it, in this (the daemon's) namespace
  c->tcp.data = c;
  c->connect.data = c;
  carry(c, it);
  Upstream* u = upstreams_[c->upstream].get();
  sockaddr_storage ss{};
  socklen_t len = 0;
  make_sockaddr(u->addr.host, u->addr.port, &ss, &len);  // checked when the config was read
  int rc = uv_tcp_connect(&c->connect, &c->tcp, reinterpret_cast<sockaddr*>(&ss),
                          [](uv_connect_t* r, int st) {
                            auto* uc = static_cast<UpConn*>(r->data);
                            uc->srv->on_upconn_connect(uc, st);
                          });
  if (rc != 0) upconn_failed(c, "upstream-error", fmt::format("connecting over tcp: {}", uv::error_string(rc)));
}

bool Server::send_query(UpConn* c, const Pending& p) {
  int rc = write_framed(reinterpret_cast<uv_stream_t*>(&c->tcp), p.sent);
  if (rc == 0) return true;
  upconn_failed(c, "upstream-error", fmt::format("sending over tcp: {}", uv::error_string(rc)));
  return false;
}

void Server::carry(UpConn* c, PendingIt it) {
  it->second.up = c;
  it->second.upstream = c->upstream;
  c->ids.push_back(it->first);
  ++stats_.upstream_tcp;
}

void Server::on_upconn_connect(UpConn* c, int status) {
  if (c->closing) return;  // closed meanwhile (UV_ECANCELED)
  if (status != 0) {
    upconn_failed(c, "upstream-error", fmt::format("connecting over tcp: {}", uv::error_string(status)));
    return;
  }
  c->connected = true;
  // What was asked while it connected, in order.
  const std::vector<uint16_t> ids = c->ids;
  for (uint16_t id : ids)
    if (!send_query(c, pending_.at(id))) return;
  int rc = uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->tcp),
      [](uv_handle_t* h, size_t, uv_buf_t* b) {
        auto* s = static_cast<UpConn*>(h->data)->srv;
        *b = uv_buf_init(reinterpret_cast<char*>(s->rbuf_.data()), s->rbuf_.size());
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        auto* uc = static_cast<UpConn*>(s->data);
        uc->srv->on_upconn_read(uc, n, b);
      });
  if (rc != 0) upconn_failed(c, "upstream-error", fmt::format("reading over tcp: {}", uv::error_string(rc)));
}

void Server::on_upconn_read(UpConn* c, ssize_t n, const uv_buf_t* buf) {
  if (c->closing || n == 0) return;
  if (n < 0) {
    if (c->ids.empty()) {  // the upstream closed an idle connection: the next query opens another
      close_upconn(c);
      return;
    }
    upconn_failed(c, "upstream-error",
                  n == UV_EOF ? std::string("the upstream closed the TCP connection before its answer")
                              : fmt::format("reading over tcp: {}", uv::error_string(static_cast<int>(n))));
    return;
  }
  auto fed = c->framer.feed({reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(n)});
  if (!fed) {
    upconn_failed(c, "upstream-bad", fmt::format("its TCP framing: {}", fed.error().message));
    return;
  }
  for (auto m = c->framer.next(); !m.empty() && !c->closing; m = c->framer.next()) {
    const uint16_t id = m.size() >= 2 ? static_cast<uint16_t>((m[0] << 8) | m[1]) : 0;
    auto live = std::find(c->ids.begin(), c->ids.end(), id);
    if (live != c->ids.end()) {
      c->reused = true;
      answer_from(pending_.find(id), m);
    } else if (std::find(c->stale.begin(), c->stale.end(), id) != c->stale.end()) {
      continue;  // the late answer to a query that timed out
    } else if (c->ids.size() == 1) {
      retire_upconn(c);  // its framing may be lost: closed with this query
      answer_from(pending_.find(c->ids.front()), m);  // check_response says how it differs
    } else {
      upconn_failed(c, "upstream-bad", "an answer's id is none of the connection's queries");
      return;
    }
  }
}

void Server::retire_upconn(UpConn* c) {
  if (c->owner && c->owner->up == c) c->owner->up = nullptr;
  c->owner = nullptr;
}

void Server::upconn_failed(UpConn* c, const char* verdict, const std::string& why) {
  retire_upconn(c);
  Upstream* u = upstreams_[c->upstream].get();
  const uint64_t now = mono_ms();
  // A reused connection the upstream closed under its queries (its idle
  // close crossing them): each is sent once more, on a fresh connection.
  const bool resend = c->reused && std::strcmp(verdict, "upstream-error") == 0;
  const std::vector<uint16_t> ids = c->ids;
  for (uint16_t id : ids) {
    auto it = pending_.find(id);
    Pending& p = it->second;
    if (resend && !p.resent) {
      p.resent = true;
      c->ids.erase(std::find(c->ids.begin(), c->ids.end(), id));
      auto ci = clients_.find(p.conn);
      upstream_tcp(it, ci != clients_.end() ? ci->second : nullptr);
      continue;
    }
    ++stats_.upstream_bad;
    if (now - u->failures_logged_ms >= 1000) {
      u->failures_logged_ms = now;
      log::error("upstream {}: {} — check the VM's resolver (resolv.conf, Lima's "
                 "192.168.5.3) serves TCP; clients get SERVFAIL meanwhile", u->text, why);
    }
    servfail(it, verdict, why);
  }
  close_upconn(c);
}

void Server::close_upconn(UpConn* c) {
  if (c->closing) return;
  c->closing = true;
  retire_upconn(c);
  // A connect or write still under way is called back (UV_ECANCELED) before this.
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp),
           [](uv_handle_t* h) { delete static_cast<UpConn*>(h->data); });
}

Server::PendingIt Server::erase_pending(PendingIt it) {
  if (UpConn* c = it->second.up) {
    auto at = std::find(c->ids.begin(), c->ids.end(), it->first);
    if (at != c->ids.end()) c->ids.erase(at);
    if (c->ids.empty() && c->owner == nullptr) close_upconn(c);
  }
  return pending_.erase(it);
}

Server::PendingIt Server::servfail(PendingIt it, const char* verdict, const std::string& why) {
  Pending& p = it->second;
  std::vector<uint8_t> a = wall::dns::local_answer(p.sent, p.q, 2);
  a[0] = static_cast<uint8_t>(p.client_id >> 8);
  a[1] = static_cast<uint8_t>(p.client_id);
  log_line(p.l->cfg.name, p.tcp, p.src, nullptr, &p.q, verdict, why, 2,
           upstreams_[p.upstream]->text, static_cast<double>(mono_us() - p.start_us) / 1000.0,
           p.uid);
  reply(p, a);
  return erase_pending(it);
}

Server::PendingIt Server::answer_from(PendingIt it, std::span<const uint8_t> resp) {
  Pending& p = it->second;
  auto out = check_response(resp, p.sent, p.q, p.client_id, p.limit);
  if (!out) {
    ++stats_.upstream_bad;
    return servfail(it, "upstream-bad", out.error().message);
  }
  ++stats_.answered;
  log_line(p.l->cfg.name, p.tcp, p.src, nullptr, &p.q, "forwarded", "", (*out)[3] & 0xF,
           upstreams_[p.upstream]->text, static_cast<double>(mono_us() - p.start_us) / 1000.0,
           p.uid);
  reply(p, *out);
  return erase_pending(it);
}

std::optional<uint32_t> Server::asker_uid(Listener* l, bool tcp, const sockaddr* from,
                                          TcpClient* c) {
  if (!cfg_.log_uid) return std::nullopt;
  if (tcp) {
    const sockaddr* orig = c && c->orig_dst.ss_family ? reinterpret_cast<sockaddr*>(&c->orig_dst)
                                                      : nullptr;
    return l->owner.uid_of(IPPROTO_TCP, from, orig);
  }
  // A UDP client is most often connected to the resolver its resolv.conf
  // names, which is the upstream; an unconnected one matches any peer.
  sockaddr_storage up{};
  socklen_t len = 0;
  const HostPort& u = cfg_.upstream.front();
  if (!make_sockaddr(u.host, 53, &up, &len)) return l->owner.uid(IPPROTO_UDP, from);
  return l->owner.uid_of(IPPROTO_UDP, from, reinterpret_cast<sockaddr*>(&up));
}

void Server::on_upstream(Upstream* u, ssize_t n, const uv_buf_t* buf, const sockaddr*) {
  if (n < 0) {
    // An ICMP error on the connected socket (port unreachable: nothing serves
    // DNS there). Which query it was about is not said, so every query
    // waiting on this upstream gets SERVFAIL now rather than at its deadline;
    // say why once a second.
    uint64_t now = mono_ms();
    if (now - u->failures_logged_ms >= 1000) {
      u->failures_logged_ms = now;
      log::error("upstream {}: {} — check the VM's resolver (resolv.conf, Lima's 192.168.5.3)",
                 u->text, uv::error_string(static_cast<int>(n)));
    }
    // Only the queries sent over UDP: a TCP one has its own connection.
    const std::string why = uv::error_string(static_cast<int>(n));
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      if (p.tcp || upstreams_[p.upstream].get() != u) {
        ++it;
        continue;
      }
      ++stats_.upstream_bad;
      it = servfail(it, "upstream-error", why);
    }
    return;
  }
  if (n < 12) return;
  std::span<const uint8_t> resp(reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(n));
  const uint16_t id = static_cast<uint16_t>((resp[0] << 8) | resp[1]);
  auto it = pending_.find(id);
  // late, stray, or the id of a query sent over TCP
  if (it == pending_.end() || it->second.tcp || upstreams_[it->second.upstream].get() != u) return;
  answer_from(it, resp);
}

void Server::reply(Pending& p, std::span<const uint8_t> bytes) {
  if (p.tcp) {
    auto ci = clients_.find(p.conn);
    if (ci != clients_.end()) --ci->second->inflight;
  }
  reply_to(p.l, p.tcp, reinterpret_cast<const sockaddr*>(&p.client), p.conn, bytes);
}

void Server::reply_to(Listener* l, bool tcp, const sockaddr* to, uint64_t conn,
                      std::span<const uint8_t> bytes) {
  if (!tcp) {
    if (!l->udp_open || uv_is_closing(reinterpret_cast<uv_handle_t*>(&l->udp))) return;
    uv_buf_t b = uv_buf_init(const_cast<char*>(reinterpret_cast<const char*>(bytes.data())),
                             bytes.size());
    (void)uv_udp_try_send(&l->udp, &b, 1, to);  // a full socket buffer drops it, as UDP does
    return;
  }
  auto ci = clients_.find(conn);
  if (ci == clients_.end() || ci->second->closing) return;
  (void)write_framed(reinterpret_cast<uv_stream_t*>(&ci->second->tcp), bytes);  // a write that fails is dropped
}

void Server::on_accept(Listener* l) {
  auto* c = new TcpClient;
  c->srv = this;
  c->l = l;
  c->id = next_client_++;
  c->framer = TcpFramer(cfg_.policy.max_query);
  uv_tcp_init(loop_, &c->tcp);
  c->tcp.data = c;
  uv_timer_init(loop_, &c->idle);
  c->idle.data = c;
  clients_.emplace(c->id, c);
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&l->tcp), reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0) {
    close_client(c);
    return;
  }
  if (clients_.size() > cfg_.max_tcp_clients) {
    ++stats_.tcp_refused;
    close_client(c);
    return;
  }
  ++stats_.tcp_clients;
  int len = sizeof c->peer;
  uv_tcp_getpeername(&c->tcp, reinterpret_cast<sockaddr*>(&c->peer), &len);
  uv_os_fd_t fd;
  socklen_t olen = sizeof(sockaddr_in);
  if (c->peer.ss_family == AF_INET && uv_fileno(reinterpret_cast<uv_handle_t*>(&c->tcp), &fd) == 0)
    (void)getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &c->orig_dst, &olen);  // none: stays AF_UNSPEC
  uv_timer_start(&c->idle, [](uv_timer_t* t) {
    auto* cl = static_cast<TcpClient*>(t->data);
    cl->srv->close_client(cl);
  }, cfg_.tcp_idle_ms, 0);
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->tcp),
      [](uv_handle_t* h, size_t, uv_buf_t* b) {
        auto* cl = static_cast<TcpClient*>(h->data);
        *b = uv_buf_init(reinterpret_cast<char*>(cl->rbuf), sizeof cl->rbuf);
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        auto* cl = static_cast<TcpClient*>(s->data);
        cl->srv->on_tcp_read(cl, n, b);
      });
}

void Server::on_tcp_read(TcpClient* c, ssize_t n, const uv_buf_t* buf) {
  if (n == 0) return;
  if (n < 0) {
    close_client(c);
    return;
  }
  auto fed = c->framer.feed({reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(n)});
  if (!fed) {
    ++stats_.malformed;
    uint64_t suppressed = 0;
    if (drop_log_.allow(mono_ms(), &suppressed)) {
      stats_.log_suppressed += suppressed;
      log_line(c->l->cfg.name, true, sa_text(reinterpret_cast<sockaddr*>(&c->peer)), nullptr,
               nullptr, "malformed", fed.error().message, -1, "", -1);
    }
    close_client(c);
    return;
  }
  uv_timer_again(&c->idle);
  const uint64_t id = c->id;
  for (auto m = c->framer.next(); !m.empty(); m = c->framer.next()) {
    if (c->inflight >= 16) {  // a client that never reads its answers
      close_client(c);
      return;
    }
    handle(c->l, true, reinterpret_cast<sockaddr*>(&c->peer), c, m);
    if (!clients_.count(id) || c->closing) return;  // handle() closed it
  }
}

void Server::close_client(TcpClient* c) {
  if (c->closing) return;
  c->closing = true;
  clients_.erase(c->id);
  if (UpConn* u = c->up) {  // its queries upstream carry on (answered into the void, or time out)
    retire_upconn(u);
    if (u->ids.empty()) close_upconn(u);
  }
  auto done = [](uv_handle_t* h) {
    auto* cl = static_cast<TcpClient*>(h->data);
    if (cl->closes.finished_one()) delete cl;
  };
  c->closes.started();
  c->closes.started();
  uv_close(reinterpret_cast<uv_handle_t*>(&c->idle), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), done);
}

void Server::sweep() {
  const uint64_t now = mono_ms();
  for (auto& slot : listeners_) {
    Listener* l = slot.get();
    if (l->cfg.follow) follow(l);
  }
  // A retired listener is freed once its handles are closed and no query or
  // client points at it.
  for (auto it = retired_.begin(); it != retired_.end();) {
    Listener* l = it->get();
    bool used = l->udp_open || l->tcp_open;
    for (auto& [id, p] : pending_) used = used || p.l == l;
    for (auto& [id, c] : clients_) used = used || c->l == l;
    it = used ? std::next(it) : retired_.erase(it);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    if (p.deadline_ms > now) {
      ++it;
      continue;
    }
    ++stats_.upstream_timeouts;
    Upstream* u = upstreams_[p.upstream].get();
    if (now - u->failures_logged_ms >= 1000) {
      u->failures_logged_ms = now;
      log::error("upstream {} did not answer within {} ms — check the VM's resolver "
                 "(resolv.conf, Lima's 192.168.5.3); clients get SERVFAIL meanwhile",
                 u->text, cfg_.timeout_ms);
    }
    if (UpConn* c = p.up) {  // a connection that let a query time out takes no more
      retire_upconn(c);
      c->stale.push_back(it->first);
    }
    it = servfail(it, "upstream-timeout", fmt::format("no answer within {} ms", cfg_.timeout_ms));
  }
}

void Server::log_line(const std::string& ns, bool tcp, const std::string& src, const Verdict*,
                      const wall::dns::Query* q, const char* verdict, const std::string& reason,
                      int rcode, const std::string& upstream, double ms,
                      std::optional<uint32_t> uid) {
  std::string out = "{\"ts\":";
  json_append_string(out, iso8601_utc(wall_ms(), true, true));
  out += ",\"ns\":";
  json_append_string(out, ns);
  out += tcp ? ",\"proto\":\"tcp\"" : ",\"proto\":\"udp\"";
  out += ",\"src\":";
  json_append_string(out, src);
  if (uid) out += fmt::format(",\"uid\":{}", *uid);
  if (q) {
    out += ",\"name\":";
    json_append_string(out, q->name);
    out += ",\"qtype\":";
    json_append_string(out, qtype_name(q->qtype));
  }
  out += ",\"verdict\":";
  json_append_string(out, verdict);
  if (!reason.empty()) {
    out += ",\"reason\":";
    json_append_string(out, reason);
  }
  if (rcode >= 0) out += fmt::format(",\"rcode\":{}", rcode);
  if (!upstream.empty()) {
    out += ",\"upstream\":";
    json_append_string(out, upstream);
  }
  if (ms >= 0) out += fmt::format(",\"ms\":{:.3f}", ms);
  out += "}\n";
  // One write(2) a line, O_APPEND: lines of concurrent writers never mix.
  ssize_t w = ::write(log_fd_, out.data(), out.size());
  (void)w;
}

}  // namespace fy::dnsfwd

#include "forwarder/relay.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/net.h"
#include "forwarder/attrib.h"
#include "forwarder/stamper.h"

namespace fy::fwd {
namespace {

// Relayed sockets are edge-triggered. EPOLLOUT is in the mask only while it
// is wanted (a connect in progress, or a write that met a full send buffer): a
// socket with room to write raises OUT edges of its own (ACKs, send-buffer
// growth; ~2,800 per GiB on the upstream socket of a download), and each woke
// the forwarder for nothing. It is dropped lazily, on the first OUT edge that
// nobody was waiting for, and added back when a write meets EAGAIN.
constexpr uint32_t kRelayIn = EPOLLIN | EPOLLRDHUP | EPOLLET;
constexpr size_t kSpliceMax = 1 << 20;
constexpr uint64_t kRefuseLingerMs = 2000;
constexpr uint64_t kOutqPollMs = 1;
// One pump() reading this much from a source makes its direction bulk.
constexpr size_t kBulkRead = 64 * 1024;

// Peer-caused events: at most 20 lines a second from each worker.
thread_local log::RateLimit g_peer_log(20, 1000);

bool peer_log_allowed() {
  return log::allow_noting(g_peer_log,
                     "peer-caused log lines suppressed (see the counters in the status line)");
}

int socket_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

// Proxy-caused lines (re-dials, unreachable): when the proxy is down or the
// VM froze, every connection says the same; at most 5 a second per worker.
thread_local log::RateLimit g_upstream_log(5, 1000);

bool upstream_log_allowed() {
  return log::allow_noting(g_upstream_log,
                     "similar lines about the proxy suppressed (see redials= and "
                     "upstream_failed= in the status line)");
}

// [limits] pump_budget_kib: what one pump() reads from each source before it
// yields to the loop (0 in the configuration: no bound).
size_t pump_budget(const Config& cfg) {
  return cfg.pump_budget ? cfg.pump_budget : SIZE_MAX;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Closes with an RST instead of a FIN.
void close_reset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

}  // namespace

// ---------------------------------------------------------------------------

PipePool::~PipePool() {
  for (auto& p : free_) {
    ::close(p[0]);
    ::close(p[1]);
  }
}

bool PipePool::get(int* r, int* w) {
  if (!free_.empty()) {
    *r = free_.back()[0];
    *w = free_.back()[1];
    free_.pop_back();
    idle_.store(free_.size(), std::memory_order_relaxed);
    return true;
  }
  int p[2];
  if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) return false;
  *r = p[0];
  *w = p[1];
  return true;
}

bool PipePool::grow(int w) {
  if (bulk_size_ <= static_cast<uint32_t>(kDefaultSize)) return false;
  // Taken before the pipe grows and given back if it does not, so the cap
  // holds across workers without a lock.
  if (grown_total_->fetch_add(1, std::memory_order_relaxed) >= max_grown_) {
    grown_total_->fetch_sub(1, std::memory_order_relaxed);
    ++capped_;
    return false;
  }
  // Fails (EPERM) past fs.pipe-max-size without CAP_SYS_RESOURCE: the pipe
  // keeps its size, which is only slower.
  if (fcntl(w, F_SETPIPE_SZ, static_cast<int>(bulk_size_)) <= 0) {
    grown_total_->fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void PipePool::put(int r, int w, bool empty, bool grown) {
  if (grown) grown_total_->fetch_sub(1, std::memory_order_relaxed);
  // A grown pipe's ring (40 bytes a slot) is not kept for small connections.
  if (empty && free_.size() < kMax && (!grown || fcntl(w, F_SETPIPE_SZ, kDefaultSize) > 0)) {
    free_.push_back({r, w});
    idle_.store(free_.size(), std::memory_order_relaxed);
    return;
  }
  ::close(r);
  ::close(w);
}

// ---------------------------------------------------------------------------

struct Connection::AttribOut {
  AttribQuery query;
  Attribution result;
  const Attributor* attributor = nullptr;
  // Set by the loop when the connection gave up waiting (the deadline, or
  // the client went): a lookup not started yet is skipped.
  std::atomic<bool> abandoned{false};
};

Connection::Connection(RelayContext* ctx, Accepted a)
    : ctx_(ctx),
      id_(ctx->shared->next_id.fetch_add(1, std::memory_order_relaxed)),
      a_(std::move(a)),
      cfd_(a_.fd) {
  cside_.c = this;
  cside_.upstream = false;
  uside_.c = this;
  uside_.upstream = true;
  ++ctx_->counters.accepted;
  // Shared::active was reserved by the listener; finish() gives it back.
  next_ = ctx_->head;
  if (next_) next_->prev_ = this;
  ctx_->head = this;
}

Connection::~Connection() {
  // finish() ran: both fds are closed and the connection is off the list.
}

std::string Connection::label() const {
  return fmt::format("{} {}", log::ConnId{id_}, sockaddr_string(reinterpret_cast<const sockaddr*>(&a_.peer)));
}

void Connection::start() {
  // TCP_NODELAY came from the listener (listen_tcp).
  cside_.out = false;  // c_writable_ starts true: nothing to wait for
  if (!ctx_->engine->watch(cfd_, kRelayIn, &cside_)) {
    ++ctx_->counters.local_failed;
    if (peer_log_allowed())
      log::warn("{} cannot watch the client socket (epoll: {}); reset", label(), strerror(errno));
    finish(true, true);
    return;
  }
  phase_start_ms_ = ctx_->engine->now_ms();
  if (!a_.rule->stamp) {
    // A token-service port: relayed byte for byte, never parsed, never stamped.
    ++ctx_->counters.relayed_unstamped;
    dial();
    return;
  }
  phase_ = Phase::head;
  ctx_->engine->arm(this, ctx_->cfg->head_timeout_ms);
  // Data may already be there; the edge for it has not been seen yet either
  // way, so read now rather than wait.
  c_readable_ = true;
  read_head();
}

void Connection::on_io(bool upstream, uint32_t ev) {
  if (ev == 0) again_pending_ = false;  // Engine::again: pump on
  if (phase_ == Phase::closed) return;
  bool in = ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
  bool out = ev & (EPOLLOUT | EPOLLHUP | EPOLLERR);
  if (out && !in && (upstream ? u_writable_ : c_writable_))
    set_out(upstream ? uside_ : cside_, false);  // an OUT edge nobody waited for
  if (upstream) {
    if (in) u_readable_ = true;
    if (out) u_writable_ = true;
  } else {
    if (in) c_readable_ = true;
    if (out) c_writable_ = true;
    if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c_hup_ = true;
  }
  if ((ev & EPOLLERR) && !upstream && phase_ != Phase::head && phase_ != Phase::refusing &&
      socket_error(cfd_) != 0) {
    // The client reset. Before the relay starts, its head must not go on
    // alone (a retried POST would run twice); once relaying, a client done
    // sending is never read again, so no splice would notice. Both reset.
    if (phase_ == Phase::attributing || phase_ == Phase::dialing || phase_ == Phase::sending)
      ++ctx_->counters.client_gone;
    else
      ++ctx_->counters.aborted;
    if (attrib_) attrib_->abandoned = true;
    finish(true, true);
    return;
  }
  switch (phase_) {
    case Phase::head:
      if (!upstream && in) read_head();
      break;
    case Phase::dialing:
      if (upstream && out) check_connect();
      break;
    case Phase::sending:
      if (upstream && out) send_head(false);
      break;
    case Phase::relaying:
      pump();
      break;
    case Phase::rst_wait:
      // Both directions are done: nothing to pump. An upstream error here is
      // the proxy resetting first (begin_rst_wait sees it).
      if (upstream && (ev & (EPOLLERR | EPOLLHUP))) begin_rst_wait();
      break;
    case Phase::refusing:
      if (!upstream && in) {
        char sink[4096];
        while (true) {
          ssize_t n = ::recv(cfd_, sink, sizeof sink, 0);
          if (n > 0) continue;
          if (n < 0 && errno == EAGAIN) break;
          finish(false, false);  // EOF or error: the client has its answer
          return;
        }
      }
      break;
    case Phase::attributing:
    case Phase::closed:
      break;
  }
}

void Connection::on_timer() {
  switch (phase_) {
    case Phase::head:
      ++ctx_->counters.head_timeouts;
      refuse(408, "Request Timeout", "head_timeout",
             fmt::format("fy-forwarder closed this connection: no complete request head arrived "
                         "within {} ms. Send the whole request head at once.\n",
                         ctx_->cfg->head_timeout_ms));
      return;
    case Phase::dialing: {
      if (attempts_ <= ctx_->cfg->redials) {
        ++ctx_->counters.redials;
        if (upstream_log_allowed())
          log::info(
              "{} no answer from the proxy in {} ms (attempt {}); re-dialling on a new "
              "socket",
              label(), ctx_->cfg->connect_timeout_ms, attempts_);
        ::close(ufd_);  // a SYN_SENT socket goes without a packet
        ufd_ = -1;
        u_writable_ = u_readable_ = false;
        dial();
        return;
      }
      fail_upstream(fmt::format("no answer to {} connection attempts of {} ms each", attempts_,
                                ctx_->cfg->connect_timeout_ms));
      return;
    }
    case Phase::attributing:
      ++ctx_->counters.attrib_timeouts;
      attrib_->abandoned = true;
      if (peer_log_allowed())
        log::warn(
            "{} not attributed within {} ms (lookups queued: is [vm] attribution on the "
            "/proc walk? see the attribution= field of the status line)",
            label(), ctx_->cfg->vm.attribution_timeout_ms);
      refuse(503, "Service Unavailable", "attribution",
             fmt::format("fy-forwarder could not tell within {} ms who made this connection, so "
                         "it does not pass it on. Retry; if it persists, see fy-forwarder's log.\n",
                         ctx_->cfg->vm.attribution_timeout_ms));
      return;
    case Phase::rst_wait:
      begin_rst_wait();
      return;
    case Phase::relaying:
      ++ctx_->counters.half_closed_timeouts;
      if (peer_log_allowed())
        log::info("{} one side finished {} ms ago and the other did not: reset", label(),
                  ctx_->cfg->half_closed_timeout_ms);
      finish(true, true);
      return;
    case Phase::refusing:
      finish(false, false);
      return;
    default:
      return;
  }
}

void Connection::read_head() {
  const size_t max = ctx_->cfg->max_head_bytes;
  if (!head_buf_) head_buf_.reset(new char[max]);
  while (c_readable_ && head_have_ < max) {
    size_t room = max - head_have_;
    ssize_t n = ::recv(cfd_, head_buf_.get() + head_have_, room, 0);
    if (n > 0) {
      head_have_ += static_cast<size_t>(n);
      // A short read from a TCP socket emptied its receive queue, and any
      // later segment raises a new edge; the EAGAIN recv that would confirm
      // it is one syscall a connection. Not when a FIN was already signalled
      // (the edge that brought it is the one being handled): read on to it.
      if (static_cast<size_t>(n) < room && !c_hup_) {
        c_readable_ = false;
        break;
      }
      continue;
    }
    if (n < 0 && errno == EAGAIN) {
      c_readable_ = false;
      break;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && head_have_ > 0) {
      // A client may send its whole request and half-close at once (nc -N,
      // printf | socat): a complete head read with the EOF behind it goes on,
      // and the EOF after it (the relay finds c2u_ at EOF).
      c2u_.eof = true;
      c_readable_ = false;
      break;
    }
    // EOF or an error before any byte: nothing to answer.
    ++ctx_->counters.head_eof;
    finish(n < 0, false);
    return;
  }
  if (!head_) head_ = std::make_unique<Head>();
  HeadLimits lim{max, ctx_->cfg->max_headers};
  ParseResult r = parse_head(std::string_view(head_buf_.get(), head_have_), lim, head_.get());
  if (r.status == ParseStatus::incomplete) {
    if (c2u_.eof) {
      // EOF before a complete head: nothing to answer.
      ++ctx_->counters.head_eof;
      finish(false, false);
    }
    return;
  }
  if (r.status == ParseStatus::refused) {
    ++ctx_->counters.refused_head;
    ++ctx_->counters.refused_by[static_cast<size_t>(r.refusal)];
    if (peer_log_allowed())
      log::info("{} refused: {} ({})", label(), refusal_reason(r.refusal), refusal_name(r.refusal));
    refuse(400, "Bad Request", refusal_name(r.refusal),
           fmt::format("fy-forwarder refused this request: {}.\nIt passes only canonical HTTP/1 "
                       "proxy requests: CRLF line ends, single spaces, an upper-case method, "
                       "no folded headers, an absolute-form target (http://host/path) or, for "
                       "CONNECT, host:port. Send it through an HTTP proxy client "
                       "(HTTPS_PROXY / curl -x).\n",
                       refusal_reason(r.refusal)));
    return;
  }
  on_head(*head_);
}

void Connection::on_head(const Head& h) {
  ctx_->engine->disarm(this);
  ctx_->counters.stamps_stripped += h.stamps_removed;
  if (h.stamps_removed && peer_log_allowed())
    log::info("{} removed {} client-written stamp header(s)", label(), h.stamps_removed);
  if (!a_.ingress_refusal.empty()) {
    // Bridge listener: the ingress link does not route the source. Answered
    // once the head is read whole, so the client reads the answer rather
    // than a reset.
    ++ctx_->counters.refused_ingress;
    if (peer_log_allowed()) log::info("{} refused (ingress): {}", label(), a_.ingress_refusal);
    refuse(400, "Bad Request", "ingress",
           "fy-forwarder refused this connection: " + a_.ingress_refusal + ".\n");
    return;
  }
  if (a_.kind == ListenerKind::vm && ctx_->attributor) {
    phase_ = Phase::attributing;
    attrib_ = std::make_unique<AttribOut>();
    attrib_->attributor = ctx_->attributor;
    std::memcpy(&attrib_->query.client, &a_.peer, sizeof a_.peer);
    std::memcpy(&attrib_->query.dst, &a_.orig_dst, sizeof a_.orig_dst);
    work_.data = this;
    work_pending_ = true;
    uv_queue_work(ctx_->engine->loop(), &work_, &Connection::attrib_work, &Connection::attrib_done);
    ctx_->engine->arm(this, ctx_->cfg->vm.attribution_timeout_ms);
    return;
  }
  {
    // A container whose start the hook recorded is named by its id, so its
    // row resolves even when it is gone before the engine lists it.
    std::string src = sockaddr_ip(reinterpret_cast<const sockaddr*>(&a_.peer));
    std::string who;
    if (ctx_->starts) {
      std::string id = ctx_->starts->holder(src);
      if (!id.empty()) {
        who = "container:" + id;
        ++ctx_->counters.stamped_by_start;
      }
    }
    stamp_line_ = ctx_->stamper->line(src, a_.net, who);
  }
  ++ctx_->counters.stamped;
  dial();
}

void Connection::attrib_work(uv_work_t* w) {
  auto* self = static_cast<Connection*>(w->data);
  // Runs on a thread-pool thread: touch only attrib_.
  if (self->attrib_->abandoned.load()) return;
  self->attrib_->result = self->attrib_->attributor->lookup(self->attrib_->query);
}

void Connection::attrib_done(uv_work_t* w, int status) {
  auto* self = static_cast<Connection*>(w->data);
  self->work_pending_ = false;
  if (self->phase_ == Phase::closed) {
    self->ctx_->engine->retire(self);
    return;
  }
  if (self->phase_ != Phase::attributing) return;  // timed out: answered already
  self->ctx_->engine->disarm(self);
  const Attribution& a = self->attrib_->result;
  Counters& k = self->ctx_->counters;
  k.attrib_us_total += a.cost_us;
  if (a.cost_us > k.attrib_us_max) k.attrib_us_max = a.cost_us;
  if (a.verdict == Attribution::Verdict::refused_pasta) {
    ++k.attrib_refused_pasta;
    if (peer_log_allowed()) log::info("{} refused: {}", self->label(), a.why);
    self->refuse(403, "Forbidden", "pasta",
                 "fy-forwarder refused this connection: " + a.why + ".\n");
    return;
  }
  if (a.verdict != Attribution::Verdict::ok) {
    ++k.attrib_failed;
    if (peer_log_allowed()) log::info("{} not attributed: {}", self->label(), a.why);
    self->refuse(503, "Service Unavailable", "attribution",
                 "fy-forwarder could not tell who made this connection, so it does not pass it "
                 "on: " +
                     a.why + ". Retry; if it persists, see fy-forwarder's log.\n");
    return;
  }
  ++k.attributed;
  const char* via = "uid";
  if (a.via == Attribution::Via::bpf) {
    ++k.attrib_bpf;
    via = "bpf";
  } else if (a.via == Attribution::Via::proc) {
    ++k.attrib_proc;
    via = "proc";
  } else {
    ++k.attrib_uid;
  }
  log::debug("{} attributed to {} (pid {}, {} us, {})", self->label(), a.who, a.pid, a.cost_us,
             via);
  self->stamp_line_ = self->ctx_->stamper->line(
      sockaddr_ip(reinterpret_cast<const sockaddr*>(&self->a_.peer)), self->a_.net, a.who);
  ++k.stamped;
  self->attrib_.reset();
  self->dial();
}

void Connection::dial() {
  phase_ = Phase::dialing;
  ++attempts_;
  sockaddr_storage up = ctx_->upstream;
  if (up.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&up)->sin_port = htons(a_.rule->port);
  else
    reinterpret_cast<sockaddr_in6*>(&up)->sin6_port = htons(a_.rule->port);
  ufd_ = ::socket(up.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ufd_ < 0) {
    fail_local(fmt::format("cannot make a socket: {}", strerror(errno)));
    return;
  }
  set_nodelay(ufd_);
  int rc = ::connect(ufd_, reinterpret_cast<sockaddr*>(&up), ctx_->upstream_len);
  if (rc != 0 && errno != EINPROGRESS) {
    fail_upstream(strerror(errno));
    return;
  }
  // Completion arrives as EPOLLOUT (or EPOLLERR) on the upstream side. But
  // where the handshake completes inside connect() (the peer is reached over
  // veth or loopback, whose receive path runs inline), the head can go now
  // rather than one loop turn later: a send on a socket still in SYN_SENT
  // fails with EAGAIN and changes nothing. So with a head to send, EPOLLOUT is
  // asked for only once that early send found the socket still connecting.
  // Watched only once the SYN is out, so the first EPOLLOUT is the answer.
  bool early = head_buf_ != nullptr;
  uside_.out = !early;
  if (!ctx_->engine->watch(ufd_, early ? kRelayIn : kRelayIn | EPOLLOUT, &uside_)) {
    fail_local(fmt::format("cannot watch a socket (epoll): {}", strerror(errno)));
    return;
  }
  ctx_->engine->arm(this, ctx_->cfg->connect_timeout_ms);
  if (early) send_head(true);
}

void Connection::check_connect() {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(ufd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == EINPROGRESS || err == EALREADY) return;
  if (err != 0) {
    fail_upstream(strerror(err));
    return;
  }
  // EPOLLOUT with no error: tcp_poll reports writability only once the
  // socket has left SYN_SENT.
  ctx_->engine->disarm(this);
  phase_ = Phase::sending;
  send_head(false);
}

void Connection::send_head(bool early) {
  if (head_buf_) {
    // First attempt: the kept ranges of the client's own buffer, our stamp
    // line, the blank line and whatever followed the head, in one writev.
    std::string_view buf(head_buf_.get(), head_have_);
    iovec iov[Head::kMaxKeep + 3];
    size_t n_iov = build_iov(*head_, buf, stamp_line_, iov);
    if (head_have_ > head_->length) {
      iov[n_iov].iov_base = head_buf_.get() + head_->length;
      iov[n_iov].iov_len = head_have_ - head_->length;
      ++n_iov;
    }
    size_t total = 0;
    for (size_t i = 0; i < n_iov; ++i) total += iov[i].iov_len;
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = n_iov;
    ssize_t n;
    do {
      n = ::sendmsg(ufd_, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (early) {
      if (n < 0 && errno == EAGAIN) {
        // Still connecting: stay in the dialing phase (its timer, re-dials)
        // and wait for the completion.
        set_out(uside_, true);
        return;
      }
      if (n < 0) {
        // The connect failed (refused: the RST came back inside connect()).
        // This send consumed the socket's error, so report it here; as in
        // check_connect(), a refusal is not re-dialled.
        fail_upstream(strerror(errno));
        return;
      }
      ctx_->engine->disarm(this);  // the connect timeout
      phase_ = Phase::sending;
      u_writable_ = true;
    }
    if (n < 0 && errno != EAGAIN) {
      fail_upstream(fmt::format("sending the request head: {}", strerror(errno)));
      return;
    }
    size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
    ctx_->counters.bytes_up += sent;
    if (sent < total) {
      // Rare: keep the unsent rest as a copy and wait for EPOLLOUT.
      u_writable_ = false;
      set_out(uside_, true);
      for (size_t i = 0; i < n_iov; ++i) {
        size_t len = iov[i].iov_len;
        if (sent >= len) {
          sent -= len;
          continue;
        }
        pending_head_.append(static_cast<const char*>(iov[i].iov_base) + sent, len - sent);
        sent = 0;
      }
    }
    head_buf_.reset();
    head_.reset();
    head_have_ = 0;
    stamp_line_.clear();
    stamp_line_.shrink_to_fit();
  }
  while (!pending_head_.empty()) {
    if (!u_writable_) return;
    ssize_t n = ::send(ufd_, pending_head_.data(), pending_head_.size(), MSG_NOSIGNAL);
    if (n > 0) {
      ctx_->counters.bytes_up += static_cast<uint64_t>(n);
      pending_head_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EAGAIN) {
      u_writable_ = false;
      set_out(uside_, true);
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    fail_upstream(fmt::format("sending the request head: {}", strerror(errno)));
    return;
  }
  pending_head_.shrink_to_fit();
  phase_ = Phase::relaying;
  // The readiness flags are exact here: the head was read until EAGAIN or a
  // short read, and every edge since (both sockets are watched) set them. A
  // forced read would be two EAGAIN splices per connection.
  pump();
}

bool Connection::move(Dir& d, int src, int dst, bool& src_readable, bool& dst_writable,
                      Count& bytes) {
  const size_t budget = pump_budget(*ctx_->cfg);
  bool any = false;
  while (!d.done) {
    if (d.pending > 0 && dst_writable) {
      ssize_t n =
          splice(d.pipe_r, nullptr, dst, nullptr, d.pending, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d.pending -= static_cast<size_t>(n);
        bytes += static_cast<uint64_t>(n);
        any = true;
        continue;
      }
      if (n < 0 && errno == EAGAIN) {
        dst_writable = false;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        ++ctx_->counters.aborted;
        finish(true, true);  // EPIPE, ECONNRESET: the destination is gone
        return any;
      }
    }
    if (!d.eof && src_readable && d.read_now < budget) {
      if (d.pipe_r < 0 && !ctx_->pipes->get(&d.pipe_r, &d.pipe_w)) {
        ++ctx_->counters.local_failed;
        if (peer_log_allowed())
          log::warn(
              "{} cannot make a pipe: {}; reset (raise LimitNOFILE or lower [limits] "
              "connections)",
              label(), strerror(errno));
        finish(true, true);
        return any;
      }
      ssize_t n =
          splice(src, nullptr, d.pipe_w, nullptr, kSpliceMax, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d.pending += static_cast<size_t>(n);
        d.read_now += static_cast<size_t>(n);
        any = true;
        continue;
      }
      if (n == 0) {
        d.eof = true;
        any = true;
      } else if (errno == EAGAIN) {
        // An empty pipe means the socket is drained; a non-empty one may just
        // be full, so keep the flag and try again after the next write.
        if (d.pending == 0) src_readable = false;
      } else if (errno == EINTR) {
        continue;
      } else {
        ++ctx_->counters.aborted;
        finish(true, true);  // ECONNRESET and friends: reset the other side too
        return any;
      }
    }
    if (d.eof && d.pending == 0) {
      d.done = true;
      any = true;
    }
    break;
  }
  return any;
}

void Connection::set_out(Side& s, bool on) {
  if (s.out == on) return;
  s.out = on;
  ctx_->engine->modify(s.upstream ? ufd_ : cfd_, on ? kRelayIn | EPOLLOUT : kRelayIn, &s);
}

// Invariant: a side we wait to write to (a write met EAGAIN) has EPOLLOUT in
// its mask, or its edge would never come.
void Connection::sync_out() {
  if (!c_writable_) set_out(cside_, true);
  if (!u_writable_) set_out(uside_, true);
}

void Connection::note_bulk(Dir& d) {
  if (d.bulk || d.read_now < kBulkRead) return;
  d.bulk = true;
  ++ctx_->counters.bulk_dirs;
  if (d.pipe_w >= 0) d.grown = ctx_->pipes->grow(d.pipe_w);
}

void Connection::pump() {
  bool c2u_was = c2u_.done, u2c_was = u2c_.done;
  bool progress = true;
  c2u_.read_now = u2c_.read_now = 0;
  while (progress && phase_ != Phase::closed) {
    progress = false;
    progress |= move(c2u_, cfd_, ufd_, c_readable_, u_writable_, ctx_->counters.bytes_up);
    if (phase_ == Phase::closed) return;
    progress |= move(u2c_, ufd_, cfd_, u_readable_, c_writable_, ctx_->counters.bytes_down);
    if (phase_ == Phase::closed) return;
  }
  sync_out();
  note_bulk(c2u_);
  note_bulk(u2c_);
  // move() read at most the budget from each source; one that stopped there
  // yields to the loop (Engine::again) with its readiness kept. Otherwise a
  // fast stream holds its worker, and every other connection on it, for as
  // long as both ends keep up.
  const size_t budget = pump_budget(*ctx_->cfg);
  if (!again_pending_ && ((c_readable_ && !c2u_.eof && c2u_.read_now >= budget) ||
                          (u_readable_ && !u2c_.eof && u2c_.read_now >= budget))) {
    // Stopped by the budget with bytes still to read: no edge will say so.
    again_pending_ = true;
    ++ctx_->counters.pump_yields;
    ctx_->engine->again(&cside_);
  }
  bool c_done_now = !c2u_was && c2u_.done;
  bool u_done_now = !u2c_was && u2c_.done;
  if (c_done_now) release_dir(c2u_);
  if (u_done_now) release_dir(u2c_);
  // Both may finish in this one pump, in either order: settle() decides by
  // what reached the sockets, not by which direction this pump moved first.
  if (c_done_now || u_done_now) settle();
}

bool Connection::upstream_fin_arrived() const {
  if (u2c_.eof) return true;
  // Not read yet: it may wait in the receive queue behind bytes still bound
  // for the client (backpressure). The socket state says whether it came.
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(ufd_, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  return ti.tcpi_state == TCP_CLOSE_WAIT;
}

void Connection::settle() {
  if (c2u_.done && !u2c_.done) {
    // The client is done sending and every byte reached the upstream socket.
    // Its FIN goes upstream (the client closed first) unless the upstream's
    // FIN is already here: then the upstream closed first, whatever order
    // this side saw the two EOFs in, and it must never get a FIN from us.
    if (!fin_sent_upstream_) {
      if (!upstream_fin_arrived()) {
        ::shutdown(ufd_, SHUT_WR);
        fin_sent_upstream_ = true;
      } else {
        // The upstream finished first: the client has half_closed_timeout_ms
        // to take the rest, as when the upstream's EOF is read first.
        ctx_->engine->arm(this, ctx_->cfg->half_closed_timeout_ms);
      }
    }
    return;  // the upstream's remaining bytes still go to the client
  }
  if (!c2u_.done) {
    // The upstream is done sending and every byte reached the client: pass
    // its EOF on. It closed first; the client has half_closed_timeout_ms.
    ::shutdown(cfd_, SHUT_WR);
    client_shut_ = true;
    ctx_->engine->arm(this, ctx_->cfg->half_closed_timeout_ms);
    return;
  }
  // Both are done.
  if (fin_sent_upstream_) {
    // The client closed first and its FIN went upstream before the upstream's
    // arrived; the upstream's EOF completes an ordinary close (close() gives
    // the client its FIN).
    ++ctx_->counters.fin_closes;
    finish(false, false);
    return;
  }
  // The upstream's FIN came while ours was never sent: it closed first. The
  // client gets its EOF now; the upstream an RST once it has acknowledged
  // every byte.
  if (!client_shut_) {
    ::shutdown(cfd_, SHUT_WR);
    client_shut_ = true;
  }
  begin_rst_wait();
}

void Connection::begin_rst_wait() {
  bool first = phase_ != Phase::rst_wait;
  if (first) {
    phase_ = Phase::rst_wait;
    phase_start_ms_ = ctx_->engine->now_ms();
  }
  int outq = 0;
  if (ioctl(ufd_, SIOCOUTQ, &outq) != 0) outq = 0;
  if (outq > 0 && socket_error(ufd_) != 0) {
    // The proxy reset the connection first: nothing more will be
    // acknowledged (SIOCOUTQ stays where it was), and its 4-tuple holds no
    // TIME_WAIT. Checked only while bytes are outstanding: at 0 the RST goes
    // either way.
    ++ctx_->counters.rst_by_upstream;
    finish(false, false);
    return;
  }
  if (first && outq > 0) ++ctx_->counters.rst_waited;
  if (outq == 0) {
    ++ctx_->counters.rst_closes;
    finish(false, true);
    return;
  }
  if (ctx_->engine->now_ms() - phase_start_ms_ >= ctx_->cfg->rst_wait_ms) {
    ++ctx_->counters.rst_forced;
    ++ctx_->counters.rst_closes;
    if (peer_log_allowed())
      log::info("{} the proxy left {} bytes unacknowledged for {} ms: reset anyway", label(), outq,
                ctx_->cfg->rst_wait_ms);
    finish(false, true);
    return;
  }
  ctx_->engine->arm(this, kOutqPollMs);
}

void Connection::fail_upstream(const std::string& why) {
  ++ctx_->counters.upstream_failed;
  std::string up = sockaddr_ip(reinterpret_cast<const sockaddr*>(&ctx_->upstream));
  if (upstream_log_allowed())
    log::warn("{} cannot reach the proxy at {}:{}: {}", label(), up, a_.rule->port, why);
  give_up(502, "Bad Gateway", "upstream",
          fmt::format("fy-forwarder could not reach the egress proxy at {}:{}: {}. Check that "
                      "foldyard's proxy is running on the host (fy up).\n",
                      up, a_.rule->port, why));
}

void Connection::fail_local(const std::string& why) {
  ++ctx_->counters.local_failed;
  if (peer_log_allowed())
    log::warn(
        "{} {}: the forwarder itself is short of resources; raise LimitNOFILE in its unit "
        "or lower [limits] connections",
        label(), why);
  give_up(503, "Service Unavailable", "forwarder",
          fmt::format("fy-forwarder could not pass this request on: {}. The forwarder in the VM "
                      "is short of resources, not the proxy; retry, and see fy-forwarder's log.\n",
                      why));
}

void Connection::give_up(int status, const char* reason_phrase, const char* tag,
                         const std::string& body) {
  if (ufd_ >= 0) {
    ::close(ufd_);
    ufd_ = -1;
  }
  if (!a_.rule->stamp) {
    finish(true, false);  // an unparsed port gets no HTTP answer: reset
    return;
  }
  refuse(status, reason_phrase, tag, body);
}

void Connection::refuse(int status, const char* reason_phrase, const std::string& tag,
                        const std::string& body) {
  std::string resp = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n"
      "Connection: close\r\nFy-Forwarder-Refusal: {}\r\n\r\n{}",
      status, reason_phrase, body.size(), tag, body);
  ssize_t n = ::send(cfd_, resp.data(), resp.size(), MSG_NOSIGNAL);
  (void)n;  // a small answer into an empty send buffer; if it does not fit, the client is gone
  ::shutdown(cfd_, SHUT_WR);
  head_buf_.reset();
  phase_ = Phase::refusing;
  // Read what the client still sends until it closes, so our close does not
  // turn into an RST that destroys the answer in flight.
  ctx_->engine->arm(this, kRefuseLingerMs);
  c_readable_ = true;
  on_io(false, EPOLLIN);
}

void Connection::release_dir(Dir& d) {
  if (d.pipe_r >= 0) ctx_->pipes->put(d.pipe_r, d.pipe_w, d.pending == 0, d.grown);
  d.pipe_r = d.pipe_w = -1;
  d.pending = 0;
  d.grown = false;
}

void Connection::finish(bool reset_client, bool reset_upstream) {
  if (phase_ == Phase::closed) return;
  phase_ = Phase::closed;
  ctx_->engine->disarm(this);
  if (again_pending_) ctx_->engine->cancel_again(&cside_);
  if (ufd_ >= 0) {
    if (reset_upstream)
      close_reset(ufd_);
    else
      ::close(ufd_);
    ufd_ = -1;
  }
  if (cfd_ >= 0) {
    if (reset_client)
      close_reset(cfd_);
    else
      ::close(cfd_);
    cfd_ = -1;
  }
  release_dir(c2u_);
  release_dir(u2c_);
  ctx_->shared->active.fetch_sub(1, std::memory_order_relaxed);
  if (prev_)
    prev_->next_ = next_;
  else
    ctx_->head = next_;
  if (next_) next_->prev_ = prev_;
  prev_ = next_ = nullptr;
  if (!work_pending_) ctx_->engine->retire(this);
  // else attrib_done retires it.
}

void Connection::abort_now() {
  finish(true, true);
}

}  // namespace fy::fwd

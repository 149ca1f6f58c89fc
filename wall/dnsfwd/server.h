// fy-dnsfwd's loop: UDP and TCP listeners (each in the namespace its config
// names), one connected upstream UDP socket per upstream address in the
// daemon's own namespace, and the table of queries upstream. A query that
// arrived over UDP goes upstream over UDP; one that arrived over TCP goes
// upstream over TCP, on the connection upstream of the client's connection
// (UpConn: one per client connection, made from the daemon's own namespace
// too, its queries pipelined and matched by id). Both kinds are in the same
// table, under the same max_pending and timeout_ms. Every
// decision is judge.h's; this file only moves bytes and writes the log.
//
// Ownership: the Server owns its listeners and upstream sockets by value
// (in heap objects it keeps until destruction) and each TcpClient, which it
// frees in the client's last close callback. An UpConn is open while its
// client connection is, or while it carries a query (Pending::up); when
// neither holds (erase_pending(), close_client(), a failure) close_upconn(),
// its one close point, closes it, and it is freed in its close callback.
// close() starts closing every handle; the caller runs the loop until it is
// empty, then destroys the Server (the destructor asserts close() ran).
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "wall/dnsfwd/config.h"
#include "wall/dnsfwd/judge.h"

namespace fy::dnsfwd {

struct Stats {
  uint64_t forwarded = 0, answered = 0, refused = 0, malformed = 0, rate_limited = 0,
           too_large = 0, upstream_timeouts = 0, upstream_bad = 0, overloaded = 0,
           tcp_clients = 0, tcp_refused = 0, log_suppressed = 0,
           upstream_tcp = 0;  // queries sent upstream over TCP
};

class Server {
 public:
  // `log_fd`: where the JSON lines go (not owned).
  Server(uv_loop_t* loop, Config cfg, int log_fd);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Opens every listener and the upstream sockets; an error names the
  // listener and what to do. Nothing is left open on failure but what
  // close() closes.
  Result<void> start();
  // Starts closing every handle; queries upstream are dropped.
  void close();
  // SIGHUP: takes `next`'s judgement (allow, rate, burst, max_query,
  // max_sources), timeouts and limits at once; queries upstream and open TCP
  // clients carry on (an open client keeps its framer's size bound). What
  // needs a restart (listeners, upstreams, the log) is kept as it runs, and
  // the returned text names it ("" when nothing was kept).
  std::string reload(Config next);
  const Config& config() const { return cfg_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Listener;
  struct TcpClient;
  struct Pending;
  struct Upstream;
  struct UpConn;
  using PendingIt = std::unordered_map<uint16_t, Pending>::iterator;

  // Opens `l`'s UDP and TCP sockets (and its redirect) in the namespace
  // `ns_path` names ("" = the daemon's own).
  Result<void> open_listener(Listener* l, const std::string& ns_path);
  // Closes `l`'s sockets, its TCP clients and the queries it waits on.
  void close_listener(Listener* l);
  // Moves `l` to retired_ (freed by sweep() once nothing points at it) and
  // returns the fresh, unopened listener of the same config in its place.
  Listener* retire_listener(Listener* l);
  // A `follow` listener: checks the namespace at its path and opens, moves
  // or closes the listener to match; `l` is updated when it is replaced.
  void follow(Listener*& l);
  void on_udp(Listener* l, ssize_t n, const uv_buf_t* buf, const sockaddr* from, unsigned flags);
  void on_upstream(Upstream* u, ssize_t n, const uv_buf_t* buf, const sockaddr* from);
  // The TCP upstream: the query at `it` goes on `client`'s connection
  // upstream, made now if it has none (or none that takes more), else on a
  // connection of its own (client null: gone). handle() calls it once the
  // query is in pending_; it may answer SERVFAIL at once.
  void upstream_tcp(PendingIt it, TcpClient* client);
  // `c` carries the query at `it` (its id in c->ids, c in its Pending).
  void carry(UpConn* c, PendingIt it);
  // Writes `p`'s query on the connected `c`; false when that failed (`c`
  // failed with it: upconn_failed()).
  bool send_query(UpConn* c, const Pending& p);
  void on_upconn_connect(UpConn* c, int status);
  void on_upconn_read(UpConn* c, ssize_t n, const uv_buf_t* buf);
  // Detaches `c` from its client: no new query goes on it.
  void retire_upconn(UpConn* c);
  // `c` failed (refused, reset, closed early, framing lost): its queries get
  // SERVFAIL logged with `verdict` and `why` (a reused connection's are sent
  // once more on a fresh one instead), a stderr line once a second per
  // upstream, and it closes.
  void upconn_failed(UpConn* c, const char* verdict, const std::string& why);
  // The one close point of an UpConn (freed in its close callback).
  void close_upconn(UpConn* c);
  // Takes the query out of the table; its upstream connection closes when
  // that left it nothing to carry and no client.
  PendingIt erase_pending(PendingIt it);
  // The upstream's answer to the query at `it` (either path): checked
  // (check_response), logged, relayed or SERVFAIL; the query leaves the table.
  PendingIt answer_from(PendingIt it, std::span<const uint8_t> resp);
  // SERVFAIL for the query at `it`, logged with `verdict` and `why`; it
  // leaves the table.
  PendingIt servfail(PendingIt it, const char* verdict, const std::string& why);
  void on_accept(Listener* l);
  void on_tcp_read(TcpClient* c, ssize_t n, const uv_buf_t* buf);
  void close_client(TcpClient* c);
  // One message from a client (UDP datagram or TCP frame).
  void handle(Listener* l, bool tcp, const sockaddr* from, TcpClient* c,
              std::span<const uint8_t> wire);
  void reply(Pending& p, std::span<const uint8_t> bytes);
  void reply_to(Listener* l, bool tcp, const sockaddr* to, uint64_t conn,
                std::span<const uint8_t> bytes);
  void sweep();
  // The asking socket's uid, when log_uid and its socket is in `l`'s namespace.
  std::optional<uint32_t> asker_uid(Listener* l, bool tcp, const sockaddr* from, TcpClient* c);
  void log_line(const std::string& ns, bool tcp, const std::string& src, const Verdict* v,
                const wall::dns::Query* q, const char* verdict, const std::string& reason,
                int rcode, const std::string& upstream, double ms,
                std::optional<uint32_t> uid = std::nullopt);

  uv_loop_t* loop_;
  Config cfg_;
  int log_fd_;
  RateBound rate_;
  std::vector<std::unique_ptr<Listener>> listeners_;  // one per [[listen]], in order
  std::vector<std::unique_ptr<Listener>> retired_;    // closed, awaiting sweep()
  std::vector<std::unique_ptr<Upstream>> upstreams_;  // one per configured address
  std::unordered_map<uint16_t, Pending> pending_;     // by the id we sent upstream
  std::unordered_map<uint64_t, TcpClient*> clients_;
  uint64_t next_client_ = 1;
  size_t next_upstream_ = 0;
  uv_timer_t sweep_{};
  std::mt19937 rng_;
  log::RateLimit drop_log_{50, 1000};  // malformed and rate-limited lines
  std::vector<uint8_t> rbuf_;
  Stats stats_;
  bool started_ = false, closed_ = false;
};

}  // namespace fy::dnsfwd

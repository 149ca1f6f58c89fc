// One relayed connection: client socket in (the bridge or VM listener), one
// upstream socket out (from the forwarder's own namespace to the proxy).
//
//   head       read and check the first request head (forwarder/head.h)
//   attribute  VM listener only: who owns the client socket (thread pool)
//   dial       non-blocking connect; unanswered after connect_timeout_ms, the
//              socket is dropped and a new one dialled, at most `redials` times
//   send       the head with client-written stamps removed and ours added
//   relay      splice(2) through a pipe each way; nothing is parsed
//
// Closing (ADR-0034 amendment): a client that finishes first has its FIN
// passed upstream. When the upstream finishes first its EOF is passed to the
// client, but the forwarder never sends the upstream a FIN: once the client is
// done too and SIOCOUTQ on the upstream socket reads 0 (every byte acked), the
// upstream socket is closed with SO_LINGER {1,0}, an RST, so the host side
// never holds the 4-tuple in TIME_WAIT. An error on either side resets both.
// "First" is decided on the upstream socket, where TIME_WAIT is decided: the
// upstream closed first when its FIN arrived before ours was sent — read
// before or in the same pump as the client's EOF, or still unread behind
// bytes bound for the client (CLOSE_WAIT) when the client finished. (A FIN of
// the upstream's that crosses ours on the wire is a simultaneous close; both
// ends then hold TIME_WAIT, and nothing on this side can tell it coming.)
//
// Bulk directions. A direction is bulk once one pump() reads >= 64 KiB from
// its source (data arrives faster than it is passed on); its pipe then grows
// from the kernel's 64 KiB (16 slots, and a TCP segment's pages take at least
// one slot each) to [limits] pipe_size, so one wake-up takes in and passes on
// more at a time. Small exchanges keep small pipes (a slot costs 40 bytes of
// kernel memory whether used or not).
//
// Ownership: a Connection owns both fds and its pipes; it deletes itself
// (through Engine::retire) once both fds are closed and no thread-pool work is
// in flight. Every method that may close is marked "may close"; callers check
// closed() before touching it again.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <uv.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forwarder/config.h"
#include "forwarder/engine.h"
#include "forwarder/starts.h"
#include "forwarder/head.h"

namespace fy::fwd {

class Stamper;
class Attributor;

// A counter with one writer, the worker that owns it, and any reader (the
// status line, on the main thread): a relaxed load and store, no locked
// read-modify-write, so it costs what a plain increment does.
class Count {
 public:
  Count& operator++() { return *this += 1; }
  Count& operator--() {
    v_.store(v_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    return *this;
  }
  Count& operator+=(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    return *this;
  }
  Count& operator=(uint64_t n) {
    v_.store(n, std::memory_order_relaxed);
    return *this;
  }
  uint64_t get() const { return v_.load(std::memory_order_relaxed); }
  operator uint64_t() const { return get(); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Pipes kept for reuse, one pool per worker: only ever an empty pipe of the
// kernel's default size (64 KiB) goes back. At most `max_grown` pipes are
// grown at once forwarder-wide (`grown_total` is shared by every worker's
// pool), so what the relay may hold in pipes is bounded (a pipe holds up to
// its size while its destination is slow): beyond it a bulk direction keeps
// the default size, which costs a few percent of CPU, not throughput.
class PipePool {
 public:
  static constexpr size_t kMax = 1024;
  static constexpr int kDefaultSize = 64 * 1024;
  // `bulk_size`: what grow() makes a pipe (0 or <= 64 KiB: grow() does
  // nothing). `grown_total` outlives the pool.
  PipePool(uint32_t bulk_size, uint32_t max_grown, std::atomic<uint32_t>* grown_total)
      : bulk_size_(bulk_size), max_grown_(max_grown), grown_total_(grown_total) {}
  ~PipePool();
  // A pipe of the default size; false when none can be made (fd exhaustion).
  bool get(int* r, int* w);
  // Grows a pipe to the bulk size; true when it grew. False also when
  // max_grown pipes are grown already (counted in capped()).
  bool grow(int w);
  // `grown`: grow() succeeded on it; it is shrunk back before reuse.
  void put(int r, int w, bool empty, bool grown);
  size_t idle() const { return idle_.load(std::memory_order_relaxed); }
  uint64_t capped() const { return capped_.get(); }

 private:
  uint32_t bulk_size_;
  uint32_t max_grown_;
  std::atomic<uint32_t>* grown_total_;
  // Written by the pool's worker only; read by the status line.
  Count capped_;
  std::atomic<size_t> idle_{0};  // free_.size(), for that reader
  std::vector<std::array<int, 2>> free_;
};

// One worker's counters; the status line sums them over the workers.
struct Counters {
  Count accepted;
  Count over_limit;
  Count accept_errors;
  Count stamped;
  Count stamped_by_start;  // bridge stamps that name their container (the hook's record)
  Count relayed_unstamped;  // token-service ports
  Count stamps_stripped;    // client-written stamp header lines removed
  Count refused_head;
  Count refused_ingress;  // bridge listener: source not on the ingress link (400)
  std::array<Count, static_cast<size_t>(Refusal::kCount)> refused_by;
  Count head_timeouts;
  Count head_eof;
  Count redials;
  Count upstream_failed;
  Count attributed;
  Count attrib_bpf;
  Count attrib_proc;
  Count attrib_uid;  // the socket's uid is not walled: recorded as uid:<n>
  Count attrib_refused_pasta;
  Count attrib_failed;
  Count attrib_us_total;  // time spent attributing (thread pool), all lookups
  Count attrib_us_max;
  Count fin_closes;  // client finished first; FIN passed upstream
  Count rst_closes;  // upstream finished first; closed with RST after SIOCOUTQ 0
  Count rst_forced;  // ... SIOCOUTQ never reached 0 within rst_wait_ms
  Count rst_waited;  // ... SIOCOUTQ was not 0 yet when the client was done: waited
  Count rst_by_upstream;  // ... the proxy reset first while SIOCOUTQ was not 0 yet
  Count aborted;          // an error on either side while relaying: both reset
  Count client_gone;      // the client reset before the relay began: nothing went on
  Count local_failed;     // the forwarder's own resources failed (fds, epoll, pipes)
  Count attrib_timeouts;  // not attributed within 5 s: 503
  Count half_closed_timeouts;
  Count bytes_up;
  Count bytes_down;
  Count bulk_dirs;    // relay directions that turned bulk (their pipes grew)
  Count pump_yields;  // pumps stopped by the per-wake-up budget, resumed next turn
};

// What every worker shares: atomics read-modify-written from any worker.
struct Shared {
  std::atomic<uint64_t> active{0};   // live connections forwarder-wide ([limits] connections)
  std::atomic<uint64_t> next_id{1};  // connection ids (c<id> in the log) across workers
  std::atomic<uint32_t> pipes_grown{0};
};

// One worker's relay: its engine, its pipes, its counters, its connections.
// Touched only on the worker's thread (the counters are also read elsewhere).
struct RelayContext {
  Engine* engine = nullptr;
  Shared* shared = nullptr;
  unsigned worker = 0;
  const Config* cfg = nullptr;
  Stamper* stamper = nullptr;
  Starts* starts = nullptr;  // the hook's start records (bridge stamps' who)
  Attributor* attributor = nullptr;  // null without a VM listener
  PipePool* pipes = nullptr;
  Counters counters;
  sockaddr_storage upstream{};  // the proxy's address; the port is set per connection
  socklen_t upstream_len = 0;
  class Connection* head = nullptr;  // intrusive list of live connections
};

enum class ListenerKind : uint8_t { bridge, vm };

struct Accepted {
  int fd = -1;
  sockaddr_storage peer{};
  sockaddr_storage local{};
  sockaddr_storage orig_dst{};  // the client's destination before a redirect (VM)
  const PortRule* rule = nullptr;
  ListenerKind kind = ListenerKind::bridge;
  std::string net;  // the stamp's net field
  // Bridge listener: why this connection must not be stamped (its ingress
  // link does not route its source, forwarder/ingress.h); empty when it may.
  std::string ingress_refusal;
};

class Connection final : public Retirable, private TimerSlot {
 public:
  // Takes ownership of a.fd and of one count in ctx->shared->active, which
  // the caller reserved. Call start() next.
  Connection(RelayContext* ctx, Accepted a);
  ~Connection() override;
  void start();  // may close
  // Resets both sides now (forwarder shutdown).
  void abort_now();
  bool closed() const { return phase_ == Phase::closed; }
  uint64_t id() const { return id_; }

  Connection* next_ = nullptr;
  Connection* prev_ = nullptr;

 private:
  enum class Phase : uint8_t {
    head,
    attributing,
    dialing,
    sending,
    relaying,
    rst_wait,
    refusing,
    closed
  };
  struct Side final : Watcher {
    Connection* c = nullptr;
    bool upstream = false;
    bool out = false;  // EPOLLOUT is in the registered mask
    void on_io(uint32_t events) override { c->on_io(upstream, events); }
  };
  struct Dir {
    int pipe_r = -1;
    int pipe_w = -1;
    size_t pending = 0;   // bytes in the pipe
    size_t read_now = 0;  // bytes read from the source in the current pump()
    bool eof = false;     // the source said EOF
    bool done = false;    // EOF seen and every byte passed on
    bool bulk = false;    // one pump() read >= 64 KiB
    bool grown = false;   // its pipe grew to pipe_size
  };

  void on_io(bool upstream, uint32_t events);
  void on_timer() override;
  void set_out(Side& s, bool on);
  void sync_out();
  void note_bulk(Dir& d);

  void read_head();             // may close
  void on_head(const Head& h);  // may close
  static void attrib_work(uv_work_t* w);
  static void attrib_done(uv_work_t* w, int status);
  void dial();           // may close
  void check_connect();  // may close
  // `early`: straight after connect(), before its completion is known.
  void send_head(bool early);  // may close
  void pump();                 // may close
  bool move(Dir& d, int src, int dst, bool& src_readable, bool& dst_writable, Count& bytes);
  // After a direction finished (its EOF seen and every byte passed on): the
  // half-close or close that follows (the header's "Closing"). May close.
  void settle();
  // True once the upstream's FIN has arrived: its EOF was read, or it waits
  // unread in the receive queue (the socket is in CLOSE_WAIT).
  bool upstream_fin_arrived() const;
  void begin_rst_wait();                       // may close
  void fail_upstream(const std::string& why);  // may close
  // The forwarder's own failure (descriptors, epoll): a 503 that says so.
  void fail_local(const std::string& why);  // may close
  // After a failed dial: the upstream socket goes; the client gets `status`
  // with `body`, or a reset on a port that is not parsed. Closes.
  void give_up(int status, const char* reason_phrase, const char* tag, const std::string& body);
  void refuse(int status, const char* reason_phrase, const std::string& tag,
              const std::string& body);                 // may close
  void finish(bool reset_client, bool reset_upstream);  // closes
  void release_dir(Dir& d);
  std::string label() const;

  RelayContext* ctx_;
  uint64_t id_;
  Phase phase_ = Phase::head;
  Accepted a_;
  int cfd_;
  int ufd_ = -1;
  Side cside_;
  Side uside_;
  bool c_readable_ = false;
  bool c_writable_ = true;
  bool u_readable_ = false;
  bool u_writable_ = false;
  bool c_hup_ = false;  // an event on the client socket signalled its FIN (or an error)
  uint32_t attempts_ = 0;
  uint64_t phase_start_ms_ = 0;
  // The client's first bytes and the parse of its head; both live until the
  // stamped head is sent, which goes out as an iovec over head_buf_.
  std::unique_ptr<char[]> head_buf_;
  std::unique_ptr<Head> head_;
  size_t head_have_ = 0;
  std::string stamp_line_;
  std::string pending_head_;  // the unsent rest of a partially written head
  Dir c2u_;
  Dir u2c_;
  // Our FIN went upstream: the client closed first. Never set once the
  // upstream's FIN has arrived, so "both done and no FIN sent" is exactly
  // "the upstream closed first", which is closed with an RST.
  bool fin_sent_upstream_ = false;
  bool client_shut_ = false;  // the upstream's EOF was passed to the client
  bool again_pending_ = false;  // pump() yielded; Engine::again will call on_io(0)
  uv_work_t work_{};
  bool work_pending_ = false;
  struct AttribOut;
  std::unique_ptr<AttribOut> attrib_;
};

}  // namespace fy::fwd

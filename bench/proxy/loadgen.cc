// fy-loadgen: a closed-loop HTTP/1.1 load generator for the proxy benchmark.
//
// wrk cannot speak to a forward proxy (no CONNECT), so this one can: each of
// N connections issues one GET, waits for the whole response, records the
// latency and issues the next, until a duration or a request count is reached.
// One thread, one epoll set (edge-triggered), non-blocking sockets; TLS with
// BoringSSL straight on the fd (the client owns its sockets, so no memory BIOs).
//
// Modes (what one "request" costs the client):
//   keepalive  GET after GET on the same connection (reconnects only after an
//              error or a server close); latency = request written -> response
//              complete.
//   newconn    connect, GET, response, close; latency = connect -> response.
//   tls        [CONNECT + 200 through a proxy], TLS handshake (full: no session
//              cache), GET, response, close_notify, close; latency = connect ->
//              response.
// With --proxy the GET is in absolute form (`GET http://authority/path`) for
// plain modes, and tls mode tunnels with `CONNECT authority` first.
//
// Prints one JSON object on stdout (see print_json). Exit 0 when it ran (errors
// are counted in the JSON, not fatal), 1 when epoll failed, 2 on bad flags.
#include <arpa/inet.h>
#include <fcntl.h>
#include <llhttp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/net.h"

namespace fy::bench {
namespace {

constexpr const char* kUsage =
    R"(fy-loadgen — closed-loop HTTP/1.1 load for the proxy benchmark (bench/proxy)

usage: fy-loadgen --connect IP:PORT --authority HOST:PORT [options]

  --connect IP:PORT      where the TCP connections go: the origin, or the proxy with --proxy
  --authority HOST:PORT  the origin: Host header, absolute URL and CONNECT target
  --proxy                talk to --connect as a forward proxy (absolute-form GET; CONNECT in tls mode)
  --mode MODE            keepalive (default), newconn, tls (one CONNECT/TLS handshake per GET),
                         or tls-ka (one CONNECT/TLS handshake per connection, then keep-alive GETs)
  --header "N: V"        one more request header (repeatable)
  --path PATH            request path (default /)
  --concurrency N        connections at once (default 1, max 1024)
  --duration S           stop after S seconds (default 5; fractions allowed)
  --requests N           stop after N requests were started, when all have ended (default: no cap)
  --timeout S            a request not complete after S seconds counts as an error (default 10)
  --ca FILE              PEM roots that verify the TLS server (tls mode; required there)
  --sni NAME             name sent and verified in TLS (default: the host of --authority)
  --expect-bytes N       count a response whose body is not N bytes as an error
  --spread-sources N     bind new connections to 127.0.0.2 .. 127.0.0.(N+1) in turn (IPv4
                         loopback targets; default 0: the kernel picks 127.0.0.1)
  --help

Output: one JSON object on stdout: ok, errors (by kind), seconds, rps, p50_us, p99_us,
max_us, body_bytes, client_cpu_us. Exit codes: 0 ran (failed requests are counted, not
fatal), 1 the event loop failed, 2 bad flags or setup.
)";

enum class Mode { keepalive, newconn, tls, tls_ka };

struct Options {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::string authority;
  std::string host;  // authority without the port, for SNI and verification
  bool proxy = false;
  Mode mode = Mode::keepalive;
  std::string path = "/";
  int concurrency = 1;
  double duration_s = 5;
  uint64_t max_requests = 0;
  double timeout_s = 10;
  std::string ca_file;
  std::string sni;
  int64_t expect_bytes = -1;
  int spread_sources = 0;
  std::vector<std::string> headers;  // extra request header lines
};

[[noreturn]] void usage_error(const std::string& msg) {
  fmt::print(stderr, "fy-loadgen: {}\nRun fy-loadgen --help for the flags.\n", msg);
  std::exit(2);
}

double parse_double(std::string_view flag, const char* v, double lo, double hi) {
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(d) || d < lo || d > hi)
    usage_error(fmt::format("{} wants a number in [{}, {}], got '{}'", flag, lo, hi, v));
  return d;
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::string connect;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", kUsage);
      std::exit(0);
    }
    if (a == "--proxy") {
      o.proxy = true;
      continue;
    }
    static constexpr std::string_view kWithValue[] = {
        "--connect",  "--authority", "--mode", "--path", "--concurrency",  "--duration",
        "--requests", "--timeout",   "--ca",   "--sni",  "--expect-bytes", "--spread-sources",
        "--header"};
    if (std::find(std::begin(kWithValue), std::end(kWithValue), a) == std::end(kWithValue))
      usage_error(fmt::format("unknown flag '{}'", a));
    if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", a));
    const char* v = argv[++i];
    if (a == "--connect") {
      connect = v;
    } else if (a == "--authority") {
      o.authority = v;
    } else if (a == "--mode") {
      std::string_view m = v;
      if (m == "keepalive")
        o.mode = Mode::keepalive;
      else if (m == "newconn")
        o.mode = Mode::newconn;
      else if (m == "tls")
        o.mode = Mode::tls;
      else if (m == "tls-ka")
        o.mode = Mode::tls_ka;
      else
        usage_error(fmt::format("--mode is keepalive, newconn, tls or tls-ka, not '{}'", m));
    } else if (a == "--path") {
      o.path = v;
      if (o.path.empty() || o.path[0] != '/') usage_error("--path must start with '/'");
    } else if (a == "--concurrency") {
      o.concurrency = static_cast<int>(parse_double(a, v, 1, 1024));
    } else if (a == "--duration") {
      o.duration_s = parse_double(a, v, 0.01, 86400);
    } else if (a == "--requests") {
      o.max_requests = static_cast<uint64_t>(parse_double(a, v, 1, 1e12));
    } else if (a == "--timeout") {
      o.timeout_s = parse_double(a, v, 0.01, 3600);
    } else if (a == "--header") {
      std::string h = v;
      if (h.find(':') == std::string::npos || h.find_first_of("\r\n") != std::string::npos)
        usage_error("--header takes \"Name: value\"");
      o.headers.push_back(h);
    } else if (a == "--ca") {
      o.ca_file = v;
    } else if (a == "--sni") {
      o.sni = v;
    } else if (a == "--expect-bytes") {
      o.expect_bytes = static_cast<int64_t>(parse_double(a, v, 0, 1e15));
    } else if (a == "--spread-sources") {
      o.spread_sources = static_cast<int>(parse_double(a, v, 0, 250));
    }
  }
  if (connect.empty()) usage_error("--connect IP:PORT is required");
  if (o.authority.empty()) usage_error("--authority HOST:PORT is required");
  auto hp = parse_authority(connect, 0);
  if (!hp || !make_sockaddr(hp->host, hp->port, &o.addr, &o.addr_len))
    usage_error(fmt::format("--connect wants a numeric IP:PORT, got '{}'", connect));
  auto auth = parse_authority(o.authority, 0);
  if (!auth) usage_error(fmt::format("--authority: {}", auth.error().message));
  o.host = auth->host;
  if (o.sni.empty()) o.sni = o.host;
  if ((o.mode == Mode::tls || o.mode == Mode::tls_ka) && o.ca_file.empty())
    usage_error("--mode tls and tls-ka need --ca FILE");
  if (o.spread_sources > 0 && (o.addr.ss_family != AF_INET || hp->host.rfind("127.", 0) != 0))
    usage_error("--spread-sources needs an IPv4 loopback --connect address");
  return o;
}

enum class State {
  idle,
  connecting,
  send_connect,
  read_connect,
  handshake,
  send_request,
  read_response
};

struct Conn {
  int fd = -1;
  State state = State::idle;
  bssl::UniquePtr<SSL> ssl;
  llhttp_t parser{};
  size_t out_off = 0;        // bytes of the current request (or CONNECT) written
  std::string connect_head;  // the proxy's answer to CONNECT, accumulated
  uint64_t t0_us = 0;        // when this request (and its connection, if new) started
  uint64_t body_bytes = 0;
  bool complete = false;       // llhttp saw the end of the response
  bool server_keeps = true;    // the response allows another request on this connection
  uint64_t restart_at_us = 0;  // when parked for a (re)start: not before this time
  bool parked = false;
};

class LoadGen {
 public:
  explicit LoadGen(Options o) : opt_(std::move(o)) {}

  bool init() {
    signal(SIGPIPE, SIG_IGN);
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) return setup_error("epoll_create1", errno);
    if (opt_.proxy && !tls_mode()) {
      request_ =
          fmt::format("GET http://{0}{1} HTTP/1.1\r\nHost: {0}\r\n", opt_.authority, opt_.path);
    } else {
      request_ = fmt::format("GET {1} HTTP/1.1\r\nHost: {0}\r\n", opt_.authority, opt_.path);
    }
    request_ += "User-Agent: fy-loadgen\r\nAccept: */*\r\n";
    for (const auto& h : opt_.headers) request_ += h + "\r\n";
    request_ += "\r\n";
    connect_req_ = fmt::format("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", opt_.authority);
    if (tls_mode() && !init_tls()) return false;
    llhttp_settings_init(&settings_);
    settings_.on_headers_complete = &LoadGen::on_headers_complete;
    settings_.on_body = &LoadGen::on_body;
    settings_.on_message_complete = &LoadGen::on_message_complete;
    conns_.resize(static_cast<size_t>(opt_.concurrency));
    latencies_.reserve(1 << 20);
    return true;
  }

  void run() {
    start_us_ = mono_us();
    end_us_ = start_us_ + static_cast<uint64_t>(opt_.duration_s * 1e6);
    timeout_us_ = static_cast<uint64_t>(opt_.timeout_s * 1e6);
    for (auto& c : conns_) park(c, start_us_);
    epoll_event evs[256];
    while (true) {
      uint64_t now = mono_us();
      if (now >= end_us_) {
        stop_us_ = end_us_;
        break;
      }
      int wait_ms = start_parked(now);
      if (active_ == 0 && parked_ == 0) {
        stop_us_ = last_done_us_ ? last_done_us_ : now;
        break;
      }
      now = mono_us();
      uint64_t to_end_ms = (end_us_ > now ? end_us_ - now : 0) / 1000 + 1;
      wait_ms = std::min<int>(wait_ms, static_cast<int>(std::min<uint64_t>(to_end_ms, 50)));
      int n = epoll_wait(ep_, evs, 256, wait_ms);
      if (n < 0 && errno != EINTR) {
        fmt::print(stderr, "fy-loadgen: epoll_wait: {}\n", strerror(errno));
        std::exit(1);
      }
      for (int i = 0; i < n; ++i) drive(conns_[evs[i].data.u32], evs[i].events);
      expire(mono_us());
    }
    for (auto& c : conns_) close_conn(c);
  }

  void print_json() const {
    std::vector<uint32_t> lat = latencies_;
    auto pct = [&lat](double p) -> uint64_t {
      if (lat.empty()) return 0;
      size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(lat.size()))) - 1;
      k = std::min(k, lat.size() - 1);
      std::nth_element(lat.begin(), lat.begin() + static_cast<ptrdiff_t>(k), lat.end());
      return lat[k];
    };
    uint64_t p50 = pct(0.50), p99 = pct(0.99);
    uint64_t max = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
    double secs = static_cast<double>(stop_us_ - start_us_) / 1e6;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    uint64_t cpu_us = static_cast<uint64_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000u +
                      static_cast<uint64_t>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    std::string errs;
    uint64_t nerr = 0;
    for (const auto& [k, v] : errors_) {
      errs += fmt::format("{}\"{}\":{}", errs.empty() ? "" : ",", k, v);
      nerr += v;
    }
    fmt::print(
        "{{\"ok\":{},\"error_count\":{},\"errors\":{{{}}},\"started\":{},\"seconds\":{:.6f},"
        "\"rps\":{:.2f},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"body_bytes\":{},"
        "\"client_cpu_us\":{}}}\n",
        ok_, nerr, errs, started_, secs, secs > 0 ? static_cast<double>(ok_) / secs : 0.0, p50, p99,
        max, body_bytes_, cpu_us);
  }

 private:
  bool setup_error(const char* what, int err) {
    fmt::print(stderr, "fy-loadgen: {}: {}\n", what, strerror(err));
    return false;
  }

  bool init_tls() {
    ctx_.reset(SSL_CTX_new(TLS_method()));
    if (!ctx_) return false;
    SSL_CTX_set_min_proto_version(ctx_.get(), TLS1_2_VERSION);
    if (SSL_CTX_load_verify_locations(ctx_.get(), opt_.ca_file.c_str(), nullptr) != 1) {
      fmt::print(stderr,
                 "fy-loadgen: cannot load the CA bundle {}: check the path and that it is PEM\n",
                 opt_.ca_file);
      return false;
    }
    SSL_CTX_set_verify(ctx_.get(), SSL_VERIFY_PEER, nullptr);
    // A fresh, full handshake per request: no session is ever offered.
    SSL_CTX_set_session_cache_mode(ctx_.get(), SSL_SESS_CACHE_OFF);
    static const uint8_t kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
    SSL_CTX_set_alpn_protos(ctx_.get(), kAlpn, sizeof kAlpn);
    return true;
  }

  // Parks `c` to (re)start at `at`: the main loop starts parked connections,
  // so an error never recurses into a new attempt.
  void park(Conn& c, uint64_t at) {
    if (c.state != State::idle) {
      c.state = State::idle;
      --active_;
    }
    if (!c.parked) ++parked_;
    c.parked = true;
    c.restart_at_us = at;
  }

  bool may_start() const {
    return (opt_.max_requests == 0 || started_ < opt_.max_requests) && mono_us() < end_us_;
  }

  // Starts the parked connections that are due; returns how long (ms) until the
  // next one is.
  int start_parked(uint64_t now) {
    int wait_ms = 50;
    if (parked_ == 0) return wait_ms;
    for (auto& c : conns_) {
      if (!c.parked) continue;
      if (!may_start()) {
        c.parked = false;
        --parked_;
        close_conn(c);
        continue;
      }
      if (c.restart_at_us > now) {
        wait_ms = std::min<int>(wait_ms, static_cast<int>((c.restart_at_us - now) / 1000 + 1));
        continue;
      }
      c.parked = false;
      --parked_;
      begin(c);
    }
    return wait_ms;
  }

  // Starts one request on `c`: on its open connection in keepalive mode, on a
  // new one otherwise.
  void begin(Conn& c) {
    ++started_;
    ++active_;
    c.state = c.fd >= 0 ? State::send_request : State::connecting;
    c.t0_us = mono_us();
    c.body_bytes = 0;
    c.complete = false;
    c.server_keeps = true;
    c.out_off = 0;
    llhttp_init(&c.parser, HTTP_RESPONSE, &settings_);
    c.parser.data = &c;
    if (c.fd >= 0) {
      drive(c, 0);
      return;
    }
    c.fd = socket(opt_.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return fail(c, "socket");
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (opt_.spread_sources > 0 && !bind_source(c.fd)) return fail(c, "bind");
    int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&opt_.addr), opt_.addr_len);
    if (rc < 0 && errno != EINPROGRESS) return fail(c, "connect");
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = static_cast<uint32_t>(&c - conns_.data());
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev) < 0) return fail(c, "epoll");
    if (rc == 0) drive(c, EPOLLOUT);
  }

  // One source address per new connection, in turn. Closing first leaves the
  // client's side in TIME_WAIT; at thousands of connections a second to one
  // origin port, the kernel's search for a free ephemeral port (a walk over
  // TIME_WAIT entries) then costs more than the rest of the request. Several
  // source addresses give each its own port space. The port is still chosen at
  // connect() (IP_BIND_ADDRESS_NO_PORT).
  bool bind_source(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000002u + static_cast<uint32_t>(next_source_));
    next_source_ = (next_source_ + 1) % opt_.spread_sources;
    return ::bind(fd, reinterpret_cast<const sockaddr*>(&src), sizeof src) == 0;
  }

  void close_conn(Conn& c) {
    if (c.ssl) {
      // Sends close_notify after a finished handshake; the peer's is not awaited.
      ERR_clear_error();
      if (SSL_is_init_finished(c.ssl.get())) SSL_shutdown(c.ssl.get());
      c.ssl.reset();
    }
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
    c.connect_head.clear();
  }

  void fail(Conn& c, const char* kind) {
    ++errors_[kind];
    close_conn(c);
    park(c, mono_us() + 1000);  // 1 ms back-off: a refusing peer must not spin the loop
  }

  void done(Conn& c) {
    uint64_t now = mono_us();
    if (opt_.expect_bytes >= 0 && c.body_bytes != static_cast<uint64_t>(opt_.expect_bytes))
      return fail(c, "body_size");
    uint64_t status = c.parser.status_code;
    if (status < 200 || status > 299) {
      ++errors_[fmt::format("status_{}", status)];
      close_conn(c);
      park(c, now + 1000);
      return;
    }
    ++ok_;
    body_bytes_ += c.body_bytes;
    last_done_us_ = now;
    latencies_.push_back(static_cast<uint32_t>(std::min<uint64_t>(now - c.t0_us, UINT32_MAX)));
    bool keep = opt_.mode == Mode::keepalive || opt_.mode == Mode::tls_ka;
    if (!keep || !c.server_keeps) close_conn(c);
    park(c, now);
  }

  // Writes what is left of `msg` from c.out_off; true when all of it is out.
  // Sets `err` when the connection failed.
  bool write_out(Conn& c, std::string_view msg, const char** err) {
    while (c.out_off < msg.size()) {
      const char* p = msg.data() + c.out_off;
      size_t n = msg.size() - c.out_off;
      if (c.ssl) {
        ERR_clear_error();
        int w = SSL_write(c.ssl.get(), p, static_cast<int>(n));
        if (w <= 0) {
          int e = SSL_get_error(c.ssl.get(), w);
          if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) return false;
          *err = "tls_write";
          return false;
        }
        c.out_off += static_cast<size_t>(w);
      } else {
        ssize_t w = send(c.fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
          if (errno == EAGAIN || errno == EINTR) return false;
          *err = "write";
          return false;
        }
        c.out_off += static_cast<size_t>(w);
      }
    }
    return true;
  }

  // Advances `c` as far as its socket allows (edge-triggered: until EAGAIN).
  void drive(Conn& c, uint32_t events) {
    const char* err = nullptr;
    for (;;) {
      switch (c.state) {
        case State::idle:
          return;
        case State::connecting: {
          if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
          int so = 0;
          socklen_t len = sizeof so;
          getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &so, &len);
          if (so != 0 || (events & (EPOLLERR | EPOLLHUP))) return fail(c, "connect");
          c.out_off = 0;
          if (tls_mode()) {
            c.state = opt_.proxy ? State::send_connect : State::handshake;
            if (c.state == State::handshake && !start_tls(c)) return fail(c, "tls_setup");
          } else {
            c.state = State::send_request;
          }
          break;
        }
        case State::send_connect:
          if (!write_out(c, connect_req_, &err)) return err ? fail(c, err) : void();
          c.state = State::read_connect;
          break;
        case State::read_connect: {
          // The CONNECT answer is short and the client sends nothing until it
          // has it, so nothing after the blank line may arrive yet.
          ssize_t r = recv(c.fd, buf_, sizeof buf_, 0);
          if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            return fail(c, "connect_reset");
          }
          if (r == 0) return fail(c, "connect_eof");
          c.connect_head.append(buf_, static_cast<size_t>(r));
          size_t end = c.connect_head.find("\r\n\r\n");
          if (end == std::string::npos) {
            if (c.connect_head.size() > 16384) return fail(c, "connect_head");
            break;
          }
          if (end + 4 != c.connect_head.size()) return fail(c, "connect_extra");
          if (c.connect_head.compare(0, 9, "HTTP/1.1 ") != 0 &&
              c.connect_head.compare(0, 9, "HTTP/1.0 ") != 0)
            return fail(c, "connect_head");
          if (c.connect_head.compare(9, 1, "2") != 0) {
            ++errors_[fmt::format("connect_status_{}", c.connect_head.substr(9, 3))];
            close_conn(c);
            return park(c, mono_us() + 1000);
          }
          if (!start_tls(c)) return fail(c, "tls_setup");
          c.state = State::handshake;
          break;
        }
        case State::handshake: {
          ERR_clear_error();
          int rc = SSL_do_handshake(c.ssl.get());
          if (rc != 1) {
            int e = SSL_get_error(c.ssl.get(), rc);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
            return fail(c, "tls_handshake");
          }
          c.out_off = 0;
          c.state = State::send_request;
          break;
        }
        case State::send_request:
          if (!write_out(c, request_, &err)) return err ? fail(c, err) : void();
          c.state = State::read_response;
          break;
        case State::read_response: {
          ssize_t r;
          bool eof = false;
          if (c.ssl) {
            ERR_clear_error();
            int n = SSL_read(c.ssl.get(), buf_, sizeof buf_);
            if (n <= 0) {
              int e = SSL_get_error(c.ssl.get(), n);
              if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
              if (e != SSL_ERROR_ZERO_RETURN) return fail(c, "tls_read");
              eof = true;
            }
            r = n;
          } else {
            r = recv(c.fd, buf_, sizeof buf_, 0);
            if (r < 0) {
              if (errno == EAGAIN || errno == EINTR) return;
              return fail(c, "reset");
            }
            eof = r == 0;
          }
          if (eof) {
            // Close-delimited bodies end here; anything else is a truncation.
            llhttp_errno_t e = llhttp_finish(&c.parser);
            if ((e != HPE_OK && e != HPE_PAUSED) || !c.complete) return fail(c, "eof");
          } else {
            llhttp_errno_t e = llhttp_execute(&c.parser, buf_, static_cast<size_t>(r));
            if (e == HPE_PAUSED) {
              // Paused at the end of the response: nothing may follow it, since
              // the next request has not been sent.
              if (llhttp_get_error_pos(&c.parser) != buf_ + r) return fail(c, "extra_bytes");
            } else if (e != HPE_OK) {
              return fail(c, "bad_response");
            }
          }
          if (!c.complete) break;
          if (eof) c.server_keeps = false;
          return done(c);
        }
      }
    }
  }

  bool tls_mode() const { return opt_.mode == Mode::tls || opt_.mode == Mode::tls_ka; }

  bool start_tls(Conn& c) {
    c.ssl.reset(SSL_new(ctx_.get()));
    if (!c.ssl) return false;
    SSL_set_fd(c.ssl.get(), c.fd);
    SSL_set_connect_state(c.ssl.get());
    SSL_set_tlsext_host_name(c.ssl.get(), opt_.sni.c_str());
    X509_VERIFY_PARAM* param = SSL_get0_param(c.ssl.get());
    if (is_ipv4_literal(opt_.sni) || is_ipv6_literal(opt_.sni))
      return X509_VERIFY_PARAM_set1_ip_asc(param, opt_.sni.c_str()) == 1;
    return X509_VERIFY_PARAM_set1_host(param, opt_.sni.data(), opt_.sni.size()) == 1;
  }

  // Requests past the timeout count as errors; their connection is dropped.
  void expire(uint64_t now) {
    for (auto& c : conns_) {
      if (c.state != State::idle && now - c.t0_us > timeout_us_) fail(c, "timeout");
    }
  }

  static Conn& conn_of(llhttp_t* p) { return *static_cast<Conn*>(p->data); }

  static int on_headers_complete(llhttp_t* p) {
    conn_of(p).server_keeps = llhttp_should_keep_alive(p) != 0;
    return 0;
  }
  static int on_body(llhttp_t* p, const char*, size_t n) {
    conn_of(p).body_bytes += n;
    return 0;
  }
  static int on_message_complete(llhttp_t* p) {
    Conn& c = conn_of(p);
    c.complete = true;
    // llhttp_should_keep_alive is final only here (it considers the framing).
    c.server_keeps = c.server_keeps && llhttp_should_keep_alive(p) != 0;
    return HPE_PAUSED;  // one response per request: stop at its end
  }

  Options opt_;
  int ep_ = -1;
  bssl::UniquePtr<SSL_CTX> ctx_;
  llhttp_settings_t settings_{};
  std::string request_;
  std::string connect_req_;
  std::vector<Conn> conns_;
  int active_ = 0;  // connections with a request in progress
  int parked_ = 0;  // connections waiting to start their next request
  int next_source_ = 0;
  uint64_t start_us_ = 0, end_us_ = 0, stop_us_ = 0, last_done_us_ = 0, timeout_us_ = 0;
  uint64_t started_ = 0, ok_ = 0, body_bytes_ = 0;
  std::map<std::string, uint64_t> errors_;
  std::vector<uint32_t> latencies_;
  char buf_[256 * 1024];
};

}  // namespace
}  // namespace fy::bench

int main(int argc, char** argv) {
  auto gen = std::make_unique<fy::bench::LoadGen>(fy::bench::parse_args(argc, argv));
  if (!gen->init()) return 2;
  gen->run();
  gen->print_json();
  return 0;
}

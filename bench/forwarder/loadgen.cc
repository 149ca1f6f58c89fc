// fy-fwd-loadgen: the client side of the forwarder benchmark (bench/forwarder).
// Every sample is a new TCP connection to the proxy (or to the forwarder in
// front of it); results go to stdout as one JSON object.
//
//   --mode small  --url URL --samples N                 request latency, us
//   --mode tls    --connect HOST:PORT --path P --samples N --parallel P
//                 CONNECT, TLS handshake, GET, response: latency, us
//   --mode bulk   --url URL --samples N --parallel P    one large body per sample
//   --mode rate   --url URL --seconds S --concurrency C new connections per second
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/net.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode, proxy, url, connect, path = "/small";
  int samples = 100, parallel = 1, concurrency = 32;
  double seconds = 3;
  int timeout_ms = 10000;
};

sockaddr_storage g_proxy;
socklen_t g_proxy_len;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int dial() {
  int fd = socket(g_proxy.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&g_proxy), g_proxy_len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += n;
  }
  return true;
}

// Parses a response head in `buf`; returns the total length (head + body) it
// announces, or 0 while the head is incomplete.
size_t response_size(const char* buf, size_t n) {
  std::string_view v(buf, n);
  size_t end = v.find("\r\n\r\n");
  if (end == std::string_view::npos) return 0;
  size_t len = 0;
  size_t pos = 0;
  while (pos < end) {
    size_t e = v.find("\r\n", pos);
    std::string_view line = v.substr(pos, e - pos);
    if (line.size() > 15 && strncasecmp(line.data(), "content-length:", 15) == 0)
      len = strtoull(std::string(line.substr(15)).c_str(), nullptr, 10);
    pos = e + 2;
  }
  return end + 4 + len;
}

// Reads one response (head + Content-Length body); returns bytes or -1.
ssize_t read_response(int fd, std::vector<char>& buf) {
  size_t have = 0, need = 0;
  while (true) {
    if (have == buf.size()) buf.resize(buf.size() * 2);
    ssize_t n = recv(fd, buf.data() + have, buf.size() - have, 0);
    if (n <= 0) return -1;
    have += n;
    if (!need) need = response_size(buf.data(), have);
    if (need && have >= need) return static_cast<ssize_t>(have);
  }
}

// Reads a large response without keeping it: returns body bytes or -1.
ssize_t drain_response(int fd) {
  std::vector<char> buf(1 << 20);
  size_t have = 0, need = 0, total = 0;
  size_t head_len = 0;
  while (true) {
    ssize_t n = recv(fd, buf.data() + (need ? 0 : have), need ? buf.size() : buf.size() - have, 0);
    if (n <= 0) return -1;
    total += n;
    if (!need) {
      have += n;
      need = response_size(buf.data(), have);
      if (need) {
        head_len = std::string_view(buf.data(), have).find("\r\n\r\n") + 4;
        if (have < 12 || memcmp(buf.data() + 9, "200", 3) != 0) return -1;  // not the body
      }
    }
    if (need && total >= need) return static_cast<ssize_t>(total - head_len);
  }
}

std::string get_request(const std::string& url) {
  std::string host = url.substr(url.find("://") + 3);
  host = host.substr(0, host.find('/'));
  return "GET " + url + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: fy-fwd-loadgen\r\n\r\n";
}

void print_samples(const char* mode, const std::vector<double>& us, int failed,
                   const std::string& extra = "") {
  printf("{\"mode\":\"%s\",\"failed\":%d%s,\"us\":[", mode, failed, extra.c_str());
  for (size_t i = 0; i < us.size(); ++i) printf("%s%.1f", i ? "," : "", us[i]);
  printf("]}\n");
}

int run_small(const Args& a) {
  std::string req = get_request(a.url);
  std::vector<double> us;
  std::vector<char> buf(65536);
  int failed = 0;
  for (int i = 0; i < a.samples; ++i) {
    auto t0 = Clock::now();
    int fd = dial();
    bool ok = fd >= 0 && send_all(fd, req) && read_response(fd, buf) > 0;
    if (fd >= 0) close(fd);  // the client closes first, as curl does
    if (ok)
      us.push_back(us_since(t0));
    else
      ++failed;
  }
  print_samples("small", us, failed);
  return 0;
}

int run_tls(const Args& a) {
  bssl::UniquePtr<SSL_CTX> ctx(SSL_CTX_new(TLS_method()));
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);  // the throwaway origin cert
  std::string connect_req = "CONNECT " + a.connect + " HTTP/1.1\r\nHost: " + a.connect + "\r\n\r\n";
  std::string inner = "GET " + a.path + " HTTP/1.1\r\nHost: " + a.connect + "\r\n\r\n";
  std::mutex mu;
  std::vector<double> us;
  std::atomic<int> failed{0};
  auto worker = [&] {
    std::vector<double> mine;
    std::vector<char> buf(65536);
    for (int i = 0; i < a.samples; ++i) {
      auto t0 = Clock::now();
      int fd = dial();
      bool ok = fd >= 0 && send_all(fd, connect_req);
      if (ok) {
        // The proxy's answer to CONNECT: read exactly the head.
        std::string head;
        char c;
        while (ok && head.find("\r\n\r\n") == std::string::npos)
          ok = recv(fd, &c, 1, 0) == 1 && (head += c, true);
        ok = ok && head.compare(9, 3, "200") == 0;
      }
      if (ok) {
        SSL* ssl = SSL_new(ctx.get());
        SSL_set_fd(ssl, fd);
        ok = SSL_connect(ssl) == 1 && SSL_write(ssl, inner.data(), inner.size()) > 0;
        size_t have = 0, need = 0;
        while (ok) {
          int n = SSL_read(ssl, buf.data() + have, buf.size() - have);
          if (n <= 0) {
            ok = false;
            break;
          }
          have += n;
          if (!need) need = response_size(buf.data(), have);
          if (need && have >= need) break;
        }
        SSL_free(ssl);
        ERR_clear_error();
      }
      if (fd >= 0) close(fd);
      if (ok)
        mine.push_back(us_since(t0));
      else
        ++failed;
    }
    std::lock_guard<std::mutex> l(mu);
    us.insert(us.end(), mine.begin(), mine.end());
  };
  std::vector<std::thread> ts;
  for (int p = 0; p < a.parallel; ++p) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  print_samples("tls", us, failed.load());
  return 0;
}

int run_bulk(const Args& a) {
  std::string req = get_request(a.url);
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> failed{0};
  std::mutex mu;
  std::vector<double> us;
  auto t0 = Clock::now();
  auto worker = [&] {
    for (int i = 0; i < a.samples; ++i) {
      auto s0 = Clock::now();
      int fd = dial();
      ssize_t n = -1;
      if (fd >= 0 && send_all(fd, req)) n = drain_response(fd);
      if (fd >= 0) close(fd);
      if (n > 0) {
        bytes += n;
        std::lock_guard<std::mutex> l(mu);
        us.push_back(us_since(s0));
      } else {
        ++failed;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int p = 0; p < a.parallel; ++p) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  double secs = us_since(t0) / 1e6;
  char extra[128];
  snprintf(extra, sizeof extra, ",\"bytes\":%llu,\"seconds\":%.6f",
           static_cast<unsigned long long>(bytes.load()), secs);
  print_samples("bulk", us, failed.load(), extra);
  return 0;
}

// New connections per second: `concurrency` connections in flight on one
// epoll loop; each completes a small request and is replaced by a new one.
int run_rate(const Args& a) {
  std::string req = get_request(a.url);
  int ep = epoll_create1(0);
  struct C {
    int fd = -1;
    size_t have = 0, need = 0;
    bool sent = false;
    char buf[4096];
  };
  std::vector<C> cs(a.concurrency);
  uint64_t done = 0, errors = 0;
  std::map<std::string, uint64_t> kinds;
  auto open_one = [&](size_t i) {
    C& c = cs[i];
    c = C();
    c.fd = socket(g_proxy.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&g_proxy), g_proxy_len) != 0 &&
        errno != EINPROGRESS) {
      ++errors;
      ++kinds[strerror(errno)];
      close(c.fd);
      c.fd = -1;
      return;
    }
    epoll_event e{};
    e.events = EPOLLOUT | EPOLLIN;
    e.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &e);
  };
  auto t0 = Clock::now();
  auto end = t0 + std::chrono::duration<double>(a.seconds);
  for (size_t i = 0; i < cs.size(); ++i) open_one(i);
  epoll_event evs[512];
  while (Clock::now() < end) {
    int n = epoll_wait(ep, evs, 512, 50);
    for (int k = 0; k < n; ++k) {
      size_t i = evs[k].data.u64;
      C& c = cs[i];
      if (c.fd < 0) continue;
      bool fail = false;
      if (!c.sent && (evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err || send(c.fd, req.data(), req.size(), MSG_NOSIGNAL) != (ssize_t)req.size()) {
          fail = true;
          ++kinds[err ? strerror(err) : "send"];
        } else {
          c.sent = true;
          epoll_event e{};
          e.events = EPOLLIN;
          e.data.u64 = i;
          epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &e);
        }
      } else if (c.sent && (evs[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
        while (true) {
          ssize_t r = recv(c.fd, c.buf + c.have, sizeof c.buf - c.have, 0);
          if (r > 0) {
            c.have += r;
            if (!c.need) c.need = response_size(c.buf, c.have);
            if (c.need && c.have >= c.need) break;
            if (c.have == sizeof c.buf) {
              fail = true;
              ++kinds["response larger than 4 KiB"];
              break;
            }
            continue;
          }
          if (r < 0 && errno == EAGAIN) break;
          fail = true;
          ++kinds[r == 0 ? "eof before response" : strerror(errno)];
          break;
        }
        if (!fail && c.need && c.have >= c.need) {
          ++done;
          close(c.fd);
          c.fd = -1;
          open_one(i);
          continue;
        }
      }
      if (fail) {
        ++errors;
        close(c.fd);
        c.fd = -1;
        open_one(i);
      }
    }
    for (size_t i = 0; i < cs.size(); ++i)
      if (cs[i].fd < 0 && Clock::now() < end) open_one(i);
  }
  double secs = us_since(t0) / 1e6;
  for (auto& c : cs)
    if (c.fd >= 0) close(c.fd);
  printf(
      "{\"mode\":\"rate\",\"completed\":%llu,\"errors\":%llu,\"seconds\":%.4f,"
      "\"per_second\":%.1f,\"error_kinds\":{",
      (unsigned long long)done, (unsigned long long)errors, secs, done / secs);
  bool first = true;
  for (auto& [k, v] : kinds) {
    printf("%s\"%s\":%llu", first ? "" : ",", k.c_str(), (unsigned long long)v);
    first = false;
  }
  printf("}}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto v = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--help") {
      puts(
          "usage: fy-fwd-loadgen --proxy IP:PORT --mode small|tls|bulk|rate [--url URL] "
          "[--connect HOST:PORT] [--path P] [--samples N] [--parallel P] [--seconds S] "
          "[--concurrency C]");
      return 0;
    } else if (k == "--mode")
      a.mode = v();
    else if (k == "--proxy")
      a.proxy = v();
    else if (k == "--url")
      a.url = v();
    else if (k == "--connect")
      a.connect = v();
    else if (k == "--path")
      a.path = v();
    else if (k == "--samples")
      a.samples = atoi(v().c_str());
    else if (k == "--parallel")
      a.parallel = atoi(v().c_str());
    else if (k == "--concurrency")
      a.concurrency = atoi(v().c_str());
    else if (k == "--seconds")
      a.seconds = atof(v().c_str());
    else {
      fprintf(stderr, "fy-fwd-loadgen: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  auto hp = fy::parse_authority(a.proxy, 0);
  if (!hp || !fy::make_sockaddr(hp->host, hp->port, &g_proxy, &g_proxy_len)) {
    fprintf(stderr, "fy-fwd-loadgen: --proxy must be IP:PORT\n");
    return 2;
  }
  if (a.mode == "small") return run_small(a);
  if (a.mode == "tls") return run_tls(a);
  if (a.mode == "bulk") return run_bulk(a);
  if (a.mode == "rate") return run_rate(a);
  fprintf(stderr, "fy-fwd-loadgen: --mode is small, tls, bulk or rate\n");
  return 2;
}

#include "sys.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace fy::machine {

namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// One fd, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

}  // namespace

bool on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* p = std::getenv("PATH");
  std::string path = p ? p : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string full = dir + "/" + program;
    struct stat st {};
    if (::stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(full.c_str(), X_OK) == 0)
      return true;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return false;
}

RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
              const std::string& stdin_path) {
  RunResult r;
  if (argv.empty() || !on_path(argv[0])) {
    r.rc = 127;
    r.err = argv.empty() ? "no program" : argv[0] + ": not found";
    return r;
  }
  int in = ::open(stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return {127, "", stdin_path + ": " + std::strerror(errno)};
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in);
    return {127, "", std::strerror(errno)};
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(in);
    ::close(out[0]);
    ::close(out[1]);
    return {127, "", std::strerror(errno)};
  }
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(in, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvp(cargv[0], cargv.data());
    _exit(127);
  }
  ::close(in);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return {127, "", std::strerror(errno)};
  }
  ::setpgid(pid, pid);
  auto deadline = Clock::now() + timeout;
  bool timed_out = false;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[8192];
  while (open_fds > 0) {
    int left = ms_left(deadline);
    if (left == 0) {
      timed_out = true;
      break;
    }
    int n = ::poll(fds, 2, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (timed_out) {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) r.rc = 124;
  else if (WIFEXITED(status)) r.rc = WEXITSTATUS(status);
  else r.rc = 128 + WTERMSIG(status);
  return r;
}

Probe ping_socket(const std::string& uri, std::chrono::milliseconds timeout) {
  std::string path = uri.rfind("unix://", 0) == 0 ? uri.substr(7) : uri;
  if (path.empty()) return {false, "no socket (the machine has none yet)"};
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {false, "no socket file at " + path};
  if (!S_ISSOCK(st.st_mode)) return {false, path + " is not a socket"};
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return {false, "socket path too long: " + path};
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (s.fd < 0) return {false, std::string("socket(): ") + std::strerror(errno)};
  auto deadline = Clock::now() + timeout;
  if (::connect(s.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno == ECONNREFUSED) return {false, "a dead socket file (nobody listening): " + path};
    if (errno != EAGAIN && errno != EINPROGRESS)
      return {false, "connect " + path + ": " + std::strerror(errno)};
    pollfd p{s.fd, POLLOUT, 0};
    if (::poll(&p, 1, ms_left(deadline)) <= 0)
      return {false, "connect " + path + " not accepted within the deadline (backlog full)"};
    int e = 0;
    socklen_t el = sizeof e;
    ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (e != 0) return {false, "connect " + path + ": " + std::strerror(e)};
  }
  static constexpr std::string_view req =
      "GET /_ping HTTP/1.1\r\nHost: d\r\nUser-Agent: fy-machine\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < req.size()) {
    ssize_t n = ::send(s.fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{s.fd, POLLOUT, 0};
      if (::poll(&p, 1, ms_left(deadline)) <= 0) return {false, "the socket takes no request"};
      continue;
    }
    return {false, std::string("sending GET /_ping: ") + std::strerror(errno)};
  }
  std::string resp;
  char buf[4096];
  for (;;) {
    // Done as soon as a whole 200 "OK" is in; a keep-alive server may not close.
    size_t hend = resp.find("\r\n\r\n");
    if (hend != std::string::npos && resp.compare(hend + 4, 2, "OK") == 0) break;
    int left = ms_left(deadline);
    if (left == 0) {
      if (resp.empty())
        return {false, "the socket accepts but never answers GET /_ping (a wedged listener): " + path};
      break;
    }
    pollfd p{s.fd, POLLIN, 0};
    int n = ::poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t got = ::recv(s.fd, buf, sizeof buf, 0);
    if (got > 0) {
      resp.append(buf, static_cast<size_t>(got));
      if (resp.size() > 65536) break;
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    break;  // EOF or reset
  }
  if (resp.empty()) return {false, "the socket closed without answering GET /_ping (the forward is up, the engine behind it is not): " + path};
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.size() < 12 || resp.compare(9, 3, "200") != 0) {
    std::string first = resp.substr(0, resp.find("\r\n"));
    if (first.size() > 80) first.resize(80);
    return {false, "GET /_ping answered '" + first + "', not 200: " + path};
  }
  size_t hend = resp.find("\r\n\r\n");
  if (hend == std::string::npos || resp.compare(hend + 4, 2, "OK") != 0)
    return {false, "GET /_ping answered 200 without the body OK: " + path};
  return {true, ""};
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool write_file(const std::string& path, const std::string& data, mode_t mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool mkdirs(const std::string& path, mode_t mode) {
  if (path.empty()) return false;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) return false;
    }
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool pid_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  // A zombie is not alive: it is only waiting to be reaped.
  auto st = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (st) {
    size_t rp = st->rfind(')');
    if (rp != std::string::npos && rp + 2 < st->size() && (*st)[rp + 2] == 'Z') return false;
  }
  return true;
}

void terminate(const std::vector<pid_t>& pids, std::chrono::milliseconds wait) {
  for (int sig : {SIGTERM, SIGKILL}) {
    bool any = false;
    for (pid_t p : pids)
      if (pid_alive(p)) {
        ::kill(p, sig);
        any = true;
      }
    if (!any) return;
    auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until &&
           std::any_of(pids.begin(), pids.end(), pid_alive))
      sleep_for(std::chrono::milliseconds(50));
  }
}

std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
  return l;
}

std::optional<pid_t> live_pid_file(const std::string& path) {
  auto t = read_file(path);
  if (!t) return std::nullopt;
  char* end = nullptr;
  long v = std::strtol(t->c_str(), &end, 10);
  if (v <= 0 || v > 1 << 22) return std::nullopt;
  if (!pid_alive(static_cast<pid_t>(v))) return std::nullopt;
  return static_cast<pid_t>(v);
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  static const double scale = [] {
    const char* v = std::getenv("FY_MACHINE_TIME_SCALE");
    double s = v ? std::atof(v) : 1.0;
    return (s > 0 && s <= 1.0) ? s : 1.0;
  }();
  return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(d.count()) * scale));
}

void sleep_for(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

}  // namespace fy::machine

namespace fy::machine {

pid_t spawn_detached(const std::vector<std::string>& argv, const std::string& log) {
  if (argv.empty()) return -1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t mid = ::fork();
  if (mid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    return -1;
  }
  if (mid == 0) {
    // The middle process: a new session, then the daemon, whose pid goes up
    // the pipe; the middle exits at once, so init reaps the daemon.
    ::setsid();
    pid_t d = ::fork();
    if (d == 0) {
      int in = ::open("/dev/null", O_RDONLY);
      int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (in >= 0) ::dup2(in, 0);
      if (out >= 0) {
        ::dup2(out, 1);
        ::dup2(out, 2);
      }
      ::execvp(cargv[0], cargv.data());
      _exit(127);
    }
    ssize_t w = ::write(p[1], &d, sizeof d);
    (void)w;
    _exit(0);
  }
  ::close(p[1]);
  pid_t d = -1;
  ssize_t got = ::read(p[0], &d, sizeof d);
  ::close(p[0]);
  int st = 0;
  ::waitpid(mid, &st, 0);
  return got == sizeof d ? d : -1;
}

int free_loopback_port() {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

}  // namespace fy::machine

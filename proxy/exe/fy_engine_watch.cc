// fy-engine-watch: follows the container engine through its API socket and
// appends a snapshot of each container's addresses beside the Network Log, so
// fy-netlog can name who made each row (docs/engine-watch.md).
//
// One thread, one poll(2) loop over three kinds of descriptor: the event
// stream, the control socket and its one client at a time. Requests to the
// engine for a list are blocking with a deadline: they go to a local socket and
// take milliseconds; while one runs, the event stream buffers in the kernel.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/args.h"
#include "core/text.h"
#include "core/clock.h"
#include "core/fd.h"
#include "core/log.h"
#include "proxy/engine/client.h"
#include "proxy/engine/engine.h"
#include "proxy/netlog/reader.h"
#include "proxy/netlog/snapshot.h"
#include "proxy/netlog/writer.h"

namespace {

using namespace fy;
using namespace fy::engine;

constexpr const char* kUsage = R"(Usage: fy-engine-watch --socket PATH [OPTIONS]
       fy-engine-watch --probe [--control PATH | --state-dir DIR]

Follows the container engine's API socket (podman system service, or the VM's
forwarded libpod socket): its event stream, and a full list every interval and
after any gap. Appends one snapshot per container start, stop, die, removal and
network connect or disconnect (time, id, the engine's claims of name and compose
project/service, each endpoint's network, interface and address) to
<state>/logs/engine.jsonl, rotated as the Network Log is. fy-netlog reads it to
name who made each row.

Options:
  --socket PATH          the engine's API socket (required)
  --state-dir DIR        default $XDG_STATE_HOME/foldyard/egress (the proxy's)
  --log PATH             the snapshot log (default <state>/logs/engine.jsonl)
  --control PATH         the control socket (default <state>/engine-watch.sock)
  --list-interval-ms N   full list this often (default 30000; also the heartbeat)
  --max-bytes N          rotate past this size (default 5 MiB)
  --backups N            dated backups kept (default 5)
  --timeout-ms N         deadline of one request to the engine (default 5000)
  --log-level LEVEL      debug, info, warn, error (default info)
  --probe                ask a running watcher for its status line; exit 0 if ok
  -h, --help             this text
)";

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

std::string default_state_dir() {
  const char* x = std::getenv("XDG_STATE_HOME");
  std::string base;
  if (x && x[0] == '/') {
    base = x;
  } else {
    const char* home = std::getenv("HOME");
    base = std::string(home ? home : "/root") + "/.local/state";
  }
  return base + "/foldyard/egress";
}

// "%7B%22id%22%3A%5B%22<id>%22%5D%7D": ids are hex, so nothing else needs escaping.
std::string id_filter(const std::string& id) {
  return "%7B%22id%22%3A%5B%22" + id + "%22%5D%7D";
}

struct Stats {
  uint64_t events = 0;      // relevant events handled
  uint64_t bad_events = 0;  // lines of the stream that were not events
  uint64_t snapshots = 0;   // snapshot lines appended
  uint64_t lists = 0;
  uint64_t list_failures = 0;
  uint64_t connects = 0;    // event streams opened
  uint64_t gaps = 0;        // re-syncs after a lost stream
};

class Watcher {
 public:
  Watcher(std::string sock, netlog::WriterOptions wo, int list_interval_ms, int timeout_ms)
      : sock_(std::move(sock)),
        writer_(std::move(wo)),
        list_interval_ms_(list_interval_ms),
        timeout_ms_(timeout_ms) {}

  // The last state of each container, from the log as it is on disk.
  void seed() {
    auto files = netlog::list_log_files(writer_.path());
    if (!files) return;
    size_t n = 0;
    for (const auto& f : *files) {
      FILE* fp = std::fopen(f.path.c_str(), "re");
      if (!fp) continue;
      char* line = nullptr;
      size_t cap = 0;
      ssize_t len;
      while ((len = ::getline(&line, &cap, fp)) > 0) {
        std::string_view l(line, static_cast<size_t>(len));
        if (l.back() != '\n') break;  // torn: the next record starts after it
        l.remove_suffix(1);
        if (auto s = netlog::parse_snapshot(l)) {
          tracker_.seed(*s);
          ++n;
        }
      }
      std::free(line);
      std::fclose(fp);
    }
    log::info("engine log {}: {} records read, {} containers known", writer_.path(), n,
              tracker_.size());
  }

  void run(int control_fd) {
    uint64_t next_open = 0, next_list = 0, backoff = 250;
    bool first = true;
    Fd client;  // the one control client at a time
    while (!g_stop) {
      uint64_t now = mono_ms();
      if (stream_.fd() < 0 && now >= next_open) {
        auto r = stream_.open(sock_, "/v1.40/events?stream=true", timeout_ms_);
        if (r && resync(first ? "start" : "resync")) {
          ++stats_.connects;
          if (!first) ++stats_.gaps;
          first = false;
          backoff = 250;
          engine_error_.clear();
          next_list = now + static_cast<uint64_t>(list_interval_ms_);
          log::info("following the engine at {}", sock_);
        } else {
          std::string why = r ? last_list_error_ : r.error().message;
          if (why != engine_error_) log::warn("{} (retrying; snapshots resume with a full list)", why);
          engine_error_ = why;
          stream_.close();
          next_open = now + backoff;
          backoff = std::min<uint64_t>(backoff * 2, 5000);
        }
      }
      if (stream_.fd() >= 0 && now >= next_list) {
        list(false);
        next_list = now + static_cast<uint64_t>(list_interval_ms_);
      }
      flush();

      pollfd pfd[3];
      int n = 0;
      int i_stream = -1, i_ctl = -1, i_client = -1;
      if (stream_.fd() >= 0) pfd[i_stream = n++] = {stream_.fd(), POLLIN, 0};
      if (control_fd >= 0 && !client) pfd[i_ctl = n++] = {control_fd, POLLIN, 0};
      if (client) pfd[i_client = n++] = {client.get(), POLLIN, 0};
      uint64_t wake = stream_.fd() >= 0 ? next_list : next_open;
      now = mono_ms();
      int timeout = wake > now ? static_cast<int>(std::min<uint64_t>(wake - now, 1000)) : 0;
      int rc = ::poll(pfd, static_cast<nfds_t>(n), timeout);
      if (rc < 0 && errno != EINTR) {
        log::error("poll: {}", std::strerror(errno));
        break;
      }
      if (rc <= 0) continue;
      if (i_stream >= 0 && pfd[i_stream].revents) {
        auto r = stream_.read_some([this](std::string_view line) { on_line(line); });
        if (!r) {
          log::warn("{}: the event stream is lost; re-syncing from a full list", r.error().message);
          engine_error_ = r.error().message;
          stream_.close();
          next_open = mono_ms();  // at once: the list after it covers the gap
        }
      }
      if (i_ctl >= 0 && (pfd[i_ctl].revents & POLLIN)) {
        client.reset(::accept4(control_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        client_deadline_ = mono_ms() + 2000;
      }
      if (i_client >= 0 && pfd[i_client].revents) serve(client);
      if (client && mono_ms() > client_deadline_) client.reset();
    }
    client.reset();
    netlog::Snapshot stop;
    stop.kind = netlog::Snapshot::Kind::watch;
    stop.event = "stop";
    stop.ts_ms = wall_ms();
    append(stop);
    flush();
  }

  std::string status_line() const {
    uint64_t age = last_list_mono_ ? mono_ms() - last_list_mono_ : 0;
    std::string fields = fmt::format(
        "pid={} engine={} events={} bad_events={} snapshots={} lists={} list_failures={} "
        "connects={} gaps={} containers={} last_list_ms_ago={} write_errors={} rows_dropped={} "
        "rotations={} log={}",
        ::getpid(), stream_.fd() >= 0 ? "following" : "unreachable", stats_.events,
        stats_.bad_events, stats_.snapshots, stats_.lists, stats_.list_failures, stats_.connects,
        stats_.gaps, tracker_.size(), last_list_mono_ ? std::to_string(age) : "never",
        writer_.stats().write_errors, writer_.stats().rows_dropped, writer_.stats().rotations,
        writer_.path());
    std::string why;
    if (stream_.fd() < 0)
      why = "engine unreachable: " + engine_error_;
    else if (!last_list_mono_ || age > 3 * static_cast<uint64_t>(list_interval_ms_))
      why = "no list from the engine for " + std::to_string(age) + " ms";
    else if (!writer_.last_error().empty() && writer_.stats().write_errors > reported_errors_)
      why = "cannot write: " + writer_.last_error();
    return why.empty() ? "ok " + fields : "fail " + why + " | " + fields;
  }

 private:
  void append(const netlog::Snapshot& s) {
    std::string line;
    netlog::append_snapshot_json(line, s);
    writer_.append_line(line);
    if (s.kind == netlog::Snapshot::Kind::container) ++stats_.snapshots;
  }

  void flush() {
    uint64_t rot = writer_.stats().rotations;
    uint64_t errs = writer_.stats().write_errors;
    writer_.flush();
    if (writer_.stats().write_errors == errs) reported_errors_ = errs;
    // A new file begins with the whole state, so each file stands alone once
    // older ones are pruned.
    if (writer_.stats().rotations != rot && stream_.fd() >= 0) {
      list(true);
      writer_.flush();
    }
  }

  bool refresh_ifaces() {
    auto body = http_get(sock_, "/v4.0.0/libpod/networks/json", timeout_ms_, kMaxListBody);
    if (!body) return false;
    auto n = parse_networks(*body);
    if (!n) return false;
    ifaces_ = std::move(*n);
    return true;
  }

  Result<std::vector<Container>> fetch(const std::string& target) {
    auto body = http_get(sock_, target, timeout_ms_, kMaxListBody);
    if (!body) return std::move(body).take_error();
    auto list = parse_containers(*body);
    if (!list) return make_error(list.error().code, "{} (from GET {})", list.error().message, target);
    if (Tracker::missing_iface(*list, ifaces_)) refresh_ifaces();
    return list;
  }

  // A full list: the marker first, then the snapshots, all at one time.
  bool list(bool all, const char* marker = "list") {
    auto l = fetch("/v1.40/containers/json?all=true");
    if (!l) {
      ++stats_.list_failures;
      last_list_error_ = l.error().message;
      log::warn("{}", l.error().message);
      return false;
    }
    int64_t now = wall_ms();
    auto snaps = tracker_.on_list(*l, ifaces_, now, all);
    netlog::Snapshot m;
    m.kind = netlog::Snapshot::Kind::watch;
    m.event = marker;
    m.ts_ms = now;
    m.containers = l->size();
    append(m);
    for (const auto& s : snaps) append(s);
    ++stats_.lists;
    last_list_mono_ = mono_ms();
    return true;
  }

  bool resync(const char* marker) {
    refresh_ifaces();
    return list(true, marker);
  }

  void on_line(std::string_view line) {
    auto e = parse_event(line);
    if (!e) {
      if (stats_.bad_events++ == 0) log::warn("the engine sent a line that is not an event: {}", e.error().message);
      return;
    }
    if (!relevant(*e)) return;
    ++stats_.events;
    auto l = fetch("/v1.40/containers/json?all=true&filters=" + id_filter(e->id));
    if (!l) {
      // Not knowing is not a snapshot: the next list records what it is.
      ++stats_.list_failures;
      log::warn("{} (after {} {})", l.error().message, e->action, e->id.substr(0, 12));
      return;
    }
    const Container* c = nullptr;
    for (const auto& k : *l)
      if (k.id == e->id || k.id.rfind(e->id, 0) == 0) c = &k;
    append(tracker_.on_event(*e, c, ifaces_, wall_ms()));
  }

  // Answers one control line, then closes the client (kept open while
  // nothing has arrived yet).
  void serve(Fd& client) {
    const int fd = client.get();
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
      std::string_view cmd(buf, static_cast<size_t>(n));
      while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == '\r')) cmd.remove_suffix(1);
      std::string out = cmd == "status" ? status_line() : "error unknown command (try: status)";
      out += '\n';
      (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    }
    client.reset();
  }

  std::string sock_;
  netlog::Writer writer_;
  int list_interval_ms_;
  int timeout_ms_;
  EventStream stream_;
  Tracker tracker_;
  Ifaces ifaces_;
  Stats stats_;
  std::string engine_error_ = "not connected yet";
  std::string last_list_error_;
  uint64_t last_list_mono_ = 0;
  uint64_t client_deadline_ = 0;
  uint64_t reported_errors_ = 0;
};

// The control socket, listening; empty (errno set) when it cannot be made.
Fd listen_control(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa.sun_path)) {
    errno = ENAMETOOLONG;
    return Fd();
  }
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return fd;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(fd.get(), 8) != 0) {
    int e = errno;
    fd.reset();
    errno = e;
    return fd;
  }
  ::chmod(path.c_str(), 0600);
  return fd;
}

int probe(const std::string& path, int timeout_ms) {
  auto fd = connect_unix(path, timeout_ms);
  if (!fd) {
    fmt::print(stderr, "fy-engine-watch: no watcher answers at {}: {}\n", path, fd.error().message);
    return 1;
  }
  (void)::send(fd->get(), "status\n", 7, MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd->get(), buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  fd->reset();
  if (out.empty()) {
    fmt::print(stderr, "fy-engine-watch: the watcher at {} did not answer\n", path);
    return 1;
  }
  fmt::print("{}", out);
  return out.rfind("ok ", 0) == 0 ? 0 : 1;
}


}  // namespace

int main(int argc, char** argv) {
  std::string sock, state, log_path, control;
  long interval = 30000, max_bytes = 5 * 1024 * 1024, backups = 5, timeout = 5000;
  log::Level level = log::Level::info;
  bool do_probe = false;
  auto bad = [](const std::string& m) {
    fmt::print(stderr, "fy-engine-watch: {}\nRun `fy-engine-watch --help` for the options.\n", m);
    return 2;
  };
  using Refusal = ArgParser::Refusal;
  auto in_range = [](long* out, long lo, long hi, std::string why) {
    return [=](const std::string& v) -> Refusal {
      if (!parse_long_in(v, lo, hi, out)) return why;
      return std::nullopt;
    };
  };
  ArgParser p;
  p.stop("-h,--help")
      .value("--socket", &sock)
      .value("--state-dir", &state)
      .value("--log", &log_path)
      .value("--control", &control)
      .value("--list-interval-ms",
             in_range(&interval, 100, 3600000, "--list-interval-ms: give 100..3600000"))
      .value("--max-bytes", in_range(&max_bytes, 4096, 1L << 40, "--max-bytes: give 4096 or more"))
      .value("--backups", in_range(&backups, 1, 1000, "--backups: give 1..1000"))
      .value("--timeout-ms", in_range(&timeout, 100, 600000, "--timeout-ms: give 100..600000"))
      .value("--log-level",
             [&](const std::string& v) -> Refusal {
               auto l = log::parse_level(v);
               if (!l) return fmt::format("--log-level: '{}' is not debug, info, warn or error", v);
               level = *l;
               return std::nullopt;
             })
      .flag("--probe", &do_probe);
  ParsedArgs args = p.parse(argc, argv);
  if (args.stopped_at) {
    fmt::print("{}", kUsage);
    return 0;
  }
  if (args.problem) {
    const ArgProblem& e = *args.problem;
    switch (e.kind) {
      case ArgProblem::Kind::needs_value: return bad(fmt::format("{} needs a value", e.option));
      case ArgProblem::Kind::bad_value: return bad(e.message);
      case ArgProblem::Kind::no_value: return bad(fmt::format("{} takes no value", e.option));
      case ArgProblem::Kind::unknown: return bad(fmt::format("unknown option '{}'", e.option));
    }
  }
  if (!args.positional.empty())
    return bad(fmt::format("unexpected argument '{}'", args.positional.front()));
  if (state.empty()) state = default_state_dir();
  if (control.empty()) control = state + "/engine-watch.sock";
  if (do_probe) return probe(control, static_cast<int>(timeout));
  if (sock.empty()) return bad("--socket is required: the engine's API socket (podman system service)");
  if (log_path.empty()) log_path = state + "/logs/engine.jsonl";

  log::init("fy-engine-watch", level);
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  ::mkdir(state.c_str(), 0700);
  // One watcher per log: a second would append every record twice and take
  // the first one's control socket. The lock dies with its holder.
  std::string lock_path = log_path + ".lock";
  {
    std::string dir = log_path.substr(0, log_path.rfind('/'));
    ::mkdir(dir.c_str(), 0700);
  }
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0 || ::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    fmt::print(stderr,
               "fy-engine-watch: another fy-engine-watch is writing {} (lock {}: {}). Stop it "
               "first, or give this one another --state-dir or --log.\n",
               log_path, lock_path, lock < 0 ? std::strerror(errno) : "held");
    return 1;
  }
  Fd ctl = listen_control(control);
  if (!ctl) {
    fmt::print(stderr, "fy-engine-watch: cannot listen on the control socket {}: {}\n", control,
               std::strerror(errno));
    return 1;
  }
  netlog::WriterOptions wo;
  wo.path = log_path;
  wo.max_bytes = static_cast<uint64_t>(max_bytes);
  wo.backups = static_cast<int>(backups);
  wo.what = "engine log";
  Watcher w(sock, wo, static_cast<int>(interval), static_cast<int>(timeout));
  w.seed();
  w.run(ctl.get());
  ctl.reset();
  ::unlink(control.c_str());
  log::info("stopped");
  return 0;
}

#include "forwarder/forwarder.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/json.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/net.h"
#include "core/netns_path.h"
#include "forwarder/redirect.h"

namespace fy::fwd {
namespace {

constexpr uint64_t kBurstMs = 1000;
constexpr uint64_t kBurstEveryMs = 5;
// After the redirect could not be installed in a namespace, the next attempt
// there waits this long (an nft transaction blocks the loop for milliseconds;
// the event burst would otherwise retry every 5 ms).
constexpr uint64_t kRedirectRetryMs = 250;
// [limits] workers = 0 (the default): one per two CPUs, at most this many.
constexpr unsigned kMaxDefaultWorkers = 8;

std::string dirname_of(const std::string& p) {
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

// The uid of a control peer (SO_PEERCRED), -1 when it cannot be read.
int64_t peer_uid(uv_pipe_t* pipe) {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(pipe), &fd) != 0) return -1;
  ucred cr{};
  socklen_t len = sizeof cr;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return -1;
  return cr.uid;
}

// Makes `dir` (and its parents) when missing, saying once at info what it
// made; an error names the path, the reason and the setting that picks
// another place.
Result<void> ensure_dir(const std::string& dir, const char* what, const char* setting) {
  auto made = make_dirs(dir, 0755);
  if (!made)
    return Error{Errc::io, fmt::format("{} (the {}); pick another with {} in the config file",
                                       made.error().message, what, setting)};
  if (!made->empty()) {
    std::string list;
    for (const std::string& d : *made) list += (list.empty() ? "" : ", ") + d;
    log::info("made the {} {} (it did not exist): {}", what, dir, list);
  }
  return {};
}

}  // namespace

// One control connection: a line in, a line out, then it closes. It owns two
// handles (the pipe and a deadline timer) and deletes itself once both have
// closed. Reading stops when the line is answered, and only the write's
// callback closes after that, so a peer that sends more or hangs up while the
// answer is in flight cannot close the pipe twice. A peer that sends no line
// within kDeadlineMs is closed: the socket is 0666, and idle peers must not
// pile up descriptors on the main loop.
struct Forwarder::ControlClient {
  static constexpr uint64_t kDeadlineMs = 2000;
  static constexpr size_t kMaxLine = 256;

  uv_pipe_t pipe{};
  uv_timer_t timer{};
  Forwarder* fw = nullptr;
  std::string in;
  bool answered = false;
  bool closing = false;
  int open_handles = 0;
  uv_write_t write{};
  std::string out;

  void close() {
    if (closing) return;
    closing = true;
    auto done = [](uv_handle_t* h) {
      auto* c = static_cast<ControlClient*>(h->data);
      if (--c->open_handles == 0) delete c;
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe), done);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), done);
  }
  void on_read(ssize_t n, const uv_buf_t* b);
};

void Forwarder::ControlClient::on_read(ssize_t n, const uv_buf_t* b) {
  if (answered || closing) return;  // reading stopped; a write is in flight
  if (n < 0) {
    close();
    return;
  }
  in.append(b->base, static_cast<size_t>(n));
  size_t nl = in.find('\n');
  if (nl == std::string::npos) {
    if (in.size() > kMaxLine) close();
    return;
  }
  std::string cmd = in.substr(0, nl);
  if (!cmd.empty() && cmd.back() == '\r') cmd.pop_back();
  if (cmd == "status")
    out = fw->status_line();
  else if (cmd == "ready")
    out = fw->ready_line();
  else if (cmd == "stats")
    out = fw->stats_json();
  else if (cmd.rfind("start ", 0) == 0)
    out = fw->start_line(cmd, peer_uid(&pipe));
  else
    out = "error unknown command; send one of: status, ready, stats, start <id> <pid>";
  out += '\n';
  answered = true;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe));
  uv_timer_stop(&timer);
  uv_buf_t wb = uv_buf_init(out.data(), out.size());
  write.data = this;
  int rc = uv_write(&write, reinterpret_cast<uv_stream_t*>(&pipe), &wb, 1,
                    [](uv_write_t* w, int) { static_cast<ControlClient*>(w->data)->close(); });
  if (rc != 0) close();
}

Forwarder::Forwarder(Config cfg) : cfg_(std::move(cfg)) {}

Forwarder::~Forwarder() {
  bridge_.reset();
  vm_.reset();
  if (mountinfo_fd_ >= 0) ::close(mountinfo_fd_);
}

void Forwarder::notify(const std::string& msg) {
  const char* path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n >= sizeof sa.sun_path) return;
  std::memcpy(sa.sun_path, path, n);
  if (sa.sun_path[0] == '@') sa.sun_path[0] = 0;
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  ::sendto(fd, msg.data(), msg.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&sa),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n));
  ::close(fd);
}

void Forwarder::check_previous_instance() {
  // We hold the lock, so no forwarder runs on this state_dir. A pid file
  // left behind means the last one never reached its clean shutdown.
  std::string pid_path = cfg_.state_dir + "/pid";
  pid_t prev = read_pid_file(pid_path);
  if (prev > 0 && prev != getpid()) {
    unclean_restart_ = true;
    log::error(
        "the previous fy-forwarder (pid {}) stopped without a clean shutdown; this is "
        "a restart after a crash or a kill. Its connections were reset. Find the cause "
        "in the journal (journalctl -u fy-forwarder).",
        prev);
  }
}

Result<void> Forwarder::start(uv_loop_t* loop) {
  loop_ = loop;
  FY_TRY(ensure_dir(cfg_.state_dir, "state directory", "state_dir = \"DIR\""));
  std::string pid_path = cfg_.state_dir + "/pid";
  // One forwarder per state_dir: an flock held for the process's life (the
  // kernel drops it however the process ends, so a reused pid never counts).
  std::string lock_path = cfg_.state_dir + "/lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return make_error(Errc::io, "cannot open {}: {}", lock_path, strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err != EWOULDBLOCK) return make_error(Errc::io, "flock {}: {}", lock_path, strerror(err));
    return make_error(Errc::refused,
                      "another fy-forwarder (pid {}) is running with state_dir {}; stop it "
                      "first or give this one its own state_dir",
                      read_pid_file(pid_path), cfg_.state_dir);
  }
  check_previous_instance();
  FY_TRY(stamper_.init(cfg_.key_file, cfg_.boot_id_file, cfg_.state_dir));

  if (!make_sockaddr(cfg_.upstream_host, 0, &base_.upstream, &base_.upstream_len))
    return make_error(Errc::invalid_argument, "upstream host {} is not an IP address",
                      cfg_.upstream_host);
  base_.cfg = &cfg_;
  base_.stamper = &stamper_;
  base_.starts = &starts_;
  base_.shared = &shared_;

  if (cfg_.vm.enabled) {
    attributor_ = std::make_unique<Attributor>(cfg_.vm);
    if (auto r = attributor_->start(); !r) {
      attribution_note_ = "proc (bpf failed)";
      log::error(
          "attribution: the BPF recorder is not available: {}. Falling back to the /proc "
          "walk, which costs milliseconds per connection with many sockets open.",
          r.error().message);
    }
    base_.attributor = attributor_.get();
  }

  // Before any worker runs: a splice into a socket its client closed raises
  // SIGPIPE, which must not end the process.
  signal(SIGPIPE, SIG_IGN);
  // The workers, before any listener: a listener has a socket per worker.
  unsigned n = cfg_.workers ? cfg_.workers : default_workers();
  for (unsigned i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>(i, base_);
    if (auto r = w->start(i == 0 ? loop_ : nullptr); !r) {
      stop_workers();
      return make_error(r.error().code, "cannot start the workers: {}", r.error().message);
    }
    workers_.push_back(std::move(w));
  }

  if (cfg_.vm.enabled) {
    auto own = own_netns();
    auto l = Listener::open(worker_ptrs(), cfg_, ListenerKind::vm, -1, own ? *own : NsId{},
                            cfg_.vm.listen, "host");
    if (!l)
      return make_error(l.error().code, "the VM listener cannot listen: {}", l.error().message);
    vm_ = std::move(*l);
    log::info("vm listener: listening on {}", vm_->describe());
  }

  if (cfg_.bridge.enabled) {
    uv_timer_init(loop_, &poll_timer_);
    poll_timer_.data = this;
    uv_timer_init(loop_, &burst_timer_);
    burst_timer_.data = this;
    rescan_bridge("start");
    start_watches();
  }

  FY_TRY(start_control());

  for (auto* s : {&sig_term_, &sig_int_, &sig_hup_}) {
    uv_signal_init(loop_, s);
    s->data = this;
  }
  auto on_sig = [](uv_signal_t* s, int signum) {
    static_cast<Forwarder*>(s->data)->on_signal(signum);
  };
  uv_signal_start(&sig_term_, on_sig, SIGTERM);
  uv_signal_start(&sig_int_, on_sig, SIGINT);
  uv_signal_start(&sig_hup_, on_sig, SIGHUP);

  uv_timer_init(loop_, &watchdog_);
  watchdog_.data = this;
  if (const char* wd = getenv("WATCHDOG_USEC")) {
    uint64_t usec = strtoull(wd, nullptr, 10);
    if (usec >= 2000) {
      uv_timer_start(
          &watchdog_, [](uv_timer_t* t) { static_cast<Forwarder*>(t->data)->on_watchdog(); },
          usec / 2000, usec / 2000);
    }
  }
  uv_timer_init(loop_, &beat_timer_);
  beat_timer_.data = this;
  if (workers_.size() > 1)
    uv_timer_start(
        &beat_timer_,
        [](uv_timer_t* t) {
          for (auto& w : static_cast<Forwarder*>(t->data)->workers_) w->beat();
        },
        kBeatMs, kBeatMs);

  FILE* pf = fopen(pid_path.c_str(), "w");
  if (pf) {
    fprintf(pf, "%d\n", getpid());
    fclose(pf);
  }
  started_ = true;
  notify("READY=1\nSTATUS=" + status_line());
  log::info("serving: {}", status_line());
  return {};
}

Result<std::string> Forwarder::bridge_path() const {
  if (!cfg_.bridge.netns.empty())
    return locate_netns(cfg_.bridge.netns, cfg_.bridge.mount_ns_pid_file);
  pid_t pid = read_pid_file(cfg_.bridge.netns_pid_file);
  if (!pid) return make_error(Errc::not_found, "no live pid in {}", cfg_.bridge.netns_pid_file);
  return "/proc/" + std::to_string(pid) + "/ns/net";
}

bool Forwarder::bridge_current(NsId* at_path, std::string* why) {
  auto located = bridge_path();
  if (!located) {
    if (why) *why = located.error().message;
    return false;
  }
  const std::string& path = *located;
  auto ns = open_netns(path);
  if (!ns) {
    if (why) *why = ns.error().message;
    return false;
  }
  if (at_path) *at_path = ns->id;
  return bridge_ && bridge_->ns() == ns->id;
}

void Forwarder::rescan_bridge(const char* why) {
  if (stopping_ || !cfg_.bridge.enabled) return;
  auto located = bridge_path();
  // A pattern that matches several entries is said once, when it starts:
  // no namespace is followed until one matches (absent otherwise).
  if (std::string several = bridge_unlocated_.update(located); !several.empty())
    log::warn("bridge listener: {}; no namespace is followed until only one matches", several);
  if (!located) {
    bridge_error_ = located.error().message;
    return;
  }
  const std::string& path = *located;
  auto ns = open_netns(path);
  if (!ns) {
    bridge_error_ = ns.error().message;
    return;
  }
  bridge_seen_ = true;
  if (bridge_ && bridge_->ns() == ns->id) {
    bridge_error_.clear();
    return;
  }
  if (cfg_.bridge.redirect && redirect_failed_ == ns->id &&
      mono_ms() - redirect_failed_ms_ < kRedirectRetryMs)
    return;  // bridge_error_ still says why
  auto l = Listener::open(worker_ptrs(), cfg_, ListenerKind::bridge, ns->fd.get(), ns->id,
                          cfg_.bridge.listen, cfg_.bridge.net);
  if (!l) {
    bridge_error_ = l.error().message;
    uint64_t now = mono_ms();
    if (now - last_warn_ms_ > 1000) {
      last_warn_ms_ = now;
      log::warn(
          "bridge listener: cannot listen in the namespace at {} (netns {}): {}; "
          "retrying",
          path, ns->id.ino, bridge_error_);
    }
    return;
  }
  // The listener listens; only with the redirect in place does anything reach
  // it. Fail closed: a namespace without it is not served (the new listener
  // is closed again, the probe fails, the hook waits).
  if (cfg_.bridge.redirect) {
    auto r = run_in_netns(ns->fd.get(), [this] { return install_redirect(cfg_); });
    if (!r) {
      uint64_t now = mono_ms();
      redirect_failed_ = ns->id;
      redirect_failed_ms_ = now;
      bridge_error_ = "the redirect could not be installed: " + r.error().message;
      if (now - last_warn_ms_ > 1000) {
        last_warn_ms_ = now;
        log::error(
            "bridge listener: cannot install the redirect (table {} {}) in the namespace at {} "
            "(netns {}): {}. Containers there cannot reach the proxy without it, so this "
            "namespace is not served: the probe fails and the hook holds containers. Check that "
            "the kernel has nf_tables NAT (nft_chain_nat, nft_redir) and that no other program "
            "owns a table of that name; if something else installs the redirect, set [bridge] "
            "redirect = false. Retrying every {} ms.",
            redirect_family(cfg_), kRedirectTable, path, ns->id.ino, r.error().message,
            kRedirectRetryMs);
      }
      return;
    }
    redirect_failed_ = NsId{};
  }
  std::unique_ptr<Listener> old = std::move(bridge_);
  bridge_ = std::move(*l);
  bridge_error_.clear();
  ++bridge_switches_;
  log::info("bridge listener: listening on {} in netns {} at {} ({}){}{}", bridge_->describe(),
            ns->id.ino, path, why,
            cfg_.bridge.redirect ? fmt::format(", redirect installed (table {} {})",
                                               redirect_family(cfg_), kRedirectTable)
                                 : std::string(),
            old ? fmt::format("; released netns {}", old->ns().ino) : std::string());
  old.reset();  // only now: the old namespace stayed alive until the new one was served
  notify("STATUS=" + status_line());
}

void Forwarder::on_event(const char* why) {
  rescan_bridge(why);
  if (bridge_current(nullptr, nullptr)) return;
  // A namespace file is created before the namespace is mounted on it, and a
  // mount in another mount namespace raises no event here: look again often
  // for a while.
  burst_until_ms_ = mono_ms() + kBurstMs;
  uv_timer_start(
      &burst_timer_,
      [](uv_timer_t* t) {
        auto* fw = static_cast<Forwarder*>(t->data);
        fw->rescan_bridge("event+retry");
        if (fw->bridge_current(nullptr, nullptr) || mono_ms() > fw->burst_until_ms_)
          uv_timer_stop(t);
      },
      kBurstEveryMs, kBurstEveryMs);
}

void Forwarder::watch_dir() {
  std::string target = cfg_.bridge.netns.empty() ? cfg_.bridge.netns_pid_file : cfg_.bridge.netns;
  std::string dir = dirname_of(target);
  if (dir.rfind("/proc/", 0) == 0 && dir.find("/root/") == std::string::npos) return;
  if (stopping_ || !dir_watch_ || dir_watch_->armed()) return;
  // A directory that does not exist yet (/run/user/<uid> before the user's
  // first login) is not watched: the poll timer tries again each tick. With
  // mount_ns_pid_file the directory is watched here, in the forwarder's own
  // mount namespace: podman makes the file in the same tmpfs whichever
  // namespace it binds it in, so its creation is seen; the bind itself raises
  // no event here (on_event's burst and the poll find it).
  dir_watch_->arm(dir);
}

void Forwarder::start_watches() {
  if (cfg_.bridge.watch_events) start_event_watches();
  uv_timer_start(
      &poll_timer_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Forwarder*>(t->data);
        self->rescan_bridge("poll");
        if (self->cfg_.bridge.watch_events) self->watch_dir();
      },
      cfg_.bridge.poll_ms, cfg_.bridge.poll_ms);
}

void Forwarder::start_event_watches() {
  dir_watch_ = std::make_unique<DirWatch>(loop_, [this] { on_event("inotify"); });
  watch_dir();
  mountinfo_fd_ = ::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (mountinfo_fd_ >= 0) {
    uv_poll_init(loop_, &mount_watch_, mountinfo_fd_);
    mount_watch_.data = this;
    uv_poll_start(&mount_watch_, UV_PRIORITIZED, [](uv_poll_t* h, int status, int events) {
      auto* self = static_cast<Forwarder*>(h->data);
      self->on_event("mount");
    });
    mount_watching_ = true;
  }
}

unsigned Forwarder::default_workers() {
  // Half the CPUs this process may run on (a cpuset or taskset is honoured),
  // at least one, at most kMaxDefaultWorkers. The forwarder shares the VM
  // with the clients it serves: on two vCPUs a second worker measured no more
  // connections a second and a slower small request (docs/bench-forwarder.md,
  // "Workers"), while a forwarder that fills a core needs a second loop.
  cpu_set_t set;
  CPU_ZERO(&set);
  unsigned n = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = static_cast<unsigned>(CPU_COUNT(&set));
  return std::clamp(n / 2, 1u, kMaxDefaultWorkers);
}

std::vector<Worker*> Forwarder::worker_ptrs() const {
  std::vector<Worker*> v;
  for (const auto& w : workers_) v.push_back(w.get());
  return v;
}

uint64_t Forwarder::total(Count Counters::*field) const {
  uint64_t n = 0;
  for (const auto& w : workers_) n += (w->ctx().counters.*field).get();
  return n;
}

std::string Forwarder::stats_json() const {
  struct Named {
    const char* name;
    Count Counters::*field;
  };
  static constexpr Named kSummed[] = {
      {"accepted", &Counters::accepted},
      {"over_limit", &Counters::over_limit},
      {"accept_errors", &Counters::accept_errors},
      {"stamped", &Counters::stamped},
      {"stamped_by_start", &Counters::stamped_by_start},
      {"relayed_unstamped", &Counters::relayed_unstamped},
      {"stamps_stripped", &Counters::stamps_stripped},
      {"refused_head", &Counters::refused_head},
      {"refused_ingress", &Counters::refused_ingress},
      {"head_timeouts", &Counters::head_timeouts},
      {"head_eof", &Counters::head_eof},
      {"redials", &Counters::redials},
      {"upstream_failed", &Counters::upstream_failed},
      {"attributed", &Counters::attributed},
      {"attrib_bpf", &Counters::attrib_bpf},
      {"attrib_proc", &Counters::attrib_proc},
      {"attrib_uid", &Counters::attrib_uid},
      {"attrib_refused_pasta", &Counters::attrib_refused_pasta},
      {"attrib_failed", &Counters::attrib_failed},
      {"attrib_us_total", &Counters::attrib_us_total},
      {"fin_closes", &Counters::fin_closes},
      {"rst_closes", &Counters::rst_closes},
      {"rst_forced", &Counters::rst_forced},
      {"rst_waited", &Counters::rst_waited},
      {"rst_by_upstream", &Counters::rst_by_upstream},
      {"aborted", &Counters::aborted},
      {"client_gone", &Counters::client_gone},
      {"local_failed", &Counters::local_failed},
      {"attrib_timeouts", &Counters::attrib_timeouts},
      {"half_closed_timeouts", &Counters::half_closed_timeouts},
      {"bytes_up", &Counters::bytes_up},
      {"bytes_down", &Counters::bytes_down},
      {"bulk_dirs", &Counters::bulk_dirs},
      {"pump_yields", &Counters::pump_yields},
  };
  std::string j;
  JsonObject o(j);
  o.unum("active", shared_.active.load());
  for (const Named& n : kSummed) o.unum(n.name, total(n.field));
  uint64_t us_max = 0, pipes_idle = 0, capped = 0;
  std::string by_worker = "[";
  for (const auto& w : workers_) {
    us_max = std::max(us_max, w->ctx().counters.attrib_us_max.get());
    pipes_idle += w->pipes()->idle();
    capped += w->pipes()->capped();
    if (by_worker.size() > 1) by_worker += ',';
    by_worker += std::to_string(w->ctx().counters.accepted.get());
  }
  by_worker += ']';
  o.unum("attrib_us_max", us_max)
      .unum("seq", stamper_.issued())
      .unum("bridge_switches", bridge_switches_)
      .unum("iface_refreshes", bridge_ ? bridge_->iface_refreshes() : 0)
      .unum("workers", workers_.size())
      .raw("accepted_by_worker", by_worker)
      .unum("pipes_idle", pipes_idle)
      .unum("pipes_grown", shared_.pipes_grown.load())
      .unum("pipes_grow_capped", capped);
  for (size_t i = 1; i < static_cast<size_t>(Refusal::kCount); ++i) {
    uint64_t n = 0;
    for (const auto& w : workers_) n += w->ctx().counters.refused_by[i].get();
    o.unum(std::string("refused_") + refusal_name(static_cast<Refusal>(i)), n);
  }
  o.close();
  return j;
}

std::string Forwarder::status_line() {
  std::string bridge = "off";
  bool serving = started_ && !stopping_;
  std::string fail;
  if (cfg_.bridge.enabled) {
    NsId at{};
    std::string why;
    bool current = bridge_current(&at, &why);
    if (current) {
      bridge = fmt::format("listening:netns={}", at.ino);
    } else if (!at.valid()) {
      // Not a failure: the namespace exists only while bridge containers do.
      // But never-found says the bridge side has served nothing yet; a
      // supervisor that knows bridge containers run asks --require-bridge.
      bridge = bridge_        ? fmt::format("absent:holding={}", bridge_->ns().ino)
               : bridge_seen_ ? std::string("absent")
                              : std::string("absent:never-found");
    } else {
      bridge = fmt::format("not-listening:netns={}", at.ino);
      serving = false;
      auto located = bridge_path();
      fail = "the bridge listener is not listening in the namespace at " +
             (located ? *located : cfg_.bridge.netns) + ": " +
             (bridge_error_.empty() ? "not yet" : bridge_error_);
    }
  }
  std::string vm = "off";
  if (cfg_.vm.enabled) {
    if (vm_)
      vm = "listening:" + vm_->describe();
    else {
      vm = "down";
      serving = false;
      fail = "the VM listener is down";
    }
  }
  if (std::string stalled = stalled_workers(); !stalled.empty()) {
    serving = false;
    fail = stalled + " (its connections stall)";
  }
  if (!started_) fail = "starting";
  if (stopping_) fail = "stopping";
  std::string attribution = !cfg_.vm.enabled                           ? "off"
                            : attributor_ && attributor_->bpf_active() ? "bpf"
                            : attribution_note_.empty()                ? "proc"
                                                                       : attribution_note_;
  for (char& c : attribution)
    if (c == ' ') c = '_';
  std::string counters = fmt::format(
      "pid={} bridge={} vm={} attribution={} active={} accepted={} stamped={} refused_head={} "
      "stamps_stripped={} redials={} upstream_failed={} rst_closes={} seq={} switches={} "
      "workers={}{}",
      getpid(), bridge, vm, attribution, shared_.active.load(), total(&Counters::accepted),
      total(&Counters::stamped), total(&Counters::refused_head), total(&Counters::stamps_stripped),
      total(&Counters::redials), total(&Counters::upstream_failed), total(&Counters::rst_closes),
      stamper_.issued(), bridge_switches_, workers_.size(),
      unclean_restart_ ? " restarted_after_crash=1" : "");
  if (serving) return "ok " + counters;
  return "fail " + fail + " | " + counters;
}

std::string Forwarder::start_line(const std::string& cmd, int64_t uid) {
  std::string id;
  pid_t pid = 0;
  if (!parse_start_line(cmd, &id, &pid))
    return "error usage: start <container id: 12..64 hex digits> <pid>";
  if (uid != 0 && !(uid > 0 && cfg_.vm.walled(static_cast<uint32_t>(uid))))
    return fmt::format("error uid {} may not record starts (root and the walled uids may)", uid);
  auto r = starts_.record(id, pid);
  if (!r) {
    log::warn("start {} pid {}: {}", id.substr(0, 12), pid, r.error().message);
    return "error " + r.error().message;
  }
  log::debug("start {} pid {}: {} addresses recorded", id.substr(0, 12), pid, *r);
  return fmt::format("ok addresses={}", *r);
}

std::string Forwarder::ready_line() {
  rescan_bridge("hook");
  if (!cfg_.bridge.enabled) return "absent bridge listener not configured";
  NsId at{};
  std::string why;
  // The path the answer is about, so the hook can look at it too from its own
  // mount namespace (docs/fy-forwarder.md, "The OCI hook"). Left out for a
  // path with a space, which would not survive as a token.
  auto located = bridge_path();
  std::string path = located ? *located : std::string();
  std::string where = !path.empty() && path.find_first_of(" \t\r\n") == std::string::npos
                          ? " path=" + path
                          : std::string();
  if (bridge_current(&at, &why)) return fmt::format("ready {}{}", at.ino, where);
  if (!at.valid()) return "absent" + where + " " + why;
  return "waiting " +
         (bridge_error_.empty() ? std::string("listener not made yet") : bridge_error_);
}

Result<void> Forwarder::start_control() {
  FY_TRY(ensure_dir(dirname_of(cfg_.control_socket), "control socket's directory",
                    "control_socket = \"PATH\""));
  ::unlink(cfg_.control_socket.c_str());
  uv_pipe_init(loop_, &control_, 0);
  control_.data = this;
  int rc = uv_pipe_bind(&control_, cfg_.control_socket.c_str());
  if (rc == 0)
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&control_), 64, [](uv_stream_t* s, int status) {
      auto* fw = static_cast<Forwarder*>(s->data);
      if (status < 0) return;
      auto* c = new ControlClient();
      c->fw = fw;
      uv_pipe_init(fw->loop_, &c->pipe, 0);
      uv_timer_init(fw->loop_, &c->timer);
      c->pipe.data = c;
      c->timer.data = c;
      c->open_handles = 2;
      if (uv_accept(s, reinterpret_cast<uv_stream_t*>(&c->pipe)) != 0) {
        c->close();
        return;
      }
      uv_timer_start(
          &c->timer, [](uv_timer_t* t) { static_cast<ControlClient*>(t->data)->close(); },
          ControlClient::kDeadlineMs, 0);
      uv_read_start(
          reinterpret_cast<uv_stream_t*>(&c->pipe),
          [](uv_handle_t*, size_t, uv_buf_t* b) {
            // One loop thread, and each read is consumed before the next.
            static char buf[512];
            *b = uv_buf_init(buf, sizeof buf);
          },
          [](uv_stream_t* st, ssize_t n, const uv_buf_t* b) {
            static_cast<ControlClient*>(st->data)->on_read(n, b);
          });
    });
  if (rc != 0)
    return make_error(Errc::io, "control socket {}: {}", cfg_.control_socket, uv_strerror(rc));
  chmod(cfg_.control_socket.c_str(), 0666);  // the hook may run as the VM user
  control_open_ = true;
  return {};
}

std::string Forwarder::stalled_workers() const {
  std::string out;
  uint64_t now = mono_ms();
  for (const auto& w : workers_) {
    uint64_t ms = w->since_beat_ms(now);
    if (ms < kStallMs) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("worker {} has not turned its loop for {} ms", w->index(), ms);
  }
  return out;
}

void Forwarder::on_watchdog() {
  // A wedged worker holds its share of the connections (SO_REUSEPORT keeps
  // sending it new ones): no ping, and systemd restarts the forwarder.
  std::string stalled = stalled_workers();
  if (stalled.empty()) {
    notify("WATCHDOG=1");
    return;
  }
  log::error("{}: withholding the watchdog ping, so systemd restarts the forwarder", stalled);
}

void Forwarder::on_signal(int sig) {
  if (sig == SIGHUP) {
    if (auto r = stamper_.reload_key(); !r) {
      log::error("SIGHUP: the key was not reloaded, the old key stays in use: {}",
                 r.error().message);
    } else {
      log::info("SIGHUP: key reloaded from {}", cfg_.key_file);
    }
    return;
  }
  log::info("signal {}: stopping; live connections are reset", sig);
  stop();
}

void Forwarder::stop() {
  if (stopping_) return;
  stopping_ = true;
  notify("STOPPING=1");
  // The listeners go first: each worker closes its sockets before it
  // resets its connections, so from then on the kernel refuses new ones
  // (one accepted in between is reset with the rest).
  bridge_.reset();
  vm_.reset();
  stop_workers();
  auto close_h = [](auto* h) {
    auto* hh = reinterpret_cast<uv_handle_t*>(h);
    if (hh->type != UV_UNKNOWN_HANDLE && !uv_is_closing(hh)) uv_close(hh, nullptr);
  };
  if (cfg_.bridge.enabled) {
    close_h(&poll_timer_);
    close_h(&burst_timer_);
  }
  if (dir_watch_) dir_watch_->drop();
  if (mount_watching_) close_h(&mount_watch_);
  if (control_open_) {
    close_h(&control_);
    ::unlink(cfg_.control_socket.c_str());
  }
  if (started_) {
    close_h(&watchdog_);
    close_h(&beat_timer_);
    close_h(&sig_term_);
    close_h(&sig_int_);
    close_h(&sig_hup_);
    ::unlink((cfg_.state_dir + "/pid").c_str());
  }
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);  // after the pid file is gone
    lock_fd_ = -1;
  }
}

void Forwarder::stop_workers() {
  // All are asked first, then waited for: they stop side by side.
  for (auto& w : workers_) w->begin_stop();
  for (auto& w : workers_) w->stop();
}

}  // namespace fy::fwd

// lima and podman machine behind Backend. Each command is one run() with a
// deadline; what its output means is decided in plan.cc.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fmt/format.h>

#include "backend.h"
#include "core/text.h"

namespace fy::machine {

using std::chrono::milliseconds;
using namespace std::chrono_literals;

const char* state_name(State s) {
  switch (s) {
    case State::absent: return "absent";
    case State::stopped: return "stopped";
    case State::running: return "running";
    case State::starting: return "starting";
    case State::broken: return "broken";
  }
  return "?";
}

namespace {

std::string argv_str(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_./=:@,").find(c) != std::string_view::npos;
    });
    s += plain ? a : shell_quote(a);
  }
  return s;
}

// ---------------------------------------------------------------- lima ----

class Lima final : public Backend {
 public:
  explicit Lima(Env e) : env_(std::move(e)) {}
  std::string name() const override { return "lima"; }
  std::string cli() const override { return "limactl"; }
  bool supports_concurrent() const override { return true; }

  // `limactl list --json n`, remembered until this process next runs a
  // limactl command that changes the instance (checked() forgets it).
  std::optional<LimaInstance> find(const std::string& n) {
    if (cached_ && cached_name_ == n) return *cached_;
    RunResult r = run({"limactl", "list", "--json", n}, 30s);
    if (r.rc != 0) return std::nullopt;
    std::optional<LimaInstance> out;
    for (auto& i : parse_lima_list(r.out))
      if (i.name == n) out = i;
    cached_ = out;
    cached_name_ = n;
    return out;
  }

  std::string dir(const std::string& n) {
    if (auto i = find(n); i && !i->dir.empty()) return i->dir;
    std::string home = env("LIMA_HOME").value_or(env_.home + "/.lima");
    return home + "/" + n;
  }

  bool exists(const std::string& n) override { return find(n).has_value(); }

  State state(const std::string& n) override {
    auto i = find(n);
    if (!i) return State::absent;
    if (iequals(i->status, "running")) return State::running;
    if (iequals(i->status, "broken")) return State::broken;
    return State::stopped;
  }

  bool create(const std::string& n, const Resources& res, const std::vector<Mount>& m) override {
    std::optional<std::string> vt = env("MACHINE_VMTYPE");
    if (!vt && env_.vm_type) vt = env_.vm_type;
    std::string info;
    if (!vt || vt->empty()) info = run({"limactl", "info"}, 30s).out;
    auto resolved = resolve_vm_type(vt, info);
    if (resolved) env_.say("▶ hypervisor (vmType): " + *resolved);
    auto argv = lima_create_argv("limactl", n, lima_set_expr(res, m, resolved));
    return checked(argv, 600s);
  }

  bool start(const std::string& n) override {
    auto i = find(n);
    if (i && iequals(i->status, "broken")) {
      env_.say(fmt::format("▶ '{}' is Broken (a host agent or driver died) — limactl stop --force {}", n, n));
      run({"limactl", "stop", "--force", n}, 60s);
      cached_.reset();
    }
    reap_orphans(n);
    if (!checked({"limactl", "start", n}, 900s)) return false;
    std::string sock = socket(n).substr(7);
    for (int k = 0; k < 30; ++k) {
      if (::access(sock.c_str(), F_OK) == 0) return true;
      sleep_for(scaled(1000ms));
    }
    env_.say(fmt::format("✗ '{}' started but its socket never appeared: {}", n, sock));
    return false;
  }

  bool stop(const std::string& n) override {
    RunResult r = run({"limactl", "stop", n}, 60s);
    cached_.reset();
    auto left = host_pids(n);
    if (r.rc == 0 && left.empty()) return true;
    env_.say(fmt::format("▶ '{}' did not stop gracefully ({}) — limactl stop --force {}", n,
                         r.rc == 124 ? "no exit within 60 s" : "rc " + std::to_string(r.rc), n));
    bool ok = checked({"limactl", "stop", "--force", n}, 60s);
    return ok && host_pids(n).empty();
  }

  bool remove(const std::string& n) override { return checked({"limactl", "delete", "-f", n}, 120s); }

  std::vector<pid_t> reap_orphans(const std::string& n) override {
    std::string d = dir(n);
    auto ha = live_pid_file(d + "/ha.pid");
    if (!ha || live_pid_file(d + "/qemu.pid") || live_pid_file(d + "/vz.pid")) return {};
    // A host agent whose driver is dead: it may be on its way out; wait, then end it.
    env_.say(fmt::format("▶ '{}' has an orphaned host agent (pid {}, its driver is dead) — ending it", n, *ha));
    auto until = std::chrono::steady_clock::now() + scaled(20s);
    while (std::chrono::steady_clock::now() < until && pid_alive(*ha)) sleep_for(scaled(200ms));
    terminate({*ha}, scaled(5s));
    ::unlink((d + "/ha.pid").c_str());
    return {*ha};
  }

  std::vector<std::string> mounts(const std::string& n) override {
    auto y = read_file(dir(n) + "/lima.yaml");
    return y ? parse_lima_mounts(*y) : std::vector<std::string>{};
  }

  std::string socket(const std::string& n) override {
    auto i = find(n);
    if (!i) return "";
    return "unix://" + (i->dir.empty() ? dir(n) : i->dir) + "/sock/podman.sock";
  }

  std::string guest_socket() const override {
    return fmt::format("/run/user/{}/podman/podman.sock", ::getuid());
  }

  std::optional<SshConfig> ssh_target(const std::string& n) override {
    auto i = find(n);
    if (!i) return std::nullopt;
    auto t = read_file((i->dir.empty() ? dir(n) : i->dir) + "/ssh.config");
    if (!t) return std::nullopt;
    auto c = parse_ssh_config(*t);
    if (!c && i->ssh_port > 0) {
      // lima's config without a Port: the host agent's port from limactl list.
      auto c2 = parse_ssh_config(*t + "\n  Port " + std::to_string(i->ssh_port) + "\n");
      if (c2) return c2;
    }
    return c;
  }

  bool can_provision() const override { return true; }
  std::string provision_id(const std::string& n) override {
    auto y = read_file(dir(n) + "/lima.yaml");
    return y ? parse_provision_id(*y, kProvisionMarker) : "";
  }
  bool set_provision(const std::string& n, const std::string& script) override {
    return checked({"limactl", "edit", "--tty=false", n, "--set",
                    provision_set_expr(script, kProvisionMarker)},
                   120s);
  }
  RunResult guest(const std::string& n, const std::vector<std::string>& argv) override {
    std::vector<std::string> a = {"limactl", "shell", "--workdir", "/", n, "--"};
    a.insert(a.end(), argv.begin(), argv.end());
    return run(a, 20s);
  }

  std::vector<pid_t> host_pids(const std::string& n) override {
    std::string d = dir(n);
    std::vector<pid_t> out;
    for (const char* f : {"/qemu.pid", "/vz.pid", "/ha.pid"})
      if (auto p = live_pid_file(d + f); p && std::find(out.begin(), out.end(), *p) == out.end())
        out.push_back(*p);
    return out;
  }

  std::vector<std::string> list_running() override {
    RunResult r = run({"limactl", "list", "--json"}, 30s);
    std::vector<std::string> out;
    for (auto& i : parse_lima_list(r.out))
      if (iequals(i.status, "running")) out.push_back(i.name);
    return out;
  }

 private:
  // Runs argv; on failure says what failed, with the tool's first stderr line.
  bool checked(const std::vector<std::string>& argv, milliseconds t) {
    RunResult r = run(argv, t);
    cached_.reset();
    if (r.rc == 0) return true;
    env_.say(fmt::format("✗ {} failed ({}){}", argv_str(argv),
                         r.rc == 124 ? "timed out" : "rc " + std::to_string(r.rc),
                         r.err.empty() ? "" : ": " + first_line(r.err)));
    return false;
  }
  Env env_;
  std::optional<std::optional<LimaInstance>> cached_;
  std::string cached_name_;
};

// ------------------------------------------------------- podman machine ----

class Podman final : public Backend {
 public:
  explicit Podman(Env e) : env_(std::move(e)) {}
  std::string name() const override { return "podman"; }
  std::string cli() const override { return "podman"; }
  bool supports_concurrent() const override { return false; }

  RunResult inspect(const std::string& n, const std::string& format) {
    return run({"podman", "machine", "inspect", "--format", format, n}, 30s);
  }

  bool exists(const std::string& n) override {
    return run({"podman", "machine", "inspect", n}, 30s).rc == 0;
  }

  State state(const std::string& n) override {
    RunResult r = inspect(n, "{{.State}}");
    if (r.rc != 0) return State::absent;
    std::string s = to_lower(first_line(r.out));
    if (s == "running") return State::running;
    if (s == "starting") return State::starting;
    return State::stopped;
  }

  bool create(const std::string& n, const Resources& res, const std::vector<Mount>& m) override {
    return checked(podman_init_argv("podman", n, res, m), 900s);
  }

  bool start(const std::string& n) override {
    if (state(n) == State::starting) {
      if (host_pids(n).empty()) {
        // podman#16945/#24416: "Starting" persisted with nothing behind it.
        env_.say(fmt::format("▶ podman machine '{}' says Starting but no VM process is alive — "
                             "a stuck start; stopping it before starting again", n));
        run({"podman", "machine", "stop", n}, 60s);
      } else {
        // A real start in progress: give it the time a boot takes.
        for (int k = 0; k < 60 && state(n) == State::starting; ++k) sleep_for(scaled(1000ms));
        if (state(n) == State::running) return true;
        env_.say(fmt::format("▶ podman machine '{}' stayed Starting for 60 s — ending its processes", n));
        reap_orphans(n);
        run({"podman", "machine", "stop", n}, 60s);
      }
    }
    return checked({"podman", "machine", "start", n}, 900s);
  }

  bool stop(const std::string& n) override {
    RunResult r = run({"podman", "machine", "stop", n}, 60s);
    if (r.rc == 0 && host_pids(n).empty()) return true;
    env_.say(fmt::format("▶ podman machine '{}' did not stop cleanly — ending its processes", n));
    reap_orphans(n);
    return host_pids(n).empty();
  }

  bool remove(const std::string& n) override {
    return checked({"podman", "machine", "rm", "-f", n}, 120s);
  }

  std::vector<pid_t> reap_orphans(const std::string& n) override {
    auto pids = host_pids(n);
    if (pids.empty()) return {};
    terminate(pids, scaled(5s));
    return pids;
  }

  std::vector<std::string> mounts(const std::string& n) override {
    RunResult r = inspect(n, "{{.ConfigDir.Path}}");
    if (r.rc != 0) return {};
    auto j = read_file(first_line(r.out) + "/" + n + ".json");
    return j ? parse_podman_mounts(*j) : std::vector<std::string>{};
  }

  std::string socket(const std::string& n) override {
    RunResult r = inspect(n, "{{.ConnectionInfo.PodmanSocket.Path}}");
    std::string p = first_line(r.out);
    if (r.rc != 0 || p.empty()) return "";
    return "unix://" + p;
  }

  std::string guest_socket() const override { return "/run/docker.sock"; }

  std::optional<SshConfig> ssh_target(const std::string& n) override {
    RunResult r = inspect(
        n, "{{.SSHConfig.RemoteUsername}}\t{{.SSHConfig.Port}}\t{{.SSHConfig.IdentityPath}}");
    if (r.rc != 0) return std::nullopt;
    std::string line = first_line(r.out);  // f's views point into it
    auto f = split_list(line, '\t');
    if (f.size() < 3) return std::nullopt;
    std::string cfg = fmt::format("Host podman-{}\n  User {}\n  Port {}\n  IdentityFile {}\n", n,
                                  trim_ows(f[0]), trim_ows(f[1]), trim_ows(f[2]));
    return parse_ssh_config(cfg);
  }

  // Own-uid krunkit/vfkit/gvproxy/qemu-system processes whose argv names this
  // machine's files (as a whole word: another VM's qemu "-append" is not the
  // machine "app").
  std::vector<pid_t> host_pids(const std::string& n) override {
    std::vector<pid_t> out;
    DIR* d = ::opendir("/proc");
    if (!d) return out;
    uid_t me = ::getuid();
    while (dirent* e = ::readdir(d)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (pid <= 0 || *end) continue;
      std::string base = "/proc/" + std::string(e->d_name);
      auto status = read_file(base + "/status");
      auto comm = read_file(base + "/comm");
      auto cmd = read_file(base + "/cmdline");
      if (!status || !comm || !cmd) continue;
      size_t u = status->find("\nUid:\t");
      if (u == std::string::npos || std::strtoul(status->c_str() + u + 6, nullptr, 10) != me) continue;
      std::string c = first_line(*comm);
      bool vm_tool = c == "krunkit" || c == "vfkit" || c == "gvproxy" || c.rfind("qemu-system", 0) == 0;
      if (vm_tool && cmdline_names_machine(*cmd, n) && pid_alive(static_cast<pid_t>(pid)))
        out.push_back(static_cast<pid_t>(pid));
    }
    ::closedir(d);
    return out;
  }

  std::vector<std::string> list_running() override {
    RunResult r = run({"podman", "machine", "list", "--format", "{{.Name}}|{{.Running}}"}, 30s);
    std::vector<std::string> out;
    for (auto& m : parse_podman_list(r.out))
      if (m.running) out.push_back(m.name);
    return out;
  }

 private:
  bool checked(const std::vector<std::string>& argv, milliseconds t) {
    RunResult r = run(argv, t);
    if (r.rc == 0) return true;
    env_.say(fmt::format("✗ {} failed ({}){}", argv_str(argv),
                         r.rc == 124 ? "timed out" : "rc " + std::to_string(r.rc),
                         r.err.empty() ? "" : ": " + first_line(r.err)));
    return false;
  }
  Env env_;
};

}  // namespace

std::unique_ptr<Backend> make_lima(Env e) { return std::make_unique<Lima>(std::move(e)); }
std::unique_ptr<Backend> make_podman(Env e) { return std::make_unique<Podman>(std::move(e)); }

}  // namespace fy::machine

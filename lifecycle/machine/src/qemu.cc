// The qemu backend's I/O (qemu.h says what a VM is). Chosen over driving
// lifecycle/guest/fyguest.py: that engine's guest lives as long as the Python
// object that booted it, while a Backend's VM must outlive each fy-machine
// command (ensure, then status, ssh-target, stop from other processes).
// qemu's own -daemonize/-pidfile gives that, the argv is a pure function
// (qemu_plan.cc, unit-tested like lima's), and fy-machine needs no Python.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "qemu.h"

namespace fy::machine {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

class Qemu final : public Backend {
 public:
  Qemu(Env e, QemuOptions o) : env_(std::move(e)), o_(std::move(o)) {}
  std::string name() const override { return "qemu"; }
  std::string cli() const override { return "qemu-system-x86_64"; }
  bool supports_concurrent() const override { return true; }

  std::string dir(const std::string& n) const { return o_.home + "/" + n; }
  std::optional<QemuVm> vm(const std::string& n) const {
    auto t = read_file(dir(n) + "/vm.json");
    return t ? parse_qemu_vm(*t) : std::nullopt;
  }
  std::optional<pid_t> qemu_pid(const std::string& n) const {
    return live_pid_file(dir(n) + "/qemu.pid");
  }

  bool exists(const std::string& n) override { return vm(n).has_value(); }

  State state(const std::string& n) override {
    if (!exists(n)) return State::absent;
    return qemu_pid(n) ? State::running : State::stopped;
  }

  bool create(const std::string& n, const Resources& res, const std::vector<Mount>& m) override {
    std::string d = dir(n);
    if (!mkdirs(d + "/boot", 0700)) {
      env_.say(fmt::format("✗ cannot create {}: {}", d, std::strerror(errno)));
      return false;
    }
    env_.say("▶ the guest image: " + o_.build_image + " (cached; minutes when its inputs changed)");
    RunResult b = run({o_.build_image}, 3600s);
    if (b.rc != 0) {
      std::string tail = b.err.size() > 2000 ? b.err.substr(b.err.size() - 2000) : b.err;
      env_.say(fmt::format("✗ {} failed (rc {}):\n{}", o_.build_image, b.rc, tail));
      return false;
    }
    std::string out = b.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    QemuVm v;
    v.image = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    v.cpus = res.cpus;
    v.memory_mib = memory_mib(res.memory);
    for (const auto& mt : m) v.mounts.push_back(mt.location);
    if (!parse_qemu_vm(render_qemu_vm(v))) {
      env_.say(fmt::format("✗ cannot make a qemu VM of this: image '{}', a mount with ',' or a "
                           "newline in its path, or memory {} MiB out of range",
                           v.image, v.memory_mib));
      return false;
    }
    RunResult q = run({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                       v.image + "/rootfs.img", d + "/overlay.qcow2"},
                      60s);
    if (q.rc != 0) {
      env_.say("✗ qemu-img create failed: " + first_line(q.err));
      return false;
    }
    if (!write_file(d + "/boot/hook", qemu_boot_hook(v.mounts, guest_socket()), 0755) ||
        !write_file(d + "/vm.json", render_qemu_vm(v), 0600)) {
      env_.say(fmt::format("✗ cannot write {}: {}", d, std::strerror(errno)));
      return false;
    }
    return true;
  }

  // The guest's ssh host key, made here (qemu.h: kQemuHostKeyFile).
  std::string host_key(const std::string& n) const { return dir(n) + "/boot/" + std::string(kQemuHostKeyFile); }
  std::string key_alias(const std::string& n) const { return "fy-qemu-" + n; }

  std::vector<HostKey> known_host_keys(const std::string& n) override {
    auto pub = read_file(host_key(n) + ".pub");
    return pub ? parse_host_keys(key_alias(n) + " " + first_line(*pub)) : std::vector<HostKey>{};
  }

  // Makes the guest's host key once per VM (a VM made before this has none:
  // it gets one at its next start), and the backend's own known_hosts of it.
  bool make_host_key(const std::string& n) {
    std::string k = host_key(n);
    if (known_host_keys(n).empty() || ::access(k.c_str(), R_OK) != 0) {
      ::unlink(k.c_str());
      ::unlink((k + ".pub").c_str());
      RunResult g = run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key_alias(n), "-f", k}, 60s);
      if (g.rc != 0 || known_host_keys(n).empty()) {
        env_.say(fmt::format("✗ ssh-keygen could not make the guest's host key {}: {}", k,
                             first_line(g.err.empty() ? g.out : g.err)));
        return false;
      }
    }
    if (!write_file(dir(n) + "/known_hosts", render_known_hosts(key_alias(n), known_host_keys(n)), 0600)) {
      env_.say(fmt::format("✗ cannot write {}/known_hosts: {}", dir(n), std::strerror(errno)));
      return false;
    }
    return true;
  }

  // Strict: the one key is the one made here (a guest still serving fy-init's
  // own key, before the hook replaced it, is not answered).
  std::vector<std::string> ssh_base(const std::string& n, const std::string& user) {
    auto v = vm(n);
    auto port = read_file(dir(n) + "/ssh.port");
    return {"ssh", "-i", v ? v->image + "/id_ed25519" : "", "-p", port ? first_line(*port) : "0",
            "-o", "UserKnownHostsFile=" + dir(n) + "/known_hosts",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlias=" + key_alias(n),
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", user + "@127.0.0.1"};
  }

  bool start(const std::string& n) override {
    auto v = vm(n);
    if (!v) return false;
    std::string d = dir(n);
    if (!qemu_pid(n)) {
      reap_orphans(n);
      if (!make_host_key(n)) return false;
      std::string why;
      bool kvm = qemu_use_kvm(fs::exists("/sys/module/kvm_pvm"),
                              fs::exists("/sys/module/kvm_intel") || fs::exists("/sys/module/kvm_amd"),
                              ::access("/dev/kvm", R_OK | W_OK) == 0, &why);
      env_.say("▶ accelerator: " + why);
      QemuLaunch l{d, *v, kvm, free_loopback_port(), o_.share, o_.gateway, o_.port_base};
      if (l.ssh_port <= 0 || !write_file(d + "/ssh.port", std::to_string(l.ssh_port) + "\n", 0600)) {
        env_.say("✗ no free loopback port for the guest's ssh forward");
        return false;
      }
      ::unlink((d + "/console.log").c_str());
      RunResult q = run(qemu_argv(l), 120s);
      if (q.rc != 0 || !qemu_pid(n)) {
        env_.say(fmt::format("✗ qemu-system-x86_64 did not start (rc {}): {}", q.rc,
                             first_line(q.err.empty() ? q.out : q.err)));
        return false;
      }
      // Booted when the VM user's ssh answers (a minute or more under TCG).
      auto until = std::chrono::steady_clock::now() + (kvm ? 120s : 900s);
      bool up = false;
      while (!up && std::chrono::steady_clock::now() < until && qemu_pid(n)) {
        auto a = ssh_base(n, std::string(kQemuUser));
        a.push_back("true");
        up = run(a, 30s).rc == 0;
        if (!up) sleep_for(scaled(1000ms));
      }
      if (!up) {
        auto c = read_file(d + "/console.log").value_or("");
        env_.say(fmt::format("✗ '{}' did not answer ssh {} — its console ends:\n{}", n,
                             qemu_pid(n) ? "within the boot timeout" : "(qemu exited)",
                             c.size() > 3000 ? c.substr(c.size() - 3000) : c));
        stop(n);
        return false;
      }
    }
    // The boot hook runs the provisioning, then starts the engine (bounded).
    auto until = std::chrono::steady_clock::now() + 600s;
    for (;;) {
      auto a = ssh_base(n, "root");
      a.push_back("test -e /run/fyboot.done");
      if (run(a, 30s).rc == 0) break;
      if (std::chrono::steady_clock::now() > until || !qemu_pid(n)) {
        env_.say(fmt::format("✗ '{}''s boot hook did not finish (no /run/fyboot.done); its "
                             "output is on the console: {}/console.log",
                             n, d));
        return false;
      }
      sleep_for(scaled(1000ms));
    }
    return forward(n);
  }

  // The libpod socket on the host: an ssh stream forward of the guest's.
  bool forward(const std::string& n) {
    std::string d = dir(n);
    if (auto p = live_pid_file(d + "/fwd.pid")) terminate({*p}, scaled(2s));
    std::string host = d + "/podman.sock";
    ::unlink(host.c_str());
    auto a = ssh_base(n, std::string(kQemuUser));
    a.insert(a.end() - 1, {"-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
                           "-o", "ServerAliveInterval=10", "-L", host + ":" + guest_socket()});
    pid_t p = spawn_detached(a, d + "/fwd.log");
    if (p <= 0 || !write_file(d + "/fwd.pid", std::to_string(p) + "\n", 0600)) {
      env_.say("✗ cannot start the socket forward: " + std::string(std::strerror(errno)));
      return false;
    }
    for (int k = 0; k < 150 && pid_alive(p); ++k) {
      if (::access(host.c_str(), F_OK) == 0) return true;
      sleep_for(100ms);
    }
    env_.say(fmt::format("✗ ssh did not forward {} to {}: {}", guest_socket(), host,
                         first_line(read_file(d + "/fwd.log").value_or(""))));
    return false;
  }

  bool stop(const std::string& n) override {
    std::string d = dir(n);
    if (qemu_pid(n)) {
      // fy-init has no shutdown: the disk is flushed, then qemu ends on SIGTERM
      // (a clean exit of its own, the qcow2 closed); SIGKILL after 10 s.
      auto a = ssh_base(n, "root");
      a.push_back("sync");
      run(a, 20s);
    }
    auto pids = host_pids(n);
    terminate(pids, scaled(10s));
    for (const char* f : {"/qemu.pid", "/fwd.pid", "/ssh.port", "/podman.sock"})
      ::unlink((d + f).c_str());
    return host_pids(n).empty();
  }

  bool remove(const std::string& n) override {
    if (!host_pids(n).empty() && !stop(n)) return false;
    std::error_code ec;
    fs::remove_all(dir(n), ec);
    if (ec) env_.say(fmt::format("✗ cannot remove {}: {}", dir(n), ec.message()));
    return !ec;
  }

  // A socket relay whose VM is gone.
  std::vector<pid_t> reap_orphans(const std::string& n) override {
    if (qemu_pid(n)) return {};
    auto f = live_pid_file(dir(n) + "/fwd.pid");
    if (!f) return {};
    terminate({*f}, scaled(2s));
    return {*f};
  }

  std::vector<std::string> mounts(const std::string& n) override {
    auto v = vm(n);
    return v ? v->mounts : std::vector<std::string>{};
  }

  std::string socket(const std::string& n) override {
    return exists(n) ? "unix://" + dir(n) + "/podman.sock" : "";
  }

  std::string guest_socket() const override {
    return fmt::format("/run/user/{}/podman/podman.sock", kQemuUid);
  }

  std::optional<SshConfig> ssh_target(const std::string& n) override {
    auto v = vm(n);
    auto port = read_file(dir(n) + "/ssh.port");
    if (!v || !port || !qemu_pid(n)) return std::nullopt;
    return parse_ssh_config(fmt::format("Host fy-qemu-{}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n"
                                        "  IdentityFile {}/id_ed25519\n",
                                        n, first_line(*port), kQemuUser, v->image));
  }

  bool can_provision() const override { return true; }
  std::string provision_id(const std::string& n) override {
    auto t = read_file(dir(n) + "/boot/provision.sh");
    return t ? parse_provision_id(*t, kProvisionMarker) : "";
  }
  bool set_provision(const std::string& n, const std::string& script) override {
    if (!write_file(dir(n) + "/boot/provision.sh",
                    fill_lima_fields(script, kQemuUser, kQemuUid), 0700)) {
      env_.say(fmt::format("✗ cannot write {}/boot/provision.sh: {}", dir(n), std::strerror(errno)));
      return false;
    }
    return true;
  }
  RunResult guest(const std::string& n, const std::vector<std::string>& argv) override {
    std::string cmd;
    for (const auto& x : argv) cmd += (cmd.empty() ? "" : " ") + shell_quote(x);
    auto a = ssh_base(n, std::string(kQemuUser));
    a.push_back(cmd);
    return run(a, 20s);
  }

  std::vector<pid_t> host_pids(const std::string& n) override {
    std::vector<pid_t> out;
    for (const char* f : {"/qemu.pid", "/fwd.pid"})
      if (auto p = live_pid_file(dir(n) + f)) out.push_back(*p);
    return out;
  }

  std::vector<std::string> list_running() override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(o_.home, ec)) {
      std::string n = e.path().filename().string();
      if (valid_machine_name(n) && qemu_pid(n)) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  Env env_;
  QemuOptions o_;
};

}  // namespace

std::unique_ptr<Backend> make_qemu(Env e, QemuOptions o) {
  return std::make_unique<Qemu>(std::move(e), std::move(o));
}

}  // namespace fy::machine

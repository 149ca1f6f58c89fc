#include "machine.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <fmt/ranges.h>
#include <fmt/format.h>

#include "core/text.h"

namespace fy::machine {

using namespace std::chrono_literals;

namespace {

std::string trimmed(const std::string& s) {
  size_t e = s.find_last_not_of(" \t\r\n");
  return e == std::string::npos ? "" : s.substr(0, e + 1);
}

class GvisorProbe final : public ReadinessCheck {
 public:
  std::string name() const override { return "the socket filter's runtime probe (gVisor)"; }
  Probe check(Backend&, const std::string&, const std::string& ssh_config,
              const std::string& alias) override {
    std::string last;
    for (int k = 0; k < 10; ++k) {
      RunResult r = run({"ssh", "-F", ssh_config, alias, "--",
                         "podman --url unix:///run/user/$(id -u)/podman/podman-runsc-filtered.sock "
                         "info --format '{{.Host.OCIRuntime.Name}}'"},
                        15s);
      last = trimmed(r.out);
      if (r.rc == 0 && last == "runsc-fy") return {true, ""};
      if (last.empty()) last = trimmed(r.err.substr(0, r.err.find('\n')));
      sleep_for(scaled(1000ms));
    }
    return {false, "podman info through the filtered socket did not answer runsc-fy (last: '" +
                       last + "')"};
  }
};

}  // namespace

std::unique_ptr<ReadinessCheck> make_gvisor_probe() { return std::make_unique<GvisorProbe>(); }

bool Machine::cli_ok() {
  if (b_->available()) return true;
  say_(missing_cli_message(s_.sel));
  return false;
}

bool Machine::poll_ready(int tries, std::chrono::milliseconds every, Probe* last) {
  for (int k = 0; k < tries; ++k) {
    *last = b_->responsive(s_.name);
    if (last->ready) return true;
    if (k + 1 < tries) sleep_for(scaled(every));
  }
  return false;
}

bool Machine::check_guest() {
  const std::string& n = s_.name;
  std::string want = boot_want(s_.boot);
  std::vector<std::string> wrong;
  RunResult st = b_->guest(n, {"cat", "/run/fy-wall/state"});
  std::string got = st.rc == 0 ? trimmed(st.out) : "";
  if (got != want)
    wrong.push_back(got.empty() ? "no /run/fy-wall/state (the script did not run to its end)"
                                : fmt::format("/run/fy-wall/state says '{}', not '{}'", got, want));
  for (const auto& u : boot_system_units(s_.boot)) {
    RunResult r = b_->guest(n, {"systemctl", "is-active", u});
    std::string a = r.rc == 124 ? "" : trimmed(r.out);
    if (a != "active") wrong.push_back(fmt::format("{} is {}", u, a.empty() ? "unknown" : a));
  }
  RunResult m = b_->guest(n, {"systemctl", "is-enabled", "podman.socket"});
  if (trimmed(m.out) != "masked")
    wrong.push_back(fmt::format("the rootful podman.socket is '{}', not masked", trimmed(m.out)));
  for (const auto& u : boot_user_units(s_.boot)) {
    RunResult r = b_->guest(n, {"systemctl", "--user", "is-active", u});
    std::string a = trimmed(r.out);
    if (a != "active") wrong.push_back(fmt::format("user unit {} is {}", u, a.empty() ? "unknown" : a));
  }
  if (wrong.empty()) return true;
  std::string list;
  for (const auto& w : wrong) list += "\n    - " + w;
  std::string log_cmd = b_->name() == "lima"
                            ? fmt::format("limactl shell {} -- cat /run/fy-wall/boot.log", n)
                            : "$(fy-machine ssh-target) cat /run/fy-wall/boot.log";
  say_(fmt::format("✗ '{}' did not apply its boot provisioning:{}\n"
                   "  Its log says why: {}\n"
                   "  Fix the cause, then restart it so the script runs again: "
                   "fy-machine stop && fy-machine ensure",
                   n, list, log_cmd));
  return false;
}

bool Machine::pin_host_key(int tries, std::string* config, std::string* alias, SshConfig* target) {
  const std::string& n = s_.name;
  auto t = b_->ssh_target(n);
  if (!t) {
    say_(fmt::format("✗ '{}' has no ssh target yet (no ssh.config with a Port and a User) — is it "
                     "running? Run: fy-machine ensure",
                     n));
    return false;
  }
  *target = *t;
  *alias = "fy-" + n;
  std::string kh = s_.state_dir + "/known_hosts";
  *config = s_.state_dir + "/ssh.config";
  // A key the backend made and handed to the guest itself is the guest's key
  // from a trusted channel: nothing to scan, and nothing a process answering
  // on the forwarded port could substitute. ssh then verifies it at every
  // connection (StrictHostKeyChecking yes against the file written here).
  std::vector<HostKey> seen = b_->known_host_keys(n);
  const bool trusted = !seen.empty();
  std::string err;
  for (int k = 0; !trusted && k < tries && seen.empty(); ++k) {
    // -T 60: ssh-keyscan runs one key exchange per key type at once, and an
    // emulated guest (qemu under TCG, a loaded machine) took longer than 15 s.
    RunResult r = run({"ssh-keyscan", "-T", "60", "-p", std::to_string(t->port), t->hostname}, 120s);
    seen = parse_host_keys(r.out);
    err = trimmed(r.err);
    if (seen.empty() && k + 1 < tries) sleep_for(scaled(1000ms));
  }
  auto pinned_text = read_file(kh);
  auto pinned = pinned_text ? parse_host_keys(*pinned_text) : std::vector<HostKey>{};
  switch (judge_host_keys(pinned, seen)) {
    case PinVerdict::no_keys:
      say_(fmt::format("✗ '{}''s sshd at {}:{} offered no host key ({}) — is the guest up? Run: "
                       "fy-machine ensure",
                       n, t->hostname, t->port, err.empty() ? "no answer" : err));
      return false;
    case PinVerdict::changed:
      say_(fmt::format(
          "✗ '{}''s ssh host key CHANGED since it was pinned ({}): refusing to "
          "talk to it. Something else may be answering on {}:{}.\n"
          "  If you recreated the VM on purpose, remove the VM with fy-machine rm (which drops the "
          "pin) and ensure it again; if not, find out what listens on that port.",
          n, kh, t->hostname, t->port));
      return false;
    case PinVerdict::first_contact:
      if (!mkdirs(s_.state_dir, 0700) || !write_file(kh, render_known_hosts(*alias, seen), 0600)) {
        say_(fmt::format("✗ cannot write {}: {}", kh, std::strerror(errno)));
        return false;
      }
      say_(trusted ? fmt::format("▶ pinned '{}''s ssh host key, made by the host before the boot "
                                 "(not scanned): {}",
                                 n, kh)
                   : fmt::format("▶ pinned '{}''s ssh host key(s) on first contact: {}", n, kh));
      break;
    case PinVerdict::match:
      break;
  }
  if (!write_file(*config, render_pinned_ssh_config(*alias, *t, kh), 0600)) {
    say_(fmt::format("✗ cannot write {}: {}", *config, std::strerror(errno)));
    return false;
  }
  return true;
}

int Machine::ensure() {
  const std::string& n = s_.name;
  if (!cli_ok()) return 1;
  if (!mkdirs(s_.wt_root)) {
    say_(fmt::format("✗ cannot create the worktrees root {}: {}", s_.wt_root, std::strerror(errno)));
    return 1;
  }
  if (!b_->exists(n)) {
    say_(fmt::format("▶ creating {} VM '{}' (cpus {}, memory {} MiB, disk {} GiB; mounts: {} and {})",
                     b_->name(), n, s_.res.cpus, memory_mib(s_.res.memory), s_.res.disk_gib,
                     s_.repo, s_.wt_root));
    if (!b_->create(n, s_.res, isolation_mounts(s_.repo, s_.wt_root))) return 1;
  } else {
    auto m = b_->mounts(n);
    if (std::find(m.begin(), m.end(), s_.wt_root) == m.end())
      say_(fmt::format("⚠ '{}' was created without the worktrees root {} mounted: worktrees will not "
                       "resolve in it. Recreate it: fy-machine rm && fy-machine ensure",
                       n, s_.wt_root));
  }
  State st = b_->state(n);
  if (b_->can_provision()) {
    Rendered r = render_boot(s_.boot);
    std::string have = b_->provision_id(n);
    if (have != r.id) {
      if (st == State::running) {
        say_(fmt::format(
            "✗ '{}' is running with STALE boot provisioning (recorded {}, wanted {}) — it is "
            "applied only at boot, so the wall and the forwarder in it are not what this "
            "configuration says.\n  Restart it so the new script runs: fy-machine stop && "
            "fy-machine ensure (in foldyard: fy machine stop && fy up)",
            n, have.empty() ? "none" : have, r.id));
        return 1;
      }
      if (!b_->set_provision(n, r.script)) return 1;
      say_(fmt::format("▶ recorded boot provisioning {} on '{}'", r.id, n));
    }
  } else {
    say_(fmt::format("⚠ {} cannot be provisioned with the in-VM wall (ADR-0011, amended): egress "
                     "from '{}' is cooperative. [machine] backend = \"lima\" walls it.",
                     b_->name() == "podman" ? "podman machine" : b_->name(), n));
  }
  Probe p;
  if (st != State::running) {
    if (!b_->supports_concurrent()) {
      for (const auto& other : b_->list_running())
        if (other != n) {
          say_(one_vm_refusal(other));
          return 1;
        }
    }
    say_(fmt::format("▶ starting '{}'", n));
    if (!b_->start(n)) return 1;
    if (!poll_ready(30, 1000ms, &p)) {
      say_(fmt::format("✗ '{}' started but its socket never answered GET /_ping: {}\n  Run "
                       "fy-machine status to see more; fy-machine stop && fy-machine ensure retries.",
                       n, p.reason));
      return 1;
    }
  } else if (!(p = b_->responsive(n)).ready) {
    say_(fmt::format("▶ '{}' is running but its socket is dead ({}) — reviving it: stop, reap, start",
                     n, p.reason));
    b_->stop(n);
    b_->reap_orphans(n);
    if (!b_->start(n)) return 1;
    if (!poll_ready(10, 500ms, &p)) {
      say_(fmt::format("✗ '{}' was restarted but its socket is still dead: {}\n  Look at the VM "
                       "({} shell / logs), or recreate it: fy-machine rm && fy-machine ensure",
                       n, p.reason, b_->cli()));
      return 1;
    }
  }
  if (b_->can_provision() && !check_guest()) return 1;
  std::string cfg, alias;
  SshConfig t;
  if (!pin_host_key(5, &cfg, &alias, &t)) return 1;
  for (auto& c : checks_) {
    Probe cp = c->check(*b_, n, cfg, alias);
    if (!cp.ready) {
      say_(fmt::format("✗ '{}' is not ready: {} failed: {}\n  Its engine must not be used "
                       "(fail closed). fy-machine status shows the state; fy-machine stop && "
                       "fy-machine ensure reboots it.",
                       n, c->name(), cp.reason));
      return 1;
    }
  }
  if (!s_.dns_policy.empty() && dns_allow(s_.dns_policy, "") != 0) {
    say_(fmt::format("✗ '{}' is up, but its DNS allow list was not sent: in it every name is "
                     "REFUSED (or the old list holds) until it is.\n  Fix what is said above, then "
                     "run: fy-machine dns-allow {}",
                     n, shell_quote(s_.dns_policy)));
    return 1;
  }
  say_(fmt::format("✓ '{}' ({}) is ready: {}", n, b_->name(), b_->socket(n)));
  return 0;
}

int Machine::dns_allow(const std::string& policy, const std::string& file) {
  const std::string& n = s_.name;
  if (!cli_ok()) return 1;
  if (!b_->can_provision()) {
    say_(fmt::format("✗ {} VMs get no boot provisioning, so no DNS forwarder to send an allow list "
                     "to — [machine] backend = \"lima\" walls the VM and its DNS.",
                     b_->name() == "podman" ? "podman machine" : b_->name()));
    return 1;
  }
  State st = b_->state(n);
  if (st != State::running) {
    say_(fmt::format("✗ '{}' is {}: the allow list goes to its running fy-dnsfwd — run: fy-machine "
                     "ensure (with [machine].dns_policy set it sends the list itself)",
                     n, st == State::absent ? "absent" : state_name(st)));
    return 1;
  }
  // What the walled side can write must not decide what it may resolve: the
  // repo and the worktrees root are mounted read-write in the VM.
  std::error_code ec;
  std::string src = policy.empty() ? file : policy;
  std::string abs = std::filesystem::weakly_canonical(std::filesystem::absolute(src, ec), ec).string();
  for (const std::string& d : {s_.repo, s_.wt_root})
    if (path_within(abs, d)) {
      say_(fmt::format("✗ {} is inside {}, which '{}' mounts read-write: the walled side could "
                       "write it and so widen its own DNS. Refused — keep the policy outside the "
                       "repo and the worktrees (fy-proxy's state dir) and run: fy-machine "
                       "dns-allow POLICY",
                       abs, d, n));
      return 1;
    }
  std::string key = s_.state_dir + "/" + std::string(kDnsAllowKeyFile);
  if (::access(key.c_str(), R_OK) != 0) {
    say_(fmt::format("✗ no allow-list key for '{}' ({}: {}) — fy-machine ensure makes it and its "
                     "boot provisioning gives root the public half; a VM provisioned before that "
                     "needs: fy-machine stop && fy-machine ensure",
                     n, key, std::strerror(errno)));
    return 1;
  }
  std::string send = file;
  if (!policy.empty()) {
    send = s_.state_dir + "/dnsfwd-allow.txt";
    RunResult r = run(dns_allow_render_argv(s_.dnsfwd_allow_bin, abs, send), 60s);
    if (r.rc == 127) {
      say_(fmt::format("✗ {} is not there to render the policy's names — install foldyard's "
                       "fy-dnsfwd-allow (meson install), set FY_DNSFWD_ALLOW, or render the file "
                       "yourself and run: fy-machine dns-allow --allow-file FILE",
                       s_.dnsfwd_allow_bin));
      return 1;
    }
    if (r.rc != 0) {
      say_(fmt::format("✗ fy-dnsfwd-allow refused the policy {} (exit {}):\n{}\n  The guest's list "
                       "is unchanged. Fix the policy, then run: fy-machine dns-allow {}",
                       abs, r.rc, trimmed(r.err), shell_quote(policy)));
      return 1;
    }
    if (!trimmed(r.err).empty()) say_(trimmed(r.err));  // observe/learn mode's warning
  }
  std::string cfg, alias;
  SshConfig t;
  if (!pin_host_key(3, &cfg, &alias, &t)) return 1;
  RunResult p = run(dns_allow_push_argv(t, key, s_.state_dir + "/known_hosts", alias), 60s, send);
  std::string out = trimmed(p.out), err = trimmed(p.err);
  if (p.rc == 0) {
    say_(fmt::format("{} (on '{}', from {})", out.empty() ? "✓ sent" : out, n, policy.empty() ? send : abs));
    return 0;
  }
  if (p.rc == 3) {
    say_(fmt::format("✗ '{}' refused the allow list {} — nothing was installed, its old list is "
                     "kept:\n{}\n  Fix it{}, then run: fy-machine dns-allow {}",
                     n, send, name_sent_file(err, send), policy.empty() ? "" : " (the policy it was rendered from)",
                     policy.empty() ? "--allow-file " + shell_quote(file) : shell_quote(policy)));
    return 1;
  }
  if (p.rc == 255 || p.rc == 127 || p.rc == 124) {
    say_(fmt::format("✗ cannot reach root's allow-list channel on '{}' ({}) — its boot "
                     "provisioning installs it (a forced-command key for root); a VM provisioned "
                     "before that needs: fy-machine stop && fy-machine ensure",
                     n, err.empty() ? fmt::format("ssh exit {}", p.rc) : first_line(err)));
    return 1;
  }
  say_(fmt::format("✗ the allow list's install on '{}' did not complete (exit {}):\n{}\n  "
                   "fy-machine stop && fy-machine ensure restarts its fy-dnsfwd, which reads the "
                   "list at its start",
                   n, p.rc, err.empty() ? out : err));
  return 1;
}

namespace {

volatile sig_atomic_t g_watch_stop = 0;

void stop_watch(int) { g_watch_stop = 1; }

}  // namespace

int Machine::dns_allow_watch(const std::string& policy, const std::string& file,
                             std::chrono::milliseconds every) {
  const std::string& n = s_.name;
  const std::string src = policy.empty() ? file : policy;
  g_watch_stop = 0;
  struct sigaction sa {};
  sa.sa_handler = stop_watch;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::optional<std::string> last = read_file(src);
  bool readable = last.has_value();
  dns_allow(policy, file);  // says what it did
  if (!cli_ok() || !b_->can_provision() || b_->state(n) != State::running) return 1;
  say_(fmt::format("▶ watching {} every {} ms: each change is sent to '{}' again, and a refused "
                   "one leaves its list as it was — Ctrl-C ends the watch",
                   src, every.count(), n));
  while (!g_watch_stop) {
    for (auto slept = 0ms; slept < every && !g_watch_stop; slept += 50ms)
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(50ms, every - slept));
    if (g_watch_stop) break;
    std::optional<std::string> now = read_file(src);
    if (!now) {
      if (readable)
        say_(fmt::format("✗ {} cannot be read ({}): '{}' keeps the list last sent; watching for "
                         "it to come back",
                         src, std::strerror(errno), n));
      readable = false;
      continue;
    }
    if (readable && now == last) continue;
    readable = true;
    last = now;
    State st = b_->state(n);
    if (st != State::running) {
      say_(fmt::format("✗ '{}' is {}: the watch ends — run: fy-machine ensure, then fy-machine "
                       "dns-allow {} --watch",
                       n, state_name(st),
                       policy.empty() ? "--allow-file " + shell_quote(file) : shell_quote(policy)));
      return 1;
    }
    dns_allow(policy, file);
  }
  say_(fmt::format("▶ the watch on {} ended; '{}' keeps the list last sent", src, n));
  return 0;
}

int Machine::status() {
  const std::string& n = s_.name;
  say_(fmt::format("backend: {} (from {}){}", b_->name(), s_.sel.from,
                   s_.sel.explicit_ && s_.sel.named != b_->name()
                       ? fmt::format(", named '{}'", s_.sel.named)
                       : ""));
  if (!b_->available()) {
    say_(fmt::format("✗ not ready: no '{}' CLI on this host", b_->cli()));
    say_(missing_cli_message(s_.sel));
    return 1;
  }
  State st = b_->state(n);
  if (st == State::absent) {
    say_(fmt::format("✗ '{}' does not exist — run: fy-machine ensure (creates and starts it)", n));
    return 1;
  }
  say_(fmt::format("state: {} (the {} word for its processes; readiness is the socket)",
                   state_name(st), b_->cli()));
  std::string sock = b_->socket(n);
  say_("socket: " + (sock.empty() ? std::string("(none)") : sock));
  if (b_->can_provision()) {
    Rendered r = render_boot(s_.boot);
    std::string have = b_->provision_id(n);
    if (have == r.id) say_("provisioning: " + have + " (current)");
    else
      say_(fmt::format("provisioning: {} — STALE, wanted {}: {}", have.empty() ? "none" : have, r.id,
                       st == State::running ? "run fy-machine stop && fy-machine ensure"
                                            : "fy-machine ensure records it before the boot"));
  }
  switch (st) {
    case State::stopped:
      say_(fmt::format("✗ '{}' is stopped — run: fy-machine ensure", n));
      return 1;
    case State::broken:
      say_(fmt::format("✗ '{}' is Broken (its host agent or its driver died) — run: fy-machine "
                       "ensure (it stops it with --force and starts it again)",
                       n));
      return 1;
    case State::starting:
      say_(fmt::format("✗ '{}' says Starting{} — run: fy-machine ensure", n,
                       b_->host_pids(n).empty() ? " with no VM process behind it (a stuck start)" : ""));
      return 1;
    default:
      break;
  }
  Probe p = b_->responsive(n);
  if (!p.ready) {
    say_(fmt::format("✗ '{}' is running but its socket is dead: {} — run: fy-machine ensure (it "
                     "restarts the VM)",
                     n, p.reason));
    return 1;
  }
  say_(fmt::format("✓ '{}' is running and its socket answers GET /_ping", n));
  return 0;
}

int Machine::stop() {
  const std::string& n = s_.name;
  if (!cli_ok()) return 1;
  State st = b_->state(n);
  if (st == State::absent) {
    say_(fmt::format("ℹ '{}' does not exist: nothing to stop", n));
    return 0;
  }
  if (st == State::stopped && b_->host_pids(n).empty()) {
    say_(fmt::format("ℹ '{}' is already stopped", n));
    return 0;
  }
  if (!b_->stop(n)) {
    say_(fmt::format("✗ '{}' did not stop: processes {} outlived a forced stop", n,
                     fmt::join(b_->host_pids(n), ", ")));
    return 1;
  }
  say_(fmt::format("✓ '{}' stopped", n));
  return 0;
}

int Machine::rm() {
  const std::string& n = s_.name;
  if (!cli_ok()) return 1;
  if (!b_->exists(n)) {
    say_(fmt::format("ℹ '{}' does not exist: nothing to remove", n));
    std::error_code ec;
    std::filesystem::remove_all(s_.state_dir, ec);
    return 0;
  }
  if (b_->state(n) != State::stopped && !b_->stop(n)) return 1;
  if (!b_->remove(n)) return 1;
  std::error_code ec;
  std::filesystem::remove_all(s_.state_dir, ec);  // the pinned host key goes with the VM
  say_(fmt::format("✓ '{}' removed (its disk, and its pinned ssh host key)", n));
  return 0;
}

int Machine::socket() {
  const std::string& n = s_.name;
  if (!cli_ok()) return 1;
  std::string s = b_->exists(n) ? b_->socket(n) : "";
  if (s.empty()) {
    say_(fmt::format("✗ '{}' does not exist, so it has no socket — run: fy-machine ensure", n));
    return 1;
  }
  fmt::print("{}\n", s);
  return 0;
}

int Machine::ssh_target(bool json) {
  if (!cli_ok()) return 1;
  std::string cfg, alias;
  SshConfig t;
  if (!pin_host_key(3, &cfg, &alias, &t)) return 1;
  if (json)
    fmt::print("{}\n", ssh_target_json(cfg, alias, t, s_.state_dir + "/known_hosts"));
  else
    fmt::print("ssh -F {} {}\n", shell_quote(cfg), alias);
  return 0;
}

}  // namespace fy::machine

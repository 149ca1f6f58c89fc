// fy-machine: the VM lifecycle (ADR-0011, ADR-0027) from the command line.
// Reads [machine] of the project's foldyard.toml and the MACHINE_* env; the
// verbs' logic is in src/machine.cc, their decisions in src/plan.cc.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/crypto.h"
#include "core/text.h"
#include "machine.h"
#include "qemu.h"

#ifndef FY_MACHINE_ASSETS
#define FY_MACHINE_ASSETS ""
#endif

namespace fs = std::filesystem;
using namespace fy::machine;

namespace {

constexpr const char* kUsage = R"(usage: fy-machine <verb> [options]

verbs:
  ensure        create, provision and start the project's VM; done when its
                socket answers GET /_ping (and, under gVisor, the runtime probe)
  status        what state it is in, what is wrong, what to run
  stop          stop it (gracefully, then forced)
  rm            stop and delete it, and its pinned ssh host key
  socket        print its libpod socket (unix://...)
  ssh-target    pin the guest's ssh host key (first contact) or verify it, and
                print an ssh command; --json: {"config","host","user","known_hosts",...}
  dns-allow [POLICY] [--allow-file FILE] [--watch]
                send the guest's DNS forwarder its allow list: the names of the
                proxy's POLICY (rendered by fy-dnsfwd-allow; default
                [machine].dns_policy), or FILE as it is, over root's
                forced-command channel; a refused list leaves the old one.
                --watch: then send it again at each change of that file
                (looked at every second) until Ctrl-C, as fy-proxy reloads it

options:
  --config FILE     foldyard.toml (default: ./foldyard.toml when present)
  --name NAME       the VM (default: PODMAN_MACHINE, [machine].name, the repo's name)
  --repo DIR        the repository (default: the config's directory, else .)
  --worktrees DIR   the worktrees root (default: [machine].worktrees, else <repo>.worktrees)
  --json            (ssh-target) machine-readable output

env: MACHINE_BACKEND (lima|podman|qemu), MACHINE_CPUS, MACHINE_MEMORY (MiB),
     MACHINE_DISK (GiB), MACHINE_VMTYPE, PODMAN_MACHINE, FY_MACHINE_RUNTIME
     (gvisor), FY_MACHINE_STATE_DIR, FY_MACHINE_ASSETS, FY_MACHINE_DNS_POLICY
     (ensure sends its names), FY_DNSFWD_ALLOW (the renderer); qemu: FY_QEMU_HOME,
     FY_GUEST_SHARE (the build run at /fy, default <repo>/build), FY_GUEST_BUILD_IMAGE
exit: 0 done/ready, 1 refused or not ready, 2 usage or configuration error
)";

struct Cfg {
  std::optional<std::string> backend, name, vmtype, worktrees, runtime, memory, gateway, dns_policy;
  std::optional<int64_t> cpus, disk, port_base;
};

std::optional<std::string> read_asset(const std::string& dir, const std::string& rel) {
  auto t = read_file(dir + "/" + rel);
  if (!t) std::fprintf(stderr, "✗ cannot read %s/%s — set FY_MACHINE_ASSETS to the foldyard source tree\n",
                       dir.c_str(), rel.c_str());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  std::string verb = args[0];
  std::optional<std::string> config_path, name_flag, repo_flag, wt_flag, policy_arg, allow_file;
  bool json = false, watch = false;
  for (size_t i = 1; i < args.size(); ++i) {
    auto val = [&](std::optional<std::string>& dst) {
      if (i + 1 >= args.size()) return false;
      dst = args[++i];
      return true;
    };
    const std::string& a = args[i];
    bool ok = true;
    if (a == "--config") ok = val(config_path);
    else if (a == "--name") ok = val(name_flag);
    else if (a == "--repo") ok = val(repo_flag);
    else if (a == "--worktrees") ok = val(wt_flag);
    else if (a == "--json" && verb == "ssh-target") json = true;
    else if (a == "--allow-file" && verb == "dns-allow") ok = val(allow_file);
    else if (a == "--watch" && verb == "dns-allow") watch = true;
    else if (verb == "dns-allow" && !policy_arg && !a.empty() && a[0] != '-') policy_arg = a;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "✗ fy-machine %s: bad option '%s' — see fy-machine --help\n", verb.c_str(), a.c_str());
      return 2;
    }
  }
  static const std::vector<std::string> verbs = {"ensure", "status", "stop", "rm", "socket", "ssh-target", "dns-allow"};
  if (std::find(verbs.begin(), verbs.end(), verb) == verbs.end()) {
    std::fprintf(stderr, "✗ unknown command '%s' — ensure|status|stop|rm|socket|ssh-target|dns-allow\n", verb.c_str());
    return 2;
  }
  if (verb == "dns-allow" && policy_arg && allow_file) {
    std::fprintf(stderr, "✗ fy-machine dns-allow: a POLICY or --allow-file FILE, not both\n");
    return 2;
  }

  // ---- [machine] of foldyard.toml (other sections belong to other tools) ----
  Cfg c;
  if (!config_path && fs::exists("foldyard.toml")) config_path = "foldyard.toml";
  if (config_path) {
    auto doc = fy::cfg::Doc::load_file(*config_path);
    if (!doc) {
      std::fprintf(stderr, "%s\n", doc.error().message.c_str());
      return 2;
    }
    auto root = doc->root();
    if (auto m = root.table("machine")) {
      c.backend = m->string("backend");
      c.name = m->string("name");
      c.vmtype = m->string("vmtype");
      c.worktrees = m->string("worktrees");
      c.runtime = m->string("runtime");
      c.gateway = m->string("gateway");
      c.dns_policy = m->string("dns_policy");
      c.cpus = m->integer("cpus", 1, 256);
      c.disk = m->integer("disk_gib", 1, 65536);
      c.port_base = m->integer("port_base", 1024, 65000);
      std::string t = m->type_of("memory_mib");
      if (t == "integer") c.memory = std::to_string(*m->integer("memory_mib", 1, 1 << 24));
      else if (t == "string") c.memory = m->string("memory_mib");
    }
    auto r = doc->result();
    if (!r) {
      std::fprintf(stderr, "%s\n", r.error().message.c_str());
      return 2;
    }
  }

  Settings s;
  s.sel = select_backend(env("MACHINE_BACKEND"), c.backend);
  // Loud, on every command (ADR-0027).
  for (const auto& w : s.sel.warnings) std::fprintf(stderr, "%s\n", w.c_str());

  std::error_code ec;
  std::string repo = repo_flag ? *repo_flag
                     : config_path ? fs::absolute(*config_path).parent_path().string()
                                   : fs::current_path().string();
  repo = fs::weakly_canonical(fs::absolute(repo), ec).string();
  s.repo = repo;
  s.wt_root = wt_flag ? *wt_flag : c.worktrees ? *c.worktrees : repo + ".worktrees";
  s.wt_root = fs::weakly_canonical(fs::absolute(s.wt_root), ec).string();
  s.name = name_flag   ? *name_flag
           : env("PODMAN_MACHINE") ? *env("PODMAN_MACHINE")
           : c.name    ? *c.name
                       : fs::path(repo).filename().string();
  if (!valid_machine_name(s.name)) {
    std::fprintf(stderr, "✗ '%s' is not a machine name: use [A-Za-z0-9][A-Za-z0-9._-]* (set [machine].name or --name)\n",
                 s.name.c_str());
    return 2;
  }
  auto num = [](const char* var, std::optional<int64_t> cfgv, int64_t def) -> std::optional<int64_t> {
    if (auto e = env(var)) {
      auto v = fy::parse_u64(*e);
      if (!v || *v == 0 || *v > 65536) {
        std::fprintf(stderr, "✗ %s='%s' is not a positive whole number\n", var, e->c_str());
        return std::nullopt;
      }
      return static_cast<int64_t>(*v);
    }
    return cfgv.value_or(def);
  };
  auto cpus = num("MACHINE_CPUS", c.cpus, 4);
  auto disk = num("MACHINE_DISK", c.disk, 60);
  if (!cpus || !disk) return 2;
  s.res.cpus = *cpus;
  s.res.disk_gib = *disk;
  s.res.memory = env("MACHINE_MEMORY").value_or(c.memory.value_or("8192"));

  std::string home = env("HOME").value_or("/root");
  std::string state_root = env("FY_MACHINE_STATE_DIR").value_or(
      env("XDG_STATE_HOME").value_or(home + "/.local/state") + "/fy-machine");
  s.state_dir = state_root + "/" + s.sel.name + "-" + s.name;

  // ---- the boot provisioning's inputs ----
  std::string runtime = env("FY_MACHINE_RUNTIME").value_or(c.runtime.value_or(""));
  s.boot.gvisor = runtime == "gvisor";
  s.boot.port_base = c.port_base.value_or(41000);
  if (auto e = env("FY_PORT_BASE")) {
    auto v = fy::parse_u64(*e);
    if (!v || *v < 1024 || *v > 65000) {
      std::fprintf(stderr, "✗ FY_PORT_BASE='%s' is not a port base (1024-65000)\n", e->c_str());
      return 2;
    }
    s.boot.port_base = static_cast<int64_t>(*v);
  }
  // The policy whose names the guest may resolve: relative to the config's folder.
  if (auto e = env("FY_MACHINE_DNS_POLICY"); e && !e->empty()) s.dns_policy = *e;
  else if (c.dns_policy && !c.dns_policy->empty())
    s.dns_policy = fs::path(*c.dns_policy).is_absolute() || !config_path
                       ? *c.dns_policy
                       : (fs::absolute(*config_path).parent_path() / *c.dns_policy).string();
  if (verb == "dns-allow" && !policy_arg && !allow_file) {
    if (s.dns_policy.empty()) {
      std::fprintf(stderr, "✗ fy-machine dns-allow: which policy? Name it (fy-machine dns-allow POLICY), "
                           "set [machine].dns_policy, or send a rendered file with --allow-file FILE\n");
      return 2;
    }
    policy_arg = s.dns_policy;
  }
  if (auto e = env("FY_DNSFWD_ALLOW"); e && !e->empty()) s.dnsfwd_allow_bin = *e;
  else if (!on_path("fy-dnsfwd-allow")) {
    // Installed beside fy-dnsfwd (meson install: libexec/fy), or this build's own.
    std::error_code xe;
    fs::path self = fs::read_symlink("/proc/self/exe", xe);
    std::vector<fs::path> cands = {"/usr/local/libexec/fy/fy-dnsfwd-allow",
                                   "/usr/libexec/fy/fy-dnsfwd-allow"};
    if (!xe) cands.push_back(self.parent_path() / "../../wall/dnsfwd/fy-dnsfwd-allow");
    for (const fs::path& cand : cands)
      if (::access(cand.c_str(), X_OK) == 0) {
        s.dnsfwd_allow_bin = fs::weakly_canonical(cand, xe).string();
        break;
      }
  }
  if (c.gateway) s.boot.gateway = *c.gateway;
  else if (s.sel.name == "qemu") s.boot.gateway = std::string(kQemuGateway);
  if (s.sel.name == "qemu") s.boot.bridge_watch = "poll";  // boot.h says why
  // The image's root key is the qemu backend's own way in (boot.h: root_login).
  if (s.sel.name == "qemu") s.boot.root_login = "prohibit-password";
  for (char ch : s.boot.gateway)
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.')) {
      std::fprintf(stderr, "✗ [machine].gateway '%s' is not an IPv4 address\n", s.boot.gateway.c_str());
      return 2;
    }
  bool needs_assets = (s.sel.name == "lima" || s.sel.name == "qemu") && (verb == "ensure" || verb == "status");
  if (needs_assets) {
    std::string assets = env("FY_MACHINE_ASSETS").value_or(FY_MACHINE_ASSETS);
    auto wu = read_asset(assets, "wall/dist/fy-wall.service");
    auto gu = read_asset(assets, "wall/dist/fy-forwarder-guard.service");
    auto fu = read_asset(assets, "forwarder/exe/fy-forwarder.service");
    auto du = read_asset(assets, "wall/dnsfwd/exe/fy-dnsfwd.service");
    if (!wu || !gu || !fu || !du) return 2;
    s.boot.wall_unit = *wu;
    s.boot.guard_unit = *gu;
    s.boot.forwarder_unit = *fu;
    s.boot.dnsfwd_unit = *du;
    // The stamp key: made once per VM, kept beside its pin (the host proxy reads it).
    std::string key_path = s.state_dir + "/forwarder.key";
    auto key = read_file(key_path);
    if (!key && verb == "ensure") {
      std::string k = fy::random_hex(32);
      if (!mkdirs(s.state_dir, 0700) || !write_file(key_path, k + "\n", 0600)) {
        std::fprintf(stderr, "✗ cannot write %s: %s\n", key_path.c_str(), std::strerror(errno));
        return 1;
      }
      key = k + "\n";
    }
    s.boot.forwarder_key = key ? key->substr(0, key->find('\n')) : std::string(64, '0');
    // The allow list's channel key: made once per VM, kept beside the
    // forwarder's; only its public half goes into the boot script (root's
    // forced-command line), the private half never leaves this folder.
    std::string dk = s.state_dir + "/" + std::string(kDnsAllowKeyFile);
    auto pub = read_file(dk + ".pub");
    if ((!pub || ::access(dk.c_str(), R_OK) != 0) && verb == "ensure") {
      ::unlink(dk.c_str());
      ::unlink((dk + ".pub").c_str());
      RunResult g = run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                         std::string(kDnsAllowKeyComment), "-f", dk},
                        std::chrono::seconds(60));
      pub = read_file(dk + ".pub");
      if (g.rc != 0 || !pub) {
        std::fprintf(stderr, "✗ ssh-keygen could not make the allow list's key %s: %s — install "
                             "openssh-client\n", dk.c_str(), first_line(g.err.empty() ? g.out : g.err).c_str());
        return 1;
      }
    }
    if (pub) {
      auto k = parse_host_keys("k " + first_line(*pub));
      if (!k.empty()) s.boot.dns_allow_key = k[0].type + " " + k[0].blob;
    }
  }

  Say say = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  Env e{say, home, c.vmtype};
  std::unique_ptr<Backend> backend;
  if (s.sel.name == "lima") {
    backend = make_lima(e);
  } else if (s.sel.name == "qemu") {
    QemuOptions q;
    q.home = env("FY_QEMU_HOME").value_or(state_root + "/qemu");
    q.build_image = env("FY_GUEST_BUILD_IMAGE")
                        .value_or(env("FY_MACHINE_ASSETS").value_or(FY_MACHINE_ASSETS) +
                                  "/lifecycle/guest/build-image");
    // The build the guest runs (its fy-wall, its fy-forwarder), at /fy.
    q.share = env("FY_GUEST_SHARE").value_or(s.repo + "/build");
    q.gateway = s.boot.gateway;
    q.port_base = s.boot.port_base;
    if (verb == "ensure" && !fs::exists(q.share + "/wall/fy-wall")) {
      std::fprintf(stderr,
                   "✗ the qemu guest runs the build at %s (its wall/fy-wall, forwarder/fy-forwarder), "
                   "and there is none: build it (ninja -C build) or set FY_GUEST_SHARE to a foldyard "
                   "build directory\n",
                   q.share.c_str());
      return 2;
    }
    backend = make_qemu(e, q);
  } else {
    backend = make_podman(e);
  }
  Machine m(std::move(s), std::move(backend), say);
  if (m.backend().name() == "lima" && runtime == "gvisor") m.add_check(make_gvisor_probe());

  if (verb == "ensure") return m.ensure();
  if (verb == "status") return m.status();
  if (verb == "stop") return m.stop();
  if (verb == "rm") return m.rm();
  if (verb == "socket") return m.socket();
  if (verb == "dns-allow" && watch)
    return m.dns_allow_watch(policy_arg.value_or(""), allow_file.value_or(""),
                             std::chrono::milliseconds(1000));
  if (verb == "dns-allow") return m.dns_allow(policy_arg.value_or(""), allow_file.value_or(""));
  return m.ssh_target(json);
}

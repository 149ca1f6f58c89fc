// fy-machine's pure decisions (plan.h, boot.h) as units.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>

#include "boot.h"
#include "plan.h"
#include "qemu.h"

using namespace fy::machine;

TEST_CASE("the MiB rule: whole MiB verbatim, 8192 when not a whole number, never GiB") {
  CHECK(memory_mib("4000") == 4000);
  CHECK(memory_mib("8192") == 8192);
  CHECK(memory_mib(" 3072 ") == 3072);
  CHECK(memory_mib("3.91") == 8192);
  CHECK(memory_mib("3.91GiB") == 8192);
  CHECK(memory_mib("4GiB") == 8192);
  CHECK(memory_mib("") == 8192);
  CHECK(memory_mib("-5") == 8192);
  Resources r{2, "4001", 30};
  std::string e = lima_set_expr(r, {}, std::nullopt);
  CHECK(e.find(".memory = \"4001MiB\"") != std::string::npos);
  CHECK(e.find("GiB\" | .mounts") != std::string::npos);  // disk only is in GiB
  CHECK(e.find("3.9") == std::string::npos);
}

TEST_CASE("the --set expression pins sizing, replaces the mounts, vmType only when resolved") {
  Resources r{6, "12288", 80};
  auto m = isolation_mounts("/src/app", "/src/app.worktrees");
  CHECK(lima_set_expr(r, m, std::nullopt) ==
        ".cpus = 6 | .memory = \"12288MiB\" | .disk = \"80GiB\" | .mounts = ["
        "{\"location\": \"/src/app\", \"mountPoint\": \"/src/app\", \"writable\": true}, "
        "{\"location\": \"/src/app.worktrees\", \"mountPoint\": \"/src/app.worktrees\", "
        "\"writable\": true}]");
  CHECK(lima_set_expr(r, m, std::string("vz")).ends_with("] | .vmType = \"vz\""));
  auto argv = lima_create_argv("limactl", "app", "X");
  CHECK(argv == std::vector<std::string>{"limactl", "create", "--tty=false", "--name", "app",
                                         "template://podman", "--set", "X"});
  // A path with a quote stays one JSON string.
  CHECK(lima_set_expr(r, isolation_mounts("/a\"b", "/c"), std::nullopt).find("\"/a\\\"b\"") !=
        std::string::npos);
}

TEST_CASE("vmType: configured verbatim, else vz then qemu from limactl info, never krunkit") {
  CHECK(resolve_vm_type(std::string("krunkit"), "") == "krunkit");
  CHECK(resolve_vm_type(std::nullopt, R"({"vmTypes":["qemu","vz","krunkit"]})") == "vz");
  CHECK(resolve_vm_type(std::nullopt, R"({"vmTypes":["krunkit","qemu"]})") == "qemu");
  CHECK(!resolve_vm_type(std::nullopt, R"({"vmTypes":["krunkit"]})"));
  CHECK(!resolve_vm_type(std::nullopt, "not json"));
  CHECK(!resolve_vm_type(std::string(""), R"({"vmTypes":[]})"));
}

TEST_CASE("selection: env, then config, then lima; native retired; unknown names warned") {
  auto s = select_backend(std::nullopt, std::nullopt);
  CHECK(s.name == "lima");
  CHECK(!s.explicit_);
  CHECK(s.warnings.empty());
  s = select_backend(std::string("PODMAN"), std::string("lima"));
  CHECK(s.name == "podman");
  CHECK(s.from == "MACHINE_BACKEND");
  s = select_backend(std::string(""), std::string("Lima"));
  CHECK(s.name == "lima");
  CHECK(s.explicit_);
  s = select_backend(std::nullopt, std::string("native"));
  CHECK(s.name == "podman");
  REQUIRE(s.warnings.size() == 1);
  CHECK(s.warnings[0].find("RETIRED (ADR-0027)") != std::string::npos);
  s = select_backend(std::nullopt, std::string("vmware"));
  CHECK(s.name == "podman");
  REQUIRE(s.warnings.size() == 1);
  CHECK(s.warnings[0].starts_with("⚠ unknown [machine].backend 'vmware' — falling back to podman"));
}

TEST_CASE("missing CLI: explicit names vs the inherited default, which never offers a VM-less way") {
  auto d = missing_cli_message(select_backend(std::nullopt, std::nullopt));
  CHECK(d.starts_with("✗ `limactl` isn't installed, and 'lima' is foldyard's DEFAULT"));
  CHECK(d.find("backend = \"podman\"") != std::string::npos);
  CHECK(d.find("native") == std::string::npos);
  auto x = missing_cli_message(select_backend(std::nullopt, std::string("podman")));
  CHECK(x.starts_with("✗ [machine].backend = 'podman' but 'podman' isn't installed."));
  CHECK(x.find("or name a different [machine].backend") != std::string::npos);
}

TEST_CASE("limactl list --json, lima.yaml provision id and mounts") {
  auto l = parse_lima_list(
      "{\"name\":\"a\",\"status\":\"Running\",\"dir\":\"/h/.lima/a\",\"sshLocalPort\":60022}\n"
      "garbage\n{\"status\":\"x\"}\n{\"name\":\"b\",\"status\":\"Broken\"}\n");
  REQUIRE(l.size() == 2);
  CHECK(l[0].dir == "/h/.lima/a");
  CHECK(l[0].ssh_port == 60022);
  CHECK(l[1].status == "Broken");
  // The fuzzer's: an empty name, a name lima would refuse, a port that is not one.
  auto odd = parse_lima_list("{\"name\":\"\"}\n{\"name\":\"a b\"}\n"
                             "{\"name\":\"c\",\"sshLocalPort\":-5}\n"
                             "{\"name\":\"d\",\"sshLocalPort\":70000}\n");
  REQUIRE(odd.size() == 2);
  CHECK(odd[0].name == "c");
  CHECK(odd[0].ssh_port == 0);
  CHECK(odd[1].ssh_port == 0);
  std::string yaml =
      "provision:\n- mode: system\n  script: |\n    #!/bin/bash\n    # fy-monitor 1111\n"
      "- mode: system\n  script: |\n    #!/bin/bash\n    # fy-provision 0123456789abcdef\n"
      "mounts:\n- location: \"/src/app\"\n  mountPoint: /src/app\n";
  CHECK(parse_provision_id(yaml, kProvisionMarker) == "0123456789abcdef");
  CHECK(parse_provision_id("x: 1\n", kProvisionMarker) == "");
  CHECK(parse_lima_mounts(yaml) == std::vector<std::string>{"/src/app", "/src/app"});
  auto e = provision_set_expr("#!/bin/bash\n# fy-provision x\necho 'é'\n", kProvisionMarker);
  CHECK(e.starts_with(".provision = ([ (.provision // [])[] | select((.script // \"\") | "
                      "test(\"# fy-provision \") | not) ] + [{\"mode\": \"system\", \"script\": "
                      "\"#!/bin/bash\\n# fy-provision x\\necho 'é'\\n\"}])"));
}

TEST_CASE("ssh.config, host keys and the pin verdict") {
  auto c = parse_ssh_config(
      "# lima\nHost lima-app\n  IdentityFile \"/h/.lima/_config/user\"\n  StrictHostKeyChecking no\n"
      "  User alice\n  Hostname 127.0.0.1\n  Port 60022\nHost other\n  Port 1\n");
  REQUIRE(c);
  CHECK(c->host == "lima-app");
  CHECK(c->port == 60022);
  CHECK(c->user == "alice");
  CHECK(c->identity == "/h/.lima/_config/user");
  CHECK(!parse_ssh_config("Host x\n  User a\n"));
  auto k = parse_host_keys("# 127.0.0.1:22 SSH-2.0\n[127.0.0.1]:2222 ssh-ed25519 AAAAC3Nza=\n"
                           "[127.0.0.1]:2222 ssh-ed25519 AAAAC3Nza=\nbad line\nh x-type AAAA\n");
  REQUIRE(k.size() == 1);
  CHECK(judge_host_keys({}, k) == PinVerdict::first_contact);
  CHECK(judge_host_keys(k, k) == PinVerdict::match);
  CHECK(judge_host_keys(k, {{"ssh-ed25519", "BBBB"}}) == PinVerdict::changed);
  CHECK(judge_host_keys(k, {}) == PinVerdict::no_keys);
  auto cfg = render_pinned_ssh_config("fy-app", *c, "/s/known_hosts");
  CHECK(cfg.find("StrictHostKeyChecking yes") != std::string::npos);
  CHECK(cfg.find("UserKnownHostsFile \"/s/known_hosts\"") != std::string::npos);
  CHECK(cfg.find("HostKeyAlias fy-app") != std::string::npos);
  CHECK(ssh_target_json("/s/ssh.config", "fy-app", *c, "/s/known_hosts")
            .starts_with("{\"config\": \"/s/ssh.config\", \"host\": \"fy-app\", \"user\": \"alice\", "
                         "\"known_hosts\": \"/s/known_hosts\""));
}

TEST_CASE("podman machine: init argv, list, mounts, the one-VM refusal") {
  Resources r{2, "3.5GiB", 40};
  CHECK(podman_init_argv("podman", "app", r, isolation_mounts("/r", "/w")) ==
        std::vector<std::string>{"podman", "machine", "init", "app", "--cpus", "2", "--memory",
                                 "8192", "--disk-size", "40", "--volume", "/r:/r", "--volume",
                                 "/w:/w"});
  auto l = parse_podman_list("podman-machine-default*|true\napp|false\n\n");
  REQUIRE(l.size() == 2);
  CHECK(l[0].name == "podman-machine-default");
  CHECK(l[0].running);
  // A line whose name podman would not accept is not a machine (the fuzzer
  // found "x**": one marker stripped, a '*' left in the name).
  CHECK(parse_podman_list("x**|true\n{\"name\":\"a\"|true\n-a|true\n").empty());
  CHECK(parse_podman_mounts(R"({"Mounts":[{"Source":"/r","Target":"/r"}]})") ==
        std::vector<std::string>{"/r"});
  CHECK(one_vm_refusal("other").starts_with("✗ podman machine 'other' is already running, and macOS runs only ONE"));
  CHECK(valid_machine_name("app-1.x_y"));
  CHECK(!valid_machine_name("-app"));
  CHECK(!valid_machine_name("a b"));
  CHECK(!valid_machine_name("a/b"));
}

namespace {
BootSpec spec(int64_t base) {
  BootSpec s;
  s.port_base = base;
  s.wall_unit = "[Unit]\nDescription=wall\n";
  s.guard_unit = "[Unit]\nDescription=guard\n";
  s.forwarder_unit = "[Unit]\nDescription=fwd\n";
  s.dnsfwd_unit = "[Unit]\nDescription=dnsfwd\n";
  s.forwarder_key = std::string(64, 'a');
  return s;
}
}  // namespace

TEST_CASE("the boot script's kernel closures: the families file and fy-novsock, before the wall") {
  auto s = spec(41000);
  s.wall_bin = "/opt/fy wall";
  s.novsock_bin = "/opt/novsock";
  std::string k = render_kernel_closures(s);
  CHECK(k.find("'/opt/fy wall' render families >/etc/modprobe.d/fy-wall-families.conf.tmp\n") !=
        std::string::npos);
  // the user and every uid it can map, read as fy-wall reads them (core/subid.h)
  CHECK(k.find("'/opt/novsock' apply --user \"$user\"\n") != std::string::npos);
  CHECK(k.find("/etc/subuid") == std::string::npos);
  CHECK(k.find("@@") == std::string::npos);
  auto a = render_boot(s);
  size_t at = a.script.find(k);
  REQUIRE(at != std::string::npos);
  CHECK(at > a.script.find("uid=$(id -u \"$user\")"));    // $uid is known
  CHECK(at < a.script.find("# 3. The wall"));              // before anything else loads
}

TEST_CASE("the boot script: marker on line 2, id = sha256 prefix, changes with the band alone") {
  auto a = render_boot(spec(41000));
  CHECK(a.id.size() == 16);
  CHECK(a.script.starts_with("#!/bin/bash\n# fy-provision " + a.id + "\n"));
  CHECK(render_boot(spec(41000)).id == a.id);  // deterministic
  CHECK(render_boot(spec(41200)).id != a.id);  // the band changes it
  CHECK(boot_want(spec(41000)) == "wall on 41000-41089, 41100-41189");
  std::string bad;
  CHECK(uses_only_lima_fields(a.script, &bad));
  auto g = spec(41000);
  g.gvisor = true;
  auto gr = render_boot(g);
  CHECK(gr.script.find("podman-runsc-filter.service") != std::string::npos);
  CHECK(a.script.find("podman-runsc-filter.service") == std::string::npos);
  CHECK(uses_only_lima_fields(gr.script, &bad));
  CHECK(!uses_only_lima_fields("echo {{.Dir}}", &bad));
  CHECK(bad == "{{.Dir}}");
  // The state file is the last thing written.
  CHECK(a.script.rfind("mv /run/fy-wall/state.tmp /run/fy-wall/state") >
        a.script.rfind("systemctl reload-or-restart"));
}

TEST_CASE("the boot script: fy-dnsfwd's config checked before it is moved in, started before the wall") {
  auto s = spec(41000);
  s.dnsfwd_bin = "/opt/dns fwd";
  std::string t = render_boot(s).script;
  auto at = [&](std::string_view x) {
    size_t p = t.find(x);
    INFO(x);
    REQUIRE(p != std::string::npos);
    return p;
  };
  // The wall's redirect names the listener fy-dnsfwd's config opens.
  size_t wall_key = at("dns_forwarder = \"127.42.0.53\"\n");
  CHECK(wall_key < at("\"$wall\" apply machine --check --config /etc/fy-wall/fy-wall.toml.tmp"));
  CHECK(at("[[listen]]\n# The VM's own namespace: where the machine wall's redirect sends :53.\n"
           "address = \"127.42.0.53\"\n") > wall_key);
  CHECK(at("upstream = [\"$dns_upstream\"]\n") < at("__FY_DNSFWD_TOML__\nif ! \"$dnsfwd\" --check"));
  // The bridge listener follows the namespace the forwarder follows.
  // Both look for it in rootless podman's mount namespace, at the path of the
  // podman installed (tests/machine boot_script runs the choice under bash).
  size_t choice = at("bridge_pause=\"/run/user/$uid/libpod/tmp/pause.pid\"\n");
  CHECK(at("if [ \"${podman_major:-0}\" -ge 5 ]; then\n"
           "  bridge_netns=\"/run/user/$uid/containers/networks/rootless-netns/rootless-netns\"\n"
           "else\n  bridge_netns=\"/run/user/$uid/netns/rootless-netns-*\"\nfi\n") < choice);
  CHECK(choice < at("[bridge]\nnetns = \"$bridge_netns\"\nmount_ns_pid_file = \"$bridge_pause\"\n"));
  CHECK(at("[bridge]\nnetns = \"$bridge_netns\"\n") <
        at("address = \"0.0.0.0:5353\"\nnetns = \"$bridge_netns\"\n"
           "mount_ns_pid_file = \"$bridge_pause\"\n"
           "name = \"bridge\"\nfollow = true\n__FY_DNSFWD_TOML__\n"));
  CHECK(at("dns_upstream=${dns_upstream:-192.168.5.3}\n") < at("upstream = [\"$dns_upstream\"]"));
  CHECK(at("allow_file = \"/etc/fy/dnsfwd-allow.txt\"\n") > at("install -m0644 /dev/null /etc/fy/dnsfwd-allow.txt"));
  CHECK(at("dnsfwd='/opt/dns fwd'\n") < at("if ! \"$dnsfwd\" --check --config /etc/fy/dnsfwd.toml.tmp; then"));
  CHECK(at("if ! \"$dnsfwd\" --check --config /etc/fy/dnsfwd.toml.tmp; then") <
        at("mv /etc/fy/dnsfwd.toml.tmp /etc/fy/dnsfwd.toml\n"));
  // The unit's text arrives byte for byte; it is enabled and started before the wall applies.
  CHECK(at("<<'__FY_DNSFWD_UNIT__'\n[Unit]\nDescription=dnsfwd\n__FY_DNSFWD_UNIT__\n") > 0);
  CHECK(at("systemctl enable fy-dnsfwd.service fy-wall.service") < at("systemctl restart fy-dnsfwd.service\n"));
  CHECK(at("systemctl restart fy-dnsfwd.service\n") < at("systemctl reload-or-restart fy-wall.service\n"));
  CHECK(t.find("@@") == std::string::npos);
  auto units = boot_system_units(s);
  CHECK(std::find(units.begin(), units.end(), "fy-dnsfwd.service") != units.end());
}

TEST_CASE("the boot script: root's allow-list channel, a forced command and restrict only") {
  auto s = spec(41000);
  s.dnsfwd_bin = "/opt/dns fwd";
  s.dns_allow_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey+/k=";
  std::string line = dns_allow_key_line(s);
  CHECK(line ==
        "restrict,command=\"/usr/local/libexec/fy-dnsfwd-install\" ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIKey+/k= fy-machine-dns-allow");
  auto r = render_boot(s);
  std::string t = r.script;
  auto at = [&](std::string_view x) {
    size_t p = t.find(x);
    INFO(x);
    REQUIRE(p != std::string::npos);
    return p;
  };
  // Only the public half, as one line of root's file, after the old one is dropped.
  CHECK(at("grep -v ' fy-machine-dns-allow$' \"$keys\" >\"$keys.fy.tmp\" || true\n") <
        at("printf '%s\\n' '" + line + "' >>\"$keys.fy.tmp\"\n"));
  CHECK(at("printf '%s\\n' '" + line + "'") < at("mv \"$keys.fy.tmp\" \"$keys\"\n"));
  // sshd: root only by a forced command, in the drop-in read first, checked.
  CHECK(at("PermitRootLogin %s\\n' 'forced-commands-only' >/etc/ssh/sshd_config.d/00-fy-root.conf\n") <
        at("if ! /usr/sbin/sshd -t; then\n"));
  // The forced command, byte for byte (quoted heredoc), before the key that runs it.
  std::string inst = render_dns_install(s);
  CHECK(at("<<'__FY_DNS_INSTALL__'\n" + inst + "__FY_DNS_INSTALL__\n") < at("printf '%s\\n' '" + line));
  CHECK(inst.find("head -c \"$max\" >\"$tmp\"\n") < inst.find("'/opt/dns fwd' --check-allow \"$tmp\""));
  CHECK(inst.find("'/opt/dns fwd' --check-allow \"$tmp\"") < inst.find("mv -f \"$tmp\" \"$dest\"\n"));
  CHECK(inst.find("chown root:root \"$tmp\"\nchmod 0644 \"$tmp\"\n") < inst.find("mv -f \"$tmp\" \"$dest\"\n"));
  CHECK(inst.find("mv -f \"$tmp\" \"$dest\"\n") < inst.find("systemctl reload-or-restart fy-dnsfwd.service"));
  CHECK(inst.find("max=1048576\n") != std::string::npos);
  CHECK(inst.find("dest=/etc/fy/dnsfwd-allow.txt\n") != std::string::npos);
  CHECK(t.find("@@") == std::string::npos);
  // The key is an input of the id; no key, no line (and an old one removed).
  auto n = spec(41000);
  auto nr = render_boot(n);
  CHECK(nr.id != r.id);
  CHECK(nr.script.find(">>\"$keys.fy.tmp\"") == std::string::npos);
  CHECK(nr.script.find("grep -v ' fy-machine-dns-allow$'") != std::string::npos);
  // Nothing but "<type> <base64>" becomes a key line (no option or newline smuggled in).
  for (const char* bad : {"ssh-ed25519 AAAA\nssh-rsa BBBB", "ssh-ed25519 AAAA comment",
                          "command=\"sh\" ssh-ed25519 AAAA", "ssh-ed25519", ""}) {
    n.dns_allow_key = bad;
    INFO(bad);
    CHECK(dns_allow_key_line(n).empty());
  }
  // qemu's image key for root stays usable there (the backend's way in).
  n.root_login = "prohibit-password";
  CHECK(render_boot(n).script.find("PermitRootLogin %s\\n' 'prohibit-password'") != std::string::npos);
}

TEST_CASE("dns-allow: the push's ssh, the refusal's file:line, the mounted folders") {
  SshConfig t;
  t.hostname = "127.0.0.1";
  t.port = 2222;
  t.user = "fy";
  t.identity = "/img/id_ed25519";
  auto a = dns_allow_push_argv(t, "/st/dns-allow_ed25519", "/st/known_hosts", "fy-app");
  auto has = [&](const std::vector<std::string>& v, std::string_view x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  CHECK(a.front() == "ssh");
  CHECK(a[1] == "-F");
  CHECK(a[2] == "/dev/null");  // no config: not the VM user's key, not its IdentityFile
  CHECK(has(a, "/st/dns-allow_ed25519"));
  CHECK(!has(a, "/img/id_ed25519"));
  for (const char* o : {"IdentitiesOnly=yes", "IdentityAgent=none", "BatchMode=yes",
                        "StrictHostKeyChecking=yes", "UserKnownHostsFile=/st/known_hosts",
                        "GlobalKnownHostsFile=/dev/null", "HostKeyAlias=fy-app"}) {
    INFO(o);
    CHECK(has(a, o));
  }
  CHECK(a[a.size() - 2] == "root@127.0.0.1");
  CHECK(has(a, "2222"));
  CHECK(dns_allow_render_argv("/b/fy-dnsfwd-allow", "/p.toml", "/st/a.txt") ==
        std::vector<std::string>{"/b/fy-dnsfwd-allow", "/p.toml", "--out", "/st/a.txt"});
  CHECK(name_sent_file("✗ stdin:3: 'a b' is not a host name suffix\n✗ refused: kept", "/h/x.txt") ==
        "✗ /h/x.txt:3: 'a b' is not a host name suffix\n✗ refused: kept");
  CHECK(name_sent_file("stdin: no line", "/h") == "stdin: no line");
  CHECK(path_within("/r/repo/p.toml", "/r/repo"));
  CHECK(path_within("/r/repo", "/r/repo/"));
  CHECK(!path_within("/r/repo2/p.toml", "/r/repo"));
  CHECK(!path_within("/r/p.toml", ""));
}

TEST_CASE("host processes: the machine's name as a whole word of an argument, never inside one") {
  using std::string_literals::operator""s;
  std::string qemu = "qemu-system-x86_64\0-name\0fy-machine:/tmp/x/guest\0-append\0console=ttyS0\0"s;
  CHECK_FALSE(cmdline_names_machine(qemu, "app"));
  CHECK(cmdline_names_machine(qemu, "guest"));
  CHECK(cmdline_names_machine("gvproxy\0-forward-sock\0/tmp/d/podman-app-api.sock\0"s, "app"));
  CHECK(cmdline_names_machine("qemu\0-qmp\0unix:/run/qmp_app.sock,server\0"s, "app"));
  CHECK(cmdline_names_machine("vfkit\0app\0"s, "app"));
  CHECK_FALSE(cmdline_names_machine("vfkit\0apple\0happ\0"s, "app"));
  CHECK_FALSE(cmdline_names_machine("vfkit\0app"s, ""));
  CHECK(cmdline_names_machine("vfkit\0x\0app"s, "app"));  // no trailing NUL
}

TEST_CASE("qemu: vm.json round-trips; anything else is refused") {
  QemuVm v{"/var/cache/foldyard/guest/abc", 2, 3000, {"/src/app", "/src/app.worktrees"}};
  auto back = parse_qemu_vm(render_qemu_vm(v));
  REQUIRE(back);
  CHECK(back->image == v.image);
  CHECK(back->cpus == 2);
  CHECK(back->memory_mib == 3000);
  CHECK(back->mounts == v.mounts);
  CHECK_FALSE(parse_qemu_vm(""));
  CHECK_FALSE(parse_qemu_vm("[]"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": ""})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "cpus": "2"})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "cpus": 0})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "memory_mib": 64})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "mounts": ["rel"]})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "mounts": ["/a,b"]})"));
  CHECK_FALSE(parse_qemu_vm(R"({"image": "/i", "mounts": "/a"})"));
  CHECK(parse_qemu_vm(R"({"image": "/i"})")->cpus == 2);
}

TEST_CASE("qemu: the argv boots the image's kernel on the VM's overlay, daemonized, walled net") {
  QemuLaunch l{"/st/qemu/app", {"/img", 3, 2500, {"/src/app", "/src/wt"}}, false, 2222, "/b",
               std::string(kQemuGateway), 41000};
  auto a = qemu_argv(l);
  auto has = [&](const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); };
  auto after = [&](const std::string& x) {
    auto it = std::find(a.begin(), a.end(), x);
    return it == a.end() || it + 1 == a.end() ? std::string() : *(it + 1);
  };
  CHECK(a[0] == "qemu-system-x86_64");
  CHECK(after("-accel") == "tcg,thread=multi");
  CHECK_FALSE(has("-enable-kvm"));
  CHECK(after("-m") == "2500");
  CHECK(after("-smp") == "3");
  CHECK(after("-kernel") == "/img/vmlinuz");
  CHECK(after("-drive") == "file=/st/qemu/app/overlay.qcow2,if=virtio,format=qcow2");
  CHECK(after("-pidfile") == "/st/qemu/app/qemu.pid");
  CHECK(has("-daemonize"));
  CHECK(after("-append").find("init=/sbin/fy-init") != std::string::npos);
  std::string net = after("-netdev");
  CHECK(net.starts_with("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:2222-:22,"));
  // Every port of the band, and nothing else, reaches the host.
  // socat's log to /dev/null: its stderr is the guest's stream.
  CHECK(net.find(",guestfwd=tcp:10.0.2.100:41000-cmd:socat -lf /dev/null - TCP:127.0.0.1:41000") !=
        std::string::npos);
  CHECK(net.find(":41089-cmd:socat -lf /dev/null - TCP:127.0.0.1:41089") != std::string::npos);
  CHECK(net.find(":41090-") == std::string::npos);
  CHECK(net.find(":41100-cmd:socat -lf /dev/null - TCP:127.0.0.1:41100") != std::string::npos);
  CHECK(net.find("cmd:socat - ") == std::string::npos);
  CHECK(net.find(":41189-") != std::string::npos);
  CHECK(net.find(":41190-") == std::string::npos);
  size_t n = 0;
  for (size_t p = 0; (p = net.find("guestfwd=", p)) != std::string::npos; ++p) ++n;
  CHECK(n == 180);
  std::vector<std::string> fs;
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == "-virtfs") fs.push_back(a[i + 1]);
  CHECK(fs == std::vector<std::string>{
                  "local,path=/st/qemu/app/boot,mount_tag=fyboot,security_model=none,readonly=on",
                  "local,path=/b,mount_tag=fybuild,security_model=none,readonly=on",
                  "local,path=/src/app,mount_tag=fym0,security_model=none",
                  "local,path=/src/wt,mount_tag=fym1,security_model=none"});
  l.kvm = true;
  a = qemu_argv(l);
  CHECK(after("-cpu") == "host");
  CHECK(has("-enable-kvm"));
}

TEST_CASE("qemu: the boot hook mounts, runs the provisioning, then the VM user's engine") {
  std::string h = qemu_boot_hook({"/src/my app"}, "/run/user/1000/podman/podman.sock");
  CHECK(h.find("mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 fym0 '/src/my app'") !=
        std::string::npos);
  size_t prov = h.find("bash /run/fyboot/provision.sh");
  size_t eng = h.find("podman system service --time=0 unix:///run/user/1000/podman/podman.sock");
  size_t done = h.find("touch /run/fyboot.done");
  CHECK(prov != std::string::npos);
  CHECK(eng > prov);
  CHECK(done > eng);
  CHECK(h.find("su -s /bin/sh fy -c") != std::string::npos);
  // The host-made ssh host key replaces fy-init's own before anything else,
  // and the novsock closure's binary is linked where the boot script runs it.
  size_t key = h.find("install -m 0600 -o root -g root /run/fyboot/ssh_host_ed25519_key "
                      "/etc/ssh/ssh_host_ed25519_key\n");
  size_t hup = h.find("kill -HUP \"$(cat /run/sshd.pid)\"");
  CHECK(key != std::string::npos);
  CHECK(hup > key);
  CHECK(h.find("mount -t 9p") > hup);
  CHECK(prov > hup);
  size_t nv = h.find("ln -sf /fy/wall/novsock/fy-novsock /usr/local/bin/fy-novsock");
  CHECK(nv != std::string::npos);
  CHECK(nv < prov);
}

TEST_CASE("qemu: Lima's fields filled as lima would; KVM only where it boots a stock kernel") {
  CHECK(fill_lima_fields("u='{{.User}}' i='{{.UID}}' {{.User}}", "fy", 1000) == "u='fy' i='1000' fy");
  std::string why;
  CHECK_FALSE(qemu_use_kvm(true, false, true, &why));
  CHECK(why.find("kvm_pvm") != std::string::npos);
  CHECK(qemu_use_kvm(true, true, true, &why));
  CHECK_FALSE(qemu_use_kvm(false, true, false, &why));
  CHECK(qemu_use_kvm(false, true, true, &why));
}

TEST_CASE("selection: qemu is a backend of its own") {
  auto s = select_backend(std::string("QEMU"), std::nullopt);
  CHECK(s.name == "qemu");
  CHECK(s.warnings.empty());
  CHECK(cli_info("qemu").cli == "qemu-system-x86_64");
}

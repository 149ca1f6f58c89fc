#include "boot.h"

#include <fmt/format.h>

#include <regex>

#include "core/crypto.h"
#include "plan.h"

namespace fy::machine {

namespace {

// The script, with @@NAME@@ placeholders. Lima expands only {{.User}} and
// {{.UID}} in it (uses_only_lima_fields enforces that no other {{...}} gets
// in). Each heredoc's delimiter is quoted, so nothing inside is expanded by
// the guest's shell either: unit files arrive byte for byte.
constexpr std::string_view kTemplate = R"__(#!/bin/bash
@@ID@@
# foldyard's guest boot provisioning, written by fy-machine (run as root by
# lima at every boot). It narrows sudo, installs the wall through fy-wall,
# installs the forwarder's unit and key, the DNS forwarder's unit and config
# (fy-dnsfwd)@@GVISOR_NOTE@@, and writes
# /run/fy-wall/state LAST: no state file means this boot did not apply it.
install -d -m0755 /run/fy-wall
exec >>/run/fy-wall/boot.log 2>&1
chmod 0644 /run/fy-wall/boot.log
set -euo pipefail
echo "fy-provision boot $(date -u +%Y-%m-%dT%H:%M:%SZ)"
rm -f /run/fy-wall/state

# 1. Sudo narrowing: the VM user may only power the guest off.
user='{{.User}}'
uid='{{.UID}}'
cloud=/etc/sudoers.d/90-cloud-init-users
if [ -z "$user" ] && [ -f "$cloud" ]; then
  user=$(awk '/NOPASSWD/ { print $1; exit }' "$cloud")
fi
if [ -z "$user" ]; then
  echo "✗ no VM user (neither lima's {{.User}} nor a NOPASSWD line in $cloud)" >&2
  exit 1
fi
if [ -z "$uid" ]; then
  uid=$(id -u "$user")
fi
printf '%s ALL=(ALL) NOPASSWD:/sbin/shutdown -h now\n' "$user" >/run/fy-wall/sudoers.tmp
visudo -cf /run/fy-wall/sudoers.tmp
install -m0440 /run/fy-wall/sudoers.tmp "$cloud"
rm -f /run/fy-wall/sudoers.tmp
@@KERNEL_CLOSURES@@
# 2. The journal cap.
install -d -m0755 /etc/systemd/journald.conf.d
printf '[Journal]\nSystemMaxUse=@@JOURNAL_MIB@@M\n' >/etc/systemd/journald.conf.d/50-foldyard-cap.conf

# 3. The wall, through fy-wall (its config checked before it replaces the old).
wall=@@WALL_BIN@@
if [ ! -x "$wall" ]; then
  echo "✗ $wall is missing in the guest: install fy-wall there before booting" >&2
  exit 1
fi
install -d -m0755 /etc/fy-wall
cat >/etc/fy-wall/fy-wall.toml.tmp <<__FY_WALL_TOML__
# written by fy-machine's boot provisioning
[machine]
user = "$user"
gateway = @@GATEWAY@@
ports = @@PORTS_TOML@@
# The walled principals' port 53 goes to fy-dnsfwd (4c below), nowhere else.
dns_forwarder = "127.42.0.53"

[guard]
listener = "127.42.0.1"
__FY_WALL_TOML__
"$wall" apply machine --check --config /etc/fy-wall/fy-wall.toml.tmp
"$wall" apply guard --check --config /etc/fy-wall/fy-wall.toml.tmp
mv /etc/fy-wall/fy-wall.toml.tmp /etc/fy-wall/fy-wall.toml
# fy-forwarder-guard.service reads (ConditionPathExists) fy-guard.toml.
install -m0644 /etc/fy-wall/fy-wall.toml /etc/fy-wall/fy-guard.toml
cat >/etc/systemd/system/fy-wall.service.tmp <<'__FY_WALL_UNIT__'
@@WALL_UNIT@@__FY_WALL_UNIT__
mv /etc/systemd/system/fy-wall.service.tmp /etc/systemd/system/fy-wall.service
cat >/etc/systemd/system/fy-forwarder-guard.service.tmp <<'__FY_GUARD_UNIT__'
@@GUARD_UNIT@@__FY_GUARD_UNIT__
mv /etc/systemd/system/fy-forwarder-guard.service.tmp /etc/systemd/system/fy-forwarder-guard.service
# The rootful engine stays off: the walled user's rootless one is the engine.
systemctl disable --now podman.socket podman.service || true
systemctl mask podman.socket
rm -f /run/podman/podman.sock

# 4. The forwarder: its key (root only), its config, its unit.
install -d -m0700 /var/lib/fy-forwarder
install -d -m0755 /etc/fy
(umask 077 && printf '%s\n' @@FORWARDER_KEY@@ >/var/lib/fy-forwarder/forwarder.key.tmp)
mv /var/lib/fy-forwarder/forwarder.key.tmp /var/lib/fy-forwarder/forwarder.key
# The walled uids: the VM user's and every range newuidmap would grant it, as
# fy-wall's one reader (core/subid.h) reads the subordinate uids: every line by name,
# uid or a name sharing the uid. It refuses NSS subid and a grant of root,
# which fails this boot (no state file).
walled=$("$wall" render principals --user "$user")
walled="\"${walled//,/\", \"}\""
# The VM user's rootless bridge namespace, which the forwarder and fy-dnsfwd
# follow (docs/fy-machine.md, "The bridge namespace"). Rootless podman binds
# it inside its own mount namespace, the pause process's, where it never
# propagates to this one: both daemons look for it there (mount_ns_pid_file).
# Podman 4 names it netns/rootless-netns-<hash>, podman 5
# containers/networks/rootless-netns/rootless-netns: chosen by the podman
# installed (this script runs again at every boot, so an upgrade is followed).
podman_major=$(podman --version 2>/dev/null | sed -n 's/^podman version \([0-9][0-9]*\)[.].*/\1/p')
if [ "${podman_major:-0}" -ge 5 ]; then
  bridge_netns="/run/user/$uid/containers/networks/rootless-netns/rootless-netns"
else
  bridge_netns="/run/user/$uid/netns/rootless-netns-*"
fi
bridge_pause="/run/user/$uid/libpod/tmp/pause.pid"
cat >/etc/fy/forwarder.toml.tmp <<__FY_FWD_TOML__
# written by fy-machine's boot provisioning
key_file = "/var/lib/fy-forwarder/forwarder.key"
state_dir = "/run/fy-forwarder"

[upstream]
host = @@GATEWAY@@

# The whole band the wall admits: each worktree offset 0..89 has its proxy
# port (base+offset, stamped) and its token minter (base+100+offset, relayed
# byte for byte, never stamped).
[[port]]
ports = "@@PROXY_PORTS@@"
stamp = true

[[port]]
ports = "@@MINTER_PORTS@@"
stamp = false

[bridge]
netns = "$bridge_netns"
mount_ns_pid_file = "$bridge_pause"
@@BRIDGE_WATCH@@
[vm]
listen = "127.42.0.1"
walled_uids = [$walled]
__FY_FWD_TOML__
@@FORWARDER_BIN@@ --check-config --config /etc/fy/forwarder.toml.tmp
mv /etc/fy/forwarder.toml.tmp /etc/fy/forwarder.toml
cat >/etc/systemd/system/fy-forwarder.service.tmp <<'__FY_FWD_UNIT__'
@@FORWARDER_UNIT@@__FY_FWD_UNIT__
mv /etc/systemd/system/fy-forwarder.service.tmp /etc/systemd/system/fy-forwarder.service

# 4c. The DNS forwarder (fy-dnsfwd, docs/fy-dnsfwd.md): the wall's
# dns_forwarder above. Its upstream is the first nameserver of resolv.conf
# that is an IPv4 address off loopback (a local stub such as resolved's
# 127.0.0.53 is skipped: fy-dnsfwd's queries would loop back to it), else
# lima's 192.168.5.3. Computed here, in the guest: the rendered script (and
# so the provision id) does not depend on it.
dnsfwd=@@DNSFWD_BIN@@
if [ ! -x "$dnsfwd" ]; then
  echo "✗ $dnsfwd is missing in the guest: install fy-dnsfwd there before booting" >&2
  exit 1
fi
dns_upstream=$(awk '$1 == "nameserver" && $2 ~ /^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$/ && $2 !~ /^127[.]/ { print $2; exit }' /etc/resolv.conf 2>/dev/null || true)
dns_upstream=${dns_upstream:-192.168.5.3}
# The allow list: the host renders it from fy-proxy's policy and sends it
# (fy-machine dns-allow, over root's channel of 4d below). Until it does, an
# empty file: an empty list resolves nothing (every name is REFUSED), so DNS
# fails closed. A list sent before is kept across boots.
if [ ! -e /etc/fy/dnsfwd-allow.txt ]; then
  install -m0644 /dev/null /etc/fy/dnsfwd-allow.txt
fi
cat >/etc/fy/dnsfwd.toml.tmp <<__FY_DNSFWD_TOML__
# written by fy-machine's boot provisioning
upstream = ["$dns_upstream"]
# Sent by the host (fy-machine dns-allow); empty = nothing resolves.
allow_file = "/etc/fy/dnsfwd-allow.txt"
# The query log to stdout: the journal, under the cap of step 2.
log = "-"

[[listen]]
# The VM's own namespace: where the machine wall's redirect sends :53.
address = "127.42.0.53"
name = "vm"

[[listen]]
# The rootless bridge namespace (the forwarder's [bridge] netns), followed:
# it exists only once the VM user's first container runs and is made again
# after the last; each one found there gets this listener and its :53
# redirect (to the gateway's address on 5353, whatever podman numbered it),
# so the log names the container by its address. Until it is followed, a
# container's DNS leaves through aardvark and slirp/pasta as the VM user's
# socket and meets the VM's redirect above (judged, logged with the VM's
# address): never unjudged.
address = "0.0.0.0:5353"
netns = "$bridge_netns"
mount_ns_pid_file = "$bridge_pause"
name = "bridge"
follow = true
__FY_DNSFWD_TOML__
if ! "$dnsfwd" --check --config /etc/fy/dnsfwd.toml.tmp; then
  echo "✗ the DNS forwarder's config (/etc/fy/dnsfwd.toml.tmp, upstream $dns_upstream) is refused: see fy-dnsfwd's message above" >&2
  exit 1
fi
mv /etc/fy/dnsfwd.toml.tmp /etc/fy/dnsfwd.toml
cat >/etc/systemd/system/fy-dnsfwd.service.tmp <<'__FY_DNSFWD_UNIT__'
@@DNSFWD_UNIT@@__FY_DNSFWD_UNIT__
mv /etc/systemd/system/fy-dnsfwd.service.tmp /etc/systemd/system/fy-dnsfwd.service

# 4d. The allow list's channel from the host (fy-machine dns-allow,
# docs/fy-machine.md): root's ssh for one key, made on the host and held
# there, whose forced command is the install below (restrict: no pty, no
# forwarding; the command the client asks for is ignored). Root, not the VM
# user: the walled side must not write the list or start an install of its
# own, and its sudo is only the shutdown above. sshd lets root in only with
# a forced command (00-fy-root.conf, read before every other drop-in: the
# first value sshd reads wins).
install -d -m0755 "$(dirname @@DNS_INSTALL_BIN@@)"
cat >@@DNS_INSTALL_BIN@@.tmp <<'__FY_DNS_INSTALL__'
@@DNS_INSTALL@@__FY_DNS_INSTALL__
chmod 0755 @@DNS_INSTALL_BIN@@.tmp
mv @@DNS_INSTALL_BIN@@.tmp @@DNS_INSTALL_BIN@@
install -d -m0700 /root/.ssh
keys=/root/.ssh/authorized_keys
touch "$keys"
grep -v ' @@DNS_KEY_COMMENT@@$' "$keys" >"$keys.fy.tmp" || true
@@DNS_KEY_LINE@@chmod 0600 "$keys.fy.tmp"
mv "$keys.fy.tmp" "$keys"
install -d -m0755 /etc/ssh/sshd_config.d
printf '# written by fy-machine: root only by a key with a forced command\nPermitRootLogin %s\n' @@ROOT_LOGIN@@ >/etc/ssh/sshd_config.d/00-fy-root.conf
if ! /usr/sbin/sshd -t; then
  rm -f /etc/ssh/sshd_config.d/00-fy-root.conf
  echo "✗ sshd refuses its config with 00-fy-root.conf (see above): removed; the allow list's channel is not installed" >&2
  exit 1
fi
sshd_reloaded=no
for u in ssh.service sshd.service; do
  if [ "$(systemctl is-active "$u" 2>/dev/null)" = active ]; then
    systemctl reload "$u" && sshd_reloaded=yes
    break
  fi
done
if [ "$sshd_reloaded" = no ] && [ -s /run/sshd.pid ]; then
  kill -HUP "$(cat /run/sshd.pid)"
fi
@@GVISOR@@
# 5. Apply without ever taking a wall down: reload-or-restart runs the unit's
# ExecReload (one atomic apply) when it is active, a start when it is not.
systemctl daemon-reload
systemctl enable fy-dnsfwd.service fy-wall.service fy-forwarder-guard.service fy-forwarder.service
# fy-dnsfwd first (its unit is Before=fy-wall.service too): on the first boot
# the redirect then never points at a closed port. It needs nothing of the
# wall (it runs as root, which the wall does not redirect). Restarted, not
# reloaded: a new upstream needs a restart; the moment it is down the
# redirected DNS meets a closed port and fails, closed.
systemctl restart fy-dnsfwd.service
systemctl reload-or-restart fy-wall.service
systemctl reload-or-restart fy-forwarder-guard.service
systemctl reload-or-restart fy-forwarder.service
"$wall" status machine --config /etc/fy-wall/fy-wall.toml
"$wall" status guard --config /etc/fy-wall/fy-wall.toml

# 6. Last, and only when everything above held: what this boot wanted.
printf '%s\n' @@WANT@@ >/run/fy-wall/state.tmp
chmod 0644 /run/fy-wall/state.tmp
mv /run/fy-wall/state.tmp /run/fy-wall/state
echo "fy-provision boot done: "@@WANT@@
)__";

// The forced command of root's allow-list key (boot.h: render_dns_install).
constexpr std::string_view kDnsInstall = R"__(#!/bin/bash
# fy-dnsfwd-install: the forced command of root's allow-list key, written by
# fy-machine's boot provisioning; the host runs it with `fy-machine dns-allow`.
# Reads the new allow list on stdin (under 1 MiB), checks it with fy-dnsfwd's
# own reader, installs it atomically (root:root 0644) and has fy-dnsfwd
# re-read it (SIGHUP, the unit's ExecReload). A refused list leaves the old
# one. The command the client asked for (SSH_ORIGINAL_COMMAND) is ignored.
# Exit: 0 installed; 3 refused, the old list kept; 4 installed, not reloaded.
set -euo pipefail
umask 077
dest=@@DEST@@
max=1048576
tmp=$(mktemp "$(dirname "$dest")/.dnsfwd-allow.XXXXXX")
trap 'rm -f "$tmp"' EXIT
old=$(grep -cv -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$dest" 2>/dev/null || true)
head -c "$max" >"$tmp"
if [ "$(stat -c %s "$tmp")" -ge "$max" ]; then
  echo "✗ the allow list sent is 1 MiB or more: refused, $dest kept (${old:-0} names) — one host name a line; render it with fy-dnsfwd-allow POLICY" >&2
  exit 3
fi
if ! out=$(@@DNSFWD_BIN@@ --check-allow "$tmp" 2>&1); then
  printf '%s\n' "${out//"$tmp"/stdin}" >&2
  echo "✗ the allow list sent is refused: $dest kept (${old:-0} names) — fix it, or the policy it was rendered from, and send it again" >&2
  exit 3
fi
n=${out##*: }
n=${n%% *}
chown root:root "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$dest"
trap - EXIT
if ! systemctl reload-or-restart fy-dnsfwd.service; then
  echo "✗ installed $dest ($n names, was ${old:-0}), but fy-dnsfwd did not reload — look at: systemctl status fy-dnsfwd.service" >&2
  exit 4
fi
echo "✓ installed $dest ($n names, was ${old:-0}); fy-dnsfwd told to re-read it (SIGHUP)"
)__";

// ADR-0025's posture: a runsc-default engine for the walled user, behind the
// socket filter (fy-sockfilter), as user units every login of the user gets.
constexpr std::string_view kGvisor = R"__(
# 4b. The gVisor posture: a runsc engine behind the socket filter (user units).
home=$(getent passwd "$user" | cut -d: -f6)
gid=$(id -g "$user")
install -d -o "$uid" -g "$gid" "$home/.config" "$home/.config/containers"
cat >"$home/.config/containers/runsc.conf" <<'__FY_RUNSC_CONF__'
[engine]
runtime = "runsc-fy"

[engine.runtimes]
runsc-fy = ["/usr/local/libexec/fy/runsc-fy"]

# podman >= 5 sends wasi/wasm images to crun-wasm (crun, outside gVisor)
# before its default runtime: those platforms go to runsc-fy too
# (lifecycle/sockfilter/provision/runsc.conf.in, docs/fy-sockfilter.md).
[engine.platform_to_oci_runtime]
"wasi/wasm" = "runsc-fy"
"wasi/wasm32" = "runsc-fy"
"wasi/wasm64" = "runsc-fy"

[containers]
label = false
__FY_RUNSC_CONF__
chown "$uid:$gid" "$home/.config/containers/runsc.conf"
install -d -m0755 /usr/local/libexec/fy
cat >/usr/local/libexec/fy/runsc-fy <<'__FY_RUNSC_WRAP__'
#!/bin/sh
exec @@RUNSC_BIN@@ --ignore-cgroups --host-uds=all "$@"
__FY_RUNSC_WRAP__
chmod 0755 /usr/local/libexec/fy/runsc-fy
cat >/etc/systemd/user/podman-runsc.service <<'__FY_RUNSC_UNIT__'
[Unit]
Description=rootless podman API service with runsc as its default runtime (ADR-0025)

[Service]
Environment=CONTAINERS_CONF_OVERRIDE=%h/.config/containers/runsc.conf
ExecStart=/usr/bin/podman system service --time=0 unix://%t/podman/podman-runsc.sock
Restart=always

[Install]
WantedBy=default.target
__FY_RUNSC_UNIT__
cat >/etc/systemd/user/podman-runsc-filter.service <<'__FY_FILTER_UNIT__'
[Unit]
Description=foldyard socket filter in front of the runsc engine (ADR-0025)
Requires=podman-runsc.service
After=podman-runsc.service

[Service]
ExecStart=@@SOCKFILTER_BIN@@ %t/podman/podman-runsc.sock %t/podman/podman-runsc-filtered.sock
Restart=always

[Install]
WantedBy=default.target
__FY_FILTER_UNIT__
systemctl --global enable podman-runsc.service podman-runsc-filter.service
systemctl --user -M "$user@" daemon-reload || true
systemctl --user -M "$user@" restart podman-runsc.service podman-runsc-filter.service || true
)__";

// The kernel closures (docs/fy-wall.md, "vsock" and "Packets without a socket
// file"): text of their own, rendered by render_kernel_closures. Uses the
// template's $user and $uid.
constexpr std::string_view kKernelClosures = R"__(
# 1b. The kernel closures. The socket families a dev box never needs may not
# load (fy-wall's modprobe.d file: socket() of them fails, an explicit
# modprobe too; a module loaded before this boot's provisioning stays), and
# AF_VSOCK and multicast memberships are refused to the VM user and every uid
# it can map (fy-novsock reads them as fy-wall does, core/subid.h) by BPF-LSM
# programs on socket_create and socket_setsockopt (pinned: they stay after the
# command exits).
# Root and the guest agent keep vsock (Lima's vz driver carries the agent).
install -d -m0755 /etc/modprobe.d
@@WALL_BIN@@ render families >/etc/modprobe.d/fy-wall-families.conf.tmp
mv /etc/modprobe.d/fy-wall-families.conf.tmp /etc/modprobe.d/fy-wall-families.conf
@@NOVSOCK_BIN@@ apply --user "$user"
@@NOVSOCK_BIN@@ status
)__";

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// A unit file's text, ending in exactly one newline (the heredoc's delimiter
// must start a line), and never containing a line equal to the delimiter.
std::string unit_body(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text + "\n";
}

std::string ports_toml(int64_t b) {
  return fmt::format("[\"{}-{}\", \"{}-{}\"]", b, b + 89, b + 100, b + 189);
}

}  // namespace

std::string render_kernel_closures(const BootSpec& s) {
  std::string t(kKernelClosures);
  replace_all(t, "@@WALL_BIN@@", shell_quote(s.wall_bin));
  replace_all(t, "@@NOVSOCK_BIN@@", shell_quote(s.novsock_bin));
  return t;
}

std::string render_dns_install(const BootSpec& s) {
  std::string t(kDnsInstall);
  replace_all(t, "@@DEST@@", "/etc/fy/dnsfwd-allow.txt");
  replace_all(t, "@@DNSFWD_BIN@@", shell_quote(s.dnsfwd_bin));
  return t;
}

std::string dns_allow_key_line(const BootSpec& s) {
  static const std::regex key(R"(^([a-z0-9@.-]+) ([A-Za-z0-9+/]+={0,2})$)");
  std::smatch m;
  if (!std::regex_match(s.dns_allow_key, m, key)) return "";
  if (s.dns_install_bin.find_first_of("\"\\ \n") != std::string::npos) return "";
  return fmt::format("restrict,command=\"{}\" {} {} {}", s.dns_install_bin, m[1].str(), m[2].str(),
                     kDnsAllowKeyComment);
}

std::string boot_want(const BootSpec& s) {
  return fmt::format("wall on {}{}", wall_ports(s.port_base), s.gvisor ? " gvisor" : "");
}

std::vector<std::string> boot_system_units(const BootSpec&) {
  return {"fy-dnsfwd.service", "fy-wall.service", "fy-forwarder-guard.service",
          "fy-forwarder.service"};
}

std::vector<std::string> boot_user_units(const BootSpec& s) {
  if (!s.gvisor) return {};
  return {"podman-runsc.service", "podman-runsc-filter.service"};
}

Rendered render_boot(const BootSpec& s) {
  std::string t(kTemplate);
  std::string gv = s.gvisor ? std::string(kGvisor) : std::string();
  replace_all(gv, "@@RUNSC_BIN@@", shell_quote(s.runsc_bin));
  replace_all(gv, "@@SOCKFILTER_BIN@@", s.sockfilter_bin);
  replace_all(t, "@@KERNEL_CLOSURES@@", render_kernel_closures(s));
  replace_all(t, "@@GVISOR@@", gv);
  replace_all(t, "@@GVISOR_NOTE@@", s.gvisor ? ", the socket filter's units (gVisor)" : "");
  replace_all(t, "@@JOURNAL_MIB@@", std::to_string(s.journal_max_mib));
  replace_all(t, "@@WALL_BIN@@", shell_quote(s.wall_bin));
  replace_all(t, "@@FORWARDER_BIN@@", shell_quote(s.forwarder_bin));
  replace_all(t, "@@DNSFWD_BIN@@", shell_quote(s.dnsfwd_bin));
  replace_all(t, "@@GATEWAY@@", json_quote(s.gateway));
  replace_all(t, "@@PORTS_TOML@@", ports_toml(s.port_base));
  replace_all(t, "@@PROXY_PORTS@@", fmt::format("{}-{}", s.port_base, s.port_base + 89));
  replace_all(t, "@@MINTER_PORTS@@", fmt::format("{}-{}", s.port_base + 100, s.port_base + 189));
  replace_all(t, "@@FORWARDER_KEY@@", shell_quote(s.forwarder_key));
  replace_all(t, "@@WANT@@", shell_quote(boot_want(s)));
  replace_all(t, "@@DNS_INSTALL_BIN@@", shell_quote(s.dns_install_bin));
  replace_all(t, "@@DNS_KEY_COMMENT@@", std::string(kDnsAllowKeyComment));
  std::string line = dns_allow_key_line(s);
  replace_all(t, "@@DNS_KEY_LINE@@",
              line.empty() ? std::string()
                           : "printf '%s\\n' " + shell_quote(line) + " >>\"$keys.fy.tmp\"\n");
  replace_all(t, "@@ROOT_LOGIN@@", shell_quote(s.root_login));
  replace_all(t, "@@BRIDGE_WATCH@@",
              s.bridge_watch.empty() ? "" : "watch = " + json_quote(s.bridge_watch) + "\n");
  // Units last: their text is not scanned for placeholders again.
  replace_all(t, "@@WALL_UNIT@@", unit_body(s.wall_unit));
  replace_all(t, "@@GUARD_UNIT@@", unit_body(s.guard_unit));
  replace_all(t, "@@FORWARDER_UNIT@@", unit_body(s.forwarder_unit));
  replace_all(t, "@@DNSFWD_UNIT@@", unit_body(s.dnsfwd_unit));
  replace_all(t, "@@DNS_INSTALL@@", render_dns_install(s));
  Rendered r;
  r.id = hex(sha256(t)).substr(0, 16);
  r.script = t;
  replace_all(r.script, "@@ID@@", std::string(kProvisionMarker) + r.id);
  return r;
}

bool uses_only_lima_fields(const std::string& script, std::string* bad) {
  static const std::regex field(R"(\{\{[^}]*\}\})");
  for (auto it = std::sregex_iterator(script.begin(), script.end(), field);
       it != std::sregex_iterator(); ++it) {
    std::string f = it->str();
    if (f != "{{.User}}" && f != "{{.UID}}") {
      if (bad) *bad = f;
      return false;
    }
  }
  return true;
}

}  // namespace fy::machine

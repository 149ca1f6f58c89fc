#!/bin/sh
# fy-wall's boot snippet for a guest: run as root at boot (a Lima `provision`
# script of mode system, under its own marker line), with fy-wall already at
# /usr/local/bin/fy-wall (or FY_WALL_BIN). It writes the config, installs the
# unit(s), applies, checks the result, and records what it wanted in
# /run/fy-wall/state, as the reference's boot script does. Everything it
# prints goes to /run/fy-wall/boot.log.
#
#   FY_WALL_USER     the VM user (required)
#   FY_WALL_GATEWAY  the host gateway (default 192.168.5.2)
#   FY_WALL_PORTS    the daemon port bands (default "41000-41089,41100-41189")
#   FY_WALL_GUARD    1: also the forwarder's guard (default 0)
#   FY_WALL_DNSFWD   1: also the DNS forwarder, fy-dnsfwd, and the wall's
#                    dns_forwarder redirect to it (default 0)
#   FY_DNSFWD_BIN    fy-dnsfwd (default /usr/libexec/fy/fy-dnsfwd, its unit's)
#   FY_DNSFWD_UNIT   its unit file (default $FY_WALL_UNITS/fy-dnsfwd.service;
#                    in the source tree wall/dnsfwd/exe/fy-dnsfwd.service)
#   FY_DNSFWD_BRIDGE 1: also a listener in the VM user's rootless bridge
#                    namespace, followed at podman 4's and podman 5's paths
#                    (default 1; 0 for the VM's namespace only)
#   FY_WALL_UNITS    where the unit files are (default: beside this script)
set -eu
install -d -m0755 /run/fy-wall /etc/fy-wall
exec >>/run/fy-wall/boot.log 2>&1
echo "fy-wall boot $(date -u +%Y-%m-%dT%H:%M:%SZ)"

bin=${FY_WALL_BIN:-/usr/local/bin/fy-wall}
units=${FY_WALL_UNITS:-$(dirname "$0")}
user=${FY_WALL_USER:?set FY_WALL_USER to the VM user}
gateway=${FY_WALL_GATEWAY:-192.168.5.2}
ports=${FY_WALL_PORTS:-41000-41089,41100-41189}
guard=${FY_WALL_GUARD:-0}
dnsfwd=${FY_WALL_DNSFWD:-0}
dnsfwd_bin=${FY_DNSFWD_BIN:-/usr/libexec/fy/fy-dnsfwd}
dnsfwd_unit=${FY_DNSFWD_UNIT:-$units/fy-dnsfwd.service}
dnsfwd_bridge=${FY_DNSFWD_BRIDGE:-1}

quoted_ports=$(printf '%s' "$ports" | sed 's/[[:space:]]//g; s/,/", "/g')
umask 022
cat >/etc/fy-wall/fy-wall.toml.tmp <<EOT
# written by fy-wall's boot snippet
[machine]
user = "$user"
gateway = "$gateway"
ports = ["$quoted_ports"]
EOT
if [ "$dnsfwd" = 1 ]; then
  # The walled principals' port 53 goes to fy-dnsfwd's listener, nowhere else.
  printf 'dns_forwarder = "127.42.0.53"\n' >>/etc/fy-wall/fy-wall.toml.tmp
fi
# Refuse a bad config before it replaces the good one.
"$bin" apply machine --check --config /etc/fy-wall/fy-wall.toml.tmp
mv /etc/fy-wall/fy-wall.toml.tmp /etc/fy-wall/fy-wall.toml
install -m0644 "$units/fy-wall.service" /etc/systemd/system/fy-wall.service

want="wall on $ports"
if [ "$dnsfwd" = 1 ]; then
  # fy-dnsfwd's upstream: the first IPv4 nameserver of resolv.conf off
  # loopback (a local stub such as 127.0.0.53 is skipped: the queries would
  # loop back to it), else lima's 192.168.5.3.
  if [ ! -x "$dnsfwd_bin" ]; then
    echo "✗ $dnsfwd_bin is missing: install fy-dnsfwd before FY_WALL_DNSFWD=1" >&2
    exit 1
  fi
  dns_upstream=$(awk '$1 == "nameserver" && $2 ~ /^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$/ && $2 !~ /^127[.]/ { print $2; exit }' /etc/resolv.conf 2>/dev/null || true)
  dns_upstream=${dns_upstream:-192.168.5.3}
  install -d -m0755 /etc/fy
  # The allow list: the host writes it (fy-dnsfwd-allow POLICY, from
  # fy-proxy's policy) and copies it in. Until then an empty file: an empty
  # list resolves nothing (every name REFUSED), so DNS fails closed.
  if [ ! -e /etc/fy/dnsfwd-allow.txt ]; then
    install -m0644 /dev/null /etc/fy/dnsfwd-allow.txt
  fi
  cat >/etc/fy/dnsfwd.toml.tmp <<EOT
# written by fy-wall's boot snippet
upstream = ["$dns_upstream"]
# Written by the host (fy-dnsfwd-allow POLICY); empty = nothing resolves.
allow_file = "/etc/fy/dnsfwd-allow.txt"
log = "-"

[[listen]]
# The VM's own namespace: where the machine wall's redirect sends :53.
address = "127.42.0.53"
name = "vm"
EOT
  if [ "$dnsfwd_bridge" = 1 ]; then
    # The rootless bridge namespace, followed: it exists only while the VM
    # user has a container on a bridge network, and it is made again after
    # the last. Rootless podman binds it inside its own mount namespace (its
    # pause process's; it never propagates to this one), so both listeners
    # look for it there (mount_ns_pid_file). Podman 4 names it
    # netns/rootless-netns-<hash>, podman 5 at the second path; only one ever
    # exists, and each listener waits for its own. Each
    # namespace found there gets its listener and its :53 redirect (to the
    # bridge gateway's address on 5353), so the log names the container by
    # its address. Until then a container's DNS leaves as the VM user's and
    # meets the VM's redirect above: judged, never unjudged.
    vm_uid=$(id -u "$user")
    cat >>/etc/fy/dnsfwd.toml.tmp <<EOT

[[listen]]
address = "0.0.0.0:5353"
netns = "/run/user/$vm_uid/netns/rootless-netns-*"
mount_ns_pid_file = "/run/user/$vm_uid/libpod/tmp/pause.pid"
name = "bridge"
follow = true

[[listen]]
address = "0.0.0.0:5353"
netns = "/run/user/$vm_uid/containers/networks/rootless-netns/rootless-netns"
mount_ns_pid_file = "/run/user/$vm_uid/libpod/tmp/pause.pid"
name = "bridge5"
follow = true
EOT
  fi
  if ! "$dnsfwd_bin" --check --config /etc/fy/dnsfwd.toml.tmp; then
    echo "✗ the DNS forwarder's config (upstream $dns_upstream) is refused: see above" >&2
    exit 1
  fi
  mv /etc/fy/dnsfwd.toml.tmp /etc/fy/dnsfwd.toml
  install -m0644 "$dnsfwd_unit" /etc/systemd/system/fy-dnsfwd.service
  want="$want dnsfwd"
fi
if [ "$guard" = 1 ]; then
  { cat /etc/fy-wall/fy-wall.toml; printf '\n[guard]\nlistener = "127.42.0.1"\n'; } \
    >/etc/fy-wall/fy-guard.toml.tmp
  "$bin" apply guard --check --config /etc/fy-wall/fy-guard.toml.tmp
  mv /etc/fy-wall/fy-guard.toml.tmp /etc/fy-wall/fy-guard.toml
  install -m0644 "$units/fy-forwarder-guard.service" \
    /etc/systemd/system/fy-forwarder-guard.service
  want="$want guard"
fi

# Apply without ever taking a wall down. On every boot after the first the
# units are already active (systemd started them, enabled, before the network),
# and `systemctl restart` would run ExecStop (`fy-wall remove`) and only then
# ExecStart: a moment with no wall. `reload-or-restart` runs ExecReload (one
# atomic `fy-wall apply`) on an active unit and starts an inactive one; a
# failed or never-started unit has nothing to stop, so no remove runs either.
systemctl daemon-reload
if [ "$dnsfwd" = 1 ]; then
  # Before the wall (its unit is Before=fy-wall.service too): on the first
  # boot the redirect then never points at a closed port. It needs nothing of
  # the wall (root is not redirected). Restarted, not reloaded (a new upstream
  # needs a restart); while it is down the redirected DNS fails, closed.
  systemctl enable fy-dnsfwd.service
  systemctl restart fy-dnsfwd.service
fi
systemctl enable fy-wall.service
systemctl reload-or-restart fy-wall.service
"$bin" status machine --config /etc/fy-wall/fy-wall.toml
if [ "$guard" = 1 ]; then
  systemctl enable fy-forwarder-guard.service
  systemctl reload-or-restart fy-forwarder-guard.service
  "$bin" status guard --config /etc/fy-wall/fy-guard.toml
fi

# Last, and only when everything above held: what this boot wanted.
printf '%s\n' "$want" >/run/fy-wall/state.tmp
chmod 0644 /run/fy-wall/state.tmp
mv /run/fy-wall/state.tmp /run/fy-wall/state
echo "fy-wall boot done: $want"

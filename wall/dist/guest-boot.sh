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

quoted_ports=$(printf '%s' "$ports" | sed 's/[[:space:]]//g; s/,/", "/g')
umask 022
cat >/etc/fy-wall/fy-wall.toml.tmp <<EOT
# written by fy-wall's boot snippet
[machine]
user = "$user"
gateway = "$gateway"
ports = ["$quoted_ports"]
EOT
# Refuse a bad config before it replaces the good one.
"$bin" apply machine --check --config /etc/fy-wall/fy-wall.toml.tmp
mv /etc/fy-wall/fy-wall.toml.tmp /etc/fy-wall/fy-wall.toml
install -m0644 "$units/fy-wall.service" /etc/systemd/system/fy-wall.service

want="wall on $ports"
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

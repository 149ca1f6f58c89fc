#!/usr/bin/python3
"""The guest's boot snippet and unit files (wall/dist/), run for real.

The snippet runs as root in a private mount namespace whose /etc is an
overlay (its writes land in a temp dir, never in the machine's /etc), with
fy-wall at /usr/local/bin, inside a test network namespace. There is no
systemd here, so `systemctl` is a stub that does what systemd does with the
verbs the snippet uses, for the units' kind (Type=oneshot,
RemainAfterExit=yes): a unit is active or not, and that state outlives one run
of the snippet, as systemd's does while the guest runs; `start` runs ExecStart
only when the unit is not active; `stop` runs ExecStop only when it is;
`restart` is stop then start. A Type=simple unit (fy-dnsfwd's) is active
while its ExecStart runs in the background, its pid in $FY_STUB_STATE-pids;
`stop` ends that pid. `reload` runs ExecReload and refuses an
inactive unit; `reload-or-restart` reloads an active unit that has
ExecReload and starts an inactive one. Its `__boot` verb is what systemd does
at boot: every enabled unit starts, none active before. The unit files
themselves are checked by `systemd-analyze verify`.

The storm classes prove, as test_apply.py's do for `fy-wall apply`, that
running the snippet again on a running guest, with a walled client
hammering both walls, never lets a packet through that they refuse; the
control runs the snippet as it was (`systemctl restart`) and the same
observers see packets get out.
"""
import json
import os
import re
import subprocess
import tempfile
import time
import unittest

import fywnet as n
from test_apply import StormBase

DIST = os.path.join(n.SOURCE, "wall", "dist")
DNSFWD_UNIT = os.path.join(n.SOURCE, "wall", "dnsfwd", "exe", "fy-dnsfwd.service")
FY_DNSFWD = os.path.join(n.BUILD, "wall", "dnsfwd", "fy-dnsfwd")
T = n.GuestTopology
U = n.WALLED_UID

STUB = r"""#!/bin/sh
set -u
state=${FY_STUB_STATE:?the test sets FY_STUB_STATE}
mkdir -p /run/fy-wall "$state"
log=/run/fy-wall/systemctl.log
echo "systemctl $*" >>"$log"
verb=${1:-}
unit=${2:-}
file=/etc/systemd/system/$unit

lines() { sed -n "s/^$1=//p" "$file"; }
pids=$state-pids
mkdir -p "$pids"
simple() { [ "$(lines Type)" = simple ]; }
run() {  # every Exec$1= line in order; a leading '-' ignores its failure
  lines "$1" | while IFS= read -r cmd; do
    ignore=0
    case $cmd in -*) ignore=1; cmd=${cmd#-} ;; esac
    echo "stub: $unit $1: $cmd" >>"$log"
    MAINPID=$(cat "$pids/$unit" 2>/dev/null || true) sh -c "$cmd" </dev/null || [ $ignore = 1 ] || exit 1
  done
}
active() {
  [ -e "$state/$unit" ] || return 1
  if simple; then kill -0 "$(cat "$pids/$unit")" 2>/dev/null || { rm -f "$state/$unit"; return 1; }; fi
}
start() {
  active && return 0
  cond=$(lines ConditionPathExists)
  if [ -n "$cond" ] && [ ! -e "$cond" ]; then
    echo "stub: $unit: ConditionPathExists=$cond failed, not started" >>"$log"
    return 0
  fi
  if simple; then
    run ExecStartPre || { echo "Job for $unit failed (ExecStartPre)." >&2; return 1; }
    cmd=$(lines ExecStart)
    echo "stub: $unit ExecStart: $cmd" >>"$log"
    setsid sh -c "exec $cmd" </dev/null >>"$pids/$unit.out" 2>&1 &
    echo $! >"$pids/$unit"
    touch "$state/$unit"
  elif run ExecStartPre && run ExecStart; then
    touch "$state/$unit"
  else
    echo "Job for $unit failed because the control process exited with error code." >&2
    return 1
  fi
}
stop() {
  active || return 0
  rm -f "$state/$unit"
  if simple; then
    pid=$(cat "$pids/$unit"); kill "$pid" 2>/dev/null || true
    i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    rm -f "$pids/$unit"
  fi
  run ExecStop || true  # systemd stops the unit whatever ExecStop returns
}
reload() {
  if ! active; then
    echo "Unit $unit cannot be reloaded because it is inactive." >&2
    return 1
  fi
  if [ -z "$(lines ExecReload)" ]; then
    echo "Failed to reload $unit: Job type reload is not applicable for unit $unit." >&2
    return 1
  fi
  run ExecReload || { echo "Job for $unit failed." >&2; return 1; }
}
case $verb in
  daemon-reload) ;;
  enable)
    wants=$(sed -n 's/^WantedBy=//p' "$file")
    mkdir -p "/etc/systemd/system/$wants.wants"
    ln -sf "$file" "/etc/systemd/system/$wants.wants/$unit" ;;
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  reload) reload ;;
  reload-or-restart)
    if active && [ -n "$(lines ExecReload)" ]; then reload; else stop; start; fi ;;
  try-restart) if active; then stop; start; fi ;;
  is-active) if active; then echo active; else echo inactive; exit 3; fi ;;
  __boot)
    rm -f "$state"/*
    for link in /etc/systemd/system/*.wants/*; do
      [ -e "$link" ] || continue
      unit=$(basename "$link"); file=/etc/systemd/system/$unit
      start || exit 1
    done ;;
  *) echo "stub systemctl: '$verb' is not implemented" >&2; exit 1 ;;
esac
"""


class BootRig:
    """A guest's persistent /etc (an overlay's upper dir), the systemctl stub
    and its unit state, in a temp dir; `boot` runs the snippet once."""

    def __init__(self, ident):
        self.ident = ident
        self.tmp = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-boot-")
        n.on_cleanup(lambda: n.sh("rm", "-rf", self.tmp), "boot dir")
        n.on_cleanup(self.kill_daemons, "the stub's simple units")
        for d in ("upper", "work", "stub", "out", "units"):
            os.mkdir(os.path.join(self.tmp, d))
        with open(os.path.join(self.tmp, "stub", "systemctl"), "w") as f:
            f.write(STUB)
        os.chmod(os.path.join(self.tmp, "stub", "systemctl"), 0o755)
        # The snippet as it was before it used reload-or-restart: the control.
        with open(os.path.join(DIST, "guest-boot.sh")) as f:
            snippet = f.read()
        self.restart_snippet = os.path.join(self.tmp, "guest-boot-restart.sh")
        with open(self.restart_snippet, "w") as f:
            f.write(snippet.replace("systemctl reload-or-restart ", "systemctl restart "))

    def kill_daemons(self):
        d = os.path.join(self.tmp, "units-pids")
        for u in os.listdir(d) if os.path.isdir(d) else []:
            if not u.endswith(".out"):
                with open(os.path.join(d, u)) as f:
                    pid = f.read().strip()
                n.sh("kill", pid, check=False)

    def daemon_pid(self, unit):
        with open(os.path.join(self.tmp, "units-pids", unit)) as f:
            return int(f.read())

    def boot(self, ns, env, then="", reboot=False, snippet=None):
        """Runs the snippet in `ns`; with `reboot`, first what systemd does at
        boot (starts every enabled unit). Returns the completed process; the
        run's /run/fy-wall is copied to out/ (the previous run's is replaced)."""
        t = self.tmp
        snippet = snippet or os.path.join(DIST, "guest-boot.sh")
        stub_env = f"PATH={t}/stub:$PATH FY_STUB_STATE={t}/units"
        script = f"""
set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir={t}/upper,workdir={t}/work /etc
mount --bind {self.ident.passwd} /etc/passwd
echo {n.WALLED_NAME}:{n.SUBUID_START}:{n.SUBUID_COUNT} >/etc/subuid
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /usr/local/bin
cp {n.FY_WALL} /usr/local/bin/fy-wall
mount -t tmpfs tmpfs /usr/libexec
mkdir -p /usr/libexec/fy
cp {FY_DNSFWD} /usr/libexec/fy/fy-dnsfwd
printf 'nameserver 127.0.0.53\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n' >/etc/resolv.conf
mkdir -p /etc/systemd/system
rc=0
{"env " + stub_env + " systemctl __boot || rc=$?" if reboot else ""}
[ $rc = 0 ] && {{ env {stub_env} {env} FY_WALL_UNITS={DIST} FY_DNSFWD_UNIT={DNSFWD_UNIT} sh {snippet} || rc=$?; }}
rm -rf {t}/out/fy-wall
cp -r /run/fy-wall {t}/out/ 2>/dev/null || true
{then}
exit $rc
"""
        return n.sh("unshare", "-m", "--propagation", "private",
                    *n.nsexec(ns, "sh", "-c", script), check=False, timeout=120)

    def out(self, name):
        path = os.path.join(self.tmp, "out", "fy-wall", name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()

    def active_units(self):
        return sorted(os.listdir(os.path.join(self.tmp, "units")))


GUARDED = "FY_WALL_USER=fywalice FY_WALL_GUARD=1"
DNSFWD = GUARDED + " FY_WALL_DNSFWD=1"


class Boot(unittest.TestCase):
    def setUp(self):
        self.mark = len(n._undo)
        self.ident = n.Identity()
        self.rig = BootRig(self.ident)

    def tearDown(self):
        n.cleanup(self.mark)

    def boot(self, ns, env, **kw):
        r = self.rig.boot(ns, env, **kw)
        self.log = self.rig.out("boot.log") or ""
        self.calls = self.rig.out("systemctl.log") or ""
        return r

    def test_the_snippet_installs_applies_and_records_the_wall_and_the_guard(self):
        ns = n.netns("boot")
        r = self.boot(ns, GUARDED)
        self.assertEqual(r.returncode, 0, r.stderr + self.log)
        self.assertEqual(self.rig.out("state"), "wall on 41000-41089,41100-41189 guard\n")
        self.assertIn("table inet fy_wall: PRESENT, as rendered", self.log)
        self.assertIn("table ip fy_guard: PRESENT, as rendered", self.log)
        # The subuid range came from /etc/subuid: 2 uid ranges x 2 bands.
        self.assertIn("policy routes: 4 rule(s)", self.log)
        self.assertIn("systemctl enable fy-wall.service", self.calls)
        self.assertIn("systemctl reload-or-restart fy-forwarder-guard.service", self.calls)
        # Nothing was active yet: both units were started, with ExecStart.
        self.assertIn("stub: fy-wall.service ExecStart: /usr/local/bin/fy-wall apply machine",
                      self.calls)
        self.assertIn("stub: fy-forwarder-guard.service ExecStart: ", self.calls)
        self.assertEqual(self.rig.active_units(),
                         ["fy-forwarder-guard.service", "fy-wall.service"])
        tables = n.in_ns(ns, "nft", "list", "tables").stdout
        for t in ("table inet fy_wall", "table ip6 fy_wall6", "table ip fy_guard"):
            self.assertIn(t, tables)
        with open(os.path.join(self.rig.tmp, "upper", "fy-wall", "fy-wall.toml")) as f:
            self.assertIn('ports = ["41000-41089", "41100-41189"]', f.read())
        self.assertTrue(os.path.exists(
            os.path.join(self.rig.tmp, "upper", "systemd", "system", "fy-wall.service")))
        self.assertTrue(os.path.islink(os.path.join(
            self.rig.tmp, "upper", "systemd", "system", "multi-user.target.wants",
            "fy-wall.service")))
        self.assertFalse(os.path.exists("/etc/fy-wall"), "the snippet wrote the real /etc")

    def test_running_it_again_reloads_and_never_removes_a_wall(self):
        """Run again on a running guest, and after a reboot (systemd has
        started the enabled units before the snippet runs): the units are
        active, and each is re-applied by ExecReload, never stopped. The
        control, the snippet with `systemctl restart`, runs ExecStop — the
        `fy-wall remove` that opens the window the storm below measures."""
        ns = n.netns("boot")
        self.assertEqual(self.boot(ns, GUARDED).returncode, 0, self.log)
        for reboot in (False, True):
            with self.subTest(reboot=reboot):
                r = self.boot(ns, GUARDED, reboot=reboot)
                self.assertEqual(r.returncode, 0, r.stderr + self.log)
                if reboot:  # systemd started both, before the snippet
                    self.assertLess(self.calls.index("stub: fy-wall.service ExecStart: "),
                                    self.calls.index("systemctl daemon-reload"))
                after = self.calls[self.calls.index("systemctl daemon-reload"):]
                self.assertIn("stub: fy-wall.service ExecReload: /usr/local/bin/fy-wall apply "
                              "machine --config /etc/fy-wall/fy-wall.toml", after)
                self.assertIn("stub: fy-forwarder-guard.service ExecReload: ", after)
                self.assertNotIn("ExecStop", self.calls)
                self.assertNotIn("ExecStart", after)
                self.assertEqual(self.rig.out("state"),
                                 "wall on 41000-41089,41100-41189 guard\n")
                self.assertIn("table inet fy_wall: PRESENT, as rendered", self.log)
        r = self.boot(ns, GUARDED, snippet=self.rig.restart_snippet)
        self.assertEqual(r.returncode, 0, r.stderr + self.log)
        self.assertIn("stub: fy-wall.service ExecStop: /usr/local/bin/fy-wall remove machine",
                      self.calls)
        self.assertIn("stub: fy-forwarder-guard.service ExecStop: ", self.calls)

    def test_a_bad_value_is_refused_before_anything_changes(self):
        ns = n.netns("boot")
        r = self.boot(ns, "FY_WALL_USER=fywalice FY_WALL_PORTS=41000-41089,41050")
        self.assertNotEqual(r.returncode, 0)
        self.assertIsNone(self.rig.out("state"), "a refused boot must not record a state")
        self.assertIn("ports 41000-41089 and 41050 overlap", self.log)
        self.assertNotIn("fy_wall", n.in_ns(ns, "nft", "list", "tables").stdout)
        self.assertFalse(os.path.exists(os.path.join(self.rig.tmp, "upper", "fy-wall",
                                                     "fy-wall.toml")))

    def test_a_bad_value_on_a_running_guest_leaves_the_wall_as_it_was(self):
        ns = n.netns("boot")
        self.assertEqual(self.boot(ns, GUARDED).returncode, 0, self.log)
        before = n.in_ns(ns, "nft", "-s", "list", "ruleset").stdout
        r = self.boot(ns, "FY_WALL_USER=fywalice FY_WALL_GUARD=1 FY_WALL_PORTS=41000-41089,41050")
        self.assertNotEqual(r.returncode, 0)
        self.assertIsNone(self.rig.out("state"))
        self.assertNotIn("ExecStop", self.calls)
        self.assertEqual(n.in_ns(ns, "nft", "-s", "list", "ruleset").stdout, before)

    def test_the_dns_forwarder_is_provisioned_before_the_wall_and_fails_closed(self):
        """FY_WALL_DNSFWD=1: fy-dnsfwd's config (upstream: resolv.conf's first
        nameserver off loopback), an empty allow file, its unit, started before
        the wall applies its dns_forwarder redirect. A walled uid asking any
        :53 (here 127.0.0.1, where nothing listens) meets fy-dnsfwd, which
        refuses every name: the allow list is empty until the host writes it.
        A bad allow file fails the boot before anything is replaced."""
        import dnsnet as d
        ns = n.netns("boot")
        # A route to the resolv.conf's resolver (fy-dnsfwd connects its upstream at start).
        n.veth(ns, ["192.0.2.1/24"], n.netns("bootdns"), ["192.0.2.53/24"])
        r = self.boot(ns, DNSFWD)
        self.assertEqual(r.returncode, 0, r.stderr + self.log)
        self.assertEqual(self.rig.out("state"), "wall on 41000-41089,41100-41189 dnsfwd guard\n")
        self.assertEqual(self.rig.active_units(),
                         ["fy-dnsfwd.service", "fy-forwarder-guard.service", "fy-wall.service"])
        self.assertLess(self.calls.index("systemctl restart fy-dnsfwd.service"),
                        self.calls.index("systemctl reload-or-restart fy-wall.service"))
        self.assertIn("stub: fy-dnsfwd.service ExecStartPre: /usr/libexec/fy/fy-dnsfwd --check", self.calls)
        up = os.path.join(self.rig.tmp, "upper")
        with open(os.path.join(up, "fy", "dnsfwd.toml")) as f:
            conf = f.read()
        self.assertIn('upstream = ["192.0.2.53"]\n', conf)
        self.assertIn('allow_file = "/etc/fy/dnsfwd-allow.txt"\n', conf)
        self.assertEqual(os.path.getsize(os.path.join(up, "fy", "dnsfwd-allow.txt")), 0)
        with open(os.path.join(up, "fy-wall", "fy-wall.toml")) as f:
            self.assertIn('dns_forwarder = "127.42.0.53"\n', f.read())
        self.assertIn("dnat ip to 127.42.0.53:53",
                      n.in_ns(ns, "nft", "list", "table", "inet", "fy_wall").stdout)
        deadline = time.monotonic() + 10
        while True:
            q = d.dnsprobe(ns, U, "query", "127.0.0.1", "github.com", "--timeout", "2")
            if q.get("rcodes") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        with open(os.path.join(self.rig.tmp, "units-pids", "fy-dnsfwd.service.out")) as f:
            out = f.read()
        # REFUSED by fy-dnsfwd: the empty allow list
        self.assertEqual(q["rcodes"], {"5": 1}, f"{q}\n{out}\n{self.calls}")
        # Run again (a restart, a new daemon), then a bad allow file: refused, the old kept.
        first = self.rig.daemon_pid("fy-dnsfwd.service")
        r = self.boot(ns, DNSFWD)
        self.assertEqual(r.returncode, 0, r.stderr + self.log)
        self.assertNotEqual(self.rig.daemon_pid("fy-dnsfwd.service"), first)
        with open(os.path.join(up, "fy", "dnsfwd-allow.txt"), "w") as f:
            f.write("not a name!\n")
        r = self.boot(ns, DNSFWD)
        self.assertNotEqual(r.returncode, 0)
        self.assertIsNone(self.rig.out("state"))
        self.assertIn("the DNS forwarder's config (upstream 192.0.2.53) is refused", self.log)
        self.assertIn("dnsfwd-allow.txt:1", self.log)
        with open(os.path.join(up, "fy", "dnsfwd.toml")) as f:
            self.assertEqual(f.read(), conf)

    def bridge_boot(self, env):
        """Boots with the DNS forwarder, then binds a bridge namespace with one
        container behind it at podman 5's rootless-netns path, as rootless
        podman does at its first bridge container: inside its pause process's
        mount namespace (a stand-in made from the boot's, where the stub's
        fy-dnsfwd runs), its pid where podman writes it. Returns (ctr ns, the
        bridge ns)."""
        import dnsnet as d
        ns = n.netns("bootbr")
        n.veth(ns, ["192.0.2.1/24"], n.netns("bootbrdns"), ["192.0.2.53/24"])
        br, ctr = n.netns("bootrl"), n.netns("bootrlctr")
        n.veth(ctr, [f"{d.CTR}/24"], br, [f"{d.BRIDGE_GW}/24"])
        n.sh("ip", "-n", ctr, "route", "add", "default", "via", d.BRIDGE_GW)
        # Something living in the bridge namespace, so the boot's mount
        # namespace (its /run a tmpfs of its own) can name it by /proc.
        holder = subprocess.Popen(n.nsexec(br, "sleep", "600"))
        n.on_cleanup(lambda: (holder.kill(), holder.wait()), "the bridge namespace's holder")
        path5 = "/run/user/$(id -u fywalice)/containers/networks/rootless-netns"
        pause_pid = os.path.join(self.rig.tmp, "pause.pid")

        def end_pause():
            try:
                with open(pause_pid) as f:
                    os.kill(int(f.read()), 9)
            except (OSError, ValueError):
                pass
        n.on_cleanup(end_pause, "the pause stand-in")
        then = (f"mkdir -p {path5} /run/user/$(id -u fywalice)/libpod/tmp && "
                f"touch {path5}/rootless-netns && "
                f"{{ unshare -m --propagation private sleep 600 </dev/null >/dev/null 2>&1 & }} && "
                f"pause=$! && echo $pause >{pause_pid} && "
                f"echo $pause >/run/user/$(id -u fywalice)/libpod/tmp/pause.pid && "
                f"until [ \"$(readlink /proc/$pause/ns/mnt)\" != \"$(readlink /proc/self/ns/mnt)\" ]; "
                f"do sleep 0.01; done && "
                f"nsenter -t $pause -m mount --bind /proc/{holder.pid}/ns/net {path5}/rootless-netns")
        r = self.boot(ns, env, then=then)
        self.assertEqual(r.returncode, 0, r.stderr + self.log)
        return ctr, br

    def daemon_out(self):
        with open(os.path.join(self.rig.tmp, "units-pids", "fy-dnsfwd.service.out")) as f:
            return f.read()

    def test_the_dns_forwarder_follows_the_rootless_bridge_namespace_at_both_podman_paths(self):
        """FY_WALL_DNSFWD=1 also writes a listener for the VM user's rootless
        bridge namespace, followed at podman 4's path and podman 5's: a
        container behind a bridge namespace bound at podman 5's path asking
        its gateway's :53 meets fy-dnsfwd (REFUSED: the allow list is empty),
        the redirect installed in that namespace. Control: FY_DNSFWD_BRIDGE=0
        (the snippet as it was) leaves the container's query unanswered and
        no redirect there."""
        import dnsnet as d
        ctr, br = self.bridge_boot(DNSFWD)
        up = os.path.join(self.rig.tmp, "upper")
        with open(os.path.join(up, "fy", "dnsfwd.toml")) as f:
            conf = f.read()
        self.assertIn('name = "bridge"\nfollow = true\n', conf)
        self.assertIn('name = "bridge5"\nfollow = true\n', conf)
        self.assertRegex(conf, r'netns = "/run/user/\d+/netns/rootless-netns-\*"\n'
                               r'mount_ns_pid_file = "/run/user/\d+/libpod/tmp/pause.pid"\n')
        deadline = time.monotonic() + 10
        while "following the namespace" not in self.daemon_out() and time.monotonic() < deadline:
            time.sleep(0.05)
        out = self.daemon_out()
        self.assertRegex(out, r"waiting for the namespace /run/user/\d+/netns/rootless-netns-\*")
        self.assertRegex(out, r"following the namespace /run/user/\d+/containers/networks/"
                              r"rootless-netns/rootless-netns")
        rules = n.in_ns(br, "nft", "list", "table", "ip", "fy_dnsfwd_redirect").stdout
        self.assertIn("udp dport 53 redirect to :5353", rules)
        q = d.dnsprobe(ctr, 0, "query", d.BRIDGE_GW, "github.com", "--timeout", "2")
        self.assertEqual(q.get("rcodes"), {"5": 1}, f"{q}\n{self.daemon_out()}")

    def test_control_without_the_bridge_listener_a_bridge_container_is_not_answered(self):
        import dnsnet as d
        ctr, br = self.bridge_boot(DNSFWD + " FY_DNSFWD_BRIDGE=0")
        up = os.path.join(self.rig.tmp, "upper")
        with open(os.path.join(up, "fy", "dnsfwd.toml")) as f:
            self.assertNotIn("rootless-netns", f.read())
        time.sleep(0.5)  # a followed listener would have opened by now (it polls every 100 ms)
        r = n.in_ns(br, "nft", "list", "table", "ip", "fy_dnsfwd_redirect", check=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        q = d.dnsprobe(ctr, 0, "query", d.BRIDGE_GW, "github.com", "--timeout", "2")
        self.assertFalse(q.get("rcodes"), f"{q}\n{self.daemon_out()}")

    def test_unit_files_verify(self):
        script = f"""
set -e
mount -t tmpfs tmpfs /usr/local/bin
cp {n.FY_WALL} /usr/local/bin/fy-wall
cd {DIST}
for u in fy-wall.service fy-forwarder-guard.service fy-host-wall@.service; do
  case $u in *@.service) systemd-analyze verify --man=no "$PWD/$u" 2>&1 | grep -v '^$' || true ;;
             *) systemd-analyze verify --man=no "$PWD/$u" 2>&1 || true ;;
  esac
done
"""
        r = n.sh("unshare", "-m", "--propagation", "private", "sh", "-c", script,
                 check=False)
        # A template cannot be verified without an instance; the others must be clean.
        complaints = [l for l in (r.stdout + r.stderr).splitlines()
                      if l and "fy-host-wall@" not in l and "Unit name" not in l]
        self.assertEqual(complaints, [])
        for u in ("fy-wall.service", "fy-forwarder-guard.service", "fy-host-wall@.service"):
            with open(os.path.join(DIST, u)) as f:
                text = f.read()
            # reload-or-restart re-applies through ExecReload only if there is one,
            # and it must be the same atomic apply as ExecStart.
            start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
            self.assertEqual(re.search(r"^ExecReload=(.*)$", text, re.M).group(1), start, u)


class BootStorm(StormBase):
    """The boot snippet (machine wall and guard) run again and again on a
    running guest while a walled client hammers destinations both walls
    refuse (public TCP and UDP 443, the gateway's 41095) and the band port
    the guard sends to the forwarder stand-in. Observers at the destinations
    count what arrives; one on the host counts band connections that reached
    it directly (past the guard). Fresh namespaces per class."""

    # The storm lasts at least SECONDS and until MIN_BOOTS re-runs are done,
    # however long each takes on this machine now (209-329 ms idle; several
    # seconds on a loaded 2-core box).
    SECONDS = 6.0
    MIN_BOOTS = 3

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.fwd = n.Server(cls.t.guest, "fwd", "fwd:127.42.0.1:41000")
        n.sh(*n.nsexec(cls.t.host, "nft", "-f", "-"), input=(
            "table inet fyw_obs_guard {\n chain pre {\n"
            "  type filter hook prerouting priority -400; policy accept;\n"
            f"  ip saddr {T.GUEST} tcp dport 41000 counter\n }}\n}}\n"))
        cls.rig = BootRig(cls.ident)

    def direct(self):
        out = n.in_ns(self.t.host, "nft", "list", "table", "inet", "fyw_obs_guard").stdout
        return int(re.search(r"counter packets (\d+)", out).group(1))

    def boot_storm(self, snippet):
        r = self.rig.boot(self.t.guest, GUARDED)  # the first boot: both units start
        self.assertEqual(r.returncode, 0, r.stderr + (self.rig.out("boot.log") or ""))
        base, base_direct = self.observed(), self.direct()
        client = n.spawn(n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                                  "--clear-groups", n.PY, os.path.join(n.HERE, "storm.py"),
                                  "stdin", T.GW, T.PUBLIC),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # The storm is on before the first re-run, however slowly it started.
        self.assertEqual(client.stdout.readline(), "storming\n")
        boots, took = 0, []
        start = time.monotonic()
        while boots < self.MIN_BOOTS or time.monotonic() - start < self.SECONDS:
            t0 = time.monotonic()
            r = self.rig.boot(self.t.guest, GUARDED, snippet=snippet)
            took.append(time.monotonic() - t0)
            self.assertEqual(r.returncode, 0, r.stderr + (self.rig.out("boot.log") or ""))
            boots += 1
        self.window = time.monotonic() - start
        out, _ = client.communicate(input="stop\n", timeout=60)
        counts = json.loads(out)
        calls = self.rig.out("systemctl.log") or ""
        return (counts, boots, self.observed() - base, self.direct() - base_direct, calls,
                sorted(took)[len(took) // 2] if took else 0)



class BootUnderLoad(BootStorm, unittest.TestCase):
    def test_rerunning_the_boot_snippet_never_lets_a_packet_through(self):
        counts, boots, leaked, direct, calls, med = self.boot_storm(None)
        print(f"\nmeasure: boot snippet re-run {boots} times in {self.window:.1f}s "
              f"(median {med * 1000:.0f} ms each), client {counts}, packets past the machine "
              f"wall: {leaked}, walled band packets that reached the host: {direct}", flush=True)
        self.assertGreaterEqual(boots, self.MIN_BOOTS)
        self.assertIn("stub: fy-wall.service ExecReload: ", calls)
        self.assertNotIn("ExecStop", calls)
        for k in ("pub_tcp443", "pub_udp443", "gw_offband"):
            self.assertGreater(counts[k]["attempts"], 100, counts)
            self.assertEqual(counts[k]["ok"], 0, counts)
        self.assertEqual(leaked, 0, "a packet both walls refuse got out")
        self.assertEqual(direct, 0, "a walled band connection reached the host past the guard")
        band = counts["gw_band"]
        self.assertGreater(band["ok"], 100, counts)
        self.assertLessEqual(band["refused"] + band["timeout"] + band["other"],
                             band["attempts"] // 1000, band)


class BootUnderLoadControl(BootStorm, unittest.TestCase):
    """The control, in namespaces of its own: the same storm with the snippet
    as it was, whose `systemctl restart` runs ExecStop (`fy-wall remove`)
    before ExecStart."""

    def test_control_the_snippet_with_restart_lets_packets_through(self):
        counts, boots, leaked, direct, calls, med = self.boot_storm(self.rig.restart_snippet)
        print(f"\nmeasure: boot snippet with `systemctl restart` re-run {boots} times in "
              f"{self.window:.1f}s (median {med * 1000:.0f} ms each), client {counts}, packets "
              f"past the machine wall: {leaked}, walled band packets that reached the host: "
              f"{direct}", flush=True)
        self.assertIn("stub: fy-wall.service ExecStop: ", calls)
        self.assertGreater(leaked + direct, 0,
                           "the observers see nothing even with the wall removed: proof void")


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

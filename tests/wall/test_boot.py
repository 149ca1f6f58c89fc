#!/usr/bin/python3
"""The guest's boot snippet and unit files (wall/dist/), run for real.

The snippet runs as root in a private mount namespace whose /etc is an
overlay (its writes land in a temp dir, never in the machine's /etc), with
fy-wall at /usr/local/bin, inside a test network namespace. There is no
systemd here, so `systemctl` is a stub that records its calls and, for
start/restart, runs the unit's ExecStart line, as systemd would. The unit
files themselves are checked by `systemd-analyze verify`.
"""
import os
import tempfile
import unittest

import fywnet as n

DIST = os.path.join(n.SOURCE, "wall", "dist")

STUB = """#!/bin/sh
echo "systemctl $*" >>/run/fy-wall/systemctl.log
case "$1" in
  start|restart)
    cmd=$(sed -n 's/^ExecStart=//p' "/etc/systemd/system/$2")
    exec sh -c "$cmd" ;;
esac
"""


class Boot(unittest.TestCase):
    def setUp(self):
        self.mark = len(n._undo)
        self.ident = n.Identity()
        self.tmp = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-boot-")
        n.on_cleanup(lambda: n.sh("rm", "-rf", self.tmp), "boot dir")
        for d in ("upper", "work", "stub", "out"):
            os.mkdir(os.path.join(self.tmp, d))
        with open(os.path.join(self.tmp, "stub", "systemctl"), "w") as f:
            f.write(STUB)
        os.chmod(os.path.join(self.tmp, "stub", "systemctl"), 0o755)

    def tearDown(self):
        n.cleanup(self.mark)

    def boot(self, ns, env, then=""):
        t = self.tmp
        script = f"""
set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir={t}/upper,workdir={t}/work /etc
mount --bind {self.ident.passwd} /etc/passwd
echo {n.WALLED_NAME}:{n.SUBUID_START}:{n.SUBUID_COUNT} >/etc/subuid
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /usr/local/bin
cp {n.FY_WALL} /usr/local/bin/fy-wall
mkdir -p /etc/systemd/system
rc=0
env PATH={t}/stub:$PATH {env} FY_WALL_UNITS={DIST} sh {DIST}/guest-boot.sh || rc=$?
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

    def test_the_snippet_installs_applies_and_records_the_wall_and_the_guard(self):
        ns = n.netns("boot")
        r = self.boot(ns, "FY_WALL_USER=fywalice FY_WALL_GUARD=1")
        log = self.out("boot.log") or ""
        self.assertEqual(r.returncode, 0, r.stderr + log)
        self.assertEqual(self.out("state"), "wall on 41000-41089,41100-41189 guard\n")
        self.assertIn("table inet fy_wall: PRESENT, as rendered", log)
        self.assertIn("table ip fy_guard: PRESENT, as rendered", log)
        self.assertIn("policy routes: 4 rule(s)", log)  # the subuid range came from /etc/subuid
        calls = self.out("systemctl.log")
        self.assertIn("systemctl enable fy-wall.service", calls)
        self.assertIn("systemctl restart fy-forwarder-guard.service", calls)
        tables = n.in_ns(ns, "nft", "list", "tables").stdout
        for t in ("table inet fy_wall", "table ip6 fy_wall6", "table ip fy_guard"):
            self.assertIn(t, tables)
        with open(os.path.join(self.tmp, "upper", "fy-wall", "fy-wall.toml")) as f:
            self.assertIn('ports = ["41000-41089", "41100-41189"]', f.read())
        self.assertTrue(os.path.exists(
            os.path.join(self.tmp, "upper", "systemd", "system", "fy-wall.service")))
        self.assertFalse(os.path.exists("/etc/fy-wall"), "the snippet wrote the real /etc")

    def test_a_bad_value_is_refused_before_anything_changes(self):
        ns = n.netns("boot")
        r = self.boot(ns, "FY_WALL_USER=fywalice FY_WALL_PORTS=41000-41089,41050")
        self.assertNotEqual(r.returncode, 0)
        self.assertIsNone(self.out("state"), "a refused boot must not record a state")
        self.assertIn("ports 41000-41089 and 41050 overlap", self.out("boot.log"))
        self.assertNotIn("fy_wall", n.in_ns(ns, "nft", "list", "tables").stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "upper", "fy-wall",
                                                     "fy-wall.toml")))

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


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

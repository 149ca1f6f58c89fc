#!/usr/bin/python3
"""The rendered guest boot script (both postures, from the source tree's unit
files): `bash -n` and Debian's shellcheck pass, it uses only Lima's template
fields ({{.User}}, {{.UID}}), its line 2 carries the provision id, which is
the sha256 prefix of the script with the placeholder still in it, and the id
changes with the port band and with nothing else the renderer is given the
same (re-rendered, it is the same). The forwarder config it writes, expanded
as the guest's bash expands it, serves the whole band the wall admits (the
proxy ports base..base+89 stamped, the minters base+100..base+189 not) and
passes the real `fy-forwarder --check-config` (FY_FORWARDER_BIN: the top
build's; a subproject built alone has none and skips that one check)."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

R = os.environ.get("FY_MACHINE_RENDER_BOOT", "")
ASSETS = os.environ.get("FY_MACHINE_ASSETS", "")
FORWARDER = os.environ.get("FY_FORWARDER_BIN", "")


def render(base, posture=""):
    r = subprocess.run([R, ASSETS, str(base)] + ([posture] if posture else []),
                       capture_output=True, text=True, check=True)
    return r.stdout, r.stderr.strip()


class Boot(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="fym-boot-%d-" % os.getpid())

    def tearDown(self):
        shutil.rmtree(self.d, ignore_errors=True)

    def check_script(self, text, lima_fields=True):
        p = os.path.join(self.d, "boot.sh")
        with open(p, "w") as f:
            f.write(text)
        r = subprocess.run(["bash", "-n", p], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run(["shellcheck", "-s", "bash", "-S", "style", p], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)
        fields = set(re.findall(r"\{\{[^}]*\}\}", text))
        self.assertTrue(fields <= {"{{.User}}", "{{.UID}}"}, fields)
        if lima_fields:
            self.assertIn("{{.User}}", fields)

    def test_both_postures_pass_bash_n_and_shellcheck(self):
        for posture in ("", "gvisor"):
            text, ident = render(41000, posture)
            self.check_script(text)
            lines = text.split("\n")
            self.assertEqual(lines[1], "# fy-provision " + ident)
            lines[1] = "@@ID@@"
            self.assertEqual(hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16], ident)
            # The state file is written last, after every unit is (re)started.
            self.assertGreater(text.rindex("mv /run/fy-wall/state.tmp /run/fy-wall/state"),
                               text.rindex("reload-or-restart"))
        g, _ = render(41000, "gvisor")
        self.assertIn("podman-runsc-filter.service", g)
        # podman >= 5's platform table cannot send an image to crun-wasm
        conf = g.split("<<'__FY_RUNSC_CONF__'", 1)[1].split("__FY_RUNSC_CONF__", 1)[0]
        for plat in ("wasi/wasm", "wasi/wasm32", "wasi/wasm64"):
            self.assertIn('"%s" = "runsc-fy"' % plat, conf.split("[engine.platform_to_oci_runtime]", 1)[1])
        self.assertIn("visudo -cf", g)
        self.assertIn("NOPASSWD:/sbin/shutdown -h now", g)

    def test_the_id_changes_with_the_port_band_and_nothing_else(self):
        a, ia = render(41000)
        b, ib = render(41000)
        self.assertEqual((a, ia), (b, ib))
        c, ic = render(41200)
        self.assertNotEqual(ia, ic)
        # The band is the only difference between the two scripts.
        diff = [(x, y) for x, y in zip(a.split("\n"), c.split("\n")) if x != y]
        for x, y in diff[1:]:
            self.assertTrue("41000" in x or "41100" in x, (x, y))

    def forwarder_toml(self, text, path=None):
        """The forwarder config's heredoc, expanded by bash as the guest does
        (the VM user's uid, its subuid range, the bridge namespace chosen by
        the script's own lines for the `podman` found on `path`)."""
        start = text.index("podman_major=$(podman --version")
        choice = text[start:text.index("\n", text.index("bridge_pause=")) + 1]
        start = "cat >/etc/fy/forwarder.toml.tmp <<__FY_FWD_TOML__\n"
        body = text.split(start, 1)[1].split("\n__FY_FWD_TOML__\n", 1)[0]
        script = ("uid=1000\nwalled='\"1000\", \"100000-165535\"'\n" + choice +
                  "cat <<__FY_FWD_TOML__\n" + body + "\n__FY_FWD_TOML__\n")
        env = dict(os.environ, PATH=path) if path else None
        r = subprocess.run([shutil.which("bash"), "-euc", script], capture_output=True,
                           text=True, check=True, env=env)
        return r.stdout

    def test_the_forwarder_serves_the_whole_band_the_wall_admits(self):
        for base in (41000, 41200):
            text, _ = render(base)
            # What the wall admits, from the same script: base..+89, +100..+189.
            self.assertIn('ports = ["%d-%d", "%d-%d"]' % (base, base + 89, base + 100, base + 189),
                          text)
            toml = self.forwarder_toml(text)
            cfg = tomllib.loads(toml)
            served = {}
            for t in cfg["port"]:
                if "ports" in t:
                    lo, hi = (int(x) for x in t["ports"].split("-"))
                else:
                    lo = hi = t["port"]
                for p in range(lo, hi + 1):
                    self.assertNotIn(p, served, "port %d given twice" % p)
                    served[p] = t.get("stamp", True)
            want = {base + o: True for o in range(90)}
            want.update({base + 100 + o: False for o in range(90)})
            self.assertEqual(served, want, "every worktree offset 0..89: its proxy port stamped, "
                                           "its minter port not")
            self.assertEqual(cfg["vm"]["walled_uids"], ["1000", "100000-165535"])
            if not FORWARDER:
                continue
            self.assertTrue(os.access(FORWARDER, os.X_OK), "FY_FORWARDER_BIN %s is not built"
                            % FORWARDER)
            p = os.path.join(self.d, "forwarder-%d.toml" % base)
            with open(p, "w") as f:
                f.write(toml)
            r = subprocess.run([FORWARDER, "--check-config", "--config", p], capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("is valid", r.stdout)
        if not FORWARDER:
            self.skipTest("FY_FORWARDER_BIN is unset (fy-machine built alone, no fy-forwarder); "
                          "the band was checked, --check-config was not run")

    def test_the_walled_uids_come_from_fy_walls_one_reader(self):
        """Neither the forwarder's walled_uids nor fy-novsock's ranges are read
        with awk: both come from core/subid's reader (`fy-wall render
        principals`, `fy-novsock apply --user`), which takes every line of
        /etc/subuid that newuidmap does (issue 26). The forwarder list is the
        reader's output made TOML strings, every range of it."""
        text, _ = render(41000)
        self.assertNotIn("/etc/subuid", text)
        self.assertIn('walled=$("$wall" render principals --user "$user")', text)
        self.assertIn('apply --user "$user"', text)
        start = text.index('walled=$("$wall" render principals')
        lines = text[start:text.index("\n", text.index("\n", start) + 1) + 1]
        stub = os.path.join(self.d, "fy-wall-stub")
        with open(stub, "w") as f:
            f.write("#!/bin/sh\necho 1000,100000-165535,300000-365535\n")
        os.chmod(stub, 0o755)
        r = subprocess.run([shutil.which("bash"), "-euc",
                            'wall="$1"; user=alice\n' + lines + 'printf "%s" "$walled"', "x", stub],
                           capture_output=True, text=True, check=True)
        self.assertEqual(tomllib.loads("w = [%s]" % r.stdout)["w"],
                         ["1000", "100000-165535", "300000-365535"])

    def test_the_bridge_namespace_is_podmans_own(self):
        """The forwarder follows the rootless bridge namespace where the podman
        installed binds it, looked up in its pause process's mount namespace:
        podman 4's netns/rootless-netns-<hash> (seen in a Debian 12 guest),
        podman 5's containers/networks/rootless-netns/rootless-netns."""
        text, _ = render(41000)
        want = {"podman version 4.3.1": "/run/user/1000/netns/rootless-netns-*",
                "podman version 5.4.2": "/run/user/1000/containers/networks/rootless-netns/"
                                        "rootless-netns",
                "podman version 10.0.0-dev": "/run/user/1000/containers/networks/rootless-netns/"
                                             "rootless-netns",
                # No podman at all: podman 4's (nothing is followed until one is installed
                # and the script runs again).
                None: "/run/user/1000/netns/rootless-netns-*"}
        for version, netns in want.items():
            bindir = os.path.join(self.d, "bin-%s" % (version or "none").replace(" ", "_"))
            os.makedirs(bindir, exist_ok=True)
            for tool in ("sed", "cat"):  # all the lines need, and no other podman
                if not os.path.exists(os.path.join(bindir, tool)):
                    os.symlink(shutil.which(tool), os.path.join(bindir, tool))
            if version:
                with open(os.path.join(bindir, "podman"), "w") as f:
                    f.write("#!/bin/sh\necho '%s'\n" % version)
                os.chmod(os.path.join(bindir, "podman"), 0o755)
            toml = self.forwarder_toml(text, path=bindir)
            cfg = tomllib.loads(toml)
            self.assertEqual(cfg["bridge"]["netns"], netns, version)
            self.assertEqual(cfg["bridge"]["mount_ns_pid_file"],
                             "/run/user/1000/libpod/tmp/pause.pid", version)
            if FORWARDER:
                p = os.path.join(self.d, "fwd-bridge.toml")
                with open(p, "w") as f:
                    f.write(toml)
                c = subprocess.run([FORWARDER, "--check-config", "--config", p],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(c.returncode, 0, c.stderr)

    def test_the_allow_lists_forced_command(self):
        """The forced command of root's allow-list key, alone: bash -n and
        shellcheck; run here against a stand-in fy-dnsfwd and systemctl, it
        installs a good list 0644 and reloads, refuses a bad one (stdin:line,
        exit 3) and an oversized one, and keeps the old list each time."""
        text, _ = render(41000, "dns-install")
        self.check_script(text, lima_fields=False)
        full, _ = render(41000)
        self.assertIn("<<'__FY_DNS_INSTALL__'\n" + text + "__FY_DNS_INSTALL__\n", full)
        self.assertIn("restrict,command=\"/usr/local/libexec/fy-dnsfwd-install\" ssh-ed25519 ", full)
        self.assertIn("PermitRootLogin %s\\n' 'forced-commands-only' >/etc/ssh/sshd_config.d/00-fy-root.conf", full)
        # Run it, its paths moved under the temp dir.
        etc = os.path.join(self.d, "etc")
        os.makedirs(etc)
        dest = os.path.join(etc, "dnsfwd-allow.txt")
        with open(dest, "w") as f:
            f.write("old.example\n")
        bin_ = os.path.join(self.d, "bin")
        os.makedirs(bin_)
        log = os.path.join(self.d, "reloads")
        with open(os.path.join(bin_, "systemctl"), "w") as f:
            f.write("#!/bin/sh\necho \"$*\" >>%s\n" % log)
        # The stand-in checker: one name a line, no spaces (fy-dnsfwd's own reader is
        # the real one's test: wall_dns, and the qemu guest's).
        with open(os.path.join(bin_, "fy-dnsfwd"), "w") as f:
            f.write('#!/bin/sh\n[ "$1" = --check-allow ] || exit 2\n'
                    'bad=$(grep -n " " "$2" | head -1 | cut -d: -f1)\n'
                    'if [ -n "$bad" ]; then echo "✗ $2:$bad: not a name" >&2; exit 3; fi\n'
                    'echo "✓ $2: $(grep -c . "$2") allowed suffix(es)"\n')
        for x in ("systemctl", "fy-dnsfwd"):
            os.chmod(os.path.join(bin_, x), 0o755)
        script = text.replace("dest=/etc/fy/dnsfwd-allow.txt", "dest=" + dest).replace(
            "'/usr/libexec/fy/fy-dnsfwd'", os.path.join(bin_, "fy-dnsfwd"))
        sp = os.path.join(self.d, "install")
        with open(sp, "w") as f:
            f.write(script)
        env = dict(os.environ, PATH=bin_ + ":" + os.environ["PATH"])

        def install(data):
            return subprocess.run(["bash", sp], input=data, capture_output=True, env=env)

        def current():
            with open(dest) as f:
                return f.read()
        r = install(b"github.com\npypi.org\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("✓ installed %s (2 names, was 1)" % dest, r.stdout.decode())
        self.assertEqual(current(), "github.com\npypi.org\n")
        self.assertEqual(os.stat(dest).st_mode & 0o777, 0o644)
        with open(log) as f:
            self.assertEqual(f.read(), "reload-or-restart fy-dnsfwd.service\n")
        r = install(b"github.com\nnot a name\n")
        self.assertEqual(r.returncode, 3)
        self.assertIn("stdin:2:", r.stderr.decode())
        self.assertIn("refused: %s kept (2 names)" % dest, r.stderr.decode())
        self.assertEqual(current(), "github.com\npypi.org\n")
        r = install(b"a.example\n" * (1 << 17))
        self.assertEqual(r.returncode, 3)
        self.assertIn("1 MiB or more", r.stderr.decode())
        self.assertEqual(current(), "github.com\npypi.org\n")
        self.assertEqual(sorted(os.listdir(etc)), ["dnsfwd-allow.txt"], "no temp file left")
        with open(log) as f:
            self.assertEqual(f.read().count("\n"), 1, "a refused list reloads nothing")

    def test_shellcheck_catches_a_broken_script(self):
        # The check can fail: a script with an unquoted expansion does not pass.
        p = os.path.join(self.d, "bad.sh")
        with open(p, "w") as f:
            f.write("#!/bin/bash\nrm -rf $1/x\n")
        r = subprocess.run(["shellcheck", "-s", "bash", p], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    if not os.access(R, os.X_OK):
        print("SKIP: FY_MACHINE_RENDER_BOOT is not built")
        sys.exit(77)
    if not shutil.which("shellcheck"):
        print("SKIP: shellcheck missing (scripts/install-deps installs it)")
        sys.exit(77)
    unittest.main(verbosity=2)

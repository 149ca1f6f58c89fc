#!/usr/bin/env python3
"""fy-machine's qemu backend end to end (MACHINE_BACKEND=qemu): the real
`fy-machine ensure` boots the cached Debian guest (lifecycle/guest) once for
the module, and then, with nothing faked:
  - the guest's libpod socket answers GET /_ping on the host (fy-machine
    socket), and `podman --url` from the host runs its containers;
  - the boot provisioning ran in the guest: the state file, each unit active,
    the machine wall and the guard applied by fy-wall, as `fy-wall status`
    says; ssh-target's pinned config connects with strict host key checking,
    the pin being the host key fy-machine made and gave the guest (not scanned);
  - a process of the walled VM user (uid 1000) reaches a host-side fy-proxy
    only through the provisioned wall, guard and fy-forwarder: its request
    arrives stamped and verified (the key the test gave fy-machine), a walled
    dial to a band port the forwarder does not serve reaches nothing, an
    unstamped dial by root is refused by the proxy, and with the forwarder
    stopped nothing arrives; the same request from a rootless container
    (`podman --url` from the host) arrives stamped;
  - `fy-machine rm` stops qemu and removes the VM and its pin.
Exit 77 (skipped) where qemu or the guest image's tools are missing.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from fytest import Origin, Proxy  # noqa: E402

BUILD = os.environ.get("FY_BUILD_DIR") or os.path.join(ROOT, "build")
FY_MACHINE = os.environ.get("FY_MACHINE_BIN") or os.path.join(
    BUILD, "subprojects", "fy-machine", "fy-machine")
GATEWAY = "10.0.2.100"
# The guest's busybox (1.35, bookworm) wget dies of SIGSEGV whenever it is given
# -T (exit 139, a segfault at address 0 in the kernel log; without -T it works):
# the time limit is timeout(1)'s instead, busybox's own applet in a container.
WGET = "timeout 20 busybox wget -q -O -"


def missing():
    for t in ("qemu-system-x86_64", "qemu-img", "socat", "debootstrap", "mkfs.ext4"):
        if not shutil.which(t):
            return "%s is not installed (qemu-system-x86, qemu-utils, socat, debootstrap)" % t
    if os.geteuid() != 0:
        return "build-image needs root"
    return None


def free_band():
    """A port base whose band's two forwarder ports are free on the host."""
    for _ in range(50):
        # Below the ephemeral range (32768-60999): ssh's and qemu's own
        # connections must not take a port of the band.
        b = random.randrange(20000, 32400, 200)
        try:
            for p in (b, b + 100):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return b
        except OSError:
            continue
    raise RuntimeError("no free port band")


def unix_get(path, target, timeout=30):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n".encode())
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


def rows(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


class QemuMachine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fy15m-", dir="/tmp")
        cls.base = free_band()
        cls.name = "fy15m-%d" % os.getpid()
        cls.repo = os.path.join(cls.tmp, "repo")
        os.makedirs(cls.repo)
        cls.env = dict(os.environ, MACHINE_BACKEND="qemu",
                       FY_MACHINE_STATE_DIR=os.path.join(cls.tmp, "state"),
                       FY_QEMU_HOME=os.path.join(cls.tmp, "qemu"),
                       FY_GUEST_SHARE=BUILD, FY_PORT_BASE=str(cls.base),
                       MACHINE_CPUS="2", MACHINE_MEMORY="2048")
        cls.opts = ["--repo", cls.repo, "--name", cls.name]
        cls.vm_dir = os.path.join(cls.tmp, "qemu", cls.name)
        cls.state_dir = os.path.join(cls.tmp, "state", "qemu-" + cls.name)
        cls.proxy = cls.origin = None
        t0 = time.monotonic()
        try:
            # The host proxy first, so it holds the band's proxy port (where the
            # guest's gateway:port leads), with the stamp key fy-machine then
            # finds and provisions (it makes one only when there is none).
            secret = "%064x" % random.getrandbits(256)
            os.makedirs(cls.state_dir, mode=0o700)
            key = os.path.join(cls.state_dir, "forwarder.key")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, (secret + "\n").encode())
            os.close(fd)
            cls.origin = Origin().__enter__()
            cls.proxy = Proxy(f'mode = "enforce"\nattribution = "require"\n'
                              f'allow = ["127.0.0.1:{cls.origin.port}"]\n',
                              args=["--stamp-key", key], admin=False)
            cls.proxy.cmd[cls.proxy.cmd.index("--listen") + 1] = "127.0.0.1:%d" % cls.base
            cls.proxy.start()
            cls.ensure = cls.fym("ensure", timeout=1800)
            cls.ensure_seconds = time.monotonic() - t0
            if cls.ensure.returncode != 0:
                raise AssertionError("fy-machine ensure failed (%d):\n%s\nconsole:\n%s" % (
                    cls.ensure.returncode, cls.ensure.stderr, cls.console()))
            print("fy-machine ensure (qemu): %.1f s, image included\n%s"
                  % (cls.ensure_seconds, cls.ensure.stderr), file=sys.stderr)
        except BaseException:
            cls.cleanup()
            raise

    @classmethod
    def fym(cls, verb, *args, timeout=300):
        return subprocess.run([FY_MACHINE, verb, *cls.opts, *args], env=cls.env, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)

    @classmethod
    def console(cls):
        try:
            with open(os.path.join(cls.vm_dir, "console.log"), errors="replace") as f:
                return "".join(f.readlines()[-40:])
        except OSError:
            return "(none)"

    @classmethod
    def cleanup(cls):
        # Every step runs whatever the one before raised: the VM must not outlive the test.
        errors = []
        for step in (lambda: cls.proxy and cls.proxy.__exit__(None, None, None),
                     lambda: cls.origin and cls.origin.__exit__(None, None, None),
                     lambda: os.path.isdir(cls.vm_dir) and cls.fym("rm", timeout=120)):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        for f in ("qemu.pid", "fwd.pid"):  # whatever rm could not end
            try:
                with open(os.path.join(cls.vm_dir, f)) as pf:
                    os.kill(int(pf.read()), 9)
            except (OSError, ValueError):
                pass
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if errors:
            raise errors[0]

    @classmethod
    def tearDownClass(cls):
        cls.cleanup()

    def root(self, cmd, check=True, timeout=120, input=None):
        """A command in the guest as root (the image's key; the backend's own known_hosts,
        the host-made key under its alias)."""
        p = subprocess.run(self.root_argv() + [cmd], input=input, capture_output=True,
                           text=True, timeout=timeout)
        if check:
            self.assertEqual(p.returncode, 0, "guest: %r: %s%s" % (cmd, p.stdout, p.stderr))
        return p

    def root_argv(self):
        with open(os.path.join(self.vm_dir, "vm.json")) as f:
            vm = json.load(f)
        with open(os.path.join(self.vm_dir, "ssh.port")) as f:
            port = f.read().strip()
        return ["ssh", "-i", os.path.join(vm["image"], "id_ed25519"), "-p", port,
                "-o", "UserKnownHostsFile=" + os.path.join(self.vm_dir, "known_hosts"),
                "-o", "HostKeyAlias=fy-qemu-" + self.name, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR", "root@127.0.0.1"]

    def podman(self, *args, check=True, timeout=180, input=None):
        """The host's podman client through the socket fy-machine exposes."""
        p = subprocess.run(["podman", "--url", self.sock_uri(), *args], input=input,
                           capture_output=True, timeout=timeout)
        if check:
            self.assertEqual(p.returncode, 0, "podman %s: %s" % (args, p.stderr.decode()[-2000:]))
        return p

    def sock_uri(self):
        r = self.fym("socket")
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_1_socket_answers_on_the_host(self):
        uri = self.sock_uri()
        self.assertEqual(uri, "unix://" + os.path.join(self.vm_dir, "podman.sock"))
        status, body = unix_get(uri[len("unix://"):], "/_ping")
        self.assertIn(b" 200 ", status)
        self.assertEqual(body.strip(), b"OK")
        status, body = unix_get(uri[len("unix://"):], "/v4.0.0/libpod/version")
        self.assertIn(b" 200 ", status)
        rel = self.root("uname -r").stdout.strip()
        self.assertRegex(rel, r"^\d+\.\d+\.\d+-\d+-amd64$")
        self.assertIn(rel.encode(), body, "the socket is the guest's engine")
        st = self.fym("status")
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertIn("answers GET /_ping", st.stderr)
        # The engine is the VM user's, rootless.
        info = json.loads(self.podman("info", "--format", "json").stdout)
        self.assertTrue(info["host"]["security"]["rootless"], "the engine is rootless")

    def test_2_provisioning_applied_in_the_guest(self):
        state = self.root("cat /run/fy-wall/state").stdout.strip()
        self.assertEqual(state, "wall on %d-%d, %d-%d" % (self.base, self.base + 89,
                                                          self.base + 100, self.base + 189))
        act = self.root("systemctl is-active fy-dnsfwd.service fy-wall.service "
                        "fy-forwarder-guard.service fy-forwarder.service").stdout.split()
        self.assertEqual(act, ["active"] * 4)
        self.root("nft list table inet fy_wall >/dev/null && nft list table ip fy_guard >/dev/null")
        self.root("fy-wall status machine --config /etc/fy-wall/fy-wall.toml")
        self.root("fy-wall status guard --config /etc/fy-wall/fy-guard.toml")
        sudo = self.root("cat /etc/sudoers.d/90-cloud-init-users").stdout
        self.assertEqual(sudo, "fy ALL=(ALL) NOPASSWD:/sbin/shutdown -h now\n", "sudo narrowed")
        # ssh-target: pinned at first contact, strict checking, the VM user.
        j = self.target()
        self.assertEqual(j["user"], "fy")
        p = subprocess.run(["ssh", "-F", j["config"], j["host"], "id -u"], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "1000"), p.stderr)
        with open(j["config"]) as f:
            self.assertIn("StrictHostKeyChecking yes", f.read())
        # The pin is the key fy-machine made on the host and gave the guest
        # (never scanned over the network), and the guest's sshd serves it.
        with open(os.path.join(self.vm_dir, "boot", "ssh_host_ed25519_key.pub")) as f:
            made = f.read().split()[:2]
        with open(j["known_hosts"]) as f:
            self.assertEqual([l.split()[1:3] for l in f if l.strip()], [made])
        self.assertEqual(self.root("cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[:2], made)
        self.assertIn("made by the host before the boot (not scanned)", self.ensure.stderr)

    def target(self):
        """ssh-target --json, once (it pins the host-made key; ssh verifies it
        at every connection)."""
        if getattr(type(self), "_target", None) is None:
            r = self.fym("ssh-target", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            type(self)._target = json.loads(r.stdout)
        return type(self)._target

    def walled(self, url, proxy_port):
        """The walled VM user's own process (uid 1000) over ssh-target's pinned config."""
        t = self.target()
        return subprocess.run(["ssh", "-F", t["config"], t["host"],
                               f"http_proxy=http://{GATEWAY}:{proxy_port} {WGET} {url}"], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)

    def test_3_walled_user_reaches_the_proxy_only_through_the_forwarder(self):
        url = f"http://127.0.0.1:{self.origin.port}"
        p = self.walled(url + "/through", self.base)
        self.assertEqual(p.returncode, 0, "stdout %r stderr %r" % (p.stdout[-1000:], p.stderr[-2000:]))
        got = [r for r in self.origin.requests if r["path"] == "/through"]
        self.assertEqual(len(got), 1, "the origin got the walled user's request once")
        self.assertIsNone(self.origin.header(got[0], "Fy-Stamp"), "the stamp never reaches an origin")
        deadline = time.monotonic() + 10
        while not [r for r in rows(self.proxy.netlog) if r.get("path") == "/through"]:
            self.assertLess(time.monotonic(), deadline, "no Network Log row for the request")
            time.sleep(0.2)
        row = [r for r in rows(self.proxy.netlog) if r.get("path") == "/through"][0]
        self.assertNotIn("unattributed", row, "the proxy verified the forwarder's stamp: %r" % row)

        # Root in the guest is not walled: its direct dial has no stamp, and the
        # proxy refuses it.
        before = len(self.origin.requests)
        d = self.root(f"http_proxy=http://{GATEWAY}:{self.base} {WGET} {url}/unstamped", check=False)
        self.assertEqual(d.returncode, 1, "an unstamped request must be refused: %r" % (d,))
        # A band port no host proxy listens on: the guard sends it to the
        # forwarder (which serves the whole band), whose dial finds nothing.
        self.assertNotEqual(self.walled(url + "/unserved", self.base + 1).returncode, 0)
        # The forwarder stopped: nothing of the walled user arrives.
        self.root("systemctl stop fy-forwarder.service")
        try:
            self.assertNotEqual(self.walled(url + "/stopped", self.base).returncode, 0)
        finally:
            self.root("systemctl start fy-forwarder.service")
        self.assertEqual(len(self.origin.requests), before, "nothing else reached the origin")

    def test_3b_container_reaches_the_proxy_through_the_forwarder(self):
        if self.podman("image", "exists", "localhost/bb:1", check=False).returncode != 0:
            # The guest's own busybox-static, tarred there, imported from here.
            tar = subprocess.run(self.root_argv() + [
                "rm -rf /tmp/bb && mkdir -p /tmp/bb/bin && cp /bin/busybox /tmp/bb/bin/ && "
                "for a in sh wget id timeout; do ln -s busybox /tmp/bb/bin/$a; done && tar -C /tmp/bb -c ."],
                capture_output=True, check=True, timeout=120).stdout
            self.podman("import", "-", "localhost/bb:1", input=tar)
        url = f"http://127.0.0.1:{self.origin.port}"
        p = self.podman("run", "--rm", "--network=host", "--cgroups=disabled",
                        "-e", f"http_proxy=http://{GATEWAY}:{self.base}", "localhost/bb:1",
                        "timeout", "20", "wget", "-q", "-O", "-", url + "/container", check=False)
        self.assertEqual(p.returncode, 0, "stdout %r stderr %r" % (p.stdout[-1000:], p.stderr[-2000:]))
        self.assertEqual(len([r for r in self.origin.requests if r["path"] == "/container"]), 1)
        deadline = time.monotonic() + 10
        while not [r for r in rows(self.proxy.netlog) if r.get("path") == "/container"]:
            self.assertLess(time.monotonic(), deadline, "no Network Log row for the container's request")
            time.sleep(0.2)
        row = [r for r in rows(self.proxy.netlog) if r.get("path") == "/container"][0]
        self.assertNotIn("unattributed", row, "the proxy verified the forwarder's stamp: %r" % row)

    def test_3p_walled_user_reaches_an_offset_port_of_the_band(self):
        """A worktree at offset N (1..89) has its own proxy port base+N and minter
        port base+100+N: the wall admits the walled user to both, and the forwarder
        the boot script configured serves them (a stamped request at base+N, an
        unstamped relay at base+100+N), not only the band's first ports."""
        for off in (7, 13, 42, 61):
            try:
                for p in (self.base + off, self.base + 100 + off):
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", p))
                break
            except OSError:
                continue
        else:
            self.skipTest("no offset of the band is free on the host")
        key = os.path.join(self.state_dir, "forwarder.key")
        url = f"http://127.0.0.1:{self.origin.port}"
        proxy = Proxy(f'mode = "enforce"\nattribution = "require"\n'
                      f'allow = ["127.0.0.1:{self.origin.port}"]\n',
                      args=["--stamp-key", key], admin=False)
        proxy.cmd[proxy.cmd.index("--listen") + 1] = "127.0.0.1:%d" % (self.base + off)
        proxy.start()
        minter = Origin(port=self.base + 100 + off).__enter__()
        try:
            path = "/offset-%d" % off
            p = self.walled(url + path, self.base + off)
            self.assertEqual(p.returncode, 0, "stdout %r stderr %r" % (p.stdout[-1000:], p.stderr[-2000:]))
            got = [r for r in self.origin.requests if r["path"] == path]
            self.assertEqual(len(got), 1, "the origin got the offset port's request once")
            self.assertIsNone(self.origin.header(got[0], "Fy-Stamp"))
            deadline = time.monotonic() + 10
            while not [r for r in rows(proxy.netlog) if r.get("path") == path]:
                self.assertLess(time.monotonic(), deadline, "no Network Log row at base+%d" % off)
                time.sleep(0.2)
            row = [r for r in rows(proxy.netlog) if r.get("path") == path][0]
            self.assertNotIn("unattributed", row, "stamped and verified at base+%d: %r" % (off, row))
            self.assertFalse([r for r in rows(self.proxy.netlog) if r.get("path") == path],
                             "it reached its own port's proxy, not the band's first")
            # The minter port: relayed as it was sent, no stamp added.
            t = self.target()
            m = subprocess.run(["ssh", "-F", t["config"], t["host"],
                                f"{WGET} http://{GATEWAY}:{self.base + 100 + off}/token-{off}"],
                               capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            self.assertEqual(m.returncode, 0, "stdout %r stderr %r" % (m.stdout[-1000:], m.stderr[-2000:]))
            tok = [r for r in minter.requests if r["path"] == "/token-%d" % off]
            self.assertEqual(len(tok), 1, minter.requests)
            self.assertIsNone(minter.header(tok[0], "Fy-Stamp"), "a minter port is never stamped")
        finally:
            minter.__exit__(None, None, None)
            proxy.__exit__(None, None, None)

    def test_4_rm_tears_it_down(self):
        with open(os.path.join(self.vm_dir, "qemu.pid")) as f:
            pid = int(f.read())
        r = self.fym("rm", timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(self.vm_dir), "the VM's folder (its disk) is gone")
        self.assertFalse(os.path.exists(self.state_dir), "the pin is gone")
        deadline = time.monotonic() + 10
        while os.path.exists("/proc/%d" % pid):
            self.assertLess(time.monotonic(), deadline, "qemu outlived fy-machine rm")
            time.sleep(0.1)
        self.assertEqual(self.fym("status").returncode, 1)


if __name__ == "__main__":
    why = missing()
    if why:
        print("SKIP: " + why, file=sys.stderr)
        sys.exit(77)
    unittest.main(verbosity=2)

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
# fy-forwarder's status line in the guest, from its control socket.
CONTROL_STATUS = ("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                  "s.settimeout(5); s.connect('/run/fy-forwarder/control.sock'); "
                  "s.sendall(b'status\\n'); print(s.recv(65536).decode())\"")


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

    # ---- the DNS allow list, host -> guest (fy-machine dns-allow) ----------

    def dns_upstream(self):
        """fy-dnsfwd's upstream in the guest (what the boot provisioning wrote:
        resolv.conf's nameserver, else lima's 192.168.5.3) answered by the
        authoritative stand-in (tests/wall/dnsserve.py auth), run by root on
        that address on the guest's loopback: restrict=on leaves the guest no
        resolver of its own. Started once; its queries are logged to
        /opt/fy18a/auth.jsonl. Also ships dnsprobe.py for the walled user."""
        if getattr(type(self), "_upstream", None):
            return type(self)._upstream
        conf = self.root("cat /etc/fy/dnsfwd.toml").stdout
        up = [l.split('"')[1] for l in conf.splitlines() if l.startswith("upstream")][0]
        up = up.split(":")[0]
        self.root("install -d -m0755 /opt/fy18a")
        for f in ("dnsserve.py", "dnsprobe.py"):
            with open(os.path.join(ROOT, "tests", "wall", f)) as src:
                self.root("cat >/opt/fy18a/%s && chmod 0755 /opt/fy18a/%s" % (f, f), input=src.read())
        self.root("ip addr add %s/32 dev lo 2>/dev/null; ip addr show dev lo | grep -q ' %s/'" % (up, up))
        self.root("setsid python3 /opt/fy18a/dnsserve.py auth %s </dev/null >/opt/fy18a/auth.jsonl "
                  "2>/opt/fy18a/auth.err & i=0; until grep -q READY /opt/fy18a/auth.jsonl; do "
                  "i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done" % up)
        type(self)._upstream = up
        return up

    def walled_query(self, name, want=None):
        """The walled VM user's A query for `name` to the guest's resolver
        address (the wall redirects it to fy-dnsfwd): its rcode. With `want`,
        asked again for up to 10 s until it is that (a SIGHUP reload is
        asynchronous)."""
        up = self.dns_upstream()
        t = self.target()
        deadline = time.monotonic() + 10
        while True:
            p = subprocess.run(["ssh", "-F", t["config"], t["host"],
                                "python3 /opt/fy18a/dnsprobe.py query %s %s --timeout 3" % (up, name)],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            self.assertEqual(p.returncode, 0, p.stderr)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rc = int(next(iter(r["rcodes"]))) if r["rcodes"] else None  # {"5": 1}
            if want is None or rc == want or time.monotonic() > deadline:
                return rc
            time.sleep(0.5)

    def allow_list(self):
        return self.root("cat /etc/fy/dnsfwd-allow.txt").stdout

    def policy(self, name, text):
        p = os.path.join(self.tmp, name)  # outside the repo and the worktrees: not mounted
        with open(p, "w") as f:
            f.write(text)
        return p

    def test_3c_dns_allow_sends_the_policys_names_and_only_they_resolve(self):
        # As provisioned: an empty list, every name REFUSED.
        self.assertEqual(self.walled_query("allowed.example"), 5, "REFUSED before the list is sent")
        pol = self.policy("policy-a.toml", 'mode = "enforce"\nallow = ["allowed.example:443"]\n')
        r = self.fym("dns-allow", pol)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("✓ installed /etc/fy/dnsfwd-allow.txt (1 names, was 0)", r.stderr)
        self.assertIn("allowed.example\n", self.allow_list())
        self.assertEqual(self.root("stat -c '%U:%G %a' /etc/fy/dnsfwd-allow.txt").stdout.strip(),
                         "root:root 644")
        # Forwarded: the upstream stand-in answers (NOERROR) and saw it; another name is not.
        self.assertEqual(self.walled_query("allowed.example", want=0), 0)
        self.assertEqual(self.walled_query("www.allowed.example"), 0, "a suffix allows the names below it")
        self.assertEqual(self.walled_query("other.example"), 5, "a name outside the policy is REFUSED")
        seen = [json.loads(l)["name"] for l in
                self.root("cat /opt/fy18a/auth.jsonl").stdout.splitlines() if l.startswith("{")]
        self.assertIn("allowed.example", seen)
        self.assertNotIn("other.example", seen, "a REFUSED name never goes upstream")
        # ensure sends the configured policy's list itself, after the boot checks.
        pol_b = self.policy("policy-b.toml", 'mode = "enforce"\nallow = ["allowed.example", "*.second.example"]\n')
        e = subprocess.run([FY_MACHINE, "ensure", *self.opts], text=True, capture_output=True, timeout=600,
                           stdin=subprocess.DEVNULL, env=dict(self.env, FY_MACHINE_DNS_POLICY=pol_b))
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertIn("✓ installed /etc/fy/dnsfwd-allow.txt (2 names, was 1)", e.stderr)
        self.assertEqual(self.walled_query("x.second.example", want=0), 0)

    def test_3d_the_walled_user_cannot_write_the_list_or_use_roots_channel(self):
        self.dns_upstream()
        t = self.target()

        def walled(cmd):
            return subprocess.run(["ssh", "-F", t["config"], t["host"], cmd], capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL)
        before = self.allow_list()
        self.assertTrue(before.strip(), "test_3c sent a list")
        # The file, the forced command, root's keys: not the walled user's to write or read.
        p = walled("echo evil.example >>/etc/fy/dnsfwd-allow.txt")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Permission denied", p.stderr)
        for f in ("/usr/local/libexec/fy-dnsfwd-install", "/root/.ssh/authorized_keys", "/etc/fy"):
            self.assertNotEqual(walled("test -w %s" % f).returncode, 0, f)
        self.assertNotEqual(walled("cat /root/.ssh/authorized_keys").returncode, 0)
        # Running the install itself, or through sudo (narrowed to shutdown), changes nothing.
        p = walled("echo evil.example | /usr/local/libexec/fy-dnsfwd-install")
        self.assertNotEqual(p.returncode, 0, p.stdout)
        p = walled("echo evil.example | sudo -n /usr/local/libexec/fy-dnsfwd-install")
        self.assertNotEqual(p.returncode, 0, p.stdout)
        # ssh to root from inside the guest, with no key root takes: refused.
        p = walled("ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                   "-o ConnectTimeout=10 root@127.0.0.1 true")
        self.assertEqual(p.returncode, 255, p.stdout)
        self.assertIn("Permission denied", p.stderr)
        self.assertEqual(self.allow_list(), before)
        self.assertEqual(self.walled_query("evil.example"), 5)
        # From the host: another key is refused for root; the channel's key runs
        # the install whatever command is asked (restrict, command=...).
        other = os.path.join(self.tmp, "other_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
        key = os.path.join(self.state_dir, "dns-allow_ed25519")
        self.assertEqual(os.stat(key).st_mode & 0o777, 0o600)
        base = self.root_argv()
        def as_root(k, cmd, data):
            a = ["ssh", "-F", "/dev/null", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-i", k] + \
                base[3:]
            return subprocess.run(a + [cmd], input=data, capture_output=True, text=True, timeout=60)
        p = as_root(other, "id -u", "")
        self.assertEqual(p.returncode, 255, p.stdout)
        p = as_root(key, "cat /etc/shadow; id -u", before)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("✓ installed /etc/fy/dnsfwd-allow.txt"), p.stdout)
        self.assertNotIn("root:", p.stdout)
        # The drop-in is in place, read before the others.
        self.assertEqual(self.root("ls /etc/ssh/sshd_config.d | head -1").stdout.strip(), "00-fy-root.conf")
        line = [l for l in self.root("cat /root/.ssh/authorized_keys").stdout.splitlines()
                if l.endswith(" fy-machine-dns-allow")]
        with open(key + ".pub") as f:
            blob = f.read().split()[1]
        self.assertEqual(line, ['restrict,command="/usr/local/libexec/fy-dnsfwd-install" ssh-ed25519 %s '
                                'fy-machine-dns-allow' % blob])

    def test_3e_a_malformed_list_is_refused_with_where_and_why_and_the_old_kept(self):
        self.dns_upstream()
        before = self.allow_list()
        self.assertIn("allowed.example", before)
        bad = self.policy("bad-allow.txt", "fine.example\nnot a name\n")
        r = self.fym("dns-allow", "--allow-file", bad)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("%s:2: 'not a name' is not a host name suffix" % bad, r.stderr)
        self.assertIn("nothing was installed, its old list is kept", r.stderr)
        self.assertEqual(self.allow_list(), before)
        self.assertEqual(self.walled_query("allowed.example"), 0, "the old list still holds")
        self.assertEqual(self.walled_query("fine.example"), 5)
        # A policy fy-proxy would refuse renders nothing: the proxy's file:line.
        broken = self.policy("broken.toml", 'mode = "enforce"\nallow = [\n')
        r = self.fym("dns-allow", broken)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("fy-dnsfwd-allow refused the policy %s" % broken, r.stderr)
        self.assertIn(broken + ":", r.stderr)
        # A policy in a folder the VM mounts read-write: the walled side could write it.
        inrepo = os.path.join(self.repo, "policy.toml")
        with open(inrepo, "w") as f:
            f.write('mode = "enforce"\nallow = ["evil.example"]\n')
        r = self.fym("dns-allow", inrepo)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("mounts read-write: the walled side could write it", r.stderr)
        self.assertEqual(self.allow_list(), before)

    def test_3g_dns_allow_watch_sends_each_change_of_the_policy(self):
        """`dns-allow POLICY --watch` sends the list, then again at each change
        of the policy (as fy-proxy reloads it): a name added is resolved a
        moment later, a broken edit is refused and the guest keeps its list,
        the fix is sent, and SIGTERM ends the watch (0)."""
        self.dns_upstream()
        pol = self.policy("policy-w.toml", 'mode = "enforce"\nallow = ["allowed.example"]\n')
        w = subprocess.Popen([FY_MACHINE, "dns-allow", *self.opts, pol, "--watch"], env=self.env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
        said = []

        def wait_for(text, timeout=90):
            deadline = time.monotonic() + timeout
            while not any(text in l for l in said):
                self.assertLess(time.monotonic(), deadline, "the watch did not say %r:\n%s"
                                % (text, "".join(said)))
                self.assertIsNone(w.poll(), "the watch ended:\n" + "".join(said))
                said.append(w.stderr.readline())
        try:
            wait_for("▶ watching " + pol)
            self.assertEqual(self.walled_query("watched.example"), 5)
            with open(pol + ".tmp", "w") as f:
                f.write('mode = "enforce"\nallow = ["allowed.example", "watched.example"]\n')
            os.rename(pol + ".tmp", pol)  # as an editor saves it
            wait_for("(2 names, was 1)")
            self.assertEqual(self.walled_query("watched.example", want=0), 0)
            before = self.allow_list()
            with open(pol, "w") as f:
                f.write('mode = "enforce"\nallow = [\n')
            wait_for("fy-dnsfwd-allow refused the policy")
            self.assertEqual(self.allow_list(), before, "a refused edit leaves the guest's list")
            self.assertIsNone(w.poll(), "a refused edit does not end the watch")
            with open(pol, "w") as f:
                f.write('mode = "enforce"\nallow = ["allowed.example"]\n')
            wait_for("(1 names, was 2)")
            self.assertEqual(self.walled_query("watched.example", want=5), 5)
            w.terminate()
            rest = w.communicate(timeout=30)[1]
            self.assertEqual(w.returncode, 0, "".join(said) + rest)
            self.assertIn("the watch on %s ended" % pol, rest)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()

    def test_3f_a_bridge_container_is_judged_in_the_rootless_bridge_namespace(self):
        """A rootless container on podman's bridge network: its egress and its
        DNS are served in the VM user's rootless bridge namespace, which podman
        4 binds as netns/rootless-netns-<hash> inside its pause process's mount
        namespace (never visible in root's). The provisioned forwarder and
        fy-dnsfwd follow it there (mount_ns_pid_file): the Network Log row and
        the DNS log name the container by its bridge address. Before, both
        followed /run/user/<uid>/netns/rootless-netns, which never exists:
        the request left as the VM user's and the query was logged as the
        VM's (tests/forwarder test_follow and tests/wall test_dns have the
        control)."""
        up = self.dns_upstream()
        if self.podman("image", "exists", "localhost/bb:2", check=False).returncode != 0:
            tar = subprocess.run(self.root_argv() + [
                "rm -rf /tmp/bb2 && mkdir -p /tmp/bb2/bin && cp /bin/busybox /tmp/bb2/bin/ && "
                "for a in sh wget sleep timeout nslookup; do ln -s busybox /tmp/bb2/bin/$a; done && "
                "tar -C /tmp/bb2 -c ."], capture_output=True, check=True, timeout=120).stdout
            self.podman("import", "-", "localhost/bb:2", input=tar)
        self.podman("run", "-d", "--name", "fy18br", "--network=bridge", "--cgroups=disabled",
                    "localhost/bb:2", "sleep", "600", timeout=300)
        try:
            ip = self.podman("inspect", "fy18br", "--format",
                             "{{.NetworkSettings.Networks.podman.IPAddress}}").stdout.decode().strip()
            self.assertTrue(ip.startswith("10.88."), ip)
            # Where podman 4 put it: only in the pause process's mount namespace.
            found = self.root("p=$(cat /run/user/1000/libpod/tmp/pause.pid); "
                              "ls /proc/$p/root/run/user/1000/netns/ | grep '^rootless'; "
                              "stat -f -c %T /proc/$p/root/run/user/1000/netns/rootless-netns-*; "
                              "stat -f -c %T /run/user/1000/netns/rootless-netns-*").stdout.split()
            # (its neighbours there are the containers' own, netns-<uuid>)
            self.assertRegex(found[0], r"^rootless-netns-[0-9a-f]{20}$", found)
            self.assertEqual(found[1:], ["nsfs", "tmpfs"], found)
            url = f"http://127.0.0.1:{self.origin.port}/bridge-container"
            deadline = time.monotonic() + 60
            while True:
                p = self.podman("exec", "-e", f"http_proxy=http://{GATEWAY}:{self.base}", "fy18br",
                                "timeout", "20", "wget", "-q", "-O", "-", url, check=False)
                if p.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(1)  # the forwarder polls every 250 ms; no hook in this guest
            self.assertEqual(p.returncode, 0, "stdout %r stderr %r\n%s" % (
                p.stdout[-500:], p.stderr[-1000:],
                self.root("tail -n 20 /run/fy-svc/fy-forwarder.service.log", check=False).stdout))
            deadline = time.monotonic() + 10
            while not [r for r in rows(self.proxy.netlog) if r.get("path") == "/bridge-container"]:
                self.assertLess(time.monotonic(), deadline, "no Network Log row for the request")
                time.sleep(0.2)
            row = [r for r in rows(self.proxy.netlog) if r.get("path") == "/bridge-container"][0]
            self.assertNotIn("unattributed", row, row)
            self.assertEqual(row.get("src", "").rsplit(":", 1)[0], ip,
                             "stamped by the bridge listener with the container's address: %r" % row)
            # Its DNS: a query to the resolver the guest names meets fy-dnsfwd's
            # bridge listener (the redirect in that namespace), and is logged so.
            q = self.podman("exec", "fy18br", "nslookup", "allowed.example", up, check=False)
            log = self.root("cat /run/fy-svc/fy-dnsfwd.service.log").stdout
            lines = [json.loads(l) for l in log.splitlines()
                     if l.startswith("{") and '"allowed.example"' in l]
            mine = [l for l in lines if l.get("src", "").startswith(ip + ":")]
            self.assertTrue(mine, "no fy-dnsfwd line from %s (nslookup: %r)\n%s" % (
                ip, q.stdout[-500:] + q.stderr[-500:], log[-3000:]))
            self.assertEqual({(l["ns"], l["verdict"]) for l in mine}, {("bridge", "forwarded")}, mine)
            # The control, in this guest: the forwarder as provisioned before
            # (the path alone, podman 4's name without its hash) never follows
            # the namespace, and the container's next request is not stamped
            # with its bridge address.
            self.root("cp /etc/fy/forwarder.toml /run/fy18-forwarder.toml && "
                      "sed -i -e 's|^netns = .*|netns = \"/run/user/1000/netns/rootless-netns\"|' "
                      "-e '/^mount_ns_pid_file = /d' /etc/fy/forwarder.toml && "
                      "systemctl restart fy-forwarder.service")
            try:
                time.sleep(3)  # twelve polls
                status = self.root(CONTROL_STATUS).stdout
                self.assertIn("bridge=absent", status)
                self.podman("exec", "-e", f"http_proxy=http://{GATEWAY}:{self.base}", "fy18br",
                            "timeout", "10", "wget", "-q", "-O", "-", url + "-old", check=False)
                old = [r for r in rows(self.proxy.netlog) if r.get("path") == "/bridge-container-old"]
                self.assertFalse([r for r in old if r.get("src", "").rsplit(":", 1)[0] == ip], old)
            finally:
                self.root("mv /run/fy18-forwarder.toml /etc/fy/forwarder.toml && "
                          "systemctl restart fy-forwarder.service")
            deadline = time.monotonic() + 20
            while "bridge=listening" not in self.root(CONTROL_STATUS).stdout:
                self.assertLess(time.monotonic(), deadline, "the provisioned forwarder came back")
                time.sleep(0.5)
        finally:
            self.podman("rm", "-f", "fy18br", check=False, timeout=120)

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

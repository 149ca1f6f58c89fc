#!/usr/bin/env python3
"""The qemu guest (lifecycle/guest): a real Debian 12 guest with Debian's stock
kernel under qemu (KVM or TCG: fyguest.accelerator()), booted from the cached
image, and the egress path through it.

It proves, with nothing faked:
  - the guest boots from the cached image and answers ssh (the boot time is
    printed; the image is built once per change of its inputs);
  - it runs Debian's stock kernel, and offers what this machine's kernel lacks
    (AF_VSOCK, AF_RXRPC, AF_SMC are probed and reported per family);
  - a container made by the guest's podman reaches the host's fy-proxy only
    through fy-forwarder: its request arrives stamped with its own address and
    bridge (verified by the proxy with the shared key, in the Network Log);
    the same container dialling the proxy's address itself is refused by the
    proxy (attribution = "require"); and with the forwarder stopped nothing of
    it reaches the proxy.
The guest reaches nothing but the one guestfwd to the proxy (qemu's user
network with restrict=on).
"""
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, "lifecycle", "guest"))
import fyguest  # noqa: E402
from fytest import Origin, Proxy  # noqa: E402

BUILD = os.environ.get("FY_BUILD_DIR") or os.path.join(ROOT, "build")
PROXY_IN_GUEST = "10.0.2.100"  # the guestfwd's address: qemu connects it to the host proxy
PORT = 8088


def rows(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


class Guest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = fyguest.qemu_missing()
        if why:
            raise unittest.SkipTest(why)
        t0 = time.monotonic()
        cls.image = fyguest.build_image()
        cls.image_seconds = time.monotonic() - t0
        cls.key_hex = secrets.token_hex(32)
        cls.origin = Origin().__enter__()
        cls.tmp = os.path.join("/tmp", "fyguest-test-%d" % os.getpid())
        os.makedirs(cls.tmp, exist_ok=True)
        key_file = os.path.join(cls.tmp, "forwarder.key")
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, (cls.key_hex + "\n").encode())
        os.close(fd)
        cls.proxy = Proxy(f'mode = "enforce"\nattribution = "require"\n'
                          f'allow = ["127.0.0.1:{cls.origin.port}"]\n',
                          args=["--stamp-key", key_file], admin=False).start()
        try:
            cls.guest = fyguest.Guest.boot(cls.image, share=BUILD,
                                           guestfwd={f"{PROXY_IN_GUEST}:{PORT}": cls.proxy.port})
        except BaseException:
            cls.proxy.__exit__(None, None, None)
            cls.origin.__exit__(None, None, None)
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        print("guest: image ready in %.1f s, booted to ssh in %.1f s under %s (%s)"
              % (cls.image_seconds, cls.guest.boot_seconds, *cls.guest.accel), file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        cls.guest.close()
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_debian_stock_kernel_and_families(self):
        rel = self.guest.ssh("uname -r").stdout.strip()
        ver = self.guest.ssh("cat /proc/version").stdout
        self.assertRegex(rel, r"^\d+\.\d+\.\d+-\d+-amd64$", "Debian's stock kernel names itself so")
        self.assertIn("Debian", ver)
        probe = ("import socket\n"
                 "for n, f in (('AF_VSOCK', 40), ('AF_RXRPC', 33), ('AF_SMC', 43)):\n"
                 "    try:\n"
                 "        socket.socket(f, socket.SOCK_STREAM if f != 33 else socket.SOCK_DGRAM).close(); print(n, 'yes')\n"
                 "    except OSError as e:\n"
                 "        print(n, 'no', e.errno)\n")
        out = self.guest.ssh("python3 -", input=probe).stdout
        print("guest kernel %s: %s" % (rel, " ".join(out.split())), file=sys.stderr)
        # The guest's kernel offers vsock (its modules load on demand); this
        # machine's does not. Which families the wall must close is judged there.
        self.assertIn("AF_VSOCK yes", out)

    def test_podman_socket_on_the_host(self):
        """The backend's whole downstream contract: the guest's libpod socket,
        answering on the host (GET /_ping over AF_UNIX, then /version)."""
        self.guest.ssh("test -S /run/podman/podman.sock || { setsid podman system service --time=0 "
                       "unix:///run/podman/podman.sock </dev/null >/run/podman-service.log 2>&1 & "
                       "for i in $(seq 100); do test -S /run/podman/podman.sock && break; sleep 0.2; done; }")
        host_sock = os.path.join(self.tmp, "podman.sock")
        self.guest.forward_socket("/run/podman/podman.sock", host_sock)

        def get(path):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(20)
            s.connect(host_sock)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n".encode())
            buf = b""
            while True:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
            s.close()
            head, _, body = buf.partition(b"\r\n\r\n")
            return head.split(b"\r\n")[0], body

        status, body = get("/_ping")
        self.assertIn(b" 200 ", status)
        self.assertIn(b"OK", body)
        status, body = get("/v4.0.0/libpod/version")
        self.assertIn(b" 200 ", status)
        rel = self.guest.ssh("uname -r").stdout.strip()
        self.assertIn(rel.encode(), body, "the socket is the guest's engine (its kernel)")

    def _container(self, cmd, env=()):
        envs = " ".join("-e %s" % e for e in env)
        return self.guest.ssh("podman run --rm %s localhost/bb:1 %s" % (envs, cmd), check=False,
                              timeout=120)

    def test_container_reaches_the_proxy_only_through_the_forwarder(self):
        g = self.guest
        # A busybox image made in the guest (there is no registry).
        g.ssh("podman image exists localhost/bb:1 || { rm -rf /tmp/bb && mkdir -p /tmp/bb/bin && "
              "cp /bin/busybox /tmp/bb/bin/ && for a in sh wget nc cat; do ln -s busybox /tmp/bb/bin/$a; done && "
              "tar -C /tmp/bb -c . | podman import - localhost/bb:1 >/dev/null; }")
        # The bridge: podman's default network, made by running once.
        self._container("true")
        # Its bridge (cni-podman0 with podman 4.3's CNI backend) and gateway.
        bridge = g.ssh("podman network inspect podman -f '{{.NetworkInterface}}'").stdout.strip()
        gw_ip = g.ssh("podman network inspect podman -f '{{range .Subnets}}{{.Gateway}}{{end}}'"
                      ).stdout.strip()
        self.assertTrue(bridge and gw_ip, "the default network has a bridge and a gateway")
        g.ssh("mkdir -p /etc/fy && umask 077 && cat > /etc/fy/forwarder.key", input=self.key_hex + "\n")
        cfg = (f'key_file = "/etc/fy/forwarder.key"\nstate_dir = "/run/fy-forwarder"\n'
               f'[upstream]\nhost = "{PROXY_IN_GUEST}"\n[[port]]\nport = {PORT}\n'
               f'[bridge]\nnetns = "/proc/1/ns/net"\nlisten = "{gw_ip}"\nredirect = false\n')
        g.ssh("cat > /etc/fy/forwarder.toml", input=cfg)
        g.ssh("/fy/forwarder/fy-forwarder --check-config --config /etc/fy/forwarder.toml")
        g.ssh("setsid /fy/forwarder/fy-forwarder --config /etc/fy/forwarder.toml "
              "</dev/null >/run/fy-forwarder.log 2>&1 & echo $! >/run/fy-forwarder-test.pid")
        try:
            deadline = time.monotonic() + 20
            while g.ssh("/fy/forwarder/fy-forwarder --probe --config /etc/fy/forwarder.toml",
                        check=False).returncode != 0:
                self.assertLess(time.monotonic(), deadline, "the forwarder did not come up in the guest")
                time.sleep(0.3)
            url = f"http://127.0.0.1:{self.origin.port}/from-guest"
            p = self._container(f"wget -q -O - {url}", env=[f"http_proxy=http://{gw_ip}:{PORT}"])
            self.assertEqual(p.returncode, 0, p.stderr)
            got = [r for r in self.origin.requests if r["path"] == "/from-guest"]
            self.assertEqual(len(got), 1, "the origin got the container's request once")
            self.assertIsNone(self.origin.header(got[0], "Fy-Stamp"), "the stamp never reaches an origin")
            deadline = time.monotonic() + 5
            while not [r for r in rows(self.proxy.netlog) if r.get("path") == "/from-guest"]:
                self.assertLess(time.monotonic(), deadline, "no Network Log row for the request")
                time.sleep(0.1)
            row = [r for r in rows(self.proxy.netlog) if r.get("path") == "/from-guest"][0]
            self.assertNotIn("unattributed", row, "the proxy verified the stamp: %r" % row)
            self.assertTrue(str(row.get("src", "")).startswith(gw_ip.rsplit(".", 1)[0] + "."),
                            "stamped with the container's own bridge address: %r" % row)
            self.assertNotEqual(row.get("src"), gw_ip, row)
            self.assertEqual(row.get("net"), bridge, "stamped with its own bridge: %r" % row)

            # The container dialling the proxy's address itself: unstamped, refused.
            before = len(self.origin.requests)
            p = self._container(f"wget -q -O - {url}-direct", env=[f"http_proxy=http://{PROXY_IN_GUEST}:{PORT}"])
            self.assertNotEqual(p.returncode, 0, "an unstamped request must be refused")
            self.assertEqual(len(self.origin.requests), before, "nothing unstamped reached the origin")
        finally:
            g.ssh("kill $(cat /run/fy-forwarder-test.pid); sleep 0.5", check=False)
        # The forwarder stopped: the container's request reaches nothing.
        before = len(self.origin.requests)
        p = self._container(f"wget -q -T 5 -O - {url}-stopped", env=[f"http_proxy=http://{gw_ip}:{PORT}"])
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(len(self.origin.requests), before)


if __name__ == "__main__":
    unittest.main(verbosity=2)

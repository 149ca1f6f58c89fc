#!/usr/bin/python3
"""The socket contract against a real engine: fy-machine's `status` (which
probes `responsive`: AF_UNIX connect, then GET /_ping) and `socket`, with a
real `podman system service` behind the socket the machine reports. Only the
machine's metadata is a stand-in (tests/standin/podman, which names that
socket). A dead socket file (the service killed -9, its file left) and a
wedged listener (accepts, never answers) are both not ready, within the 2 s
probe deadline."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
BIN = os.environ.get("FY_MACHINE_BIN", "")
PODMAN = "/usr/bin/podman"


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


class Socket(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="fym-sock-%d-" % os.getpid())
        self.sock = os.path.join(self.d, "podman.sock")
        self.repo = os.path.join(self.d, "app")
        os.makedirs(self.repo)
        self.procs = []
        json.dump({"machines": {"app": {"state": "running", "socket": self.sock}}},
                  open(os.path.join(self.d, "podman.json"), "w"))

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.d, ignore_errors=True)

    def fy(self, *args):
        env = {"PATH": STANDIN + ":/usr/bin:/bin", "HOME": self.d, "STANDIN_DIR": self.d,
               "MACHINE_BACKEND": "podman", "FY_MACHINE_STATE_DIR": os.path.join(self.d, "st")}
        t0 = time.monotonic()
        r = subprocess.run([BIN] + list(args) + ["--repo", self.repo], env=env,
                           capture_output=True, text=True, timeout=60)
        r.secs = time.monotonic() - t0
        return r

    def start_podman(self):
        # The engine's own storage in the test's dir: nothing of the host's is touched.
        root = os.path.join(self.d, "storage")
        p = subprocess.Popen([PODMAN, "--root", root + "/root", "--runroot", root + "/run",
                              "--tmpdir", root + "/tmp", "system", "service", "--time=0",
                              "unix://" + self.sock],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(p)
        for _ in range(200):
            if os.path.exists(self.sock):
                try:
                    c = socket.socket(socket.AF_UNIX)
                    c.connect(self.sock)
                    c.close()
                    return p
                except OSError:
                    pass
            if p.poll() is not None:
                self.fail("podman system service exited: %s" % p.stderr.read().decode()[-400:])
            time.sleep(0.05)
        self.fail("podman system service did not make its socket")

    def test_real_engine_ready_then_dead_file_not_ready(self):
        p = self.start_podman()
        r = self.fy("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("✓ 'app' is running and its socket answers GET /_ping", r.stderr)
        r = self.fy("socket")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "unix://%s\n" % self.sock)
        # The engine dies hard: its socket file stays, nobody listens.
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.assertTrue(os.path.exists(self.sock))
        r = self.fy("status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is running but its socket is dead: a dead socket file (nobody listening)",
                      r.stderr)
        self.assertIn("run: fy-machine ensure", r.stderr)
        os.unlink(self.sock)
        r = self.fy("status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no socket file at", r.stderr)

    def test_wedged_listener_not_ready_within_the_deadline(self):
        s = socket.socket(socket.AF_UNIX)
        s.bind(self.sock)
        s.listen(8)  # accepted by the kernel, never answered
        try:
            r = self.fy("status")
        finally:
            s.close()
        self.assertEqual(r.returncode, 1)
        self.assertIn("the socket accepts but never answers GET /_ping (a wedged listener)", r.stderr)
        self.assertLess(r.secs, 10)

    def test_an_answer_that_is_not_ping_ok_is_not_ready(self):
        s = socket.socket(socket.AF_UNIX)
        s.bind(self.sock)
        s.listen(8)
        import threading

        def serve():
            c, _ = s.accept()
            c.recv(4096)
            c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
            c.close()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            r = self.fy("status")
        finally:
            s.close()
        self.assertEqual(r.returncode, 1)
        self.assertIn("GET /_ping answered 'HTTP/1.1 500 Internal Server Error', not 200", r.stderr)


if __name__ == "__main__":
    if not os.access(BIN, os.X_OK):
        skip("FY_MACHINE_BIN is not built")
    if not os.access(PODMAN, os.X_OK):
        skip("no real podman at /usr/bin/podman (scripts/install-deps installs it)")
    unittest.main(verbosity=2)

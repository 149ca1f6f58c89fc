#!/usr/bin/env python3
"""Never fail open.

kill -9 the forwarder: every new connection from a container is reset at once
(nothing else listens), an open tunnel is cut, nothing reaches the proxy, and
there is no other way out of the rootless namespace. The liveness probe and the
OCI hook report it. A restart serves again, says loudly that it follows a
crash, and continues the stamp sequence (no stamp is refused as a replay). A
SIGTERM is a clean stop. The systemd unit passes systemd-analyze.
"""

import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import (FORWARDER, GATEWAY, HOOK, ORIGIN, PROXY_PORT, Rig, get)  # noqa: E402
from fyf_topology import source_dir  # noqa: E402

TUNNEL = r"""
import socket, sys, time
s = socket.create_connection((%r, %d), timeout=5)
s.sendall(b"CONNECT %s:80 HTTP/1.1\r\nHost: x\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(4096)
print("open", head.split(b"\r\n")[0].decode(), flush=True)
sys.stdin.readline()  # the test kills the forwarder, then says go
try:
    s.sendall(b"GET /after-kill HTTP/1.1\r\nHost: o\r\n\r\n")
    data = s.recv(4096)
    print("after", "eof" if not data else "data:" + data.decode("latin-1"), flush=True)
except OSError as e:
    print("after", type(e).__name__, flush=True)
""" % (GATEWAY, PROXY_PORT, ORIGIN)


class FailClosed(unittest.TestCase):
    def test_kill9_resets_clients_and_nothing_gets_round(self):
        with Rig("fcl", containers=(("podman1", 2),)) as rig:
            ok = rig.client(0, get("http://%s/before" % ORIGIN))[0]
            self.assertEqual(ok["status"], 200, ok)
            seq_before = rig.proxy_row_for("http://%s/before" % ORIGIN)["stamp"]["seq"]

            tunnel = subprocess.Popen(
                ["ip", "netns", "exec", rig.topo.containers[1][0], "python3", "-c", TUNNEL],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                self.assertIn("200", tunnel.stdout.readline())
                rows_before = len(rig.proxy_rows())

                rig.fwd.kill9()

                tunnel.stdin.write("go\n")
                tunnel.stdin.flush()
                after = tunnel.stdout.readline().split()
                self.assertEqual(after[0], "after")
                self.assertIn(after[1], ("eof", "ConnectionResetError", "BrokenPipeError"),
                              "an open tunnel must be cut when the forwarder dies")
            finally:
                tunnel.kill()
                tunnel.wait(timeout=10)

            for i in range(2):
                results = rig.client(i, get("http://%s/dead" % ORIGIN), count=20, timeout=3)
                for r in results:
                    self.assertFalse(r["ok"], r)
                    self.assertEqual(r["error"], "ECONNREFUSED", r)  # an RST, at once
                    self.assertLess(r["elapsed_ms"], 500, r)
            # No other way out of the rootless namespace: not the gateway's other
            # ports, not the origin, not the VM.
            for target in ("%s:80" % ORIGIN, "%s:22" % GATEWAY, "192.168.5.15:%d" % PROXY_PORT):
                r = rig.client(0, get("http://%s/round" % ORIGIN), connect=target, timeout=2)[0]
                self.assertFalse(r["ok"], (target, r))
                self.assertIn(r["error"], ("ENETUNREACH", "EHOSTUNREACH", "TimeoutError"),
                              (target, r))
            time.sleep(0.3)
            self.assertEqual(len(rig.proxy_rows()), rows_before,
                             "something reached the proxy while the forwarder was dead")
            self.assertFalse([r for r in rig.proxy_rows()
                              if "/dead" in r.get("target", "") or "/round" in r.get("target", "")
                              or "after-kill" in r.get("target", "")])

            # The probe and the hook say so.
            sock = os.path.join(rig.topo.path("state"), "control.sock")
            p = subprocess.run([FORWARDER, "--probe", "--control", sock], capture_output=True,
                               text=True, timeout=10)
            self.assertEqual(p.returncode, 1)
            self.assertTrue(p.stdout.startswith("fail "), p.stdout)
            h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", "300"], input="{}",
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(h.returncode, 1)
            self.assertIn("not listening", h.stderr)
            self.assertIn("container is not started", h.stderr)
            h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", "300", "--on-timeout",
                                "continue"], input="{}", capture_output=True, text=True,
                               timeout=10)
            self.assertEqual(h.returncode, 0)

            # A restart (as systemd's Restart=always would) serves again, loudly.
            fwd = rig.start_forwarder(name="restarted")
            self.assertIn("stopped without a clean shutdown", fwd.log())
            self.assertIn("restarted_after_crash=1", rig.topo.control("status"))
            res = rig.client(0, get("http://%s/after" % ORIGIN))[0]
            self.assertEqual(res["status"], 200, res)
            row = rig.proxy_row_for("http://%s/after" % ORIGIN)
            self.assertEqual(row["stamp_status"], "valid", row)
            self.assertGreater(row["stamp"]["seq"], seq_before)

            # SIGTERM: a clean stop; new connections are reset; the next start is quiet.
            self.assertEqual(fwd.stop(), 0)
            self.assertFalse(os.path.exists(sock))
            self.assertFalse(os.path.exists(os.path.join(rig.topo.path("state"), "pid")))
            r = rig.client(0, get("http://%s/stopped" % ORIGIN), timeout=3)[0]
            self.assertEqual(r.get("error"), "ECONNREFUSED", r)
            fwd = rig.start_forwarder(name="clean")
            self.assertNotIn("without a clean shutdown", fwd.log())

    def test_example_config_and_hook_json_are_valid(self):
        example = os.path.join(source_dir(), "forwarder", "exe", "forwarder.example.toml")
        r = subprocess.run([FORWARDER, "--check-config", "--config", example],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run([FORWARDER, "--check-config", "--config", "/nonexistent/fyf.toml"],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot be read", r.stderr)
        import json
        with open(os.path.join(source_dir(), "forwarder", "exe", "fy-forwarder-hook.json")) as f:
            spec = json.load(f)
        self.assertEqual(spec["stages"], ["prestart"])
        self.assertEqual(spec["hook"]["path"], "/usr/libexec/fy/fy-forwarder-hook")
        self.assertGreater(spec["hook"]["timeout"], 5)  # longer than the hook's own bound

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
    def test_systemd_unit_is_valid(self):
        unit = os.path.join(source_dir(), "forwarder", "exe", "fy-forwarder.service")
        with open(unit) as f:
            text = f.read()
        self.assertIn("Restart=always", text)
        self.assertIn("StartLimitIntervalSec=0", text)
        self.assertIn("Type=notify", text)
        self.assertIn("WatchdogSec=", text)
        tmp = "/tmp/fyf-unit-%d" % os.getpid()
        os.makedirs(tmp, exist_ok=True)
        try:
            copy = os.path.join(tmp, "fy-forwarder.service")
            with open(copy, "w") as f:
                f.write(text.replace("/usr/libexec/fy/fy-forwarder", FORWARDER))
            r = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True,
                               text=True, timeout=60)
            problems = [l for l in (r.stdout + r.stderr).splitlines()
                        if "fy-forwarder.service" in l]
            self.assertEqual(problems, [], r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)

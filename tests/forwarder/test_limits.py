#!/usr/bin/env python3
"""Overload fails closed and loses nothing, with two workers:

  - past [limits] connections, new connections are reset at once (over_limit),
    the held ones are served as usual, and once they go new ones are served;
  - out of file descriptors (the forwarder run with RLIMIT_NOFILE 64): a
    connection that cannot be accepted is accepted with the spare descriptor
    and reset (accept_errors), one accepted without a descriptor left for its
    upstream socket gets a 502 that says why, and where two workers raced for
    the freed slot and one lost its spare, that one's clients wait in the
    backlog while it retries every 50 ms, without spinning; the log says what
    to raise, nothing reaches the proxy, and once descriptors are free again
    the forwarder serves.
"""

import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import FORWARDER, GATEWAY, ORIGIN, PROXY_PORT, Rig, get  # noqa: E402

# Run in a container: holds `hold` connections that send nothing (they wait in
# the head phase), then tries `extra` more, each sending a whole request, and
# reports what each got; waits for a line on stdin before closing the held ones.
HOLDER = r"""
import json, socket, sys
gw, port, hold, extra, req = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
wait = float(sys.argv[6])
held = []
reset = 0
for _ in range(hold):
    try:
        held.append(socket.create_connection((gw, port), timeout=5))
    except ConnectionResetError:
        reset += 1  # past a limit, reset before connect() returned
print("held %d reset %d" % (len(held), reset), flush=True)
sys.stdin.readline()
got = []
for _ in range(extra):
    s = None
    try:
        s = socket.create_connection((gw, port), timeout=wait)
        s.sendall(req.encode())
        data = s.recv(65536)
        got.append("data:" + data.decode("latin-1").split("\r\n", 1)[0] if data else "eof")
    except (ConnectionResetError, BrokenPipeError):
        got.append("reset")
    except socket.timeout:
        got.append("timeout")
    except OSError as e:
        got.append("error:%s" % e)
    if s:
        s.close()
print(json.dumps(got), flush=True)
sys.stdin.readline()
for s in held:
    s.close()
print("closed", flush=True)
"""


class Holder:
    def __init__(self, rig, hold, extra, target, wait=5.0):
        ns = rig.topo.containers[0][0]
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", ns, "python3", "-c", HOLDER, GATEWAY, str(PROXY_PORT),
             str(hold), str(extra), get(target).decode(), str(wait)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        assert line[0] == "held" and int(line[1]) + int(line[3]) == hold, line
        self.held, self.reset_at_connect = int(line[1]), int(line[3])

    def try_extra(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def release(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().startswith("closed")
        self.p.stdin.close()
        self.p.stdout.close()
        self.p.wait(10)


def ubsan_build():
    """True for a forwarder built with UBSan, whose vptr check reads memory it
    has not seen through a pipe it makes for the purpose: out of descriptors it
    cannot, and reports a valid object as one with an invalid vptr."""
    with open(FORWARDER, "rb") as f:
        return b"__ubsan_handle_dynamic_type_cache_miss" in f.read()


def cpu_seconds(pid):
    """utime + stime of every thread of `pid`, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return pred()


class Limits(unittest.TestCase):
    def test_past_the_connection_limit_new_connections_are_reset(self):
        with Rig("lim1", containers=(("podman1", 1),),
                 fwd_kw={"extra": "[limits]\nconnections = 6\nworkers = 2\n"}) as rig:
            t = rig.topo
            target = "http://%s/past-limit" % ORIGIN
            h = Holder(rig, 6, 4, target)
            self.assertTrue(wait_for(lambda: t.stats()["active"] == 6), t.stats())
            got = h.try_extra()
            self.assertEqual(got, ["reset"] * 4, got)
            s = t.stats()
            self.assertEqual(s["over_limit"], 4, s)
            self.assertEqual(s["active"], 6, s)
            self.assertFalse([r for r in rig.proxy_rows() if r.get("target") == target])
            h.release()
            self.assertTrue(wait_for(lambda: t.stats()["active"] == 0), t.stats())
            res = rig.client(0, get(target))[0]
            self.assertEqual(res["status"], 200, res)
            self.assertEqual(rig.proxy_row_for(target)["stamp_status"], "valid")

    @unittest.skipIf(ubsan_build(), "UBSan's vptr check needs a free descriptor (it probes "
                     "memory through a pipe), so out of descriptors it reports false positives; "
                     "the normal and the TSan builds run this")
    def test_out_of_descriptors_connections_are_reset_and_service_resumes(self):
        with Rig("lim2", containers=(("podman1", 1),), forwarder=False) as rig:
            t = rig.topo
            wrapper = t.path("limited-forwarder.sh")
            with open(wrapper, "w") as f:
                f.write('#!/bin/sh\nexec prlimit --nofile=64:64 %s "$@"\n' % FORWARDER)
            os.chmod(wrapper, 0o755)
            # The held connections must outlive the test's slowest run (ASan).
            cfg = t.forwarder_config(rig.key_file, workers=2,
                                     extra="[limits]\nhead_timeout_ms = 120000\n")
            fwd = t.start_forwarder(cfg, name="limited", exe=wrapper)
            pid = fwd.p.pid
            with open("/proc/%d/comm" % pid) as f:
                self.assertEqual(f.read().strip(), "fy-forwarder")
            base = len(os.listdir("/proc/%d/fd" % pid))
            room = 64 - base
            self.assertGreater(room, 4, "the forwarder holds %d descriptors at rest" % base)
            # More than fit: each held connection waits in the head phase on
            # one descriptor; those past the limit are reset as they come.
            target = "http://%s/out-of-fds" % ORIGIN
            # (The control socket is out of descriptors too: libuv accepts and
            # closes its clients, so the probe fails meanwhile. Nothing asks it
            # until descriptors are back.)
            h = Holder(rig, room + 8, 3, target, wait=2.0)
            self.assertTrue(wait_for(lambda: "Too many open files" in fwd.log()), fwd.log())
            got = h.try_extra()
            for g in got:
                self.assertIn(g, ("reset", "data:HTTP/1.1 503 Service Unavailable", "timeout"), got)
            self.assertIn("Too many open files", fwd.log())
            self.assertIn("Raise LimitNOFILE", fwd.log())
            if "data:HTTP/1.1 503 Service Unavailable" in got:
                # Only its upstream socket was missing: the forwarder's own
                # shortage, said as such (not "cannot reach the proxy").
                self.assertIn("cannot make a socket: Too many open files: the forwarder itself "
                              "is short of resources", fwd.log())
            # Still out of descriptors: no worker spins on a failing accept.
            cpu0 = cpu_seconds(pid)
            time.sleep(1.0)
            self.assertLess(cpu_seconds(pid) - cpu0, 0.3)
            self.assertFalse([r for r in rig.proxy_rows() if r.get("target") == target])
            h.release()
            self.assertTrue(wait_for(lambda: t.stats()["active"] == 0), t.stats())
            s = t.stats()
            self.assertGreaterEqual(s["accept_errors"], 1, s)
            self.assertEqual(s["upstream_failed"], 0, s)
            if "data:HTTP/1.1 503 Service Unavailable" in got:
                self.assertGreaterEqual(s["local_failed"], 1, s)
            self.assertGreaterEqual(s["accepted"], room - 8, s)
            # (A client that gave up while waiting in the backlog had sent its
            # whole request; accepted now, it reads as a request and a
            # half-close, and goes on. So a target of its own.)
            after = "http://%s/fds-back" % ORIGIN
            for _ in range(4):
                res = rig.client(0, get(after))[0]
                self.assertEqual(res["status"], 200, res)
            rows = [r for r in rig.proxy_rows() if r.get("target") == after]
            self.assertEqual(len(rows), 4)
            self.assertTrue(all(r["stamp_status"] == "valid" for r in rows), rows)
            self.assertTrue(t.control("status").startswith("ok "))


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""The amendment's upstream behaviour, observed on the wire (tcpdump on the host
side of the VM link) and in the kernel's socket tables (ss):

  - the upstream (proxy) closes first: the forwarder never sends it a FIN; once
    the client is done and every byte is acknowledged it resets, and the proxy's
    side is left with no TIME_WAIT;
  - the client closes first: a FIN goes upstream as before (TIME_WAIT, if any,
    stays in the VM);
  - a connect unanswered for connect_timeout_ms is re-dialled on a new socket (a
    new source port), at most `redials` times, then the client gets a 502.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import GATEWAY, ORIGIN, PROXY_PORT, Rig, get  # noqa: E402
from fyf_topology import VM_ADDR  # noqa: E402

RIG = None
LINE = re.compile(r"^(\d+\.\d+) IP (\S+)\.(\d+) > (\S+)\.(\d+): Flags \[([^\]]*)\]")


def setUpModule():
    global RIG
    RIG = Rig("wire", containers=(("podman1", 1),))
    RIG.__enter__()


def tearDownModule():
    if RIG:
        RIG.__exit__(None, None, None)


class Capture:
    """tcpdump on the host namespace's end of the VM link, port 42600."""

    def __init__(self, name):
        self.path = RIG.topo.path(name + ".pcap")

    def __enter__(self):
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", RIG.topo.host, "tcpdump", "-Z", "root", "--immediate-mode",
             "-i", "eth0", "-nn", "-U", "-w", self.path, "tcp port %d" % PROXY_PORT],
            stderr=subprocess.PIPE, text=True)
        line = self.p.stderr.readline()  # "listening on eth0 ..." once it captures
        assert "listening" in line, line
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)
        self.p.send_signal(signal.SIGINT)
        self.p.wait(timeout=10)
        self.p.stderr.close()
        return False

    def packets(self):
        out = subprocess.run(["tcpdump", "-r", self.path, "-nn", "-tt"], capture_output=True,
                             text=True, timeout=30).stdout
        pk = []
        for line in out.splitlines():
            m = LINE.match(line)
            if m:
                pk.append({"t": float(m[1]), "src": m[2], "sport": int(m[3]), "dst": m[4],
                           "dport": int(m[5]), "flags": m[6]})
        return pk


def forwarder_port(target):
    return int(RIG.proxy_row_for(target)["peer"].rsplit(":", 1)[1])


def time_wait(ns, port):
    r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tanH", "state", "time-wait"],
                       capture_output=True, text=True, timeout=10)
    return [l for l in r.stdout.splitlines() if ":%d " % port in l + " "]


class Wire(unittest.TestCase):
    def restart_forwarder(self, **kw):
        if RIG.fwd:
            RIG.fwd.stop()
        RIG.start_forwarder(name="fwd-%d" % int(time.monotonic() * 1000), **kw)

    def test_upstream_closes_first_gets_rst_never_fin(self):
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://close-first.test/"
        with Capture("close-first") as cap:
            res = RIG.client(0, get(target), until="eof")[0]
            self.assertEqual(res["status"], 200, res)
            self.assertTrue(res.get("eof"), "the client must see the upstream's EOF")
            port = forwarder_port(target)
            time.sleep(0.5)
        mine = [p for p in cap.packets() if p["src"] == VM_ADDR and p["sport"] == port]
        theirs = [p for p in cap.packets() if p["dst"] == VM_ADDR and p["dport"] == port]
        self.assertTrue(mine, "no packets captured for port %d" % port)
        self.assertTrue(any("F" in p["flags"] for p in theirs), "the proxy closed first")
        self.assertFalse([p for p in mine if "F" in p["flags"]], "the forwarder sent a FIN")
        self.assertTrue([p for p in mine if "R" in p["flags"]], "the forwarder sent no RST")
        # The RST comes after the proxy's FIN was acknowledged, not instead of data.
        fin_t = min(p["t"] for p in theirs if "F" in p["flags"])
        rst_t = min(p["t"] for p in mine if "R" in p["flags"])
        self.assertGreater(rst_t, fin_t)
        self.assertEqual(time_wait(RIG.topo.host, port), [], "TIME_WAIT on the host side")
        after = RIG.topo.stats()
        self.assertEqual(after["rst_closes"] - before["rst_closes"], 1)
        self.assertEqual(after["rst_forced"] - before["rst_forced"], 0)

    def test_client_closes_first_gets_fin(self):
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://client-first.test/"
        with Capture("client-first") as cap:
            res = RIG.client(0, get(target), until="length")[0]
            self.assertEqual(res["status"], 200, res)
            port = forwarder_port(target)
            time.sleep(0.5)
        mine = [p for p in cap.packets() if p["src"] == VM_ADDR and p["sport"] == port]
        theirs = [p for p in cap.packets() if p["dst"] == VM_ADDR and p["dport"] == port]
        fins = [p for p in mine if "F" in p["flags"]]
        self.assertTrue(fins, "the client closed first: its FIN must go upstream")
        self.assertFalse([p for p in mine if "R" in p["flags"]], "an RST where a FIN belongs")
        self.assertLess(fins[0]["t"], min(p["t"] for p in theirs if "F" in p["flags"]))
        self.assertEqual(time_wait(RIG.topo.host, port), [])
        after = RIG.topo.stats()
        self.assertEqual(after["fin_closes"] - before["fin_closes"], 1)
        self.assertEqual(after["rst_closes"] - before["rst_closes"], 0)

    def drop_syns(self):
        rules = ("table inet fyf_drop {\n chain in {\n  type filter hook input priority -10;\n"
                 "  tcp dport %d tcp flags & (syn | ack) == syn drop\n }\n}\n" % PROXY_PORT)
        subprocess.run(["ip", "netns", "exec", RIG.topo.host, "nft", "-f", "-"], input=rules,
                       text=True, check=True, timeout=10)

    def allow_syns(self):
        subprocess.run(["ip", "netns", "exec", RIG.topo.host, "nft", "delete", "table", "inet",
                        "fyf_drop"], check=False, timeout=10, capture_output=True)

    def syn_ports(self, cap):
        ports = []
        for p in cap.packets():
            if p["src"] == VM_ADDR and p["flags"] == "S" and p["sport"] not in ports:
                ports.append(p["sport"])
        return ports

    def test_redial_after_2s_on_a_new_socket(self):
        self.restart_forwarder()  # the defaults: 2000 ms, 8 re-dials
        before = RIG.topo.stats()
        self.drop_syns()
        timer = threading.Timer(2.6, self.allow_syns)
        try:
            with Capture("redial") as cap:
                timer.start()
                t0 = time.monotonic()
                res = RIG.client(0, get("http://%s/redial" % ORIGIN), timeout=20)[0]
                elapsed = time.monotonic() - t0
        finally:
            timer.cancel()
            self.allow_syns()
        self.assertEqual(res.get("status"), 200, res)
        self.assertGreater(elapsed, 2.0)
        ports = self.syn_ports(cap)
        self.assertEqual(len(ports), 2, "one re-dial on a new socket: %s" % ports)
        first_syns = [p["t"] for p in cap.packets() if p["sport"] == ports[0] and p["flags"] == "S"]
        second = min(p["t"] for p in cap.packets() if p["sport"] == ports[1])
        self.assertAlmostEqual(second - first_syns[0], 2.0, delta=0.3)
        self.assertEqual(RIG.topo.stats()["redials"] - before["redials"], 1)

    def test_refused_connect_is_not_redialled(self):
        # Nothing listens on the proxy's port for a moment: the RST comes back
        # inside the forwarder's connect() (veth), so this is the early-send
        # path's failure, answered at once with the kernel's reason.
        self.restart_forwarder()
        before = RIG.topo.stats()
        rules = ("table inet fyf_rst {\n chain in {\n  type filter hook input priority -10;\n"
                 "  tcp dport %d tcp flags & (syn | ack) == syn reject with tcp reset\n }\n}\n"
                 % PROXY_PORT)
        subprocess.run(["ip", "netns", "exec", RIG.topo.host, "nft", "-f", "-"], input=rules,
                       text=True, check=True, timeout=10)
        try:
            with Capture("refused") as cap:
                t0 = time.monotonic()
                res = RIG.client(0, get("http://%s/refused" % ORIGIN), timeout=20)[0]
                elapsed = time.monotonic() - t0
        finally:
            subprocess.run(["ip", "netns", "exec", RIG.topo.host, "nft", "delete", "table",
                            "inet", "fyf_rst"], check=False, timeout=10, capture_output=True)
        self.assertEqual(res.get("status"), 502, res)
        self.assertIn("Connection refused", res["response"])
        self.assertIn("Fy-Forwarder-Refusal: upstream", res["response"])
        self.assertEqual(len(self.syn_ports(cap)), 1)  # no re-dial
        self.assertLess(elapsed, 1.0)
        after = RIG.topo.stats()
        self.assertEqual(after["upstream_failed"] - before["upstream_failed"], 1)
        self.assertEqual(after["redials"] - before["redials"], 0)
        # And the next connection, with the port open again, goes through.
        self.assertEqual(RIG.client(0, get("http://%s/after" % ORIGIN))[0].get("status"), 200)

    def test_redials_are_bounded_then_502(self):
        self.restart_forwarder(connect_timeout_ms=300, redials=8)
        self.drop_syns()
        try:
            with Capture("exhaust") as cap:
                t0 = time.monotonic()
                res = RIG.client(0, get("http://%s/never" % ORIGIN), timeout=20)[0]
                elapsed = time.monotonic() - t0
        finally:
            self.allow_syns()
        self.assertEqual(res.get("status"), 502, res)
        self.assertIn("no answer to 9 connection attempts of 300 ms", res["response"])
        self.assertIn("Fy-Forwarder-Refusal: upstream", res["response"])
        self.assertEqual(len(self.syn_ports(cap)), 9)  # the first dial and 8 re-dials
        self.assertGreater(elapsed, 2.6)
        self.assertLess(elapsed, 6.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)

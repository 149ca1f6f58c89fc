#!/usr/bin/env python3
"""The amendment's upstream behaviour, observed on the wire (tcpdump on the host
side of the VM link) and in the kernel's socket tables (ss):

  - the upstream (proxy) closes first: the forwarder never sends it a FIN; once
    the client is done and every byte is acknowledged it resets, and the proxy's
    side is left with no TIME_WAIT — also when both FINs are found at once (the
    forwarder stopped while they arrived, in either order), and when the client
    still uploads after the proxy's FIN (the reset waits for SIOCOUTQ 0: every
    byte arrives, the RST's sequence number is the proxy's last ACK);
  - a client that half-closes straight after its request still gets the answer
    (its FIN follows the head upstream);
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
from fyproc import Lateness  # noqa: E402

RIG = None
LINE = re.compile(r"^(\d+\.\d+) IP (\S+)\.(\d+) > (\S+)\.(\d+): Flags \[([^\]]*)\]"
                  r"(?:, seq (\d+)(?::(\d+))?)?(?:, ack (\d+))?")


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
        out = subprocess.run(["tcpdump", "-r", self.path, "-nn", "-tt", "-S"],
                             capture_output=True, text=True, timeout=30).stdout
        pk = []
        for line in out.splitlines():
            m = LINE.match(line)
            if m:
                # seq: the first sequence number (absolute, -S); seq_end: after the
                # segment's data; ack: the acknowledged sequence number.
                pk.append({"t": float(m[1]), "src": m[2], "sport": int(m[3]), "dst": m[4],
                           "dport": int(m[5]), "flags": m[6],
                           "seq": int(m[7]) if m[7] else None,
                           "seq_end": int(m[8] or m[7]) if m[7] else None,
                           "ack": int(m[9]) if m[9] else None})
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

    def both_fins_at_once(self, client_shut_ms, proxy_close_ms, name):
        """The client half-closes and the proxy answers (Connection: close) and
        closes, both while the forwarder is stopped (SIGSTOP), so that when it
        runs again it finds both FINs waiting. The proxy's came before the
        forwarder sent any: the proxy closed first, whichever EOF is read first."""
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://close-after.test/%d" % proxy_close_ms
        out = {}

        def run_client():
            out["res"] = RIG.client(0, get(target), until="eof",
                                    pre=["--shut-after-ms", str(client_shut_ms)])[0]

        with Capture(name) as cap:
            t = threading.Thread(target=run_client)
            t.start()
            port = forwarder_port(target)  # the head went through
            pid = RIG.fwd.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(max(client_shut_ms, proxy_close_ms) / 1000.0 + 0.8)
                # Both FINs are here and neither has been read: the forwarder's
                # client socket and its upstream socket are both in CLOSE-WAIT.
                up = RIG.topo.nsexec(RIG.topo.vm, "ss", "-tnH", "state", "close-wait",
                                     "( sport = :%d )" % port).stdout
                down = RIG.topo.nsexec(RIG.topo.rl, "ss", "-tnH", "state", "close-wait",
                                       "( sport = :%d )" % PROXY_PORT).stdout
            finally:
                os.kill(pid, signal.SIGCONT)
            t.join(30)
            time.sleep(0.5)
        self.assertTrue(up.strip(), "the proxy's FIN had not arrived while stopped")
        self.assertTrue(down.strip(), "the client's FIN had not arrived while stopped")
        res = out["res"]
        self.assertEqual(res["status"], 200, res)
        self.assertTrue(res.get("eof"), res)
        self.assertTrue(res.get("shut"), res)
        mine = [p for p in cap.packets() if p["src"] == VM_ADDR and p["sport"] == port]
        theirs = [p for p in cap.packets() if p["dst"] == VM_ADDR and p["dport"] == port]
        self.assertTrue(any("F" in p["flags"] for p in theirs), "the proxy closed")
        self.assertFalse([p for p in mine if "F" in p["flags"]],
                         "the forwarder sent a FIN after the proxy's")
        self.assertTrue([p for p in mine if "R" in p["flags"]], "the forwarder sent no RST")
        self.assertEqual(time_wait(RIG.topo.host, port), [], "TIME_WAIT on the host side")
        after = RIG.topo.stats()
        self.assertEqual(after["rst_closes"] - before["rst_closes"], 1)
        self.assertEqual(after["fin_closes"] - before["fin_closes"], 0)
        self.assertEqual(after["aborted"] - before["aborted"], 0)

    def test_both_fins_at_once_client_fin_arrived_first(self):
        # The client's FIN is the first event the forwarder handles: it must not
        # pass it on as a FIN, because the proxy's FIN is already there.
        # (Seconds, not milliseconds: the forwarder must be stopped before the
        # first FIN, however slowly this machine notices the head went by.)
        self.both_fins_at_once(1500, 2500, "both-client-first")

    def test_both_fins_at_once_proxy_fin_arrived_first(self):
        self.both_fins_at_once(2500, 1500, "both-proxy-first")

    def test_upstream_closes_first_rst_waits_for_every_byte_acked(self):
        # The proxy answers and half-closes, then reads nothing for 1 s and then
        # slowly, while the client sends 1 MiB after the proxy's EOF: when the
        # client is done, the forwarder's upstream socket still holds unsent and
        # unacknowledged bytes (SIOCOUTQ > 0), and the RST must wait for them.
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://half-close.test/1000"
        size = 1 << 20
        with Capture("unacked") as cap:
            res = RIG.client(0, get(target), until="eof", timeout=30,
                             pre=["--upload-after-eof", str(size)])[0]
            port = forwarder_port(target)
            deadline = time.monotonic() + 30
            row = None
            while row is None and time.monotonic() < deadline:
                row = next((r for r in RIG.proxy_rows() if r.get("upload_of") == target), None)
                time.sleep(0.05)
            time.sleep(0.3)
        self.assertEqual(res.get("status"), 200, res)
        self.assertTrue(res.get("eof"), res)
        self.assertEqual(res.get("uploaded"), size, res)
        self.assertIsNotNone(row, "the proxy never finished reading the upload")
        # Every byte arrived, and the end was a reset, never our FIN.
        self.assertEqual(row["upload_bytes"], size, row)
        self.assertEqual(row["upload_end"], "reset", row)
        mine = [p for p in cap.packets() if p["src"] == VM_ADDR and p["sport"] == port]
        theirs = [p for p in cap.packets() if p["dst"] == VM_ADDR and p["dport"] == port]
        self.assertFalse([p for p in mine if "F" in p["flags"]], "the forwarder sent a FIN")
        rsts = [p for p in mine if "R" in p["flags"]]
        self.assertTrue(rsts, "the forwarder sent no RST")
        # The RST carries the next sequence number, which the proxy had acknowledged:
        # nothing was outstanding when it went.
        isn = next(p["seq"] for p in mine if p["flags"] == "S")

        def rel(n):  # relative to our SYN, so a wrap of the 32-bit space is no matter
            return (n - isn) % (1 << 32)
        acked = max(rel(p["ack"]) for p in theirs if p["ack"] is not None)
        sent_end = max(rel(p["seq_end"]) for p in mine if p["seq_end"] is not None)
        self.assertEqual(rel(rsts[0]["seq"]), acked, (rsts[0], acked))
        self.assertEqual(sent_end, acked)
        self.assertGreater(acked, size)  # the upload (and the head) were acknowledged
        self.assertGreater(rsts[0]["t"], max(p["t"] for p in theirs))
        self.assertEqual(time_wait(RIG.topo.host, port), [], "TIME_WAIT on the host side")
        after = RIG.topo.stats()
        self.assertEqual(after["rst_closes"] - before["rst_closes"], 1)
        self.assertEqual(after["rst_waited"] - before["rst_waited"], 1,
                         "SIOCOUTQ was 0 already: this did not test the wait")
        self.assertEqual(after["rst_forced"] - before["rst_forced"], 0)

    def test_a_proxy_reset_during_the_rst_wait_ends_it_at_once(self):
        # As above, but the proxy resets instead of reading on: SIOCOUTQ stays
        # where it was (nothing more is acknowledged), so waiting for 0 would
        # last rst_wait_ms and end in a "forced" RST the proxy never needed.
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://reset-after.test/1000"
        # More than the proxy's receive window takes, less than the
        # forwarder's send buffer holds: the client is done long before the
        # reset, with bytes still unacknowledged upstream.
        res = RIG.client(0, get(target), until="eof", timeout=30,
                         pre=["--upload-after-eof", "400000"])[0]
        self.assertEqual(res.get("status"), 200, res)
        deadline = time.monotonic() + 20
        with Lateness() as late:
            while time.monotonic() < deadline and not any(
                    r.get("reset_of") == target for r in RIG.proxy_rows()):
                time.sleep(0.02)
            reset_at = time.monotonic()
            while time.monotonic() < deadline and RIG.topo.stats()["active"] > 0:
                time.sleep(0.02)
            closed_in = time.monotonic() - reset_at
        after = RIG.topo.stats()
        self.assertEqual(after["rst_waited"] - before["rst_waited"], 1,
                         "SIOCOUTQ was 0 already: this did not test the wait")
        self.assertEqual(after["rst_by_upstream"] - before["rst_by_upstream"], 1, after)
        self.assertEqual(after["rst_forced"] - before["rst_forced"], 0, after)
        self.assertEqual(after["active"], 0, after)
        self.assertLess(closed_in, 2.0 + late.max, "lateness %.3f s" % late.max)
        self.assertNotIn("reset anyway", RIG.fwd.log())

    def test_client_half_closes_straight_after_its_request(self):
        # printf ... | nc -N: the head and the client's FIN arrive together (the
        # forwarder is stopped until both wait in the accepted socket, so its
        # first read finds the head and then the EOF). The request goes
        # through, the FIN follows it upstream (the client closed first), and
        # the answer comes back.
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://client-first.test/half"
        out = {}

        def run_client():
            out["res"] = RIG.client(0, get(target), until="eof", pre=["--shut-after-ms", "0"])[0]

        with Capture("half-closed-client") as cap:
            pid = RIG.fwd.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                t = threading.Thread(target=run_client)
                t.start()
                deadline = time.monotonic() + 10
                waiting = ""
                while not waiting.strip() and time.monotonic() < deadline:
                    time.sleep(0.05)
                    waiting = RIG.topo.nsexec(RIG.topo.rl, "ss", "-tnH", "state", "close-wait",
                                              "( sport = :%d )" % PROXY_PORT).stdout
            finally:
                os.kill(pid, signal.SIGCONT)
            self.assertTrue(waiting.strip(), "the client's head and FIN never arrived")
            t.join(30)
            port = forwarder_port(target)
            time.sleep(0.3)
        res = out["res"]
        self.assertEqual(res.get("status"), 200, res)
        self.assertIn("client-first", res["response"])
        mine = [p for p in cap.packets() if p["src"] == VM_ADDR and p["sport"] == port]
        self.assertTrue([p for p in mine if "F" in p["flags"]], "the client's FIN must go upstream")
        after = RIG.topo.stats()
        self.assertEqual(after["head_eof"] - before["head_eof"], 0)
        self.assertEqual(after["fin_closes"] - before["fin_closes"], 1)

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

    def drop_syns(self, first_socket_only=False):
        """Drops the SYNs to the proxy: all of them, or (first_socket_only) every
        SYN of the first socket that dials it (its kernel retransmits too), so
        that a re-dial on a new socket is answered with no timer in the test."""
        if first_socket_only:
            rules = ("table inet fyf_drop {\n"
                     " set first { type inet_service; size 1; flags dynamic; }\n"
                     " chain in {\n  type filter hook input priority -10;\n"
                     "  tcp dport %d tcp flags & (syn | ack) == syn add @first { tcp sport }\n"
                     "  tcp dport %d tcp flags & (syn | ack) == syn tcp sport @first drop\n"
                     " }\n}\n" % (PROXY_PORT, PROXY_PORT))
        else:
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
        # The first socket's SYNs are dropped (its kernel retransmit at 1 s
        # too), the re-dial's are not: no timer in the test decides which
        # dial is answered, whatever the load.
        self.restart_forwarder()  # the defaults: 2000 ms, 8 re-dials
        before = RIG.topo.stats()
        self.drop_syns(first_socket_only=True)
        try:
            with Capture("redial") as cap, Lateness() as late:
                t0 = time.monotonic()
                res = RIG.client(0, get("http://%s/redial" % ORIGIN), timeout=20)[0]
                elapsed = time.monotonic() - t0
        finally:
            self.allow_syns()
        self.assertEqual(res.get("status"), 200, res)
        self.assertGreater(elapsed, 2.0)
        ports = self.syn_ports(cap)
        self.assertEqual(len(ports), 2, "one re-dial on a new socket: %s" % ports)
        first_syns = [p["t"] for p in cap.packets() if p["sport"] == ports[0] and p["flags"] == "S"]
        second = min(p["t"] for p in cap.packets() if p["sport"] == ports[1])
        # 2 s after the first SYN (the capture's clock), give or take 0.3 s, and
        # later by what the load made every process wait for its timers.
        self.assertGreater(second - first_syns[0], 2.0 - 0.3)
        self.assertLess(second - first_syns[0], 2.0 + 0.3 + late.max,
                        "lateness %.3f s" % late.max)
        self.assertEqual(RIG.topo.stats()["redials"] - before["redials"], 1)

    RESET_CLIENT = """
import socket, struct, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(sys.argv[3].encode())
if sys.argv[5] == "shut":
    s.shutdown(socket.SHUT_WR)
time.sleep(float(sys.argv[4]))
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
"""

    def reset_client(self, target, after_s, shut=False):
        """A client that sends a head (and half-closes), waits, then resets."""
        return RIG.topo.run_in_container(
            0, ["python3", "-c", self.RESET_CLIENT, GATEWAY, str(PROXY_PORT),
                get(target).decode(), str(after_s), "shut" if shut else "-"],
            timeout=30, check=True)

    def test_a_client_that_resets_after_finishing_first_is_not_held(self):
        # The client sends its request and half-closes (its FIN goes
        # upstream), then resets while the proxy is still silent. Nothing is
        # read from a client that is done sending, so only its error event
        # tells: both sides go at once, not when the proxy next speaks.
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://close-after.test/6000"
        with Lateness() as late:
            self.reset_client(target, 0.5, shut=True)
            # The client has reset: from here, not from its (loaded) start, the
            # forwarder must let go at once, long before the proxy speaks at 6 s.
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10 and RIG.topo.stats()["active"] > 0:
                time.sleep(0.02)
            held = time.monotonic() - t0
        self.assertLess(held, 3.0 + late.max, "held until the proxy spoke (lateness %.3f s)"
                        % late.max)
        after = RIG.topo.stats()
        self.assertEqual(after["aborted"] - before["aborted"], 1, after)
        self.assertEqual(after["active"], 0, after)

    def test_a_client_that_resets_while_the_proxy_is_dialled_sends_nothing(self):
        # The proxy does not answer the SYN; the client gives up (an RST) before
        # the re-dial, and the proxy answers again just after. The head must
        # not go on alone: a client's retry would run the request twice.
        self.restart_forwarder()
        before = RIG.topo.stats()
        target = "http://%s/gone-while-dialling" % ORIGIN
        self.drop_syns()
        try:
            self.reset_client(target, 0.5)
            # The client has reset (reset_client returned): only now does the
            # proxy answer again, whatever the load did to the client's start,
            # so the first dial's SYN retransmit or a re-dial would find it.
            self.allow_syns()
            time.sleep(2.5)  # past the first re-dial, at 2 s
        finally:
            self.allow_syns()
        after = RIG.topo.stats()
        self.assertEqual(after["client_gone"] - before["client_gone"], 1, after)
        self.assertEqual(after["redials"] - before["redials"], 0, after)
        self.assertEqual(after["active"], 0, after)
        self.assertFalse([r for r in RIG.proxy_rows() if r.get("target") == target])

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
            with Capture("refused") as cap, Lateness() as late:
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
        # Answered at once, not after the 2 s connect timeout (the client's own
        # clock: a loaded machine's process start-up is not in it), later by
        # what the load made every process wait.
        self.assertLess(res["elapsed_ms"], 1500 + 1000 * late.max, (res, late.max))
        self.assertLess(elapsed, 10.0 + late.max)
        after = RIG.topo.stats()
        self.assertEqual(after["upstream_failed"] - before["upstream_failed"], 1)
        self.assertEqual(after["redials"] - before["redials"], 0)
        # And the next connection, with the port open again, goes through.
        self.assertEqual(RIG.client(0, get("http://%s/after" % ORIGIN))[0].get("status"), 200)

    def test_redials_are_bounded_then_502(self):
        self.restart_forwarder(connect_timeout_ms=300, redials=8)
        self.drop_syns()
        try:
            with Capture("exhaust") as cap, Lateness() as late:
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
        # Nine timers of 300 ms one after another, each as late as the load
        # made any.
        self.assertLess(elapsed, 6.0 + 9 * late.max, "lateness %.3f s" % late.max)


if __name__ == "__main__":
    unittest.main(verbosity=2)

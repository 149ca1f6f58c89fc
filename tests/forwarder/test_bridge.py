#!/usr/bin/env python3
"""The bridge listener in a namespace topology (fyf_topology.py), with the
recording proxy stand-in verifying stamps with its own HMAC and with core/stamp.cc.

Proves: each container's requests are attributed to its own address and
network; client-written stamps are stripped (any case, any number); a forged or
replayed stamp is refused by the verifier (recorded unattributed); the origin
never sees a stamp; non-canonical heads get a 400 and never reach the proxy;
Proxy-Authorization passes untouched; CONNECT tunnels, early data, large
bodies and token-service ports work; the probe reports serving.
"""

import hashlib
import os
import socket
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import (FORWARDER, GATEWAY, ORIGIN, PROXY_PORT, TOKEN_PORT, Rig,  # noqa: E402
                      get)

RIG = None


def setUpModule():
    global RIG
    # bulk_pipes = 1: the forwarder-wide cap on grown pipes, met by one download.
    # workers = 3: more workers than this machine may have CPUs, so every test
    # here runs across several loops (their pipe pools share the cap).
    RIG = Rig("brg", containers=(("podman1", 2), ("podman2", 1)),
              fwd_kw={"extra": "[limits]\nbulk_pipes = 1\nworkers = 3\n"})
    RIG.__enter__()


def tearDownModule():
    if RIG:
        RIG.__exit__(None, None, None)


class Bridge(unittest.TestCase):
    def assert_valid_stamp(self, row, src, net):
        self.assertEqual(row["stamp_headers"], 1, row)
        self.assertEqual(row["stamp_status"], "valid", row)
        self.assertEqual(row.get("cpp_status"), "valid", row)
        self.assertNotIn("cpp_mismatch", row)
        self.assertEqual(row["stamp"]["src"], src)
        self.assertEqual(row["stamp"]["net"], net)
        self.assertEqual(row["stamp"]["who"], "")

    def test_each_container_is_attributed_to_its_own_address(self):
        for i, (ns, ip, bridge) in enumerate(RIG.topo.containers):
            target = "http://%s/attr-%d" % (ORIGIN, i)
            res = RIG.client(i, get(target))[0]
            self.assertTrue(res["ok"], res)
            self.assertEqual(res["status"], 200, res)
            self.assertIn("origin ok /attr-%d" % i, res["response"])
            self.assert_valid_stamp(RIG.proxy_row_for(target), ip, bridge)
        # curl, a real client, through the proxy URL the containers are given.
        r = RIG.topo.run_in_container(2, ["curl", "-sS", "-m", "10", "-x", "http://%s:%d" % (
            GATEWAY, PROXY_PORT), "http://%s/curl" % ORIGIN])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "origin ok /curl")
        self.assert_valid_stamp(RIG.proxy_row_for("http://%s/curl" % ORIGIN), "10.89.1.10",
                                "podman2")

    def test_a_renamed_bridge_is_stamped_with_its_new_name(self):
        # net = "auto" names the interface that holds the address the client
        # connected to. The forwarder has seen podman2 already; renamed (as a
        # network re-made under another name on the same subnet would be),
        # the very next connection carries the new name, and the one after
        # the name is given back, the old one. Without the change socket the
        # first name was kept until an address it had never seen.
        i = 2
        _, ip, bridge = RIG.topo.containers[i]

        def fetch(path, net):
            target = "http://%s/%s" % (ORIGIN, path)
            res = RIG.client(i, get(target))[0]
            self.assertTrue(res["ok"], res)
            self.assertEqual(res["status"], 200, res)
            self.assert_valid_stamp(RIG.proxy_row_for(target), ip, net)

        def link(*args, check=True):
            return RIG.topo.nsexec(RIG.topo.rl, "ip", "link", *args, check=check)

        fetch("before-rename", bridge)
        before = RIG.topo.stats()["iface_refreshes"]
        try:
            link("set", "dev", bridge, "down")
            link("set", "dev", bridge, "name", "fyrenamed0")
            link("set", "dev", "fyrenamed0", "up")
            fetch("after-rename", "fyrenamed0")
            # Applied from the kernel's messages, not read again.
            self.assertEqual(RIG.topo.stats()["iface_refreshes"], before)
        finally:
            # Whatever a failure left, the other tests need the bridge back
            # under its own name, up.
            if link("show", "dev", "fyrenamed0", check=False).returncode == 0:
                link("set", "dev", "fyrenamed0", "down", check=False)
                link("set", "dev", "fyrenamed0", "name", bridge)
            link("set", "dev", bridge, "up")
        fetch("renamed-back", bridge)

    def test_link_and_address_changes_are_applied_without_a_reread(self):
        # What a container's start and stop do to the rootless namespace (a
        # veth made, joined to the bridge, brought up and down), a new link
        # with an address, and that link renamed: the forwarder applies the
        # kernel's change messages to its map and dumps it for none of them.
        # A client behind the new link (a namespace of its own, as a container
        # on a new network) is stamped with the link it arrives on, under each
        # of its names, and its source is judged against the link's new
        # address (issue 19: net is the ingress link).
        i = 0
        _, ip, bridge = RIG.topo.containers[i]
        side = RIG.topo.name + "-x"  # fyf-brg-<pid>-x: clean_leftovers knows it

        def fetch(path, src=ip, net=bridge, **kw):
            target = "http://%s/%s" % (ORIGIN, path)
            res = RIG.client(i, get(target), **kw)[0]
            self.assertTrue(res["ok"], res)
            self.assertEqual(res["status"], 200, res)
            self.assert_valid_stamp(RIG.proxy_row_for(target), src, net)

        def ip_cmd(*args, check=True):
            return RIG.topo.nsexec(RIG.topo.rl, "ip", *args, check=check)

        def behind(path, net):
            fetch(path, src="10.77.0.10", net=net, ns=side,
                  connect="10.77.0.1:%d" % PROXY_PORT)

        def clean():
            for link in ("fyvx0", "fyvx1", "fyvx2"):
                ip_cmd("link", "del", link, check=False)
            subprocess.run(["ip", "netns", "del", side], capture_output=True, timeout=30)

        clean()  # left by a killed run
        fetch("reread-0")  # whatever an earlier test changed is applied by now
        before = RIG.topo.stats()["iface_refreshes"]
        try:
            ip_cmd("link", "add", "fyvx0", "type", "veth", "peer", "name", "fyvx3")
            ip_cmd("link", "set", "fyvx0", "master", bridge)
            for state in ("up", "down", "up"):
                ip_cmd("link", "set", "fyvx0", state)
                ip_cmd("link", "set", "fyvx3", state)
            subprocess.run(["ip", "netns", "add", side], check=True, timeout=30)
            ip_cmd("link", "add", "fyvx1", "type", "veth", "peer", "name", "eth0", "netns", side)
            ip_cmd("addr", "add", "10.77.0.1/24", "dev", "fyvx1")
            ip_cmd("link", "set", "fyvx1", "up")
            for args in (("link", "set", "lo", "up"), ("addr", "add", "10.77.0.10/24", "dev",
                                                       "eth0"), ("link", "set", "eth0", "up")):
                RIG.topo.nsexec(side, "ip", *args)
            behind("reread-1", "fyvx1")
            for args in (("down",), ("name", "fyvx2"), ("up",)):
                ip_cmd("link", "set", "dev", "fyvx2" if args[0] == "up" else "fyvx1", *args)
            behind("reread-2", "fyvx2")
            fetch("reread-3")
            self.assertEqual(RIG.topo.stats()["iface_refreshes"], before)
        finally:
            clean()
        # The links gone: nothing to re-read (the map is by link, and a link
        # takes its addresses with it).
        fetch("reread-4")
        self.assertLessEqual(RIG.topo.stats()["iface_refreshes"], before + 1)

    def test_client_written_stamps_are_stripped(self):
        # A real stamp taken from an earlier connection, plus junk, in every case.
        RIG.client(0, get("http://%s/donor" % ORIGIN))
        donor = RIG.proxy_row_for("http://%s/donor" % ORIGIN)["stamp_raw"]
        before = RIG.topo.stats()["stamps_stripped"]
        target = "http://%s/stripped" % ORIGIN
        req = get(target, ["Fy-Stamp: " + donor, "fy-stamp: v=1;src=10.89.0.99;net=x",
                           "FY-STAMP: " + donor, "Accept: */*", "fY-sTaMp:" + donor])
        res = RIG.client(1, req)[0]
        self.assertEqual(res["status"], 200, res)
        row = RIG.proxy_row_for(target)
        self.assert_valid_stamp(row, "10.89.0.11", "podman1")
        self.assertNotEqual(row["stamp_raw"], donor)
        self.assertEqual([n for n in row["header_names"] if n.lower() == "fy-stamp"],
                         ["Fy-Stamp"])
        self.assertIn("Accept", row["header_names"])
        self.assertEqual(RIG.topo.stats()["stamps_stripped"] - before, 4)

    def test_a_head_that_arrives_in_pieces_is_read_whole_and_stamped_once(self):
        # Each piece its own segment, 50 ms apart: a short read is not the end
        # of a head, and every later piece must wake the forwarder (a stall
        # here ends in the 408 of the head timeout). Cuts inside the request
        # line, inside a client-written stamp line and between the CR and LF
        # of the blank line.
        target = "http://%s/pieces" % ORIGIN
        req = get(target, ["Fy-Stamp: v=1;src=10.89.0.99;net=x", "Accept: */*"])
        cuts = sorted({3, req.index(b"Fy-Stamp") + 12, req.index(b"\r\n\r\n") + 3})
        res = RIG.client(0, req, pre=["--cuts", ",".join(map(str, cuts)), "--gap-ms", "50"])[0]
        self.assertTrue(res["ok"], res)
        self.assertEqual(res["status"], 200, res)
        self.assertGreaterEqual(res["elapsed_ms"], len(cuts) * 50 * 0.9, "the pieces were not sent apart")
        row = RIG.proxy_row_for(target)
        self.assert_valid_stamp(row, "10.89.0.10", "podman1")
        self.assertEqual(row["header_names"], ["Host", "Accept", "Fy-Stamp"])

    def test_forged_and_replayed_stamps_are_refused_by_the_verifier(self):
        # Straight to the proxy from the VM namespace, as something that got round
        # the forwarder would: the verifier must not believe it.
        RIG.client(0, get("http://%s/replay-donor" % ORIGIN))
        donor = RIG.proxy_row_for("http://%s/replay-donor" % ORIGIN)["stamp_raw"]
        import fyf_stamp
        forged = fyf_stamp.format_stamp(os.urandom(32), "10.89.0.10", "podman1", 10 ** 9,
                                        donor.split("boot=")[1][:36])
        cases = {
            "replayed": donor,
            "forged": forged,
            "edited": donor.replace("src=10.89.0.10", "src=10.89.0.11"),
        }
        for name, value in cases.items():
            target = "http://%s/direct-%s" % (ORIGIN, name)
            res = RIG.client(0, get(target, ["Fy-Stamp: " + value]), ns=RIG.topo.vm)[0]
            self.assertEqual(res["status"], 200, res)  # served, but unattributed
            row = RIG.proxy_row_for(target)
            self.assertNotIn("stamp", row)
            self.assertNotIn("cpp_mismatch", row)
            if name == "replayed":
                self.assertEqual(row["stamp_status"], "replayed")
                self.assertEqual(row["cpp_status"], "replayed")
            else:
                self.assertTrue(row["stamp_status"].startswith("invalid: mac"), row)
                self.assertTrue(row["cpp_status"].startswith("invalid: stamp refused: mac"), row)

    def test_the_origin_never_sees_a_stamp(self):
        RIG.client(0, get("http://%s/o1" % ORIGIN, ["Fy-Stamp: mine"]))
        RIG.client(2, get("http://%s/o2" % ORIGIN))
        rows = RIG.wait_rows(RIG.origin_log, 2)
        self.assertGreaterEqual(len(rows), 2)
        for r in rows:
            for name in r["header_names"]:
                self.assertNotEqual(name.lower(), "fy-stamp", r)
            for h in r["headers"]:
                self.assertNotIn("mac=", h, r)

    def test_non_canonical_heads_are_refused(self):
        t = "http://%s/nc" % ORIGIN
        cases = [
            ("bare_lf", ("GET %s HTTP/1.1\nHost: x\n\n" % t).encode()),
            ("method_case", ("get %s HTTP/1.1\r\nHost: x\r\n\r\n" % t).encode()),
            ("request_line", ("GET  %s HTTP/1.1\r\nHost: x\r\n\r\n" % t).encode()),
            ("obs_fold", ("GET %s HTTP/1.1\r\nA: b\r\n c\r\n\r\n" % t).encode()),
            ("target_form", b"GET /nc HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("header_name", ("GET %s HTTP/1.1\r\nFy-Stamp : x\r\n\r\n" % t).encode()),
            ("bare_cr", ("GET %s HTTP/1.1\r\nA: b\rc\r\n\r\n" % t).encode()),
            ("version", ("GET %s HTTP/2.0\r\n\r\n" % t).encode()),
            ("leading_empty", ("\r\nGET %s HTTP/1.1\r\n\r\n" % t).encode()),
            ("too_large", ("GET %s HTTP/1.1\r\nX: %s\r\n\r\n" % (t, "a" * 20000)).encode()),
        ]
        before_rows = len(RIG.proxy_rows())
        before = RIG.topo.stats()
        for name, data in cases:
            with self.subTest(name=name):
                res = RIG.client(0, data)[0]
                self.assertTrue(res["ok"], res)
                self.assertEqual(res.get("status"), 400, res)
                self.assertIn("Fy-Forwarder-Refusal: %s\r\n" % name, res["response"])
                self.assertIn("fy-forwarder refused this request", res["response"])
        after = RIG.topo.stats()
        self.assertEqual(after["refused_head"] - before["refused_head"], len(cases))
        for name, _ in cases:
            self.assertEqual(after["refused_" + name] - before["refused_" + name], 1, name)
        self.assertEqual(len(RIG.proxy_rows()), before_rows, "a refused head reached the proxy")

    def test_proxy_authorization_passes_untouched(self):
        auth = "Basic Znktdm9pbGQ6czNjcmV0IHdpdGggc3BhY2Vz=="
        target = "%s:80" % ORIGIN
        req = ("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n" % (
            target, target, auth)).encode()
        res = RIG.client(0, req + b"GET /in-tunnel HTTP/1.1\r\nHost: o\r\nConnection: close\r\n"
                         b"\r\n", until="eof", timeout=5)[0]
        self.assertIn("200 Connection established", res.get("response", ""), res)
        self.assertIn("origin ok /in-tunnel", res["response"])
        row = RIG.proxy_row_for(target)
        self.assertEqual(row["proxy_authorization"], auth)
        self.assertEqual(row["method"], "CONNECT")
        self.assert_valid_stamp(row, "10.89.0.10", "podman1")

    def test_large_download_is_relayed_intact(self):
        res = RIG.client(1, get("http://%s/big/%d" % (ORIGIN, 24 << 20)), timeout=60)[0]
        self.assertTrue(res["ok"], res)
        self.assertEqual(res["bytes"] - res["response"].index("\r\n\r\n") - 4, 24 << 20)

    def test_a_budgeted_pump_yields_and_resumes_intact(self):
        # [limits] pump_budget_kib: a wake-up reads at most this much from a
        # side, then lets the loop's other work run and resumes on its next
        # turn (no edge comes for what is already there). With 64 KiB a 24 MiB
        # download yields many times, and arrives whole, while other
        # connections on the same workers are served.
        RIG.fwd.stop()
        RIG.start_forwarder(name="budget", extra="[limits]\nbulk_pipes = 1\nworkers = 1\n"
                            "pump_budget_kib = 64\n")
        try:
            before = RIG.topo.stats()
            out = {}
            t = threading.Thread(target=lambda: out.update(
                res=RIG.client(1, get("http://%s/big/%d" % (ORIGIN, 24 << 20)), timeout=60)[0]))
            t.start()
            small = [RIG.client(0, get("http://%s/beside-%d" % (ORIGIN, i)))[0] for i in range(5)]
            t.join(90)
            res = out["res"]
            self.assertTrue(res["ok"], res)
            self.assertEqual(res["bytes"] - res["response"].index("\r\n\r\n") - 4, 24 << 20)
            self.assertTrue(all(r.get("status") == 200 for r in small), small)
            after = RIG.topo.stats()
            self.assertGreater(after["pump_yields"] - before["pump_yields"], 0, after)
            self.assertEqual(after["active"], 0, after)
        finally:
            RIG.fwd.stop()
            RIG.start_forwarder(name="after-budget", extra="[limits]\nbulk_pipes = 1\nworkers = 3\n")

    def test_parallel_downloads_past_the_grown_pipe_cap_are_intact(self):
        # Three downloads whose clients wait before reading: each direction
        # fills its pipe and turns bulk while the others are still open, so
        # with bulk_pipes = 1 one pipe grows and two are refused the growth.
        # All three arrive whole, and every grant comes back.
        before = RIG.topo.stats()
        n = 8 << 20
        results = [None] * 3

        def run(i):
            results[i] = RIG.client(i, get("http://%s/big/%d" % (ORIGIN, n)), timeout=60,
                                    pre=["--delay-read-ms", "400"])[0]
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        for res in results:
            self.assertTrue(res and res["ok"], res)
            self.assertEqual(res["bytes"] - res["response"].index("\r\n\r\n") - 4, n)
        after = RIG.topo.stats()
        self.assertGreaterEqual(after["bulk_dirs"] - before["bulk_dirs"], 3)
        self.assertGreaterEqual(after["pipes_grow_capped"] - before["pipes_grow_capped"], 1)
        self.assertEqual(after["pipes_grown"], 0)

    def test_token_service_port_is_relayed_without_stamp(self):
        # Not a proxy request and not canonical: the port is forwarded, not parsed.
        req = (b"get /computeMetadata/v1/token HTTP/1.1\r\nMetadata-Flavor: Google\r\n"
               b"Fy-Stamp: client-written, not ours to judge here\r\n\r\n")
        res = RIG.client(0, req, connect="%s:%d" % (GATEWAY, TOKEN_PORT), timeout=3)[0]
        self.assertTrue(res["ok"], res)
        rows = RIG.wait_rows(RIG.token_log, 1)
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual(rows[0]["request_line"], "get /computeMetadata/v1/token HTTP/1.1")
        # Byte for byte: nothing added, nothing removed.
        self.assertEqual(rows[0]["headers"], ["Metadata-Flavor: Google",
                                              "Fy-Stamp: client-written, not ours to judge here"])

    def test_sequences_are_unique_and_increasing(self):
        RIG.client(0, get("http://%s/seq" % ORIGIN), count=20)
        seqs = [r["stamp"]["seq"] for r in RIG.proxy_rows() if "stamp" in r
                and r["stamp"]["src"].startswith("10.89.")]
        self.assertEqual(len(seqs), len(set(seqs)))
        boots = {r["stamp"]["boot"] for r in RIG.proxy_rows() if "stamp" in r}
        with open("/proc/sys/kernel/random/boot_id") as f:
            self.assertEqual(boots, {f.read().strip()})

    def test_connections_spread_over_every_worker(self):
        # Each port has one socket per worker and the kernel picks one by the
        # 4-tuple: 120 new connections from three containers, 30 of them at
        # once from each of two, leave none of three workers idle (each stays
        # idle with a chance of (2/3)^120). Every one is stamped with its own
        # container's address, with a sequence no other connection has.
        before = RIG.topo.stats()
        self.assertEqual(before["workers"], 3, before)
        results = {}

        def run(i, n):
            results[i] = RIG.client(i, get("http://%s/spread-%d" % (ORIGIN, i)), count=n)
        threads = [threading.Thread(target=run, args=(i, n)) for i, n in ((0, 60), (1, 30),
                                                                           (2, 30))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i, n in ((0, 60), (1, 30), (2, 30)):
            self.assertEqual(len(results[i]), n)
            for res in results[i]:
                self.assertTrue(res["ok"], res)
                self.assertIn("origin ok /spread-%d" % i, res["response"])
        after = RIG.topo.stats()
        per_worker = [a - b for a, b in zip(after["accepted_by_worker"],
                                            before["accepted_by_worker"])]
        self.assertEqual(sum(per_worker), 120, per_worker)
        self.assertTrue(all(n > 0 for n in per_worker), per_worker)
        self.assertEqual(after["accepted"] - before["accepted"], 120)
        self.assertEqual(after["stamped"] - before["stamped"], 120)
        self.assertEqual(after["seq"] - before["seq"], 120)
        rows = [r for r in RIG.proxy_rows() if r.get("target", "").startswith(
            "http://%s/spread-" % ORIGIN)]
        self.assertEqual(len(rows), 120)
        for r in rows:
            i = int(r["target"].rsplit("-", 1)[1])
            self.assert_valid_stamp(r, RIG.topo.containers[i][1], RIG.topo.containers[i][2])
        seqs = [r["stamp"]["seq"] for r in rows]
        self.assertEqual(len(set(seqs)), 120)

    def test_probe_reports_serving(self):
        sock = os.path.join(RIG.topo.path("state"), "control.sock")
        r = subprocess.run([FORWARDER, "--probe", "--control", sock], capture_output=True,
                           text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("ok "), r.stdout)
        self.assertIn("bridge=listening:netns=", r.stdout)
        r = subprocess.run([FORWARDER, "--probe", "--config", RIG.topo.forwarder_cfg],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_no_way_around_the_forwarder(self):
        # The rootless namespace has no route to the host: only the forwarder gets out.
        s = subprocess.run(["ip", "netns", "exec", RIG.topo.rl, "ip", "route", "get", GATEWAY],
                           capture_output=True, text=True, timeout=10)
        self.assertNotEqual(s.returncode, 0, s.stdout)
        res = RIG.client(0, get("http://%s/x" % ORIGIN), connect="%s:80" % ORIGIN,
                         timeout=2)[0]
        self.assertFalse(res["ok"], res)


if __name__ == "__main__":
    unittest.main(verbosity=2)

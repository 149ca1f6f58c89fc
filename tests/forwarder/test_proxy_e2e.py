#!/usr/bin/env python3
"""ADR-0034 end to end with the real parts: containers in their own namespaces
on bridges in a "rootless" namespace, the real fy-forwarder there (and its VM
listener in the VM's namespace), the real fy-proxy on the host gateway with
the same key, origins on an "internet" address in the host namespace.

It proves, from fy-proxy's Network Log and the origins' records: each
container's requests are attributed to its own address and bridge; a
client-written stamp is stripped and the origin never sees a stamp; requests
decrypted inside a CONNECT inherit the stamp; a stamp replayed or forged from
outside the forwarder is recorded as unattributed; a process in a container's
cgroup using the VM listener is attributed to that container; kill -9 the
forwarder and clients get refused/reset, and nothing reaches the proxy.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from fyf_base import CLIENT, get  # noqa: E402
from fyf_topology import (GATEWAY, ORIGIN, PROXY_PORT, VM_LISTEN, Topology,  # noqa: E402
                          build_dir, source_dir)
from fytest import TestCA  # noqa: E402

POD = "5a5a5a5a5a5a5a5a" * 4
with open("/proc/sys/kernel/random/boot_id") as _f:
    BOOT_ID = _f.read().strip()
FYTEST = os.path.join(HERE, "..", "lib", "fytest.py")


def read_rows(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


class ProxyEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.topo = Topology("e2e", containers=[("podman1", 2), ("podman2", 1)])
        t = cls.topo.__enter__()
        try:
            cls.key_file, cls.key_hex = t.write_key()
            ca = TestCA(t.path(""))
            cert, key = ca.issue(["tls.origin.test"], ips=[ORIGIN])
            cls.origin_log = t.path("origin.jsonl")
            cls.tls_log = t.path("tls-origin.jsonl")
            cls.netlog = t.path("egress.jsonl")
            policy = t.path("policy.toml")
            with open(policy, "w") as f:
                f.write(f'mode = "enforce"\nallow = ["{ORIGIN}", "tls.origin.test"]\n'
                        'build_allow = ["build.origin.test"]\n')
            cls.state = t.path("proxy-state")
            t.start_in_host(["python3", FYTEST, "origin", "--host", ORIGIN, "--port", "80",
                             "--log", cls.origin_log], name="origin")
            t.start_in_host(["python3", FYTEST, "origin", "--host", ORIGIN, "--port", "443",
                             "--cert", cert, "--key", key, "--log", cls.tls_log], name="tls-origin")
            cls.proxy = t.start_in_host(
                [os.path.join(build_dir(), "proxy", "fy-proxy"), "--listen", f"{GATEWAY}:{PROXY_PORT}",
                 "--admin", "off", "--state-dir", cls.state, "--policy", policy,
                 "--netlog", cls.netlog, "--stamp-key", cls.key_file, "--upstream-ca", ca.cert_path,
                 "--resolve", f"tls.origin.test={ORIGIN}",
                 "--resolve", f"build.origin.test={ORIGIN}", "--log-level", "debug"], name="fy-proxy")
            t.wait_listening(t.host, GATEWAY, PROXY_PORT, proc=cls.proxy)
            t.wait_listening(t.host, ORIGIN, 80)
            t.wait_listening(t.host, ORIGIN, 443)
            cls.fwd = t.start_forwarder(t.forwarder_config(cls.key_file, vm=True))
            cls.pod_cg = t.cgroup("libpod-%s.scope" % POD)
        except BaseException:
            t.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        err = cls.proxy.log() if cls.proxy else ""
        cls.topo.__exit__(None, None, None)
        if "AddressSanitizer" in err or "runtime error:" in err:
            raise AssertionError("fy-proxy reported a sanitizer error:\n" + err[-3000:])

    def client(self, i, data, ns=None, connect=None, pre=(), until="length"):
        connect = connect or "%s:%d" % (GATEWAY, PROXY_PORT)
        argv = ["python3", CLIENT, "--connect", connect, "--count", "1", "--timeout", "10",
                "--until", until, "--send-b64", base64.b64encode(data).decode()]
        argv += list(pre)
        if ns:
            r = subprocess.run(["nsenter", "--net=/run/netns/" + ns, "--"] + argv,
                               capture_output=True, text=True, timeout=60)
        else:
            r = self.topo.run_in_container(i, argv, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.splitlines()[0])

    def row(self, path, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [r for r in read_rows(self.netlog) if r.get("path") == path]
            if rows:
                return rows[-1]
            time.sleep(0.02)
        raise AssertionError(f"no Network Log row for {path}: {read_rows(self.netlog)[-5:]}")

    def container_addr(self, i):
        return self.topo.containers[i][1]  # (namespace, address, bridge)

    def test_each_container_is_attributed_to_its_own_address_and_bridge(self):
        seen_seq = []
        for i, net in ((0, "podman1"), (1, "podman1"), (2, "podman2")):
            path = f"/who-{i}"
            forged = "v=1;src=10.0.0.99;net=evil;seq=1;boot=%s;mac=%s" % ("0" * 8 + "-0000-0000-0000-" + "0" * 12, "0" * 64)
            res = self.client(i, get(f"http://{ORIGIN}{path}", [f"Fy-Stamp: {forged}", f"fy-stamp: {forged}"]))
            self.assertEqual(res["status"], 200, res)
            row = self.row(path)
            self.assertEqual(row["src"], self.container_addr(i), row)
            self.assertEqual(row["net"], net, row)
            self.assertEqual(row["boot"], BOOT_ID)
            self.assertNotIn("unattributed", row)
            seen_seq.append(row["seq"])
        self.assertEqual(seen_seq, sorted(seen_seq))
        self.assertEqual(len(set(seen_seq)), 3)
        # The origin never saw a stamp, the client's or the forwarder's.
        for rec in read_rows(self.origin_log):
            self.assertNotIn("fy-stamp", [k.lower() for k, _ in rec["headers"]])

    def test_requests_decrypted_inside_a_connect_inherit_the_stamp(self):
        ca = os.path.join(self.state, "ca-cert.pem")
        r = self.topo.run_in_container(
            2, ["curl", "-sS", "--noproxy", "", "-x", f"http://{GATEWAY}:{PROXY_PORT}", "--cacert", ca,
                "https://tls.origin.test/inner-1", "-o", "/dev/null", "https://tls.origin.test/inner-2"],
            timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [self.row("/inner-1"), self.row("/inner-2")]
        for row in rows:
            self.assertEqual(row["tls"], "decrypted")
            self.assertEqual(row["src"], self.container_addr(2))
            self.assertEqual(row["net"], "podman2")
        self.assertEqual(rows[0]["seq"], rows[1]["seq"], "one connection, one stamp")
        for rec in read_rows(self.tls_log):
            self.assertNotIn("fy-stamp", [k.lower() for k, _ in rec["headers"]])

    def test_keep_alive_requests_and_a_407_retry_inherit_the_first_heads_stamp(self):
        # One connection through the forwarder, which stamps only its first
        # head: a keep-alive request, a build host's 407 challenge and the
        # retry that answers it (as git sends it), the retry carrying a stamp of
        # the client's own. fy-proxy binds the forwarder's stamp to the
        # connection: every row has it, the client's never counts and never
        # reaches an origin.
        forged = "v=1;src=10.0.0.99;net=evil;seq=1;boot=%s;mac=%s" % (
            "0" * 8 + "-0000-0000-0000-" + "0" * 12, "0" * 64)
        auth = base64.b64encode(b"fy-build:not-a-known-secret").decode()
        data = (get(f"http://{ORIGIN}/ka-1") + get("http://build.origin.test/ka-407")
                + get("http://build.origin.test/ka-retry",
                      [f"Proxy-Authorization: Basic {auth}", f"Fy-Stamp: {forged}", "Connection: close"]))
        res = self.client(1, data, until="eof")
        self.assertTrue(res["ok"], res)
        statuses = [int(x) for x in re.findall(r"HTTP/1\.1 (\d{3}) ", res["response"])]
        self.assertEqual(statuses, [200, 407, 403], res["response"][:2000])
        rows = [self.row(p) for p in ("/ka-1", "/ka-407", "/ka-retry")]
        self.assertEqual([r["status"] for r in rows], [200, 407, 403])
        for r in rows:
            self.assertEqual((r["src"], r["net"]), (self.container_addr(1), "podman1"), r)
            self.assertNotIn("unattributed", r)
        self.assertEqual(len({r["seq"] for r in rows}), 1, "one connection, one stamp")
        for rec in read_rows(self.origin_log):
            self.assertNotIn("fy-stamp", [k.lower() for k, _ in rec["headers"]])

    def test_a_stamp_replayed_or_forged_outside_the_forwarder_is_unattributed(self):
        res = self.client(0, get(f"http://{ORIGIN}/original"))
        self.assertEqual(res["status"], 200)
        row = self.row("/original")
        # Rebuild the exact header value the forwarder wrote (as a thief who
        # captured it would have it) and send it again, around the forwarder,
        # from the VM's namespace (root is not walled in this topology).
        value = f"v=1;src={row['src']};net={row['net']};seq={row['seq']};boot={row['boot']}"
        key = bytes.fromhex(self.key_hex)
        mac = hmac.new(key, b"fy-stamp\n" + value.encode(), hashlib.sha256).hexdigest()
        replay = self.client(0, get(f"http://{ORIGIN}/replayed", [f"Fy-Stamp: {value};mac={mac}"]),
                             ns=self.topo.vm)
        self.assertEqual(replay["status"], 200)
        self.assertTrue(self.row("/replayed").get("unattributed"))
        forged_mac = hmac.new(b"k" * 32, b"fy-stamp\n" + value.replace(f"seq={row['seq']}", "seq=999999").encode(),
                              hashlib.sha256).hexdigest()
        forged = value.replace(f"seq={row['seq']}", "seq=999999") + ";mac=" + forged_mac
        self.client(0, get(f"http://{ORIGIN}/forged", [f"Fy-Stamp: {forged}"]), ns=self.topo.vm)
        self.assertTrue(self.row("/forged").get("unattributed"))
        self.assertNotIn("src", self.row("/forged"))

    def rows_where(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [r for r in read_rows(self.netlog) if pred(r)]
            if rows:
                return rows
            time.sleep(0.02)
        raise AssertionError(f"no such Network Log row: {read_rows(self.netlog)[-5:]}")

    def test_a_stamp_field_in_a_chunked_trailer_never_reaches_the_origin(self):
        # The forwarder strips stamps from the head; a trailer travels with the
        # body bytes. fy-proxy refuses a stamp field there (it cannot strip it
        # before the bytes go on). A harmless trailer goes through, which shows
        # the origin records trailers at all.
        def chunked(path, trailer):
            return (f"POST http://{ORIGIN}{path} HTTP/1.1\r\nHost: {ORIGIN}\r\n"
                    "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    f"5\r\nhello\r\n0\r\n{trailer}\r\n\r\n").encode()
        ok = self.client(0, chunked("/trailer-plain", "X-Checksum: 1"), until="eof")
        self.assertEqual(ok["status"], 200, ok)
        recs = [r for r in read_rows(self.origin_log) if r["path"] == "/trailer-plain"]
        self.assertEqual(recs[-1]["trailers"], [["X-Checksum", "1"]])
        for name in ("Fy-Stamp", "fY-sTaMp"):
            path = "/trailer-" + name
            res = self.client(1, chunked(path, f"{name}: v=1;src=10.0.0.99;net=evil"), until="eof")
            self.assertEqual(res["status"], 400, res)
            self.assertIn("trailer section carries a " + name, res["response"])
            row = self.row(path)
            self.assertEqual(row["status"], 400)
            self.assertEqual(row["src"], self.container_addr(1), row)
        for rec in read_rows(self.origin_log):
            self.assertNotIn("fy-stamp", [k.lower() for k, _ in rec.get("trailers", [])], rec)

    def test_a_first_head_the_proxy_refuses_still_names_who_asked(self):
        # Canonical for the forwarder (which stamps it), refused by fy-proxy:
        # two Host headers (its framing check, after llhttp parsed the head),
        # two Content-Lengths and a method llhttp does not know (the head
        # cannot be parsed at all). The refusal's row carries the stamp all the
        # same.
        cases = [
            (0, get(f"http://{ORIGIN}/two-host", [f"Host: {ORIGIN}"]), "more than one Host header"),
            (1, (f"POST http://{ORIGIN}/two-cl HTTP/1.1\r\nHost: {ORIGIN}\r\nContent-Length: 1\r\n"
                 "Content-Length: 1\r\n\r\nx").encode(), "Duplicate Content-Length"),
            (2, get(f"http://{ORIGIN}/frob", method="FROB"), "the request line is not HTTP/1"),
        ]
        for i, data, why in cases:
            res = self.client(i, data, until="eof")
            self.assertEqual(res["status"], 400, res)
            row = self.rows_where(lambda r, why=why: why in r.get("error", ""))[-1]
            self.assertEqual(row["status"], 400, row)
            self.assertEqual(row["src"], self.container_addr(i), row)
            self.assertEqual(row["boot"], BOOT_ID)
            self.assertNotIn("unattributed", row)

    def test_an_http_1_0_first_head_is_attributed(self):
        res = self.client(0, (f"GET http://{ORIGIN}/one-oh HTTP/1.0\r\nHost: {ORIGIN}\r\n\r\n").encode(),
                          until="eof")
        self.assertEqual(res["status"], 200, res)
        row = self.row("/one-oh")
        self.assertEqual(row["src"], self.container_addr(0), row)

    def test_the_vm_listener_attributes_by_cgroup(self):
        res = self.client(0, get(f"http://{ORIGIN}/vm-pod"), ns=self.topo.vm,
                          connect=f"{VM_LISTEN}:{PROXY_PORT}", pre=["--cgroup", self.pod_cg, "--uid", "100123"])
        self.assertEqual(res["status"], 200, res)
        row = self.row("/vm-pod")
        self.assertEqual(row["who"], "container:" + POD)
        self.assertEqual(row["net"], "host")

    def test_zz_kill9_the_forwarder_and_nothing_gets_through(self):
        before = len(read_rows(self.netlog))
        self.fwd.kill9()
        time.sleep(0.2)
        for i in range(3):
            argv = ["python3", CLIENT, "--connect", f"{GATEWAY}:{PROXY_PORT}", "--count", "1", "--timeout",
                    "3", "--send-b64", base64.b64encode(get(f"http://{ORIGIN}/after-kill")).decode()]
            r = self.topo.run_in_container(i, argv, timeout=30)
            res = json.loads(r.stdout.splitlines()[0])
            self.assertFalse(res["ok"], res)
            self.assertIn(res["error"], ("ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH", "timeout"), res)
        time.sleep(0.3)
        after = read_rows(self.netlog)
        self.assertFalse([r for r in after if r.get("path") == "/after-kill"])
        self.assertEqual(len(after), before)


if __name__ == "__main__":
    unittest.main(verbosity=2)

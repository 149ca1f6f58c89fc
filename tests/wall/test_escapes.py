#!/usr/bin/python3
"""Escape techniques tried against the machine wall and the guard.

Each test tries one way out as the walled user (or a container uid, or a
forwarded container), asserts the outcome observed on this kernel, and
records it. Where fy-wall's rules depart from the reference's, the same
technique is also tried against the reference's exact tables, and its
result there is recorded too. The table of results is printed at the end
and written to $FY_BUILD_DIR/tests/wall/escapes.json; docs/wall-escapes.md
is that table with the reasoning. The guard's, the host wall's and the
re-apply techniques are proven in test_guard.py, test_host.py, test_apply.py
and test_boot.py; the document lists them with the test that shows each, and
EscapesDoc checks that its count and the tests it names are real.
"""
import json
import os
import re
import subprocess
import time
import unittest

import fywnet as n

T = n.GuestTopology
U = n.WALLED_UID
SUB = n.SUBUID_START + 11
RESULTS = []


def record(technique, observed, passes, under_reference=None):
    RESULTS.append({"technique": technique, "observed": observed, "passes": passes,
                    "under_reference": under_reference})


class Escapes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        n.set_nf_log_all_netns()
        cls.t = n.GuestTopology(container=True)
        cls.t.warm_up()
        cls.ident = n.Identity()
        cls.apply_fy_wall()
        cls.fwd = n.Server(cls.t.guest, "fwd", "fwd:127.42.0.1:41000")
        cls.log = n.KernelLog()
        # Unprivileged ICMP echo sockets, as many distributions allow.
        n.in_ns(cls.t.guest, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)
        out = os.path.join(n.BUILD, "tests", "wall", "escapes.json")
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w") as f:
                json.dump(RESULTS, f, indent=1)
        except OSError:
            pass
        print(f"\nescape techniques tried here: {len(RESULTS)}")
        for r in RESULTS:
            ref = f" | reference: {r['under_reference']}" if r["under_reference"] else ""
            print(f"  {'PASSES' if r['passes'] else 'held  '} {r['technique']}: "
                  f"{r['observed']}{ref}")

    @classmethod
    def apply_fy_wall(cls):
        for wall in ("machine", "guard"):
            r = cls.ident.fy_wall(cls.t.guest, "apply", wall, *n.machine_args(cls.ident))
            assert r.returncode == 0, r.stderr

    def apply_reference(self):
        n.sh(*n.nsexec(self.t.guest, "nft", "-f", "-"), input=n.reference_machine_wall())

    def pub_seen(self):
        return len(self.t.pub_srv.seen_from(T.GUEST))

    def try_out(self, technique, uid, kind, host, port, *extra, expect, log=None, ns=None,
                timeout=2.0):
        """One attempt that must not get out: `expect` is the outcome the
        client sees; nothing from the guest reaches the public namespace."""
        seen = self.pub_seen()
        self.log.mark()
        r = n.probe(ns or self.t.guest, uid, kind, host, port, *extra, timeout=timeout)
        line = None
        if log:
            line = self.log.wait_for(*log)
            self.assertIsNotNone(line, f"{technique}: no deny line {log}")
        self.assertEqual(self.pub_seen(), seen, f"{technique}: reached the public namespace")
        self.assertEqual(r["outcome"], expect, f"{technique}: {r}")
        observed = r["outcome"] + (f" ({r['errno']} at {r['stage']})" if r.get("errno") else
                                   f" (at {r['stage']})")
        if line:
            observed += f"; logged '{line.split(' ')[0]}'"
        record(technique, observed, False)
        return r

    # ---- addressing tricks ----

    def test_ipv4_mapped_ipv6_socket(self):
        self.try_out("IPv4-mapped IPv6 socket (::ffff:203.0.113.10) to TCP 443", U,
                     "tcp-mapped", T.PUBLIC, 443, expect="refused",
                     log=("fy-wall-deny ", "DST=203.0.113.10 ", "DPT=443 "))

    def test_gateways_other_address(self):
        self.try_out("the band port on another address of the host (203.0.113.1:41000)", U,
                     "tcp", T.HOST_OTHER, 41000, expect="refused",
                     log=("fy-wall-deny ", "DST=203.0.113.1 ", "DPT=41000 "))

    def test_gateway_band_port_over_ipv6(self):
        self.try_out("the band port over IPv6 (fd00:5::2:41000)", U, "tcp", "fd00:5::2", 41000,
                     expect="refused", log=("fy-wall-deny", "DPT=41000 "), timeout=4.0)

    def test_dns_over_tcp_to_a_public_resolver(self):
        self.try_out("DNS over TCP to a public resolver", U, "tcp", T.PUBLIC, 53,
                     expect="refused", log=("fy-wall-deny ", "PROTO=TCP ", "DPT=53 "))

    def test_limited_broadcast_dns(self):
        self.try_out("DNS to the limited broadcast 255.255.255.255:53", U, "udp-broadcast",
                     "255.255.255.255", 53, expect="eperm",
                     log=("fy-wall-deny ", "DST=255.255.255.255 "))

    def test_multicast_mdns(self):
        self.try_out("mDNS multicast 224.0.0.251:5353", U, "udp", "224.0.0.251", 5353,
                     expect="eperm", log=("fy-wall-deny ", "DST=224.0.0.251 "))

    def test_subnet_broadcast_dns_is_admitted_by_design(self):
        self.log.mark()
        r = n.probe(self.t.guest, U, "udp-broadcast", "192.168.5.255", 53, timeout=1.0)
        self.assertEqual(r["outcome"], "timeout", r)  # sent; no resolver answers broadcasts
        self.assertIsNone(self.log.wait_for("fy-wall-deny ", "DST=192.168.5.255 ", timeout=0.5))
        record("DNS to the guest subnet's broadcast 192.168.5.255:53",
               "sent, by design: a private destination on :53 (the resolver rule); no one "
               "answered here", True)

    # ---- protocols and socket kinds ----

    def test_icmp_echo_from_a_ping_socket(self):
        self.try_out("ICMP echo from an unprivileged ping socket", U, "icmp", T.PUBLIC, 0,
                     expect="eperm", log=("fy-wall-deny ", "PROTO=ICMP ", "TYPE=8 "))

    def test_tcp_fast_open_data_in_the_syn(self):
        self.try_out("TCP Fast Open (data in the SYN)", U, "tcp-fastopen", T.PUBLIC, 443,
                     expect="refused", log=("fy-wall-deny ", "DPT=443 "))

    def test_raw_and_packet_sockets(self):
        for kind in ("raw", "packet"):
            r = n.probe(self.t.guest, U, kind, T.PUBLIC, 0)
            self.assertEqual(r["outcome"], "eperm", r)
            record(f"a {'SOCK_RAW' if kind == 'raw' else 'AF_PACKET'} socket",
                   f"eperm ({r['errno']} at socket): no CAP_NET_RAW", False)

    def test_socket_mark_and_transparent(self):
        for opt in ("mark", "transparent"):
            r = n.probe(self.t.guest, U, "tcp", T.PUBLIC, 443, "--sockopt", opt)
            self.assertEqual(r["outcome"], "eperm", r)
            name = "SO_MARK (to steer policy routing)" if opt == "mark" else \
                "IP_TRANSPARENT (to send from a foreign address)"
            record(name, f"eperm ({r['errno']} at setsockopt): needs CAP_NET_ADMIN", False)

    # ---- routing tricks ----

    def test_bind_to_lo_to_match_the_loopback_rule(self):
        self.try_out("SO_BINDTODEVICE lo, then TCP to a public address (oifname \"lo\" "
                     "accepts it)", U, "tcp", T.PUBLIC, 443, "--bind-dev", "lo",
                     expect="timeout", timeout=1.5)
        self.try_out("SO_BINDTODEVICE lo, then UDP to a public resolver", U, "udp", T.PUBLIC,
                     53, "--bind-dev", "lo", expect="timeout", timeout=1.0)

    def test_root_in_a_user_namespace(self):
        seen = self.pub_seen()
        r = n.sh(*n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                           "--clear-groups", "unshare", "-U", "-r", n.PY, n.PROBE, "tcp",
                           T.PUBLIC, "443"), check=False)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out["outcome"], "refused", out)
        self.assertEqual(self.pub_seen(), seen)
        record("root in a new user namespace (unshare -Ur)",
               "refused (ECONNREFUSED): the socket's uid is the kernel uid, still 4242", False)
        r = n.sh(*n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                           "--clear-groups", "unshare", "-U", "-r", "-n", n.PY, n.PROBE,
                           "tcp", T.PUBLIC, "443"), check=False)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out["outcome"], "unreachable", out)
        record("a new network namespace in a user namespace (unshare -Urn)",
               "unreachable (ENETUNREACH): no interface leads out of it", False)

    def test_changing_the_rules_as_the_walled_user(self):
        for cmd in (["nft", "flush", "ruleset"], ["ip", "rule", "add", "priority", "1",
                                                  "lookup", "main"]):
            r = n.sh(*n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                               "--clear-groups", *cmd), check=False)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("Operation not permitted", r.stderr)
        self.assertEqual(n.in_ns(self.t.guest, "nft", "list", "tables").stdout.count("fy_"), 3)
        record("nft flush ruleset / ip rule add, as the walled user",
               "refused: Operation not permitted (no CAP_NET_ADMIN)", False)

    def test_a_container_uid(self):
        self.try_out("a container's uid (subuid 100011) to TCP 443", SUB, "tcp", T.PUBLIC, 443,
                     expect="refused", log=("fy-wall-deny ", "DPT=443 "))

    # ---- conntrack ----

    def test_reusing_roots_conntrack_entry(self):
        """Root's UDP exchange with a public host leaves a conntrack entry; a
        walled socket bound to the same source port sends the same 5-tuple."""
        results = {}
        for which in ("reference", "fy-wall"):
            if which == "reference":
                self.apply_reference()
            try:
                port = 40101 if which == "reference" else 40102
                root = n.probe(self.t.guest, 0, "udp", T.PUBLIC, 53, "--bind-port", port)
                self.assertEqual(root["outcome"], "ok", root)
                results[which] = n.probe(self.t.guest, U, "udp", T.PUBLIC, 53, "--bind-port",
                                         port)
            finally:
                self.apply_fy_wall()
        self.assertEqual(results["reference"]["outcome"], "ok", "the reference held?")
        self.assertEqual(results["fy-wall"]["outcome"], "eperm", results["fy-wall"])
        record("a UDP socket bound to the source port of root's finished exchange with a "
               "public resolver (its conntrack entry is 'established')",
               "eperm (EPERM at send): judged as walled before conntrack", False,
               under_reference="ESCAPED: the resolver answered (ct state established "
                               "accepted it first)")

    def test_a_flow_opened_before_the_wall(self):
        results = {}
        for which in ("reference", "fy-wall"):
            n.in_ns(self.t.guest, "nft", "delete", "table", "inet", "fy_wall")
            n.in_ns(self.t.guest, "nft", "delete", "table", "ip6", "fy_wall6")
            port = 4443 if which == "reference" else 4444
            srv = n.Server(self.t.pub, "hold", f"hold:{T.PUBLIC}:{port}")
            h = n.spawn(n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                                 "--clear-groups", n.PY, n.PROBE, "hold", T.PUBLIC, port,
                                 "--timeout", "2", "--payload", "after-wall"),
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.assertIn('"connected"', h.stdout.readline())
            if which == "reference":
                self.apply_reference()
            else:
                self.apply_fy_wall()
            h.stdin.write("go\n")
            h.stdin.flush()
            after = json.loads(h.stdout.readline())
            h.wait(timeout=10)
            time.sleep(0.2)
            results[which] = (after, [r for r in srv.records() if r.startswith("data ")])
            self.apply_fy_wall()
        ref_after, ref_data = results["reference"]
        fy_after, fy_data = results["fy-wall"]
        self.assertTrue(ref_data, "under the reference the held flow stayed open")
        self.assertFalse(fy_data, f"data passed fy-wall: {fy_data}")
        self.assertEqual(fy_after["outcome"], "reset", fy_after)
        record("a TCP flow to a public host opened before the wall, used after it",
               "reset (ECONNRESET): its next packet is judged like a new one", False,
               under_reference="ESCAPED: the data arrived (ct state established)")

    def test_inbound_connection_answered_by_the_walled_user(self):
        srv = n.Server(self.t.guest, "walled-listener", "tcp:0.0.0.0:8080", uid=U)
        r = n.probe(self.t.pub, 0, "tcp", T.GUEST, 8080)
        self.assertEqual(r["outcome"], "ok", r)
        self.assertTrue(srv.records())
        record("answering a connection a public host opened to the walled user's listener",
               "passes, by design: replies on flows others opened (ct direction reply); the "
               "real guest is not reachable from outside the host", True)

    # ---- a socket the walled user did not create ----

    def test_a_socket_made_by_root(self):
        r = n.sh(*n.nsexec(self.t.guest, n.PY, os.path.join(n.HERE, "handoff.py"), U,
                           T.PUBLIC, 443), check=False)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out["uid"], U)
        self.assertEqual(out["outcome"], "ok", out)
        record("a socket root created, used by a walled process (fd passing)",
               "passes, by design: a socket's owner is its creator; a root accomplice is "
               "VM-root (ADR-0009)", True)

    # ---- the forward chain ----

    def test_a_forwarded_container(self):
        self.try_out("a rootful container, forwarded by the guest, to TCP 443", 0, "tcp",
                     T.PUBLIC, 443, ns=self.t.ctr, expect="refused",
                     log=("fy-wall-deny-fwd ", "SRC=10.89.0.2 ", "DPT=443 "))
        r = n.probe(self.t.ctr, 0, "tcp", T.GW, 41095)
        self.assertEqual(r["outcome"], "ok", r)
        record("a forwarded container to a private address on any port (41095 on the "
               "gateway)", "passes, by design: the forward chain admits private destinations "
               "(the reference's rule); rootless containers leave through pasta and are "
               "judged by uid", True)

    # ---- the guard ----

    def test_guard_direct_connection_to_the_proxy_port(self):
        seen = len(self.t.host_srv.seen_from(T.GUEST))
        r = n.probe(self.t.guest, U, "tcp", T.GW, 41000)
        self.assertEqual(r["reply"], "fwd tcp 127.42.0.1:41000 orig=192.168.5.2:41000", r)
        self.assertEqual(len(self.t.host_srv.seen_from(T.GUEST)), seen)
        record("a direct TCP connection to the proxy port on the gateway (guard on)",
               "redirected to the forwarder's listener, port kept; the host never sees it",
               False)


DOC = os.path.join(n.SOURCE, "docs", "wall-escapes.md")


class EscapesDoc(unittest.TestCase):
    """docs/wall-escapes.md stays honest: its count is its number of rows,
    every row names at least one test, and each test it names exists in the
    test file of the suite it names; `wall_escapes` writes as many records as
    the page says."""

    def test_the_count_the_rows_and_the_tests_they_name(self):
        with open(DOC) as f:
            text = f.read()
        rows = [l for l in text.splitlines() if re.match(r"^\| \d+ \|", l)]
        self.assertEqual([int(re.match(r"^\| (\d+) \|", l).group(1)) for l in rows],
                         list(range(1, len(rows) + 1)), "rows numbered 1..N in order")
        claimed = re.search(r"\*\*(\d+) techniques tried\.\*\*", text)
        self.assertIsNotNone(claimed)
        self.assertEqual(int(claimed.group(1)), len(rows))
        sources = {}
        for row in rows:
            cell = row.rstrip().rstrip("|").rsplit("|", 1)[-1].strip()
            if cell == "same":  # the row above's test
                continue
            suite, named = None, 0
            for tok in re.findall(r"`([^`]+)`", cell):
                if tok.startswith("wall_"):
                    suite = tok[len("wall_"):]
                elif tok.startswith("test_"):
                    self.assertIsNotNone(suite, f"{tok} without its suite: {row[:60]}")
                    path = os.path.join(n.HERE, f"test_{suite}.py")
                    if path not in sources:
                        with open(path) as f:
                            sources[path] = f.read()
                    self.assertTrue(f"def {tok}(" in sources[path],
                                    f"{row[:60]}: no {tok} in {path}")
                    named += 1
            self.assertGreater(named, 0, f"a row without a test: {row[:60]}")
        said = re.search(r"`wall_escapes` prints its own (\d+) rows.*?\((\d+) entries", text,
                         re.S)
        self.assertIsNotNone(said)
        # Rows whose test is wall_escapes', and the "same" rows below them.
        own = 0
        for row in rows:
            cell = row.rstrip().rstrip("|").rsplit("|", 1)[-1].strip()
            if cell != "same":
                last = "`wall_escapes`" in cell
            own += last
        self.assertEqual(own, int(said.group(1)))
        if RESULTS:  # Escapes ran in this process: what it recorded
            self.assertEqual(len(RESULTS), int(said.group(2)))


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

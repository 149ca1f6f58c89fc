#!/usr/bin/python3
"""fy-dnsfwd and the machine wall's DNS redirect, in network namespaces
(dnsnet.py): real nft, real sockets, the real binaries.

Each class of escape the forwarder closes is tried twice: under the machine
wall as it is on main (DNS admitted to the VM's resolver, or, for the LAN
host, to every private range: the old default), where it gets out, and
under the wall with `dns_forwarder`, where it does not. docs/wall-escapes.md
rows 102-113 are these tests.
"""
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import dnsnet as d
import fywnet as n

U = n.WALLED_UID
SUB = n.SUBUID_START + 7


class DnsForwarder(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.t = d.DnsTopology()
        cls.p, cls.log, cls.err = cls.t.start_dnsfwd(cls.t.dnsfwd_config())

    @classmethod
    def tearDownClass(cls):
        try:
            text = d.stop_dnsfwd(cls.p, cls.err)
            assert "stopped: forwarded" in text, text[-2000:]
        finally:
            n.cleanup(cls.mark)

    def setUp(self):
        self.t.wall(forwarder=True)

    def logged(self, **want):
        """The forwarder's log lines that have every key of `want`."""
        return [l for l in d.read_log(self.log) if all(l.get(k) == v for k, v in want.items())]

    def resolver_saw(self):
        return len(self.t.resolver.records())

    def auth_saw(self, suffix):
        return [r for r in self.t.auth.records() if r["name"] and r["name"].endswith(suffix)]

    # ---- the redirect, and who asked ----

    def test_walled_query_is_redirected_and_answered(self):
        for uid in (U, SUB):
            for proto in ([], ["--tcp"]):
                r = d.dnsprobe(self.t.guest, uid, "query", d.RESOLVER, f"u{uid}.api.github.com",
                               *proto)
                self.assertEqual(r["answered"], 1, r)
                self.assertEqual(r["rcodes"], {"0": 1}, r)
                self.assertEqual(r["from"], f"{d.RESOLVER}:53", r)  # the client sees its resolver
        lines = self.logged(name=f"u{U}.api.github.com", verdict="forwarded")
        self.assertEqual({l["proto"] for l in lines}, {"udp", "tcp"}, lines)
        for l in lines:
            self.assertEqual(l["ns"], "vm")
            self.assertTrue(l["src"].startswith(f"{d.GUEST}:"), l)
            self.assertEqual(l["upstream"], f"{d.RESOLVER}:53")
            self.assertEqual(l.get("uid"), U, l)  # the asking socket's owner (sock_diag)
        sub = self.logged(name=f"u{SUB}.api.github.com", verdict="forwarded")
        self.assertEqual([l.get("uid") for l in sub], [SUB, SUB], sub)
        self.assertTrue(self.auth_saw(f"u{SUB}.api.github.com"))
        # root is not walled: its queries go to the resolver itself, unlogged
        before = len(d.read_log(self.log))
        r = d.dnsprobe(self.t.guest, 0, "query", d.RESOLVER, "root.example.net")
        self.assertEqual(r["rcodes"], {"0": 1}, r)
        self.assertEqual(len(d.read_log(self.log)), before)

    def test_the_log_names_the_container_in_the_bridge_namespace(self):
        r = d.dnsprobe(self.t.ctr, 0, "query", d.BRIDGE_GW, "files.pypi.org")
        self.assertEqual(r["rcodes"], {"0": 1}, r)
        lines = self.logged(name="files.pypi.org")
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(lines[0]["ns"], "bridge")
        self.assertTrue(lines[0]["src"].startswith(f"{d.CTR}:"), lines[0])
        self.assertEqual(lines[0]["verdict"], "forwarded")
        self.assertNotIn("uid", lines[0])  # its socket is in the container's namespace

    # ---- the classes closed, each with its control ----

    def test_a_dns_tunnel_through_the_vms_resolver(self):
        """E37/E41: TXT queries whose labels carry data reach the zone's
        authoritative server through a recursing resolver. Under the wall
        as on main: they arrive. Through fy-dnsfwd: REFUSED, none arrives."""
        label = "mzxw6ytboi" * 6
        try:
            self.t.wall(forwarder=False)
            r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, f"{label}.old.t.example",
                           "--qtype", "TXT")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            self.assertEqual(len(self.auth_saw("old.t.example")), 1)
        finally:
            self.t.wall(forwarder=True)
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, f"{label}.new.t.example",
                       "--qtype", "TXT")
        self.assertEqual(r["rcodes"], {"5": 1}, r)  # REFUSED by the forwarder
        self.assertEqual(self.auth_saw("new.t.example"), [])
        line = self.logged(name=f"{label}.new.t.example")
        self.assertEqual(line[0]["verdict"], "refused", line)
        self.assertEqual(line[0].get("uid"), U, line)

    def test_non_dns_bytes_to_port_53_are_refused(self):
        """E39: a non-DNS session to the resolver's :53. Under the wall as on
        main the resolver's address takes it; through fy-dnsfwd the TCP
        session is closed and a datagram gets nothing, and the resolver sees
        neither."""
        try:
            self.t.wall(forwarder=False)
            seen = self.resolver_saw()
            r = d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "SSH-2.0-OpenSSH_9.2\r\n", "--tcp",
                           "--timeout", "1")
            self.assertEqual(r["outcome"], "timeout", r)  # accepted; the stand-in waits for more
            d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "WG handshake", "--timeout", "0.5")
            self.assertGreaterEqual(self.resolver_saw() - seen, 2, "old rules: not reached")
        finally:
            self.t.wall(forwarder=True)
        seen = self.resolver_saw()
        r = d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "SSH-2.0-OpenSSH_9.2\r\n", "--tcp")
        self.assertEqual(r["outcome"], "closed", r)
        r = d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "WG handshake", "--timeout", "0.5")
        self.assertEqual(r["outcome"], "timeout", r)
        self.assertEqual(self.resolver_saw(), seen)
        self.assertTrue(self.logged(verdict="malformed", proto="tcp"))
        self.assertTrue(self.logged(verdict="malformed", proto="udp"))

    def test_another_private_hosts_port_53_is_not_reached(self):
        """E38: a LAN host's ssh moved to :53 (a plain listener). Under the old
        default resolvers (every private range) it answered; now every :53 of
        a walled principal goes to fy-dnsfwd: non-DNS bytes are refused, a
        query is answered by the VM's resolver, and the LAN host sees nothing."""
        try:
            self.t.wall(forwarder=False, resolvers="127.0.0.0/8,10.0.0.0/8,172.16.0.0/12,"
                                                   "192.168.0.0/16")
            r = n.probe(self.t.guest, U, "tcp", d.LAN, 53)
            self.assertEqual(r["reply"], f"lan tcp {d.LAN}:53", r)
        finally:
            self.t.wall(forwarder=True)
        seen = len(self.t.lan_srv.records())
        r = d.dnsprobe(self.t.guest, U, "raw", d.LAN, "SSH-2.0-OpenSSH_9.2\r\n", "--tcp")
        self.assertEqual(r["outcome"], "closed", r)
        r = d.dnsprobe(self.t.guest, U, "raw", d.LAN, "datagram", "--timeout", "0.5")
        self.assertEqual(r["outcome"], "timeout", r)
        r = d.dnsprobe(self.t.guest, U, "query", d.LAN, "lan.github.com")
        self.assertEqual(r["rcodes"], {"0": 1}, r)  # answered, by the VM's resolver
        self.assertEqual(len(self.t.lan_srv.records()), seen)

    def test_a_root_stub_on_loopback_is_reached_only_through_the_forwarder(self):
        """E20/E22's DNS half (row 93): a root resolver stub on 127.0.0.53
        forwards whatever it is sent. Under the wall as on main the walled
        user reaches it (loopback is open); now its :53 goes to fy-dnsfwd."""
        stub = n.Server(self.t.guest, "stub", "udp:127.0.0.53:53", "tcp:127.0.0.53:53")
        try:
            self.t.wall(forwarder=False)
            r = n.probe(self.t.guest, U, "tcp", "127.0.0.53", 53)
            self.assertEqual(r["reply"], "stub tcp 127.0.0.53:53", r)
        finally:
            self.t.wall(forwarder=True)
        seen = len(stub.records())
        r = d.dnsprobe(self.t.guest, U, "raw", "127.0.0.53", "not dns", "--tcp")
        self.assertEqual(r["outcome"], "closed", r)
        r = d.dnsprobe(self.t.guest, U, "query", "127.0.0.53", "stub.github.com")
        self.assertEqual(r["rcodes"], {"0": 1}, r)
        self.assertEqual(len(stub.records()), seen)

    def test_ipv6_loopback_port_53_is_refused(self):
        """Row 113: a root stub on [::1]:53. fy-dnsfwd and the redirect are
        IPv4's, so a walled principal's IPv6 :53 is refused at once (a
        resolver library then asks its IPv4 nameserver, which is
        redirected). Under the wall as on main: the stub takes the session."""
        stub = n.Server(self.t.guest, "stub6", "udp:[::1]:53", "tcp:[::1]:53")
        try:
            self.t.wall(forwarder=False)
            r = n.probe(self.t.guest, U, "tcp", "::1", 53)
            self.assertEqual(r["reply"], "stub6 tcp [::1]:53", r)
            r = n.probe(self.t.guest, U, "udp", "::1", 53)
            self.assertEqual(r["reply"], "stub6 udp [::1]:53", r)
        finally:
            self.t.wall(forwarder=True)
        seen = len(stub.records())
        for uid in (U, SUB):
            r = n.probe(self.t.guest, uid, "tcp", "::1", 53)
            self.assertEqual(r["outcome"], "refused", r)  # a reset to the SYN
            r = n.probe(self.t.guest, uid, "udp", "::1", 53)
            self.assertIn(r["outcome"], ("eperm", "refused"), r)  # the local reject: EPERM
        self.assertEqual(len(stub.records()), seen)
        # not the walled principals' IPv6 at large: loopback off :53 stays open
        other = n.Server(self.t.guest, "lo6", "tcp:[::1]:5353")
        self.assertEqual(n.probe(self.t.guest, U, "tcp", "::1", 5353)["reply"],
                         "lo6 tcp [::1]:5353")
        # root is not walled: its stub still answers it
        self.assertEqual(n.probe(self.t.guest, 0, "tcp", "::1", 53)["reply"], "stub6 tcp [::1]:53")
        del other

    def test_rate_is_bounded_per_source(self):
        """200 queries back to back: under the wall as on main the resolver
        answers every one; through fy-dnsfwd (rate 20/s, burst 20) about
        burst + rate x elapsed, the rest dropped and logged rate-limited; a
        container's bucket is its own."""
        try:
            self.t.wall(forwarder=False)
            r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "old.rate.github.com",
                           "--count", "200", "--timeout", "1")
            self.assertEqual(r["answered"], 200, r)
        finally:
            self.t.wall(forwarder=True)
        time.sleep(1.1)  # a full bucket
        t0 = time.monotonic()
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "rate.github.com", "--count", "200",
                       "--timeout", "0.02", timeout=60)
        took = time.monotonic() - t0
        print(f"measure: rate 20/s burst 20: {r['answered']} of 200 answered in {took:.2f} s")
        self.assertGreaterEqual(r["answered"], 20, r)
        self.assertLessEqual(r["answered"], 20 + 20 * took + 2, r)
        self.assertTrue(self.logged(verdict="rate-limited", src=self.logged(
            name="rate.github.com")[0]["src"]))
        r = d.dnsprobe(self.t.ctr, 0, "query", d.BRIDGE_GW, "ctr.rate.github.com")
        self.assertEqual(r["rcodes"], {"0": 1}, r)

    def test_size_is_bounded(self):
        """A 600-byte query (EDNS padding) over UDP, and a TCP message that
        announces 4000 bytes: the resolver took both under the wall as on
        main; fy-dnsfwd drops the first (too-large) and closes the second."""
        try:
            self.t.wall(forwarder=False)
            r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "big.github.com", "--pad", "550")
            self.assertEqual(r["answered"], 1, r)
        finally:
            self.t.wall(forwarder=True)
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "big2.github.com", "--pad", "550",
                       "--timeout", "0.5")
        self.assertEqual(r["timeouts"], 1, r)
        self.assertTrue(self.logged(verdict="too-large"))
        r = d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "\x0f\xa0" + "x" * 100, "--tcp")
        self.assertEqual(r["outcome"], "closed", r)
        # a small padded query is still a query
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "small.github.com", "--pad", "40")
        self.assertEqual(r["rcodes"], {"0": 1}, r)

    def test_without_the_forwarder_the_redirect_fails_closed(self):
        """fy-dnsfwd stopped: the redirected :53 reaches no one (refused),
        and nothing goes to the resolver directly."""
        cfg = self.t.dnsfwd_config(listen=[("127.42.0.54", "", "vm2")])
        p, log, err = self.t.start_dnsfwd(cfg)
        self.assertIn("stopped:", d.stop_dnsfwd(p, err))
        # the wall pointed at the stopped forwarder's address
        fd_cfg = os.path.join(self.t.ident.dir, "wall54.toml")
        with open(fd_cfg, "w") as f:
            f.write('[machine]\ndns_forwarder = "127.42.0.54"\n')
        r = self.t.ident.fy_wall(self.t.guest, "apply", "machine", "--config", fd_cfg,
                                 *n.machine_args(self.t.ident), "--resolvers", d.RESOLVER)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = self.resolver_saw()
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, "x.github.com", "--timeout", "0.5")
        self.assertEqual(r["answered"], 0, r)
        r = d.dnsprobe(self.t.guest, U, "raw", d.RESOLVER, "x", "--tcp")
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(self.resolver_saw(), seen)

    def test_status_says_whether_the_forwarder_listens(self):
        """print_dnsfwd_status() (wall/dnsfwd_status.h, for `fy-wall status
        machine`), run in the guest: listening on the live redirect's address
        when fy-dnsfwd is up; NOT LISTENING, exit 1, when it is stopped; no
        line without dns_forwarder."""
        def status():
            r = n.sh(*n.nsexec(self.t.guest, d.DNSFWD_STATUS), check=False)
            return r.returncode, r.stdout.strip()
        rc, out = status()
        self.assertEqual(rc, 0, out)
        self.assertIn(f"fy-dnsfwd: listening on {d.FWD}:53 (", out)
        self.assertIn(f"udp {d.FWD}:53 uid 0", out)
        self.assertIn(f"tcp {d.FWD}:53 uid 0", out)
        # a wall pointed at an address no fy-dnsfwd holds
        cfg = os.path.join(self.t.ident.dir, "wall55.toml")
        with open(cfg, "w") as f:
            f.write('[machine]\ndns_forwarder = "127.42.0.55"\n')
        r = self.t.ident.fy_wall(self.t.guest, "apply", "machine", "--config", cfg,
                                 *n.machine_args(self.t.ident), "--resolvers", d.RESOLVER)
        self.assertEqual(r.returncode, 0, r.stderr)
        rc, out = status()
        self.assertEqual(rc, 1, out)
        self.assertIn("fy-dnsfwd: NOT LISTENING on 127.42.0.55:53 (neither udp nor tcp)", out)
        # only udp held there: said
        holder = n.Server(self.t.guest, "half", "udp:127.42.0.55:53")
        rc, out = status()
        self.assertEqual(rc, 1, out)
        self.assertIn("(no tcp)", out)
        del holder
        self.t.wall(forwarder=False)
        self.assertEqual(status(), (0, ""))

    # ---- a large answer: TC over UDP, whole over TCP ----

    def test_a_large_answer_is_truncated_over_udp_and_whole_over_tcp(self):
        """A TXT answer of 1600 bytes of data (the authoritative stand-in's
        large.*). Asked over UDP, the walled client gets the upstream's TC
        (correct DNS: retry over TCP); asked over TCP, fy-dnsfwd asks the
        upstream over TCP and relays the whole answer, not cut to 512. Before
        the TCP upstream, the TCP query went upstream over UDP and the client
        got TC again, and never the answer."""
        name = "large.big.github.com"
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, name, "--qtype", "TXT")
        self.assertEqual(r["rcodes"], {"0": 1}, r)
        self.assertEqual(r["tc"], 1, r)
        self.assertLessEqual(r["lens"][0], 512, r)
        seen = [x for x in self.t.resolver.records() if x.get("tcpmsg")]
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, name, "--qtype", "TXT", "--tcp")
        self.assertEqual(r["rcodes"], {"0": 1}, r)
        self.assertEqual(r["tc"], 0, r)  # the whole answer
        self.assertEqual(r["ancounts"], [1], r)
        self.assertGreater(r["lens"][0], 1600, r)
        self.assertEqual(r["from"], f"{d.RESOLVER}:53", r)
        # fy-dnsfwd (root, the guest's own address) asked the resolver over TCP
        tcp = [x for x in self.t.resolver.records() if x.get("tcpmsg")][len(seen):]
        self.assertEqual(len(tcp), 1, tcp)
        self.assertTrue(tcp[0]["from"].startswith(f"{d.GUEST}:"), tcp)
        lines = self.logged(name=name)
        self.assertEqual([(l["proto"], l["verdict"], l.get("rcode")) for l in lines],
                         [("udp", "forwarded", 0), ("tcp", "forwarded", 0)], lines)
        self.assertEqual(lines[1].get("uid"), U, lines)
        self.assertEqual(lines[1]["upstream"], f"{d.RESOLVER}:53", lines)
        # an EDNS client's UDP limit (1232) is still under the answer: TC
        r = d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, name, "--qtype", "TXT",
                       "--pad", "8")
        self.assertEqual((r["rcodes"], r["tc"]), ({"0": 1}, 1), r)

    # ---- failing closed, and saying why ----

    def test_a_dead_upstream_gives_servfail_and_says_so(self):
        cfg = self.t.dnsfwd_config(upstream="192.168.5.99",
                                   listen=[("127.42.0.55", "", "dead")])
        p, log, err = self.t.start_dnsfwd(cfg)
        r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.55", "dead.github.com",
                       "--timeout", "3")
        self.assertEqual(r["rcodes"], {"2": 1}, r)  # SERVFAIL
        # over TCP: its own connection upstream, which gets no answer either
        r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.55", "dead.github.com",
                       "--timeout", "3", "--tcp")
        self.assertEqual(r["rcodes"], {"2": 1}, r)
        self.assertGreater(r["lat_us"][0], 400_000, r)  # at the deadline (500 ms)
        text = d.stop_dnsfwd(p, err)
        self.assertIn("upstream 192.168.5.99:53 did not answer within 500 ms", text)
        self.assertEqual([(l["proto"], l["verdict"]) for l in d.read_log(log)],
                         [("udp", "upstream-timeout"), ("tcp", "upstream-timeout")])
        self.assertIn("upstream-tcp 1", text)

    def test_a_refusing_tcp_upstream_gives_servfail_at_once(self):
        """A TCP query to an upstream whose :53 refuses the connection (a
        reset to the SYN): SERVFAIL at once, not at the 5 s deadline; the log
        line says proto tcp and ECONNREFUSED, stderr names the upstream."""
        cfg = self.t.dnsfwd_config(upstream="192.168.5.2", listen=[("127.42.0.57", "", "tcpref")],
                                   timeout_ms=5000)
        p, log, err = self.t.start_dnsfwd(cfg)
        r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.57", "refused.github.com", "--tcp",
                       "--timeout", "4")
        self.assertEqual(r["rcodes"], {"2": 1}, r)
        self.assertLess(r["lat_us"][0], 1_000_000, "SERVFAIL only at the deadline")
        text = d.stop_dnsfwd(p, err)
        self.assertIn("upstream 192.168.5.2:53: connecting over tcp: ECONNREFUSED", text)
        lines = d.read_log(log)
        self.assertEqual([(l["proto"], l["verdict"]) for l in lines], [("tcp", "upstream-error")])
        self.assertIn("ECONNREFUSED", lines[0]["reason"])
        self.assertEqual(lines[0]["upstream"], "192.168.5.2:53")
        print(f"measure: SERVFAIL from a refusing TCP upstream after "
              f"{r['lat_us'][0] / 1000:.1f} ms")

    def test_a_broken_tcp_upstream_gives_servfail_saying_what_broke(self):
        """The TCP upstream resets, closes before answering, frames a zero
        length, answers with another id or another question, or holds the
        connection without a word: each TCP query gets SERVFAIL (the first
        four at once, the last at timeout_ms), logged with what happened. With
        max_pending = 1, a query asked while one is upstream is answered
        SERVFAIL (overloaded) at once. The ASan build's run checks that every
        connection is freed."""
        port = 5301
        d.Stand(self.t.host, "tcpbad", d.RESOLVER, str(port))
        cfg = self.t.dnsfwd_config(upstream=f"{d.RESOLVER}:{port}", timeout_ms=1000,
                                   listen=[("127.42.0.58", "", "tcpbad")],
                                   extra="max_pending = 1\n")
        p, log, err = self.t.start_dnsfwd(cfg)
        try:
            cases = [("reset", "upstream-error", "reading over tcp: ECONNRESET"),
                     ("close", "upstream-error", "closed the TCP connection before its answer"),
                     ("zero", "upstream-bad", "its TCP framing: a TCP message of 0 bytes"),
                     ("garbage", "upstream-bad", "the answer's id differs"),
                     ("otherq", "upstream-bad", "the answer's question is not the query's")]
            for how, verdict, reason in cases:
                r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.58", f"{how}.github.com",
                               "--tcp", "--timeout", "3")
                self.assertEqual(r["rcodes"], {"2": 1}, (how, r))
                self.assertLess(r["lat_us"][0], 900_000, (how, r))
                line = [l for l in d.read_log(log) if l.get("name") == f"{how}.github.com"]
                self.assertEqual([(l["proto"], l["verdict"]) for l in line], [("tcp", verdict)],
                                 line)
                self.assertIn(reason, line[0]["reason"], line)
            # one held upstream: the next query is over max_pending; the held one times out
            q = d.dnsprobe_start(self.t.guest, 0, "query", "127.42.0.58", "hang.github.com",
                                 "--tcp", "--timeout", "4")
            time.sleep(0.4)
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.58", "next.github.com", "--tcp")
            self.assertEqual(r["rcodes"], {"2": 1}, r)
            r = d.dnsprobe_result(q)
            self.assertEqual(r["rcodes"], {"2": 1}, r)
            self.assertGreater(r["lat_us"][0], 900_000, r)
            verdicts = {l["name"]: l["verdict"] for l in d.read_log(log)}
            self.assertEqual(verdicts["next.github.com"], "overloaded", verdicts)
            self.assertEqual(verdicts["hang.github.com"], "upstream-timeout", verdicts)
            # a client gone while its query is upstream: the query times out, its answer dropped
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.58", "hang.gone.github.com", "--tcp",
                           "--timeout", "0.2")
            self.assertEqual(r["timeouts"], 1, r)
            time.sleep(1.3)
            verdicts = {l["name"]: l["verdict"] for l in d.read_log(log)}
            self.assertEqual(verdicts["hang.gone.github.com"], "upstream-timeout", verdicts)
        finally:
            text = d.stop_dnsfwd(p, err)
        self.assertIn("upstream-tcp 7", text)

    def test_a_tcp_clients_queries_share_one_upstream_connection(self):
        """A TCP client's queries go upstream on one TCP connection of their
        own (RFC 7766 reuse), not one connection per query: the resolver sees
        one connection carrying all five, each answered and logged."""
        cfg = self.t.dnsfwd_config(listen=[("127.42.0.60", "", "reuse")], rate=1000, burst=1000)
        p, log, err = self.t.start_dnsfwd(cfg)
        try:
            before = self.t.resolver.records()
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.60", "reuse.github.com", "--tcp",
                           "--count", "5")
            self.assertEqual(r["rcodes"], {"0": 5}, r)
            time.sleep(0.2)
            new = self.t.resolver.records()[len(before):]
            conns = [x for x in new if "conn" in x]
            msgs = [x for x in new if "tcpmsg" in x]
            self.assertEqual(len(conns), 1, new)
            self.assertEqual(len(msgs), 5, new)
            rows = [l for l in d.read_log(log) if l.get("name") == "reuse.github.com"]
            self.assertEqual([(l["proto"], l["verdict"]) for l in rows], [("tcp", "forwarded")] * 5)
        finally:
            text = d.stop_dnsfwd(p, err)
        self.assertIn("upstream-tcp 5", text)

    def test_a_reused_connection_closed_under_a_query_sends_it_again(self):
        """The upstream closes a reused connection under its next query (its
        idle close crossing the query): the query is sent once more on a fresh
        connection and answered, not SERVFAIL. The stand-in answers each
        connection's first query and closes under the second."""
        port = 5303
        stand = d.Stand(self.t.host, "tcpbad", d.RESOLVER, str(port))
        cfg = self.t.dnsfwd_config(upstream=f"{d.RESOLVER}:{port}", timeout_ms=3000,
                                   listen=[("127.42.0.61", "", "drop2")], rate=1000, burst=1000)
        p, log, err = self.t.start_dnsfwd(cfg)
        try:
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.61", "drop2.github.com", "--tcp",
                           "--count", "2", "--timeout", "3")
            self.assertEqual(r["rcodes"], {"0": 2}, r)
            rows = [l for l in d.read_log(log) if l.get("name") == "drop2.github.com"]
            self.assertEqual([l["verdict"] for l in rows], ["forwarded"] * 2, rows)
            time.sleep(0.2)
            self.assertEqual(len({x["from"] for x in stand.records()}), 2, stand.records())
        finally:
            d.stop_dnsfwd(p, err)

    def test_max_pending_counts_udp_and_tcp_queries_together(self):
        """max_pending bounds what is upstream at once whatever the protocol:
        with max_pending = 1 and a TCP query held upstream, a UDP query is
        `overloaded` at once (a table per protocol would forward it, and the
        stand-in's closed UDP port would make it `upstream-error`); once the
        held one times out, the next UDP query goes upstream again."""
        port = 5302
        d.Stand(self.t.host, "tcpbad", d.RESOLVER, str(port))
        cfg = self.t.dnsfwd_config(upstream=f"{d.RESOLVER}:{port}", timeout_ms=3000,
                                   listen=[("127.42.0.59", "", "mixed")],
                                   extra="max_pending = 1\n")
        p, log, err = self.t.start_dnsfwd(cfg)
        try:
            q = d.dnsprobe_start(self.t.guest, 0, "query", "127.42.0.59", "hang.github.com",
                                 "--tcp", "--timeout", "6")
            time.sleep(0.5)  # the held query upstream (it stays there 3 s)
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.59", "udp.github.com",
                           "--timeout", "2")
            self.assertEqual(r["rcodes"], {"2": 1}, r)
            verdicts = {l["name"]: l["verdict"] for l in d.read_log(log)}
            self.assertEqual(verdicts.get("udp.github.com"), "overloaded", verdicts)
            r = d.dnsprobe_result(q)
            self.assertEqual(r["rcodes"], {"2": 1}, r)
            verdicts = {l["name"]: l["verdict"] for l in d.read_log(log)}
            self.assertEqual(verdicts["hang.github.com"], "upstream-timeout", verdicts)
            r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.59", "udp2.github.com",
                           "--timeout", "4")
            verdicts = {l["name"]: l["verdict"] for l in d.read_log(log)}
            self.assertNotEqual(verdicts.get("udp2.github.com"), "overloaded", (verdicts, r))
        finally:
            d.stop_dnsfwd(p, err)

    def test_an_upstream_that_refuses_gives_servfail_at_once(self):
        # 192.168.5.2 is up, with nothing on 53: ICMP port unreachable
        cfg = self.t.dnsfwd_config(upstream="192.168.5.2", listen=[("127.42.0.56", "", "icmp")],
                                   timeout_ms=5000)
        p, log, err = self.t.start_dnsfwd(cfg)
        t0 = time.monotonic()
        r = d.dnsprobe(self.t.guest, 0, "query", "127.42.0.56", "refused.github.com",
                       "--timeout", "4")
        took = time.monotonic() - t0
        self.assertEqual(r["rcodes"], {"2": 1}, r)
        self.assertLess(r["lat_us"][0], 1_000_000, "SERVFAIL only at the deadline")
        text = d.stop_dnsfwd(p, err)
        self.assertIn("upstream 192.168.5.2:53: ECONNREFUSED", text)
        self.assertEqual([l["verdict"] for l in d.read_log(log)], ["upstream-error"])
        print(f"measure: SERVFAIL from a refusing upstream after {r['lat_us'][0] / 1000:.1f} ms "
              f"(the client's run {took:.2f} s)")

    def test_bad_configs_are_refused_with_where_and_what(self):
        cases = [
            ('upstream = ["192.168.5.3"]\n', 3, "at least one [[listen]] is required"),
            ('[[listen]]\naddress = "127.42.0.53"\n', 3, "upstream is required"),
            ('upstream = ["resolver.lan"]\n[[listen]]\naddress = "127.42.0.53"\n', 3,
             "'resolver.lan' is not an IP address"),
            ('upstream = ["192.168.5.3"]\nrate = 0\n[[listen]]\naddress = "127.42.0.53"\n', 3,
             "rate"),
            ('upstream = ["192.168.5.3"]\nallowed = ["x"]\n[[listen]]\naddress = "127.42.0.53"\n',
             3, "allowed"),
            ('upstream = ["192.168.5.3"]\n[[listen]]\naddress = "10.89.0.1:5353"\n'
             'netns = "/run/netns/fyw-none"\n', 4, "cannot open the namespace"),
            # a bridge's redirect cannot send containers to loopback (martians)
            ('upstream = ["192.168.5.3"]\n[[listen]]\naddress = "127.42.0.53"\n'
             'netns = "/run/netns/fyw-none"\n', 3, "martians"),
            ('upstream = ["192.168.5.3"]\n[[listen]]\naddress = "192.168.5.15:53"\n'
             '[[listen]]\naddress = "192.168.5.15:53"\n', 4, "another resolver holds"),
        ]
        for text, code, needle in cases:
            path = os.path.join(self.t.ident.dir, "bad.toml")
            with open(path, "w") as f:
                f.write(text)
            r = n.sh(*n.nsexec(self.t.guest, d.FY_DNSFWD, "--config", path), check=False,
                     timeout=10)
            self.assertEqual(r.returncode, code, (text, r.stderr))
            self.assertIn(needle, r.stderr, text)
            self.assertTrue(r.stderr.strip().splitlines()[-1].startswith("✗ "), r.stderr)
            if code == 3:
                self.assertIn(f"{path}:", r.stderr)
        r = n.sh(d.FY_DNSFWD, check=False)
        self.assertEqual(r.returncode, 2)
        r = n.sh(d.FY_DNSFWD, "--help")
        self.assertIn("--config FILE", r.stdout)

    def test_status_finds_the_redirect_as_rendered(self):
        args = ["--config", self.t.wall_config, *n.machine_args(self.t.ident),
                "--resolvers", d.RESOLVER]
        r = self.t.ident.fy_wall(self.t.guest, "status", "machine", *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = self.t.ident.fy_wall(None, "render", "machine", *args)
        self.assertIn("dnat ip to 127.42.0.53:53", r.stdout)
        # the redirect removed by hand: status says the wall is not as rendered
        n.in_ns(self.t.guest, "nft", "flush", "chain", "inet", "fy_wall", "dns_redirect")
        r = self.t.ident.fy_wall(self.t.guest, "status", "machine", *args)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("dnat ip to 127.42.0.53:53", r.stdout)
        r = self.t.ident.fy_wall(self.t.guest, "apply", "machine", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("every :53 redirected to fy-dnsfwd at 127.42.0.53", r.stdout)

    def test_the_wall_refuses_a_forwarder_off_loopback(self):
        path = os.path.join(self.t.ident.dir, "badwall.toml")
        with open(path, "w") as f:
            f.write('[machine]\ndns_forwarder = "192.168.5.3"\n')
        r = self.t.ident.fy_wall(None, "render", "machine", "--config", path,
                                 *n.machine_args(self.t.ident))
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("dns_forwarder", r.stderr)
        self.assertIn("127.0.0.0/8", r.stderr)


class AllowFromPolicyAndReload(unittest.TestCase):
    """The allow list rendered from fy-proxy's policy by fy-dnsfwd-allow (on
    the host) into fy-dnsfwd's allow_file, and SIGHUP: the new list and rate
    apply at once, a query upstream across the reload is answered, a bad
    config or allow file on reload is refused and the running one kept."""

    SLOW_PORT = 5300
    DELAY = 0.8

    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.t = d.DnsTopology()
        # the upstream answers 0.8 s late, and a "held" name once the test
        # releases it, so a query can be in flight at a reload
        cls.release = os.path.join(tempfile.mkdtemp(prefix=f"fyw-{n.PID}-slow-"), "release")
        n.on_cleanup(lambda: shutil.rmtree(os.path.dirname(cls.release)),
                     f"dir {os.path.dirname(cls.release)}")
        cls.slow = d.Stand(cls.t.host, "slow", d.RESOLVER, str(cls.SLOW_PORT), str(cls.DELAY),
                           cls.release)
        cls.t.wall(forwarder=True)
        fd, cls.policy = tempfile.mkstemp(prefix=f"fyw-{n.PID}-policy-", suffix=".toml")
        os.close(fd)
        n.on_cleanup(lambda: os.unlink(cls.policy), f"file {cls.policy}")
        cls.allow_file = cls.policy + ".allow"
        n.on_cleanup(lambda: os.path.exists(cls.allow_file) and os.unlink(cls.allow_file),
                     f"file {cls.allow_file}")

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def render(self, policy_text):
        with open(self.policy, "w") as f:
            f.write(policy_text)
        return n.sh(d.FY_DNSFWD_ALLOW, self.policy, "--out", self.allow_file, check=False)

    def config(self, rate=20, burst=20, timeout_ms=3000):
        return self.t.dnsfwd_config(upstream=f"{d.RESOLVER}:{self.SLOW_PORT}", allow=[],
                                    rate=rate, burst=burst, timeout_ms=timeout_ms,
                                    listen=[(d.FWD, "", "vm")],
                                    extra=f'allow_file = "{self.allow_file}"\n')

    def ask(self, name, **kw):
        return d.dnsprobe(self.t.guest, U, "query", d.RESOLVER, name, "--timeout", "3",
                          *[f"--{k}={v}" for k, v in kw.items()])

    def stderr(self, err):
        with open(err) as f:
            return f.read()

    def wait_for(self, err, text, after=0):
        """Until `text` is in fy-dnsfwd's stderr past `after`: an expected
        line, returned as soon as it is there (30 s is for a loaded machine)."""
        deadline = time.monotonic() + 30
        while text not in self.stderr(err)[after:]:
            self.assertLess(time.monotonic(), deadline, f"no {text!r}: {self.stderr(err)}")
            time.sleep(0.02)

    def wait_upstream(self, name):
        """Until the slow upstream has received a query for `name`."""
        deadline = time.monotonic() + 30
        while not any(r.get("received") == name for r in self.slow.records()):
            self.assertLess(time.monotonic(), deadline, f"{name} never reached the upstream")
            time.sleep(0.02)

    def test_the_policy_renders_the_allow_list(self):
        r = self.render('mode = "enforce"\n'
                        'allow = ["pypi.org", "*.npmjs.org", "api.example.com:8443", "10.1.2.3"]\n'
                        'build_allow = ["files.pythonhosted.org"]\n'
                        '[[grant]]\nhost = "github.com:22"\n'
                        '[[grant]]\nhost = "old.example.net"\nlevel = "once"\n'
                        'expires = 2020-01-01T00:00:00Z\n')
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.allow_file) as f:
            names = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        # ports and wildcards off, IP literals and the expired grant left out
        self.assertEqual(names, ["api.example.com", "files.pythonhosted.org", "github.com",
                                 "npmjs.org", "pypi.org"])
        # a policy the proxy fails closed on renders nothing, and the old file stays
        r = self.render('allow = ["pypi.org"\n')
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(f"{self.policy}:", r.stderr)
        self.assertIn("nothing rendered", r.stderr)
        with open(self.allow_file) as f:
            self.assertIn("npmjs.org", f.read())
        # observing: said, since DNS is narrower than the proxy then
        r = self.render('mode = "observe"\nallow = ["pypi.org"]\n')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("observe mode", r.stderr)

    def test_sighup_reloads_the_rendered_list_and_keeps_queries_in_flight(self):
        self.assertEqual(self.render('allow = ["pypi.org"]\n').returncode, 0)
        # The held query waits upstream for the test, not for a fixed time:
        # fy-dnsfwd's upstream timeout and the client's are far past any reload.
        p, log, err = self.t.start_dnsfwd(self.config(timeout_ms=60000))
        try:
            self.assertEqual(self.ask("files.pypi.org")["rcodes"], {"0": 1})
            self.assertEqual(self.ask("api.github.com")["rcodes"], {"5": 1})
            # the policy now allows github.com, not pypi.org; a pypi query is upstream
            # when the reload lands: it is still answered
            self.assertEqual(self.render('allow = ["github.com:22"]\n').returncode, 0)
            q = d.dnsprobe_start(self.t.guest, U, "query", d.RESOLVER, "held.pypi.org",
                                 "--timeout", "60")
            self.wait_upstream("held.pypi.org")  # forwarded under the old list
            seen = time.monotonic()
            mark = len(self.stderr(err))
            p.send_signal(signal.SIGHUP)
            self.wait_for(err, "reloaded", mark)
            self.assertIsNone(q.poll(), "the reload answered a query that was upstream")
            # Held at least DELAY in all, so the log's time upstream says something.
            time.sleep(max(0.0, seen + self.DELAY - time.monotonic()))
            open(self.release, "w").close()
            r = d.dnsprobe_result(q, timeout=60)
            self.assertEqual(r["rcodes"], {"0": 1}, r)  # in flight across the reload
            line = [l for l in d.read_log(log) if l.get("name") == "held.pypi.org"]
            self.assertEqual([l["verdict"] for l in line], ["forwarded"], line)
            self.assertGreater(line[0]["ms"], 700, line)
            self.assertIn("1 allowed suffix(es)", self.stderr(err)[mark:])
            self.assertEqual(self.ask("api.github.com")["rcodes"], {"0": 1})
            self.assertEqual(self.ask("files.pypi.org")["rcodes"], {"5": 1})

            # a bad allow file on reload: refused with where and what, the old list kept
            with open(self.allow_file, "w") as f:
                f.write("github.com\nnot a name!\n")
            mark = len(self.stderr(err))
            p.send_signal(signal.SIGHUP)
            self.wait_for(err, "reload refused", mark)
            self.assertIn(f"{self.allow_file}:2:", self.stderr(err)[mark:])
            self.assertEqual(self.ask("api.github.com")["rcodes"], {"0": 1})
            # a bad config: the same
            cfg = self.config()
            with open(cfg, "a") as f:
                f.write("rate = \"fast\"\n")
            self.render('allow = ["github.com"]\n')
            self.copy(cfg, self.config_path(p))
            mark = len(self.stderr(err))
            p.send_signal(signal.SIGHUP)
            self.wait_for(err, "reload refused", mark)
            self.assertEqual(self.ask("api.github.com")["rcodes"], {"0": 1})
            self.assertIsNone(p.poll())
        finally:
            d.stop_dnsfwd(p, err)

    def test_sighup_reloads_the_rate(self):
        self.assertEqual(self.render('allow = ["pypi.org"]\n').returncode, 0)
        p, log, err = self.t.start_dnsfwd(self.config(rate=20, burst=20))
        try:
            # REFUSED names are answered locally (no upstream wait); the rate is charged first
            r = self.ask("x.refused.example", count=5, timeout=0.5)
            self.assertEqual(r["rcodes"], {"5": 5}, r)
            self.copy(self.config(rate=0.1, burst=1), self.config_path(p))
            mark = len(self.stderr(err))
            p.send_signal(signal.SIGHUP)
            self.wait_for(err, "reloaded", mark)
            self.assertIn("rate 0.1", self.stderr(err)[mark:])
            r = self.ask("y.refused.example", count=5, timeout=0.3)
            self.assertEqual(r["answered"], 1, r)  # the new burst: one, then 0.1/s
            self.assertEqual(r["timeouts"], 4, r)
        finally:
            d.stop_dnsfwd(p, err)

    @staticmethod
    def copy(src, dst):
        with open(src) as f, open(dst, "w") as g:
            g.write(f.read())

    @staticmethod
    def config_path(p):
        return p.args[p.args.index("--config") + 1]


class BridgeRedirect(unittest.TestCase):
    """The bridge namespace's :53 (row 112): fy-dnsfwd installs, in the
    namespace of a [[listen]] with netns, a prerouting DNAT of every port 53
    to its bridge listener. A container asking a LAN host's :53, or aardvark
    on the gateway, meets fy-dnsfwd. Control: the same listener with
    redirect = false (as before this table existed): the LAN host's :53 takes
    any bytes, aardvark answers any name."""

    LISTEN = f"{d.BRIDGE_GW}:5353"

    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.t = d.DnsTopology()
        # the bridge namespace's way out, as slirp/pasta gives it: to the host,
        # which routes to the LAN
        n.veth(cls.t.bridge, ["10.88.0.2/24"], cls.t.host, ["10.88.0.1/24"])
        n.sh("ip", "-n", cls.t.bridge, "route", "add", "default", "via", "10.88.0.1")
        n.sh("ip", "-n", cls.t.host, "route", "add", "10.89.0.0/24", "via", "10.88.0.2")
        n.in_ns(cls.t.bridge, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        cls.aardvark = d.Stand(cls.t.bridge, "auth", d.BRIDGE_GW)

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def start(self, redirect):
        cfg = self.t.dnsfwd_config(listen=[(d.FWD, "", "vm"),
                                           (self.LISTEN, f"/run/netns/{self.t.bridge}", "bridge")])
        if not redirect:
            with open(cfg, "a") as f:
                f.write("redirect = false\n")
        return self.t.start_dnsfwd(cfg)

    def test_a_containers_port_53_anywhere_goes_to_the_forwarder(self):
        p, log, err = self.start(redirect=False)
        try:
            r = n.probe(self.t.ctr, 0, "tcp", d.LAN, 53)
            self.assertEqual(r["reply"], f"lan tcp {d.LAN}:53", r)  # the LAN host's :53 answers
            r = d.dnsprobe(self.t.ctr, 0, "query", d.BRIDGE_GW, "old.t.example", "--qtype", "TXT")
            self.assertEqual(r["rcodes"], {"0": 1}, r)  # aardvark answers any name
            self.assertTrue([x for x in self.aardvark.records() if x["name"] == "old.t.example"])
            self.assertEqual(d.read_log(log), [])
        finally:
            d.stop_dnsfwd(p, err)
        p, log, err = self.start(redirect=True)
        try:
            with open(err) as f:
                self.assertIn("port 53 redirected to " + self.LISTEN, f.read())
            rules = n.in_ns(self.t.bridge, "nft", "list", "table", "ip", "fy_dnsfwd_redirect").stdout
            self.assertIn(f"udp dport 53 dnat to {self.LISTEN}", rules)
            self.assertIn(f"tcp dport 53 dnat to {self.LISTEN}", rules)
            seen = len(self.t.lan_srv.records())
            r = d.dnsprobe(self.t.ctr, 0, "raw", d.LAN, "SSH-2.0-OpenSSH_9.2\r\n", "--tcp")
            self.assertEqual(r["outcome"], "closed", r)
            r = d.dnsprobe(self.t.ctr, 0, "query", d.LAN, "lan.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            self.assertEqual(r["from"], f"{d.LAN}:53", r)  # the container sees the LAN host answer
            self.assertEqual(len(self.t.lan_srv.records()), seen)  # which saw nothing
            r = d.dnsprobe(self.t.ctr, 0, "query", d.BRIDGE_GW, "new.t.example", "--qtype", "TXT")
            self.assertEqual(r["rcodes"], {"5": 1}, r)  # REFUSED by fy-dnsfwd, not aardvark
            self.assertFalse([x for x in self.aardvark.records() if x["name"] == "new.t.example"])
            lines = d.read_log(log)
            lan = [l for l in lines if l.get("name") == "lan.github.com"]
            self.assertEqual([(l["ns"], l["verdict"]) for l in lan], [("bridge", "forwarded")], lines)
            self.assertTrue(lan[0]["src"].startswith(f"{d.CTR}:"), lan)
        finally:
            d.stop_dnsfwd(p, err)
        # left in place when fy-dnsfwd stops: DNS fails closed, nothing reaches the LAN host
        r = d.dnsprobe(self.t.ctr, 0, "raw", d.LAN, "SSH-2.0-OpenSSH_9.2\r\n", "--tcp")
        self.assertIn(r["outcome"], ("refused", "closed"), r)
        self.assertEqual(len(self.t.lan_srv.records()), seen)
        # and a restart replaces the table whole: one rule each, not two
        p, log, err = self.start(redirect=True)
        d.stop_dnsfwd(p, err)
        rules = n.in_ns(self.t.bridge, "nft", "list", "table", "ip", "fy_dnsfwd_redirect").stdout
        self.assertEqual(rules.count("udp dport 53 dnat"), 1, rules)


class BridgeFollow(unittest.TestCase):
    """A [[listen]] with `follow = true` (rootless podman's bridge namespace:
    missing until the VM user's first container, torn down and made again
    after the last): fy-dnsfwd starts without it, opens its listener and
    redirect in each namespace that appears at the path, and closes them when
    it goes. Control: the same listener without `follow` refuses to start
    (exit 4: no DNS at all). The listener is the wildcard 0.0.0.0:5353, which
    `redirect to :5353` reaches on whatever address the bridge's gateway has."""

    LISTEN = "0.0.0.0:5353"

    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.t = d.DnsTopology()
        cls.path = f"/run/fyw-{n.PID}-rootless-netns"
        n.on_cleanup(lambda: os.path.exists(cls.path) and os.unlink(cls.path), f"file {cls.path}")

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def config(self, follow, extra=""):
        cfg = self.t.dnsfwd_config(listen=[(d.FWD, "", "vm"), (self.LISTEN, self.path, "bridge")],
                                   extra=extra)
        if follow:
            with open(cfg, "a") as f:
                f.write("follow = true\n")
        return cfg

    def bridge(self):
        """A bridge namespace with one container behind it, bind-mounted at
        the followed path (over whatever is mounted there): podman making
        its rootless namespace. Returns (bridge ns, container ns)."""
        br, ctr = n.netns("rl"), n.netns("rlctr")
        n.veth(ctr, [f"{d.CTR}/24"], br, [f"{d.BRIDGE_GW}/24"])
        n.sh("ip", "-n", ctr, "route", "add", "default", "via", d.BRIDGE_GW)
        if not os.path.exists(self.path):
            open(self.path, "w").close()
        n.sh("mount", "--bind", f"/run/netns/{br}", self.path)
        n.on_cleanup(lambda: n.sh("umount", self.path, check=False), f"mount {self.path}")
        return br, ctr

    def wait_err(self, err, text, count=1, timeout=5):
        deadline = time.monotonic() + timeout
        while True:
            with open(err) as f:
                got = f.read()
            if got.count(text) >= count:
                return got
            if time.monotonic() > deadline:
                self.fail(f"fy-dnsfwd did not say {text!r} {count}x within {timeout}s:\n{got}")
            time.sleep(0.02)

    def ask(self, ctr, name):
        return d.dnsprobe(ctr, 0, "query", d.BRIDGE_GW, name, timeout=20)

    def test_the_listener_follows_a_namespace_bound_in_podmans_mount_namespace(self):
        """Rootless podman binds the namespace in its pause process's mount
        namespace (never propagated here: the path is an empty file outside)
        and podman 4 names it rootless-netns-<hash> (both seen in a Debian 12
        guest, podman 4.3.1). `mount_ns_pid_file` and a final '*' follow it
        there; the control is the path alone, the spelling the boot script
        wrote before, under which the container's DNS goes unanswered."""
        base = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-pause-")
        n.on_cleanup(lambda: shutil.rmtree(base, ignore_errors=True), f"dir {base}")
        pause = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
        n.on_cleanup(lambda: (pause.kill(), pause.wait()), "the pause stand-in")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{pause.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            self.assertLess(time.monotonic(), deadline, "unshare made no mount namespace")
            time.sleep(0.01)
        pid_file = os.path.join(base, "pause.pid")
        with open(pid_file, "w") as f:
            f.write(f"{pause.pid}\n")
        name = os.path.join(base, "rootless-netns-" + os.urandom(10).hex())

        def bridge_in_pause():
            br, ctr = n.netns("rl"), n.netns("rlctr")
            n.veth(ctr, [f"{d.CTR}/24"], br, [f"{d.BRIDGE_GW}/24"])
            n.sh("ip", "-n", ctr, "route", "add", "default", "via", d.BRIDGE_GW)
            if not os.path.exists(name):
                open(name, "w").close()
            n.sh("nsenter", f"--net=/run/netns/{br}", "-t", str(pause.pid), "-m",
                 "mount", "--bind", "/proc/self/ns/net", name)
            return br, ctr

        def config(extra):
            cfg = self.t.dnsfwd_config(listen=[(d.FWD, "", "vm"), (self.LISTEN, "/x", "bridge")])
            with open(cfg) as f:
                text = f.read()
            with open(cfg, "w") as f:
                f.write(text.replace('netns = "/x"', extra) + "follow = true\n")
            return cfg

        br1, ctr1 = bridge_in_pause()
        # the control: the path alone is an empty file here, never followed
        p, log, err = self.t.start_dnsfwd(config(f'netns = "{name}"'))
        try:
            self.wait_err(err, f"waiting for the namespace {name}")
            time.sleep(1.0)
            r = self.ask(ctr1, "control.github.com")
            self.assertEqual(r["answered"], 0, r)
        finally:
            d.stop_dnsfwd(p, err)
        p, log, err = self.t.start_dnsfwd(config(
            f'netns = "{base}/rootless-netns-*"\nmount_ns_pid_file = "{pid_file}"'))
        try:
            got = self.wait_err(err, f"following the namespace {base}/rootless-netns-*")
            self.assertIn(f"at /proc/{pause.pid}/root{name}", got)
            r = self.ask(ctr1, "one.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            # torn down and made again, in the pause process's namespace only
            n.sh("nsenter", "-t", str(pause.pid), "-m", "umount", name)
            self.wait_err(err, "went away: listener closed")
            br2, ctr2 = bridge_in_pause()
            self.wait_err(err, f"following the namespace {base}/rootless-netns-*", count=2)
            r = self.ask(ctr2, "two.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            # a second name that matches: neither is guessed at
            open(os.path.join(base, "rootless-netns-other"), "w").close()
            self.wait_err(err, "not following a guess")
            lines = d.read_log(log)
            got = [(l["ns"], l["name"], l["verdict"]) for l in lines if l.get("name")]
            self.assertEqual(got, [("bridge", "one.github.com", "forwarded"),
                                   ("bridge", "two.github.com", "forwarded")], lines)
            for l in lines:
                self.assertTrue(l["src"].startswith(f"{d.CTR}:"), l)
        finally:
            d.stop_dnsfwd(p, err)

    def test_a_missing_namespace_without_follow_fails_the_start(self):
        if os.path.exists(self.path):
            self.skipTest("the followed path exists (another test's mount)")
        fd, err = tempfile.mkstemp(prefix=f"fyw-{n.PID}-dnserr-")
        os.close(fd)
        n.on_cleanup(lambda: os.unlink(err), f"log {err}")
        with open(err, "w") as ef:
            r = subprocess.run(n.nsexec(self.t.guest, d.FY_DNSFWD, "--config", self.config(False)),
                               stdout=subprocess.DEVNULL, stderr=ef, timeout=20)
        with open(err) as f:
            text = f.read()
        self.assertEqual(r.returncode, 4, text)
        self.assertIn("cannot open the namespace " + self.path, text)

    def test_the_listener_follows_the_namespace_through_teardown_and_re_creation(self):
        p, log, err = self.t.start_dnsfwd(self.config(True))
        try:
            self.wait_err(err, f"waiting for the namespace {self.path}")
            # podman makes the namespace: the listener and redirect follow
            br1, ctr1 = self.bridge()
            self.wait_err(err, f"following the namespace {self.path}")
            rules = n.in_ns(br1, "nft", "list", "table", "ip", "fy_dnsfwd_redirect").stdout
            self.assertIn("udp dport 53 redirect to :5353", rules)
            self.assertIn("tcp dport 53 redirect to :5353", rules)
            r = self.ask(ctr1, "one.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            self.assertEqual(r["from"], f"{d.BRIDGE_GW}:53", r)  # the gateway answers, as asked
            r = self.ask(ctr1, "one.t.example")
            self.assertEqual(r["rcodes"], {"5": 1}, r)  # REFUSED: not a name the policy allows
            # torn down (the last container went): the listener is closed
            n.sh("umount", self.path)
            self.wait_err(err, "went away: listener closed")
            # made again: followed again, in the new namespace
            br2, ctr2 = self.bridge()
            self.wait_err(err, f"following the namespace {self.path}", count=2)
            r = self.ask(ctr2, "two.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            # replaced without a gap (another namespace bound over it): moved
            br3, ctr3 = self.bridge()
            self.wait_err(err, "was made again: moving to the new one")
            self.wait_err(err, f"following the namespace {self.path}", count=3)
            r = self.ask(ctr3, "three.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            # the namespace it left keeps its redirect, to a closed port:
            # that bridge's DNS fails closed, it never goes where it asked
            r = d.dnsprobe(ctr2, 0, "query", d.BRIDGE_GW, "late.github.com", timeout=20)
            self.assertEqual(r["answered"], 0, r)
            self.assertEqual(r["closed"] + r["timeouts"], 1, r)
            lines = d.read_log(log)
            got = [(l["ns"], l["name"], l["verdict"]) for l in lines if l.get("name")]
            self.assertEqual(got, [("bridge", "one.github.com", "forwarded"),
                                   ("bridge", "one.t.example", "refused"),
                                   ("bridge", "two.github.com", "forwarded"),
                                   ("bridge", "three.github.com", "forwarded")], lines)
            for l in lines:
                self.assertTrue(l["src"].startswith(f"{d.CTR}:"), l)
        finally:
            d.stop_dnsfwd(p, err)

    # Holds argv[2] TCP connections to argv[1]:53 open; prints READY, then, for
    # each line read, how many of them the far end has not closed.
    HOLDER = (
        "import resource, socket, sys\n"
        "n = int(sys.argv[2])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (n + 64, n + 64))\n"
        "socks = [socket.create_connection((sys.argv[1], 53), timeout=10) for _ in range(n)]\n"
        "print('READY', flush=True)\n"
        "for line in sys.stdin:\n"
        "    alive = 0\n"
        "    for s in socks:\n"
        "        s.setblocking(False)\n"
        "        try:\n"
        "            alive += s.recv(1) != b''\n"
        "        except BlockingIOError:\n"
        "            alive += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    print(alive, flush=True)\n")
    HOLD = 1100  # with the daemon's own few, every descriptor below 1024 is taken

    def test_a_namespace_followed_past_fd_setsize_descriptors_keeps_the_daemon(self):
        """fy-dnsfwd holding more than FD_SETSIZE (1024) descriptors, TCP
        clients of its VM listener, when the followed namespace appears: its
        redirect is installed, and the daemon and every client stay.
        Control: the fy-dnsfwd before core's nft::Ctx ran libnftables with a
        descriptor table of its own died of SIGABRT there (libnftables
        select()s on its netlink socket, numbered past 1023: glibc's "*** bit
        out of range 0 - FD_SETSIZE on fd_set ***"), ending every client."""
        cfg = self.config(True, extra="max_tcp_clients = 4000\ntcp_idle_ms = 600000\n")
        p, log, err = self.t.start_dnsfwd(cfg, nofile=8192)
        hold = None
        try:
            self.wait_err(err, f"waiting for the namespace {self.path}")
            hold = n.spawn(n.nsexec(self.t.guest, n.PY, "-c", self.HOLDER, d.FWD, self.HOLD),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.assertEqual(hold.stdout.readline().strip(), "READY", "the holder did not connect")
            fds = lambda: len(os.listdir(f"/proc/{p.pid}/fd"))
            deadline = time.monotonic() + 10
            while fds() < self.HOLD and time.monotonic() < deadline:
                time.sleep(0.05)
            held = fds()
            self.assertGreater(held, self.HOLD, "fy-dnsfwd did not accept every connection")
            br, ctr = self.bridge()
            self.addCleanup(n.sh, "umount", self.path)  # the next test starts without it
            try:
                self.wait_err(err, f"following the namespace {self.path}", timeout=10)
            finally:
                with open(err) as f:
                    self.assertIsNone(p.poll(), f"fy-dnsfwd died:\n{f.read()[-2000:]}")
            rules = n.in_ns(br, "nft", "list", "table", "ip", "fy_dnsfwd_redirect").stdout
            self.assertIn("udp dport 53 redirect to :5353", rules)
            r = self.ask(ctr, "one.github.com")
            self.assertEqual(r["rcodes"], {"0": 1}, r)
            # the process's own table is untouched: every client still connected
            hold.stdin.write("count\n")
            hold.stdin.flush()
            self.assertEqual(int(hold.stdout.readline()), self.HOLD)
            self.assertGreaterEqual(fds(), held)
        finally:
            if hold is not None:
                hold.stdin.close()
                hold.wait(timeout=10)
            d.stop_dnsfwd(p, err)


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

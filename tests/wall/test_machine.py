#!/usr/bin/python3
"""The machine wall, proven in namespaces: who may reach what, as clients see it.

A guest namespace holds the walled user (uid 4242, subuid 100000-165535), root
and another user; a host namespace holds the gateway 192.168.5.2 with
listeners on band ports (41000, 41100), an off-band port (41095) and a
private resolver (53); a public namespace stands for the internet (TCP 443 and
53, UDP 53 and 443, TCP 443 over IPv6); a container namespace is forwarded by
the guest. The real `fy-wall apply machine` installs the wall.

Every refusal is checked three ways: the outcome the client sees (a reset, an
ICMP error, or the kernel refusing the send), the deny line in the kernel log,
and the listener never seeing the attempt. Every refusal has a control: the
same attempt succeeds for root, and succeeded for the walled user before the
wall existed, so a broken topology cannot pass for a working wall.
"""
import unittest

import fywnet as n

T = n.GuestTopology
U, SUB_LO, SUB_HI = n.WALLED_UID, n.SUBUID_START, n.SUBUID_START + n.SUBUID_COUNT - 1


class MachineWall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        n.set_nf_log_all_netns()
        cls.t = n.GuestTopology(container=True)
        cls.t.warm_up()
        cls.ident = n.Identity()
        # Before the wall, the walled user gets out: the control for every refusal.
        cls.before = {
            "pub443": n.probe(cls.t.guest, U, "tcp", T.PUBLIC, 443),
            "pub6": n.probe(cls.t.guest, U, "tcp", T.PUBLIC6, 443),
            "udp53": n.probe(cls.t.guest, U, "udp", T.PUBLIC, 53),
            "offband": n.probe(cls.t.guest, U, "tcp", T.GW, 41095),
            "ctr": n.probe(cls.t.ctr, 0, "tcp", T.PUBLIC, 443),
        }
        r = cls.ident.fy_wall(cls.t.guest, "apply", "machine", *n.machine_args(cls.ident))
        if r.returncode != 0:
            raise RuntimeError(f"apply failed: {r.stderr}")
        cls.log = n.KernelLog()

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    # ---- helpers ----

    def reaches(self, ns, uid, kind, host, port, reply_has):
        r = n.probe(ns, uid, kind, host, port)
        self.assertEqual(r["outcome"], "ok", f"uid {uid} -> {host}:{port} {kind}: {r}")
        self.assertIn(reply_has, r["reply"])
        return r

    def refused(self, ns, uid, kind, host, port, outcome, prefix, server, src=T.GUEST,
                timeout=2.0):
        """The attempt fails as `outcome`, the kernel logs `prefix` for it, and
        `server` never sees it."""
        seen = len(server.seen_from(src))
        self.log.mark()
        r = n.probe(ns, uid, kind, host, port, timeout=timeout)
        self.assertEqual(r["outcome"], outcome, f"uid {uid} -> {host}:{port} {kind}: {r}")
        proto = "TCP" if kind.startswith("tcp") else "UDP"
        line = self.log.wait_for(prefix + " ", f"DST={n.log_addr(host)} ",
                                 f"PROTO={proto} ", f"DPT={port} ")
        self.assertIsNotNone(line, f"no '{prefix}' line for {host}:{port}")
        self.assertEqual(len(server.seen_from(src)), seen, f"{host}:{port} saw the attempt")
        return r, line

    # ---- the control: the topology lets everything out without the wall ----

    def test_00_without_the_wall_the_walled_user_got_out(self):
        for what, r in self.before.items():
            self.assertEqual(r["outcome"], "ok", f"{what} before the wall: {r}")

    # ---- what the walled user may reach ----

    def test_walled_reaches_both_band_ports(self):
        self.reaches(self.t.guest, U, "tcp", T.GW, 41000, "host tcp 192.168.5.2:41000")
        self.reaches(self.t.guest, U, "tcp", T.GW, 41100, "host tcp 192.168.5.2:41100")

    def test_walled_reaches_the_private_resolver(self):
        self.reaches(self.t.guest, U, "udp", T.GW, 53, "host udp 192.168.5.2:53")
        self.reaches(self.t.guest, U, "tcp", T.GW, 53, "host tcp 192.168.5.2:53")

    def test_walled_reaches_loopback(self):
        srv = n.Server(self.t.guest, "guest-lo", "tcp:127.0.0.1:9999")
        self.reaches(self.t.guest, U, "tcp", "127.0.0.1", 9999, "guest-lo tcp")
        self.assertTrue(srv.seen_from("127.0.0.1"))

    # ---- what it may not ----

    def test_walled_refused_off_band_port_on_the_gateway(self):
        r, line = self.refused(self.t.guest, U, "tcp", T.GW, 41095, "refused", "fy-wall-deny",
                               self.t.host_srv)
        self.assertEqual(r["errno"], "ECONNREFUSED")  # the wall's TCP reset
        self.reaches(self.t.guest, 0, "tcp", T.GW, 41095, "host tcp 192.168.5.2:41095")

    def test_walled_refused_public_tcp_443(self):
        self.refused(self.t.guest, U, "tcp", T.PUBLIC, 443, "refused", "fy-wall-deny",
                     self.t.pub_srv)
        self.reaches(self.t.guest, 0, "tcp", T.PUBLIC, 443, "public tcp 203.0.113.10:443")

    def test_walled_refused_public_dns_resolver(self):
        r, _ = self.refused(self.t.guest, U, "udp", T.PUBLIC, 53, "eperm", "fy-wall-deny",
                            self.t.pub_srv)
        self.assertEqual(r["stage"], "send")  # the kernel refuses the datagram itself
        self.refused(self.t.guest, U, "tcp", T.PUBLIC, 53, "refused", "fy-wall-deny",
                     self.t.pub_srv)
        self.reaches(self.t.guest, 0, "udp", T.PUBLIC, 53, "public udp 203.0.113.10:53")

    def test_walled_refused_quic(self):
        self.refused(self.t.guest, U, "udp", T.PUBLIC, 443, "eperm", "fy-wall-deny",
                     self.t.pub_srv)
        self.reaches(self.t.guest, 0, "udp", T.PUBLIC, 443, "public udp 203.0.113.10:443")

    def test_walled_refused_ipv6(self):
        # ICMPv6 errors are rate-limited (1/s per destination): allow a retransmit.
        self.refused(self.t.guest, U, "tcp", T.PUBLIC6, 443, "refused", "fy-wall-deny6",
                     self.t.pub_srv, src="fd00:5::15", timeout=4.0)
        self.reaches(self.t.guest, 0, "tcp", T.PUBLIC6, 443, "public tcp [2001:db8:1::10]:443")

    # ---- status shows the refusals ----

    def test_status_prints_the_deny_lines_of_refusals(self):
        """After two refusals (source ports of their own, so their lines are
        told apart from every other test's), `status --log-lines N` prints
        both deny lines with the refused destination and port, only the
        machine wall's prefixes, and at most N lines."""
        r = n.probe(self.t.guest, U, "tcp", T.GW, 41095, "--bind-port", 40555)
        self.assertEqual(r["outcome"], "refused", r)
        r = n.probe(self.t.guest, U, "udp", T.PUBLIC, 53, "--bind-port", 40556)
        self.assertEqual(r["outcome"], "eperm", r)
        args = n.machine_args(self.ident)
        st = self.ident.fy_wall(self.t.guest, "status", "machine", *args, "--log-lines", 20)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        denied = n.status_denied(st.stdout)
        self.assertIsNotNone(denied, st.stdout)
        self.assertTrue(0 < len(denied) <= 20, st.stdout)
        self.assertRegex(st.stdout, r"denied: \d+ line\(s\) in the kernel log")
        for want in ((f"SRC={T.GUEST} DST={T.GW} ", "PROTO=TCP SPT=40555 DPT=41095 "),
                     (f"SRC={T.GUEST} DST={T.PUBLIC} ", "PROTO=UDP SPT=40556 DPT=53 ")):
            hits = [l for l in denied if l.split("] ", 1)[-1].startswith("fy-wall-deny ")
                    and all(w in l for w in want)]
            self.assertEqual(len(hits), 1, f"{want} in {denied}")
            self.assertRegex(hits[0], r"^\[ *\d+\.\d{6}\] fy-wall-deny IN= OUT=\S+ ")
        self.assertFalse([l for l in denied if "] fy-wall-deny" not in l], denied)
        # The default is 5 lines; 0 prints none.
        st = self.ident.fy_wall(self.t.guest, "status", "machine", *args)
        self.assertLessEqual(len(n.status_denied(st.stdout)), 5, st.stdout)
        st = self.ident.fy_wall(self.t.guest, "status", "machine", *args, "--log-lines", 0)
        self.assertIsNone(n.status_denied(st.stdout), st.stdout)
        self.assertEqual(st.returncode, 0, st.stdout)

    # ---- who is walled ----

    def test_subuid_is_walled_like_the_user(self):
        for uid in (SUB_LO, SUB_LO + 5, SUB_HI):
            with self.subTest(uid=uid):
                self.reaches(self.t.guest, uid, "tcp", T.GW, 41000, "host tcp")
                self.refused(self.t.guest, uid, "tcp", T.PUBLIC, 443, "refused",
                             "fy-wall-deny", self.t.pub_srv)
                self.refused(self.t.guest, uid, "udp", T.PUBLIC, 53, "eperm", "fy-wall-deny",
                             self.t.pub_srv)
                self.refused(self.t.guest, uid, "tcp", T.GW, 41095, "refused",
                             "fy-wall-deny", self.t.host_srv)

    def test_root_and_other_users_are_not_walled(self):
        for uid in (0, n.OTHER_UID, SUB_HI + 1, SUB_LO - 1):
            with self.subTest(uid=uid):
                self.reaches(self.t.guest, uid, "tcp", T.PUBLIC, 443, "public tcp")
                self.reaches(self.t.guest, uid, "udp", T.PUBLIC, 443, "public udp")
                self.reaches(self.t.guest, uid, "tcp", T.GW, 41095, "host tcp")
                self.reaches(self.t.guest, uid, "tcp", T.PUBLIC6, 443, "public tcp")

    # ---- the forward chain ----

    def test_forwarded_traffic_reaches_private_destinations_only(self):
        self.refused(self.t.ctr, 0, "tcp", T.PUBLIC, 443, "refused", "fy-wall-deny-fwd",
                     self.t.pub_srv, src=T.CTR)
        self.refused(self.t.ctr, 0, "udp", T.PUBLIC, 53, "refused", "fy-wall-deny-fwd",
                     self.t.pub_srv, src=T.CTR)
        self.reaches(self.t.ctr, 0, "tcp", T.GW, 41095, "host tcp 192.168.5.2:41095")

    # ---- the kernel's own IPv6 is not walled ----

    def test_ipv6_neighbour_discovery_passes_for_everyone_else(self):
        """The reference's ip6 table refused packets that have no user socket.
        With fy-wall's table root still reaches IPv6 after the neighbour cache
        is flushed; with the reference's exact table (the control) it does not."""
        n.sh("ip", "-n", self.t.guest, "-6", "neigh", "flush", "all")
        n.sh("ip", "-n", self.t.host, "-6", "neigh", "flush", "all")
        self.reaches(self.t.guest, 0, "tcp", T.PUBLIC6, 443, "public tcp")
        reference = n.reference_machine_wall()
        try:
            n.sh(*n.nsexec(self.t.guest, "nft", "-f", "-"), input=reference)
            n.sh("ip", "-n", self.t.guest, "-6", "neigh", "flush", "all")
            n.sh("ip", "-n", self.t.host, "-6", "neigh", "flush", "all")
            self.log.mark()
            r = n.probe(self.t.guest, 0, "tcp", T.PUBLIC6, 443, timeout=3.0)
            self.assertNotEqual(r["outcome"], "ok", "the reference's table let root's ND out?")
            self.assertIsNotNone(self.log.wait_for("fy-wall-deny", "PROTO=ICMPv6 ", "TYPE=135 "),
                                 "no neighbour solicitation refused by the reference's table")
        finally:
            r = self.ident.fy_wall(self.t.guest, "apply", "machine",
                                   *n.machine_args(self.ident))
            self.assertEqual(r.returncode, 0, r.stderr)
        n.sh("ip", "-n", self.t.guest, "-6", "neigh", "flush", "all")
        self.reaches(self.t.guest, 0, "tcp", T.PUBLIC6, 443, "public tcp")


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

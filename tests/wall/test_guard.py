#!/usr/bin/python3
"""The forwarder's guard table (ADR-0034, amended), proven in namespaces.

The guest runs the machine wall and the guard, both applied by the real
fy-wall, and a listener standing in for the forwarder on 127.42.0.1 at both
band ports, which answers with the connection's original destination
(SO_ORIGINAL_DST). The host namespace listens on the same band ports at the
gateway address, so a connection that reaches the host instead of the
stand-in is seen there.
"""
import random
import re
import subprocess
import time
import unittest

import fywnet as n

T = n.GuestTopology
U = n.WALLED_UID
SUB = n.SUBUID_START + 7


class Guard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        n.set_nf_log_all_netns()
        cls.t = n.GuestTopology()
        cls.t.warm_up()
        cls.ident = n.Identity()
        r = cls.ident.fy_wall(cls.t.guest, "apply", "machine", *n.machine_args(cls.ident))
        assert r.returncode == 0, r.stderr
        # The control: with the machine wall alone, the walled user reaches the
        # host's band port directly (the wall's own daemon-port rule).
        cls.before = n.probe(cls.t.guest, U, "tcp", T.GW, 41000)
        cls.apply_guard()
        cls.fwd = n.Server(cls.t.guest, "fwd", "fwd:127.42.0.1:41000", "fwd:127.42.0.1:41100")
        cls.log = n.KernelLog()

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    @classmethod
    def apply_guard(cls):
        r = cls.ident.fy_wall(cls.t.guest, "apply", "guard", *n.guard_args(cls.ident))
        assert r.returncode == 0, r.stderr
        return r

    def status(self, wall):
        args = n.machine_args(self.ident)
        return self.ident.fy_wall(self.t.guest, "status", wall, *args)

    def host_seen(self):
        return len(self.t.host_srv.seen_from(T.GUEST))

    def test_00_without_the_guard_the_walled_user_reached_the_host_directly(self):
        self.assertEqual(self.before["outcome"], "ok", self.before)
        self.assertEqual(self.before["reply"], "host tcp 192.168.5.2:41000")

    def test_walled_connections_go_to_the_forwarder_keeping_the_port(self):
        for uid in (U, SUB):
            for port in (41000, 41100):
                with self.subTest(uid=uid, port=port):
                    seen = self.host_seen()
                    r = n.probe(self.t.guest, uid, "tcp", T.GW, port)
                    self.assertEqual(r["outcome"], "ok", r)
                    self.assertEqual(r["reply"], f"fwd tcp 127.42.0.1:{port} "
                                                 f"orig=192.168.5.2:{port}")
                    self.assertEqual(self.host_seen(), seen, "the host saw a walled connection")

    def test_root_is_not_redirected(self):
        # The forwarder's own upstream connection, made as root, goes straight out.
        r = n.probe(self.t.guest, 0, "tcp", T.GW, 41000)
        self.assertEqual(r["reply"], "host tcp 192.168.5.2:41000", r)
        r = n.probe(self.t.guest, n.OTHER_UID, "tcp", T.GW, 41000)
        self.assertEqual(r["reply"], "host tcp 192.168.5.2:41000", r)

    def test_walled_udp_to_the_daemon_ports_is_refused_by_the_guard(self):
        self.log.mark()
        r = n.probe(self.t.guest, U, "udp", T.GW, 41000)
        self.assertEqual(r["outcome"], "eperm", r)
        self.assertIsNotNone(self.log.wait_for("fy-guard-deny ", "PROTO=UDP ", "DPT=41000 "))

    def test_status_prints_the_guards_deny_line(self):
        """A walled datagram to a daemon port, refused by the guard, appears in
        `status guard --log-lines N` with its destination and port, and only
        the guard's prefix does."""
        # A source port of this run's own: the kernel log keeps an earlier
        # run's line for the same datagram.
        spt = random.randrange(40100, 41000)
        r = n.probe(self.t.guest, U, "udp", T.GW, 41100, "--bind-port", spt)
        self.assertEqual(r["outcome"], "eperm", r)
        st = self.ident.fy_wall(self.t.guest, "status", "guard", *n.guard_args(self.ident),
                                "--log-lines", 20)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        denied = n.status_denied(st.stdout)
        self.assertIsNotNone(denied, st.stdout)
        self.assertTrue(0 < len(denied) <= 20, st.stdout)
        hits = [l for l in denied if "] fy-guard-deny " in l and
                f"SRC={T.GUEST} DST={T.GW} " in l and f"PROTO=UDP SPT={spt} DPT=41100 " in l]
        self.assertEqual(len(hits), 1, denied)
        self.assertFalse([l for l in denied if "] fy-guard-deny " not in l], denied)

    def test_a_direct_connection_made_before_the_guard_is_cut(self):
        """A reject in any base chain is final: the machine wall accepts the
        established flow, the guard's reject still resets it."""
        r = self.ident.fy_wall(self.t.guest, "remove", "guard")
        self.assertEqual(r.returncode, 0, r.stderr)
        try:
            srv = n.Server(self.t.host, "hold", f"hold:{T.GW}:41001")
            h = n.spawn(n.nsexec(self.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}",
                                 "--clear-groups", n.PY, n.PROBE, "hold", T.GW, 41001,
                                 "--timeout", "3", "--payload", "after-guard"),
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            first = h.stdout.readline()
            self.assertIn('"connected"', first)
            self.assertIn("hold tcp 192.168.5.2:41001", first)
        finally:
            self.apply_guard()
        self.log.mark()
        h.stdin.write("go\n")
        h.stdin.flush()
        after = h.stdout.readline()
        h.wait(timeout=10)
        self.assertIn('"reset"', after)
        self.assertIsNotNone(self.log.wait_for("fy-guard-deny ", "PROTO=TCP ", "DPT=41001 "))
        self.assertFalse([r for r in srv.records() if r.startswith("data ")],
                         "data sent after the guard reached the host")

    def test_an_ownerless_reply_that_conntrack_lost_is_not_routed_to_the_host(self):
        """A walled connection's TIME_WAIT socket answers as no user: its ACK
        or RST matches no uid rule and no policy route, so routing sends it to
        the host and only conntrack's NAT redirects it. Built exactly: a
        redirected connection closed into TIME_WAIT, its conntrack entry
        deleted (as expiry, eviction or a replaced entry would leave it), and a
        segment from the gateway's port reaching the socket (injected, exempt
        from conntrack). The control, the guard without its drop rules: the
        socket's ACK reaches the host. The guard: dropped, `fy-guard-drop`."""
        srv = n.Server(self.t.guest, "fwdhold", "hold:127.42.0.1:41002")
        n.sh(*n.nsexec(self.t.host, "nft", "-f", "-"), input=(
            "table inet fyw_obs_stray {\n chain pre {\n"
            "  type filter hook prerouting priority -400; policy accept;\n"
            f"  ip saddr {T.GUEST} tcp dport 41002 counter\n }}\n}}\n"))
        n.sh(*n.nsexec(self.t.guest, "nft", "-f", "-"), input=(
            "table ip fyw_inject {\n chain raw {\n"
            "  type filter hook output priority raw; policy accept;\n"
            "  meta mark 0x4747 notrack\n }\n}\n"))

        def reached_host():
            out = n.in_ns(self.t.host, "nft", "list", "table", "inet", "fyw_obs_stray").stdout
            return int(re.search(r"counter packets (\d+)", out).group(1))

        def lost_connection():
            """Returns the walled client's port and how many of its packets
            reached the host after its conntrack entry was deleted."""
            accepted = len(srv.records())
            r = n.probe(self.t.guest, U, "tcp", T.GW, 41002)
            self.assertEqual(r["reply"], "fwdhold tcp 127.42.0.1:41002", r)
            rec = srv.records()[accepted]
            port = int(re.search(rf"from {re.escape(T.GUEST)}:(\d+)", rec).group(1))
            deadline = time.monotonic() + 5
            while f":{port} " not in n.in_ns(self.t.guest, "ss", "-Htan", "state",
                                             "time-wait").stdout:
                self.assertLess(time.monotonic(), deadline, "no TIME_WAIT socket")
                time.sleep(0.05)
            n.conntrack_flush(self.t.guest)
            before = reached_host()
            n.inject_tcp(self.t.guest, T.GW, 41002, T.GUEST, port, 0x4747)
            time.sleep(0.5)
            return port, reached_host() - before

        text = self.ident.fy_wall(None, "render", "guard", *n.guard_args(self.ident)).stdout
        control = "\n".join(l for l in text.splitlines()
                            if "fy-guard-drop" not in l and "meta skuid 0-" not in l)
        self.assertEqual(len(text.splitlines()) - len(control.splitlines()), 3)  # 1 + 2 bands
        # The machine wall's ownerless chain drops the same packet (it is a new
        # flow no user socket opened): this proof is of the guard alone, so the
        # machine wall runs without that chain's jump, as it was.
        machine = self.ident.fy_wall(None, "render", "machine", *n.machine_args(self.ident)).stdout
        self.assertIn("\t\tjump ownerless\n", machine)
        n.sh(*n.nsexec(self.t.guest, "nft", "-f", "-"),
             input=machine.replace("\t\tjump ownerless\n", ""))
        try:
            n.sh(*n.nsexec(self.t.guest, "nft", "-f", "-"), input=control + "\n")
            _, leaked = lost_connection()
            self.assertEqual(leaked, 1, "the control cannot show the reply: the proof is void")
            self.apply_guard()
            self.log.mark()
            port, leaked = lost_connection()
            self.assertEqual(leaked, 0, "a walled connection's reply reached the host")
            self.assertIsNotNone(self.log.wait_for("fy-guard-drop ", f"SPT={port} ",
                                                   "DPT=41002 "))
        finally:
            r = self.ident.fy_wall(self.t.guest, "apply", "machine", *n.machine_args(self.ident))
            self.assertEqual(r.returncode, 0, r.stderr)
            n.in_ns(self.t.guest, "nft", "delete", "table", "ip", "fyw_inject", check=False)
            n.in_ns(self.t.host, "nft", "delete", "table", "inet", "fyw_obs_stray", check=False)
            self.apply_guard()

    def test_without_the_policy_routes_the_redirect_fails_closed(self):
        try:
            for _ in range(8):
                n.sh("ip", "-n", self.t.guest, "rule", "del", "priority", "4747", check=False)
            st = self.ident.fy_wall(self.t.guest, "status", "guard", *n.guard_args(self.ident))
            self.assertEqual(st.returncode, 1, st.stdout)
            self.assertIn("policy rule MISSING", st.stdout)
            seen = self.host_seen()
            fwd = len(self.fwd.records())
            self.log.mark()
            r = n.probe(self.t.guest, U, "tcp", T.GW, 41000)
            self.assertEqual(r["outcome"], "refused", r)
            # The redirected SYN still carries the original interface, which is
            # not lo: the machine wall refuses it.
            self.assertIsNotNone(self.log.wait_for("fy-wall-deny ", "DST=127.42.0.1 ",
                                                   "DPT=41000 "))
            self.assertEqual(self.host_seen(), seen)
            self.assertEqual(len(self.fwd.records()), fwd)
        finally:
            self.apply_guard()
        st = self.ident.fy_wall(self.t.guest, "status", "guard", *n.guard_args(self.ident))
        self.assertEqual(st.returncode, 0, st.stdout)

    def test_without_the_guard_table_the_routes_fail_closed(self):
        try:
            n.in_ns(self.t.guest, "nft", "delete", "table", "ip", "fy_guard")
            seen = self.host_seen()
            fwd = len(self.fwd.records())
            r = n.probe(self.t.guest, U, "tcp", T.GW, 41000, timeout=1.5)
            self.assertNotEqual(r["outcome"], "ok", r)
            self.assertEqual(self.host_seen(), seen)
            self.assertEqual(len(self.fwd.records()), fwd)
        finally:
            self.apply_guard()

    def test_the_guard_leaves_the_machine_wall_untouched(self):
        before = n.in_ns(self.t.guest, "nft", "-s", "list", "table", "inet", "fy_wall").stdout
        before6 = n.in_ns(self.t.guest, "nft", "-s", "list", "table", "ip6", "fy_wall6").stdout
        try:
            self.assertEqual(self.ident.fy_wall(self.t.guest, "remove", "guard").returncode, 0)
            self.apply_guard()
            self.apply_guard()
        finally:
            self.apply_guard()
        self.assertEqual(
            n.in_ns(self.t.guest, "nft", "-s", "list", "table", "inet", "fy_wall").stdout, before)
        self.assertEqual(
            n.in_ns(self.t.guest, "nft", "-s", "list", "table", "ip6", "fy_wall6").stdout,
            before6)
        st = self.status("machine")
        self.assertEqual(st.returncode, 0, st.stdout)

    def test_status_remove_and_foreign_rules(self):
        args = n.guard_args(self.ident)
        st = self.ident.fy_wall(self.t.guest, "status", "guard", *args)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertIn("table ip fy_guard: PRESENT, as rendered", st.stdout)
        self.assertIn("policy routes: 4 rule(s) at priority 4747 and the lo route, as rendered",
                      st.stdout)
        try:
            # A rule at the guard's priority and table that its config does not
            # render: status names it, apply removes it.
            n.sh("ip", "-n", self.t.guest, "rule", "add", "priority", "4747", "uidrange",
                 "5000-5000", "to", T.GW, "ipproto", "tcp", "dport", "41000-41089",
                 "lookup", "4747")
            st = self.ident.fy_wall(self.t.guest, "status", "guard", *args)
            self.assertEqual(st.returncode, 1, st.stdout)
            self.assertIn("policy rule EXTRA", st.stdout)
            self.assertIn("uidrange 5000-5000", st.stdout)
            self.apply_guard()
            st = self.ident.fy_wall(self.t.guest, "status", "guard", *args)
            self.assertEqual(st.returncode, 0, st.stdout)
            rm = self.ident.fy_wall(self.t.guest, "remove", "guard")
            self.assertEqual(rm.returncode, 0, rm.stderr)
            self.assertIn("removed ip fy_guard; 4 policy rule(s) and 1 route(s) deleted",
                          rm.stdout)
            self.assertNotIn("4747:", n.sh("ip", "-n", self.t.guest, "rule").stdout)
            st = self.ident.fy_wall(self.t.guest, "status", "guard", *args)
            self.assertEqual(st.returncode, 1)
            self.assertIn("table ip fy_guard: ABSENT", st.stdout)
            rm = self.ident.fy_wall(self.t.guest, "remove", "guard")
            self.assertIn("nothing to remove", rm.stdout)
        finally:
            self.apply_guard()


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

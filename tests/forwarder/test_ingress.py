#!/usr/bin/env python3
"""The stamp's `net` is the interface a connection arrived on (issue 19).

Two bridges with a container on each (fyf_topology.py). The bridge listener
binds 0.0.0.0, so a container can dial another bridge's gateway address on the
forwarder's port instead of the proxy URL; the forwarder used to name `net`
after the interface holding the address dialled, so the client chose it. Now
`net` is the ingress interface the kernel recorded in the accepted socket, and
a connection whose source the ingress interface does not route is refused (400
`Fy-Forwarder-Refusal: ingress`, `refused_ingress`, a log line), not stamped.

Proves: each container dialling the other bridge's gateway directly is stamped
with its own bridge and address (or refused; never the other bridge), as are
its own gateway and the proxy URL, also where the listener is bound to one
bridge's address (the redirect then DNATs every bridge's connections to it); a
source address of the other bridge's
subnet (or of no bridge) on a container's link is refused and never reaches
the proxy; the bridge namespace itself (the bridges' own addresses as source)
is refused. Each of these fails against the forwarder before issue 19.
"""

import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import GATEWAY, ORIGIN, PROXY_PORT, Rig, get  # noqa: E402

RIG = None


def setUpModule():
    global RIG
    RIG = Rig("ing", containers=(("podman1", 1), ("podman2", 1)))
    RIG.__enter__()


def tearDownModule():
    if RIG:
        RIG.__exit__(None, None, None)


def gateway_of(bridge):
    n = [b for b, _ in RIG.topo.nets].index(bridge)
    return "10.89.%d.1" % RIG.topo.nets[n][1]


class Ingress(unittest.TestCase):
    def fetch(self, i, path, connect, **kw):
        target = "http://%s/%s" % (ORIGIN, path)
        res = RIG.client(i, get(target), connect=connect, **kw)[0]
        self.assertTrue(res["ok"], res)  # answered, not reset or unreachable
        return target, res

    def assert_refused(self, target, res, before):
        self.assertEqual(res.get("status"), 400, res)
        self.assertIn("Fy-Forwarder-Refusal: ingress\r\n", res["response"])
        self.assertIn("fy-forwarder refused this connection", res["response"])
        self.assertFalse([r for r in RIG.proxy_rows() if r.get("target") == target],
                         "a refused connection reached the proxy")
        self.assertEqual(RIG.topo.stats().get("refused_ingress", 0) - before, 1)

    def assert_own_stamp(self, target, res, i):
        _, ip, bridge = RIG.topo.containers[i]
        self.assertEqual(res.get("status"), 200, res)
        row = RIG.proxy_row_for(target)
        self.assertEqual(row["stamp_status"], "valid", row)
        self.assertEqual(row.get("cpp_status"), "valid", row)
        self.assertEqual((row["stamp"]["src"], row["stamp"]["net"]), (ip, bridge), row)

    def test_dialling_the_other_bridges_gateway_names_the_own_bridge(self):
        for i, (_, ip, bridge) in enumerate(RIG.topo.containers):
            other = [b for b, _ in RIG.topo.nets if b != bridge][0]
            with self.subTest(container=i, dials=other):
                before = RIG.topo.stats().get("refused_ingress", 0)
                target, res = self.fetch(i, "cross-%d" % i, "%s:%d" % (gateway_of(other),
                                                                      PROXY_PORT))
                if res.get("status") == 400:
                    self.assert_refused(target, res, before)
                else:
                    self.assert_own_stamp(target, res, i)
            with self.subTest(container=i, dials=bridge):
                target, res = self.fetch(i, "own-%d" % i, "%s:%d" % (gateway_of(bridge),
                                                                    PROXY_PORT))
                self.assert_own_stamp(target, res, i)
            with self.subTest(container=i, dials="the proxy URL"):
                target, res = self.fetch(i, "url-%d" % i, "%s:%d" % (GATEWAY, PROXY_PORT))
                self.assert_own_stamp(target, res, i)

    def test_a_listener_bound_to_one_address_names_the_arrival_bridge(self):
        # [bridge] listen = podman1's address: the forwarder's redirect is
        # `dnat to 10.89.0.1` for every bridge, so the destination names
        # podman1 for podman2's container too. The ingress interface does not.
        RIG.fwd.stop()
        cfg = RIG.topo.forwarder_config(RIG.key_file).replace('listen = "0.0.0.0"',
                                                             'listen = "10.89.0.1"')
        self.assertIn('listen = "10.89.0.1"', cfg)
        try:
            RIG.fwd = RIG.topo.start_forwarder(cfg, name="bound")
            for i in range(len(RIG.topo.containers)):
                with self.subTest(container=i):
                    target, res = self.fetch(i, "bound-%d" % i, None)
                    self.assert_own_stamp(target, res, i)
        finally:
            RIG.fwd.stop()
            RIG.start_forwarder(name="after-bound")

    def test_a_source_the_ingress_link_does_not_route_is_refused(self):
        # Container 0 (podman1) holds a second address, and the bridge
        # namespace routes it back over podman1: the shape of a container that
        # took an address of podman2's subnet (it would need NET_ADMIN), or of
        # no bridge at all. Its connection arrives on podman1 with a source
        # podman1 does not hold: refused, counted, logged, never stamped.
        ns, _, bridge = RIG.topo.containers[0]
        for addr in ("10.89.1.77", "10.123.0.5"):
            with self.subTest(source=addr):
                RIG.topo.nsexec(ns, "ip", "addr", "add", addr + "/32", "dev", "eth0")
                RIG.topo.nsexec(RIG.topo.rl, "ip", "route", "add", addr + "/32", "dev", bridge)
                try:
                    before = RIG.topo.stats().get("refused_ingress", 0)
                    target, res = self.fetch(0, "spoof-%s" % addr, None,
                                             pre=["--bind", addr])
                    self.assert_refused(target, res, before)
                    self.assertRegex(res["response"], r"arrived on %s \(10\.89\.0\.1/24[,)].*"
                                     r"whose networks do not hold its source address %s;" % (
                                         bridge, re.escape(addr)))
                    deadline = time.monotonic() + 5
                    while "refused (ingress)" not in RIG.fwd.log() and \
                            time.monotonic() < deadline:
                        time.sleep(0.05)
                    self.assertIn("%s:" % addr, RIG.fwd.log())
                    self.assertIn("refused (ingress)", RIG.fwd.log())
                finally:
                    RIG.topo.nsexec(RIG.topo.rl, "ip", "route", "del", addr + "/32",
                                    check=False)
                    RIG.topo.nsexec(ns, "ip", "addr", "del", addr + "/32", "dev", "eth0",
                                    check=False)
        # The container's own address is still stamped as before.
        target, res = self.fetch(0, "spoof-after", None)
        self.assert_own_stamp(target, res, 0)

    def test_the_bridge_namespace_itself_is_not_stamped(self):
        # A process in the rootless namespace (not a container) dialling a
        # bridge address: the kernel reports the link that holds the address,
        # and the source is that link's own address.
        for bridge, _ in RIG.topo.nets:
            with self.subTest(bridge=bridge):
                before = RIG.topo.stats().get("refused_ingress", 0)
                target, res = self.fetch(0, "local-%s" % bridge, "%s:%d" % (
                    gateway_of(bridge), PROXY_PORT), ns=RIG.topo.rl)
                self.assert_refused(target, res, before)
                self.assertIn("bridge namespace's own address", res["response"])


if __name__ == "__main__":
    unittest.main(verbosity=2)

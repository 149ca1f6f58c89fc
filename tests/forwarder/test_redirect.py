#!/usr/bin/env python3
"""The forwarder's own redirect in the rootless bridge namespace (ADR-0034: "the
forwarder's table redirects gateway-port traffic to it").

Podman re-creates the rootless namespace after every teardown, so a redirect put
there once cannot last; fy-forwarder installs `table ip fy_forwarder_redirect` in
every namespace it follows, before the namespace counts as served. Proves:

  - the table is there once the forwarder serves, with one rule (the gateway's
    daemon ports redirected, port kept), and a container's request goes through;
  - re-following the same namespace (restarts, a kill -9) leaves exactly one
    table with one rule, and a copy edited by hand is replaced whole;
  - a namespace re-made with nothing in it gets the table, and its first
    connection succeeds;
  - when the table cannot be installed (another program owns one of that name),
    the namespace is not served: the probe fails and says why, the hook holds
    the container and says why, nothing reaches the proxy, the log has the
    error; once the obstacle goes, the forwarder installs it and serves;
  - with [bridge] redirect = false the forwarder leaves the namespace's
    nftables alone, and a redirect installed by something else (the old path)
    carries the traffic.
"""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import (FORWARDER, GATEWAY, HOOK, ORIGIN, PROXY_PORT, TOKEN_PORT, Rig,  # noqa: E402
                      answer_budget_ms, get)

TABLE = "fy_forwarder_redirect"
RULE = "ip daddr %s tcp dport { %d, %d } redirect" % (GATEWAY, PROXY_PORT, TOKEN_PORT)


def nft(topo, *args, check=True):
    return topo.nsexec(topo.rl, "nft", *args, check=check)


def tables(topo):
    return [l.strip() for l in nft(topo, "list", "tables").stdout.splitlines() if l.strip()]


def rules(topo):
    """The rule lines of our table's chain (nft's own listing)."""
    out = nft(topo, "list", "table", "ip", TABLE).stdout
    return [l.strip() for l in out.splitlines()
            if l.strip() and not l.strip().startswith(("table ", "chain ", "type ", "}"))]


class Redirect(unittest.TestCase):
    def assert_one_table(self, topo):
        self.assertEqual(tables(topo).count("table ip %s" % TABLE), 1, tables(topo))
        self.assertEqual(rules(topo), [RULE], nft(topo, "list", "ruleset").stdout)

    def fetch(self, rig, path):
        res = rig.client(0, get("http://%s/%s" % (ORIGIN, path)))[0]
        self.assertEqual(res.get("status"), 200, res)
        row = rig.proxy_row_for("http://%s/%s" % (ORIGIN, path))
        self.assertEqual(row["stamp_status"], "valid", row)
        self.assertEqual(row["stamp"]["src"], rig.topo.containers[0][1])

    def test_installed_once_and_replaced_whole_on_every_refollow(self):
        with Rig("rdr1", containers=(("podman1", 1),)) as rig:
            t = rig.topo
            self.assertIn("redirect installed (table ip %s)" % TABLE, rig.fwd.log())
            self.assert_one_table(t)
            self.assertNotIn("table ip fyf_redirect", tables(t))  # nothing else redirects
            self.fetch(rig, "first")
            # Restarts (and a kill -9) follow the same namespace again.
            for i in range(3):
                rig.fwd.stop()
                rig.start_forwarder(name="again-%d" % i)
                self.assert_one_table(t)
            rig.fwd.kill9()
            rig.start_forwarder(name="after-kill")
            self.assert_one_table(t)
            # Someone adds a rule of their own to our chain: the next install
            # makes the table exactly the forwarder's again.
            nft(t, "add", "rule", "ip", TABLE, "prerouting", "tcp", "dport", "9", "accept")
            self.assertEqual(len(rules(t)), 2)
            rig.fwd.stop()
            rig.start_forwarder(name="healed")
            self.assert_one_table(t)
            self.fetch(rig, "after-restarts")

    def test_a_namespace_remade_with_nothing_in_it_gets_the_redirect(self):
        with Rig("rdr2", containers=(("podman1", 1),)) as rig:
            t = rig.topo
            sock = os.path.join(t.path("state"), "control.sock")
            # Made while the forwarder is stopped: nothing at all in it.
            rig.fwd.stop()
            t.destroy_rootless()
            t.make_rootless()
            # (fyf_way_out is the topology's stand-in for the VM's walls.)
            self.assertEqual(tables(t), ["table ip fyf_way_out"],
                             "the re-made namespace is not empty")
            rig.start_forwarder(name="fresh")
            self.assert_one_table(t)
            self.fetch(rig, "fresh")
            # And re-made under a running forwarder, as podman does: the hook
            # returns only once the new namespace has the table.
            for i in range(5):
                t.destroy_rootless()
                t.make_rootless()
                h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", "5000"], input="{}",
                                   capture_output=True, text=True, timeout=15)
                self.assertEqual(h.returncode, 0, h.stderr)
                self.assert_one_table(t)
                self.fetch(rig, "remade-%d" % i)

    def test_cannot_install_fails_closed_then_recovers(self):
        with Rig("rdr3", containers=(("podman1", 1),), forwarder=False) as rig:
            t = rig.topo
            sock = os.path.join(t.path("state"), "control.sock")
            # A table of that name owned by another program (flags owner): the
            # kernel refuses every change to it by anyone else.
            owner = subprocess.Popen(["ip", "netns", "exec", t.rl, "nft", "-i"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True)
            try:
                owner.stdin.write("add table ip %s { flags owner; }\n" % TABLE)
                owner.stdin.flush()
                deadline = time.monotonic() + 5
                while "table ip %s" % TABLE not in tables(t) and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertIn("table ip %s" % TABLE, tables(t))
                started = time.monotonic()
                fwd = t.start_forwarder(t.forwarder_config(rig.key_file), wait=False)
                rig.fwd = fwd
                status = t.wait_status(fwd, lambda s: "redirect could not be installed" in s)
                self.assertTrue(status.startswith("fail "), status)
                self.assertIn("bridge=not-listening:netns=", status)
                p = subprocess.run([FORWARDER, "--probe", "--control", sock],
                                   capture_output=True, text=True, timeout=10)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn("Operation not permitted", p.stdout)
                budget = answer_budget_ms(sock, 600)
                h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", str(budget)],
                                   input="{}", capture_output=True, text=True,
                                   timeout=10 + budget / 1000)
                self.assertEqual(h.returncode, 1, h.stderr)
                self.assertIn("the redirect could not be installed", h.stderr)
                self.assertIn("container is not started", h.stderr)
                res = rig.client(0, get("http://%s/blocked" % ORIGIN), timeout=2)[0]
                self.assertEqual(res.get("error"), "ECONNREFUSED", res)  # no redirect: the walls
                self.assertEqual(rig.proxy_rows(), [])
                log = fwd.log()
                self.assertIn("cannot install the redirect (table ip %s)" % TABLE, log)
                self.assertIn("set [bridge] redirect = false", log)
                # Retried, and logged at most once a second however often it is.
                lines = log.count("cannot install the redirect")
                self.assertLessEqual(lines, int(time.monotonic() - started) + 2, log)
            finally:
                owner.stdin.close()  # its socket closes: the owned table goes with it
                owner.wait(timeout=10)
            t.wait_status(rig.fwd, lambda s: s.startswith("ok ") and "bridge=listening" in s,
                          timeout=5)
            self.assert_one_table(t)
            self.fetch(rig, "recovered")

    def test_redirect_off_leaves_the_namespace_alone(self):
        # The old path: something else (here the topology) installs the redirect.
        with Rig("rdr4", containers=(("podman1", 1),), preinstall_redirect=True,
                 fwd_kw={"redirect": False}) as rig:
            t = rig.topo
            self.assertEqual(sorted(tables(t)), ["table ip fyf_redirect", "table ip fyf_way_out"])
            self.assertNotIn("redirect installed", rig.fwd.log())
            self.fetch(rig, "old-path")


if __name__ == "__main__":
    unittest.main(verbosity=2)

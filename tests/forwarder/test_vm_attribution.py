#!/usr/bin/env python3
"""The VM listener attributes each connection by its owner's cgroup, with real
cgroups (cgroup2, /sys/fs/cgroup/unified), real uids and sock_diag.

Clients in the VM namespace, each moved into its cgroup and switched to a
walled uid before connecting: a process in libpod-<id>.scope is that
container; the outermost libpod scope wins when scopes nest; one in
crun-buildah-x.scope is a build step; one in a plain cgroup is the VM user; a
"pasta" helper is refused; a socket of a non-walled uid is recorded by uid.
Both attribution paths are run: the BPF recorder and the /proc walk, also with
10,000 sockets held open by a walled process. The same through the wall's
redirect (DNAT of the gateway's port to 127.42.0.1, port kept).
"""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import FORWARDER, GATEWAY, ORIGIN, PROXY_PORT, Rig, get  # noqa: E402
from fyf_topology import VM_ADDR, VM_LISTEN  # noqa: E402

POD = "0123456789abcdef" * 4
POD_OUTER = "fedcba9876543210" * 4
POD_INNER = "00112233445566778899aabbccddeeff" * 2

HOLDER = r"""
import socket, sys, os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
os.setgroups([]); os.setgid(1000); os.setuid(1000)
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(int(sys.argv[2]))]
print("holding", len(socks), flush=True)
sys.stdin.readline()
"""


class VmAttribution(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rig = Rig("vma", containers=(), forwarder=False)
        cls.rig.__enter__()
        t = cls.rig.topo
        cls.cg = {
            "pod": t.cgroup("libpod-%s.scope" % POD),
            "nested": t.cgroup("user.slice", "libpod-%s.scope" % POD_OUTER,
                               "libpod-%s.scope" % POD_INNER),
            "build": t.cgroup("user.slice", "crun-buildah-x.scope"),
            "plain": t.cgroup("plain.scope"),
        }

    @classmethod
    def tearDownClass(cls):
        cls.rig.__exit__(None, None, None)

    def cases(self):
        return [
            # (name, cgroup, uid, comm, expected who or an HTTP status)
            ("container", self.cg["pod"], 100123, None, "container:" + POD),
            ("nested", self.cg["nested"], 100500, None, "container:" + POD_OUTER),
            ("build", self.cg["build"], 1000, None, "build:crun-buildah-x.scope"),
            ("user", self.cg["plain"], 1000, None, "user"),
            ("pasta", self.cg["plain"], 1000, "pasta", 403),
            ("root", self.cg["plain"], 0, None, "uid:0"),
            ("other", self.cg["plain"], 4242, None, "uid:4242"),
        ]

    def run_cases(self, mode, connect, src, tag):
        rig = self.rig
        for name, cg, uid, comm, want in self.cases():
            with self.subTest(mode=mode, case=name):
                target = "http://%s/%s-%s-%s" % (ORIGIN, tag, mode, name)
                pre = ["--cgroup", cg, "--uid", str(uid)] + (["--comm", comm] if comm else [])
                res = rig.client(0, get(target), ns=rig.topo.vm, connect=connect, pre=pre)[0]
                self.assertTrue(res["ok"], res)
                if isinstance(want, int):
                    self.assertEqual(res["status"], want, res)
                    self.assertIn("pasta helper", res["response"])
                    time.sleep(0.1)
                    self.assertFalse([r for r in rig.proxy_rows() if r.get("target") == target])
                    continue
                self.assertEqual(res["status"], 200, res)
                row = rig.proxy_row_for(target)
                self.assertEqual(row["stamp_status"], "valid", row)
                self.assertEqual(row["cpp_status"], "valid", row)
                self.assertEqual(row["stamp"]["who"], want)
                self.assertEqual(row["stamp"]["net"], "host")
                self.assertEqual(row["stamp"]["src"], src)

    def start(self, mode, **kw):
        if self.rig.fwd:
            self.rig.fwd.stop()
        self.rig.start_forwarder(name="fwd-" + mode, bridge=False, vm=True, attribution=mode, **kw)
        status = self.rig.topo.control("status")
        self.assertIn("attribution=%s" % mode, status)
        return status

    def check_path_used(self, mode, before):
        after = self.rig.topo.stats()
        walled = sum(1 for c in self.cases() if c[2] in (1000, 100123, 100500))
        used = after["attrib_" + mode] - before["attrib_" + mode]
        self.assertGreaterEqual(used, walled - 1, after)  # pasta is refused before counting
        return after

    def test_a_second_forwarder_cannot_join_the_listeners_group(self):
        # With several workers each port is an SO_REUSEPORT group, which a
        # second process of the same uid could join and take a share of the
        # connections with its own key. A second forwarder (its own state_dir,
        # so the pid check does not stop it) must fail to start instead.
        self.start("bpf")
        t = self.rig.topo
        cfg = t.forwarder_config(self.rig.key_file, bridge=False, vm=True).replace(
            'state_dir = "%s"' % t.path("state"), 'state_dir = "%s"' % t.path("state-2"))
        path = t.path("second.toml")
        with open(path, "w") as f:
            f.write(cfg)
        r = subprocess.run(["ip", "netns", "exec", t.vm, FORWARDER, "--config", path],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("the VM listener cannot listen", r.stderr)
        self.assertIn("Address already in use", r.stderr)
        # The first one still takes every connection, stamped with its key.
        before = t.stats()
        target = "http://%s/after-second" % ORIGIN
        pre = ["--cgroup", self.cg["plain"], "--uid", "1000"]
        for _ in range(8):
            res = self.rig.client(0, get(target), ns=t.vm,
                                  connect="%s:%d" % (VM_LISTEN, PROXY_PORT), pre=pre)[0]
            self.assertEqual(res["status"], 200, res)
        self.assertEqual(t.stats()["accepted"] - before["accepted"], 8)
        rows = [r for r in self.rig.proxy_rows() if r.get("target") == target]
        self.assertEqual(len(rows), 8)
        self.assertTrue(all(r["stamp_status"] == "valid" and r["stamp"]["who"] == "user"
                            for r in rows), rows)

    def test_bpf_attribution(self):
        self.start("bpf")
        before = self.rig.topo.stats()
        self.run_cases("bpf", "%s:%d" % (VM_LISTEN, PROXY_PORT), "127.0.0.1", "direct")
        after = self.check_path_used("bpf", before)
        self.assertEqual(after["attrib_proc"], before["attrib_proc"])
        self.assertEqual(after["attrib_refused_pasta"] - before["attrib_refused_pasta"], 1)

    def test_proc_attribution(self):
        self.start("proc")
        before = self.rig.topo.stats()
        self.run_cases("proc", "%s:%d" % (VM_LISTEN, PROXY_PORT), "127.0.0.1", "direct")
        self.check_path_used("proc", before)

    def test_through_the_walls_redirect(self):
        # What fy-wall does for the walled uids: their connections to the gateway's
        # daemon ports go to the VM listener, keeping the port.
        rules = ("table ip fyf_wall {\n chain out {\n  type nat hook output priority -100;\n"
                 "  meta skuid { 1000, 100000-165535 } ip daddr %s tcp dport %d "
                 "dnat ip to %s\n }\n}\n" % (GATEWAY, PROXY_PORT, VM_LISTEN))
        subprocess.run(["ip", "netns", "exec", self.rig.topo.vm, "nft", "-f", "-"], input=rules,
                       text=True, check=True, timeout=10)
        try:
            for mode in ("bpf", "proc"):
                self.start(mode)
                before = self.rig.topo.stats()
                rig = self.rig
                for name, cg, uid, want in [("container", self.cg["pod"], 100123,
                                             "container:" + POD),
                                            ("build", self.cg["build"], 1000,
                                             "build:crun-buildah-x.scope"),
                                            ("user", self.cg["plain"], 1000, "user")]:
                    target = "http://%s/redirect-%s-%s" % (ORIGIN, mode, name)
                    res = rig.client(0, get(target), ns=rig.topo.vm,
                                     connect="%s:%d" % (GATEWAY, PROXY_PORT),
                                     pre=["--cgroup", cg, "--uid", str(uid)])[0]
                    self.assertEqual(res.get("status"), 200, res)
                    row = rig.proxy_row_for(target)
                    self.assertEqual(row["stamp"]["who"], want, row)
                    self.assertEqual(row["stamp"]["src"], VM_ADDR, row)
                after = self.rig.topo.stats()
                self.assertEqual(after["accepted"] - before["accepted"], 3)
        finally:
            subprocess.run(["ip", "netns", "exec", self.rig.topo.vm, "nft", "delete", "table", "ip",
                            "fyf_wall"], check=False, timeout=10)

    def test_with_10000_sockets_open(self):
        holder = subprocess.Popen(["nsenter", "--net=/run/netns/" + self.rig.topo.vm, "--",
                                   "python3", "-c", HOLDER, self.cg["plain"], "10000"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.assertIn("holding 10000", holder.stdout.readline())
            costs = {}
            for mode in ("bpf", "proc"):
                self.start(mode)
                before = self.rig.topo.stats()
                n = 0
                for i in range(5):
                    target = "http://%s/10k-%s-%d" % (ORIGIN, mode, i)
                    res = self.rig.client(0, get(target), ns=self.rig.topo.vm,
                                          connect="%s:%d" % (VM_LISTEN, PROXY_PORT),
                                          pre=["--cgroup", self.cg["pod"], "--uid", "100123"])[0]
                    self.assertEqual(res.get("status"), 200, res)
                    self.assertEqual(self.rig.proxy_row_for(target)["stamp"]["who"],
                                     "container:" + POD)
                    n += 1
                after = self.rig.topo.stats()
                costs[mode] = (after["attrib_us_total"] - before["attrib_us_total"]) / n
                self.assertEqual(after["attrib_" + mode] - before["attrib_" + mode], n)
            print("\nattribution with 10,000 sockets open: bpf %.0f us, proc walk %.0f us per "
                  "connection (mean of 5)" % (costs["bpf"], costs["proc"]))

            # A deadline shorter than the walk: a 503 that says so, nothing
            # at the proxy, and the lookup's late answer changes nothing.
            self.assertGreater(costs["proc"], 20000, "the walk is too fast to outlast 10 ms")
            self.start("proc", attribution_timeout_ms=10)
            before = self.rig.topo.stats()
            target = "http://%s/10k-deadline" % ORIGIN
            res = self.rig.client(0, get(target), ns=self.rig.topo.vm,
                                  connect="%s:%d" % (VM_LISTEN, PROXY_PORT),
                                  pre=["--cgroup", self.cg["pod"], "--uid", "100123"])[0]
            self.assertEqual(res.get("status"), 503, res)
            self.assertIn("Fy-Forwarder-Refusal: attribution", res["response"])
            self.assertIn("could not tell within 10 ms who made this connection", res["response"])
            time.sleep(0.5)  # past the walk's own end
            after = self.rig.topo.stats()
            self.assertEqual(after["attrib_timeouts"] - before["attrib_timeouts"], 1, after)
            self.assertEqual(after["stamped"] - before["stamped"], 0, after)
            self.assertEqual(after["active"], 0, after)
            self.assertFalse([r for r in self.rig.proxy_rows() if r.get("target") == target])
            self.assertIn("not attributed within 10 ms", self.rig.fwd.log())
        finally:
            holder.kill()
            holder.wait(timeout=10)


if __name__ == "__main__":
    unittest.main(verbosity=2)

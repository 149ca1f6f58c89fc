#!/usr/bin/python3
"""The host wall, proven with real cgroup v2 processes in a namespace.

A namespace stands for the Linux host: loopback listeners on the project's
band (41000, 41199) and off it (42000), and a veth to a "public" namespace
(TCP 443 and 53, UDP 53 and 443, TCP 443 over IPv6). The VM's processes are
real processes moved into a real cgroup v2 slice (fyw-<pid>-.../
fy-machine-test.slice under the cgroup2 mount) before they make their sockets.
The real `fy-wall apply host` installs the per-VM table, resolving the slice
through its own private cgroup2 mount (this host is hybrid: /sys/fs/cgroup is
not cgroup2).
"""
import os
import unittest

import fywnet as n

PUB, PUB6 = "203.0.113.10", "2001:db8:2::10"


class HostWall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.ns = n.netns("hw")
        cls.pub = n.netns("hwpub")
        n.veth(cls.ns, ["203.0.113.1/24", "2001:db8:2::1/64"],
               cls.pub, ["203.0.113.10/24", "2001:db8:2::10/64"])
        cls.base = f"fyw-{n.PID}-hw"
        cls.slice_rel = f"{cls.base}/fy-machine-test.slice"
        cls.slice = n.cgroup(cls.slice_rel)
        cls.sibling = n.cgroup(f"{cls.base}/other.slice")
        cls.lo_srv = n.Server(cls.ns, "lo", "tcp:127.0.0.1:41000", "tcp:127.0.0.1:41199",
                              "tcp:127.0.0.1:42000")
        cls.pub_srv = n.Server(cls.pub, "public", f"tcp:{PUB}:443", f"tcp:{PUB}:53",
                               f"udp:{PUB}:53", f"udp:{PUB}:443", f"tcp:[{PUB6}]:443")
        # A listener of the VM itself (inside its slice), off the band.
        cls.vm_srv = n.Server(cls.ns, "vm", "tcp:127.0.0.1:42001", cgroup=cls.slice)
        for _ in range(30):  # IPv6 neighbour discovery settles
            if n.probe(cls.ns, 0, "tcp", PUB6, 443, timeout=1)["outcome"] == "ok":
                break
        cls.ident = n.Identity()
        cls.before = {
            "offband": cls.vm(cls, "tcp", "127.0.0.1", 42000),
            "pub443": cls.vm(cls, "tcp", PUB, 443),
        }
        cls.args = ["--vm", "test", "--cgroup", cls.slice_rel, "--ports", "41000-41199"]
        r = cls.ident.fy_wall(cls.ns, "apply", "host", *cls.args)
        assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def vm(self, kind, host, port, **kw):
        return n.probe(self.ns, 0, kind, host, port, cgroup=self.slice, **kw)

    def outside(self, kind, host, port, cgroup=None):
        return n.probe(self.ns, 0, kind, host, port, cgroup=cgroup)

    def ok(self, r, reply):
        self.assertEqual(r["outcome"], "ok", r)
        self.assertIn(reply, r["reply"])

    def test_00_without_the_wall_the_vm_got_out(self):
        self.ok(self.before["offband"], "lo tcp 127.0.0.1:42000")
        self.ok(self.before["pub443"], "public tcp")

    def test_vm_reaches_its_band_on_loopback(self):
        self.ok(self.vm("tcp", "127.0.0.1", 41000), "lo tcp 127.0.0.1:41000")
        self.ok(self.vm("tcp", "127.0.0.1", 41199), "lo tcp 127.0.0.1:41199")

    def test_vm_reaches_dns(self):
        self.ok(self.vm("udp", PUB, 53), "public udp")
        self.ok(self.vm("tcp", PUB, 53), "public tcp")

    def test_vm_reaches_its_own_listeners(self):
        self.ok(self.vm("tcp", "127.0.0.1", 42001), "vm tcp 127.0.0.1:42001")

    def test_vm_refused_off_band_loopback(self):
        seen = len(self.lo_srv.seen_from("127.0.0.1", "127.0.0.1:42000"))
        r = self.vm("tcp", "127.0.0.1", 42000)
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(len(self.lo_srv.seen_from("127.0.0.1", "127.0.0.1:42000")), seen)

    def test_vm_refused_everything_else_outside(self):
        seen = len(self.pub_srv.records())
        self.assertEqual(self.vm("tcp", PUB, 443)["outcome"], "refused")
        r = self.vm("udp", PUB, 443)
        self.assertEqual(r["outcome"], "eperm", r)
        r = self.vm("tcp", PUB6, 443, timeout=4.0)
        self.assertEqual(r["outcome"], "refused", r)  # the inet table's TCP reset
        self.assertEqual(len(self.pub_srv.records()), seen, self.pub_srv.records()[seen:])

    def test_processes_outside_the_slice_are_unaffected(self):
        for where in (None, self.sibling):
            with self.subTest(cgroup=where):
                self.ok(self.outside("tcp", "127.0.0.1", 42000, where), "lo tcp")
                self.ok(self.outside("tcp", PUB, 443, where), "public tcp")
                self.ok(self.outside("udp", PUB, 443, where), "public udp")
                self.ok(self.outside("tcp", PUB6, 443, where), "public tcp")
                self.ok(self.outside("tcp", "127.0.0.1", 42001, where), "vm tcp")

    def test_status_counts_the_refusals(self):
        self.vm("tcp", "127.0.0.1", 42000)
        self.vm("tcp", PUB, 443)
        st = self.ident.fy_wall(self.ns, "status", "host", *self.args)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertIn("table inet fy_host_wall_test: PRESENT, as rendered", st.stdout)
        counts = [l for l in st.stdout.splitlines() if l.startswith("refused (")]
        self.assertEqual(len(counts), 4, st.stdout)
        self.assertTrue(any("the VM's output" in l and "packets 0 " not in l for l in counts))
        self.assertTrue(any("loopback input" in l and "packets 0 " not in l for l in counts))

    def test_a_missing_slice_is_refused(self):
        r = self.ident.fy_wall(self.ns, "apply", "host", "--vm", "absent", "--cgroup",
                               f"{self.base}/absent.slice", "--ports", "41000-41199")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"the cgroup '{self.base}/absent.slice' does not exist", r.stderr)
        self.assertIn("start the VM's slice first", r.stderr)

    def test_a_recreated_slice_needs_a_reapply_and_status_says_so(self):
        rel = f"{self.base}/fy-machine-stale.slice"
        path = n.cgroup(rel)
        args = ["--vm", "stale", "--cgroup", rel, "--ports", "41000-41199"]
        self.assertEqual(self.ident.fy_wall(self.ns, "apply", "host", *args).returncode, 0)
        self.assertEqual(self.ident.fy_wall(self.ns, "status", "host", *args).returncode, 0)
        os.rmdir(path)
        os.mkdir(path)  # same path, new cgroup id: the rule no longer matches it
        st = self.ident.fy_wall(self.ns, "status", "host", *args)
        self.assertEqual(st.returncode, 1, st.stdout)
        self.assertIn("DIFFERS", st.stdout)
        self.assertEqual(self.ident.fy_wall(self.ns, "apply", "host", *args).returncode, 0)
        self.assertEqual(self.ident.fy_wall(self.ns, "status", "host", *args).returncode, 0)
        r = self.ident.fy_wall(self.ns, "remove", "host", "--vm", "stale")
        self.assertIn("removed inet fy_host_wall_stale", r.stdout)


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

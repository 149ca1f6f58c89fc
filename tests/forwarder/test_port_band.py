#!/usr/bin/env python3
"""A whole port band served from two `[[port]] ports = "LO-HI"` tables, as
fy-machine's boot provisioning writes them (docs/fy-machine.md): the wall
admits every worktree offset 0..89, its proxy port base+offset (stamped) and
its token minter base+100+offset (relayed byte for byte), so the forwarder
must listen on all 180, in the bridge namespace it follows and in the VM
namespace.

With base 42600 (the topology's PROXY_PORT, its minter TOKEN_PORT): a
container dialling the gateway's base+7 and base+89 (the band's last proxy
port) through the forwarder's redirect reaches a proxy stand-in listening
there, stamped with its own address and bridge, verified by the Python and
the C++ verifier; base+107 reaches a token service there unparsed and
unstamped, byte for byte; a walled VM process dialling the VM listener's
base+7 is stamped as the VM user; the redirect is one rule whose set holds
the two bands as intervals; a port past the band is not listened on; the
namespace torn down and re-made twice (the new listener made while the old
one still holds its 360 sockets and spares), the band is served again.

Fails against the forwarder before the band (a `ports` key was refused, so
nothing started; and with the two `port` tables the provisioning wrote then,
base+7 and base+107 had no listener), and the re-made namespace against the
forwarder before libnftables ran with a descriptor table of its own (now core's
nft::Ctx, core/nft.h; it aborted in libnftables: "bit out of range 0 -
FD_SETSIZE on fd_set").
"""

import errno
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import GATEWAY, ORIGIN, PROXY_PORT, STAMP_TOOL, TOKEN_PORT, Rig, get  # noqa: E402
from fyf_topology import VM_LISTEN  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = PROXY_PORT
assert TOKEN_PORT == BASE + 100
PROXY_BAND = "%d-%d" % (BASE, BASE + 89)
MINTER_BAND = "%d-%d" % (BASE + 100, BASE + 189)
BAND = list(range(BASE, BASE + 90)) + list(range(BASE + 100, BASE + 190))

RIG = None


def setUpModule():
    global RIG
    RIG = Rig("15pb", containers=(("podman1", 1),), ports=BAND,
              fwd_kw=dict(vm=True, port_ranges=[(PROXY_BAND, True), (MINTER_BAND, False)]))
    RIG.__enter__()
    t = RIG.topo
    RIG.extra = {}
    try:
        # Stand-ins on offsets of the band: the worktrees' proxies and a minter.
        for off in (7, 89):
            log = t.path("proxy-%d.jsonl" % off)
            p = t.start_in_host(
                ["python3", os.path.join(HERE, "recording_proxy.py"), "--listen",
                 "%s:%d" % (GATEWAY, BASE + off), "--key", RIG.key_file, "--log", log,
                 "--cpp-verifier", STAMP_TOOL], name="proxy-%d" % off)
            t.wait_listening(t.host, GATEWAY, BASE + off, proc=p)
            RIG.extra[BASE + off] = log
        log = t.path("token-107.jsonl")
        p = t.start_in_host(
            ["python3", os.path.join(HERE, "recording_origin.py"), "--listen",
             "%s:%d" % (GATEWAY, BASE + 107), "--log", log], name="token-107")
        t.wait_listening(t.host, GATEWAY, BASE + 107, proc=p)
        RIG.extra[BASE + 107] = log
        RIG.plain = t.cgroup("plain.scope")
    except BaseException:
        RIG.__exit__(None, None, None)
        raise


def tearDownModule():
    RIG.__exit__(None, None, None)


def row_for(log, target):
    rows = [r for r in RIG.wait_rows(log, 1) if r.get("target") == target]
    if not rows:
        rows = [r for r in RIG.rows(log) if r.get("target") == target]
    return rows


class PortBand(unittest.TestCase):
    def test_a_a_container_reaches_an_offset_proxy_port_stamped(self):
        for off in (7, 89):
            with self.subTest(offset=off):
                target = "http://%s/band-%d" % (ORIGIN, off)
                res = RIG.client(0, get(target), connect="%s:%d" % (GATEWAY, BASE + off))[0]
                self.assertTrue(res["ok"], res)
                self.assertEqual(res["status"], 200, res)
                rows = row_for(RIG.extra[BASE + off], target)
                self.assertEqual(len(rows), 1, RIG.rows(RIG.extra[BASE + off]))
                row = rows[0]
                self.assertEqual(row["stamp_status"], "valid", row)
                self.assertEqual(row["cpp_status"], "valid", row)
                self.assertEqual(row["stamp"]["src"], RIG.topo.containers[0][1])
                self.assertEqual(row["stamp"]["net"], "podman1")
                # It went to its own port's proxy, not to the band's first one.
                self.assertFalse([r for r in RIG.proxy_rows() if r.get("target") == target])

    def test_b_an_offset_minter_port_is_relayed_byte_for_byte(self):
        # Not canonical, with a client-written stamp: a stamped port would refuse
        # it (400); a minter port passes it on untouched and adds nothing.
        req = (b"get /computeMetadata/v1/token?wt=7 HTTP/1.1\r\nMetadata-Flavor: Google\r\n"
               b"fy-stamp: client-written, not ours to judge here\r\n\r\n")
        res = RIG.client(0, req, connect="%s:%d" % (GATEWAY, BASE + 107), timeout=3)[0]
        self.assertTrue(res["ok"], res)
        rows = RIG.wait_rows(RIG.extra[BASE + 107], 1)
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual(rows[0]["request_line"], "get /computeMetadata/v1/token?wt=7 HTTP/1.1")
        self.assertEqual(rows[0]["headers"], ["Metadata-Flavor: Google",
                                              "fy-stamp: client-written, not ours to judge here"])
        self.assertFalse(RIG.rows(RIG.token_log), "nothing reached the band's first minter")

    def test_c_the_vm_listener_serves_the_band_too(self):
        target = "http://%s/band-vm-7" % ORIGIN
        pre = ["--cgroup", RIG.plain, "--uid", "1000"]
        res = RIG.client(0, get(target), ns=RIG.topo.vm, connect="%s:%d" % (VM_LISTEN, BASE + 7),
                         pre=pre)[0]
        self.assertTrue(res["ok"], res)
        self.assertEqual(res["status"], 200, res)
        row = row_for(RIG.extra[BASE + 7], target)[0]
        self.assertEqual(row["stamp_status"], "valid", row)
        self.assertEqual(row["stamp"]["who"], "user")
        self.assertEqual(row["stamp"]["net"], "host")

    def test_d_one_redirect_rule_and_the_listeners_name_the_bands(self):
        r = subprocess.run(["ip", "netns", "exec", RIG.topo.rl, "nft", "list", "table", "ip",
                            "fy_forwarder_redirect"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        rules = [l.strip() for l in r.stdout.splitlines() if "dport" in l]
        self.assertEqual(rules, ["ip daddr %s tcp dport { %s, %s } redirect" % (
            GATEWAY, PROXY_BAND, MINTER_BAND)], r.stdout)
        status = RIG.topo.control("status")
        self.assertIn("vm=listening:%s:%s,%s " % (VM_LISTEN, PROXY_BAND, MINTER_BAND), status)
        self.assertIn("bridge=listening:netns=", status)

    def test_e_only_the_band_is_listened_on(self):
        # Refused (ECONNREFUSED) means no listener. A listened port may still end
        # in a reset at once (nothing on the host at base+45 or base+145: the
        # forwarder's dial is refused), which a non-blocking connect can report.
        for port, want in ((BASE + 90, False), (BASE + 99, False), (BASE + 190, False),
                           (BASE + 45, True), (BASE + 145, True)):
            with self.subTest(port=port):
                r = subprocess.run(
                    ["ip", "netns", "exec", RIG.topo.vm, "python3", "-c",
                     "import socket\ns=socket.socket(); s.settimeout(2)\n"
                     "print(s.connect_ex((%r,%d)))" % (VM_LISTEN, port)],
                    capture_output=True, text=True, timeout=30)
                self.assertEqual(int(r.stdout) != errno.ECONNREFUSED, want, (port, r.stdout))

    def test_f_the_band_survives_the_namespace_re_made(self):
        # A new namespace's listener (180 ports x 2 workers) is made before the
        # old one closes: past 1024 descriptors, where libnftables' select()
        # on its socket aborted the forwarder when it installed the redirect.
        t = RIG.topo
        for cycle in range(2):
            with self.subTest(cycle=cycle):
                before = t.control("status").split("bridge=listening:netns=", 1)[1].split()[0]
                t.destroy_rootless()
                t.make_rootless()
                status = t.wait_status(RIG.fwd, lambda s: "bridge=listening:netns=" in s and
                                       s.split("bridge=listening:netns=", 1)[1].split()[0] != before,
                                       timeout=10)
                self.assertTrue(status.startswith("ok "), status)
                target = "http://%s/band-refollow-%d" % (ORIGIN, cycle)
                res = RIG.client(0, get(target), connect="%s:%d" % (GATEWAY, BASE + 7))[0]
                self.assertTrue(res["ok"], res)
                self.assertEqual(res["status"], 200, res)
                self.assertEqual(row_for(RIG.extra[BASE + 7], target)[0]["stamp_status"], "valid")
        self.assertTrue(RIG.fwd.alive(), RIG.fwd.log()[-2000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)

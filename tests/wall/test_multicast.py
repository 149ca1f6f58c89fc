#!/usr/bin/python3
"""Kernel-sent packets whose bytes a walled process chooses (issue 26, part 3):
multicast membership reports.

A membership (IP_ADD_SOURCE_MEMBERSHIP, MCAST_JOIN_SOURCE_GROUP, ...) makes the
kernel send IGMPv3 and MLDv2 reports from a timer, with no socket: they meet
the machine wall's ownerless chain, which admits IGMP and MLD at TTL/hop limit
1 (the kernel's own), and carry the group and every source address the
caller chose. fy-novsock's second BPF-LSM program (socket_setsockopt) refuses
every membership option to the walled uids, so no report names anything a
walled process chose.

In the wall tests' topology, under fy-wall's machine wall, a walled uid joins
232.1.2.3 with four sources and ff3e::4242:1 with one, whose bytes spell
"fy-chosen-bytes!", and 239.102.121.45 without sources; a capture on the link
peer (the host namespace's end of the guest's veth) decodes the reports.
Without fy-novsock's new program (the control, and fy-novsock as on main) the
joins succeed and the capture sees the chosen sources; with it each option
fails with EPERM and the capture sees none of them, while a uid that is not
walled still joins and is reported (the capture works meanwhile).

The program is attached machine-wide, so it is keyed on a uid of this test's
own (2,000,000 + pid), one of the walled user's subuids in its subuid file:
other tests' uid 4242 is never touched. Its pins live in a bpffs of a private
mount namespace held by a helper process: when the helper dies, even by
SIGKILL of this test, the pins go and the programs detach.
"""
import json
import os
import re
import subprocess
import time
import unittest

import fywnet as n

T = n.GuestTopology
MCAST = os.path.join(n.HERE, "mcast.py")
NOVSOCK = os.path.join(n.BUILD, "wall", "novsock", "fy-novsock")
MUID = 2_000_000 + n.PID   # walled: a subuid of the walled user, in fy-novsock's ranges
OTHER = MUID + 1           # not walled
SOURCES4 = ["102.121.45.99", "104.111.115.101", "110.45.98.121", "116.101.115.33"]
SOURCE6 = "6679:2d63:686f:7365:6e2d:6279:7465:7321"


def dev_with(ns, addr):
    out = n.in_ns(ns, "ip", "-o", "-4", "addr", "show").stdout
    for line in out.splitlines():
        if f" {addr}/" in line:
            return line.split()[1]
    raise RuntimeError(f"no device holds {addr} in {ns}: {out}")


class Membership(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        n.set_nf_log_all_netns()
        cls.t = n.GuestTopology()
        cls.t.warm_up()
        cls.ident = n.Identity()
        with open(cls.ident.subuid, "w") as f:
            f.write(f"{n.WALLED_NAME}:{n.SUBUID_START}:{n.SUBUID_COUNT}\n"
                    f"{n.WALLED_NAME}:{MUID}:1\n")
        r = cls.ident.fy_wall(cls.t.guest, "apply", "machine", *n.machine_args(cls.ident))
        if r.returncode != 0:
            raise RuntimeError(f"apply failed: {r.stderr}")
        cls.guest_dev = dev_with(cls.t.guest, T.GUEST)
        cls.host_dev = dev_with(cls.t.host, T.GW)
        cls.pins = None

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    @classmethod
    def attach(cls):
        """fy-novsock applied for MUID, pinned in a private bpffs."""
        if cls.pins:
            return cls.pins
        mnt = f"/tmp/fyw-{n.PID}-bpffs"
        os.makedirs(mnt, exist_ok=True)
        n.on_cleanup(lambda: os.rmdir(mnt), f"dir {mnt}")
        script = (f'mount -t bpf bpf "{mnt}" && "{NOVSOCK}" apply --uids {MUID} '
                  f'--pin-dir "{mnt}/fy" && "{NOVSOCK}" status --pin-dir "{mnt}/fy" && '
                  'echo READY && exec sleep 3600')
        p = n.spawn(["setpriv", "--pdeathsig", "KILL", "unshare", "-m", "--propagation",
                     "private", "sh", "-c", script], stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True)
        lines = []
        while True:
            line = p.stdout.readline()
            if not line:
                text = "".join(lines)
                if "the kernel refused the programs: Operation not permitted" in text:
                    # This machine's kernel (a microVM's) loads no BPF-LSM program,
                    # fy-novsock's socket_create one included; guest_wall runs
                    # the same rows in the qemu guest (Debian's kernel).
                    raise unittest.SkipTest("skipped: this kernel refuses BPF-LSM programs "
                                            "(fy-novsock: " + text.strip().splitlines()[-1] +
                                            "); tests/guest's guest_wall proves the closure")
                raise RuntimeError(f"fy-novsock did not attach: {text}")
            lines.append(line)
            if line.strip() == "READY":
                break
        cls.pins = (p, mnt, "".join(lines))
        return cls.pins

    def joined(self, uid):
        """Joins as `uid` in the guest while the host end of the veth is
        captured; returns (what each option answered, what the capture saw)."""
        cap = subprocess.Popen(n.nsexec(self.t.host, n.PY, MCAST, "capture", self.host_dev, 4),
                               stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        j = n.sh(*n.nsexec(self.t.guest, "setpriv", f"--reuid={uid}", f"--regid={uid}",
                           "--clear-groups", n.PY, MCAST, "join", self.guest_dev, T.GUEST, 2.5),
                 timeout=30)
        out, _ = cap.communicate(timeout=30)
        return json.loads(j.stdout.strip().splitlines()[-1]), json.loads(out)

    @staticmethod
    def chosen(seen):
        """The reports naming a chosen group or source."""
        return [r for r in seen["reports"]
                if set(r["sources"]) & set(SOURCES4 + [SOURCE6])
                or r["group"] in ("232.1.2.3", "ff3e::4242:1", "239.102.121.45")]

    def test_1_without_the_program_the_reports_carry_chosen_bytes(self):
        """The control: the walled uid's joins are reported with its sources."""
        answers, seen = self.joined(MUID)
        self.assertEqual(set(answers.values()), {"ok"}, answers)
        sources = {s for r in seen["reports"] for s in r["sources"]}
        self.assertTrue(set(SOURCES4) <= sources, seen)
        self.assertIn(SOURCE6, sources, seen)
        self.assertTrue(seen["marker"], "the chosen bytes are on the link")

    def test_2_with_the_program_no_report_carries_them(self):
        p, mnt, out = self.attach()
        self.assertRegex(out, rf"refused to uids {MUID}; refused 0 socket\(s\) and 0 membership")
        answers, seen = self.joined(MUID)
        self.assertEqual(set(answers.values()), {"EPERM"}, answers)
        self.assertEqual(self.chosen(seen), [], seen)
        self.assertFalse(seen["marker"], "chosen bytes reached the link")
        st = n.sh("nsenter", f"--mount=/proc/{p.pid}/ns/mnt", NOVSOCK, "status", "--pin-dir",
                  f"{mnt}/fy")
        m = re.search(r"and (\d+) membership change", st.stdout)
        self.assertIsNotNone(m, st.stdout)
        self.assertGreaterEqual(int(m.group(1)), 6, st.stdout)

    def test_3_a_uid_that_is_not_walled_still_joins(self):
        """The program keys on the walled uids only, and the capture works
        while it is attached."""
        self.attach()
        answers, seen = self.joined(OTHER)
        self.assertEqual(set(answers.values()), {"ok"}, answers)
        self.assertTrue(set(SOURCES4) <= {s for r in seen["reports"] for s in r["sources"]}, seen)


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

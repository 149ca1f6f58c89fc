#!/usr/bin/python3
"""Every subordinate id the walled user can map is walled (issue 26, part 1).

Parity: core/subid (what fy-wall, fy-novsock and the boot provisioning wall)
is held to shadow's own newuidmap and newgidmap (package uidmap, setuid root),
run as the walled user in a mount namespace where /etc/passwd, /etc/subuid and
/etc/subgid are the test's: for each file below and each request around its
lines' edges, newuidmap accepts a mapping exactly when the reader says the ids
are the user's (or the request is the user's own id alone). A file the reader
refuses (a grant of id 0) is one where newuidmap maps root.

End to end, in the wall tests' topology (fywnet.GuestTopology): with
/etc/subuid holding a zero-count first line, a second line by name and a third
by uid, the walled user makes a user namespace mapped by the real newuidmap,
becomes an id of the third range (kernel uid 300011) and of the second
(100011), and tries a public address on TCP and UDP. Before the wall both get
out (the control); under fy-wall both are refused and logged. Under fy-wall as
on main (13429fd) they got out: it walled the first line only, and a first
line with COUNT 0 walled no subuid at all. `fy-wall status` names a range the
live wall does not cover and exits 1.
"""
import json
import os
import unittest

import fywnet as n

T = n.GuestTopology
U, NAME, ALIAS = n.WALLED_UID, n.WALLED_NAME, n.WALLED_ALIAS
USERNS = os.path.join(n.HERE, "userns.py")
SUBID_PROBE = os.path.join(n.BUILD, "tests", "wall", "subid_probe")
MAX_ID = 4294967294

# /etc/subuid texts: comments, blank lines, zero counts, overflow, duplicates,
# shared uids, number syntax, ignored lines. Each is tried whole.
PARITY_CASES = [
    f"{NAME}:100000:65536\n{NAME}:300000:65536\n",
    f"{NAME}:100000:65536\n{U}:300000:65536\n",
    f"{NAME}:100000:0\n{NAME}:300000:65536\n",
    f"{ALIAS}:500000:10\n",
    f"# {NAME}:1:1\n\n{NAME}:100000:10\r\n{NAME}:200000:10\n",
    f"{NAME}:0x186a0:0x10\n{NAME}:0400000:8\n",
    f"{NAME}: 100000:+10\n{NAME}:200000 :10\n{NAME}:300000:10:junk\n",
    f"+{NAME}:100000:10\n-{NAME}:200000:10\n{NAME}::5\n:300000:5\n{NAME}:300000\n",
    f"{NAME}:100000:10\n{NAME}:100010:10\n{NAME}:100000:10\n",
    f"{NAME}:4294967290:100\n",
    f"{NAME}:5:18446744073709551612\n{NAME}:200000:-1\n",
    f"{NAME}:100000:-100000\n",
    f"0{U}:100000:10\n {U}:200000:10\nsomeoneelse:300000:10\n",
    # shadow's 1024-byte line buffer: a 1024-byte line is ignored, a 1023-byte one read.
    f"{NAME}:100000:10:" + " " * 1005 + "\n" + f"{NAME}:200000:10:" + " " * 1004 + "\n",
    f"{NAME}:0:0\n",
    f"{NAME}:0:5\n",
]
GID_CASES = PARITY_CASES[:4]


def ids_of(ranges_text):
    out = []
    for item in filter(None, ranges_text.strip().split(",")):
        lo, _, hi = item.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def within(ranges, lo, count):
    """Every id of lo..lo+count-1 is in the union of `ranges`."""
    at, end = lo, lo + count - 1
    for a, b in sorted(ranges):
        if a <= at <= b:
            at = b + 1
        if at > end:
            return True
    return at > end


def requests_for(text):
    """Mapping requests around the edges of each line's numbers."""
    reqs = {(0, 1), (1, 1), (U, 1), (99999, 1), (100000, 1), (100009, 1), (100010, 1),
            (100000, 20), (165535, 1), (165536, 1), (300000, 1), (365535, 1), (365536, 1),
            (MAX_ID, 1), (4000000000, 1), (100000, 65536), (300000, 65536), (500009, 1)}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 3:
            continue
        try:
            start, count = int(parts[1].strip(), 0), int(parts[2].strip(), 0)
        except ValueError:
            continue
        for v in (start - 1, start, start + max(count, 1) - 1, start + count):
            if 0 <= v <= MAX_ID:
                reqs.add((v, 1))
        if 0 < count < 1 << 20 and start + count - 1 <= MAX_ID:
            reqs.add((start, count))
    return sorted(reqs)


class Parity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        if not os.path.exists("/usr/bin/newuidmap"):
            raise unittest.SkipTest("skipped: no /usr/bin/newuidmap (apt-get install uidmap)")
        cls.ident = n.Identity()
        cls.files = os.path.join(cls.ident.dir, "subid")

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def check(self, kind, text):
        with open(self.files, "w") as f:
            f.write(text)
        os.chmod(self.files, 0o644)
        etc = f"/etc/sub{kind}"
        binds = ((self.files, etc),)
        r = self.ident.run_as_system(None, SUBID_PROBE, kind, NAME, etc, binds=binds)
        refused = r.returncode != 0
        if refused:
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("id 0 (root)", r.stderr)
        ranges = [] if refused else ids_of(r.stdout)
        reqs = requests_for(text)
        t = self.ident.run_as_system(
            None, "setpriv", f"--reuid={U}", f"--regid={U}", "--clear-groups",
            n.PY, USERNS, "try", kind, *[f"{lo}:{c}" for lo, c in reqs], binds=binds,
            timeout=120)
        self.assertEqual(t.returncode, 0, t.stderr)
        accepted = json.loads(t.stdout)
        for (lo, count), ok in zip(reqs, accepted):
            if refused:
                continue
            want = within(ranges, lo, count) or (count == 1 and lo == U)
            self.assertEqual(ok, want, f"new{kind}map {lo} {count} with {text!r}: "
                                       f"{'accepted' if ok else 'refused'}, reader: {ranges}")
        if refused:
            # The reader refuses only a grant of id 0, which newuidmap honours.
            self.assertTrue(accepted[reqs.index((0, 1))],
                            f"{text!r}: refused by the reader, but newuidmap maps no root")
        return ranges, accepted

    def test_newuidmap_maps_exactly_what_the_reader_returns(self):
        for text in PARITY_CASES:
            with self.subTest(text=text[:60]):
                self.check("uid", text)

    def test_newgidmap_maps_exactly_what_the_reader_returns(self):
        for text in GID_CASES:
            with self.subTest(text=text[:60]):
                self.check("gid", text)

    def test_the_cases_say_something(self):
        """The parity cases are not vacuous: newuidmap accepts the second
        range of the two-line file and the uid-keyed line, and maps root for
        COUNT 0 at START 0."""
        ranges, _ = self.check("uid", PARITY_CASES[1])
        self.assertEqual(ranges, [(100000, 165535), (300000, 365535)])
        ranges, _ = self.check("uid", PARITY_CASES[2])
        self.assertEqual(ranges, [(300000, 365535)])
        ranges, _ = self.check("uid", PARITY_CASES[3])
        self.assertEqual(ranges, [(500000, 500009)])


class EndToEnd(unittest.TestCase):
    # A zero-count first line, a second line by name, a third by uid.
    SUBUID = f"{NAME}:100000:0\n{NAME}:100000:65536\n{U}:300000:65536\n"
    UID_MAP = "0 4242 1 1 100000 65536 65537 300000 65536"
    GID_MAP = "0 4242 1 1 100000 65536"
    # Namespace uid -> kernel uid: 12 -> 100011 (second line), 65548 -> 300011 (third).
    INNER = {100011: 12, 300011: 65548}

    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        if not os.path.exists("/usr/bin/newuidmap"):
            raise unittest.SkipTest("skipped: no /usr/bin/newuidmap (apt-get install uidmap)")
        n.set_nf_log_all_netns()
        cls.t = n.GuestTopology()
        cls.t.warm_up()
        cls.ident = n.Identity()
        with open(cls.ident.subuid, "w") as f:
            f.write(cls.SUBUID)
        cls.subgid = os.path.join(cls.ident.dir, "subgid")
        with open(cls.subgid, "w") as f:
            f.write(f"{NAME}:100000:65536\n")
        os.chmod(cls.subgid, 0o644)
        cls.binds = ((cls.ident.subuid, "/etc/subuid"), (cls.subgid, "/etc/subgid"))
        cls.before = {(k, kind): cls.mapped(k, kind, T.PUBLIC, 443)
                      for k in cls.INNER for kind in ("tcp", "udp")}
        r = cls.ident.fy_wall(cls.t.guest, "apply", "machine", *n.machine_args(cls.ident))
        if r.returncode != 0:
            raise RuntimeError(f"apply failed: {r.stderr}")
        cls.apply_out = r.stdout
        cls.log = n.KernelLog()

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    @classmethod
    def mapped(cls, kuid, kind, host, port):
        """probe.py as kernel uid `kuid`, reached through the walled user's
        user namespace as newuidmap maps it."""
        r = cls.ident.run_as_system(
            cls.t.guest, "setpriv", f"--reuid={U}", f"--regid={U}", "--clear-groups",
            n.PY, USERNS, "exec", "--uid-map", cls.UID_MAP, "--gid-map", cls.GID_MAP,
            "--become", cls.INNER[kuid], "--", n.PY, n.PROBE, kind, host, port,
            "--timeout", "2", binds=cls.binds, timeout=30)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise RuntimeError(f"no probe result: rc={r.returncode} {r.stdout!r} {r.stderr!r}")

    def test_the_control_got_out_before_the_wall(self):
        for key, r in self.before.items():
            with self.subTest(key=key):
                self.assertEqual(r["outcome"], "ok", r)
                self.assertIn("public", r["reply"])

    def test_every_range_is_walled_on_tcp_and_udp(self):
        for kuid in self.INNER:
            for kind, outcome in (("tcp", "refused"), ("udp", "eperm")):
                with self.subTest(uid=kuid, kind=kind):
                    self.log.mark()
                    seen = len(self.t.pub_srv.seen_from(T.GUEST))
                    r = self.mapped(kuid, kind, T.PUBLIC, 443)
                    self.assertEqual(r["outcome"], outcome, r)
                    line = self.log.wait_for("fy-wall-deny ", f"DST={T.PUBLIC}", "DPT=443 ")
                    self.assertIsNotNone(line, "no deny line")
                    self.assertEqual(len(self.t.pub_srv.seen_from(T.GUEST)), seen)
        self.assertIn("+subuid 100000-165535, 300000-365535", self.apply_out)

    def test_the_band_is_still_open_to_them(self):
        for kuid in self.INNER:
            with self.subTest(uid=kuid):
                r = self.mapped(kuid, "tcp", T.GW, 41000)
                self.assertEqual(r["outcome"], "ok", r)

    def test_status_names_a_range_the_live_wall_does_not_cover(self):
        args = n.machine_args(self.ident)
        st = self.ident.fy_wall(self.t.guest, "status", "machine", *args, "--log-lines", 0)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertNotIn("NOT covered", st.stdout)
        with open(self.ident.subuid, "a") as f:
            f.write(f"{ALIAS}:700000:100\n")  # a line added after the wall was applied
        try:
            st = self.ident.fy_wall(self.t.guest, "status", "machine", *args, "--log-lines", 0)
            self.assertEqual(st.returncode, 1, st.stdout + st.stderr)
            gaps = [l for l in st.stdout.splitlines() if "walled uids NOT covered" in l]
            self.assertTrue(gaps, st.stdout)
            self.assertTrue(all("700000-700099" in l for l in gaps), gaps)
            self.assertTrue(any("table inet fy_wall" in l and "jump walled" in l for l in gaps))
            self.assertTrue(any("table ip6 fy_wall6" in l for l in gaps))
            self.assertIn("does NOT cover every uid the walled user can map", st.stdout)
        finally:
            with open(self.ident.subuid, "w") as f:
                f.write(self.SUBUID)


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""The wall's rows that need a distro guest's kernel, in the qemu guest
(lifecycle/guest, Debian 12's stock kernel): docs/wall-escapes.md rows 52-56,
62 and 88-90, which this machine's kernel cannot try (no AF_RXRPC, AF_RDS,
AF_TIPC, AF_SMC, AF_KCM/CAN/QRTR, SCTP, vsock transport), and the boot
provisioning's kernel closures (fy-machine's render_kernel_closures: fy-wall's
modprobe.d file of the families a dev box never needs, fy-novsock's AF_VSOCK
refusal for the walled principals).

One boot. guest_rows.py runs in the guest as root with the 9p-shared build's
fy-wall and fy-novsock, the wall tests' probes (tests/wall) and the fragment
exactly as fy-machine renders it; it records, and each test here asserts one
row's outcome. The escape rows run in fywnet's namespaces (the same topology as
the wall suite's) under fy-wall's real machine wall, and again under that wall
without its ownerless chain (the wall as it was) as the control.

What it does not prove: PID 1 in the guest is fy-init, not systemd, and the
guest has no host vsock device (/dev/vhost-vsock is absent on this machine), so
"the host's listener" at CID 2 cannot answer; the vsock refusal is shown at
socket(), before any transport, and against a real root listener on the
loopback transport (CID 1).
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import io
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "lifecycle", "guest"))
import fyguest  # noqa: E402

BUILD = os.environ.get("FY_BUILD_DIR") or os.path.join(ROOT, "build")
RENDER_BOOT = os.path.join(BUILD, "subprojects", "fy-machine", "tests", "fy-machine-render-boot")
SHIP = [("tests/wall", f) for f in ("fywnet.py", "exotic.py", "probe.py", "serve.py",
                                    "resolv.conf", "mcast.py")] + \
       [("tests/guest", f) for f in ("guest_rows.py", "kfam.py")] + \
       [("tests/lib", f) for f in ("fyproc.py",  # fywnet's sh/alive helpers
                                   "fynet.py")]  # its netns/veth/cgroup primitives
R = {}


class GuestWall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = fyguest.qemu_missing()
        if why:
            raise unittest.SkipTest(why)
        for b in ("wall/fy-wall", "wall/novsock/fy-novsock"):
            if not os.access(os.path.join(BUILD, b), os.X_OK):
                raise RuntimeError(f"{b} is not built in {BUILD}")
        closures = subprocess.run([RENDER_BOOT, ROOT, "41000", "kernel-closures"],
                                  capture_output=True, text=True, check=True).stdout
        t0 = time.monotonic()
        image = fyguest.build_image()
        image_s = time.monotonic() - t0
        cls.guest = fyguest.Guest.boot(image, share=BUILD)
        g = cls.guest
        print("guest: image ready in %.1f s, booted to ssh in %.1f s under %s (%s)"
              % (image_s, g.boot_seconds, *g.accel), file=sys.stderr)
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for d, f in SHIP:
                    tar.add(os.path.join(ROOT, d, f), arcname=f)
                info = tarfile.TarInfo("closures.sh")
                info.size = len(closures.encode())
                tar.addfile(info, io.BytesIO(closures.encode()))
            subprocess.run(g.ssh_argv() + ["mkdir -p /opt/fyw && tar -C /opt/fyw -x"],
                           input=buf.getvalue(), check=True, capture_output=True, timeout=120)
            g.ssh("ln -sf /fy/wall/fy-wall /usr/local/bin/fy-wall && "
                  "ln -sf /fy/wall/novsock/fy-novsock /usr/local/bin/fy-novsock")
            t0 = time.monotonic()
            p = g.ssh("FY_BUILD_DIR=/fy python3 /opt/fyw/guest_rows.py /opt/fyw/closures.sh",
                      check=False, timeout=1500)
            cls.rows_seconds = time.monotonic() - t0
            sys.stderr.write(p.stderr[-3000:])
            try:
                R.update(json.loads(p.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                raise RuntimeError("guest_rows.py gave no record: rc=%d\n%s\n%s"
                                   % (p.returncode, p.stdout[-2000:], p.stderr[-3000:]))
            print("guest: rows run in %.1f s; guest kernel %s, LSMs %s"
                  % (cls.rows_seconds, R.get("kernel"), R.get("lsm")), file=sys.stderr)
            print("guest record: " + json.dumps(R, indent=1)[:20000], file=sys.stderr)
        except BaseException:
            g.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.guest.close()

    def row(self, key):
        if key not in R.get("rows", {}):
            self.fail("not recorded; guest_rows.py stopped: %s" % R.get("error"))
        return R["rows"][key]

    # ---- the boot provisioning's kernel closures ----

    def test_guest_kernel_runs_bpf_lsm(self):
        """The premise of fy-novsock: Debian's stock kernel boots with bpf among
        its LSMs (CONFIG_LSM), no command line needed."""
        self.assertRegex(R["kernel"], r"^6\.1\.\d+-\d+-amd64$")
        self.assertIn("bpf", R["lsm"].split(","))

    def test_provisioning_stops_the_families_loading(self):
        """docs/fy-wall.md's claim, run: before the fragment none of the
        modules is loaded; after it, socket() of every family fails with
        EAFNOSUPPORT for the walled uid and for root, an explicit modprobe
        fails, and no module loaded; without the file (the control), the same
        calls make sockets and load the modules."""
        self.assertEqual(R["provision"]["rc"], 0, R["provision"])
        self.assertTrue(R["families_file"])
        fams = ["rxrpc", "rds", "tipc", "smc", "kcm", "can", "qrtr", "sctp"]
        self.assertFalse(set(fams) & set(R["modules_at_boot"]), R["modules_at_boot"])
        for who in ("walled", "root"):
            for name, r in R["families_after"][who].items():
                # SCTP is a protocol of AF_INET: inet_create's answer is EPROTONOSUPPORT.
                want = "EPROTONOSUPPORT" if name == "SCTP" else "EAFNOSUPPORT"
                self.assertEqual((r["outcome"], r["errno"]), ("unsupported", want),
                                 f"{who} {name} after provisioning: {r}")
        for m, rc in R["modprobe_after"].items():
            self.assertNotEqual(rc, 0, f"modprobe {m} ran despite the file")
        self.assertFalse(set(fams) & set(R["modules_after"]), R["modules_after"])
        # Without the file: every family but RDS and TIPC loads on socket()
        # (Debian's kernel has no net-pf alias for those two: only root's
        # modprobe loads them, which the file refuses and which works without).
        for name, r in R["families_without_file"]["walled"].items():
            want = ("unsupported", "EAFNOSUPPORT") if name in ("AF_RDS", "AF_TIPC") else ("ok", "")
            self.assertEqual((r["outcome"], r["errno"]), want, f"{name} without the file: {r}")
        self.assertTrue(set(fams) - {"rds", "tipc"} <= set(R["modules_without_file"]),
                        R["modules_without_file"])
        self.assertEqual(R["modprobe_without_file"], {"rds": 0, "tipc": 0})
        for name, r in R["families_after_modprobe"]["walled"].items():
            self.assertEqual(r["outcome"], "ok", f"{name} once loaded: {r}")

    # ---- rows 52-56, 62: families that send through kernel sockets ----

    def ownerless_closed(self, rec, name):
        """fy-wall: nothing reached public, the ownerless chain logged it; the
        wall without that chain (the control): it reached public."""
        self.assertEqual(rec["fy-wall"]["arrived"], 0, f"{name} got out: {rec['fy-wall']}")
        self.assertTrue(rec["fy-wall"]["ownerless_logged"], rec["fy-wall"])
        self.assertGreater(rec["old"]["arrived"], 0,
                           f"{name}: the control shows nothing: the proof is void: {rec['old']}")

    def test_kernel_socket_family_rxrpc(self):
        """The kernel's UDP socket of the RxRPC local endpoint sends the call's
        DATA packet: under fy-wall the ownerless chain drops it, and the
        caller's sendmsg gets the drop as EPERM; under the wall as it was it
        reaches public (whose ICMP port-unreachable comes back as
        ECONNREFUSED)."""
        rec = self.row("rxrpc")
        self.assertEqual((rec["fy-wall"]["result"]["stage"], rec["fy-wall"]["result"]["errno"]),
                         ("sendmsg", "EPERM"), rec)
        self.ownerless_closed(rec, "AF_RXRPC")

    def test_kernel_socket_family_rds(self):
        """AF_RDS is not loaded by socket() (no net-pf alias; the families
        test shows it). Once root has loaded rds, the walled user's
        SO_RDS_TRANSPORT = TCP loads rds_tcp itself, and an RDS datagram
        makes rds_tcp's kernel socket connect to public's 16385: dropped by
        the ownerless chain; the control (the wall as it was) lets it through."""
        self.assertIn("rds", self.row("rds_modules_before"))
        self.assertNotIn("rds_tcp", self.row("rds_modules_before"))
        self.assertIn("rds_tcp", self.row("rds_modules_after"),
                      "the walled user's SO_RDS_TRANSPORT loads rds_tcp")
        self.ownerless_closed(self.row("rds"), "AF_RDS over rds_tcp")

    def test_kernel_socket_family_tipc(self):
        """TIPC is not loaded by socket() or its netlink family (no alias):
        only root's modprobe loads it. Loaded, the walled user enables a UDP
        bearer itself (6.1 asks for no capability), whose kernel socket sends
        discovery to any address: dropped by the ownerless chain; the control
        lets it through."""
        rec = self.row("tipc_bearer")
        for w in ("old", "fy-wall"):
            self.assertEqual(rec[w]["result"]["rc"], 0, rec[w])
            self.assertIn("udp:fyb", rec[w]["result"]["bearers"],
                          "the walled user enabled a UDP bearer (no capability asked)")
        self.ownerless_closed(rec, "TIPC's UDP bearer")

    def test_kernel_socket_family_smc(self):
        rec = self.row("smc")
        self.assertNotEqual(rec["fy-wall"]["result"]["outcome"], "ok", rec)
        self.ownerless_closed(rec, "AF_SMC")
        self.assertEqual(rec["old"]["result"]["outcome"], "ok", rec)

    def test_kernel_socket_family_kcm_can_qrtr(self):
        rec = self.row("kcm_can_qrtr")
        self.assertEqual(rec["arrived"], 0, rec)
        self.assertEqual(rec["can_devices"].strip(), "", "a CAN device in a VM")

    def test_sctp(self):
        rec = self.row("sctp")
        for where in ("public", "resolver"):
            self.assertNotEqual(rec[where]["result"]["outcome"], "ok", rec[where])
        self.assertEqual(rec["public"]["arrived"], 0, rec["public"])
        self.assertTrue(rec["public"]["deny_logged"], rec["public"])
        self.assertGreater(rec["root_public"]["arrived"], 0,
                           "root's SCTP never reached public: the proof is void")

    # ---- rows 88-90: vsock, and fy-novsock ----

    def vsock(self, key):
        """Before fy-novsock the walled attempt reaches the root listener;
        after it, socket() itself is refused (EPERM), so no transport is
        asked and no CID matters."""
        b, a = R["vsock_before"][key], R["vsock_after"][key]
        self.assertEqual((b["outcome"], b.get("reply")), ("ok", "root-vsock-listener"), b)
        self.assertEqual((a["outcome"], a["stage"], a["errno"]), ("eperm", "socket", "EPERM"),
                         f"after fy-novsock: {a}")

    def test_vsock_to_the_host(self):
        """CID 2 is the host's. This guest has no guest-to-host transport (no
        /dev/vhost-vsock here), and with only vsock_loopback loaded the
        kernel routes CID 2 to the local transport
        (vsock_use_local_transport): the guest's root listener answers for the
        host's. The walled socket is refused before any of that."""
        self.vsock("walled_cid2")

    def test_vsock_loopback(self):
        self.vsock("walled_cid1")
        self.vsock("subuid_cid1")

    def test_vsock_from_a_user_namespace(self):
        self.vsock("walled_userns_cid1")

    def test_vsock_stays_open_to_root_and_other_uids(self):
        for key in ("other_cid1", "root_cid1"):
            a = R["vsock_after"][key]
            self.assertEqual((a["outcome"], a.get("reply")), ("ok", "root-vsock-listener"), a)
        a = R["vsock_after"]["root_cid2"]
        self.assertEqual((a["outcome"], a.get("reply")), ("ok", "root-vsock-listener"), a)
        self.assertRegex(R["novsock_status"], r"refused to uids 4242,100000-165535; refused [1-9]")

    def test_novsock_reapply_and_remove(self):
        """`fy-novsock apply` on an attached program rewrites its ranges in
        place (uid 4343 added: refused; taken out again: allowed); `remove`
        detaches it (the walled uid reaches the listener, `status` exits 1);
        applying again closes it again."""
        r = R["novsock_reapply"]
        self.assertEqual(r["rc"], 0, r)
        self.assertIn("ranges updated", r["stdout"])
        self.assertEqual(r["other"]["errno"], "EPERM", r)
        self.assertIn("refused to uids 4242,100000-165535,4343;", r["status"])
        self.assertEqual((r["back"]["rc"], r["back"]["other"]["outcome"]), (0, "ok"), r)
        g = R["novsock_removed"]
        self.assertEqual((g["rc"], g["walled"]["outcome"], g["status_rc"]), (0, "ok", 1), g)
        a = R["novsock_again"]
        self.assertEqual((a["rc"], a["walled"]["errno"]), (0, "EPERM"), a)

    # ---- multicast memberships (issue 26, part 3) ----

    def test_multicast_memberships_carry_no_chosen_bytes(self):
        """With fy-novsock attached, every membership option of the walled
        uid fails with EPERM and the link peer sees no report naming its
        chosen sources ("fy-chosen-bytes!" as four IPv4 sources and one
        IPv6 source); another uid still joins and is reported; with fy-novsock
        removed (the control, and fy-novsock as on main), the walled uid's
        reports carry the chosen bytes."""
        chosen = {"102.121.45.99", "104.111.115.101", "110.45.98.121", "116.101.115.33",
                  "6679:2d63:686f:7365:6e2d:6279:7465:7321"}
        m = R["mcast"]

        def sources(rec):
            return {s for r in rec["seen"]["reports"] for s in r["sources"]}

        self.assertEqual(set(m["walled"]["answers"].values()), {"EPERM"}, m["walled"])
        self.assertFalse(m["walled"]["seen"]["marker"], m["walled"])
        self.assertFalse(sources(m["walled"]) & chosen, m["walled"])
        self.assertEqual(set(m["other"]["answers"].values()), {"ok"}, m["other"])
        self.assertTrue(chosen - {"6679:2d63:686f:7365:6e2d:6279:7465:7321"} <=
                        sources(m["other"]), m["other"])
        self.assertRegex(m["status"], r"and [1-9]\d* membership change")
        w = m["walled_without"]
        self.assertEqual(set(w["answers"].values()), {"ok"}, w)
        self.assertTrue(w["seen"]["marker"], w)
        self.assertTrue(chosen <= sources(w), w)


if __name__ == "__main__":
    unittest.main(verbosity=2)

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
                                    "resolv.conf")] + \
       [("tests/guest", f) for f in ("guest_rows.py", "kfam.py")]
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
            subprocess.run(g.ssh_argv() + ["mkdir -p /root/fyw && tar -C /root/fyw -x"],
                           input=buf.getvalue(), check=True, capture_output=True, timeout=120)
            g.ssh("ln -sf /fy/wall/fy-wall /usr/local/bin/fy-wall && "
                  "ln -sf /fy/wall/novsock/fy-novsock /usr/local/bin/fy-novsock")
            t0 = time.monotonic()
            p = g.ssh("FY_BUILD_DIR=/fy python3 /root/fyw/guest_rows.py /root/fyw/closures.sh",
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
        self.assertNotIn("error", R, "guest_rows.py stopped: %s" % R.get("error"))
        self.assertIn(key, R.get("rows", R), "not recorded")
        return R.get("rows", R)[key]

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
                self.assertEqual((r["outcome"], r["errno"]), ("unsupported", "EAFNOSUPPORT"),
                                 f"{who} {name} after provisioning: {r}")
        self.assertNotEqual(R["modprobe_after"], 0, "modprobe rxrpc ran despite the file")
        self.assertFalse(set(fams) & set(R["modules_after"]), R["modules_after"])
        for name, r in R["families_without_file"]["walled"].items():
            self.assertNotEqual(r.get("errno"), "EAFNOSUPPORT",
                                f"{name} without the file: the control shows nothing: {r}")
        self.assertTrue(set(fams) <= set(R["modules_without_file"]) | {"can"},
                        R["modules_without_file"])

    # ---- rows 52-56, 62: families that send through kernel sockets ----

    def ownerless_closed(self, rec, name):
        """fy-wall: nothing reached public, the ownerless chain logged it; the
        wall without that chain (the control): it reached public."""
        self.assertEqual(rec["fy-wall"]["arrived"], 0, f"{name} got out: {rec['fy-wall']}")
        self.assertTrue(rec["fy-wall"]["ownerless_logged"], rec["fy-wall"])
        self.assertGreater(rec["old"]["arrived"], 0,
                           f"{name}: the control shows nothing: the proof is void: {rec['old']}")

    def test_kernel_socket_family_rxrpc(self):
        rec = self.row("rxrpc")
        self.assertEqual(rec["fy-wall"]["result"]["outcome"], "sent", rec)
        self.ownerless_closed(rec, "AF_RXRPC")

    def test_kernel_socket_family_rds(self):
        alone = self.row("rds_without_rds_tcp")
        self.assertEqual(alone["arrived"], 0, alone)
        self.assertEqual(self.row("rds_tcp_load"), 0)
        rec = self.row("rds")
        self.assertEqual(rec["fy-wall"]["result"]["outcome"], "sent", rec)
        self.ownerless_closed(rec, "AF_RDS over rds_tcp")

    def test_kernel_socket_family_tipc(self):
        self.assertNotEqual(self.row("tipc_walled_bearer")["rc"], 0,
                            "the walled user enabled a TIPC bearer")
        rec = self.row("tipc_root_bearer")
        self.assertEqual(rec["fy-wall"]["result"]["rc"], 0, rec)
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
            self.assertEqual(rec[where]["arrived"], 0, rec[where])
        self.assertTrue(rec["public"]["deny_logged"], rec["public"])
        self.assertGreater(rec["root_public"]["arrived"], 0,
                           "root's SCTP never reached public: the proof is void")

    # ---- rows 88-90: vsock, and fy-novsock ----

    def vsock(self, key, before_ok):
        b, a = R["vsock_before"][key], R["vsock_after"][key]
        if before_ok:
            self.assertEqual((b["outcome"], b.get("reply")), ("ok", "root-vsock-listener"), b)
        else:
            self.assertEqual(b["stage"], "connect", f"before: the socket is made: {b}")
        self.assertEqual((a["outcome"], a["stage"], a["errno"]), ("eperm", "socket", "EPERM"),
                         f"after fy-novsock: {a}")

    def test_vsock_to_the_host(self):
        self.vsock("walled_cid2", before_ok=False)

    def test_vsock_loopback(self):
        self.vsock("walled_cid1", before_ok=True)
        self.vsock("subuid_cid1", before_ok=True)

    def test_vsock_from_a_user_namespace(self):
        self.vsock("walled_userns_cid1", before_ok=True)

    def test_vsock_stays_open_to_root_and_other_uids(self):
        for key in ("other_cid1", "root_cid1"):
            a = R["vsock_after"][key]
            self.assertEqual((a["outcome"], a.get("reply")), ("ok", "root-vsock-listener"), a)
        self.assertEqual(R["vsock_after"]["root_cid2"]["stage"], "connect")
        self.assertRegex(R["novsock_status"], r"refused to uids 4242,100000-165535; refused [1-9]")


if __name__ == "__main__":
    unittest.main(verbosity=2)

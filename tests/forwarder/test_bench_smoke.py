#!/usr/bin/env python3
"""The forwarder benchmark harness still runs: one tiny round of every figure,
every arm (direct and via the forwarder; then with the haproxy peer), no
errors, JSON with every field. (The numbers themselves are
docs/bench-forwarder.md's business, not a test's.)"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_topology import build_dir, source_dir  # noqa: E402

FIGURES = ("small_p50_ms", "small_p99_ms", "tls1_p50_ms", "tls8_p50_ms", "tp1_MBps", "tp4_MBps",
           "conn_per_s")


@unittest.skipUnless(shutil.which("nginx"), "nginx is not installed")
class BenchSmoke(unittest.TestCase):
    def bench(self, *extra):
        out = tempfile.mktemp(prefix="fyf-bench-smoke-", suffix=".json")
        try:
            r = subprocess.run(
                [sys.executable, os.path.join(source_dir(), "bench", "forwarder",
                                              "bench_forwarder.py"),
                 "--build", build_dir(), "--rounds", "1", "--small", "50", "--tls", "8",
                 "--bulk-mib", "16", "--bulk", "1", "--rate-seconds", "0.5", "--out", out] +
                list(extra), capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("via the forwarder", r.stdout)
            with open(out) as f:
                return r.stdout, json.load(f)
        finally:
            if os.path.exists(out):
                os.unlink(out)

    def test_one_small_round(self):
        _, d = self.bench()
        self.assertEqual(d["errors"], {"direct": 0, "via": 0})
        for key in FIGURES:
            for arm in ("direct", "via"):
                self.assertGreater(d["summary"][key][arm], 0, (key, arm))
        self.assertGreater(d["summary"]["fwd_cpu_s_per_GiB"]["via"], 0)
        self.assertGreater(d["forwarder_stats"]["stamped"], 0)
        self.assertIsNone(d["peer"])

    @unittest.skipUnless(shutil.which("haproxy"), "haproxy is not installed "
                         "(scripts/install-deps installs it)")
    def test_one_small_round_with_the_peer(self):
        # While the peer's figures are taken, the forwarder is stopped: only
        # haproxy listens behind the redirect, so a peer sample that succeeded
        # went through it, and its CPU is haproxy's own.
        stdout, d = self.bench("--peer", "haproxy")
        self.assertEqual(d["errors"], {"direct": 0, "via": 0, "peer": 0})
        for key in FIGURES:
            for arm in ("direct", "via", "peer"):
                self.assertGreater(d["summary"][key][arm], 0, (key, arm))
        self.assertGreater(d["summary"]["cpu_s_per_GiB"]["peer"], 0)
        self.assertGreater(d["summary"]["fwd_cpu_us_per_conn"]["peer"], 0)
        self.assertTrue(d["peer"].startswith("haproxy (tcp mode"), d["peer"])
        self.assertIn("peer: haproxy", stdout)
        for key in FIGURES:
            self.assertIsNotNone(d["via_minus_peer_paired"][key], key)


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""The forwarder benchmark harness still runs: one tiny round of every figure,
every arm (direct, via the forwarder, the haproxy peer), no errors, JSON with
every field. (The numbers themselves are
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


class BenchSmoke(unittest.TestCase):
    @unittest.skipUnless(shutil.which("nginx"), "nginx is not installed")
    def test_one_small_round(self):
        # With haproxy installed (scripts/install-deps does), the peer arm too.
        peer = shutil.which("haproxy") is not None
        arms = ["direct", "via"] + (["peer"] if peer else [])
        out = tempfile.mktemp(prefix="fyf-bench-smoke-", suffix=".json")
        try:
            r = subprocess.run(
                [sys.executable, os.path.join(source_dir(), "bench", "forwarder",
                                              "bench_forwarder.py"),
                 "--build", build_dir(), "--rounds", "1", "--small", "50", "--tls", "8",
                 "--bulk-mib", "16", "--bulk", "1", "--rate-seconds", "0.5", "--out", out] +
                (["--peer", "haproxy"] if peer else []),
                capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("via the forwarder", r.stdout)
            with open(out) as f:
                d = json.load(f)
            self.assertEqual(d["errors"], {arm: 0 for arm in arms})
            for key in ("small_p50_ms", "small_p99_ms", "tls1_p50_ms", "tls8_p50_ms",
                        "tp1_MBps", "tp4_MBps", "conn_per_s"):
                for arm in arms:
                    self.assertGreater(d["summary"][key][arm], 0, (key, arm))
            self.assertGreater(d["summary"]["fwd_cpu_s_per_GiB"]["via"], 0)
            self.assertGreater(d["forwarder_stats"]["stamped"], 0)
            if peer:
                # The peer relayed (its own CPU measured), and the forwarder
                # stamped only its own arm's connections.
                self.assertIn("peer: haproxy", r.stdout)
                self.assertGreater(d["summary"]["cpu_s_per_GiB"]["peer"], 0)
                self.assertGreater(d["summary"]["fwd_cpu_us_per_conn"]["peer"], 0)
                self.assertNotIn("peer", d["forwarder_stats_by_arm"])
        finally:
            if os.path.exists(out):
                os.unlink(out)


if __name__ == "__main__":
    unittest.main(verbosity=2)

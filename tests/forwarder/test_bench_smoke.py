#!/usr/bin/env python3
"""The forwarder benchmark harness still runs: one tiny round of every figure,
both arms, no errors, JSON with every field. (The numbers themselves are
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
        out = tempfile.mktemp(prefix="fyf-bench-smoke-", suffix=".json")
        try:
            r = subprocess.run(
                [sys.executable, os.path.join(source_dir(), "bench", "forwarder",
                                              "bench_forwarder.py"),
                 "--build", build_dir(), "--rounds", "1", "--small", "50", "--tls", "8",
                 "--bulk-mib", "16", "--bulk", "1", "--rate-seconds", "0.5", "--out", out],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("via the forwarder", r.stdout)
            with open(out) as f:
                d = json.load(f)
            self.assertEqual(d["errors"], {"direct": 0, "via": 0})
            for key in ("small_p50_ms", "small_p99_ms", "tls1_p50_ms", "tls8_p50_ms",
                        "tp1_MBps", "tp4_MBps", "conn_per_s"):
                self.assertGreater(d["summary"][key]["direct"], 0, key)
                self.assertGreater(d["summary"][key]["via"], 0, key)
            self.assertGreater(d["summary"]["fwd_cpu_s_per_GiB"]["via"], 0)
            self.assertGreater(d["forwarder_stats"]["stamped"], 0)
        finally:
            if os.path.exists(out):
                os.unlink(out)


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""fy-compose's latency against the guest stand-in of tests/test_guest.py (root):
a bare ssh round trip (`ssh -F cfg host true`) against a whole
`fy-compose config --services` (ssh, python3 -I -, the payload on stdin, the
import from memory, podman-compose's parse, the answer), in alternating rounds;
medians and their ratio, plus the payload's size and the stdin's.

  sudo FY_COMPOSE=build-compose/fy-compose python3 lifecycle/compose/bench/bench_latency.py [rounds]
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_guest as g  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    try:
        u, _ = g.setup()
        g.project("bench", "services:\n  web:\n    image: localhost/bb:1\n"
                  "  db:\n    image: localhost/bb:1\n", owner=u)
        ssh = ["ssh", "-F", g.B + "/ssh/ssh_config", "-T", "fyc16-guest", "true"]
        bare, call = [], []
        for i in range(rounds + 1):
            for arm in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if arm == 0:
                    r = subprocess.run(ssh, capture_output=True)
                else:
                    r = g.fyc("bench", "config", "--services")
                dt = time.perf_counter() - t0
                if r.returncode != 0:
                    raise RuntimeError("round %d arm %d failed: %s" % (i, arm, r.stderr))
                if i > 0:  # round 0 warms both up
                    (bare if arm == 0 else call).append(dt * 1000)
        script = subprocess.run([g.FYC, "--guest-socket", g.URL, "--project", "bench", "-f",
                                 "compose.yml", "script", "config", "--services"],
                                cwd=g.B + "/work/bench", capture_output=True, check=True).stdout
        zip_size = int(subprocess.run([g.FYC, "--version"], capture_output=True, text=True)
                       .stdout.split("payload: ")[1].split()[0])
        mb, mc = statistics.median(bare), statistics.median(call)
        print("rounds: %d (alternating, one warm-up round dropped)" % rounds)
        print("bare ssh round trip:            median %.0f ms (min %.0f, max %.0f)"
              % (mb, min(bare), max(bare)))
        print("fy-compose config --services:   median %.0f ms (min %.0f, max %.0f)"
              % (mc, min(call), max(call)))
        print("ratio call / bare: %.2f; the payload's own cost: %.0f ms" % (mc / mb, mc - mb))
        print("payload zip: %d bytes; stdin sent (bootstrap + base64 + request): %d bytes"
              % (zip_size, len(script)))
    finally:
        g.teardown()


if __name__ == "__main__":
    main()

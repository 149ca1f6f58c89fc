#!/usr/bin/env python3
"""How long fy-forwarder's loop is held by bulk relaying ([limits] pump_budget_kib).

Sets up the forwarder benchmark's topology (bench_forwarder.py --hold) once per setting,
runs 256 MiB downloads through the forwarder back to back, and meanwhile asks the control
socket for `status` every 2 ms: the control socket is answered on worker 0's loop, so its
latency is how long that loop was busy. Prints p50 / p99 / max (ms) and the forwarder's
`pump_yields` for each setting, in the order given (repeat a setting to alternate).

    sudo python3 bench/forwarder/bench_loop_stall.py --build build-bench 0 4096 0 4096

Each argument is a pump_budget_kib value. Use workers = 1 (the default on two CPUs), or
the downloads may land on a worker other than the one answering the control socket.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def control(path, command):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.sendall(command.encode() + b"\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return data.decode()


def status_ms(path):
    """How long the control socket took to answer `status`, in ms."""
    t0 = time.perf_counter()
    control(path, "status")
    return (time.perf_counter() - t0) * 1000


def run(build, budget, downloads, reps):
    extra = "[limits]\nworkers = 1\npump_budget_kib = %d\n" % budget
    bench = subprocess.Popen([sys.executable, os.path.join(HERE, "bench_forwarder.py"), "--build",
                              build, "--hold", "--forwarder-extra", extra],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    bulk_cmd, pid = None, None
    for line in bench.stdout:
        m = re.match(r"via: (.*--mode bulk.*)", line.strip())
        if m:
            bulk_cmd = m[1].replace("--samples 4", "--samples %d" % downloads).split()
        m = re.match(r"forwarder pid (\d+)", line)
        if m:
            pid = int(m[1])
            break
    if not bulk_cmd or not pid:
        raise SystemExit("bench_forwarder.py --hold did not set up")
    argv = open("/proc/%d/cmdline" % pid).read().split("\0")
    conf = open(argv[argv.index("--config") + 1]).read()
    sock = re.search(r'state_dir = "([^"]+)"', conf)[1] + "/control.sock"
    lat = []
    try:
        for _ in range(reps):
            bulk = subprocess.Popen(bulk_cmd, stdout=subprocess.DEVNULL)
            time.sleep(0.2)
            while bulk.poll() is None:
                lat.append(status_ms(sock))
                time.sleep(0.002)
        stats = json.loads(control(sock, "stats"))
    finally:
        bench.stdin.write("\n")
        bench.stdin.flush()
        bench.wait()
    lat.sort()
    return {"pump_budget_kib": budget, "samples": len(lat),
            "p50_ms": round(lat[len(lat) // 2], 3), "p99_ms": round(lat[int(len(lat) * 0.99)], 3),
            "max_ms": round(lat[-1], 2), "pump_yields": stats["pump_yields"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("FY_BUILD_DIR", "build-bench"))
    ap.add_argument("--downloads", type=int, default=6, help="256 MiB downloads per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("budgets", nargs="+", type=int, help="pump_budget_kib values, in order")
    a = ap.parse_args()
    for b in a.budgets:
        print(json.dumps(run(a.build, b, a.downloads, a.reps)), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""fy-netlog summary on a large Network Log against jq doing the same count.

Generates a log directory of SIZE bytes in all (egress.jsonl plus five dated
backups, as the proxy's rotation leaves them; rows shaped as fy-proxy writes
them, a tenth of them stamped) and an engine.jsonl beside it (fy-engine-watch's
snapshots of the containers holding those stamps' addresses, so the summary
resolves every stamped row to a principal), then times, in alternating rounds:

  fy-netlog:  fy-netlog --json DIR            (per-host rows, refusals, errors, bytes)
  jq:         jq -n 'reduce inputs as $r ({}; .[$r.host] += 1)' <files in order>

(jq counts rows per host only: the least of what the summary computes, so the
ratio flatters jq; the two counts are checked equal). Prints one JSON document:
the log's size and rows, each arm's median wall and CPU time over the rounds,
and fy-netlog's as a fraction of jq's. The log is generated under --dir (default a temporary directory, removed
afterwards; --keep keeps it for reruns).

  python3 bench/netlog/bench_summary.py --build-dir build [--size-mib 1024] [--rounds 3]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HOSTS = ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "api.github.com",
         "github.com:22", "objects.githubusercontent.com", "telemetry.example.net",
         "cdn.build-cache.internal.example.com:8443", "down.example.org"] + \
        ["h%03d.example.com" % i for i in range(200)]


def make_rows(n, rng):
    rows = []
    for i in range(n):
        host = rng.choice(HOSTS)
        r = {"ts": "2026-11-29T%02d:%02d:%02d.%03d+00:00" % (i // 3600 % 24, i // 60 % 60,
                                                               i % 60, i % 1000),
             "method": rng.choice(["GET", "GET", "POST", "CONNECT"]), "host": host,
             "path": "/simple/pkg-%d/" % rng.randrange(10000), "status": rng.choice(
                 [200, 200, 200, 304, 403, 404, 502]), "injected": rng.random() < 0.1,
             "replayed": False, "ua": "pip/23.0 CPython/3.11", "conn": i,
             "peer": "127.0.0.1:%d" % rng.randrange(1024, 65535), "tls": "decrypted",
             "bytes_up": rng.randrange(100, 5000), "bytes_down": rng.randrange(100, 500000),
             "duration_ms": rng.randrange(1, 900)}
        if r["status"] == 403:
            r["blocked"] = True
        if rng.random() < 0.1:
            r.update(src="10.89.1.%d" % rng.randrange(2, 200), net="podman1",
                     seq=i + 1, boot="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
        rows.append(json.dumps(r, separators=(",", ":")) + "\n")
    return rows


def write_engine(d):
    """engine.jsonl: the watcher's start, then one container per stamped address."""
    with open(os.path.join(d, "engine.jsonl"), "w") as f:
        f.write('{"ts":"2026-11-28T23:59:00.000Z","kind":"watch","event":"start",'
                '"containers":198}\n')
        for i in range(2, 200):
            claims = {"name": "bench_%d" % i}
            if i % 3 == 0:
                claims.update(project="shop", service="svc%d" % (i % 7))
            f.write(json.dumps({
                "ts": "2026-11-28T23:59:00.000Z", "kind": "container", "event": "list",
                "id": "%064x" % i, "state": "running", "claims": claims,
                "endpoints": [{"net": "shop_default", "iface": "podman1",
                               "ip": "10.89.1.%d" % i}]}, separators=(",", ":")) + "\n")


def generate(d, size):
    write_engine(d)
    rng = random.Random(17)
    block = "".join(make_rows(2000, rng)).encode()
    names = ["egress.20261129T%02d0000Z.jsonl" % h for h in range(1, 6)] + ["egress.jsonl"]
    per = size // len(names)
    total = 0
    for name in names:
        with open(os.path.join(d, name), "wb") as f:
            written = 0
            while written + len(block) <= per:
                f.write(block)
                written += len(block)
            total += written
    return names, total


def child_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv, stdin_files=None):
    """(wall s, CPU s of the children, stdout). CPU time is the steadier figure on a
    shared machine: it counts the arm's own work, not its wait for a core (for jq
    it includes the `cat` feeding it, a small part)."""
    c0 = child_cpu()
    t0 = time.monotonic()
    if stdin_files:
        cat = subprocess.Popen(["cat"] + stdin_files, stdout=subprocess.PIPE)
        r = subprocess.run(argv, stdin=cat.stdout, capture_output=True, text=True)
        cat.wait()
    else:
        r = subprocess.run(argv, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit("%s failed: %s" % (argv[0], r.stderr[-500:]))
    return dt, child_cpu() - c0, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    fy = os.path.join(a.build_dir, "proxy", "netlog", "fy-netlog")
    if not shutil.which("jq"):
        sys.exit("jq is not installed (apt-get install jq)")
    d = a.dir or tempfile.mkdtemp(prefix="fy-bench-netlog-")
    os.makedirs(d, exist_ok=True)
    try:
        names, total = generate(d, a.size_mib * 1024 * 1024)
        files = [os.path.join(d, n) for n in names]
        fy_t, jq_t, fy_c, jq_c = [], [], [], []
        rows = None
        for i in range(a.rounds):
            arms = [("fy", None), ("jq", None)]
            if i % 2:
                arms.reverse()
            for arm, _ in arms:
                if arm == "fy":
                    dt, cpu, out = timed([fy, "--json", d])
                    fy_c.append(cpu)
                    doc = json.loads(out)
                    rows = doc["rows_read"]
                    fy_hosts = {h["host"]: h["requests"] + h["would_block"] for h in doc["hosts"]}
                    fy_t.append(dt)
                else:
                    dt, cpu, out = timed(["jq", "-n", "-c",
                                          "reduce inputs as $r ({}; .[$r.host] += 1)"], files)
                    jq_c.append(cpu)
                    jq_hosts = {k.lower(): v for k, v in json.loads(out).items()}
                    jq_t.append(dt)
        if fy_hosts != jq_hosts:
            sys.exit("fy-netlog and jq counted differently")
        fy_m, jq_m = statistics.median(fy_t), statistics.median(jq_t)
        fy_cm, jq_cm = statistics.median(fy_c), statistics.median(jq_c)
        print(json.dumps({"bytes": total, "files": len(files), "rows": rows,
                          "rounds": a.rounds, "fy_netlog_s": round(fy_m, 3),
                          "jq_s": round(jq_m, 3), "fy_over_jq": round(fy_m / jq_m, 3),
                          "fy_netlog_cpu_s": round(fy_cm, 3), "jq_cpu_s": round(jq_cm, 3),
                          "fy_over_jq_cpu": round(fy_cm / jq_cm, 3),
                          "fy_netlog_mib_per_cpu_s": round(total / 1048576 / fy_cm, 1)},
                         indent=2))
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

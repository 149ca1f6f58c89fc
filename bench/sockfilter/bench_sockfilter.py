#!/usr/bin/env python3
"""fy-sockfilter's benchmark: the same requests, in the same run, straight to
a real podman API socket (runsc default, as test_live_podman.py sets it up),
through fy-sockfilter, through haproxy in http mode on unix sockets with
path ACLs (how the popular socket proxies are built), and through two floors,
byte relays with no parsing: floor_relay.c (one level-triggered epoll loop)
and floor_threads.c (a blocking thread per direction, no event loop), the
least any hop in front of the socket costs on this machine. Within each round the
arms take turns every --batch requests (creates: every request), the order
rotating; p50/p90 are over all requests of all rounds; each ratio is the
median over rounds of that round's p50 ratio (against direct, and against
haproxy), so load that shifts between rounds cancels.

  python3 bench/sockfilter/bench_sockfilter.py --filter build/subprojects/fy-sockfilter/fy-sockfilter \
      [--rounds 7] [--pings 300] [--lists 150] [--creates 8] [--batch 10] [--json out.json]

Needs root, podman, runsc, haproxy, cc. Each request is timed from the first byte
written to the last byte of the response read, on one keep-alive connection
per arm and round (a Python client: its cost is in every arm alike)."""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "lifecycle", "sockfilter", "tests"))
from test_live_podman import IMAGE, ensure_image  # noqa: E402

HAPROXY_CFG = """global
  maxconn 256
defaults
  mode http
  timeout connect 5s
  timeout client 10m
  timeout server 10m
frontend engine
  bind unix@{listen} mode 660
  acl creating path_reg ^(/v[0-9][0-9A-Za-z.-]*)?(/libpod)?/(play/kube|kube/play|kube/apply|quadlets|local/)
  acl restore path_reg /containers/[^/]+/restore$
  http-request deny if creating
  http-request deny if restore
  default_backend podman
backend podman
  server engine unix@{upstream}
"""


def cpu_ns_ticks(pid):
    """CPU time a process has run, exited threads included, in ns (utime+stime of
    /proc/<pid>/stat: clock-tick granular). For floor-threads, whose threads end
    with their connections and take their schedstat with them."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_ns(pid):
    """CPU time a process has run, all its threads, in ns (schedstat)."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
            total += int(f.read().split()[0])
    return total


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(60)
        self.s.connect(path)
        self.buf = b""

    def request(self, method, path, body=None):
        data = b"%s %s HTTP/1.1\r\nHost: d\r\n" % (method.encode(), path.encode())
        if body is not None:
            data += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data += b"\r\n" + (body or b"")
        t0 = time.perf_counter_ns()
        self.s.sendall(data)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lower = head.lower()
        status = int(head.split(b" ")[1])
        if b"transfer-encoding: chunked" in lower:
            out = b""
            while True:
                while b"\r\n" not in self.buf:
                    self._more()
                ln, _, self.buf = self.buf.partition(b"\r\n")
                n = int(ln.split(b";")[0], 16)
                while len(self.buf) < n + 2:
                    self._more()
                out += self.buf[:n]
                self.buf = self.buf[n + 2:]
                if n == 0:
                    break
            resp = out
        else:
            n = 0
            for ln in lower.split(b"\r\n"):
                if ln.startswith(b"content-length:"):
                    n = int(ln.split(b":")[1])
            while len(self.buf) < n:
                self._more()
            resp, self.buf = self.buf[:n], self.buf[n:]
        return time.perf_counter_ns() - t0, status, resp

    def _more(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError
        self.buf += d

    def close(self):
        self.s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pings", type=int, default=300)
    ap.add_argument("--lists", type=int, default=150)
    ap.add_argument("--creates", type=int, default=8)
    ap.add_argument("--batch", type=int, default=10, help="requests per arm's turn (creates: 1)")
    ap.add_argument("--json")
    a = ap.parse_args()
    for tool in ("podman", "runsc", "haproxy", "cc"):
        if not shutil.which(tool):
            print("SKIP: %s is not installed" % tool)
            return 77
    tmp = tempfile.mkdtemp(prefix="fy-sf-bench-%d-" % os.getpid())
    # A storage of its own: the list is of this run's containers only (the
    # machine's shared storage holds other engineers' containers, whose
    # namespaces this engine's mount namespace cannot join), and the same size
    # in every round.
    storage = ["--root", os.path.join(tmp, "root"), "--runroot", os.path.join(tmp, "runroot"),
               "--tmpdir", os.path.join(tmp, "libpod-tmp"), "--storage-driver", "vfs"]
    ensure_image(storage)
    wrapper = os.path.join(tmp, "runsc-fy")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec %s --ignore-cgroups --network=none \"$@\"\n" % shutil.which("runsc"))
    os.chmod(wrapper, 0o755)
    conf = os.path.join(tmp, "containers.conf")
    with open(conf, "w") as f:
        f.write('[containers]\nlabel = false\nnetns = "none"\n'
                'default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n'
                '[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runsc-fy"\n'
                '[engine.runtimes]\nrunsc-fy = ["%s"]\n' % wrapper)
    engine = os.path.join(tmp, "engine.sock")
    filtered = os.path.join(tmp, "filtered.sock")
    hap = os.path.join(tmp, "haproxy.sock")
    floor = os.path.join(tmp, "floor.sock")
    floor_bin = os.path.join(tmp, "floor_relay")
    subprocess.run(["cc", "-O2", "-o", floor_bin,
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor_relay.c")], check=True)
    floor_thr = os.path.join(tmp, "floor-threads.sock")
    floor_thr_bin = os.path.join(tmp, "floor_threads")
    subprocess.run(["cc", "-O2", "-pthread", "-o", floor_thr_bin,
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor_threads.c")],
                   check=True)
    with open(os.path.join(tmp, "haproxy.cfg"), "w") as f:
        f.write(HAPROXY_CFG.format(listen=hap, upstream=engine))
    procs = []
    created = []
    try:
        procs.append(subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             "umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && "
             "exec podman " + " ".join(storage) + " system service --time=0 unix://" + engine],
            env=dict(os.environ, CONTAINERS_CONF=conf), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(300):
            if os.path.exists(engine):
                break
            time.sleep(0.05)
        flt = subprocess.Popen([a.filter, engine, filtered, "--log-level", "warn"])
        hap_p = subprocess.Popen(["haproxy", "-f", os.path.join(tmp, "haproxy.cfg")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        floor_p = subprocess.Popen([floor_bin, engine, floor])
        floor_thr_p = subprocess.Popen([floor_thr_bin, engine, floor_thr])
        procs += [flt, hap_p, floor_p, floor_thr_p]
        arms = {"direct": engine, "fy-sockfilter": filtered, "haproxy": hap, "floor": floor,
                "floor-threads": floor_thr}
        for path in arms.values():
            for _ in range(300):
                if os.path.exists(path):
                    break
                time.sleep(0.05)
        # Warm-up: each arm once, the image resolved.
        for path in arms.values():
            c = Conn(path)
            c.request("GET", "/_ping")
            c.close()
        spec = json.dumps({"image": IMAGE, "command": ["true"], "oci_runtime": "crun",
                           "annotations": {"dev.gvisor.x": "1", "keep": "1"}}).encode()
        kinds = {"ping": ("GET", "/_ping", None, 200, a.pings),
                 "list": ("GET", "/v4.0.0/libpod/containers/json?all=true", None, 200, a.lists),
                 "create": ("POST", "/v4.0.0/libpod/containers/create", spec, 201, a.creates)}
        samples = {arm: {k: [] for k in kinds} for arm in arms}
        per_round = {arm: {k: [] for k in kinds} for arm in arms}  # each round's p50
        names = list(arms)
        batch = max(1, a.batch)
        procs_of = {"fy-sockfilter": flt, "haproxy": hap_p, "floor": floor_p,
                    "floor-threads": floor_thr_p}
        cpu_of = {arm: cpu_ns_ticks if arm == "floor-threads" else cpu_ns for arm in procs_of}
        cpu0 = {arm: cpu_of[arm](p.pid) for arm, p in procs_of.items()}
        for rnd in range(a.rounds):
            conns = {arm: Conn(arms[arm]) for arm in names}
            got = {arm: {k: [] for k in kinds} for arm in names}
            for kind, (method, path, body, want, n) in kinds.items():
                # The arms take turns every `batch` requests (the order
                # rotating), so a burst of load on the machine falls on all
                # arms alike.
                done, turn = 0, 0
                while done < n:
                    step = min(batch if kind != "create" else 1, n - done)
                    k = turn % len(names)
                    order = names[k:] + names[:k]
                    for arm in order:
                        for _ in range(step):
                            ns, st, rb = conns[arm].request(method, path, body)
                            assert st == want, (arm, kind, st, rb[:200])
                            if kind == "create":
                                created.append(json.loads(rb)["Id"])
                            got[arm][kind].append(ns)
                    done += step
                    turn += 1
            for arm in names:
                conns[arm].close()
                for kind in kinds:
                    samples[arm][kind] += got[arm][kind]
                    per_round[arm][kind].append(statistics.median(got[arm][kind]))
            # creates removed between rounds, untimed, so the list stays the same size
            c = Conn(engine)
            while created:
                c.request("DELETE", "/v4.0.0/libpod/containers/%s?force=true" % created.pop())
            c.close()
        # The proxies' own CPU per request (not their latency: what they
        # spend, whatever the machine's load does to the wake-ups).
        nreq = sum(len(samples["direct"][k]) for k in kinds)
        cpu = {arm: (cpu_of[arm](p.pid) - cpu0[arm]) / nreq / 1000 for arm, p in procs_of.items()}
        result = {"cpu_us_per_request": cpu}
        print("CPU per request (all kinds, %d requests per arm): %s"
              % (nreq, ", ".join("%s %.1f us" % (arm, us) for arm, us in cpu.items())))
        print("%-14s %-7s %10s %10s %10s %10s %10s" % ("arm", "request", "p50 us", "p90 us", "vs direct",
                                                       "vs haproxy", "vs floor"))
        print("  (p50, p90: over all requests; the ratios: the median over rounds of each round's "
              "p50 ratio)")
        for kind in kinds:
            for arm in names:
                xs = sorted(samples[arm][kind])
                p50 = statistics.median(xs)
                p90 = xs[int(len(xs) * 0.9)]
                vs_d = statistics.median(x / d for x, d in zip(per_round[arm][kind], per_round["direct"][kind]))
                vs_h = statistics.median(x / h for x, h in zip(per_round[arm][kind], per_round["haproxy"][kind]))
                vs_f = statistics.median(x / f for x, f in zip(per_round[arm][kind], per_round["floor"][kind]))
                result.setdefault(arm, {})[kind] = {
                    "p50_us": p50 / 1000, "p90_us": p90 / 1000, "n": len(xs),
                    "p50_vs_direct": vs_d, "p50_vs_haproxy": vs_h, "p50_vs_floor": vs_f,
                    "round_p50_us": [x / 1000 for x in per_round[arm][kind]]}
                print("%-14s %-7s %10.1f %10.1f %9.3fx %9.3fx %9.3fx"
                      % (arm, kind, p50 / 1000, p90 / 1000, vs_d, vs_h, vs_f))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    finally:
        if created:
            try:
                c = Conn(engine)
                for cid in created:
                    c.request("DELETE", "/v4.0.0/libpod/containers/%s?force=true" % cid)
                c.close()
            except (OSError, EOFError):
                pass
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The forwarder benchmark (ADR-0034's table; docs/bench-forwarder.md).

Two arms, measured in the same run, alternating which goes first each round:
  direct  a "container" connects to the proxy, routed through the rootless and VM
          namespaces (like pasta's way out);
  via     the same container connects to the proxy URL it is given; the redirect
          fy-forwarder installs in the rootless namespace sends it to its bridge
          listener, which stamps it and dials the proxy from the VM's namespace.
Each arm crosses exactly one NAT: the redirect (via), a DNAT on the host (direct).
Every sample is a new connection. Each figure is the median over rounds of the
round's figure (median, p99, MB/s, connections/s).

The proxy is a parameter (--proxy-cmd); the default is fy-bench-proxy, a small
C++ forward proxy standing in for fy-proxy (it verifies stamps like fy-proxy but
has no policy, TLS interception or log). The origin is nginx (HTTP and HTTPS).

    sudo python3 bench/forwarder/bench_forwarder.py --build build-fwd
    sudo python3 bench/forwarder/bench_forwarder.py --proxy-cmd \\
        '/path/fy-proxy --config {dir}/proxy.toml' --proxy-name fy-proxy
Placeholders in --proxy-cmd: {gateway} {port} {key} {dir} {bench}.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "forwarder"))
sys.path.insert(0, os.path.join(SRC, "tests", "lib"))  # fyproc, which fyf_topology imports

DIRECT_ADDR = "192.168.5.3"  # the host's second address; DNAT'ed to the proxy's


PEER_TABLE = "fyf_bench_peer"
PEER_REDIRECT = ("table ip " + PEER_TABLE + " {\n chain pre { type nat hook prerouting priority "
                 "dstnat; policy accept;\n  ip daddr %s tcp dport %d redirect\n }\n}\n")


def peer_name(threads):
    return "haproxy (tcp mode, splice both ways, %d thread%s, as the forwarder has workers)" % (
        threads, "" if threads == 1 else "s")


def write_haproxy_conf(d, rootless_ns, vm_ns, gateway, port, threads):
    """The peer relay: haproxy doing what the forwarder does minus the head and
    the stamp. It listens in the rootless namespace (the redirect's target) and
    dials the proxy from the VM's, as fy-forwarder does; as many threads as the
    forwarder has workers; splice both ways."""
    path = os.path.join(d, "haproxy.cfg")
    with open(path, "w") as f:
        f.write("""global
  nbthread {threads}
  maxconn 4096
  log stderr format raw local0 err
defaults
  mode tcp
  log global
  option splice-request
  option splice-response
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend containers
  bind 0.0.0.0:{port} namespace {rl} backlog 4096
  default_backend proxy
backend proxy
  server proxy {gw}:{port} namespace {vm}
""".format(port=port, rl=rootless_ns, vm=vm_ns, gw=gateway, threads=threads))
    return path


def percentile(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(p * len(v)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FY_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--proxy-cmd", default="{bench}/fy-bench-proxy --listen {gateway}:{port} "
                                           "--key {key}")
    ap.add_argument("--proxy-name", default="fy-bench-proxy (a stand-in for fy-proxy)")
    ap.add_argument("--fy-proxy", metavar="BIN",
                    help="measure against the real fy-proxy (this binary): it decrypts the TLS "
                         "samples, verifies the origin, checks stamps and writes its Network Log")
    ap.add_argument("--stub-upstream", action="store_true",
                    help="instead of a proxy, nginx answering every request itself at the "
                         "proxy's address: the forwarder's own capacity (only --only small,rate "
                         "make sense)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--small", type=int, default=400, help="small requests per arm per round")
    ap.add_argument("--tls", type=int, default=60, help="CONNECT+TLS samples per arm per round")
    ap.add_argument("--bulk-mib", type=int, default=256, help="body size for throughput")
    ap.add_argument("--bulk", type=int, default=2, help="bodies per client per arm per round")
    ap.add_argument("--rate-seconds", type=float, default=2.0)
    ap.add_argument("--rate-concurrency", type=int, default=64)
    ap.add_argument("--out", default=None,
                    help="JSON output (default: <build>/bench-forwarder.json)")
    ap.add_argument("--forwarder", metavar="BIN",
                    help="the fy-forwarder binary of the via arm (default: the build's)")
    ap.add_argument("--forwarder-extra", default="",
                    help="TOML appended to the forwarder's config (e.g. a [limits] table)")
    ap.add_argument("--only", default="small,tls,tp,rate",
                    help="which figures to measure (comma-separated: small,tls,tp,rate)")
    ap.add_argument("--ab", metavar="FORWARDER",
                    help="a third arm, via-b: this fy-forwarder binary ('same' for the build's "
                         "own) with --ab-extra, alternated with via; prints paired differences")
    ap.add_argument("--ab-proxy", metavar="FY_PROXY",
                    help="with --fy-proxy: a third arm, via-b: the same forwarder in front of "
                         "this fy-proxy binary, alternated with via (only one proxy runs at a "
                         "time); prints paired differences")
    ap.add_argument("--peer", choices=["haproxy"],
                    help="a third arm, peer: a well-known TCP relay in the forwarder's place "
                         "(haproxy, tcp mode, splice, one thread, listening in the rootless "
                         "namespace behind the same redirect and dialling from the VM's): what "
                         "any relay there costs on this host; it parses and stamps nothing")
    ap.add_argument("--skip-direct", action="store_true",
                    help="with --ab: only the two forwarder arms (A/B comparisons)")
    ap.add_argument("--ab-extra", default=None,
                    help="TOML appended to via-b's config (default: --forwarder-extra)")
    ap.add_argument("--hold", action="store_true",
                    help="after setting up, print the commands for each arm and wait for Enter "
                         "(for profiling by hand); no measurement")
    a = ap.parse_args()
    if a.ab_proxy and (not a.fy_proxy or a.ab):
        ap.error("--ab-proxy needs --fy-proxy, and not --ab (one comparison at a time)")
    if a.peer and (a.ab or a.ab_proxy):
        ap.error("--peer is a comparison of its own: not with --ab or --ab-proxy")
    os.environ["FY_BUILD_DIR"] = os.path.abspath(a.build)
    from fyf_topology import GATEWAY, ORIGIN, PROXY_PORT, Topology, sh

    bench = os.path.join(os.path.abspath(a.build), "bench", "forwarder")
    loadgen = os.path.join(bench, "fy-fwd-loadgen")
    for exe in (loadgen, os.path.join(a.build, "forwarder", "fy-forwarder")):
        if not os.path.exists(exe):
            sys.exit("missing %s: build first (ninja -C %s)" % (exe, a.build))

    with Topology("bench", containers=(("podman1", 1),), route_direct=True) as t:
        d = t.dir
        # sysctls for tens of thousands of short connections per second
        for ns in (t.containers[0][0], t.vm, t.host, t.rl):
            t.nsexec(ns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
            t.nsexec(ns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535")
        t.nsexec(t.host, "ip", "addr", "add", DIRECT_ADDR + "/24", "dev", "eth0")
        rules = ("table ip fyf_bench {\n chain pre {\n  type nat hook prerouting priority dstnat;\n"
                 "  ip daddr %s tcp dport %d dnat ip to %s\n }\n}\n" % (DIRECT_ADDR, PROXY_PORT,
                                                                        GATEWAY))
        subprocess.run(["ip", "netns", "exec", t.host, "nft", "-f", "-"], input=rules, text=True,
                       check=True)

        # The origin: nginx, HTTP and HTTPS, a small answer and a large file.
        www = os.path.join(d, "www")
        os.makedirs(www)
        with open(os.path.join(www, "big"), "wb") as f:
            f.truncate(a.bulk_mib << 20)
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
           "-nodes", "-days", "1", "-subj", "/CN=origin.fyf.test", "-addext",
           "subjectAltName=DNS:origin.fyf.test,IP:%s" % ORIGIN, "-keyout",
           os.path.join(d, "origin.key"), "-out", os.path.join(d, "origin.crt"))
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log;
events {{ worker_connections 65536; }}
http {{
  access_log off;
  client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;
  uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;
  sendfile on; tcp_nopush on;
  server {{
    listen {o}:80 backlog=4096;
    listen {o}:443 ssl backlog=4096;
    ssl_certificate {d}/origin.crt; ssl_certificate_key {d}/origin.key;
    ssl_session_cache off; ssl_session_tickets off;
    location = /small {{ return 200 "small\\n"; }}
    location / {{ root {www}; }}
  }}
}}
""".format(d=d, o=ORIGIN, www=www))
        nginx = t.start_in_host(["nginx", "-c", conf, "-g", "daemon off;"], name="nginx")
        t.wait_listening(t.host, ORIGIN, 80, proc=nginx)

        key_file, _ = t.write_key()
        if a.fy_proxy:
            # The real proxy, enforcing, with the origin granted and verified.
            with open(os.path.join(d, "policy.toml"), "w") as f:
                f.write('mode = "enforce"\nallow = ["%s"]\n' % ORIGIN)
            fy_cmd = ("%s --listen {gateway}:{port} --stamp-key {key} --admin off "
                      "--state-dir {dir}/fy-proxy --policy {dir}/policy.toml "
                      "--netlog {dir}/egress-%s.jsonl --upstream-ca {dir}/origin.crt "
                      "--log-level warn")
            a.proxy_cmd = fy_cmd % (a.fy_proxy, "a")
            a.proxy_name = "fy-proxy (%s)" % a.fy_proxy
        if a.stub_upstream:
            # Not a proxy: nginx answering every request itself, so that what is
            # measured is the forwarder's own capacity, not the proxy's.
            stub = os.path.join(d, "stub.conf")
            with open(stub, "w") as f:
                f.write("""user root;
worker_processes 1;
pid {d}/stub.pid;
error_log {d}/stub-error.log;
events {{ worker_connections 65536; }}
http {{
  access_log off;
  client_body_temp_path {d}/s1; proxy_temp_path {d}/s2; fastcgi_temp_path {d}/s3;
  uwsgi_temp_path {d}/s4; scgi_temp_path {d}/s5;
  server {{
    listen {g}:{p} backlog=4096 reuseport;
    location / {{ return 200 "small\n"; }}
  }}
}}
""".format(d=d, g=GATEWAY, p=PROXY_PORT))
            a.proxy_cmd = "nginx -c %s -g 'daemon off;'" % stub
            a.proxy_name = "a stub upstream (nginx answering every request itself; no proxy)"
        cmd = a.proxy_cmd.format(gateway=GATEWAY, port=PROXY_PORT, key=key_file, dir=d,
                                 bench=bench)
        proxy = t.start_in_host(shlex.split(cmd), name="proxy")
        t.wait_listening(t.host, GATEWAY, PROXY_PORT, proc=proxy)
        # With --ab-proxy the via-b arm runs a second proxy binary on the same
        # address: the proxy is swapped (stopped, started, waited for) whenever
        # the arm changes, as the forwarder is.
        proxy_cmds = {}
        proxy_state = {"cmd": cmd, "proc": proxy}
        if a.ab_proxy:
            proxy_cmds["via-b"] = (fy_cmd % (os.path.abspath(a.ab_proxy), "b")).format(
                gateway=GATEWAY, port=PROXY_PORT, key=key_file, dir=d, bench=bench)
        # Arms: the direct path, the forwarder under test ("via") and, with --ab, a
        # second forwarder binary or configuration ("via-b"). Only one forwarder
        # runs at a time (they share the listener's port); it is restarted when
        # the arm changes.
        arms = {"direct": "%s:%d" % (DIRECT_ADDR, PROXY_PORT),
                "via": "%s:%d" % (GATEWAY, PROXY_PORT)}
        # workers=0: the forwarder's own default unless --forwarder-extra says.
        base_cfg = t.forwarder_config(key_file, bridge=True, vm=False, workers=0).replace(
            'log_level = "info"', 'log_level = "warn"')
        fwd_spec = {"via": (a.forwarder and os.path.abspath(a.forwarder), a.forwarder_extra)}
        if a.ab_proxy:
            arms["via-b"] = arms["via"]
            fwd_spec["via-b"] = fwd_spec["via"]
        if a.ab:
            arms["via-b"] = arms["via"]
            fwd_spec["via-b"] = (None if a.ab == "same" else os.path.abspath(a.ab),
                                 a.ab_extra if a.ab_extra is not None else a.forwarder_extra)
        if a.peer:
            arms["peer"] = arms["via"]
        if a.skip_direct:
            del arms["direct"]
        cns = t.containers[0][0]
        small_url = "http://%s/small" % ORIGIN
        big_url = "http://%s/big" % ORIGIN
        # The relay in the forwarder's place: a forwarder arm or the peer. Only
        # one runs at a time (they share the listener's port).
        fwd_state = {"arm": None, "proc": None}
        fwd_stats = {arm: {} for arm in fwd_spec}

        def collect_stats():
            arm = fwd_state["arm"]
            if arm is None or arm == "peer":
                return
            for k, v in t.stats().items():
                if isinstance(v, int):
                    fwd_stats[arm][k] = fwd_stats[arm].get(k, 0) + v

        def use_proxy(arm):
            want = proxy_cmds.get(arm, cmd)
            if proxy_state["cmd"] == want:
                return
            proxy_state["proc"].stop()
            proxy_state["proc"] = t.start_in_host(shlex.split(want), name="proxy-" + (
                "b" if arm in proxy_cmds else "a"))
            t.wait_listening(t.host, GATEWAY, PROXY_PORT, proc=proxy_state["proc"])
            proxy_state["cmd"] = want

        def use(arm):
            """Makes sure the proxy and the forwarder of `arm` (if any) are the ones running."""
            use_proxy(arm)
            if arm == "direct" or fwd_state["arm"] == arm:
                return
            if fwd_state["proc"] is not None:
                collect_stats()
                fwd_state["proc"].stop()
                if fwd_state["arm"] == "peer":
                    t.nsexec(t.rl, "nft", "delete", "table", "ip", PEER_TABLE)
            fwd_state["arm"] = None
            if arm == "peer":
                # The forwarder's redirect stays behind it (fail closed); the
                # peer's own is the same rule, for a first round that starts
                # with the peer.
                subprocess.run(["ip", "netns", "exec", t.rl, "nft", "-f", "-"], text=True,
                               check=True, input=PEER_REDIRECT % (GATEWAY, PROXY_PORT))
                fwd_state["proc"] = t.start(t.vm, ["haproxy", "-db", "-f", peer_conf],
                                            name="peer-haproxy")
                t.wait_listening(cns, GATEWAY, PROXY_PORT, proc=fwd_state["proc"])
            else:
                exe, extra = fwd_spec[arm]
                fwd_state["proc"] = t.start_forwarder(base_cfg + extra.replace("\\n", "\n"),
                                                      name="forwarder-" + arm, exe=exe)
            fwd_state["arm"] = arm
            # A relay just started: its first connection (page faults, the
            # pipe pool, haproxy's pools) is not a sample.
            warm = subprocess.run(["ip", "netns", "exec", cns, loadgen, "--proxy", arms[arm],
                                   "--mode", "small", "--url", small_url, "--samples", "1"],
                                  capture_output=True, text=True, timeout=60)
            if warm.returncode != 0:
                raise RuntimeError("the %s arm's warm-up request failed: %s %s" % (
                    arm, warm.stdout, warm.stderr))

        def run(arm, *args):
            use(arm)
            r = subprocess.run(["ip", "netns", "exec", cns, loadgen, "--proxy", arms[arm]] +
                               list(args), capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError("loadgen failed: %s %s" % (r.stdout, r.stderr))
            return json.loads(r.stdout)

        def fwd_cpu_ns(arm):
            if arm == "direct":
                return 0
            # Every thread's run time: the workers ([limits] workers) are
            # threads, and a process's own schedstat is its main thread's.
            pid = fwd_state["proc"].pid
            total = 0
            for tid in os.listdir("/proc/%d/task" % pid):
                try:
                    with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                        total += int(f.read().split()[0])
                except FileNotFoundError:
                    pass  # a thread that ended (a namespace helper)
            return total

        if a.peer:
            # As many haproxy threads as the forwarder has workers (its default
            # follows the CPUs): the forwarder, started first, is asked.
            use("via")
            peer_threads = t.stats()["workers"]
            peer_conf = write_haproxy_conf(d, t.rl, t.vm, GATEWAY, PROXY_PORT, peer_threads)
        if a.hold:
            use("via")
            for arm in ("direct", "via"):
                print("%s: ip netns exec %s %s --proxy %s --mode rate --url %s --seconds 5" % (
                    arm, cns, loadgen, arms[arm], small_url))
                print("%s: ip netns exec %s %s --proxy %s --mode bulk --url %s --samples 4" % (
                    arm, cns, loadgen, arms[arm], big_url))
            print("forwarder pid %d; press Enter to tear down" % fwd_state["proc"].pid,
                  flush=True)
            sys.stdin.readline()
            return
        only = set(a.only.split(","))
        per_round = []
        names = list(arms)
        for rnd in range(a.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            res = {arm: {} for arm in arms}
            if "small" in only:
                for arm in order:
                    r = run(arm, "--mode", "small", "--url", small_url, "--samples", str(a.small))
                    res[arm]["small_p50_ms"] = percentile(r["us"], 0.5) / 1000
                    res[arm]["small_p99_ms"] = percentile(r["us"], 0.99) / 1000
                    res[arm]["small_failed"] = r["failed"]
            if "tls" in only:
                for arm in order:
                    r = run(arm, "--mode", "tls", "--connect", "%s:443" % ORIGIN, "--path",
                            "/small", "--samples", str(a.tls))
                    res[arm]["tls1_p50_ms"] = percentile(r["us"], 0.5) / 1000
                    res[arm]["tls_failed"] = r["failed"]
                    r = run(arm, "--mode", "tls", "--connect", "%s:443" % ORIGIN, "--path",
                            "/small", "--samples", str(max(1, a.tls // 8)), "--parallel", "8")
                    res[arm]["tls8_p50_ms"] = percentile(r["us"], 0.5) / 1000
                    res[arm]["tls_failed"] += r["failed"]
            if "tp" in only:
                for arm in order:
                    for p, key in ((1, "tp1"), (4, "tp4")):
                        run(arm, "--mode", "small", "--url", small_url, "--samples", "1")
                        c0 = fwd_cpu_ns(arm)
                        r = run(arm, "--mode", "bulk", "--url", big_url, "--samples",
                                str(a.bulk), "--parallel", str(p))
                        c1 = fwd_cpu_ns(arm)
                        res[arm][key + "_MBps"] = r["bytes"] / r["seconds"] / 1e6
                        if arm != "direct":
                            res[arm][key + "_cpu_s_per_GiB"] = ((c1 - c0) / 1e9 /
                                                                (r["bytes"] / 2 ** 30))
                    if arm != "direct":
                        res[arm]["cpu_s_per_GiB"] = (res[arm]["tp1_cpu_s_per_GiB"] +
                                                     res[arm]["tp4_cpu_s_per_GiB"]) / 2
            if "rate" in only:
                for arm in order:
                    run(arm, "--mode", "small", "--url", small_url, "--samples", "1")
                    c0 = fwd_cpu_ns(arm)
                    r = run(arm, "--mode", "rate", "--url", small_url, "--seconds",
                            str(a.rate_seconds), "--concurrency", str(a.rate_concurrency))
                    c1 = fwd_cpu_ns(arm)
                    res[arm]["conn_per_s"] = r["per_second"]
                    res[arm]["rate_errors"] = r["errors"]
                    if arm != "direct" and r["completed"]:
                        res[arm]["fwd_cpu_us_per_conn"] = (c1 - c0) / 1e3 / r["completed"]
            per_round.append(res)
            print("round %d/%d (load %s): %s" % (
                rnd + 1, a.rounds, " ".join(open("/proc/loadavg").read().split()[:3]),
                "; ".join("%s %s" % (arm, " ".join(
                    "%s=%.4g" % (k, v) for k, v in sorted(res[arm].items()) if
                    not k.endswith("failed") and not k.endswith("errors")))
                          for arm in names)), file=sys.stderr)
        collect_stats()

        def med(arm, key):
            vals = [r[arm][key] for r in per_round if key in r.get(arm, {})]
            return statistics.median(vals) if vals else None

        def paired(arm_a, arm_b, key):
            vals = [r[arm_b][key] - r[arm_a][key] for r in per_round
                    if key in r.get(arm_a, {}) and key in r.get(arm_b, {})]
            return statistics.median(vals) if vals else None

        keys = ["small_p50_ms", "small_p99_ms", "tls1_p50_ms", "tls8_p50_ms", "tp1_MBps",
                "tp4_MBps", "conn_per_s", "cpu_s_per_GiB", "fwd_cpu_us_per_conn"]
        all_arms = ["direct"] + list(fwd_spec) + (["peer"] if a.peer else [])
        summary = {k: {arm: med(arm, k) for arm in all_arms} for k in keys}
        summary["fwd_cpu_s_per_GiB"] = {arm: summary["cpu_s_per_GiB"][arm] for arm in fwd_spec}
        peer_added = peer_paired = None
        if a.peer:
            peer_added = {"small_p50_ms": paired("direct", "peer", "small_p50_ms"),
                          "small_p99_ms": paired("direct", "peer", "small_p99_ms")}
            peer_paired = {k: paired("peer", "via", k) for k in keys}  # via - peer, per round
        errors = {arm: sum(r.get(arm, {}).get("small_failed", 0) +
                           r.get(arm, {}).get("tls_failed", 0) +
                           r.get(arm, {}).get("rate_errors", 0) for r in per_round)
                  for arm in all_arms}
        stats = fwd_stats["via"]
        # Paired differences per round (the same round's direct and via).
        added_p50 = paired("direct", "via", "small_p50_ms")
        added_p99 = paired("direct", "via", "small_p99_ms")

    s = summary

    def f(fmt, v):
        return "-" if v is None else fmt % v

    def pct(x, y):
        return "-" if x is None or y is None else "%.0f %%" % (100 * x / y)

    def diff(x, y, fmt):
        return "-" if x is None or y is None else fmt % (x - y)

    def verdict(ok):
        return "" if ok is None else (" ok" if ok else " MISSED")

    def ge(x, y):
        return None if x is None or y is None else x >= y

    def le(x, y):
        return None if x is None else x <= y

    rows = [
        ("small request, p50", "%.3f ms", "small_p50_ms", f("%+.3f ms", added_p50),
         "<= +0.05 ms", le(added_p50, 0.05)),
        ("small request, p99", "%.3f ms", "small_p99_ms", f("%+.3f ms", added_p99),
         "<= +0.2 ms", le(added_p99, 0.2)),
        ("CONNECT + TLS, p50", "%.2f ms", "tls1_p50_ms",
         diff(s["tls1_p50_ms"]["via"], s["tls1_p50_ms"]["direct"], "%+.3f ms"), "", None),
        ("CONNECT + TLS, 8 parallel, p50", "%.2f ms", "tls8_p50_ms",
         diff(s["tls8_p50_ms"]["via"], s["tls8_p50_ms"]["direct"], "%+.3f ms"), "", None),
        ("throughput, 1 client", "%.0f MB/s", "tp1_MBps",
         pct(s["tp1_MBps"]["via"], s["tp1_MBps"]["direct"]), ">= 90 %",
         ge(s["tp1_MBps"]["via"], None if s["tp1_MBps"]["direct"] is None else
            0.9 * s["tp1_MBps"]["direct"])),
        ("throughput, 4 parallel", "%.0f MB/s", "tp4_MBps",
         pct(s["tp4_MBps"]["via"], s["tp4_MBps"]["direct"]), ">= 90 %",
         ge(s["tp4_MBps"]["via"], None if s["tp4_MBps"]["direct"] is None else
            0.9 * s["tp4_MBps"]["direct"])),
        ("new connections per second", "%.0f /s", "conn_per_s",
         pct(s["conn_per_s"]["via"], s["conn_per_s"]["direct"]),
         ">= 20,000 /s via", ge(s["conn_per_s"]["via"], 20000)),
    ]
    cpu = s["cpu_s_per_GiB"]["via"]
    out = []
    out.append("proxy: %s; origin: nginx; %d rounds, arms alternating; every sample a new "
               "connection; medians of round figures" % (a.proxy_name, a.rounds))
    out.append("%-32s %12s %18s %12s  %s" % ("", "direct", "via the forwarder", "added",
                                              "target"))
    for name, fmt, key, added, target, ok in rows:
        out.append("%-32s %12s %18s %12s  %s%s" % (name, f(fmt, s[key]["direct"]),
                                                     f(fmt, s[key]["via"]), added, target,
                                                     verdict(ok)))
    out.append("%-32s %12s %18s %12s  %s%s" % (
        "forwarder CPU per GiB relayed", "-", f("%.3f s", cpu), "", "<= 0.3 s",
        verdict(le(cpu, 0.3))))
    out.append("%-32s %12s %18s" % ("forwarder CPU per connection", "-",
                                    f("%.1f us", s["fwd_cpu_us_per_conn"]["via"])))
    out.append("errors: direct %d, via %d; forwarder: %d stamped, %d refused, %d upstream "
               "failures" % (errors["direct"], errors["via"], stats.get("stamped", 0),
                             stats.get("refused_head", 0), stats.get("upstream_failed", 0)))
    ab = None
    if a.ab or a.ab_proxy:
        ab = {k: paired("via", "via-b", k) for k in keys}
        out.append("")
        if a.ab_proxy:
            out.append("A/B: via = the forwarder before %s; via-b = the same before %s" % (
                a.fy_proxy, a.ab_proxy))
        else:
            out.append("A/B: via = %s %r; via-b = %s %r" % (
                a.build, a.forwarder_extra, a.ab, fwd_spec["via-b"][1]))
        out.append("%-32s %12s %12s %14s" % ("", "via", "via-b", "b - a (paired)"))
        for k in keys:
            if s[k]["via"] is None:
                continue
            out.append("%-32s %12.4g %12.4g %+14.4g" % (k, s[k]["via"], s[k]["via-b"], ab[k]))
        out.append("errors: via-b %d" % errors["via-b"])
    if a.peer:
        out.append("")
        out.append("peer: %s in the forwarder's place (same redirect, same namespaces); "
                   "it parses and stamps nothing" % peer_name(peer_threads))
        out.append("%-32s %12s %18s %12s %12s  %s" % ("", "direct", "via the forwarder",
                                                      "peer", "peer added", "via - peer, paired"))
        for name, fmt, key, added, _, _ in rows:
            if key in ("small_p50_ms", "small_p99_ms"):
                padd = f("%+.3f ms", peer_added[key])
            elif key.startswith("tp") or key == "conn_per_s":
                padd = pct(s[key]["peer"], s[key]["direct"])
            else:
                padd = diff(s[key]["peer"], s[key]["direct"], "%+.3f ms")
            out.append("%-32s %12s %18s %12s %12s  %s" % (
                name, f(fmt, s[key]["direct"]), f(fmt, s[key]["via"]), f(fmt, s[key]["peer"]),
                padd, f(fmt.replace("%", "%+", 1), peer_paired[key])))
        for name, fmt, key in (("relay CPU per GiB relayed", "%.3f s", "cpu_s_per_GiB"),
                               ("relay CPU per connection", "%.1f us", "fwd_cpu_us_per_conn")):
            out.append("%-32s %12s %18s %12s %12s  %s" % (
                name, "-", f(fmt, s[key]["via"]), f(fmt, s[key]["peer"]), "",
                f(fmt.replace("%", "%+", 1), peer_paired[key])))
        out.append("errors: peer %d" % errors["peer"])
    print("\n".join(out))
    path = a.out or os.path.join(os.path.abspath(a.build), "bench-forwarder.json")
    with open(path, "w") as fh:
        json.dump({"proxy": a.proxy_name, "rounds": a.rounds, "summary": summary,
                   "added_small_p50_ms": added_p50, "added_small_p99_ms": added_p99,
                   "ab_paired": ab, "peer": a.peer and peer_name(peer_threads),
                   "peer_added_small_ms": peer_added, "via_minus_peer_paired": peer_paired,
                   "errors": errors, "forwarder_stats": stats,
                   "forwarder_stats_by_arm": fwd_stats, "per_round": per_round,
                   "table": out}, fh, indent=1)
    print("(JSON: %s)" % path)


if __name__ == "__main__":
    main()

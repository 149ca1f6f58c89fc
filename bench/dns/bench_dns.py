#!/usr/bin/python3
"""DNS as a channel, before and after fy-dnsfwd, and the forwarder's added
latency (docs/fy-dnsfwd.md, "Measured here"). Not a test: it prints figures.
Runs as root in the namespaces of tests/wall/dnsnet.py (torn down at exit).

  sudo FY_BUILD_DIR=$PWD/build python3 bench/dns/bench_dns.py [--seconds 5]
       [--rounds 7] [--queries 300]

Channel: a walled process sends iodine-style TXT queries, three 63-character
base32 labels of fresh data each (117 bytes), one after another, to the
resolver it is given (192.168.5.3, which recurses to the zone's authoritative
stand-in in the public namespace), for --seconds. What counts is what the
authoritative server received: queries for the zone x 117 bytes. Three runs:
the machine wall as on main (DNS to the VM's resolver), the wall with
dns_forwarder and fy-dnsfwd's policy (github.com, pypi.org), and the same
forwarder with the tunnel's zone allowed (what the rate bound alone leaves).

Latency: alternating rounds, each --queries sequential A queries for an
allowed name: direct (root in the guest asks the resolver; root is not
redirected) and via (the walled user asks the same address; the wall
redirects it to fy-dnsfwd, which asks the resolver). p50 per round; the
figure is the median over rounds of via - direct. Over UDP with log_uid on
and off, then over TCP (one connection per round, all its queries on it;
fy-dnsfwd asks the resolver over TCP, one upstream connection per query).
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "wall"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "lib"))  # fyproc, fynet (fywnet's)
os.environ.setdefault("FY_SOURCE_DIR", os.path.join(HERE, "..", ".."))

import dnsnet as d  # noqa: E402
import fywnet as n  # noqa: E402

ZONE = "t.example"
PER_QUERY = 117


def channel(t, seconds, label):
    before = len([r for r in t.auth.records() if r["name"] and r["name"].endswith(ZONE)])
    r = d.dnsprobe(t.guest, n.WALLED_UID, "channel", d.RESOLVER, ZONE, seconds,
                   timeout=seconds + 30)
    got = len([r for r in t.auth.records() if r["name"] and r["name"].endswith(ZONE)]) - before
    out = {"run": label, "queries_sent": r["queries"], "answered": r["answered"],
           "reached_auth": got, "bytes_out": got * PER_QUERY,
           "bytes_per_s": round(got * PER_QUERY / seconds, 1)}
    print(json.dumps(out), flush=True)
    return out


def p50(ns, uid, count, tcp=False):
    r = d.dnsprobe(ns, uid, "query", d.RESOLVER, "bench.github.com", "--count", count,
                   "--keep-lat", *(["--tcp"] if tcp else []), timeout=120)
    assert r["answered"] == count, r
    return statistics.median(r["lat_us"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--queries", type=int, default=300)
    a = ap.parse_args()
    n.sweep_stale()
    t = d.DnsTopology()
    try:
        results = {"channel": [], "latency": {}}
        t.wall(forwarder=False)
        results["channel"].append(channel(t, a.seconds, "before: wall as on main, direct to "
                                                        "the resolver"))
        p, _, _ = t.start_dnsfwd(t.dnsfwd_config(rate=20, burst=40))
        t.wall(forwarder=True)
        results["channel"].append(channel(t, a.seconds, "after: fy-dnsfwd, allow github.com "
                                                        "pypi.org, rate 20/s"))
        p.terminate()
        p.wait(timeout=10)
        p, _, _ = t.start_dnsfwd(t.dnsfwd_config(rate=20, burst=40, allow=["github.com", ZONE]))
        results["channel"].append(channel(t, a.seconds, "after, the tunnel's zone allowed: "
                                                        "the rate bound alone"))
        p.terminate()
        p.wait(timeout=10)
        for proto, log_uid in (("udp", "true"), ("udp", "false"), ("tcp", "true")):
            tcp = proto == "tcp"
            p, _, _ = t.start_dnsfwd(t.dnsfwd_config(rate=100000, burst=100000,
                                                     extra=f"log_uid = {log_uid}\n"))
            direct, via = [], []
            p50(t.guest, 0, 50, tcp)  # warm
            p50(t.guest, n.WALLED_UID, 50, tcp)
            for i in range(a.rounds):
                for which in (("direct", "via") if i % 2 == 0 else ("via", "direct")):
                    if which == "direct":
                        direct.append(p50(t.guest, 0, a.queries, tcp))
                    else:
                        via.append(p50(t.guest, n.WALLED_UID, a.queries, tcp))
            diffs = [v - dd for v, dd in zip(via, direct)]
            lat = {"proto": proto, "log_uid": log_uid, "rounds": a.rounds,
                   "queries_per_round": a.queries,
                   "direct_p50_us": [round(x, 1) for x in direct],
                   "via_p50_us": [round(x, 1) for x in via],
                   "median_direct_p50_us": round(statistics.median(direct), 1),
                   "median_via_p50_us": round(statistics.median(via), 1),
                   "added_p50_ms": round(statistics.median(diffs) / 1000, 3),
                   "ratio": round(statistics.median(via) / statistics.median(direct), 3)}
            results["latency"][f"{proto}/{log_uid}"] = lat
            print(json.dumps(lat), flush=True)
            ok = lat["added_p50_ms"] <= 0.2
            print(f"{proto}, log_uid {log_uid}: added p50 latency {lat['added_p50_ms']} ms: "
                  f"{'within' if ok else 'OVER'} the 0.2 ms target", flush=True)
            p.terminate()
            p.wait(timeout=10)
    finally:
        n.cleanup()


if __name__ == "__main__":
    main()

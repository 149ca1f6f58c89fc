#!/usr/bin/env python3
"""fy-netlog names principals, on a generated Network Log and engine.jsonl
(no engine needed): per host who used it with counts, the refusals and their
grants naming who asked and with which User-Agent, `--by principal`, the
`credentials` widenings report over a time range, `--json` for each, every
text view within 80 columns; and without engine.jsonl the views are what they
were (stamps as they are, no principal lines). With --follow, snapshots that
arrive after fy-netlog started (also across a rotation of engine.jsonl) name
the rows that follow, a row whose snapshot comes just after it waits for it,
and one never named is printed as unresolved once the wait is over.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unicodedata
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "forwarder"))
from fyf_topology import build_dir  # noqa: E402

FY_NETLOG = os.path.join(build_dir(), "proxy", "netlog", "fy-netlog")
T0 = 1796191900  # s, a fixed host time
A, B, C = "a" * 64, "b" * 64, "c" * 64


def iso(s):
    import datetime
    return datetime.datetime.fromtimestamp(s, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.000Z")


def snap(t, cid, name, ip, state="running", project=None, service=None):
    claims = {"name": name}
    if project:
        claims.update(project=project, service=service)
    eps = [{"net": "shop_default", "iface": "podman1", "ip": ip}] if ip else []
    return {"ts": iso(t), "kind": "container", "event": "start", "id": cid, "state": state,
            "claims": claims, "endpoints": eps}


def row(t, host, src=None, who=None, **kw):
    r = {"ts": iso(t), "method": "GET", "host": host, "path": "/", "status": 200,
         "injected": False, "replayed": False, "conn": 1, "peer": "192.168.5.15:1",
         "bytes_up": 10, "bytes_down": 20}
    if src:
        r.update(src=src, net="podman1", seq=1, boot="b")
    if who:
        r.update(src="127.0.0.1", net="host", who=who, seq=1, boot="b")
    r.update(kw)
    return r


class Principals(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fy-principals-")
        self.log = os.path.join(self.dir, "egress.jsonl")
        snaps = [{"ts": iso(T0), "kind": "watch", "event": "start", "containers": 0},
                 snap(T0 + 1, A, "shop_web_1", "10.89.0.2", project="shop", service="web"),
                 snap(T0 + 2, B, "sandbox-1", "10.89.0.3"),
                 snap(T0 + 100, B, "sandbox-1", None, state="removed"),
                 snap(T0 + 200, C, "sandbox-2", "10.89.0.3")]
        rows = [row(T0 + 10, "api.github.com", "10.89.0.2", injected=True, rule="gh", ua="gh/2.0"),
                row(T0 + 11, "api.github.com", "10.89.0.2", injected=True, rule="gh", ua="gh/2.0"),
                row(T0 + 12, "api.github.com", "10.89.0.3", injected=True, rule="gh",
                    ua="python-requests/2.31"),
                row(T0 + 13, "evil.example", "10.89.0.3", status=403, blocked=True,
                    ua="curl/8.5.0", method="CONNECT"),
                row(T0 + 210, "evil.example", "10.89.0.3", status=403, blocked=True,
                    method="CONNECT"),
                row(T0 + 211, "api.github.com", "10.89.0.3", injected=True, rule="gh"),
                row(T0 + 212, "pypi.org", who="build:crun-buildah-buildah7.scope"),
                row(T0 + 213, "pypi.org", who="user", injected=True, rule="pypi"),
                row(T0 + 214, "pypi.org", "10.89.0.99"),
                row(T0 + 215, "pypi.org", unattributed=True)]
        with open(os.path.join(self.dir, "engine.jsonl"), "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in snaps)
        with open(self.log, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_netlog(self, *args):
        r = subprocess.run([FY_NETLOG] + list(args) + ["--utc", "--width", "80", self.log],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def assert_fits(self, out, width=80):
        for l in out.splitlines():
            w = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in l)
            self.assertLessEqual(w, width, l)

    def test_summary_names_who_used_each_host(self):
        out = self.run_netlog()
        self.assert_fits(out)
        lines = out.splitlines()
        gh = lines.index([l for l in lines if l.startswith("api.github.com")][0])
        self.assertEqual(lines[gh + 1], "  by svc:shop/web 2, ctr:sandbox-1 1, ctr:sandbox-2 1")
        doc = json.loads(self.run_netlog("--json"))
        hosts = {h["host"]: h for h in doc["hosts"]}
        self.assertEqual(hosts["pypi.org"]["principals"],
                         {"build:crun-buildah-buildah7.scope": 1, "user": 1, "unresolved": 1,
                          "unattributed": 1})
        self.assertEqual(hosts["evil.example"]["principals"],
                         {"ctr:sandbox-1": 1, "ctr:sandbox-2": 1})

    def test_refusals_name_who_asked_and_the_tools(self):
        out = self.run_netlog("refusals")
        self.assert_fits(out)
        table = [l for l in out.splitlines() if " block " in l]
        self.assertTrue(table[0].endswith("ctr:sandbox-1"), table[0])
        self.assertTrue(table[1].endswith("ctr:sandbox-2"), table[1])  # the address's new holder
        self.assertIn("fy allow add evil.example", out)
        self.assertIn("asked by ctr:sandbox-1 1x (curl/8.5.0); ctr:sandbox-2 1x (no User-Agent)",
                      out)

    def test_refusals_json_names_who_asked_and_the_grants(self):
        # A would-block on a key no `fy allow` accepts, from no stamp: no command is offered.
        with open(self.log, "a") as f:
            f.write(json.dumps(row(T0 + 220, "bad;host.example", status=0, would_block=True,
                                   unattributed=True, ua="x/1")) + "\n")
        lines = [json.loads(l) for l in self.run_netlog("refusals", "--json").splitlines()]
        rows, last = lines[:-1], lines[-1]
        # Each refusal row as the log has it, plus who asked (as `--by principal --json`
        # writes a principal).
        self.assertEqual([r["ts"] for r in rows], [iso(T0 + 13), iso(T0 + 210), iso(T0 + 220)])
        self.assertEqual((rows[0]["src"], rows[0]["net"], rows[0]["ua"]),
                         ("10.89.0.3", "podman1", "curl/8.5.0"))
        self.assertEqual(rows[0]["asked_by"], {
            "principal": "ctr:sandbox-1", "kind": "container", "id": B,
            "claims": {"name": "sandbox-1", "project": "", "service": ""},
            "basis": "engine_claim"})
        self.assertEqual(rows[1]["asked_by"]["principal"], "ctr:sandbox-2")  # the new holder
        self.assertEqual(rows[1]["asked_by"]["id"], C)
        self.assertEqual(rows[2]["asked_by"], {"principal": "unattributed",
                                                "kind": "unattributed"})
        # Then one document: the grants, as the text's "To grant, run" list, most recent first.
        self.assertEqual(list(last), ["grants"])
        bad, evil = last["grants"]
        self.assertEqual(bad["host"], "bad;host.example")
        self.assertIsNone(bad["command"])
        self.assertEqual((bad["blocked"], bad["would_block"]), (0, 1))
        self.assertEqual(bad["asked_by"], [{"principal": "unattributed", "kind": "unattributed",
                                            "requests": 1,
                                            "user_agents": [{"user_agent": "x/1",
                                                             "requests": 1}]}])
        self.assertEqual(evil["host"], "evil.example")
        self.assertEqual(evil["command"], "fy allow add evil.example")
        self.assertEqual((evil["blocked"], evil["would_block"]), (2, 0))
        self.assertEqual(evil["last_seen"], iso(T0 + 210))
        asked = {a["principal"]: a for a in evil["asked_by"]}
        self.assertEqual(sorted(asked), ["ctr:sandbox-1", "ctr:sandbox-2"])
        self.assertEqual(asked["ctr:sandbox-1"]["id"], B)
        self.assertEqual(asked["ctr:sandbox-1"]["requests"], 1)
        self.assertEqual(asked["ctr:sandbox-1"]["user_agents"],
                         [{"user_agent": "curl/8.5.0", "requests": 1}])
        self.assertEqual(asked["ctr:sandbox-2"]["user_agents"],
                         [{"user_agent": None, "requests": 1}])
        # An address no snapshot named: the principal says why, as --by principal does.
        with open(self.log, "a") as f:
            f.write(json.dumps(row(T0 + 230, "evil.example", "10.89.0.99", status=403,
                                   blocked=True)) + "\n")
        lines = [json.loads(l) for l in self.run_netlog("refusals", "--json").splitlines()]
        self.assertEqual(lines[-2]["asked_by"]["principal"], "unresolved 10.89.0.99@podman1")
        self.assertEqual(lines[-2]["asked_by"]["kind"], "unresolved")
        self.assertIn("no snapshot ever showed 10.89.0.99", lines[-2]["asked_by"]["reason"])
        evil = [g for g in lines[-1]["grants"] if g["host"] == "evil.example"][0]
        self.assertIn("unresolved 10.89.0.99@podman1", [a["principal"] for a in evil["asked_by"]])

    def test_by_principal(self):
        out = self.run_netlog("--by", "principal")
        self.assert_fits(out)
        self.assertTrue(out.startswith("PRINCIPAL"), out)
        self.assertIn("names are the engine's claims", out)
        self.assertIn("no snapshot ever showed 10.89.0.99 on podman1", out)
        doc = json.loads(self.run_netlog("--by", "principal", "--json"))
        by = {p["principal"]: p for p in doc["principals"]}
        self.assertEqual(by["svc:shop/web"]["hosts"], {"api.github.com": 2})
        self.assertEqual(by["svc:shop/web"]["claims"]["name"], "shop_web_1")
        self.assertEqual(by["svc:shop/web"]["basis"], "engine_claim")
        self.assertEqual(by["ctr:sandbox-1"]["blocked"], 1)
        self.assertEqual(by["user"]["kind"], "user")
        self.assertEqual(by["unresolved 10.89.0.99@podman1"]["kind"], "unresolved")
        self.assertEqual(by["unattributed"]["hosts"], {"pypi.org": 1})

    def test_credentials_widenings_report(self):
        out = self.run_netlog("credentials")
        self.assert_fits(out)
        self.assertIn("rule gh: injected 4 times for 3 principals", out)
        self.assertIn("rule pypi: injected 1 time for 1 principal", out)
        doc = json.loads(self.run_netlog("credentials", "--json"))
        gh = [r for r in doc["credentials"] if r["rule"] == "gh"][0]
        got = {p["principal"]: p["injections"] for p in gh["principals"]}
        self.assertEqual(got, {"svc:shop/web": 2, "ctr:sandbox-1": 1, "ctr:sandbox-2": 1})
        # Over a time range: only what was injected then.
        doc = json.loads(self.run_netlog("credentials", "--json", "--since", iso(T0 + 200)))
        gh = [r for r in doc["credentials"] if r["rule"] == "gh"][0]
        self.assertEqual([p["principal"] for p in gh["principals"]], ["ctr:sandbox-2"])

    def test_without_snapshots_the_views_are_unchanged(self):
        os.unlink(os.path.join(self.dir, "engine.jsonl"))
        out = self.run_netlog()
        self.assertNotIn("  by ", out)
        for h in json.loads(self.run_netlog("--json"))["hosts"]:
            self.assertNotIn("principals", h)
        out = self.run_netlog("refusals")
        self.assertNotIn("asked by", out)
        self.assertIn("podman1 10.89.0.3", out)
        # A bad engine line is skipped and said, never fatal.
        with open(os.path.join(self.dir, "engine.jsonl"), "w") as f:
            f.write("not json\n")
        r = subprocess.run([FY_NETLOG, self.log], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("skipped 1 engine snapshot line", r.stderr)

    def test_usage_errors(self):
        r = subprocess.run([FY_NETLOG, "--by", "host", self.log], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--by principal", r.stderr)
        r = subprocess.run([FY_NETLOG, "rows", "--by", "principal", self.log],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)


class Follow(unittest.TestCase):
    """fy-netlog --follow reloads engine.jsonl as snapshots arrive."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fy-principals-follow-")
        self.log = os.path.join(self.dir, "egress.jsonl")
        self.engine = os.path.join(self.dir, "engine.jsonl")
        with open(self.engine, "w") as f:
            f.write(json.dumps({"ts": iso(T0), "kind": "watch", "event": "start",
                                "containers": 0}) + "\n")
        open(self.log, "w").close()
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def follow(self, *args):
        import queue
        import threading
        p = subprocess.Popen([FY_NETLOG] + list(args) + ["--follow", "-n", "0", "--width", "120",
                                                         self.log],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        q = queue.Queue()
        threading.Thread(target=lambda: [q.put(l) for l in p.stdout], daemon=True).start()
        return p, q

    def append(self, path, obj):
        with open(path, "a") as f:
            f.write(json.dumps(obj) + "\n")

    def line_with(self, q, text, timeout=10.0):
        import queue
        import time
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                l = q.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(l)
            if text in l:
                return l
        raise AssertionError("no followed line with %r: %r" % (text, seen))

    def test_followed_rows_name_containers_whose_snapshots_arrive_later(self):
        import time
        rows_p, rows_q = self.follow("rows")
        ref_p, ref_q = self.follow("refusals")
        time.sleep(0.5)  # both have read the (empty) log and the engine file
        D, E = "d" * 64, "e" * 64
        # A container started after fy-netlog did: its snapshot first, then its row.
        self.append(self.engine, snap(T0 + 5, D, "late-one", "10.89.0.7"))
        time.sleep(0.4)
        self.append(self.log, row(T0 + 10, "pypi.org", "10.89.0.7", path="/first"))
        self.assertIn("by:ctr:late-one", self.line_with(rows_q, "/first"))
        # Its row before its snapshot (the watcher's lag): the row waits for it.
        self.append(self.log, row(T0 + 20, "pypi.org", "10.89.0.8", path="/second"))
        time.sleep(0.5)
        self.append(self.engine, snap(T0 + 21, E, "later-two", "10.89.0.8"))
        self.assertIn("by:ctr:later-two", self.line_with(rows_q, "/second"))
        # A refusal names who asked.
        self.append(self.log, row(T0 + 30, "evil.example", "10.89.0.7", status=403,
                                  blocked=True, path="/refused"))
        self.assertTrue(self.line_with(ref_q, "evil.example").rstrip().endswith("ctr:late-one"))
        # engine.jsonl rotated, as fy-engine-watch's writer does: the new file is read too.
        os.rename(self.engine, os.path.join(self.dir, "engine.20261202T000000Z.jsonl"))
        self.append(self.engine, snap(T0 + 40, C, "after-rotation", "10.89.0.9"))
        time.sleep(0.5)
        self.append(self.log, row(T0 + 41, "pypi.org", "10.89.0.9", path="/third"))
        self.assertIn("by:ctr:after-rotation", self.line_with(rows_q, "/third"))
        # Never named: printed once the wait is over, as unresolved.
        t = time.monotonic()
        self.append(self.log, row(T0 + 50, "pypi.org", "10.89.0.66", path="/fourth"))
        l = self.line_with(rows_q, "/fourth")
        self.assertIn("(unresolved)", l)
        self.assertGreater(time.monotonic() - t, 1.5)  # it waited for a snapshot
        for p in (rows_p, ref_p):
            p.terminate()
            self.assertEqual(p.wait(timeout=10), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""The real fy-netlog binary against Network Logs generated here.

Every expected number is computed by this file from the rows it wrote, by the
rules docs/fy-netlog.md states; nothing is read back from fy-netlog to build
an expectation. Run by `meson test --suite netlog` (FY_BUILD_DIR is set), or by
hand: FY_BUILD_DIR=build-netlog python3 tests/netlog/test_fy_netlog.py
"""

import datetime
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unicodedata
import unittest

BUILD = os.environ.get("FY_BUILD_DIR", "build")
FY_NETLOG = os.environ.get("FY_NETLOG") or os.path.join(BUILD, "proxy", "netlog", "fy-netlog")
NOW_MS = int(time.time() * 1000)


def iso(ms):
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return t.isoformat(timespec="milliseconds")


def stamp(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y%m%dT%H%M%SZ")


def parse_iso(s):
    return int(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000)


def line(row):
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def columns(s):
    """Display columns, as a terminal counts them."""
    w = 0
    for c in s:
        if unicodedata.combining(c):
            continue
        w += 2 if unicodedata.east_asian_width(c) in "WF" else 1
    return w


def human_bytes(n):
    """The documented units: 512B, 1.5K, 45M (binary)."""
    if n < 1024:
        return f"{n}B"
    v, u = float(n), -1
    while v >= 1024 and u < 5:
        v /= 1024
        u += 1
    units = "KMGTPE"
    if v < 9.95:
        return f"{v:.1f}{units[u]}"
    if v < 1023.5 or u == 5:
        return f"{v:.0f}{units[u]}"
    return f"1.0{units[u + 1]}"


def is_refusal(r):
    return bool(r.get("blocked") or r.get("would_block"))


def is_error(r):
    return bool(r.get("error")) or (r["status"] >= 400 and not is_refusal(r))


def expected_summary(rows):
    per = {}
    for r in rows:
        h = r["host"].lower()
        s = per.setdefault(h, {"host": h, "requests": 0, "blocked": 0, "would_block": 0,
                               "errors": 0, "bytes_up": 0, "bytes_down": 0,
                               "first": None, "last": None})
        if r.get("blocked"):
            s["requests"] += 1
            s["blocked"] += 1
        elif r.get("would_block"):
            s["would_block"] += 1
        else:
            s["requests"] += 1
        s["errors"] += is_error(r)
        s["bytes_up"] += r.get("bytes_up", 0)
        s["bytes_down"] += r.get("bytes_down", 0)
        t = parse_iso(r["ts"])
        s["first"] = t if s["first"] is None else min(s["first"], t)
        s["last"] = t if s["last"] is None else max(s["last"], t)
    return sorted(per.values(), key=lambda s: (-s["last"], s["host"]))


HOSTS = ["api.github.com", "github.com", "github.com:22", "pypi.org", "files.pythonhosted.org",
         "registry.npmjs.org", "objects.githubusercontent.com", "[2001:db8::1]:8443",
         "deb.debian.org", "cache.build.internal.example.com:8443"]


def generate_rows(n, seed, start_ms, end_ms):
    """Rows of every kind, in time order, between start_ms and end_ms."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts = start_ms + (end_ms - start_ms) * i // max(1, n - 1)
        host = rng.choice(HOSTS)
        r = {"ts": iso(ts), "conn": i + 1, "method": "GET", "host": host,
             "path": "/p/%d?q=%d" % (i, rng.randrange(100)), "status": rng.choice(
                 [200, 200, 200, 204, 301, 304, 401, 404, 500, 502, 504]),
             "injected": host == "api.github.com", "replayed": rng.random() < 0.05,
             "bytes_up": rng.randrange(0, 5000), "bytes_down": rng.randrange(0, 3 << 20),
             "peer": "127.0.0.1:%d" % (40000 + i), "tls": "decrypted"}
        kind = rng.random()
        if kind < 0.12:
            r.update(method="CONNECT", path="", status=403, blocked=True, bytes_up=0,
                     bytes_down=0)
            r.pop("tls")
        elif kind < 0.22:
            r.update(status=0, would_block=True, bytes_up=0, bytes_down=0)
        elif kind < 0.32:
            r.update(method="CONNECT", path="", status=0, passthrough=True, tls="passthrough",
                     sni=host.split(":")[0])
        elif kind < 0.37:
            r.update(status=rng.choice([502, 504]), error=rng.choice(
                ["dns: NXDOMAIN", "connect: refused", "timeout: 30s", "tls_verify: expired"]))
        if r["status"] >= 400 and not r.get("error") and rng.random() < 0.5:
            r["error_body"] = "not found"
        a = rng.random()
        if a < 0.3:
            r["unattributed"] = True
        elif a < 0.7:
            r.update(src="10.89.1.%d" % rng.randrange(2, 9), net="podman1",
                     who="container:" + "%064x" % rng.getrandbits(256), seq=i + 1, boot="b00t")
        if rng.random() < 0.3:
            r["ua"] = rng.choice(["curl/8.5.0", "pip/24.0", "npm/10.8.2", "git/2.43.0"])
        rows.append(r)
    return rows


class NetlogTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fy-netlog-py.")
        self.log = os.path.join(self.dir, "egress.jsonl")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ----------------------------------------------------------------

    def write_rotated(self, rows, parts):
        """Splits rows over dated backups (the last part is the current file).

        Backups get the stamp of their last row, two within one second get the
        writer's -N suffixes, so the name order is not the plain sort order."""
        files = []
        n = len(rows)
        bounds = [n * k // parts for k in range(parts + 1)]
        for k in range(parts):
            chunk = rows[bounds[k]:bounds[k + 1]]
            if k == parts - 1:
                name = "egress.jsonl"
            else:
                last = parse_iso(chunk[-1]["ts"]) if chunk else NOW_MS
                name = "egress.%s.jsonl" % stamp(last)
                i = 0
                while os.path.exists(os.path.join(self.dir, name)):
                    i += 1
                    name = "egress.%s-%d.jsonl" % (stamp(last), i)
            with open(os.path.join(self.dir, name), "w", encoding="utf-8") as f:
                f.write("".join(line(r) + "\n" for r in chunk))
            files.append(name)
        return files

    def run_netlog(self, *args, env=None, timeout=60, check=True):
        e = dict(os.environ)
        e.pop("COLUMNS", None)
        e["TZ"] = "UTC"
        e.update(env or {})
        p = subprocess.run([FY_NETLOG, *args], capture_output=True, env=e, timeout=timeout)
        out = p.stdout.decode("utf-8")  # strict: the output must be valid UTF-8
        err = p.stderr.decode("utf-8")
        if check:
            self.assertEqual(p.returncode, 0, err)
        return p.returncode, out, err

    def json_rows(self, *args):
        _, out, _ = self.run_netlog("rows", "--json", *args, self.dir)
        return [json.loads(l) for l in out.splitlines()]

    def assert_fits(self, text, width=80):
        for l in text.splitlines():
            self.assertLessEqual(columns(l), width, repr(l))
            self.assertNotIn("\x1b", l)

    # ---- summary ----------------------------------------------------------------

    def test_summary_json_is_exact(self):
        rows = generate_rows(400, 1, NOW_MS - 48 * 3600 * 1000, NOW_MS - 60 * 1000)
        self.write_rotated(rows, 4)
        _, out, err = self.run_netlog("--json", self.dir)
        doc = json.loads(out)
        self.assertEqual(err, "")
        self.assertEqual(doc["rows_read"], len(rows))
        self.assertEqual(doc["bad_lines"], 0)
        self.assertEqual(len(doc["files"]), 4)
        want = expected_summary(rows)
        self.assertEqual([h["host"] for h in doc["hosts"]], [s["host"] for s in want])
        for got, s in zip(doc["hosts"], want):
            for k in ("requests", "blocked", "would_block", "errors", "bytes_up", "bytes_down"):
                self.assertEqual(got[k], s[k], (s["host"], k))
            self.assertEqual(parse_iso(got["first_seen"]), s["first"])
            self.assertEqual(parse_iso(got["last_seen"]), s["last"])
        tot = doc["total"]
        for k in ("requests", "blocked", "would_block", "errors", "bytes_up", "bytes_down"):
            self.assertEqual(tot[k], sum(s[k] for s in want), k)

    def test_summary_table_on_80_columns(self):
        rows = generate_rows(300, 2, NOW_MS - 6 * 3600 * 1000, NOW_MS - 90 * 1000)
        self.write_rotated(rows, 3)
        _, out, _ = self.run_netlog(self.dir)
        self.assert_fits(out)
        lines = out.splitlines()
        self.assertEqual(lines[0].split(),
                         ["HOST", "REQS", "BLOCK", "WOULD", "ERR", "UP", "DOWN", "LAST"])
        want = expected_summary(rows)
        body = lines[1:1 + len(want)]
        for l, s in zip(body, want):
            host = s["host"] if columns(s["host"]) <= 29 else None
            f = l.split()
            if host:
                self.assertEqual(f[0], host)
            else:  # cut in the middle, both ends kept
                self.assertIn("…", f[0])
                self.assertTrue(s["host"].endswith(f[0].split("…")[1]))
                self.assertTrue(s["host"].startswith(f[0].split("…")[0]))
            self.assertEqual(f[1:7], [str(s["requests"]), str(s["blocked"]),
                                      str(s["would_block"]), str(s["errors"]),
                                      human_bytes(s["bytes_up"]), human_bytes(s["bytes_down"])],
                             l)
            self.assertEqual(f[8], "ago")
        self.assertEqual(lines[1 + len(want)], "")
        tot_rows = len(rows)
        self.assertTrue(lines[2 + len(want)].startswith(
            "%d hosts, %d rows" % (len(want), tot_rows)), lines[2 + len(want)])
        nb = sum(1 for r in rows if r.get("blocked"))
        nw = sum(1 for r in rows if r.get("would_block") and not r.get("blocked"))
        self.assertIn("%d blocked, %d would-block: see `fy-netlog refusals`" % (nb, nw), out)

    def test_empty_log(self):
        open(self.log, "w").close()
        _, out, _ = self.run_netlog(self.dir)
        self.assertIn("no rows", out)
        _, out, _ = self.run_netlog("--json", self.dir)
        self.assertEqual(json.loads(out)["hosts"], [])
        _, out, _ = self.run_netlog("rows", self.dir)
        self.assertEqual(out, "no rows\n")
        _, out, _ = self.run_netlog("refusals", self.dir)
        self.assertEqual(out, "no refusals\n")
        _, out, _ = self.run_netlog("rows", "--json", self.dir)
        self.assertEqual(out, "")

    # ---- filters ----------------------------------------------------------------

    def test_filters_select_exactly_the_matching_rows(self):
        rows = generate_rows(500, 3, NOW_MS - 10 * 3600 * 1000, NOW_MS - 1000)
        self.write_rotated(rows, 3)

        def host_of(key):
            if key.startswith("["):
                return key[:key.index("]") + 1], (key.split("]:")[1] if "]:" in key else None)
            return (key.split(":")[0], key.split(":")[1] if ":" in key else None)

        cases = [
            (["--host", "api.github.com"], lambda r: host_of(r["host"])[0] == "api.github.com"),
            (["--host", "*.github.com"],
             lambda r: host_of(r["host"])[0].endswith(".github.com")),
            (["--host", "*.githubusercontent.com", "--host", "pypi.org"],
             lambda r: host_of(r["host"])[0] in ("objects.githubusercontent.com", "pypi.org")),
            (["--host", "github.com:22"], lambda r: r["host"] == "github.com:22"),
            (["--host", "github.com:443"], lambda r: r["host"] == "github.com"),
            (["--host", "[2001:db8::1]"], lambda r: r["host"].startswith("[2001:db8::1]")),
            (["--status", "4xx"], lambda r: 400 <= r["status"] <= 499),
            (["--status", ">=500"], lambda r: r["status"] >= 500),
            (["--status", "403,0"], lambda r: r["status"] in (403, 0)),
            (["--status", "200-299"], lambda r: 200 <= r["status"] <= 299),
            (["--until", iso(NOW_MS - 5 * 3600 * 1000)],
             lambda r: parse_iso(r["ts"]) <= NOW_MS - 5 * 3600 * 1000),
            (["--since", iso(NOW_MS - 6 * 3600 * 1000), "--until", iso(NOW_MS - 3 * 3600 * 1000),
              "--host", "*.org", "--status", "<400"],
             lambda r: NOW_MS - 6 * 3600 * 1000 <= parse_iso(r["ts"]) <= NOW_MS - 3 * 3600 * 1000
             and host_of(r["host"])[0].endswith(".org") and r["status"] < 400),
        ]
        for args, pred in cases:
            with self.subTest(args=args):
                want = [r for r in rows if pred(r)]
                self.assertTrue(want, "the generated log must exercise " + str(args))
                self.assertLess(len(want), len(rows))
                got = self.json_rows(*args)
                self.assertEqual(got, want)
        # A relative time counts back from when fy-netlog runs: somewhere between
        # the start of this test and the end of the run.
        before = int(time.time() * 1000)
        got = self.json_rows("--since", "2h")
        after = int(time.time() * 1000)
        self.assertLessEqual(got, [r for r in rows if parse_iso(r["ts"]) >= before - 7200 * 1000])
        self.assertGreaterEqual(got,
                                [r for r in rows if parse_iso(r["ts"]) >= after - 7200 * 1000])
        self.assertGreater(len(got), 0)

    def test_rows_json_is_the_log_lines_verbatim(self):
        rows = generate_rows(50, 4, NOW_MS - 3600 * 1000, NOW_MS)
        self.write_rotated(rows, 2)
        _, out, _ = self.run_netlog("rows", "--json", self.dir)
        self.assertEqual(out, "".join(line(r) + "\n" for r in rows))
        _, out, _ = self.run_netlog("rows", "--json", "-n", "5", self.dir)
        self.assertEqual(out, "".join(line(r) + "\n" for r in rows[-5:]))

    def test_rows_view(self):
        rows = generate_rows(120, 5, NOW_MS - 30 * 3600 * 1000, NOW_MS)
        self.write_rotated(rows, 2)
        _, out, _ = self.run_netlog("rows", self.dir)
        self.assert_fits(out)
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("TIME     STS METHOD  HOST"))
        body = [l for l in lines[1:] if not l.startswith("-- ")]
        self.assertEqual(len(body), len(rows))
        days = [l for l in lines if l.startswith("-- ")]
        self.assertEqual(len(days), len({r["ts"][:10] for r in rows}))
        for l, r in zip(body, rows):
            f = l.split()
            self.assertEqual(f[0], r["ts"][11:19])
            self.assertEqual(f[1], str(r["status"]) if r["status"] else "-")
            self.assertEqual(f[2], r["method"])
            if r.get("blocked"):
                self.assertTrue(l.endswith("BLOCKED") or "BLOCKED " in l, l)
            if r.get("passthrough"):
                self.assertIn("tunnel", l)
            if r.get("error"):
                self.assertIn("err:" + r["error"].split(":")[0], l)

    # ---- refusals ---------------------------------------------------------------

    def test_refusals_view_and_grants(self):
        rows = generate_rows(300, 6, NOW_MS - 20 * 3600 * 1000, NOW_MS - 5000)
        self.write_rotated(rows, 3)
        refusals = [r for r in rows if is_refusal(r)]
        self.assertTrue(refusals)
        _, out, _ = self.run_netlog("refusals", self.dir)
        self.assert_fits(out)
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("TIME     KIND  REQUEST"))
        table = [l for l in lines[1:] if l[:2].isdigit()]
        self.assertEqual(len(table), len(refusals))
        for l, r in zip(table, refusals):
            self.assertEqual(l.split()[0], r["ts"][11:19])
            self.assertEqual(l.split()[1], "block" if r.get("blocked") else "would")
            if r.get("unattributed"):
                self.assertTrue(l.endswith("unattributed"), l)
            elif r.get("who"):
                self.assertIn("ctr:" + r["who"][10:22], l)
            else:
                self.assertTrue(l.endswith(" -"), l)
        grant_lines = [l for l in lines if "fy allow add " in l]
        keys = {r["host"].lower() for r in refusals}
        got = {l.split("fy allow add ")[1].split()[0] for l in grant_lines}
        self.assertEqual(got, keys)
        for l in grant_lines:
            key = l.split("fy allow add ")[1].split()[0]
            nb = sum(1 for r in refusals if r["host"].lower() == key and r.get("blocked"))
            nw = sum(1 for r in refusals if r["host"].lower() == key and not r.get("blocked"))
            counts = ", ".join((["%d blocked" % nb] if nb else []) +
                               (["%d would-block" % nw] if nw else [])) + ", last "
            if "  # " in l:  # the comment may be cut to the width, the command never is
                comment = l.split("  # ", 1)[1]
                if comment.endswith("…"):
                    self.assertTrue((counts + "99:99:99").startswith(comment[:-1])
                                    or comment.startswith(counts), l)
                else:
                    self.assertTrue(comment.startswith(counts), l)
        # JSON: exactly the refusal rows, each with who asked added, then the grants.
        _, out, _ = self.run_netlog("refusals", "--json", self.dir)
        lines = [json.loads(l) for l in out.splitlines()]
        for r in lines[:-1]:
            self.assertIn("asked_by", r)
        self.assertEqual([{k: v for k, v in r.items() if k != "asked_by"} for r in lines[:-1]],
                         refusals)
        self.assertEqual(sorted(g["host"] for g in lines[-1]["grants"]), sorted(keys))

    def test_refusals_never_offer_a_command_for_a_key_that_is_not_a_host(self):
        rows = [{"ts": iso(NOW_MS - 1000), "method": "CONNECT", "host": "x;rm -rf ~:443",
                 "path": "", "status": 403, "injected": False, "replayed": False,
                 "blocked": True},
                {"ts": iso(NOW_MS - 500), "method": "CONNECT", "host": "github.com:22",
                 "path": "", "status": 403, "injected": False, "replayed": False,
                 "blocked": True, "build": True}]
        with open(self.log, "w") as f:
            f.write("".join(line(r) + "\n" for r in rows))
        _, out, _ = self.run_netlog("refusals", self.dir)
        self.assertNotIn("fy allow add x;", out)
        self.assertIn("not a host `fy allow` accepts: x;rm -rf ~:443", out)
        self.assertIn("fy allow add github.com:22 --build", out)
        _, out, _ = self.run_netlog("refusals", "--json", self.dir)
        grants = {g["host"]: g for g in json.loads(out.splitlines()[-1])["grants"]}
        self.assertIsNone(grants["x;rm -rf ~:443"]["command"])
        self.assertEqual(grants["github.com:22"]["command"], "fy allow add github.com:22 --build")
        _, out, _ = self.run_netlog("refusals", "--status", "200", self.dir)
        self.assertIn("no refusals", out)

    # ---- files and rotation ------------------------------------------------------

    def test_reads_across_rotations_in_order(self):
        # All backups within one second: the -N suffixes decide the order, and
        # "-10" comes after "-9", not after "-1".
        second = NOW_MS // 1000 * 1000 - 5000
        rows = generate_rows(240, 7, second + 100, second + 200)
        files = self.write_rotated(rows, 12)
        self.assertIn("-10.", " ".join(files))
        got = self.json_rows()
        self.assertEqual([r["conn"] for r in got], [r["conn"] for r in rows])
        # Unrelated files beside the log are not read.
        with open(os.path.join(self.dir, "egress.jsonl.bak"), "w") as f:
            f.write(line(rows[0]) + "\n")
        self.assertEqual(len(self.json_rows()), len(rows))
        # A path to the file works like its directory.
        _, out, _ = self.run_netlog("rows", "--json", self.log)
        self.assertEqual(len(out.splitlines()), len(rows))

    def test_default_path_is_the_proxys(self):
        state = os.path.join(self.dir, "state")
        logs = os.path.join(state, "foldyard", "egress", "logs")
        os.makedirs(logs)
        rows = generate_rows(10, 8, NOW_MS - 1000, NOW_MS)
        with open(os.path.join(logs, "egress.jsonl"), "w") as f:
            f.write("".join(line(r) + "\n" for r in rows))
        _, out, _ = self.run_netlog("--json", env={"XDG_STATE_HOME": state})
        self.assertEqual(json.loads(out)["rows_read"], 10)
        home = os.path.join(self.dir, "home")
        os.makedirs(os.path.join(home, ".local"))
        os.symlink(state, os.path.join(home, ".local", "state"))
        e = {"HOME": home}
        old = os.environ.pop("XDG_STATE_HOME", None)
        try:
            _, out, _ = self.run_netlog("--json", env=e)
        finally:
            if old is not None:
                os.environ["XDG_STATE_HOME"] = old
        self.assertEqual(json.loads(out)["rows_read"], 10)

    # ---- bad input ------------------------------------------------------------------

    def test_bad_lines_are_skipped_counted_and_reported_once(self):
        good = generate_rows(20, 9, NOW_MS - 3600 * 1000, NOW_MS)
        bad = [
            b"not json at all",
            b"\x00\x01\x02\xff\xfe",
            b'{"ts":"2026-11-29T21:30:00Z","host":"h","status":"200"}',  # wrong type
            b'{"ts":"2026-11-29T21:30:00Z","host":"h","status":200,"blocked":"yes"}',
            b'{"ts":"2026-11-29T21:30:00Z","host":"h","status":200,"ua":"\xff"}',
            b"[1,2,3]",
            b'{"ts":"2026-11-29T21:30:00","host":"h","status":200}',  # naive ts
            b"{" * 5000,
            b"x" * (2 << 20),  # longer than any row
        ]
        data = b""
        for i, r in enumerate(good):
            data += line(r).encode() + b"\n"
            if i < len(bad):
                data += bad[i] + b"\n"
        data += b'{"ts":"2026-11-29T21:30:00Z","host":"h","sta'  # torn last line
        with open(self.log, "wb") as f:
            f.write(data)
        code, out, err = self.run_netlog("--json", self.dir)
        self.assertEqual(code, 0)
        doc = json.loads(out)
        self.assertEqual(doc["rows_read"], len(good))
        self.assertEqual(doc["bad_lines"], len(bad) + 1)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("skipped %d lines that are not Network Log rows" % (len(bad) + 1), err)
        self.assertIn("egress.jsonl:2: not JSON", err)
        want = expected_summary(good)
        self.assertEqual([h["requests"] for h in doc["hosts"]], [s["requests"] for s in want])
        for view in ([], ["rows"], ["refusals"]):
            code, out, err = self.run_netlog(*view, self.dir)
            self.assertEqual(code, 0)
            self.assertEqual(err.count("skipped"), 1)

    def test_hostile_text_stays_in_its_columns_and_off_the_terminal(self):
        nasty = ["\x1b[2J\x1b[31mred", "\u202emoc.buhtig", "git\u200bhub.com",
                 "日本語のパス" * 10,
                 "e\u0301" * 30, "😀" * 40, "\t\r\n", "\u009b2J", "a" * 400]
        rows = []
        for i, s in enumerate(nasty):
            rows.append({"ts": iso(NOW_MS - 1000 * (len(nasty) - i)), "method": "GET",
                         "host": s + ".example.com:8443", "path": "/" + s, "status": 403,
                         "injected": False, "replayed": False, "blocked": i % 2 == 0,
                         "would_block": i % 2 == 1, "ua": s, "error": "protocol: " + s,
                         "src": s, "net": s, "who": "container:" + s, "seq": 1, "boot": s})
        with open(self.log, "w", encoding="utf-8") as f:
            f.write("".join(line(r) + "\n" for r in rows))
        for width in (None, 64, 100):
            env = {} if width is None else {"COLUMNS": str(width)}
            for view in ([], ["rows"], ["refusals"]):
                with self.subTest(width=width, view=view):
                    _, out, _ = self.run_netlog(*view, self.dir, env=env)
                    self.assert_fits(out, width or 80)
                    self.assertNotIn("\u202e", out)
                    self.assertNotIn("\u200b", out)
                    self.assertNotIn("\u009b", out)
                    self.assertIn("\\x1b", out)

    # ---- errors and help ---------------------------------------------------------------

    def test_errors_say_what_to_do_and_exit_codes_are_documented(self):
        missing = os.path.join(self.dir, "nowhere", "egress.jsonl")
        code, out, err = self.run_netlog(missing, check=False)
        self.assertEqual(code, 3)
        self.assertEqual(out, "")
        self.assertIn("no Network Log at " + missing, err)
        self.assertIn("is fy-proxy running with --netlog", err)
        for args, needle in [(["--bogus"], "unknown option '--bogus'"),
                             (["--fol"], "unknown option '--fol'"),  # no abbreviations
                             (["--json=1"], "--json takes no value"),
                             (["--status", "9xx9"], "bad status '9xx9'"),
                             (["--host", "a/b"], "bad host pattern 'a/b'"),
                             (["--since", "yesterday"], "bad time 'yesterday'"),
                             (["--since", "1h", "--until", "2h"], "--since is after --until"),
                             (["--width", "10"], "bad --width"),
                             (["--lines"], "needs a value"),
                             (["summary", "--follow"], "--follow streams rows"),
                             (["-n", "5"], "--lines applies to the rows and refusals"),
                             (["rows", self.dir, "extra"], "unexpected argument 'extra'")]:
            with self.subTest(args=args):
                code, out, err = self.run_netlog(*args, check=False)
                self.assertEqual(code, 2, err)
                self.assertIn(needle, err)
                self.assertIn("fy-netlog --help", err)
        code, out, err = self.run_netlog("--help", check=False)
        self.assertEqual(code, 0)
        for word in ("summary", "rows", "refusals", "--follow", "--host", "--status", "--since",
                     "--until", "--json", "Exit status"):
            self.assertIn(word, out)
        self.assert_fits(out)

    def test_a_log_that_cannot_be_read_exits_3(self):
        # A path under a regular file: not found.
        blocker = os.path.join(self.dir, "file")
        open(blocker, "w").close()
        code, _, err = self.run_netlog(os.path.join(blocker, "egress.jsonl"), check=False)
        self.assertEqual(code, 3)
        self.assertIn("no Network Log at", err)
        # A log another user owns (0600, as the proxy writes it).
        with open(self.log, "w") as f:
            f.write(line(generate_rows(1, 1, NOW_MS, NOW_MS)[0]) + "\n")
        os.chmod(self.log, 0o600)
        os.chmod(self.dir, 0o755)
        preexec = None
        if os.geteuid() == 0:
            def preexec():  # run as nobody: root would read it anyway
                os.setgid(65534)
                os.setgroups([])
                os.setuid(65534)
        else:
            os.chmod(self.log, 0)
        e = dict(os.environ, TZ="UTC")
        try:
            p = subprocess.run([FY_NETLOG, self.dir], capture_output=True, env=e,
                               preexec_fn=preexec, timeout=30)
        except PermissionError:
            self.skipTest("the build directory is not reachable by nobody")
        if p.returncode == 126 or (b"Permission denied" in p.stderr
                                   and b"fy-netlog:" not in p.stderr):
            self.skipTest("the build directory is not reachable by nobody")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(b"run fy-netlog as the user that runs fy-proxy", p.stderr)

    # ---- follow ---------------------------------------------------------------------

    def start_follow(self, *args):
        e = dict(os.environ)
        e.pop("COLUMNS", None)
        e["TZ"] = "UTC"
        p = subprocess.Popen([FY_NETLOG, *args, "--follow", self.dir], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=e)
        self.procs.append(p)
        q = queue.Queue()
        q.pending = {"out": [], "err": []}

        def pump(stream, tag):
            for raw in iter(stream.readline, b""):
                q.put((tag, raw.decode("utf-8").rstrip("\n")))
            q.put((tag, None))

        for stream, tag in ((p.stdout, "out"), (p.stderr, "err")):
            threading.Thread(target=pump, args=(stream, tag), daemon=True).start()
        return p, q

    def take(self, q, n, tag="out", timeout=10.0):
        """The next n lines on `tag` ("out" or "err"), failing after `timeout`
        seconds; lines of the other stream are kept for a later take()."""
        pending = q.pending
        deadline = time.monotonic() + timeout
        while len(pending[tag]) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail("timed out waiting for %d lines on %s; have %r" % (n, tag, pending))
            try:
                t, l = q.get(timeout=left)
            except queue.Empty:
                continue
            if l is None:
                if t == tag:
                    self.fail("stream %s closed; have %r" % (tag, pending))
                continue
            pending[t].append(l)
        got = pending[tag][:n]
        del pending[tag][:n]
        return got, list(pending["err" if tag == "out" else "out"])

    def append(self, rows, path=None):
        with open(path or self.log, "a", encoding="utf-8") as f:
            f.write("".join(line(r) + "\n" for r in rows))

    def rotate(self, when_ms, n=0):
        name = "egress.%s%s.jsonl" % (stamp(when_ms), "-%d" % n if n else "")
        os.rename(self.log, os.path.join(self.dir, name))

    def stop(self, p, q):
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(timeout=10), 0)
        rest = [(t, l) for t in ("out", "err") for l in q.pending[t]]
        while True:
            try:
                t, l = q.get(timeout=5)
            except queue.Empty:
                break
            if l is not None:
                rest.append((t, l))
            if t == "err" and l is None:
                break
        return rest

    def test_follow_picks_up_new_rows_and_survives_rotation(self):
        rows = generate_rows(40, 10, NOW_MS - 60000, NOW_MS)
        self.append(rows[:3])
        p, q = self.start_follow("rows", "--json")
        got, _ = self.take(q, 3)  # the existing rows (fewer than 10)
        self.assertEqual([json.loads(l) for l in got], rows[:3])

        self.append(rows[3:5])
        got, _ = self.take(q, 2)
        self.assertEqual([json.loads(l) for l in got], rows[3:5])

        # The writer's rotation: the last rows go to the old file, it is
        # renamed to a dated backup, the next rows start a new file.
        self.append(rows[5:6])
        self.rotate(NOW_MS)
        self.append(rows[6:8])
        got, _ = self.take(q, 3)
        self.assertEqual([json.loads(l) for l in got], rows[5:8])

        # Several rotations in a row, faster than the follower polls.
        t = NOW_MS + 1000
        for k, (a, b) in enumerate([(8, 10), (10, 12), (12, 14)]):
            self.append(rows[a:b])
            self.rotate(t, k)
        self.append(rows[14:16])
        got, _ = self.take(q, 8)
        self.assertEqual([json.loads(l) for l in got], rows[8:16])

        # A row written in two pieces arrives once, whole, and is not "bad".
        half = line(rows[16]) + "\n"
        with open(self.log, "a") as f:
            f.write(half[:25])
        time.sleep(0.5)
        with open(self.log, "a") as f:
            f.write(half[25:])
        got, _ = self.take(q, 1)
        self.assertEqual(json.loads(got[0]), rows[16])

        rest = self.stop(p, q)
        self.assertEqual([l for t, l in rest if t == "out"], [])
        self.assertFalse([l for t, l in rest if "skipped" in l], rest)

    def test_follow_shows_the_last_rows_first_and_waits_for_a_missing_log(self):
        rows = generate_rows(30, 11, NOW_MS - 60000, NOW_MS)
        self.append(rows[:25])
        p, q = self.start_follow("rows", "--json", "-n", "4")
        got, _ = self.take(q, 4)
        self.assertEqual([json.loads(l) for l in got], rows[21:25])
        self.stop(p, q)

        shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        p, q = self.start_follow("rows", "--json")
        _, _ = self.take(q, 1, tag="err")  # "waiting for … to appear"
        self.append(rows[:2])
        got, _ = self.take(q, 2)
        self.assertEqual([json.loads(l) for l in got], rows[:2])
        self.stop(p, q)

    def test_follow_refusals_offer_the_grant_once_per_host(self):
        base = {"method": "CONNECT", "path": "", "status": 403, "injected": False,
                "replayed": False, "blocked": True, "unattributed": True}
        p, q = self.start_follow("refusals")
        self.take(q, 1, tag="err")  # waiting: no log yet
        self.append([dict(base, ts=iso(NOW_MS), host="github.com:22"),
                     dict(base, ts=iso(NOW_MS + 1), host="github.com:22"),
                     dict(base, ts=iso(NOW_MS + 2), host="gitlab.com:22")])
        got, _ = self.take(q, 7)  # header, day, 3 rows, 2 grant hints
        text = "\n".join(got)
        self.assertEqual(text.count("grant: fy allow add github.com:22"), 1)
        self.assertEqual(text.count("grant: fy allow add gitlab.com:22"), 1)
        self.assertEqual(sum(1 for l in got if " block CONNECT " in l), 3)
        self.assert_fits(text)
        self.stop(p, q)

    def test_follow_reports_bad_lines_once_then_the_total_on_exit(self):
        rows = generate_rows(4, 12, NOW_MS - 60000, NOW_MS)
        self.append(rows[:1])
        p, q = self.start_follow("rows", "--json")
        self.take(q, 1)
        with open(self.log, "a") as f:
            f.write("garbage one\n")
        self.append(rows[1:2])
        got, err = self.take(q, 1)
        errs, _ = self.take(q, 2, tag="err")
        self.assertIn("skipped 1 line that is not a Network Log row", errs[0])
        self.assertIn("further bad lines are counted", errs[1])
        with open(self.log, "a") as f:
            f.write("garbage two\ngarbage three\n")
        self.append(rows[2:3])
        self.take(q, 1)
        rest = self.stop(p, q)
        errs = [l for t, l in rest if t == "err"]
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("skipped 3 lines", errs[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""fy-engine-watch's file rotates as the Network Log does, against a fake
engine (no podman needed): a small HTTP/1.1 server on a unix socket answering
the three requests the watcher makes (the event stream, the container list,
the network list) in podman 4.3's shapes.

It proves, with --max-bytes at its smallest (4096):
  - engine.jsonl is rotated into a dated backup engine.<YYYYmmddTHHMMSSZ>[-N].jsonl,
    and the probe counts the rotation;
  - the new file opens with a full list: the running container's snapshot is in
    it before anything else of a container, so it stands alone;
  - rows on both sides of the rotation, and a container started after it,
    are named by fy-netlog; with the backups gone (as pruning would), a row
    after the rotation is still named, and one from before says why not.
"""

import json
import os
import re
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse


BUILD = os.environ.get("FY_BUILD_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")
WATCH = os.path.join(BUILD, "proxy", "engine", "fy-engine-watch")
NETLOG = os.path.join(BUILD, "proxy", "netlog", "fy-netlog")
X, Y = "1" * 64, "2" * 64
BACKUP = re.compile(r"^engine\.\d{8}T\d{6}Z(-\d+)?\.jsonl$")


def iso_ms(ms):
    import datetime
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class FakeEngine:
    """The engine's API as the watcher uses it: GET /v1.40/events (a chunked
    stream held open), /v1.40/containers/json?all=true[&filters={"id":[..]}],
    /v4.0.0/libpod/networks/json. One request per connection."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.containers = {}  # id -> (name, ip)
        self.streams = []
        engine = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                data = b""
                while b"\r\n\r\n" not in data:
                    b = self.request.recv(4096)
                    if not b:
                        return
                    data += b
                target = data.split(b" ", 2)[1].decode()
                url = urllib.parse.urlsplit(target)
                q = urllib.parse.parse_qs(url.query)
                if url.path.endswith("/events"):
                    self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n")
                    done = threading.Event()
                    with engine.lock:
                        engine.streams.append((self.request, done))
                    done.wait()
                    return
                if url.path.endswith("/networks/json"):
                    body = [{"name": "podman", "network_interface": "podman0"}]
                else:
                    ids = json.loads(q["filters"][0])["id"] if "filters" in q else None
                    with engine.lock:
                        body = [{"Id": cid, "Names": ["/" + name], "Labels": {},
                                 "State": "running",
                                 "NetworkSettings": {"Networks": {"podman": {"IPAddress": ip}}}}
                                for cid, (name, ip) in engine.containers.items()
                                if ids is None or cid in ids]
                raw = json.dumps(body).encode()
                self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                     % (len(raw), raw))

        self.server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def start(self, cid, name, ip):
        with self.lock:
            self.containers[cid] = (name, ip)
            streams = list(self.streams)
        now = time.time()
        ev = json.dumps({"status": "start", "id": cid, "Type": "container", "Action": "start",
                         "Actor": {"ID": cid, "Attributes": {"name": name}},
                         "time": int(now), "timeNano": int(now * 1e9)}).encode() + b"\n"
        for s, _ in streams:
            try:
                s.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
            except OSError:
                pass

    def close(self):
        with self.lock:
            for s, done in self.streams:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                done.set()
        self.server.shutdown()
        self.server.server_close()


def read_lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


class Rotation(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fy-engine-rot-")
        self.state = os.path.join(self.dir, "state")
        self.logs = os.path.join(self.state, "logs")
        os.makedirs(self.logs)
        self.engine_log = os.path.join(self.logs, "engine.jsonl")
        self.netlog = os.path.join(self.logs, "egress.jsonl")
        self.engine = FakeEngine(os.path.join(self.dir, "engine.sock"))
        self.watch = None
        self.watch_log = open(os.path.join(self.dir, "watch.log"), "w")

    def tearDown(self):
        if self.watch and self.watch.poll() is None:
            self.watch.terminate()
            self.watch.wait(timeout=10)
        self.watch_log.close()
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def backups(self):
        return sorted(n for n in os.listdir(self.logs) if BACKUP.match(n))

    def wait(self, pred, what, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            if self.watch.poll() is not None:
                with open(os.path.join(self.dir, "watch.log")) as f:
                    raise AssertionError("fy-engine-watch exited: " + f.read())
            time.sleep(0.05)
        raise AssertionError("timed out waiting for " + what)

    def principals(self, *extra):
        r = subprocess.run([NETLOG, "--by", "principal", "--json", "--engine", self.logs] +
                           list(extra) + [self.netlog], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return {p["principal"]: p for p in json.loads(r.stdout)["principals"]}

    def row(self, ms, path, ip):
        with open(self.netlog, "a") as f:
            f.write(json.dumps({"ts": iso_ms(ms), "method": "GET", "host": "pypi.org",
                                "path": path, "status": 200, "injected": False,
                                "replayed": False, "src": ip, "net": "podman0", "seq": 1,
                                "boot": "b"}) + "\n")

    def test_the_file_rotates_and_the_new_one_opens_with_a_full_list(self):
        self.engine.start(X, "rot-x", "10.88.0.5")
        self.watch = subprocess.Popen(
            [WATCH, "--socket", self.engine.path, "--state-dir", self.state,
             "--list-interval-ms", "100", "--max-bytes", "4096", "--backups", "5"],
            stdout=subprocess.DEVNULL, stderr=self.watch_log)
        self.wait(lambda: os.path.exists(self.engine_log) and any(
            s.get("id") == X for s in read_lines(self.engine_log)), "rot-x's first snapshot")
        now = lambda: int(time.time() * 1000)  # noqa: E731
        self.row(now(), "/before", "10.88.0.5")
        # Each heartbeat list appends a marker: 4096 bytes in a few seconds.
        self.wait(lambda: self.backups(), "a dated backup of engine.jsonl")
        [backup] = self.backups()[:1]
        first = read_lines(os.path.join(self.logs, backup))
        self.assertEqual((first[0]["kind"], first[0]["event"]), ("watch", "start"))
        self.assertTrue(any(s.get("id") == X for s in first))
        self.assertLessEqual(os.path.getsize(os.path.join(self.logs, backup)), 4096)
        # The new file opens with the whole state: rot-x's snapshot comes before
        # any other container record, after a list marker.
        self.wait(lambda: any(s.get("id") == X for s in read_lines(self.engine_log)),
                  "the full list in the new file")
        new = read_lines(self.engine_log)
        i = next(k for k, s in enumerate(new) if s["kind"] == "container")
        self.assertEqual(new[i]["id"], X)
        self.assertEqual(new[i]["event"], "list")
        self.assertEqual(new[i]["endpoints"], [{"net": "podman", "iface": "podman0",
                                                "ip": "10.88.0.5"}])
        self.assertTrue(all(s["kind"] == "watch" for s in new[:i]), new[:i + 1])
        self.assertIn("list", [s["event"] for s in new[:i]])
        probe = subprocess.run([WATCH, "--probe", "--state-dir", self.state],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(probe.returncode, 0, probe.stdout + probe.stderr)
        self.assertRegex(probe.stdout, r" rotations=[1-9]")
        # After the rotation: rot-x asks again, and a container started now.
        time.sleep(0.2)
        self.row(now(), "/after", "10.88.0.5")
        self.engine.start(Y, "rot-y", "10.88.0.6")
        self.wait(lambda: any(s.get("id") == Y for s in read_lines(self.engine_log)),
                  "rot-y's snapshot")
        self.row(now(), "/new", "10.88.0.6")
        by = self.principals()
        self.assertEqual(by["ctr:rot-x"]["requests"], 2, sorted(by))  # both sides
        self.assertEqual(by["ctr:rot-y"]["requests"], 1, sorted(by))
        self.assertEqual(by["ctr:rot-x"]["basis"], "engine_claim")
        # The backups gone, as pruning removes them: the new file stands alone.
        self.watch.terminate()
        self.assertEqual(self.watch.wait(timeout=10), 0)
        for b in self.backups():
            os.unlink(os.path.join(self.logs, b))
        by = self.principals("--since", iso_ms(now() - 3600 * 1000))
        self.assertEqual(by["ctr:rot-x"]["requests"], 1, sorted(by))  # /after
        self.assertEqual(by["ctr:rot-y"]["requests"], 1, sorted(by))
        self.assertIn("before the first engine snapshot",
                      by["unresolved 10.88.0.5@podman0"]["reason"])  # /before: its file is gone


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""fy-proxy as a plain HTTP/1.1 forward proxy: real clients, a recording origin.

Each test checks what arrived at the origin and what the Network Log says."""

import json
import os
import socket
import sys
import time
import unittest
import urllib.request

from fytest import Origin, Proxy, curl, http_status, raw_exchange, wait_until


class ForwardProxy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.origin = Origin().__enter__()
        o = cls.origin.port
        cls.policy = f'mode = "enforce"\nallow = ["origin.test:{o}", "127.0.0.1:{o}"]\n'
        cls.proxy = Proxy(cls.policy, resolve=[("origin.test", "127.0.0.1")]).__enter__()
        cls.base = f"http://origin.test:{o}"

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)

    def setUp(self):
        self.origin.requests.clear()

    def last_row(self, pred=lambda r: True):
        return self.proxy.wait_rows(pred)[-1]

    def test_curl_get_is_forwarded_in_origin_form_and_logged(self):
        r = curl(self.base + "/hello?x=1", proxy=self.proxy.url, check=True)
        info = json.loads(r.stdout)
        self.assertEqual(info["path"], "/hello?x=1")  # origin-form upstream
        req = self.origin.requests[-1]
        self.assertEqual(self.origin.header(req, "Host"), f"origin.test:{self.origin.port}")
        row = self.last_row(lambda r: r["path"] == "/hello?x=1")
        self.assertEqual(row["method"], "GET")
        self.assertEqual(row["host"], f"origin.test:{self.origin.port}")
        self.assertEqual(row["status"], 200)
        self.assertEqual(row["tls"], "plain")
        self.assertTrue(row["ua"].startswith("curl/"))
        self.assertGreater(row["bytes_down"], len(r.stdout))
        self.assertIn("conn", row)
        self.assertIn("duration_ms", row)

    def test_python_urllib_through_the_proxy(self):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": self.proxy.url}))
        with opener.open(self.base + "/urllib", timeout=10) as resp:
            body = json.loads(resp.read())
        self.assertEqual(body["path"], "/urllib")
        row = self.last_row(lambda r: r["path"] == "/urllib")
        self.assertEqual(row["status"], 200)
        self.assertIn("Python-urllib", row["ua"])

    def test_the_port_file_holds_the_port_bound_for_port_0(self):
        p = Proxy(self.policy, resolve=[("origin.test", "127.0.0.1")])
        self.assertIn("127.0.0.1:0", p.cmd)  # --listen 127.0.0.1:0: the kernel picks the port
        with open(p.port_file, "w") as f:
            f.write("1\n")  # a stale file from an earlier run is replaced
        with p:
            with open(p.port_file) as f:
                text = f.read()
            self.assertEqual(text, f"{p.port}\n")  # the port of the ready line
            self.assertNotEqual(p.port, 0)
            self.assertFalse(os.path.exists(p.port_file + ".tmp"))
            r = curl(self.base + "/via-port-file", proxy=f"http://127.0.0.1:{int(text)}", check=True)
            self.assertEqual(json.loads(r.stdout)["path"], "/via-port-file")

    def test_hop_by_hop_fields_are_not_forwarded_and_no_via_is_added(self):
        curl(self.base + "/hop-req", "-H", "Proxy-Authorization: Basic Zm9vOmJhcg==",
             "-H", "Keep-Alive: timeout=3", "-H", "TE: trailers", "-H", "Connection: X-Secret",
             "-H", "X-Secret: 1", "-H", "Proxy-Connection: keep-alive", "-H", "Fy-Stamp: forged",
             "-H", "fy-STAMP: forged2", "-H", "X-Kept: yes", proxy=self.proxy.url, check=True)
        names = [k.lower() for k, _ in self.origin.requests[-1]["headers"]]
        for gone in ("proxy-authorization", "keep-alive", "te", "x-secret", "proxy-connection",
                     "fy-stamp", "via", "connection"):
            self.assertNotIn(gone, names)
        self.assertIn("x-kept", names)
        # ... and in the response direction.
        r = curl("-i", self.base + "/hop", proxy=self.proxy.url, check=True)
        head = r.stdout.split(b"\r\n\r\n")[0].decode().lower()
        self.assertIn("x-kept: 1", head)
        for gone in ("keep-alive:", "proxy-authenticate:", "x-drop:", "via:"):
            self.assertNotIn(gone, head)

    def test_post_bodies_content_length_and_chunked_arrive_whole(self):
        data = os.urandom(300_000)
        path = os.path.join(self.proxy.dir, "upload.bin")
        with open(path, "wb") as f:
            f.write(data)
        import hashlib
        want = hashlib.sha256(data).hexdigest()
        r = curl("--data-binary", "@" + path, self.base + "/upload?cl", proxy=self.proxy.url, check=True)
        self.assertEqual(json.loads(r.stdout), {"len": len(data), "sha256": want})
        r = curl("--data-binary", "@" + path, "-H", "Transfer-Encoding: chunked",
                 self.base + "/upload?chunked", proxy=self.proxy.url, check=True)
        self.assertEqual(json.loads(r.stdout), {"len": len(data), "sha256": want})
        # Each upload's own row (rows are written in batches: wait for them,
        # never take another test's /upload row for them).
        for q in ("cl", "chunked"):
            row = self.last_row(lambda r: r["path"] == "/upload?" + q and r["method"] == "POST")
            self.assertGreaterEqual(row["bytes_up"], len(data), q)

    def test_expect_100_continue(self):
        data = b"y" * 5000
        path = os.path.join(self.proxy.dir, "e.bin")
        with open(path, "wb") as f:
            f.write(data)
        r = curl("-v", "-H", "Expect: 100-continue", "--data-binary", "@" + path, self.base + "/upload",
                 proxy=self.proxy.url, check=True)
        self.assertIn(b"100 Continue", r.stderr)
        self.assertEqual(json.loads(r.stdout)["len"], 5000)

    def test_response_framings_are_relayed(self):
        for route, n in (("bytes", 3_000_000), ("chunked", 123_457), ("close", 70_000)):
            r = curl(self.base + f"/{route}/{n}", proxy=self.proxy.url, check=True)
            self.assertEqual(len(r.stdout), n, route)
        row = self.last_row(lambda r: r["path"] == "/close/70000")
        self.assertEqual(row["status"], 200)

    def test_head_204_304_have_no_body_and_keep_the_connection(self):
        # HEAD, 204 and 304 then a GET, pipelined on one connection: if the proxy
        # waited for a body that never comes, the GET would never be answered.
        host = f"Host: origin.test:{self.origin.port}\r\n"
        reqs = (f"HEAD {self.base}/bytes/1000 HTTP/1.1\r\n{host}\r\n"
                f"GET {self.base}/204 HTTP/1.1\r\n{host}\r\n"
                f"GET {self.base}/304 HTTP/1.1\r\n{host}\r\n"
                f"GET {self.base}/last HTTP/1.1\r\n{host}\r\n")
        out = raw_exchange(self.proxy.port, reqs.encode(), until=b'"/last"')
        self.assertEqual(out.count(b"HTTP/1.1 "), 4)
        self.assertIn(b"Content-Length: 1000\r\n", out)  # HEAD keeps the length, sends no body
        self.assertNotIn(b"xxxx", out)
        self.assertIn(b"HTTP/1.1 204 ", out)
        self.assertIn(b"HTTP/1.1 304 ", out)
        self.assertTrue(out.endswith(b"}"))

    def test_keep_alive_reuses_one_client_and_one_origin_connection(self):
        r = curl(self.base + "/a", "-o", "/dev/null", self.base + "/b", "-o", "/dev/null",
                 self.base + "/c", "-w", "%{num_connects}", proxy=self.proxy.url, check=True)
        self.assertTrue(r.stdout.decode().endswith("0"))
        rows = [x for x in self.proxy.wait_rows(lambda x: x["path"] in ("/a", "/b", "/c"), n=3)]
        self.assertEqual(len({x["conn"] for x in rows[-3:]}), 1)
        clients = {req["client"] for req in self.origin.requests[-3:]}
        self.assertEqual(len(clients), 1, "the origin connection is kept alive too")

    def test_an_idle_origin_connection_serves_the_next_client(self):
        before = self.proxy.metric("fy_origin_pool_reused_total")
        curl(self.base + "/pool1", proxy=self.proxy.url, check=True)
        curl(self.base + "/pool2", proxy=self.proxy.url, check=True)  # a new client connection
        clients = [q["client"] for q in self.origin.requests if q["path"] in ("/pool1", "/pool2")]
        self.assertEqual(len(clients), 2)
        self.assertEqual(clients[0], clients[1], "the second client used the pooled origin connection")
        self.assertGreaterEqual(self.proxy.metric("fy_origin_pool_reused_total"), before + 1)
        rows = [r for r in self.proxy.wait_rows(lambda r: r["path"] in ("/pool1", "/pool2"), n=2)]
        self.assertNotEqual(rows[0]["conn"], rows[1]["conn"])
        # A reload empties the pool: idle connections are judged afresh.
        self.proxy.reload(self.policy + "\n")
        self.assertEqual(self.proxy.metric("fy_origin_pool_idle"), 0)
        curl(self.base + "/pool3", proxy=self.proxy.url, check=True)
        c3 = [q["client"] for q in self.origin.requests if q["path"] == "/pool3"][0]
        self.assertNotEqual(c3, clients[0])

    def test_pipelined_requests_are_answered_in_order(self):
        req = "GET {}/p{} HTTP/1.1\r\nHost: origin.test:{}\r\n\r\n"
        data = "".join(req.format(self.base, i, self.origin.port) for i in range(5)).encode()
        out = raw_exchange(self.proxy.port, data, until=b"/p4")
        # Each response body is the origin's JSON echo of the path it served.
        bodies = [seg[seg.index(b"{"):] for seg in out.split(b"HTTP/1.1 200 OK")[1:]]
        paths = [json.loads(b[: b.rindex(b"}") + 1])["path"] for b in bodies]
        self.assertEqual(paths, [f"/p{i}" for i in range(5)])

    def test_a_request_in_origin_form_is_refused_with_a_clear_message(self):
        out = raw_exchange(self.proxy.port, b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n")
        self.assertEqual(http_status(out), 400)
        self.assertIn(b"absolute form", out)

    def test_a_refused_plain_request_is_logged_once_and_not_forwarded(self):
        r = curl("http://not-granted.test/secret", proxy=self.proxy.url)
        self.assertIn(b"refused by the foldyard allowlist - grant it on your computer: "
                      b"`fy allow add not-granted.test`", r.stdout)
        rows = self.proxy.wait_rows(lambda x: x["host"] == "not-granted.test")
        time.sleep(0.2)
        rows = [x for x in self.proxy.rows() if x["host"] == "not-granted.test"]
        self.assertEqual(len(rows), 1)
        self.assertTrue(rows[0]["blocked"])
        self.assertEqual(rows[0]["status"], 403)
        self.assertFalse(any("secret" in q["path"] for q in self.origin.requests))

    def test_an_error_response_body_is_captured_collapsed(self):
        curl(self.base + "/status/503", proxy=self.proxy.url)
        row = self.last_row(lambda r: r["path"] == "/status/503")
        self.assertEqual(row["status"], 503)
        self.assertEqual(row["error_body"], "origin says 503: with spaces and lines")

    def test_the_host_header_must_name_the_destination(self):
        r = curl(self.base + "/claim", "-H", "Host: other.test", proxy=self.proxy.url)
        self.assertEqual(r.stdout, b"refused by the foldyard proxy - the request's Host header names a "
                                   b"different host than the one it is sent to\n")
        self.assertFalse(any(q["path"] == "/claim" for q in self.origin.requests))

    def test_websocket_upgrade_is_relayed_both_ways(self):
        from fytest import ws_frame, ws_read_frame
        s = socket.create_connection(("127.0.0.1", self.proxy.port), timeout=5)
        s.sendall((f"GET {self.base}/ws HTTP/1.1\r\nHost: origin.test:{self.origin.port}\r\n"
                   "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
        f = s.makefile("rb")
        status = f.readline()
        self.assertIn(b"101", status)
        head = b""
        while True:
            line = f.readline()
            if line in (b"\r\n", b""):
                break
            head += line.lower()
        self.assertIn(b"upgrade: websocket", head)
        self.assertIn(b"sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=", head)
        for msg in (b"hello", b"x" * 70000):
            s.sendall(ws_frame(1, msg))
            op, payload = ws_read_frame(f)
            self.assertEqual((op, payload), (1, msg))
        s.sendall(ws_frame(8, b""))
        self.assertEqual(ws_read_frame(f)[0], 8)
        f.close()  # the makefile holds the socket open: close both to send FIN
        s.close()
        row = self.last_row(lambda r: r["path"] == "/ws")
        self.assertEqual(row["status"], 101)
        self.assertGreater(row["bytes_up"], 70000)
        self.assertGreater(row["bytes_down"], 70000)
        # curl sees the 101 too (it then waits for data; bounded by --max-time).
        r = curl("-i", "-N", "-H", "Connection: Upgrade", "-H", "Upgrade: websocket", "-H",
                 "Sec-WebSocket-Version: 13", "-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                 self.base + "/ws", proxy=self.proxy.url, timeout=2)
        self.assertIn(b"101 Switching Protocols", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)

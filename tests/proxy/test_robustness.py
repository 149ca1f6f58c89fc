"""Bad input and bad upstreams: fy-proxy answers clearly, loses nothing, never
hangs and never forwards what it refused."""

import os
import resource
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from fytest import Origin, Proxy, binary, curl, free_port, http_status, raw_exchange, wait_until


class BadRequests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.origin = Origin().__enter__()
        o = cls.origin.port
        cls.host = f"origin.test:{o}"
        cls.proxy = Proxy(f'mode = "enforce"\nallow = ["{cls.host}"]\n', resolve=[("origin.test", "127.0.0.1")],
                          args=["--head-timeout", "1"]).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)

    def send(self, data):
        return raw_exchange(self.proxy.port, data, timeout=5)

    def test_smuggling_vectors_are_refused_and_never_forwarded(self):
        h = self.host
        u = f"http://{h}/smuggle"
        vectors = {
            "cl+te": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "te+cl": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
            "dup-cl": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
            "dup-cl-same": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
            "obs-fold": f"GET {u} HTTP/1.1\r\nHost: {h}\r\nX-A: 1\r\n 2\r\n\r\n",
            "bare-lf": f"GET {u} HTTP/1.1\nHost: {h}\n\n",
            "bare-lf-mixed": f"GET {u} HTTP/1.1\r\nHost: {h}\nX: 1\r\n\r\n",
            "te-gzip": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "te-space": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
            "two-hosts": f"GET {u} HTTP/1.1\r\nHost: {h}\r\nHost: evil.test\r\n\r\n",
            "cl-negative": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nContent-Length: -1\r\n\r\n",
            "cl-plus": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nContent-Length: +4\r\n\r\nabcd",
            "bad-chunk": f"POST {u} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "nul": f"GET {u} HTTP/1.1\r\nHost: {h}\r\nX: a\x00b\r\n\r\n",
        }
        self.origin.requests.clear()
        for name, data in vectors.items():
            out = self.send(data.encode())
            self.assertIn(http_status(out), (400, 501), f"{name}: {out[:200]!r}")
            self.assertIn(b"foldyard's proxy refused this request", out, name)
            self.assertIn(b"Connection: close", out, name)
        time.sleep(0.3)
        self.assertEqual([r["path"] for r in self.origin.requests if "smuggle" in r["path"]], [],
                         "a refused request reached the origin")
        self.assertGreaterEqual(self.proxy.metric('fy_requests_total{outcome="bad_request"}'), len(vectors) - 1)

    def test_a_head_over_64k_is_431_and_too_many_headers_is_431(self):
        big = f"GET http://{self.host}/big HTTP/1.1\r\nHost: {self.host}\r\nX-Big: {'a' * 70000}\r\n\r\n"
        self.assertEqual(http_status(self.send(big.encode())), 431)
        many = f"GET http://{self.host}/many HTTP/1.1\r\nHost: {self.host}\r\n" + "".join(
            f"X-{i}: 1\r\n" for i in range(101)) + "\r\n"
        self.assertEqual(http_status(self.send(many.encode())), 431)

    def test_slowloris_gets_408(self):
        s = socket.create_connection(("127.0.0.1", self.proxy.port), timeout=5)
        s.sendall(f"GET http://{self.host}/slow HTTP/1.1\r\n".encode())
        t0 = time.monotonic()
        out = b""
        try:
            while True:
                time.sleep(0.3)
                try:
                    s.sendall(b"X-Drip: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    break
                s.settimeout(0.01)
                try:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    out += chunk
                except socket.timeout:
                    pass
                if time.monotonic() - t0 > 5:
                    break
        finally:
            s.close()
        self.assertEqual(http_status(out), 408, out)
        self.assertIn(b"did not arrive within 1 s", out)

    def test_an_idle_connection_that_sends_nothing_is_not_a_408(self):
        s = socket.create_connection(("127.0.0.1", self.proxy.port), timeout=3)
        time.sleep(1.5)  # longer than the head timeout, shorter than the idle timeout
        s.sendall(f"GET http://{self.host}/late HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        self.assertIn(b"200 OK", s.recv(4096))
        s.close()

    def test_a_client_vanishing_mid_exchange_harms_nothing(self):
        for data in (
            f"POST http://{self.host}/upload HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: 100000\r\n\r\nabc",
            f"GET http://{self.host}/bytes/50000000 HTTP/1.1\r\nHost: {self.host}\r\n\r\n",
        ):
            s = socket.create_connection(("127.0.0.1", self.proxy.port))
            s.sendall(data.encode())
            time.sleep(0.1)
            s.close()
        r = curl(f"http://{self.host}/after", proxy=self.proxy.url, check=True)
        self.assertIn(b"/after", r.stdout)


class BadUpstreams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.origin = Origin().__enter__()
        cls.dead = free_port()
        o = cls.origin.port
        cls.proxy = Proxy(
            f'mode = "enforce"\nallow = ["origin.test:{o}", "dead.test:{cls.dead}", "nxdomain.invalid"]\n',
            resolve=[("origin.test", "127.0.0.1"), ("dead.test", "127.0.0.1")],
            args=["--io-timeout", "1", "--connect-timeout", "3"]).__enter__()
        cls.base = f"http://origin.test:{o}"

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)

    def check_failure(self, url, status, kind, text):
        t0 = time.monotonic()
        r = curl(url, "-w", "\n%{http_code}", proxy=self.proxy.url, timeout=10)
        self.assertLess(time.monotonic() - t0, 6, "never a hang")
        self.assertTrue(r.stdout.endswith(str(status).encode()), r.stdout)
        self.assertIn(text.encode(), r.stdout)
        path = url.split("/", 3)[3]
        row = self.proxy.wait_rows(lambda x: x["path"] == "/" + path)[-1]
        self.assertEqual(row["status"], status)
        self.assertTrue(row["error"].startswith(kind + ":"), row)
        return row

    def test_an_origin_that_resets_is_a_logged_502(self):
        self.check_failure(self.base + "/reset/x", 502, "reset", "could not reach")

    def test_an_origin_that_stalls_is_a_logged_504(self):
        self.check_failure(self.base + "/stall/x", 504, "timeout", "timed out reaching")

    def test_a_dead_port_is_a_logged_502(self):
        row = self.check_failure(f"http://dead.test:{self.dead}/dead", 502, "connect", "ECONNREFUSED")

    def test_a_name_that_does_not_resolve_is_a_logged_502(self):
        self.check_failure("http://nxdomain.invalid/nx", 502, "dns", "does not resolve")

    def test_the_proxy_keeps_serving_after_failures(self):
        r = curl(self.base + "/still-here", proxy=self.proxy.url, check=True)
        self.assertIn(b"/still-here", r.stdout)
        self.assertGreaterEqual(self.proxy.metric('fy_requests_total{outcome="upstream_error"}'), 0)


class Limits(unittest.TestCase):
    def test_over_the_connection_limit_is_503_never_a_crash(self):
        with Origin() as o, Proxy(f'mode = "enforce"\nallow = ["127.0.0.1:{o.port}"]\n',
                                  args=["--max-connections", "5"]) as p:
            held = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(5)]
            wait_until(lambda: p.metric("fy_connections_open") == 5, what="5 open connections")
            out = raw_exchange(p.port, b"GET http://127.0.0.1/ HTTP/1.1\r\n\r\n")
            self.assertEqual(http_status(out), 503)
            self.assertIn(b"connection limit (5)", out)
            for s in held:
                s.close()
            wait_until(lambda: p.metric("fy_connections_open") == 0, what="the connections to close")
            r = curl(f"http://127.0.0.1:{o.port}/ok", proxy=p.url, check=True)
            self.assertIn(b"/ok", r.stdout)
            self.assertEqual(p.metric("fy_connections_refused_limit_total"), 1)

    def test_ten_thousand_idle_connections_are_held(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard < 10100:
            self.skipTest(f"RLIMIT_NOFILE hard limit {hard} is below 10100")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        with Origin() as o, Proxy(f'mode = "enforce"\nallow = ["127.0.0.1:{o.port}"]\n') as p:
            socks = []
            try:
                for _ in range(10000):
                    socks.append(socket.create_connection(("127.0.0.1", p.port)))
                wait_until(lambda: p.metric("fy_connections_open") == 10000, timeout=30,
                           what="10,000 open connections")
                # Every one of them is live: a sample is served.
                for s in socks[::1000]:
                    s.sendall(f"GET http://127.0.0.1:{o.port}/live HTTP/1.1\r\nHost: 127.0.0.1:{o.port}\r\n\r\n".encode())
                    s.settimeout(10)
                    self.assertIn(b"200 OK", s.recv(4096))
                rss = int([l for l in open(f"/proc/{p.proc.pid}/status") if l.startswith("VmRSS")][0].split()[1])
                self.assertLess(rss, 200 * 1024, f"RSS {rss} KiB for 10,000 idle connections")
                self.assertIsNone(p.proc.poll())
            finally:
                for s in socks:
                    s.close()
            wait_until(lambda: p.metric("fy_connections_open") == 0, timeout=30, what="all to close")
            self.assertNotIn(" error ", p.stderr())


class Lifecycle(unittest.TestCase):
    def test_sigterm_drains_in_flight_work_then_exits_zero(self):
        with Origin() as o:
            p = Proxy(f'mode = "enforce"\nallow = ["127.0.0.1:{o.port}"]\n').start()
            try:
                s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
                s.sendall(f"GET http://127.0.0.1:{o.port}/slow/1500 HTTP/1.1\r\nHost: 127.0.0.1:{o.port}\r\n\r\n".encode())
                idle = socket.create_connection(("127.0.0.1", p.port), timeout=10)
                time.sleep(0.3)
                p.proc.send_signal(signal.SIGTERM)
                resp = b""
                while b"slow done" not in resp:
                    chunk = s.recv(4096)
                    self.assertTrue(chunk, f"cut before the response: {resp!r}")
                    resp += chunk
                self.assertIn(b"Connection: close", resp)
                self.assertEqual(idle.recv(10), b"")  # the idle one was closed at once
                self.assertEqual(p.proc.wait(timeout=10), 0)
                self.assertIn("exited cleanly", p.stderr())
                s.close()
                idle.close()
                rows = p.rows()
                self.assertTrue(any(r["path"] == "/slow/1500" and r["status"] == 200 for r in rows))
            finally:
                p.stop()

    def test_bad_flags_and_config_are_refused_with_file_line(self):
        r = subprocess.run([binary("fy-proxy"), "--listen", "nonsense"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("expected an IP address and port", r.stderr)
        r = subprocess.run([binary("fy-proxy"), "--frobnicate", "1"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option --frobnicate", r.stderr)
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write('listen = "127.0.0.1:0"\nmax_conections = 5\n')
        r = subprocess.run([binary("fy-proxy"), "--config", f.name], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{f.name}:2:", r.stderr)
        self.assertIn("unknown key 'max_conections'", r.stderr)
        os.unlink(f.name)
        r = subprocess.run([binary("fy-proxy"), "--help"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        self.assertIn("--policy FILE", r.stdout)

    def test_a_busy_port_exits_3_with_what_to_do(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            p = Proxy('mode = "enforce"\n', args=["--listen", f"127.0.0.1:{port}"])
            p.start(expect_ready=False)
            self.assertEqual(p.proc.wait(timeout=10), 3)
            self.assertIn("another process holds the port", p.stderr())
            p.stop()

    def test_netlog_write_errors_never_stop_traffic_and_are_counted(self):
        with Origin() as o:
            with Proxy(f'mode = "enforce"\nallow = ["127.0.0.1:{o.port}"]\n', args=["--netlog", "/dev/full"]) as p:
                for i in range(3):
                    r = curl(f"http://127.0.0.1:{o.port}/full{i}", proxy=p.url, check=True)
                    self.assertIn(b"/full", r.stdout)
                wait_until(lambda: p.metric("fy_netlog_write_errors_total") >= 1, what="a counted write error")
                self.assertGreaterEqual(p.metric("fy_netlog_rows_dropped_total"), 1)
                self.assertIn("network log: cannot write /dev/full", p.stderr())

    def test_the_network_log_rotates_into_dated_backups(self):
        with Origin() as o:
            with Proxy(f'mode = "enforce"\nallow = ["127.0.0.1:{o.port}"]\n',
                       args=["--netlog-max-bytes", "4096", "--netlog-backups", "2"]) as p:
                for i in range(40):
                    curl(f"http://127.0.0.1:{o.port}/rot{i}/" + "p" * 150, proxy=p.url, check=True)
                wait_until(lambda: p.metric("fy_netlog_rotations_total") >= 2, what="rotations")
                names = sorted(os.listdir(p.dir))
                backups = [n for n in names if n.startswith("egress.") and n != "egress.jsonl"]
                self.assertLessEqual(len(backups), 2, names)
                self.assertTrue(all(n[len("egress."):].startswith("20") for n in backups), backups)
                self.assertLessEqual(os.path.getsize(p.netlog), 4096)


if __name__ == "__main__":
    unittest.main(verbosity=2)

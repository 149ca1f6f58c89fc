"""The allowlist and live reload, through the real fy-proxy: pattern and port
semantics, observe and learn, failing closed, grants taking effect live, and
what a reload does to open connections (ADR-0030)."""

import datetime
import json
import os
import socket
import ssl
import tempfile
import threading
import time
import unittest

from fytest import EchoOrigin, Origin, Proxy, TestCA, curl, http_status, raw_exchange, wait_until


def ts(seconds_from_now):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def connect_status(proxy, authority):
    out = raw_exchange(proxy.port, f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(),
                       until=b"\r\n\r\n", timeout=3)
    return http_status(out), out


def get_status(proxy, url, host):
    out = raw_exchange(proxy.port, f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(),
                       until=b"\r\n\r\n", timeout=3)
    return http_status(out)


class Semantics(unittest.TestCase):
    """Judged at CONNECT time: an allowed CONNECT is answered 200 before any dial,
    so these need no origin."""

    @classmethod
    def setUpClass(cls):
        cls.proxy = Proxy(
            'mode = "enforce"\n'
            'allow = ["api.example.test", "*.wild.test", "ports.test:8443", "[2001:db8::5]:443", '
            '"198.51.100.7"]\n'
            '[[grant]]\nhost = "build-only.test"\nscope = "build"\n'
        ).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)

    def status(self, authority):
        return connect_status(self.proxy, authority)[0]

    def test_exact_host_case_and_root_dot(self):
        self.assertEqual(self.status("api.example.test:443"), 200)
        self.assertEqual(self.status("API.Example.TEST.:443"), 200)
        self.assertEqual(self.status("x.api.example.test:443"), 403)
        self.assertEqual(self.status("example.test:443"), 403)

    def test_wildcard_covers_subdomains_at_any_depth_never_the_bare_domain(self):
        self.assertEqual(self.status("a.wild.test:443"), 200)
        self.assertEqual(self.status("a.b.c.wild.test:443"), 200)
        self.assertEqual(self.status("wild.test:443"), 403)
        self.assertEqual(self.status("notwild.test:443"), 403)

    def test_a_bare_grant_covers_connect_443_only(self):
        self.assertEqual(self.status("api.example.test:443"), 200)
        status, out = connect_status(self.proxy, "api.example.test:22")
        self.assertEqual(status, 403)
        # The refusal names the port, so the grant it suggests is exact.
        self.assertIn(b"fy allow add api.example.test:22", out)
        row = self.proxy.wait_rows(lambda r: r["host"] == "api.example.test:22")[-1]
        self.assertTrue(row["blocked"])
        self.assertEqual(row["method"], "CONNECT")

    def test_a_host_port_grant_opens_exactly_that_port(self):
        self.assertEqual(self.status("ports.test:8443"), 200)
        self.assertEqual(self.status("ports.test:443"), 403)
        self.assertEqual(self.status("ports.test:8444"), 403)

    def test_plain_http_enforces_the_port_policy_too(self):
        # Refusals need no origin: they are answered before any dial.
        self.assertEqual(get_status(self.proxy, "http://other.test/", "other.test"), 403)
        self.assertEqual(get_status(self.proxy, "http://ports.test:8080/", "ports.test:8080"), 403)
        # http://h:443/ needs h:443, not the bare grant.
        self.assertEqual(get_status(self.proxy, "http://api.example.test:443/", "api.example.test:443"), 403)

    def test_ip_literals_and_ipv6_are_judged_like_hosts(self):
        self.assertEqual(self.status("198.51.100.7:443"), 200)
        self.assertEqual(self.status("198.51.100.8:443"), 403)
        self.assertEqual(self.status("[2001:db8::5]:443"), 200)
        self.assertEqual(self.status("[2001:DB8:0::5]:443"), 200)  # canonical form
        self.assertEqual(self.status("[2001:db8::6]:443"), 403)

    def test_a_build_scope_grant_needs_a_build(self):
        # Without a build credential the proxy asks for one (407): only a
        # build's secret opens this destination.
        status, out = connect_status(self.proxy, "build-only.test:443")
        self.assertEqual(status, 407)
        self.assertIn(b'Proxy-Authenticate: Basic realm="foldyard build"', out)

    def test_the_refusal_body_is_the_reference_s(self):
        status, out = connect_status(self.proxy, "nope.test:443")
        self.assertEqual(status, 403)
        self.assertTrue(out.endswith(b"refused by the foldyard allowlist - grant it on your computer: "
                                     b"`fy allow add nope.test`\n"))


class ObserveAndLearn(unittest.TestCase):
    def test_observing_refuses_nothing_and_rate_limits_would_block_rows(self):
        with Proxy('mode = "observe"\n') as p:
            for _ in range(3):
                self.assertEqual(connect_status(p, "seen.test:443")[0], 200)
            self.assertEqual(connect_status(p, "other.test:8443")[0], 200)
            rows = p.wait_rows(lambda r: r.get("would_block"), n=2)
            time.sleep(0.3)
            rows = [r for r in p.rows() if r.get("would_block")]
            self.assertEqual(sorted(r["host"] for r in rows), ["other.test:8443", "seen.test"])
            self.assertEqual(rows[0]["status"], 0)
            self.assertEqual(p.metric("fy_would_block_total"), 4)
            # A new observation window resets the limit.
            p.reload(f'mode = "observe"\nobserving_since = {ts(0)}\n')
            connect_status(p, "seen.test:443")
            p.wait_rows(lambda r: r.get("would_block") and r["host"] == "seen.test", n=2)

    def test_a_learn_window_observes_then_enforces_by_itself(self):
        with Proxy(f'mode = "learn"\nlearn_until = {ts(2.0)}\n') as p:
            self.assertEqual(connect_status(p, "learned.test:443")[0], 200)
            # A tunnel open when the window closes is closed with it.
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(b"CONNECT held-open.test:443 HTTP/1.1\r\n\r\n")
            self.assertIn(b" 200 ", s.recv(100))
            wait_until(lambda: connect_status(p, "learned.test:443")[0] == 403, timeout=6,
                       what="the learn window to close")
            s.settimeout(5)
            try:
                self.assertEqual(s.recv(100), b"")
            except ConnectionResetError:
                pass
            s.close()
            self.assertIn("learn window over", p.stderr())

    def test_a_learn_window_longer_than_8h_fails_closed(self):
        with Proxy(f'mode = "learn"\nlearn_until = {ts(9 * 3600)}\n') as p:
            self.assertEqual(connect_status(p, "anything.test:443")[0], 403)
            self.assertIn("at most 8 h", p.stderr())


class FailClosed(unittest.TestCase):
    def test_a_malformed_policy_fails_closed_and_says_why_once(self):
        with Proxy('mode = "enforce"\nallow = ["ok.test"]\npassthrough = ["ok.test"]\n') as p:
            self.assertEqual(connect_status(p, "ok.test:443")[0], 200)
            bad = 'mode = "enforce"\nallow = ["ok.test"\n'  # unterminated array
            p.reload(bad)
            self.assertEqual(connect_status(p, "ok.test:443")[0], 403)
            self.assertEqual(p.metric("fy_policy_failed_closed"), 1)
            self.assertIn("FAILED CLOSED", p.admin("/healthz"))
            # The same damage again is not reported again; a different one is.
            p.reload(bad)
            p.reload(bad)
            errors = [l for l in p.stderr().splitlines() if " error " in l and "is unusable" in l]
            self.assertEqual(len(errors), 1, errors)
            p.reload('mode = "enforce"\nallow = 3\n')
            errors = [l for l in p.stderr().splitlines() if " error " in l and "is unusable" in l]
            self.assertEqual(len(errors), 2, errors)
            self.assertIn(f"{p.policy_path}:", p.stderr())  # file:line in the message
            p.reload('mode = "enforce"\nallow = ["ok.test"]\n')
            self.assertEqual(connect_status(p, "ok.test:443")[0], 200)
            self.assertEqual(p.metric("fy_policy_failed_closed"), 0)

    def test_wrong_shaped_fields_are_damage_not_defaults(self):
        for text, where in (
            ('mode = "sometimes"\n', ":1:"),
            ('allow = "ok.test"\n', ":1:"),
            ('allow = ["https://ok.test/path"]\n', ":1:"),
            ('mode = "enforce"\nalow = ["ok.test"]\n', ":2:"),  # a typo is not "no grants"
            ('[[grant]]\nhost = "ok.test"\nlevel = "once"\n', ":"),  # once without expiry
        ):
            with Proxy(text) as p:
                self.assertEqual(connect_status(p, "ok.test:443")[0], 403, text)
                self.assertIn(p.policy_path + where, p.stderr(), text)

    def test_a_missing_policy_fails_closed(self):
        p = Proxy(None)
        with p:
            self.assertEqual(connect_status(p, "ok.test:443")[0], 403)
            self.assertIn("cannot be read", p.stderr())
            # It appears later: the watcher picks it up.
            p.write_policy('mode = "enforce"\nallow = ["ok.test"]\n')
            wait_until(lambda: connect_status(p, "ok.test:443")[0] == 200, what="the new policy")


class LiveReload(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fyreload-")
        cls.ca = TestCA(cls.tmp)
        cert, key = cls.ca.issue(["keep.test", "pt.test", "revoke.test"])
        cls.tls = Origin(cert, key).__enter__()
        cls.plain = Origin().__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.tls.__exit__(None, None, None)
        cls.plain.__exit__(None, None, None)

    def proxy(self, policy):
        return Proxy(policy, resolve=[(h, "127.0.0.1") for h in ("keep.test", "pt.test", "revoke.test",
                                                                 "dl.test")],
                     upstream_ca=self.ca.cert_path)

    def tls_session(self, proxy, host, cafile):
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        s.sendall(f"CONNECT {host}:{self.tls.port} HTTP/1.1\r\n\r\n".encode())
        self.assertIn(b" 200 ", s.recv(200))
        t = ssl.create_default_context(cafile=cafile).wrap_socket(s, server_hostname=host)
        return t

    def request(self, t, host, path):
        t.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{self.tls.port}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += t.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        while len(body) < n:
            body += t.recv(65536)
        return http_status(data), body

    def closed(self, t):
        t.settimeout(5)
        try:
            return t.recv(100) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def test_a_grant_takes_effect_live_without_a_restart(self):
        o = self.tls.port
        with self.proxy('mode = "enforce"\n') as p:
            pid = p.proc.pid
            self.assertEqual(connect_status(p, f"keep.test:{o}")[0], 403)
            p.write_policy(f'mode = "enforce"\nallow = ["keep.test:{o}"]\n')  # no signal: the watcher
            wait_until(lambda: connect_status(p, f"keep.test:{o}")[0] == 200, what="the grant")
            self.assertEqual(p.proc.pid, pid)
            self.assertIsNone(p.proc.poll())

    def test_revoking_a_grant_closes_its_tunnels_and_widening_closes_nothing(self):
        o = self.tls.port
        with self.proxy(f'mode = "enforce"\nallow = ["keep.test:{o}", "revoke.test:{o}"]\n') as p:
            keep = self.tls_session(p, "keep.test", p.ca)
            gone = self.tls_session(p, "revoke.test", p.ca)
            self.assertEqual(self.request(keep, "keep.test", "/1")[0], 200)
            self.assertEqual(self.request(gone, "revoke.test", "/1")[0], 200)
            # Widening: a new grant. Both stay open.
            p.reload(f'mode = "enforce"\nallow = ["keep.test:{o}", "revoke.test:{o}", "more.test"]\n')
            self.assertEqual(self.request(keep, "keep.test", "/2")[0], 200)
            self.assertEqual(self.request(gone, "revoke.test", "/2")[0], 200)
            # Revoking one closes exactly that one.
            p.reload(f'mode = "enforce"\nallow = ["keep.test:{o}"]\n')
            self.assertTrue(self.closed(gone))
            self.assertEqual(self.request(keep, "keep.test", "/3")[0], 200)
            self.assertEqual(p.metric("fy_connections_closed_by_policy_total"), 1)
            keep.close()
            gone.close()

    def test_a_reload_from_observe_to_enforce_closes_the_tunnels_it_now_refuses(self):
        o = self.tls.port
        with self.proxy(f'mode = "observe"\nallow = ["keep.test:{o}"]\n') as p:
            observed = self.tls_session(p, "revoke.test", p.ca)  # not granted: observed, not refused
            granted = self.tls_session(p, "keep.test", p.ca)
            self.assertEqual(self.request(observed, "revoke.test", "/observed")[0], 200)
            self.assertEqual(self.request(granted, "keep.test", "/granted")[0], 200)
            p.wait_rows(lambda r: r.get("would_block") and r["host"] == f"revoke.test:{o}")
            self.assertEqual(p.metric("fy_connections_closed_by_policy_total"), 0)
            p.reload(f'mode = "enforce"\nallow = ["keep.test:{o}"]\n')
            self.assertTrue(self.closed(observed))
            self.assertEqual(self.request(granted, "keep.test", "/still")[0], 200)
            self.assertEqual(p.metric("fy_connections_closed_by_policy_total"), 1)
            self.assertIn(f"closed: the policy now refuses its destination (revoke.test:{o})", p.stderr())
            # ... and the same destination is now refused at CONNECT.
            self.assertEqual(connect_status(p, f"revoke.test:{o}")[0], 403)
            self.assertEqual([r["path"] for r in self.tls.requests if r["path"] in ("/observed", "/still")],
                             ["/observed", "/still"])
            granted.close()
            observed.close()

    def test_a_tunnel_whose_host_leaves_passthrough_is_closed(self):
        o = self.tls.port
        base = f'mode = "enforce"\nallow = ["pt.test:{o}", "keep.test:{o}"]\n'
        with self.proxy(base + 'passthrough = ["pt.test", "keep.test"]\n') as p:
            pt = self.tls_session(p, "pt.test", self.ca.cert_path)  # the origin's own certificate
            untouched = self.tls_session(p, "keep.test", self.ca.cert_path)
            self.assertEqual(self.request(pt, "pt.test", "/a")[0], 200)
            p.reload(base + 'passthrough = ["keep.test"]\n')
            self.assertTrue(self.closed(pt))
            self.assertEqual(self.request(untouched, "keep.test", "/b")[0], 200)
            row = p.wait_rows(lambda r: r.get("passthrough") and r["host"] == f"pt.test:{o}")[-1]
            self.assertIn("left passthrough", row["error"])
            untouched.close()

    def test_a_download_in_flight_survives_a_settings_change(self):
        port = self.plain.port
        n = 40 * 1024 * 1024
        with self.proxy(f'mode = "enforce"\nallow = ["dl.test:{port}"]\n') as p:
            s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            s.sendall(f"GET http://dl.test:{port}/bytes/{n} HTTP/1.1\r\nHost: dl.test:{port}\r\n\r\n".encode())
            got = 0
            reloaded = False
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += s.recv(65536)
            got = len(buf.partition(b"\r\n\r\n")[2])
            while got < n:
                chunk = s.recv(65536)
                self.assertTrue(chunk, "the download was cut")
                got += len(chunk)
                if not reloaded and got > n // 4:
                    p.reload(f'mode = "enforce"\nallow = ["dl.test:{port}", "new.test"]\npassthrough = ["x.test"]\n')
                    reloaded = True
                    time.sleep(0.2)  # keep reading slowly across the reload
            self.assertTrue(reloaded)
            self.assertEqual(got, n)
            s.close()

    def test_a_once_grant_expires(self):
        with Proxy(f'mode = "enforce"\n[[grant]]\nhost = "once.test"\nlevel = "once"\nexpires = {ts(1.5)}\n') as p:
            self.assertEqual(connect_status(p, "once.test:443")[0], 200)
            wait_until(lambda: connect_status(p, "once.test:443")[0] == 403, timeout=5, what="expiry")


class NoDial(unittest.TestCase):
    def test_a_refused_connect_never_dials(self):
        with EchoOrigin() as origin:
            port = origin.port
            names = [("refused.test", "127.0.0.1"), ("allowed.test", "127.0.0.1")]
            with Proxy(f'mode = "enforce"\nallow = ["allowed.test:{port}"]\n', resolve=names) as p:
                hello = client_hello("refused.test")
                refused = [
                    f"CONNECT refused.test:{port} HTTP/1.1\r\nHost: refused.test:{port}\r\n\r\n".encode(),
                    f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode(),
                    # a client that does not wait for the answer: the ClientHello rides along
                    f"CONNECT refused.test:{port} HTTP/1.1\r\n\r\n".encode() + hello,
                    f"CONNECT allowed.test:{port + 1 if port < 65535 else port - 1} HTTP/1.1\r\n\r\n".encode(),
                    f"GET http://refused.test:{port}/x HTTP/1.1\r\nHost: refused.test:{port}\r\n\r\n".encode(),
                ]
                for data in refused:
                    out = raw_exchange(p.port, data, timeout=3)
                    self.assertEqual(http_status(out), 403, out[:200])
                    self.assertIn(b"refused by the foldyard allowlist", out)
                time.sleep(0.5)
                self.assertEqual(origin.accepts, 0, "a refused destination was dialled")
                self.assertEqual(p.metric('fy_requests_total{outcome="refused_allowlist"}'), len(refused))
                # The counter counts: an allowed CONNECT that carries bytes dials once.
                s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
                s.sendall(f"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n".encode())
                self.assertIn(b" 200 ", s.recv(200))
                s.sendall(b"ping\n")
                self.assertEqual(s.recv(100), b"ping\n")
                self.assertEqual(origin.accepts, 1)
                s.close()


def client_hello(server_name):
    """The bytes of a real TLS ClientHello for server_name."""
    incoming, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, out, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""fy-proxy's HTTPS: the generated CA, minted leaves, decryption, upstream
verification, passthrough tunnels, SNI rules, IPv6 and git over HTTPS."""

import json
import os
import socket
import ssl
import stat
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fytest import Origin, Proxy, TestCA, curl, http_status, load_cert, raw_exchange, wait_until


def connect_tunnel(proxy_port, authority, timeout=5):
    """Opens a CONNECT tunnel through the proxy; returns the socket after the 200."""
    s = socket.create_connection(("127.0.0.1", proxy_port), timeout=timeout)
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise AssertionError(f"proxy closed the CONNECT: {head!r}")
        head += chunk
    return s, head


def early_data_exchange(proxy_port, authority, server_hostname, cafile, request):
    """Sends CONNECT and the ClientHello in one write (a client that does not
    wait for the 200), then completes TLS and one request; returns the answer."""
    ctx = ssl.create_default_context(cafile=cafile)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(inc, out, server_hostname=server_hostname)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    s = socket.create_connection(("127.0.0.1", proxy_port), timeout=5)
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\n\r\n".encode() + out.read())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert b" 200 " in head, head
    inc.write(rest)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            s.sendall(out.read())
            data = s.recv(65536)
            if not data:
                raise AssertionError("the tunnel closed during the handshake")
            inc.write(data)
    tls.write(request)
    s.sendall(out.read())
    answer = b""
    while True:
        try:
            answer += tls.read(65536)
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        except ssl.SSLWantReadError:
            data = s.recv(65536)
            if not data:
                break
            inc.write(data)
        except ssl.SSLZeroReturnError:
            break
    s.close()
    return answer


class Https(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fytls-")
        cls.ca = TestCA(cls.tmp)
        cert, key = cls.ca.issue(["secure.test", "other.test"], ips=["127.0.0.1"])
        cls.origin = Origin(cert, key).__enter__()
        ecert, ekey = cls.ca.issue(["expired.test"], expired=True)
        cls.expired = Origin(ecert, ekey).__enter__()
        wcert, wkey = cls.ca.issue(["someone-else.test"], tag="wrongname")
        cls.wrongname = Origin(wcert, wkey).__enter__()
        scert, skey = cls.ca.issue(["selfsigned.test"], self_signed=True)
        cls.selfsigned = Origin(scert, skey).__enter__()
        cls.plain = Origin().__enter__()
        cls.git_root = os.path.join(cls.tmp, "repos")
        os.makedirs(cls.git_root)
        cls.origin.git_root = cls.git_root
        o, e, w, s = cls.origin.port, cls.expired.port, cls.wrongname.port, cls.selfsigned.port
        cls.policy = (
            'mode = "enforce"\n'
            f'allow = ["secure.test:{o}", "other.test:{o}", "expired.test:{e}", '
            f'"wrongname.test:{w}", "selfsigned.test:{s}", "127.0.0.1:{o}"]\n'
        )
        cls.proxy = Proxy(
            cls.policy,
            resolve=[(h, "127.0.0.1") for h in
                     ("secure.test", "other.test", "expired.test", "wrongname.test", "selfsigned.test")],
            upstream_ca=cls.ca.cert_path,
        ).__enter__()
        cls.url = f"https://secure.test:{o}"

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        for o in (cls.origin, cls.expired, cls.wrongname, cls.selfsigned, cls.plain):
            o.__exit__(None, None, None)

    def setUp(self):
        self.origin.requests.clear()

    def test_the_ca_is_generated_private_and_stable(self):
        key = os.path.join(self.proxy.state, "ca-key.pem")
        self.assertEqual(stat.S_IMODE(os.stat(key).st_mode), 0o600)
        ca = load_cert(self.proxy.ca)
        bc = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        self.assertTrue(bc.ca)
        # A second proxy on the same state directory keeps the CA.
        with Proxy(self.policy, tmp=tempfile.mkdtemp(prefix="fyca-")) as p2:
            first = open(p2.ca, "rb").read()
            p2.stop()
            p3 = Proxy(self.policy, tmp=p2.dir).start()
            try:
                self.assertEqual(open(p3.ca, "rb").read(), first)
            finally:
                p3.stop()

    def test_curl_https_is_decrypted_forwarded_and_logged(self):
        r = curl(self.url + "/inside?q=1", proxy=self.proxy.url, cacert=self.proxy.ca, check=True)
        self.assertEqual(json.loads(r.stdout)["path"], "/inside?q=1")
        req = self.origin.requests[-1]
        self.assertEqual(self.origin.header(req, "Host"), f"secure.test:{self.origin.port}")
        row = self.proxy.wait_rows(lambda x: x["path"] == "/inside?q=1")[-1]
        self.assertEqual(row["tls"], "decrypted")
        self.assertEqual(row["sni"], "secure.test")
        self.assertEqual(row["host"], f"secure.test:{self.origin.port}")
        self.assertEqual(row["status"], 200)

    def test_python_urllib_https_through_the_proxy_trusting_the_generated_ca(self):
        def opener(context):
            return urllib.request.build_opener(urllib.request.ProxyHandler({"https": self.proxy.url}),
                                               urllib.request.HTTPSHandler(context=context))
        trusting = opener(ssl.create_default_context(cafile=self.proxy.ca))
        req = urllib.request.Request(self.url + "/urllib-tls?x=1", data=b"payload=1", method="POST")
        with trusting.open(req, timeout=10) as resp:
            self.assertEqual(resp.status, 200)
            info = json.loads(resp.read())
        self.assertEqual((info["method"], info["path"], info["body_len"]), ("POST", "/urllib-tls?x=1", 9))
        got = [q for q in self.origin.requests if q["path"] == "/urllib-tls?x=1"]
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0]["body"], b"payload=1")
        self.assertEqual(self.origin.header(got[0], "Host"), f"secure.test:{self.origin.port}")
        row = self.proxy.wait_rows(lambda x: x["path"] == "/urllib-tls?x=1")[-1]
        self.assertEqual((row["method"], row["status"], row["tls"]), ("POST", 200, "decrypted"))
        self.assertEqual(row["host"], f"secure.test:{self.origin.port}")
        self.assertIn("Python-urllib", row["ua"])
        # The system roots alone do not trust the proxy's leaf: the CA is what made it work.
        with self.assertRaises(urllib.error.URLError) as e:
            opener(ssl.create_default_context()).open(self.url + "/urllib-untrusted", timeout=10)
        self.assertIsInstance(e.exception.reason, ssl.SSLCertVerificationError)
        self.assertFalse(any(q["path"] == "/urllib-untrusted" for q in self.origin.requests))

    def test_the_ca_is_load_bearing(self):
        # Without the proxy's CA the client refuses the minted certificate.
        r = curl(self.url + "/untrusted", proxy=self.proxy.url)
        self.assertNotEqual(r.returncode, 0)
        self.assertFalse(any(q["path"] == "/untrusted" for q in self.origin.requests))

    def test_leaf_is_ecdsa_p256_for_the_host_signed_by_the_ca(self):
        s, _ = connect_tunnel(self.proxy.port, f"secure.test:{self.origin.port}")
        ctx = ssl.create_default_context(cafile=self.proxy.ca)
        with ctx.wrap_socket(s, server_hostname="secure.test") as t:
            der = t.getpeercert(binary_form=True)
            self.assertEqual(t.selected_alpn_protocol(), None)
        leaf = x509.load_der_x509_certificate(der)
        self.assertIsInstance(leaf.public_key(), ec.EllipticCurvePublicKey)
        self.assertEqual(leaf.public_key().curve.name, "secp256r1")
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), ["secure.test"])
        self.assertEqual(leaf.issuer, load_cert(self.proxy.ca).subject)

    def test_an_ip_destination_gets_an_ip_san(self):
        s, _ = connect_tunnel(self.proxy.port, f"127.0.0.1:{self.origin.port}")
        ctx = ssl.create_default_context(cafile=self.proxy.ca)
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            der = t.getpeercert(binary_form=True)
        leaf = x509.load_der_x509_certificate(der)
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual([str(a) for a in san.get_values_for_type(x509.IPAddress)], ["127.0.0.1"])

    def test_tls12_and_tls13_and_alpn_http11(self):
        for flags in (["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3"]):
            r = curl(*flags, "-v", self.url + "/v", proxy=self.proxy.url, cacert=self.proxy.ca, check=True)
            want = b"TLSv1.2" if "1.2" in flags[-1] else b"TLSv1.3"
            self.assertIn(want, r.stderr)
        r = curl("--http2", "-v", self.url + "/alpn", proxy=self.proxy.url, cacert=self.proxy.ca, check=True)
        self.assertIn(b"ALPN: server accepted http/1.1", r.stderr)

    def test_a_second_tunnel_resumes_the_origin_s_tls_session(self):
        before = self.proxy.metric("fy_tls_origin_resumptions_offered_total")
        for i in range(3):
            r = curl(self.url + f"/resume{i}", proxy=self.proxy.url, cacert=self.proxy.ca, check=True)
            self.assertEqual(json.loads(r.stdout)["path"], f"/resume{i}")
        self.assertGreaterEqual(self.proxy.metric("fy_tls_origin_resumptions_offered_total"), before + 2)
        # A session is only ever offered for the origin that issued it: another
        # name on the same address still gets a full, verified handshake.
        r = curl(f"https://expired.test:{self.expired.port}/x", proxy=self.proxy.url, cacert=self.proxy.ca)
        self.assertIn(b"certificate has expired", r.stdout)

    def test_keep_alive_inside_the_tunnel(self):
        r = curl(self.url + "/k1", "-o", "/dev/null", self.url + "/k2", "-o", "/dev/null",
                 self.url + "/k3", "-w", "%{num_connects}", proxy=self.proxy.url, cacert=self.proxy.ca,
                 check=True)
        rows = self.proxy.wait_rows(lambda x: x["path"] in ("/k1", "/k2", "/k3"), n=3)
        self.assertEqual(len({x["conn"] for x in rows}), 1)
        clients = {q["client"] for q in self.origin.requests if q["path"] in ("/k1", "/k2", "/k3")}
        self.assertEqual(len(clients), 1)

    def test_pipelined_requests_past_the_stash_bound_inside_the_tunnel_stay_in_order(self):
        # The first request waits 300 ms at the origin while the client
        # pipelines ~125 KiB more, past the 64 KiB the proxy stashes: it stops
        # reading with TLS records read but not yet delivered. When the first
        # answer is done, the stash must go first and those records after it.
        host = f"secure.test:{self.origin.port}"
        s, _ = connect_tunnel(self.proxy.port, host, timeout=15)
        t = ssl.create_default_context(cafile=self.proxy.ca).wrap_socket(
            s, server_hostname="secure.test")
        n = 130
        pad = "x" * 900
        reqs = [f"GET /slow/300 HTTP/1.1\r\nHost: {host}\r\n\r\n"]
        reqs += [f"GET /q{i} HTTP/1.1\r\nHost: {host}\r\nX-Pad: {pad}\r\n\r\n"
                 for i in range(1, n - 1)]
        reqs.append(f"GET /q{n - 1} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
        data = "".join(reqs).encode()
        self.assertGreater(len(data), 100 * 1024)
        t.sendall(data)
        out = b""
        while True:
            try:
                chunk = t.recv(65536)
            except (ssl.SSLError, OSError):
                break
            if not chunk:
                break
            out += chunk
        t.close()
        # Walk the answers by their framing: statuses and bodies, in order.
        got, rest = [], out
        while rest:
            head, sep, rest = rest.partition(b"\r\n\r\n")
            self.assertTrue(sep, f"a truncated answer after {len(got)}: {head[:200]!r}")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body, rest = rest[:length], rest[length:]
            got.append((status, body))
        self.assertEqual(len(got), n, [g[0] for g in got])
        self.assertEqual(got[0], (200, b"slow done"))
        paths = [json.loads(b)["path"] if st == 200 else st for st, b in got[1:]]
        self.assertEqual(paths, [f"/q{i}" for i in range(1, n)])

    def test_websocket_frames_sent_before_the_101_past_the_stash_bound_stay_in_order(self):
        # ~120 KiB of frames follow the upgrade request before the 101 can
        # come (the origin waits 300 ms): past the stash bound, so the proxy
        # stops reading. At the 101 the stashed frames must reach the origin
        # before anything read after them. (Unlike the pipelined test above,
        # this one did not catch the old resume-first order: here the records
        # left unread stayed in the socket, not in the TLS buffers. It guards
        # the order across the 101, not that race.)
        from fytest import ws_frame, ws_read_frame
        host = f"secure.test:{self.origin.port}"
        s, _ = connect_tunnel(self.proxy.port, host, timeout=15)
        t = ssl.create_default_context(cafile=self.proxy.ca).wrap_socket(
            s, server_hostname="secure.test")
        n = 120
        frames = [ws_frame(1, (b"%05d" % i) * 200) for i in range(n)]
        t.sendall((f"GET /ws/slow HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode()
                  + b"".join(frames))
        f = t.makefile("rb")
        self.assertIn(b"101", f.readline())
        while f.readline() not in (b"\r\n", b""):
            pass
        got = []
        for _ in range(n):
            frame = ws_read_frame(f)
            if frame is None:
                break
            got.append(frame[1][:5].decode())
        t.sendall(ws_frame(8, b""))
        f.close()
        t.close()
        self.assertEqual(got, ["%05d" % i for i in range(n)])

    def test_upstream_verification_failures_answer_502_with_the_reason(self):
        cases = [
            ("expired.test", self.expired.port, "certificate has expired"),
            ("wrongname.test", self.wrongname.port, "Hostname mismatch"),
            ("selfsigned.test", self.selfsigned.port, "self signed certificate"),
        ]
        before = self.proxy.metric("fy_tls_origin_verify_failures_total")
        for host, port, reason in cases:
            r = curl(f"https://{host}:{port}/secret", proxy=self.proxy.url, cacert=self.proxy.ca)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(b"foldyard's proxy could not reach", r.stdout)
            self.assertIn(reason.encode(), r.stdout)
            row = self.proxy.wait_rows(lambda x: x["host"] == f"{host}:{port}")[-1]
            self.assertEqual(row["status"], 502)
            self.assertTrue(row["error"].startswith("tls_verify: "), row)
            self.assertIn(reason, row["error"])
        self.assertEqual(self.proxy.metric("fy_tls_origin_verify_failures_total"), before + 3)
        for o in (self.expired, self.wrongname, self.selfsigned):
            self.assertFalse(any(q["path"] == "/secret" for q in o.requests), "nothing reached the origin")

    def test_a_clienthello_sent_with_the_connect_is_not_lost(self):
        o = self.origin.port
        answer = early_data_exchange(self.proxy.port, f"secure.test:{o}", "secure.test", self.proxy.ca,
                                     f"GET /early HTTP/1.1\r\nHost: secure.test:{o}\r\n\r\n".encode())
        self.assertIn(b"200 OK", answer)
        self.assertIn(b'"/early"', answer)

    def test_a_host_header_naming_another_host_inside_the_tunnel_is_refused(self):
        r = curl(self.url + "/claim", "-H", "Host: other.test", proxy=self.proxy.url, cacert=self.proxy.ca)
        self.assertIn(b"names a different host", r.stdout)
        self.assertFalse(any(q["path"] == "/claim" for q in self.origin.requests))

    def test_git_clone_over_https(self):
        src = os.path.join(self.tmp, "src")
        subprocess.run(["git", "init", "-q", "-b", "main", src], check=True)
        with open(os.path.join(src, "README"), "w") as f:
            f.write("hello through the proxy\n")
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")
        subprocess.run(["git", "-C", src, "add", "."], check=True)
        subprocess.run(["git", "-C", src, "commit", "-qm", "first"], check=True, env=env)
        subprocess.run(["git", "clone", "-q", "--bare", src, os.path.join(self.git_root, "r.git")], check=True)
        dst = os.path.join(self.tmp, "dst")
        genv = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        genv.update(HTTPS_PROXY=self.proxy.url, GIT_SSL_CAINFO=self.proxy.ca, GIT_TERMINAL_PROMPT="0")
        r = subprocess.run(["git", "clone", "-q", f"{self.url}/git/r.git", dst], env=genv,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(open(os.path.join(dst, "README")).read(), "hello through the proxy\n")
        rows = self.proxy.wait_rows(lambda x: x["path"].startswith("/git/r.git"), n=2)
        self.assertTrue(any("info/refs" in x["path"] for x in rows))
        self.assertTrue(any(x["method"] == "POST" and "git-upload-pack" in x["path"] for x in rows))
        self.assertTrue(all(x["ua"].startswith("git/") for x in rows))


class Passthrough(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fypass-")
        cls.ca = TestCA(cls.tmp)
        cert, key = cls.ca.issue(["secure.test", "pt.example.test", "sni-other.test", "early.example.test"])
        cls.origin = Origin(cert, key).__enter__()
        o = cls.origin.port
        cls.policy = (
            'mode = "enforce"\n'
            f'allow = ["secure.test:{o}", "pt.example.test:{o}", "early.example.test:{o}"]\n'
            'passthrough = ["secure.test", "*.example.test", "@node"]\n'
        )
        cls.proxy = Proxy(cls.policy, resolve=[("secure.test", "127.0.0.1"), ("pt.example.test", "127.0.0.1"),
                                               ("early.example.test", "127.0.0.1")],
                          upstream_ca=cls.ca.cert_path).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)

    def test_passthrough_blind_tunnels_and_logs_one_sni_row(self):
        o = self.origin.port
        # The client sees the origin's own certificate: it trusts the origin CA,
        # not the proxy's.
        for host in ("secure.test", "pt.example.test"):
            r = curl(f"https://{host}:{o}/blind", proxy=self.proxy.url, cacert=self.ca.cert_path, check=True)
            self.assertEqual(json.loads(r.stdout)["path"], "/blind")
            row = self.proxy.wait_rows(lambda x: x["host"] == f"{host}:{o}" and x.get("passthrough"))[-1]
            self.assertEqual(row["method"], "CONNECT")
            self.assertEqual(row["tls"], "passthrough")
            self.assertEqual(row["sni"], host)
            self.assertEqual(row["status"], 0)
            self.assertGreater(row["bytes_up"], 200)
            self.assertGreater(row["bytes_down"], 200)
            self.assertFalse(any(x.get("path") == "/blind" for x in self.proxy.rows() if x["host"] == f"{host}:{o}"))
        # With only the proxy's CA the client fails: nothing was decrypted.
        r = curl(f"https://secure.test:{o}/blind2", proxy=self.proxy.url, cacert=self.proxy.ca)
        self.assertNotEqual(r.returncode, 0)

    def test_a_passthrough_clienthello_sent_with_the_connect_is_relayed(self):
        o = self.origin.port
        answer = early_data_exchange(self.proxy.port, f"early.example.test:{o}", "early.example.test",
                                     self.ca.cert_path,
                                     f"GET /early-pt HTTP/1.1\r\nHost: early.example.test:{o}\r\n\r\n".encode())
        self.assertIn(b'"/early-pt"', answer)

    def test_an_sni_that_disagrees_with_the_target_is_decrypted_not_tunnelled(self):
        o = self.origin.port
        s, _ = connect_tunnel(self.proxy.port, f"secure.test:{o}")
        ctx = ssl.create_default_context(cafile=self.proxy.ca)  # the proxy's CA: decrypted
        with ctx.wrap_socket(s, server_hostname="sni-other.test") as t:
            t.sendall(b"GET /mismatch HTTP/1.1\r\nHost: sni-other.test\r\nConnection: close\r\n\r\n")
            resp = b""
            while True:
                chunk = t.recv(65536)
                if not chunk:
                    break
                resp += chunk
        self.assertEqual(http_status(resp), 403)
        self.assertIn(b"names a different host", resp)
        row = self.proxy.wait_rows(lambda x: x.get("sni") == "sni-other.test")[-1]
        self.assertEqual(row["tls"], "decrypted")
        self.assertNotIn("passthrough", row)
        self.assertFalse(any(q["path"] == "/mismatch" for q in self.origin.requests))


class Ipv6(unittest.TestCase):
    def test_an_ipv6_destination_is_judged_and_served(self):
        try:
            socket.socket(socket.AF_INET6).bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback on this machine")
        with Origin(host="::1") as origin:
            policy = f'mode = "enforce"\nallow = ["[::1]:{origin.port}"]\n'
            with Proxy(policy) as proxy:
                r = curl(f"http://[::1]:{origin.port}/six", proxy=proxy.url, check=True)
                self.assertEqual(json.loads(r.stdout)["path"], "/six")
                row = proxy.wait_rows(lambda x: x["path"] == "/six")[-1]
                self.assertEqual(row["host"], f"[::1]:{origin.port}")
                # Another port on the same address is not granted.
                out = raw_exchange(proxy.port, b"CONNECT [::1]:1 HTTP/1.1\r\n\r\n")
                self.assertEqual(http_status(out), 403)
                self.assertIn(b"fy allow add [::1]:1", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""Credential injection through the real fy-proxy (issue 3): rules and kinds,
minters (static, command, github-app), single flight and caching, failures
answered by the proxy, 401 replay, held dummies, overlaps, build secrets with
git's 407 retry, log rows, and no secret in any output."""

import base64
import datetime
import hashlib
import json
import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from fytest import Origin, Proxy, TestCA, curl, http_status, raw_exchange, wait_until

# Every credential value the tests use is long and unique, so that finding it
# in an output can only mean it leaked there.
REAL = "real-token-Zq8vN3kX1pW7rT5yB2mD"          # never in the box, never in a log
ROTATED = "rotated-token-Hf4Jg6Ls8Kd0Pq2Wn9Xc"
OTHER_SECRET = "other-secret-Ty7Ui9Op1As3Df5Gh8Jk"
BUILD_SECRET = "build-secret-Mn2Bv4Cx6Zl8Kj0Hg3Fd"
MINTED = "minted-token-Qa1Ws2Ed3Rf4Tg5Yh6Uj7"     # the github-app installation token
# What the command minters print.
V_AHEAD = "v-ahead-Lq4Wm8Zr2Tx6Np0Kc3Hd"
STALE = "stale-token-Rb5Yn1Qe7Uf3Ji9Ov2Ps"
FRESH = "fresh-token-Gk8Dh2Wa6Mz0Xl4Cv7Bt"
CMD_TOKEN = "cmd-token-Ny3Fs7Kq1Ep5Rw9Tj2Ug"
SLOW = "slow-token-Pe6Ha0Vm4Lb8Sd2Qx5Zi"
LATE = "late-token-Wc9Ju3Ro7Ty1Fg5Kn8Mb"
OLD_RULE = "old-rule-token-Ax4Bz8Cy2Dw6Ev0Fu"
NEW_RULE = "new-rule-token-Hs3Jt7Lv1Nx5Pz9Rb"
ECHOED = "echoed-secret-" + "Z" * 24
# What a failing minter writes: on stderr (redacted in the answer) and stdout.
FAILING_STDERR = "sk_live_" + "A" * 30
FAILING_STDOUT = "stdout-secret-" + "B" * 25
SECRETS = [REAL, ROTATED, OTHER_SECRET, BUILD_SECRET, MINTED, V_AHEAD, STALE, FRESH, CMD_TOKEN,
           SLOW, LATE, OLD_RULE, NEW_RULE, ECHOED, FAILING_STDERR, FAILING_STDOUT]


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def pem_secrets(pem):
    """The lines of a PEM key that are its secret (base64 of the key)."""
    return [line for line in pem.splitlines() if line and not line.startswith("-----")]


class SecretCheckingProxy(Proxy):
    """A proxy run that, when it ends, fails the test if any secret the tests
    use appears in what the proxy wrote: its stdout and log lines, every
    Network Log file, its metrics and health answers, and the answers the
    proxy itself gave clients (client_saw(); https() reports each curl run,
    but not a body the origin wrote: an origin may echo what it was sent).

    `secrets` adds to SECRETS; the list is kept, not copied, so a test may add
    a value it learns while running (a JWT the origin received). The check
    runs whether or not the test passed; when both fail, both are reported."""

    def __init__(self, *args, secrets=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra_secrets = secrets if secrets is not None else []
        self.client_outputs = []

    def client_saw(self, what, data):
        self.client_outputs.append((what, data.decode(errors="replace") if isinstance(data, bytes) else data))

    def _read_stdout(self):
        # Proxy.stop() closes stdout unread: take the pipe first, read what the
        # proxy wrote after its ready line once it has exited.
        out = self.proc.stdout if self.proc else None
        if out is None:
            return ""
        self.proc.stdout = None
        if self.proc.poll() is None:
            self.stop()
        got = []
        t = threading.Thread(target=lambda: got.append(out.read()), daemon=True)
        t.start()
        t.join(5)
        if got:
            out.close()
        return (self.ready_line or "") + (got[0] if got else "")

    def __exit__(self, *exc):
        outputs = {}
        if self.proc and self.proc.poll() is None and getattr(self, "admin_port", None):
            for path in ("/metrics", "/healthz"):
                try:
                    outputs[path] = self.admin(path)
                except OSError as e:
                    outputs[path] = f"<unreachable: {e}>"
        outputs["stdout"] = self._read_stdout()
        self.stop()
        outputs["stderr"] = self.stderr()
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                if name.startswith("egress"):
                    outputs[name] = read(os.path.join(self.dir, name))
        for what, text in self.client_outputs:
            outputs[f"answer to the client ({what})"] = text
        leaks = sorted({where for where, text in outputs.items()
                        for secret in SECRETS + list(self.extra_secrets) if secret and secret in text})
        try:
            result = super().__exit__(*exc)
        except AssertionError as e:
            if not leaks:
                raise
            raise AssertionError(f"a secret leaked into the proxy's {', '.join(leaks)}; and: {e}") from e
        if leaks:
            failed = f"; the test itself failed too: {exc[0].__name__}: {exc[1]}" if exc[0] else ""
            raise AssertionError(f"a secret leaked into the proxy's {', '.join(leaks)}{failed}")
        return result


def iso(seconds):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Env:
    """A proxy with injection set up against TLS origins playing the providers."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.ca = TestCA(tmp)
        names = ["api.tracker.test", "api.query.test", "api.github.com", "api.other.test", "held.test",
                 "overlap.test", "build-only.test", "box.test"]
        cert, key = self.ca.issue(names)
        self.origin = Origin(cert, key).__enter__()
        self.origin.routes["/check-auth"] = self.check_auth
        self.host_env = os.path.join(tmp, "host.env")
        self.write_host_env({"FY_INJECT_TRACKER": REAL, "FY_INJECT_OTHER": OTHER_SECRET})
        self.tokens = os.path.join(tmp, "build-tokens.json")
        self.write_tokens({BUILD_SECRET: iso(3600)})
        self.counter = os.path.join(tmp, "mints")

    def check_auth(self, handler, body):
        # An origin that accepts only the real credential.
        auth = handler.headers.get("Authorization", "")
        ok = auth in (f"Bearer {REAL}", f"Bearer {ROTATED}", f"token {MINTED}")
        handler._send(200 if ok else 401, json.dumps({"ok": ok}).encode())

    def write_host_env(self, values):
        tmp = self.host_env + ".new"
        with open(tmp, "w") as f:
            for k, v in values.items():
                # A multi-line value (a PEM key) is written double-quoted.
                f.write(f'{k}="{v}"\n' if "\n" in v else f"{k}={v}\n")
        os.replace(tmp, self.host_env)

    def write_tokens(self, secrets):
        tokens = {hashlib.sha256(s.encode()).hexdigest(): exp for s, exp in secrets.items()}
        tmp = self.tokens + ".new"
        with open(tmp, "w") as f:
            json.dump({"tokens": tokens}, f)
        os.replace(tmp, self.tokens)

    def minter(self, name, body):
        """Writes a minter script; its invocations are counted in <counter>.<name>."""
        path = os.path.join(self.tmp, f"mint-{name}.py")
        with open(path, "w") as f:
            f.write("import json, os, sys, time\n")
            f.write(f"open({self.counter + '.' + name!r}, 'a').write('x')\n")
            f.write(body)
        return ["/usr/bin/python3", path]

    def mints(self, name):
        try:
            with open(f"{self.counter}.{name}") as f:
                return len(f.read())
        except FileNotFoundError:
            return 0

    def proxy(self, policy, args=(), secrets=None):
        o = self.origin.port
        hosts = ["api.tracker.test", "api.query.test", "api.github.com", "api.other.test", "held.test",
                 "overlap.test", "build-only.test", "box.test"]
        return SecretCheckingProxy(policy, upstream_ca=self.ca.cert_path, secrets=secrets,
                     args=["--host-env", self.host_env, "--build-tokens", self.tokens,
                           "--minter-timeout", "3"]
                     + [a for h in hosts for a in ("--connect-to", f"{h}:443=127.0.0.1:{o}")] + list(args))

    def close(self):
        self.origin.__exit__(None, None, None)


BASE_POLICY = '''mode = "enforce"
allow = ["box.test"]

[[inject]]
switch = "tracker"
host = "api.tracker.test"
value_prefix = "Bearer "
'''


def https(proxy, url, *args, timeout=20):
    """curl through the proxy. What the client got is reported to the proxy's
    secret check, except a body the origin wrote (it may echo what it was
    sent, and the origin is where the credential is meant to go)."""
    with tempfile.NamedTemporaryFile(prefix="fyheads-") as heads:
        r = curl(url, "-D", heads.name, *args, proxy=proxy.url, cacert=proxy.ca, timeout=timeout)
        with open(heads.name, "rb") as f:
            dumped = f.read()
    if hasattr(proxy, "client_saw"):
        proxy.client_saw(f"curl {url} stderr", r.stderr)
        # The last head curl saw is the final response's (after the CONNECT's and any 1xx).
        blocks = [b for b in dumped.split(b"\r\n\r\n") if b.startswith(b"HTTP/")]
        from_origin = bool(blocks) and b"\r\nserver: fytest-origin" in blocks[-1].lower()
        if not from_origin:
            proxy.client_saw(f"curl {url}", dumped + r.stdout)
    return r


def read_response(sock):
    """Reads one HTTP/1.1 response with a Content-Length body (or up to EOF)
    from a socket: (status, head bytes, body bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while length is None or len(body) < length:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        body += chunk
    return http_status(head), head, body


class Injection(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fyinject-")
        cls.env = Env(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def setUp(self):
        self.env.origin.requests.clear()

    def auth_headers(self, path):
        reqs = [r for r in self.env.origin.requests if r["path"].startswith(path)]
        self.assertTrue(reqs, f"nothing reached the origin at {path}")
        return [v for k, v in reqs[-1]["headers"] if k.lower() == "authorization"]

    def assert_no_secret_anywhere(self, proxy, extra=()):
        outputs = {"stderr": proxy.stderr(), "metrics": proxy.admin("/metrics"),
                   "healthz": proxy.admin("/healthz")}
        for name in os.listdir(proxy.dir):
            if name.startswith("egress"):
                outputs[name] = read(os.path.join(proxy.dir, name))
        for i, e in enumerate(extra):
            outputs[f"client output {i}"] = e.decode(errors="replace") if isinstance(e, bytes) else e
        for where, text in outputs.items():
            for secret in SECRETS:
                self.assertNotIn(secret, text, f"a secret leaked into {where}")

    def test_the_header_is_overwritten_and_the_dummy_never_reaches_the_origin(self):
        with self.env.proxy(BASE_POLICY) as p:
            r = https(p, "https://api.tracker.test/check-auth", "-H", "Authorization: Bearer dummy-from-the-box",
                      "-H", "authorization: Basic second-copy")
            self.assertEqual(json.loads(r.stdout), {"ok": True})
            self.assertEqual(self.auth_headers("/check-auth"), [f"Bearer {REAL}"])
            row = p.wait_rows(lambda x: x["path"] == "/check-auth")[-1]
            self.assertTrue(row["injected"])
            self.assertEqual(row["rule"], "tracker")
            self.assertEqual(row["tls"], "decrypted")
            self.assertFalse(row["replayed"])
            # The injector host needs no grant (HTTPS :443 only), never cleartext.
            out = raw_exchange(p.port, b"GET http://api.tracker.test/x HTTP/1.1\r\nHost: api.tracker.test\r\n\r\n")
            self.assertEqual(http_status(out), 403)
            self.assert_no_secret_anywhere(p, [r.stdout, r.stderr, out])

    def test_a_host_that_disagrees_with_the_destination_gets_no_credential(self):
        with self.env.proxy(BASE_POLICY) as p:
            r = https(p, "https://api.tracker.test/claim", "-H", "Host: api.other.test")
            self.assertIn(b"names a different host", r.stdout)
            self.assertFalse([q for q in self.env.origin.requests if q["path"] == "/claim"])
            # An SNI that disagrees with the CONNECT target: decrypted, never injected.
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(b"CONNECT api.tracker.test:443 HTTP/1.1\r\n\r\n")
            self.assertIn(b" 200 ", s.recv(100))
            t = ssl.create_default_context(cafile=p.ca).wrap_socket(s, server_hostname="box.test")
            t.sendall(b"GET /sni HTTP/1.1\r\nHost: api.tracker.test\r\nAuthorization: Bearer dummy\r\n"
                      b"Connection: close\r\n\r\n")
            resp = b""
            while True:
                chunk = t.recv(65536)
                if not chunk:
                    break
                resp += chunk
            t.close()
            self.assertEqual(self.auth_headers("/sni"), ["Bearer dummy"])

    def test_a_host_admitted_only_for_injection_gets_no_opaque_tunnel(self):
        with self.env.proxy(BASE_POLICY) as p:
            before = len(self.env.origin.requests)
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(b"CONNECT api.tracker.test:443 HTTP/1.1\r\n\r\n")
            self.assertIn(b" 200 ", s.recv(100))
            s.sendall(b"\x80\x2e\x01\x03\x01 not TLS the proxy can decrypt")
            s.settimeout(5)
            try:
                self.assertEqual(s.recv(100), b"")
            except ConnectionResetError:
                pass
            s.close()
            self.assertEqual(len(self.env.origin.requests), before)
            self.assertIn("admitted only for HTTPS the proxy decrypts", p.stderr())

    def test_query_param_injection_redacted_in_the_log_and_limited_to_its_prefix(self):
        policy = '''mode = "enforce"
[[inject]]
switch = "tracker"
host = "api.query.test"
path_prefix = "/api/"
query_param = "token"
'''
        with self.env.proxy(policy) as p:
            r = https(p, "https://api.query.test/api/items?token=dummy&x=1&%74oken=again")
            self.assertEqual(r.returncode, 0, r.stderr)
            req = [q for q in self.env.origin.requests if q["path"].startswith("/api/items")][-1]
            self.assertIn(f"token={REAL}", req["path"])
            self.assertNotIn("dummy", req["path"])
            self.assertNotIn("again", req["path"])
            self.assertIn("x=1", req["path"])
            row = p.wait_rows(lambda x: x["path"].startswith("/api/items"))[-1]
            self.assertIn("token=‹redacted›", row["path"])
            self.assertIn("%74oken=‹redacted›", row["path"])
            self.assertNotIn("dummy", row["path"])
            # Outside the prefix: not injected (the injector host itself is open over HTTPS).
            r = https(p, "https://api.query.test/other?token=dummy")
            self.assertEqual(json.loads(r.stdout)["path"], "/other?token=dummy")
            self.assert_no_secret_anywhere(p)

    def test_a_rule_added_by_reload_injects_without_a_new_process(self):
        with self.env.proxy('mode = "enforce"\nallow = ["api.other.test"]\n') as p:
            pid = p.proc.pid
            https(p, "https://api.other.test/before", "-H", "Authorization: Bearer dummy")
            self.assertEqual(self.auth_headers("/before"), ["Bearer dummy"])
            p.reload('mode = "enforce"\nallow = ["api.other.test"]\n[[inject]]\nswitch = "other"\n'
                     'host = "api.other.test"\nvalue_prefix = "Bearer "\n')
            https(p, "https://api.other.test/after", "-H", "Authorization: Bearer dummy")
            self.assertEqual(self.auth_headers("/after"), [f"Bearer {OTHER_SECRET}"])
            self.assertEqual(p.proc.pid, pid)

    def test_an_injector_host_beats_an_explicit_passthrough_listing(self):
        policy = BASE_POLICY.replace('allow = ["box.test"]\n',
                                     'allow = ["box.test"]\npassthrough = ["api.tracker.test", "box.test"]\n')
        with self.env.proxy(policy) as p:
            r = https(p, "https://api.tracker.test/check-auth", "-H", "Authorization: Bearer dummy-from-the-box")
            self.assertEqual(json.loads(r.stdout), {"ok": True}, r.stderr)  # decrypted, so injected
            self.assertEqual(self.auth_headers("/check-auth"), [f"Bearer {REAL}"])
            row = p.wait_rows(lambda x: x["path"] == "/check-auth")[-1]
            self.assertEqual(row["tls"], "decrypted")
            self.assertTrue(row["injected"])
            self.assertFalse([x for x in p.rows() if x.get("passthrough") and x["host"] == "api.tracker.test"])
            # The passthrough list itself is in force: box.test, with no rule, is tunnelled
            # (curl trusts only the origin's CA here, so only a blind tunnel works).
            r = curl("https://box.test/tunnelled", proxy=p.url, cacert=self.env.ca.cert_path)
            self.assertEqual(r.returncode, 0, r.stderr)
            p.wait_rows(lambda x: x.get("passthrough") and x["host"] == "box.test")

    def test_a_reload_that_adds_an_injector_rule_closes_the_host_s_blind_tunnel(self):
        v1 = 'mode = "enforce"\nallow = ["api.other.test"]\npassthrough = ["api.other.test"]\n'
        v2 = v1 + '[[inject]]\nswitch = "other"\nhost = "api.other.test"\nvalue_prefix = "Bearer "\n'
        with self.env.proxy(v1) as p:
            s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            s.sendall(b"CONNECT api.other.test:443 HTTP/1.1\r\nHost: api.other.test:443\r\n\r\n")
            self.assertIn(b" 200 ", s.recv(100))
            # The origin's own certificate: the tunnel is blind.
            t = ssl.create_default_context(cafile=self.env.ca.cert_path).wrap_socket(
                s, server_hostname="api.other.test")
            t.sendall(b"GET /in-the-tunnel HTTP/1.1\r\nHost: api.other.test\r\nAuthorization: Bearer dummy\r\n\r\n")
            status, _, _ = read_response(t)
            self.assertEqual(status, 200)
            self.assertEqual(self.auth_headers("/in-the-tunnel"), ["Bearer dummy"])
            closed_before = p.metric("fy_connections_closed_by_policy_total")
            p.reload(v2)
            t.settimeout(5)
            try:
                rest = t.recv(100)
            except (ConnectionResetError, ssl.SSLError):
                rest = b""
            self.assertEqual(rest, b"", "the tunnel was closed")
            t.close()
            self.assertEqual(p.metric("fy_connections_closed_by_policy_total"), closed_before + 1)
            row = p.wait_rows(lambda x: x.get("passthrough") and x["host"] == "api.other.test")[-1]
            self.assertIn("left passthrough", row.get("error", ""))
            # The host is now decrypted and injected.
            https(p, "https://api.other.test/after-the-tunnel", "-H", "Authorization: Bearer dummy")
            self.assertEqual(self.auth_headers("/after-the-tunnel"), [f"Bearer {OTHER_SECRET}"])
            row = p.wait_rows(lambda x: x["path"] == "/after-the-tunnel")[-1]
            self.assertEqual(row["tls"], "decrypted")

    def test_a_rotated_secret_drops_only_that_rule_s_token(self):
        cmd = json.dumps(self.env.minter("rot", f"print(json.dumps({{'value': {CMD_TOKEN!r}, 'ttl': 3600}}))\n"))
        policy = BASE_POLICY + f'''
[[inject]]
switch = "cmd"
kind = "command"
host = "api.other.test"
value_prefix = "Bearer "
command = {cmd}
'''
        try:
            with self.env.proxy(policy) as p:
                https(p, "https://api.other.test/c1")
                wait_until(lambda: self.env.mints("rot") == 1, what="the minter's warm-up")
                https(p, "https://api.tracker.test/check-auth")
                self.assertEqual(self.auth_headers("/check-auth"), [f"Bearer {REAL}"])
                self.env.write_host_env({"FY_INJECT_TRACKER": ROTATED, "FY_INJECT_OTHER": OTHER_SECRET})
                wait_until(lambda: (https(p, "https://api.tracker.test/check-auth"),
                                    self.auth_headers("/check-auth"))[1] == [f"Bearer {ROTATED}"],
                           what="the rotated secret")
                https(p, "https://api.other.test/c2")
                self.assertEqual(self.env.mints("rot"), 1, "the other rule's token was kept")
                self.assertEqual(self.auth_headers("/c2"), [f"Bearer {CMD_TOKEN}"])
        finally:
            self.env.write_host_env({"FY_INJECT_TRACKER": REAL, "FY_INJECT_OTHER": OTHER_SECRET})


class Minters(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fymint-")
        cls.env = Env(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def rule(self, name, body, extra=""):
        return f'''mode = "enforce"
[[inject]]
switch = "{name}"
kind = "command"
host = "api.other.test"
value_prefix = "Bearer "
command = {json.dumps(self.env.minter(name, body))}
{extra}'''

    def auth(self, path):
        reqs = [r for r in self.env.origin.requests if r["path"] == path]
        return [v for k, v in reqs[-1]["headers"] if k.lower() == "authorization"] if reqs else None

    def test_tokens_are_minted_ahead_cached_and_shared_by_concurrent_requests(self):
        with self.env.proxy(self.rule("ahead", f"time.sleep(1)\nprint(json.dumps({{'value': {V_AHEAD!r}, 'ttl': 3600}}))\n")) as p:
            wait_until(lambda: self.env.mints("ahead") == 1, what="the warm-up mint")
            results = []
            threads = [threading.Thread(target=lambda i=i: results.append(https(p, f"https://api.other.test/sf{i}")))
                       for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i in range(8):
                self.assertEqual(self.auth(f"/sf{i}"), [f"Bearer {V_AHEAD}"])
            self.assertEqual(self.env.mints("ahead"), 1, "one mint for all of them (single flight, cached)")

    def test_a_minter_sees_only_the_base_environment_and_its_declared_names(self):
        body = ("print(json.dumps({'value': 'other=' + str('FY_INJECT_OTHER' in os.environ) + "
                "',proc=' + str('FY_SECRET_PROC' in os.environ) + ',declared=' + os.environ.get('ORG', 'none') "
                "+ ',home=' + str('HOME' in os.environ), 'ttl': 60}))\n")
        env = dict(os.environ, FY_SECRET_PROC=OTHER_SECRET, ORG="acme")
        policy = self.rule("envcheck", body, 'env = ["ORG"]\n')
        p = self.env.proxy(policy)
        p.env = env
        with p:
            https(p, "https://api.other.test/env")
            self.assertEqual(self.auth("/env"), ["Bearer other=False,proc=False,declared=acme,home=True"])

    def test_a_failed_mint_is_answered_by_the_proxy_redacted_and_remembered(self):
        body = (f"sys.stderr.write('starting\\nfetching with key {FAILING_STDERR} failed\\n"
                f"second line\\nthird: denied\\n')\nprint({FAILING_STDOUT!r})\nsys.exit(3)\n")
        with self.env.proxy(self.rule("failing", body)) as p:
            wait_until(lambda: self.env.mints("failing") >= 1, what="the warm-up mint")
            r = https(p, "https://api.other.test/f1", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"502"), r.stdout)
            msg = json.loads(r.stdout.rsplit(b"\n", 1)[0])["message"]
            self.assertIn("foldyard could not mint a credential for api.other.test, so this request was not sent:", msg)
            self.assertIn("exit 3:", msg)
            self.assertIn("‹redacted›", msg)
            self.assertIn("third: denied", msg)
            self.assertNotIn("A" * 30, msg)
            self.assertNotIn("stdout-secret", msg)
            self.assertNotIn("mint-failing.py", msg)  # never the command
            self.assertNotIn("starting", msg)        # the last three lines only
            self.assertFalse([q for q in self.env.origin.requests if q["path"] == "/f1"])
            for i in range(3):
                https(p, f"https://api.other.test/f{i + 2}")
            self.assertEqual(self.env.mints("failing"), 1, "a failure is remembered, not re-run per request")
            row = p.wait_rows(lambda x: x["path"] == "/f1")[-1]
            self.assertTrue(row["mint_failed"])
            self.assertEqual(row["status"], 502)
            self.assertNotIn(" error ", p.stderr())  # a mint failure is a warning
            self.assertIn(" warn could not mint a credential for switch 'failing'", p.stderr())
            self.assertNotIn("A" * 30, p.stderr())

    def test_a_hung_minter_holds_up_only_its_own_rule(self):
        policy = self.rule("hung", "time.sleep(60)\n") + f'''
[[inject]]
switch = "tracker"
host = "api.tracker.test"
value_prefix = "Bearer "
'''
        with self.env.proxy(policy) as p:
            t0 = time.monotonic()
            r = https(p, "https://api.tracker.test/fast")
            self.assertLess(time.monotonic() - t0, 2)
            self.assertEqual(self.auth("/fast"), [f"Bearer {REAL}"])
            r = https(p, "https://api.other.test/hung", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"502"))
            self.assertIn(b"hung: no answer within 3 s", r.stdout)

    def test_a_rule_removed_during_its_mint_injects_nothing(self):
        slow = self.rule("slow", f"time.sleep(2)\nprint(json.dumps({{'value': {LATE!r}, 'ttl': 60}}))\n")
        # The warm-up mint is in flight when the request arrives; the rule is
        # removed (the host stays granted) before the mint ends.
        policy = slow.replace('mode = "enforce"', 'mode = "enforce"\nallow = ["api.other.test"]')
        with self.env.proxy(policy) as p:
            result = []
            t = threading.Thread(target=lambda: result.append(
                https(p, "https://api.other.test/removed", "-H", "Authorization: Bearer box-dummy")))
            t.start()
            time.sleep(0.5)
            p.reload('mode = "enforce"\nallow = ["api.other.test"]\n')
            t.join()
            self.assertEqual(self.auth("/removed"), ["Bearer box-dummy"])
            row = p.wait_rows(lambda x: x["path"] == "/removed")[-1]
            self.assertFalse(row["injected"])

    def test_a_credential_changed_during_its_mint_never_gets_the_old_token(self):
        # v1's minter is slow; the reload points the same switch at another
        # host with another minter: the new host must get the new token.
        old = self.env.minter("kc-old", f"time.sleep(3)\nprint(json.dumps({{'value': {OLD_RULE!r}, 'ttl': 3600}}))\n")
        new = self.env.minter("kc-new", f"print(json.dumps({{'value': {NEW_RULE!r}, 'ttl': 3600}}))\n")
        v1 = ('mode = "enforce"\n[[inject]]\nswitch = "kc"\nkind = "command"\nhost = "api.tracker.test"\n'
              f'value_prefix = "Bearer "\ncommand = {json.dumps(old)}\n')
        v2 = v1.replace("api.tracker.test", "api.other.test").replace(json.dumps(old), json.dumps(new))
        with self.env.proxy(v1, args=["--minter-timeout", "20"]) as p:
            time.sleep(0.5)  # the warm-up mint of v1 is running
            p.reload(v2)
            r = https(p, "https://api.other.test/after-reload")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(self.auth("/after-reload"), [f"Bearer {NEW_RULE}"])
            self.assertEqual(self.env.mints("kc-new"), 1)

    def test_an_error_body_of_an_injected_request_is_not_logged(self):
        def echo(handler, _body):
            handler._send(403, ("bad credentials: " + handler.headers.get("Authorization", "")).encode(),
                          "text/plain")
        self.env.origin.routes["/echo-auth"] = echo
        policy = self.rule("echo", f"print(json.dumps({{'value': {ECHOED!r}, 'ttl': 3600}}))\n")
        with self.env.proxy(policy) as p:
            r = https(p, "https://api.other.test/echo-auth")
            self.assertIn(b"bad credentials", r.stdout)  # the client gets the origin's answer
            row = p.wait_rows(lambda x: x["path"] == "/echo-auth")[-1]
            self.assertEqual(row["status"], 403)
            self.assertNotIn("error_body", row)
            self.assertNotIn(ECHOED, read(p.netlog))

    def test_a_slow_mint_does_not_count_against_the_exchange_timeout(self):
        # The mint (started ahead, at start) outlasts the 2 s exchange timeout
        # by far more than the proxy takes to start, so the request waits > 2 s.
        policy = self.rule("slowmint", f"time.sleep(7)\nprint(json.dumps({{'value': {SLOW!r}, 'ttl': 0}}))\n")
        with self.env.proxy(policy, args=["--io-timeout", "2", "--minter-timeout", "15"]) as p:
            t0 = time.monotonic()
            r = https(p, "https://api.other.test/late", "-w", "\n%{http_code}")
            waited = time.monotonic() - t0
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertGreater(waited, 2.0)  # it did wait past the exchange timeout
            self.assertEqual(self.auth("/late"), [f"Bearer {SLOW}"])

    def stale_then_fresh(self, name, extra="replay_on_401 = true\n"):
        """A command rule whose first mint (the warm-up) is STALE, every later one FRESH."""
        body = ("n = len(open(" + repr(self.env.counter + "." + name) + ").read())\n"
                f"print(json.dumps({{'value': {STALE!r} if n == 1 else {FRESH!r}, 'ttl': 3600}}))\n")
        return self.rule(name, body, extra)

    def fresh_only(self, path):
        """An origin route that accepts only FRESH; its 401 echoes what it was sent."""
        def check(handler, body):
            auth = handler.headers.get("Authorization", "")
            if auth != f"Bearer {FRESH}":
                return handler._send(401, json.dumps({"message": "Bad credentials", "seen": auth}).encode())
            handler._send(200, json.dumps({"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}).encode())
        self.env.origin.routes[path] = check

    def reached(self, path):
        return [q for q in self.env.origin.requests if q["path"] == path]

    def test_401_forces_one_re_mint_and_one_re_issue(self):
        self.fresh_only("/needs-fresh")
        with self.env.proxy(self.stale_then_fresh("replay")) as p:
            wait_until(lambda: self.env.mints("replay") == 1, what="the warm-up")
            r = https(p, "https://api.other.test/needs-fresh", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertNotIn(STALE.encode(), r.stdout, "the replaced 401 never reaches the client")
            self.assertEqual(self.env.mints("replay"), 2)
            seen = [dict(q["headers"]).get("Authorization") for q in self.reached("/needs-fresh")]
            self.assertEqual(seen, [f"Bearer {STALE}", f"Bearer {FRESH}"])
            row = p.wait_rows(lambda x: x["path"] == "/needs-fresh")[-1]
            self.assertTrue(row["replayed"])
            self.assertTrue(row["injected"])
            self.assertEqual(row["status"], 200)

    def replayed_post(self, name, path, body, *curl_args):
        """POSTs `body` once on a stale token; checks it was re-sent whole with
        a fresh one and returns the two requests the origin received."""
        self.fresh_only(path)
        data = os.path.join(self.tmp, f"{name}.body")
        with open(data, "wb") as f:
            f.write(body)
        with self.env.proxy(self.stale_then_fresh(name)) as p:
            wait_until(lambda: self.env.mints(name) == 1, what="the warm-up")
            r = https(p, f"https://api.other.test{path}", "--data-binary", f"@{data}", *curl_args,
                      "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"200"), (r.stdout[-300:], p.stderr()[-2000:]))
            answer = json.loads(r.stdout.rsplit(b"\n", 1)[0])
            self.assertEqual(answer, {"len": len(body), "sha256": hashlib.sha256(body).hexdigest()})
            self.assertNotIn(STALE.encode(), r.stdout, "the replaced 401 never reaches the client")
            self.assertEqual(self.env.mints(name), 2, "one re-mint")
            reqs = self.reached(path)
            self.assertEqual([dict(q["headers"]).get("Authorization") for q in reqs],
                             [f"Bearer {STALE}", f"Bearer {FRESH}"], "one re-issue, with the fresh token")
            for q in reqs:
                self.assertEqual(q["method"], "POST")
                self.assertEqual(q["body"], body, "the origin got the whole body both times")
            row = p.wait_rows(lambda x: x["path"] == path)[-1]
            self.assertTrue(row["replayed"])
            self.assertEqual(row["status"], 200)
            self.assertEqual(len([x for x in p.rows() if x["path"] == path]), 1, "one exchange, one row")
        return reqs

    def test_a_401_to_a_small_post_re_sends_its_body_with_a_fresh_token(self):
        # 200 kB with Content-Length: spans many reads, far under the 1 MiB bound.
        body = bytes(range(256)) * 800
        reqs = self.replayed_post("post-cl", "/post-cl", body, "-H", "Expect:")
        for q in reqs:
            self.assertEqual(self.env.origin.header(q, "Content-Length"), str(len(body)))

    def test_a_401_to_a_chunked_post_re_sends_the_same_chunked_body(self):
        body = b"chunked body line\n" * 3000
        reqs = self.replayed_post("post-chunked", "/post-chunked", body, "-H", "Transfer-Encoding: chunked",
                                  "-H", "Expect:")
        for q in reqs:
            self.assertEqual(self.env.origin.header(q, "Transfer-Encoding"), "chunked")
            self.assertIsNone(self.env.origin.header(q, "Content-Length"))

    def test_a_401_to_a_post_that_waited_for_100_continue_is_re_sent_without_the_expect(self):
        # The origin (Python's http.server) answers the Expect with 100 Continue,
        # reads the body, then refuses the stale token; the re-issue carries the
        # whole body at once, so it asks for no second 100 Continue.
        body = b"expect me " * 100
        first, again = self.replayed_post("post-expect", "/post-expect", body, "-H", "Expect: 100-continue")
        self.assertEqual(self.env.origin.header(first, "Expect"), "100-continue")
        self.assertIsNone(self.env.origin.header(again, "Expect"))

    def test_a_401_to_a_body_over_the_bound_is_handed_back_and_the_token_dropped(self):
        path = "/post-large"
        self.fresh_only(path)
        body = b"L" * (1024 * 1024 + 1)
        data = os.path.join(self.tmp, "large.body")
        with open(data, "wb") as f:
            f.write(body)
        with self.env.proxy(self.stale_then_fresh("large")) as p:
            wait_until(lambda: self.env.mints("large") == 1, what="the warm-up")
            r = https(p, f"https://api.other.test{path}", "--data-binary", f"@{data}", "-H", "Expect:",
                      "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"401"), r.stdout[-300:])
            reqs = self.reached(path)
            self.assertEqual(len(reqs), 1, "not re-issued")
            self.assertEqual(len(reqs[0]["body"]), len(body))
            self.assertIn("401 to a request whose body is over the 1 MiB replay bound", p.stderr())
            # The token was dropped: the next request mints anew and gets through.
            r = https(p, f"https://api.other.test{path}", "--data-binary", "small", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertEqual(self.env.mints("large"), 2)
            rows = p.wait_rows(lambda x: x["path"] == path, n=2)
            self.assertEqual([(x["status"], x["replayed"]) for x in rows], [(401, False), (200, False)])

    def test_a_401_on_a_streamed_upload_is_handed_back_and_the_token_dropped(self):
        # The origin answers 401 at the head, before the body is all there: a
        # body still arriving cannot be sent again, whatever its size.
        def early_401(handler, _body):  # /stall/...: the origin does not read the body
            handler._send(401, b'{"message": "Bad credentials"}')
        self.env.origin.routes["/stall/upload-check"] = early_401
        self.fresh_only("/upload-next")
        with self.env.proxy(self.stale_then_fresh("upload")) as p:
            wait_until(lambda: self.env.mints("upload") == 1, what="the warm-up")
            s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            s.sendall(b"CONNECT api.other.test:443 HTTP/1.1\r\nHost: api.other.test:443\r\n\r\n")
            self.assertIn(b" 200 ", s.recv(100))
            t = ssl.create_default_context(cafile=p.ca).wrap_socket(s, server_hostname="api.other.test")
            t.sendall(b"POST /stall/upload-check HTTP/1.1\r\nHost: api.other.test\r\n"
                      b"Content-Length: 100000\r\n\r\n" + b"u" * 1000)
            status, _, answer = read_response(t)
            t.close()
            self.assertEqual(status, 401)
            self.assertIn(b"Bad credentials", answer)
            self.assertEqual(len(self.reached("/stall/upload-check")), 1, "not re-issued")
            self.assertIn("401 to a request whose body is still arriving", p.stderr())
            r = https(p, "https://api.other.test/upload-next", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertEqual(self.env.mints("upload"), 2, "the next request minted anew")


class GithubApp(unittest.TestCase):
    def test_github_app_mints_an_installation_token_with_a_verified_jwt(self):
        tmp = tempfile.mkdtemp(prefix="fygh-")
        env = Env(tmp)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        pub = key.public_key()
        seen = {}
        # The key and every JWT signed with it are secrets too.
        secrets = pem_secrets(pem)

        def access_tokens(handler, body):
            auth = handler.headers.get("Authorization", "")
            jwt = auth.removeprefix("Bearer ")
            secrets.append(jwt)
            h, pl, sig = jwt.split(".")
            pad = lambda s: s + "=" * (-len(s) % 4)
            try:
                pub.verify(base64.urlsafe_b64decode(pad(sig)), f"{h}.{pl}".encode(), padding.PKCS1v15(),
                           hashes.SHA256())
                claims = json.loads(base64.urlsafe_b64decode(pad(pl)))
                seen.update(claims=claims, path=handler.path, body=json.loads(body or b"{}"))
                ok = claims["iss"] == "4242" and claims["exp"] - claims["iat"] <= 600
            except Exception as e:  # noqa: BLE001 - any failure is a refused JWT
                seen["error"] = repr(e)
                ok = False
            if not ok:
                return handler._send(401, b'{"message": "A JSON web token could not be decoded"}')
            handler._send(201, json.dumps({"token": MINTED, "expires_at": iso(3600)}).encode())
        env.origin.routes["/app/installations/"] = access_tokens
        env.write_host_env({"FY_INJECT_GH": pem})
        policy = '''mode = "enforce"
[[inject]]
switch = "gh"
kind = "github-app"
host = "api.github.com"
value_prefix = "token "
app_id = 4242
installation_id = 99
repositories = ["acme/widgets"]
'''
        try:
            with env.proxy(policy, secrets=secrets) as p:
                r = https(p, "https://api.github.com/check-auth", "-H", "Authorization: token box-dummy")
                self.assertEqual(json.loads(r.stdout), {"ok": True}, (seen, p.stderr()[-1500:]))
                self.assertEqual(seen["path"], "/app/installations/99/access_tokens")
                self.assertEqual(seen["body"], {"repositories": ["widgets"]})
                req = [q for q in env.origin.requests if q["path"] == "/check-auth"][-1]
                self.assertEqual(dict(req["headers"])["Authorization"], f"token {MINTED}")
                self.assertNotIn("PRIVATE KEY", p.stderr())
                self.assertNotIn(MINTED, p.stderr())
                # The row is written after the answer went: wait for it.
                p.wait_rows(lambda r: r.get("path") == "/check-auth")
                self.assertNotIn(MINTED, read(p.netlog))
            # A github-app rule is pinned to api.github.com.
            with env.proxy(policy.replace('host = "api.github.com"', 'host = "api.other.test"'),
                           secrets=secrets) as p:
                self.assertIn("pinned to api.github.com", p.stderr())
        finally:
            env.close()


class HeldOverlapBuild(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fyheld-")
        cls.env = Env(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def test_a_held_dummy_is_answered_by_the_proxy_and_nothing_else_is(self):
        policy = '''mode = "enforce"
allow = ["box.test"]
[[held]]
host = "held.test"
header = "x-api-key"
dummy = "sk-dummy"
axis = "tracker"
body = '{"error": {"type": "authentication_error", "message": "invalid x-api-key"}}'
[[held]]
host = "box.test"
header = "Authorization"
dummy = "bx-dummy"
any_scheme = true
axis = "box"
'''
        with self.env.proxy(policy) as p:
            r = https(p, "https://held.test/v1/messages", "-H", "x-api-key: sk-dummy", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"401"))
            self.assertIn(b"authentication_error", r.stdout)
            self.assertFalse([q for q in self.env.origin.requests if q["path"] == "/v1/messages"])
            row = p.wait_rows(lambda x: x["path"] == "/v1/messages")[-1]
            self.assertEqual(row["held"], "tracker")
            # Anything but the dummy goes on to the wall: held.test is not granted.
            r = https(p, "https://held.test/v1/messages", "-H", "x-api-key: sk-someone-elses")
            self.assertIn(b"refused by the foldyard allowlist", r.stdout)
            # Whatever scheme word comes before the dummy, when the entry says so.
            for scheme in ("Bearer", "token", "Basic"):
                r = https(p, "https://box.test/held", "-H", f"Authorization: {scheme} bx-dummy", "-w", "%{http_code}")
                self.assertTrue(r.stdout.endswith(b"401"), scheme)
            r = https(p, "https://box.test/not-held", "-H", "Authorization: Bearer someone-else")
            self.assertEqual(json.loads(r.stdout)["path"], "/not-held")

    def test_overlapping_rules_inject_nothing_and_answer_502(self):
        policy = '''mode = "enforce"
[[inject]]
switch = "wide"
host = "overlap.test"
value_prefix = "Bearer "
[[inject]]
switch = "narrow"
host = "overlap.test"
path_prefix = "/v1/"
value_prefix = "Bearer "
[[overlap]]
host = "api.other.test"
path_prefix = "/x/"
message = "the configured message"
'''
        with self.env.proxy(policy) as p:
            r = https(p, "https://overlap.test/v1/thing", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"502"), r.stdout)
            msg = json.loads(r.stdout.rsplit(b"\n", 1)[0])["message"]
            self.assertTrue(msg.startswith("foldyard did not send this request: the switches 'wide' and 'narrow'"))
            self.assertTrue(msg.endswith("(on your computer: the mode can't be changed from the box)"))
            self.assertFalse([q for q in self.env.origin.requests if q["path"] == "/v1/thing"])
            r = https(p, "https://api.other.test/x/y")
            self.assertIn(b"the configured message", r.stdout)
            row = p.wait_rows(lambda x: x["path"] == "/v1/thing")[-1]
            self.assertTrue(row["overlap"])

    def test_a_build_proves_itself_and_the_marker_opens_nothing(self):
        o = self.env.origin.port
        policy = f'''mode = "enforce"
allow = ["box.test"]
build_allow = ["build-only.test"]
'''
        with self.env.proxy(policy) as p:
            def connect(auth):
                hdr = f"Proxy-Authorization: Basic {base64.b64encode(auth.encode()).decode()}\r\n" if auth else ""
                return raw_exchange(p.port, f"CONNECT build-only.test:443 HTTP/1.1\r\n{hdr}\r\n".encode(),
                                    until=b"\r\n\r\n")
            self.assertEqual(http_status(connect(None)), 407)
            self.assertEqual(http_status(connect("fy-build:")), 403)            # the bare marker
            self.assertEqual(http_status(connect("fy-build:wrong")), 403)
            self.assertEqual(http_status(connect(f"fy-build:{BUILD_SECRET}")), 200)
            # Expired or revoked: nothing.
            self.env.write_tokens({BUILD_SECRET: iso(-10)})
            wait_until(lambda: http_status(connect(f"fy-build:{BUILD_SECRET}")) == 403, what="the expiry")
            self.env.write_tokens({BUILD_SECRET: iso(3600)})
            wait_until(lambda: http_status(connect(f"fy-build:{BUILD_SECRET}")) == 200, what="the new file")
            # The marker tunnels (no decryption) and never goes upstream.
            r = curl("https://box.test/built", proxy=f"http://fy-build:x@127.0.0.1:{p.port}",
                     cacert=self.env.ca.cert_path)
            self.assertEqual(r.returncode, 0, r.stderr)
            row = p.wait_rows(lambda x: x.get("passthrough") and x["host"] == "box.test")[-1]
            self.assertTrue(row["build"])
            names = [k.lower() for q in self.env.origin.requests for k, _ in q["headers"]]
            self.assertNotIn("proxy-authorization", names)
            self.assertNotIn(BUILD_SECRET, p.stderr())

    def test_git_over_https_with_a_407_challenge_and_a_build_secret(self):
        git_root = os.path.join(self.tmp, "repos")
        os.makedirs(git_root, exist_ok=True)
        self.env.origin.git_root = git_root
        src = os.path.join(self.tmp, "src")
        genv = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                    GIT_COMMITTER_EMAIL="t@t")
        subprocess.run(["git", "init", "-q", "-b", "main", src], check=True)
        with open(os.path.join(src, "f"), "w") as f:
            f.write("built\n")
        subprocess.run(["git", "-C", src, "add", "."], check=True)
        subprocess.run(["git", "-C", src, "commit", "-qm", "x"], check=True, env=genv)
        subprocess.run(["git", "clone", "-q", "--bare", src, os.path.join(git_root, "b.git")], check=True)
        policy = 'mode = "enforce"\nbuild_allow = ["build-only.test"]\n'
        with self.env.proxy(policy) as p:
            env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
            # The build's proxy URL carries its secret; git sends it only after a 407.
            env.update(HTTPS_PROXY=f"http://fy-build:{BUILD_SECRET}@127.0.0.1:{p.port}",
                       GIT_SSL_CAINFO=self.env.ca.cert_path, GIT_TERMINAL_PROMPT="0")
            dst = os.path.join(self.tmp, "dst")
            r = subprocess.run(["git", "clone", "-q", "https://build-only.test/git/b.git", dst], env=env,
                               capture_output=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(read(os.path.join(dst, "f")), "built\n")
            # The tunnel's row is written when it closes, after git is done.
            p.wait_rows(lambda x: x.get("passthrough") and x["host"] == "build-only.test")
            rows = p.rows()
            self.assertTrue(any(x["status"] == 407 for x in rows), rows)
            tunnel = [x for x in rows if x.get("passthrough") and x["host"] == "build-only.test"]
            self.assertTrue(tunnel and tunnel[-1]["build"])
            self.assertEqual(p.metric("fy_builds_total"), len(tunnel))
            self.assertNotIn(BUILD_SECRET, read(p.netlog) + p.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)

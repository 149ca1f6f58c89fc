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

REAL = "real-token-Zq8vN3kX1pW7rT5yB2mD"          # never in the box, never in a log
ROTATED = "rotated-token-Hf4Jg6Ls8Kd0Pq2Wn9Xc"
OTHER_SECRET = "other-secret-Ty7Ui9Op1As3Df5Gh8Jk"
BUILD_SECRET = "build-secret-Mn2Bv4Cx6Zl8Kj0Hg3Fd"
MINTED = "minted-token-Qa1Ws2Ed3Rf4Tg5Yh6Uj7"
SECRETS = [REAL, ROTATED, OTHER_SECRET, BUILD_SECRET, MINTED]


class SecretCheckingProxy(Proxy):
    """A proxy run that, when it ends, fails the test if any secret the tests
    use appears in what the proxy wrote: its log lines, every Network Log
    file, its metrics and health answers."""

    def __exit__(self, *exc):
        if exc[0] is None and self.proc and self.proc.poll() is None:
            outputs = {"metrics": self.admin("/metrics"), "healthz": self.admin("/healthz")}
            self.stop()
            outputs["stderr"] = self.stderr()
            for name in os.listdir(self.dir):
                if name.startswith("egress"):
                    outputs[name] = open(os.path.join(self.dir, name)).read()
            for where, text in outputs.items():
                for secret in SECRETS:
                    if secret in text:
                        super().__exit__(*exc)
                        raise AssertionError(f"a secret leaked into the proxy's {where}")
        return super().__exit__(*exc)


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
            return len(open(f"{self.counter}.{name}").read())
        except FileNotFoundError:
            return 0

    def proxy(self, policy, args=()):
        o = self.origin.port
        hosts = ["api.tracker.test", "api.query.test", "api.github.com", "api.other.test", "held.test",
                 "overlap.test", "build-only.test", "box.test"]
        return SecretCheckingProxy(policy, upstream_ca=self.ca.cert_path,
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
    return curl(url, *args, proxy=proxy.url, cacert=proxy.ca, timeout=timeout)


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
                outputs[name] = open(os.path.join(proxy.dir, name)).read()
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

    def test_a_rotated_secret_drops_only_that_rule_s_token(self):
        cmd = json.dumps(self.env.minter("rot", "print(json.dumps({'value': 'cmd-' + 'x' * 4, 'ttl': 3600}))\n"))
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
                self.assertEqual(self.auth_headers("/c2"), ["Bearer cmd-xxxx"])
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
        with self.env.proxy(self.rule("ahead", "time.sleep(1)\nprint(json.dumps({'value': 'v-ahead', 'ttl': 3600}))\n")) as p:
            wait_until(lambda: self.env.mints("ahead") == 1, what="the warm-up mint")
            results = []
            threads = [threading.Thread(target=lambda i=i: results.append(https(p, f"https://api.other.test/sf{i}")))
                       for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i in range(8):
                self.assertEqual(self.auth(f"/sf{i}"), ["Bearer v-ahead"])
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
        body = ("sys.stderr.write('starting\\nfetching with key sk_live_' + 'A' * 30 + ' failed\\n"
                "second line\\nthird: denied\\n')\nprint('stdout-secret-" + "B" * 25 + "')\nsys.exit(3)\n")
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
        slow = self.rule("slow", "time.sleep(2)\nprint(json.dumps({'value': 'late', 'ttl': 60}))\n")
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
        old = self.env.minter("kc-old", "time.sleep(3)\nprint(json.dumps({'value': 'TOKEN-FOR-THE-OLD-RULE', 'ttl': 3600}))\n")
        new = self.env.minter("kc-new", "print(json.dumps({'value': 'token-for-the-new-rule', 'ttl': 3600}))\n")
        v1 = ('mode = "enforce"\n[[inject]]\nswitch = "kc"\nkind = "command"\nhost = "api.tracker.test"\n'
              f'value_prefix = "Bearer "\ncommand = {json.dumps(old)}\n')
        v2 = v1.replace("api.tracker.test", "api.other.test").replace(json.dumps(old), json.dumps(new))
        with self.env.proxy(v1, args=["--minter-timeout", "20"]) as p:
            time.sleep(0.5)  # the warm-up mint of v1 is running
            p.reload(v2)
            r = https(p, "https://api.other.test/after-reload")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(self.auth("/after-reload"), ["Bearer token-for-the-new-rule"])
            self.assertEqual(self.env.mints("kc-new"), 1)

    def test_an_error_body_of_an_injected_request_is_not_logged(self):
        def echo(handler, _body):
            handler._send(403, ("bad credentials: " + handler.headers.get("Authorization", "")).encode(),
                          "text/plain")
        self.env.origin.routes["/echo-auth"] = echo
        policy = self.rule("echo", "print(json.dumps({'value': 'echoed-secret-" + "Z" * 24 + "', 'ttl': 3600}))\n")
        with self.env.proxy(policy) as p:
            r = https(p, "https://api.other.test/echo-auth")
            self.assertIn(b"bad credentials", r.stdout)  # the client gets the origin's answer
            row = p.wait_rows(lambda x: x["path"] == "/echo-auth")[-1]
            self.assertEqual(row["status"], 403)
            self.assertNotIn("error_body", row)
            self.assertNotIn("Z" * 24, open(p.netlog).read())

    def test_a_slow_mint_does_not_count_against_the_exchange_timeout(self):
        # The mint (started ahead, at start) outlasts the 2 s exchange timeout
        # by far more than the proxy takes to start, so the request waits > 2 s.
        policy = self.rule("slowmint", "time.sleep(4.5)\nprint(json.dumps({'value': 'slow', 'ttl': 0}))\n")
        with self.env.proxy(policy, args=["--io-timeout", "2", "--minter-timeout", "10"]) as p:
            t0 = time.monotonic()
            r = https(p, "https://api.other.test/late", "-w", "\n%{http_code}")
            waited = time.monotonic() - t0
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertGreater(waited, 2.0)  # it did wait past the exchange timeout
            self.assertEqual(self.auth("/late"), ["Bearer slow"])

    def test_401_forces_one_re_mint_and_one_re_issue(self):
        body = ("n = len(open(" + repr(self.env.counter + ".replay") + ").read())\n"
                "print(json.dumps({'value': 'stale' if n == 1 else 'fresh', 'ttl': 3600}))\n")
        policy = self.rule("replay", body, "replay_on_401 = true\n")

        def check(handler, _body):
            ok = handler.headers.get("Authorization") == "Bearer fresh"
            handler._send(200 if ok else 401, b'{"seen": "%s"}' % handler.headers.get("Authorization", "").encode())
        self.env.origin.routes["/needs-fresh"] = check
        with self.env.proxy(policy) as p:
            wait_until(lambda: self.env.mints("replay") == 1, what="the warm-up")
            r = https(p, "https://api.other.test/needs-fresh", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"200"), r.stdout)
            self.assertEqual(self.env.mints("replay"), 2)
            seen = [dict(q["headers"]).get("Authorization") for q in self.env.origin.requests
                    if q["path"] == "/needs-fresh"]
            self.assertEqual(seen, ["Bearer stale", "Bearer fresh"])
            row = p.wait_rows(lambda x: x["path"] == "/needs-fresh")[-1]
            self.assertTrue(row["replayed"])
            self.assertTrue(row["injected"])
            self.assertEqual(row["status"], 200)

    def test_a_401_on_a_streamed_upload_is_handed_back_and_the_token_dropped(self):
        body = ("n = len(open(" + repr(self.env.counter + ".upload") + ").read())\n"
                "print(json.dumps({'value': 'stale' if n == 1 else 'fresh', 'ttl': 3600}))\n")
        policy = self.rule("upload", body, "replay_on_401 = true\n")

        def check(handler, _body):
            ok = handler.headers.get("Authorization") == "Bearer fresh"
            handler._send(200 if ok else 401, b"{}")
        self.env.origin.routes["/upload-check"] = check
        with self.env.proxy(policy) as p:
            wait_until(lambda: self.env.mints("upload") == 1, what="the warm-up")
            r = https(p, "https://api.other.test/upload-check", "--data-binary", "some body", "-w", "\n%{http_code}")
            self.assertTrue(r.stdout.endswith(b"401"), r.stdout)
            wait_until(lambda: (https(p, "https://api.other.test/upload-check", "-w", "%{http_code}").stdout
                                .endswith(b"200")), what="a fresh token on the next request")
            self.assertEqual(self.env.mints("upload"), 2)


class GithubApp(unittest.TestCase):
    def test_github_app_mints_an_installation_token_with_a_verified_jwt(self):
        tmp = tempfile.mkdtemp(prefix="fygh-")
        env = Env(tmp)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        pub = key.public_key()
        seen = {}

        def access_tokens(handler, body):
            auth = handler.headers.get("Authorization", "")
            jwt = auth.removeprefix("Bearer ")
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
            with env.proxy(policy) as p:
                r = https(p, "https://api.github.com/check-auth", "-H", "Authorization: token box-dummy")
                self.assertEqual(json.loads(r.stdout), {"ok": True}, (seen, p.stderr()[-1500:]))
                self.assertEqual(seen["path"], "/app/installations/99/access_tokens")
                self.assertEqual(seen["body"], {"repositories": ["widgets"]})
                req = [q for q in env.origin.requests if q["path"] == "/check-auth"][-1]
                self.assertEqual(dict(req["headers"])["Authorization"], f"token {MINTED}")
                self.assertNotIn("PRIVATE KEY", p.stderr())
                self.assertNotIn(MINTED, p.stderr())
                self.assertNotIn(MINTED, open(p.netlog).read())
            # A github-app rule is pinned to api.github.com.
            with env.proxy(policy.replace('host = "api.github.com"', 'host = "api.other.test"')) as p:
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
        open(os.path.join(src, "f"), "w").write("built\n")
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
            self.assertEqual(open(os.path.join(dst, "f")).read(), "built\n")
            rows = p.rows()
            self.assertTrue(any(x["status"] == 407 for x in rows), rows)
            tunnel = [x for x in rows if x.get("passthrough") and x["host"] == "build-only.test"]
            self.assertTrue(tunnel and tunnel[-1]["build"])
            self.assertEqual(p.metric("fy_builds_total"), len(tunnel))
            self.assertNotIn(BUILD_SECRET, open(p.netlog).read() + p.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)

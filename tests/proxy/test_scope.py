"""Credential scope through the real fy-proxy (issue 17, ADR-0034 step 6):
with [scope] mode = "on", a credential goes only to the principals the policy
names (by default the box: the VM user's stamps, and what [scope] box lists),
a sibling container's identical request is answered 401 in the provider's
shape, an unattributed connection gets none, grants can be scoped the same
way, and each case is a Network Log row naming who asked. Without a stamp key
(nothing attributed: the podman backend) nothing is scoped, and the proxy says
so at start and in /healthz. Stamps are made with Python's HMAC
(test_stamp.stamp), the providers are test_inject's TLS origins."""

import json
import os
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_inject import REAL, SLOW, Env, https  # noqa: E402
from test_stamp import KEY, stamp  # noqa: E402
from fytest import wait_until  # noqa: E402

SIBLING = "container:" + "5" * 64
REFUSED = '{"ok":false,"error":{"type":"authentication_error","message":"invalid token"}}'

SCOPED = f'''mode = "enforce"

[scope]
mode = "on"
box = ["user", "net:podman1/10.89.1.2"]

[[inject]]
switch = "tracker"
host = "api.tracker.test"
value_prefix = "Bearer "
refused_body = '{REFUSED}'

[[grant]]
host = "box.test"
principals = ["{SIBLING}"]
'''


class Scope(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fy17scope-")
        cls.env = Env(cls.tmp)
        cls.key_file = os.path.join(cls.tmp, "forwarder.key")
        with open(cls.key_file, "w") as f:
            f.write(KEY.hex() + "\n")
        os.chmod(cls.key_file, 0o600)
        cls.seq = 1000

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def setUp(self):
        self.env.origin.requests.clear()

    def stamped(self, **fields):
        type(self).seq += 1
        return ["--proxy-header", "Fy-Stamp: " + stamp(seq=self.seq, **fields)]

    def proxy(self, policy, stamp_key=True, args=()):
        return self.env.proxy(policy, args=(["--stamp-key", self.key_file] if stamp_key else []) + list(args))

    def call(self, p, path, stamp_args=(), url="https://api.tracker.test"):
        """curl with the box's dummy; (status, body, the Authorization the origin saw or None)."""
        r = https(p, url + path, "-w", "\n%{http_code}", "-H", "Authorization: Bearer dummy-in-the-box",
                  *stamp_args)
        body, _, code = r.stdout.rpartition(b"\n")
        reqs = [q for q in self.env.origin.requests if q["path"] == path]
        auth = [v for k, v in reqs[-1]["headers"] if k.lower() == "authorization"] if reqs else None
        return int(code), body, auth

    def row(self, p, path):
        return p.wait_rows(lambda r: r["path"] == path)[-1]

    def test_on_the_box_gets_the_credential_a_sibling_and_the_unattributed_do_not(self):
        with self.proxy(SCOPED) as p:
            # The box: the VM user's stamp (the VM listener), and its bridge address.
            status, body, auth = self.call(p, "/check-auth?box-user",
                                           self.stamped(src="127.0.0.1", net="host", who="user"))
            self.assertEqual((status, json.loads(body)), (200, {"ok": True}))
            self.assertEqual(auth, [f"Bearer {REAL}"])
            row = self.row(p, "/check-auth?box-user")
            self.assertEqual((row["who"], row["injected"], row["rule"]), ("user", True, "tracker"))
            self.assertNotIn("scoped", row)

            status, body, auth = self.call(p, "/check-auth?box-bridge",
                                           self.stamped(src="10.89.1.2", net="podman1"))
            self.assertEqual((status, auth), (200, [f"Bearer {REAL}"]))
            row = self.row(p, "/check-auth?box-bridge")
            self.assertEqual((row["src"], row["net"], row["injected"]), ("10.89.1.2", "podman1", True))

            # A sibling container, the identical request: the provider-shaped 401, nothing upstream.
            status, body, auth = self.call(p, "/check-auth?sibling",
                                           self.stamped(src="127.0.0.1", net="host", who=SIBLING))
            self.assertEqual((status, body.decode()), (401, REFUSED))
            self.assertIsNone(auth, "the sibling's request reached the origin")
            row = self.row(p, "/check-auth?sibling")
            self.assertEqual((row["who"], row["status"], row["scoped"], row["injected"]),
                             (SIBLING, 401, "tracker", False))

            # Another address on the box's network is not the box.
            status, body, auth = self.call(p, "/check-auth?neighbour",
                                           self.stamped(src="10.89.1.3", net="podman1"))
            self.assertEqual((status, auth), (401, None))
            row = self.row(p, "/check-auth?neighbour")
            self.assertEqual((row["src"], row["scoped"]), ("10.89.1.3", "tracker"))

            # No stamp: unattributed, no credential.
            status, body, auth = self.call(p, "/check-auth?unattributed")
            self.assertEqual((status, body.decode(), auth), (401, REFUSED, None))
            row = self.row(p, "/check-auth?unattributed")
            self.assertTrue(row["unattributed"])
            self.assertEqual((row["scoped"], row["status"]), ("tracker", 401))
            self.assertNotIn("who", row)

            self.assertEqual(p.metric("fy_scoped_out_total"), 3)
            self.assertEqual(p.metric("fy_injected_total"), 2)
            health = p.admin("/healthz")
            self.assertIn("scope: on: credentials to box (box = user, net:podman1/10.89.1.2) · 1 "
                          "scoped grant; unattributed connections get no credential", health)
            self.assertIn("scope: on: credentials to box", p.stderr())
            err = p.stderr()
            for who in (SIBLING, "net:podman1/10.89.1.3", "unattributed"):
                self.assertIn(f"401: switch 'tracker' is not for {who} ([scope])", err)

    def test_on_a_grant_scoped_to_a_container_is_that_containers_alone(self):
        with self.proxy(SCOPED) as p:
            status, _, _ = self.call(p, "/granted?sibling",
                                     self.stamped(src="127.0.0.1", net="host", who=SIBLING),
                                     url="https://box.test")
            self.assertEqual(status, 200)
            status, body, auth = self.call(p, "/granted?user",
                                           self.stamped(src="127.0.0.1", net="host", who="user"),
                                           url="https://box.test")
            self.assertIsNone(auth)
            row = self.row(p, "/granted?sibling")
            self.assertEqual((row["who"], row["status"]), (SIBLING, 200))
            refused = p.wait_rows(lambda r: r.get("who") == "user" and r["host"] == "box.test")[-1]
            self.assertEqual((refused["method"], refused["status"], refused["blocked"]),
                             ("CONNECT", 403, True))

    def test_on_without_a_stamp_key_nothing_is_scoped_and_the_proxy_says_so(self):
        with self.proxy(SCOPED, stamp_key=False) as p:
            status, body, auth = self.call(p, "/check-auth?nokey",
                                           self.stamped(src="127.0.0.1", net="host", who=SIBLING))
            self.assertEqual((status, auth), (200, [f"Bearer {REAL}"]))
            row = self.row(p, "/check-auth?nokey")
            self.assertTrue(row["injected"])
            self.assertNotIn("scoped", row)
            self.assertNotIn("who", row)
            said = "on in the policy, but nothing is attributed (no --stamp-key"
            self.assertIn("scope: " + said, p.admin("/healthz"))
            self.assertIn("scope: " + said, p.stderr())
            # The scoped grant is everyone's too.
            status, _, _ = self.call(p, "/granted?nokey", url="https://box.test")
            self.assertEqual(status, 200)

    def test_off_a_sibling_and_the_unattributed_get_the_credential_as_before(self):
        off = SCOPED.replace('mode = "on"', 'mode = "off"')
        with self.proxy(off) as p:
            status, _, auth = self.call(p, "/check-auth?off-sibling",
                                        self.stamped(src="127.0.0.1", net="host", who=SIBLING))
            self.assertEqual((status, auth), (200, [f"Bearer {REAL}"]))
            status, _, auth = self.call(p, "/check-auth?off-none")
            self.assertEqual((status, auth), (200, [f"Bearer {REAL}"]))
            self.assertEqual(self.row(p, "/check-auth?off-sibling")["who"], SIBLING)
            self.assertIn("scope: off", p.admin("/healthz"))
            # Principals in a policy whose scope is off are warned about.
            self.assertIn("principals are not applied", p.stderr())

    def test_a_reload_turns_scope_on_for_the_next_request(self):
        off = SCOPED.replace('mode = "on"', 'mode = "off"')
        with self.proxy(off) as p:
            sib = self.stamped(src="127.0.0.1", net="host", who=SIBLING)
            self.assertEqual(self.call(p, "/check-auth?before", sib)[0], 200)
            mark = len(p.stderr())
            p.reload(SCOPED)
            self.assertEqual(self.call(p, "/check-auth?after",
                                       self.stamped(src="127.0.0.1", net="host", who=SIBLING))[0], 401)
            # Said once, at the reload that changed it: the file watch and the
            # SIGHUP may each reload (the second changes nothing, says nothing).
            said = p.stderr()[mark:]
            self.assertIn("policy reloaded", said)
            self.assertEqual(said.count("scope: on: credentials to box"), 1, said)

    def test_a_scope_that_changes_while_a_credential_is_minted_applies_when_it_is_ready(self):
        minter = self.env.minter("scopeslow", f"time.sleep(4)\nprint(json.dumps({{'value': {SLOW!r}, 'ttl': 3600}}))\n")
        rule = f'''
[[inject]]
switch = "scopeslow"
kind = "command"
host = "api.other.test"
value_prefix = "Bearer "
command = {json.dumps(minter)}
'''
        off = 'mode = "enforce"\n[scope]\nmode = "off"\n' + rule
        on = 'mode = "enforce"\n[scope]\nmode = "on"\n' + rule
        with self.proxy(off, args=["--minter-timeout", "15"]) as p:
            got = {}
            sib = self.stamped(src="127.0.0.1", net="host", who=SIBLING)
            t = threading.Thread(target=lambda: got.update(
                r=self.call(p, "/minted?sibling", sib, url="https://api.other.test")))
            t0 = time.monotonic()
            t.start()
            # The request is held for the credential (minted ahead, 4 s) ...
            # (two heads: the CONNECT, and the request inside it)
            wait_until(lambda: p.metric("fy_request_heads_total") >= 2 or None,
                       what="the held request", timeout=3)
            p.reload(on)  # ... when the scope goes on; the rule's spec is unchanged
            t.join(20)
            status, body, auth = got["r"]
            self.assertGreater(time.monotonic() - t0, 3.0, "the request did not wait for the mint")
            self.assertEqual((status, auth), (401, None))
            self.assertIn(b"is not for " + SIBLING.encode(), body)
            row = self.row(p, "/minted?sibling")
            self.assertEqual((row["scoped"], row["injected"], row["who"]), ("scopeslow", False, SIBLING))
            self.assertNotIn("rule", row)
            self.assertIn("scope changed while its credential was minted", p.stderr())


if __name__ == "__main__":
    unittest.main()

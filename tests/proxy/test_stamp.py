"""fy-proxy's side of ADR-0034: it verifies a forwarder stamp on a connection's
first head and binds it to the connection. Stamps are made here with Python's
own HMAC (an implementation independent of core/stamp.cc), following
docs/stamp.md; the end-to-end run with the real forwarder is in
tests/forwarder/test_proxy_e2e.py."""

import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import ssl
import tempfile
import unittest
import uuid

from fytest import Origin, Proxy, TestCA, curl, http_status, raw_exchange, wait_until

KEY = bytes(range(32))
BOOT = str(uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"))


def stamp(src="10.89.1.2", net="podman1", seq=1, boot=BOOT, who=None, key=KEY):
    value = f"v=1;src={src};net={net}"
    if who:
        value += f";who={who}"
    value += f";seq={seq};boot={boot}"
    mac = hmac.new(key, b"fy-stamp\n" + value.encode(), hashlib.sha256).hexdigest()
    return f"{value};mac={mac}"


class Stamps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fystamp-")
        cls.key_file = os.path.join(cls.tmp, "forwarder.key")
        with open(cls.key_file, "w") as f:
            f.write(KEY.hex() + "\n")
        os.chmod(cls.key_file, 0o600)
        cls.ca = TestCA(cls.tmp)
        cert, key = cls.ca.issue(["secure.test", "pt.test"])
        cls.tls = Origin(cert, key).__enter__()
        cls.plain = Origin().__enter__()
        cls.seq = 100

    @classmethod
    def tearDownClass(cls):
        cls.tls.__exit__(None, None, None)
        cls.plain.__exit__(None, None, None)

    def next_seq(self):
        type(self).seq += 1
        return self.seq

    def proxy(self, extra_policy="", key_file=None, stamp_key=True):
        t, o = self.tls.port, self.plain.port
        policy = (f'mode = "enforce"\nallow = ["plain.test:{o}", "secure.test:{t}", "pt.test:{t}"]\n'
                  f'passthrough = ["pt.test"]\nbuild_allow = ["build.test:{o}"]\n' + extra_policy)
        args = ["--stamp-key", key_file or self.key_file] if stamp_key else []
        return Proxy(policy, resolve=[("plain.test", "127.0.0.1"), ("secure.test", "127.0.0.1"),
                                      ("pt.test", "127.0.0.1"), ("build.test", "127.0.0.1")],
                     upstream_ca=self.ca.cert_path, args=args)

    def write_key(self, path, text, mode=0o600):
        """Replaces a key file the way a rotation does: a new file renamed over."""
        tmp = path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def hup(self, p):
        """SIGHUP, and waits until the proxy has reloaded (the policy is unchanged)."""
        before = p.metric("fy_policy_reloads_total") + p.metric("fy_policy_reload_failures_total")
        p.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: p.metric("fy_policy_reloads_total") + p.metric("fy_policy_reload_failures_total")
                   > before, what="the reload")

    def get(self, p, path, headers=(), host=None):
        host = host or f"plain.test:{self.plain.port}"
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
        return raw_exchange(p.port, f"GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\n{lines}"
                                    f"Connection: close\r\n\r\n".encode())

    def row(self, p, path):
        return p.wait_rows(lambda r: r["path"] == path)[-1]

    def test_a_valid_stamp_is_bound_and_never_forwarded(self):
        with self.proxy() as p:
            seq = self.next_seq()
            out = self.get(p, "/ok", [("Fy-Stamp", stamp(seq=seq, who="container:" + "a" * 64))])
            self.assertEqual(http_status(out), 200)
            row = self.row(p, "/ok")
            self.assertEqual((row["src"], row["net"], row["seq"], row["boot"]), ("10.89.1.2", "podman1", seq, BOOT))
            self.assertEqual(row["who"], "container:" + "a" * 64)
            self.assertNotIn("unattributed", row)
            names = [k.lower() for k, _ in self.plain.requests[-1]["headers"]]
            self.assertNotIn("fy-stamp", names)

    def test_forged_replayed_doubled_or_missing_stamps_are_unattributed(self):
        with self.proxy() as p:
            seq = self.next_seq()
            good = stamp(seq=seq)
            self.assertEqual(http_status(self.get(p, "/first", [("Fy-Stamp", good)])), 200)
            cases = {
                "/replayed": [("Fy-Stamp", good)],                               # another connection
                "/forged": [("Fy-Stamp", stamp(seq=self.next_seq(), key=b"x" * 32))],
                "/tampered": [("Fy-Stamp", good.replace("10.89.1.2", "10.89.1.3"))],
                "/doubled": [("Fy-Stamp", stamp(seq=self.next_seq())), ("fy-stamp", stamp(seq=self.next_seq()))],
                "/none": [],
                "/garbage": [("FY-STAMP", "v=1;src=1.2.3.4")],
            }
            for path, headers in cases.items():
                self.assertEqual(http_status(self.get(p, path, headers)), 200, path)  # refused: nothing
                row = self.row(p, path)
                self.assertTrue(row.get("unattributed"), path)
                self.assertNotIn("src", row, path)
            self.assertEqual(p.metric("fy_stamps_replayed_total"), 1)
            self.assertGreaterEqual(p.metric("fy_stamps_invalid_total"), 4)
            for req in self.plain.requests:
                self.assertNotIn("fy-stamp", [k.lower() for k, _ in req["headers"]])

    def test_every_later_request_on_the_connection_inherits_the_stamp(self):
        with self.proxy() as p:
            seq = self.next_seq()
            o = self.plain.port
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            host = f"plain.test:{o}"
            s.sendall(f"GET http://{host}/k1 HTTP/1.1\r\nHost: {host}\r\nFy-Stamp: {stamp(seq=seq)}\r\n\r\n"
                      f"GET http://{host}/k2 HTTP/1.1\r\nHost: {host}\r\nFy-Stamp: {stamp(src='10.9.9.9', seq=self.next_seq())}\r\n\r\n"
                      f"GET http://{host}/k3 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while data.count(b"HTTP/1.1 200") < 3:
                data += s.recv(65536)
            s.close()
            for path in ("/k1", "/k2", "/k3"):
                row = self.row(p, path)
                self.assertEqual((row["src"], row["seq"]), ("10.89.1.2", seq), path)
            # A later head's stamp is stripped, not honoured, and never forwarded.
            for req in self.plain.requests[-3:]:
                self.assertNotIn("fy-stamp", [k.lower() for k, _ in req["headers"]])

    def test_requests_decrypted_inside_a_connect_and_tunnel_rows_inherit_it(self):
        with self.proxy() as p:
            t = self.tls.port
            seq = self.next_seq()
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(f"CONNECT secure.test:{t} HTTP/1.1\r\nFy-Stamp: {stamp(seq=seq, src='10.89.2.7')}\r\n\r\n".encode())
            self.assertIn(b" 200 ", s.recv(100))
            tls = ssl.create_default_context(cafile=p.ca).wrap_socket(s, server_hostname="secure.test")
            tls.sendall(f"GET /inner HTTP/1.1\r\nHost: secure.test:{t}\r\nFy-Stamp: {stamp(seq=self.next_seq())}\r\n"
                        "Connection: close\r\n\r\n".encode())
            while tls.recv(65536):
                pass
            tls.close()
            row = self.row(p, "/inner")
            self.assertEqual((row["src"], row["seq"], row["tls"]), ("10.89.2.7", seq, "decrypted"))
            self.assertNotIn("fy-stamp", [k.lower() for k, _ in self.tls.requests[-1]["headers"]])
            # A passthrough tunnel's one row carries it too.
            seq2 = self.next_seq()
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(f"CONNECT pt.test:{t} HTTP/1.1\r\nFy-Stamp: {stamp(seq=seq2, src='10.89.3.3')}\r\n\r\n".encode())
            self.assertIn(b" 200 ", s.recv(100))
            tls = ssl.create_default_context(cafile=self.ca.cert_path).wrap_socket(s, server_hostname="pt.test")
            tls.sendall(f"GET /pt HTTP/1.1\r\nHost: pt.test:{t}\r\nConnection: close\r\n\r\n".encode())
            while tls.recv(65536):
                pass
            tls.close()
            row = p.wait_rows(lambda r: r.get("passthrough") and r["host"] == f"pt.test:{t}")[-1]
            self.assertEqual((row["src"], row["seq"]), ("10.89.3.3", seq2))

    def test_a_407_retry_on_the_same_connection_inherits_the_stamp(self):
        with self.proxy() as p:
            o = self.plain.port
            seq = self.next_seq()
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            host = f"build.test:{o}"
            s.sendall(f"GET http://{host}/b HTTP/1.1\r\nHost: {host}\r\nFy-Stamp: {stamp(seq=seq)}\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            self.assertEqual(http_status(data), 407)
            auth = base64.b64encode(b"fy-build:unknown").decode()
            s.sendall(f"GET http://{host}/b2 HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Basic {auth}\r\n"
                      "Connection: close\r\n\r\n".encode())
            s.settimeout(5)
            while s.recv(65536):
                pass
            s.close()
            rows = [r for r in p.wait_rows(lambda r: r["path"] in ("/b", "/b2"), n=2)]
            self.assertEqual([r["status"] for r in rows], [407, 403])  # an unknown secret opens nothing
            self.assertTrue(all(r["seq"] == seq for r in rows))

    def test_attribution_require_refuses_what_is_unattributed(self):
        with self.proxy('attribution = "require"\n') as p:
            out = self.get(p, "/unstamped")
            self.assertEqual(http_status(out), 403)
            self.assertIn(b"no valid stamp from the forwarder", out)
            self.assertEqual(http_status(self.get(p, "/stamped", [("Fy-Stamp", stamp(seq=self.next_seq()))])), 200)
        with self.proxy() as p:
            # Turning it on live closes the unattributed connections.
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            host = f"plain.test:{self.plain.port}"
            s.sendall(f"GET http://{host}/open HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while not data.endswith(b"}"):  # the whole response (its JSON body ends it)
                data += s.recv(65536)
            self.assertIn(b"200", data)
            p.reload(open(p.policy_path).read() + 'attribution = "require"\n')
            s.settimeout(5)
            self.assertEqual(s.recv(100), b"")
            s.close()

    def test_a_rotated_key_is_read_again_on_sighup(self):
        key_file = os.path.join(self.tmp, "rotated.key")
        self.write_key(key_file, KEY.hex() + "\n")
        new = bytes(range(100, 132))
        with self.proxy(key_file=key_file) as p:
            host = f"plain.test:{self.plain.port}"
            # A connection bound under the old key, kept open across the rotation.
            bound_seq = self.next_seq()
            s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            s.sendall(f"GET http://{host}/bound HTTP/1.1\r\nHost: {host}\r\n"
                      f"Fy-Stamp: {stamp(seq=bound_seq, src='10.89.4.4')}\r\n\r\n".encode())
            data = b""
            while not data.endswith(b"}"):
                data += s.recv(65536)
            self.write_key(key_file, new.hex() + "\n")
            self.hup(p)
            seq = self.next_seq()
            self.assertEqual(http_status(self.get(p, "/new-key", [("Fy-Stamp", stamp(seq=seq, key=new))])), 200)
            row = self.row(p, "/new-key")
            self.assertEqual((row.get("src"), row.get("seq")), ("10.89.1.2", seq))
            self.assertEqual(http_status(self.get(p, "/old-key", [("Fy-Stamp", stamp(seq=self.next_seq()))])), 200)
            self.assertTrue(self.row(p, "/old-key").get("unattributed"))
            self.assertIn(f"stamp key reloaded from {key_file} (SIGHUP)", p.stderr())
            self.assertEqual(p.metric("fy_stamp_key_reloads_total"), 1)
            # The connection bound before keeps its attribution.
            s.sendall(f"GET http://{host}/still-bound HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass
            s.close()
            row = self.row(p, "/still-bound")
            self.assertEqual((row["src"], row["seq"]), ("10.89.4.4", bound_seq))

            # A broken key file, then one others can read: each reload keeps
            # the key in use, says why and what to do, and is counted.
            for text, mode, reason in ((KEY.hex()[:40], 0o600, "does not hold a key"),
                                       (KEY.hex(), 0o644, f"chmod 600 {key_file}")):
                self.write_key(key_file, text, mode)
                self.hup(p)
                err = p.stderr()
                self.assertIn("stamp key not reloaded (SIGHUP), the old key stays in use", err)
                self.assertIn(reason, err)
                seq = self.next_seq()
                path = f"/kept-{mode:o}"
                self.assertEqual(http_status(self.get(p, path, [("Fy-Stamp", stamp(seq=seq, key=new))])), 200)
                self.assertEqual(self.row(p, path)["seq"], seq)
            self.assertEqual(p.metric("fy_stamp_key_reload_failures_total"), 2)
            self.assertEqual(p.metric("fy_stamp_key_reloads_total"), 1)
            self.assertEqual(p.metric("fy_policy_failed_closed"), 0)  # the policy is not at fault
            # Fixed: the file's key is the one in use again.
            self.write_key(key_file, KEY.hex() + "\n")
            self.hup(p)
            self.assertIn(f"stamp key {key_file} is usable again", p.stderr())
            seq = self.next_seq()
            self.assertEqual(http_status(self.get(p, "/fixed", [("Fy-Stamp", stamp(seq=seq))])), 200)
            self.assertEqual(self.row(p, "/fixed")["seq"], seq)

    def test_attribution_require_without_a_key_refuses_to_start(self):
        p = self.proxy('attribution = "require"\n', stamp_key=False)
        p.start(expect_ready=False)
        try:
            self.assertEqual(p.proc.wait(timeout=10), 1)
        finally:
            p.stop()
        err = p.stderr()
        self.assertIn(f'policy {p.policy_path} sets attribution = "require"', err)
        self.assertIn("without --stamp-key", err)
        self.assertIn("refusing to start", err)

    def test_a_reload_to_attribution_require_without_a_key_fails_closed(self):
        with self.proxy(stamp_key=False) as p:
            self.assertEqual(http_status(self.get(p, "/before")), 200)
            with open(p.policy_path) as f:
                policy = f.read()
            p.reload(policy + 'attribution = "require"\n')
            err = p.stderr()
            self.assertIn(f"policy {p.policy_path} is unusable", err)
            self.assertIn('sets attribution = "require", but fy-proxy was started without --stamp-key', err)
            self.assertEqual(p.metric("fy_policy_reload_failures_total"), 1)
            self.assertEqual(p.metric("fy_policy_failed_closed"), 1)
            self.assertIn("FAILED CLOSED", p.admin("/healthz"))
            self.assertEqual(http_status(self.get(p, "/closed")), 403)  # nothing granted
            p.reload(policy)
            self.assertEqual(p.metric("fy_policy_failed_closed"), 0)
            self.assertEqual(http_status(self.get(p, "/again")), 200)

    def test_a_key_file_others_can_read_is_refused_at_start(self):
        bad = os.path.join(self.tmp, "open.key")
        with open(bad, "w") as f:
            f.write(KEY.hex())
        os.chmod(bad, 0o644)
        p = Proxy('mode = "enforce"\n', args=["--stamp-key", bad])
        p.start(expect_ready=False)
        self.assertEqual(p.proc.wait(timeout=10), 1)
        self.assertIn("chmod 600", p.stderr())
        p.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)

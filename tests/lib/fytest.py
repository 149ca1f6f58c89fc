"""Shared helpers for the integration tests: real binaries, real sockets, real TLS.

- TestCA       a throwaway certificate authority (python3-cryptography) that issues
               origin certificates, good and deliberately bad
- Origin       a threaded HTTP/1.1 origin (plain or TLS) that records every request
               it receives and serves the routes the tests need
- EchoOrigin   a raw TCP echo origin that counts the connections it accepted
- Proxy        runs the real fy-proxy with a generated policy in a temporary state
               directory; reads its Network Log and admin endpoint
- curl(), raw_exchange()  clients

Every helper cleans up after itself (context managers); nothing listens beyond
loopback and nothing is left running.
"""

import base64
import datetime
import hashlib
import http.server
import json
import os
import select
import shutil
import signal
import socket
import socketserver
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BUILD = os.environ.get("FY_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
SOURCE = os.environ.get("FY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))


def binary(name):
    paths = {
        "fy-proxy": "proxy/fy-proxy",
        "fy-netlog": "proxy/netlog/fy-netlog",
    }
    path = os.path.join(BUILD, paths.get(name, name))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not built: run ninja -C {BUILD}")
    return path


class RefusingPort:
    """A port on 127.0.0.1 that refuses every connection for as long as this
    object lives: bound and never listening, so the kernel answers a SYN with
    RST, and held, so no other process can take the port meanwhile (the race
    of binding, closing and handing over the number). Close it when done."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_until(pred, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------
# Certificates


class TestCA:
    """A throwaway CA. issue() writes a leaf's cert and key and returns their paths."""

    def __init__(self, directory, name="fytest origin CA"):
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = os.path.join(directory, "origin-ca.pem")
        with open(self.cert_path, "wb") as f:
            f.write(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, names, ips=(), expired=False, self_signed=False, tag=None):
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cn = names[0] if names else (ips[0] if ips else "x")
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if expired:
            nb, na = now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)
        else:
            nb, na = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject if self_signed else self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(nb)
            .not_valid_after(na)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
        cert = builder.sign(key if self_signed else self.key, hashes.SHA256())
        tag = tag or (cn.replace(":", "_") + ("-expired" if expired else "") + ("-self" if self_signed else ""))
        cert_path = os.path.join(self.dir, f"{tag}.pem")
        key_path = os.path.join(self.dir, f"{tag}.key")
        with open(cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return cert_path, key_path


def load_cert(path):
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


# ---------------------------------------------------------------------------
# The origin


WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fytest-origin"

    def log_message(self, *args):
        pass

    def _record(self, body=b""):
        self.server.origin.record(
            {
                "method": self.command,
                "path": self.path,
                "version": self.request_version,
                "headers": list(self.headers.items()),
                "trailers": getattr(self, "trailers", []),
                "body": body,
                "client": self.client_address,
            }
        )

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    self.trailers = []
                    while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                        name, _, value = line.decode("latin-1").partition(":")
                        self.trailers.append([name, value.strip()])
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status, body=b"", ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in headers:
            self.send_header(k, v)
        if status not in (204, 304) and not (100 <= status < 200):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and status not in (204, 304):
            self.wfile.write(body)
        self.wfile.flush()

    def handle_one_request(self):
        # Remember the raw request line for the tests that check the wire form.
        return super().handle_one_request()

    def _git(self, body):
        # Smart HTTP via git http-backend (CGI): the real server side of git.
        path, _, query = self.path.partition("?")
        env = {
            "GIT_PROJECT_ROOT": self.server.origin.git_root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path[len("/git"):],
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "REMOTE_ADDR": "127.0.0.1",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        ctype = dict((k.lower(), v) for k, v in headers).get("content-type", "application/octet-stream")
        headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
        return self._send(status, payload, ctype, headers)

    def do_route(self):
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        head = parts[0] if parts else ""
        if head == "ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self._record()
            if parts[1:2] == ["slow"]:  # /ws/slow: the 101 comes after 300 ms
                time.sleep(0.3)
            return self._websocket()
        body = b"" if head in ("stall", "reset") else self._read_body()
        self._record(body)
        for prefix, route in self.server.origin.routes.items():
            if self.path.startswith(prefix):
                return route(self, body)
        if head == "git" and self.server.origin.git_root:
            return self._git(body)
        if head == "status":
            code = int(parts[1])
            return self._send(code, f"origin says {code}:   with   spaces\n\n and lines".encode(), "text/plain")
        if head == "bytes":
            n = int(parts[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            if self.command == "HEAD":
                return
            block = b"x" * 65536
            sent = 0
            while sent < n:
                k = min(len(block), n - sent)
                self.wfile.write(block[:k])
                sent += k
            self.wfile.flush()
            return
        if head == "chunked":
            n = int(parts[1])
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            while sent < n:
                k = min(1000, n - sent)
                self.wfile.write(b"%x\r\n" % k + b"c" * k + b"\r\n")
                sent += k
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if head == "close":
            n = int(parts[1])
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"z" * n)
            self.wfile.flush()
            self.close_connection = True
            return
        if head == "slow":
            time.sleep(int(parts[1]) / 1000.0)
            return self._send(200, b"slow done", "text/plain")
        if head == "stall":
            time.sleep(30)
            return
        if head == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if head == "upload":
            digest = hashlib.sha256(body).hexdigest()
            return self._send(200, json.dumps({"len": len(body), "sha256": digest}).encode())
        if head == "204":
            return self._send(204)
        if head == "304":
            return self._send(304)
        if head == "hop":
            # Hop-by-hop fields the proxy must not pass on to the client.
            return self._send(
                200,
                b"hop",
                "text/plain",
                headers=[("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic"), ("X-Kept", "1"),
                         ("Connection", "X-Drop"), ("X-Drop", "1")],
            )
        # Default: echo what arrived.
        info = {
            "method": self.command,
            "path": self.path,
            "headers": list(self.headers.items()),
            "body_len": len(body),
        }
        return self._send(200, json.dumps(info).encode())

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_route

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        # Echo frames until a close frame.
        while True:
            frame = ws_read_frame(self.rfile)
            if frame is None:
                break
            opcode, payload = frame
            if opcode == 8:
                self.wfile.write(ws_frame(8, payload, mask=False))
                self.wfile.flush()
                break
            self.wfile.write(ws_frame(opcode, payload, mask=False))
            self.wfile.flush()
        self.close_connection = True


def ws_frame(opcode, payload, mask=True):
    head = bytes([0x80 | opcode])
    n = len(payload)
    m = 0x80 if mask else 0
    if n < 126:
        head += bytes([m | n])
    elif n < 65536:
        head += bytes([m | 126]) + struct.pack(">H", n)
    else:
        head += bytes([m | 127]) + struct.pack(">Q", n)
    if mask:
        key = os.urandom(4)
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        return head + key + payload
    return head + payload


def ws_read_frame(rfile):
    h = rfile.read(2)
    if len(h) < 2:
        return None
    opcode = h[0] & 0x0F
    masked = h[1] & 0x80
    n = h[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", rfile.read(8))[0]
    key = rfile.read(4) if masked else None
    payload = rfile.read(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return opcode, payload


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # Clients that vanish mid-response are part of the tests, not errors.
        import sys
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)

    def __init__(self, addr, handler, family=socket.AF_INET):
        self.address_family = family
        super().__init__(addr, handler)


class Origin:
    """A recording HTTP/1.1 origin on loopback; TLS when cert/key are given."""

    def __init__(self, cert=None, key=None, host="127.0.0.1", port=0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.server = _Server((host, port), _Handler, family)
        self.server.origin = self
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.host = host
        self.requests = []
        self.git_root = None  # a directory of bare repositories served under /git/
        # Extra routes: path prefix -> fn(handler, body); fn answers with handler._send(...).
        self.routes = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def record(self, req):
        with self.lock:
            self.requests.append(req)

    def header(self, req, name):
        vals = [v for k, v in req["headers"] if k.lower() == name.lower()]
        return vals[0] if vals else None

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class EchoOrigin:
    """A raw TCP origin on loopback that echoes what it reads and counts the
    connections it accepted (`accepts`): for opaque tunnels, and to prove that
    something was never dialled."""

    def __init__(self, host="127.0.0.1"):
        self.s = socket.socket()
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.s.bind((host, 0))
        self.s.listen(128)
        self.port = self.s.getsockname()[1]
        self.accepts = 0
        self.conns = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            with self.lock:
                self.accepts += 1
                self.conns.append(c)
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    def _echo(self, c):
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
        except OSError:
            pass
        finally:
            c.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.s.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---------------------------------------------------------------------------
# The proxy


class Proxy:
    """Runs fy-proxy. `policy` is the TOML text of its policy file."""

    def __init__(self, policy='mode = "enforce"\n', args=(), resolve=(), upstream_ca=None, tmp=None,
                 env=None, admin=True):
        self.own_tmp = tmp is None
        self.dir = tmp or tempfile.mkdtemp(prefix="fyproxy-")
        self.state = os.path.join(self.dir, "state")
        self.policy_path = os.path.join(self.dir, "policy.toml")
        self.netlog = os.path.join(self.dir, "egress.jsonl")
        self.port_file = os.path.join(self.dir, "port")
        if policy is not None:
            self.write_policy(policy)
        cmd = [
            binary("fy-proxy"),
            "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0" if admin else "off",
            "--state-dir", self.state,
            "--policy", self.policy_path,
            "--netlog", self.netlog,
            "--port-file", self.port_file,
            "--log-level", "debug",
        ]
        for host, ip in resolve:
            cmd += ["--resolve", f"{host}={ip}"]
        if upstream_ca:
            cmd += ["--upstream-ca", upstream_ca]
        cmd += list(args)
        self.cmd = cmd
        self.env = env
        self.proc = None
        self.stderr_path = os.path.join(self.dir, "stderr.log")
        self.ready_line = None

    def start(self, expect_ready=True):
        self._err = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self._err, env=self.env, text=True)
        if not expect_ready:
            return self
        line = self.proc.stdout.readline()
        if not line.startswith("fy-proxy ready"):
            self.proc.wait(timeout=10)
            raise AssertionError(f"fy-proxy did not start: {line!r}\n{self.stderr()}")
        self.ready_line = line
        self.port = int(line.split("listening on ")[1].split(" ")[0].rsplit(":", 1)[1])
        admin = line.split("admin ")[1].split(" ")[0]
        self.admin_port = None if admin == "off" else int(admin.rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.ca = os.path.join(self.state, "ca-cert.pem")
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        code = self.stop()
        err = self.stderr()
        if self.own_tmp:
            shutil.rmtree(self.dir, ignore_errors=True)
        # A clean exit is part of every test: a crash, a sanitizer report or a
        # leak at exit fails the test that ran the proxy.
        if exc[0] is None:
            if "AddressSanitizer" in err or "runtime error:" in err or "LeakSanitizer" in err:
                raise AssertionError(f"fy-proxy reported a sanitizer error:\n{err[-4000:]}")
            if code not in (0, None):
                raise AssertionError(f"fy-proxy exited with {code}:\n{err[-2000:]}")

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if hasattr(self, "_err"):
            self._err.close()
        return self.proc.returncode if self.proc else None

    def stderr(self):
        try:
            with open(self.stderr_path) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def write_policy(self, text, signal_hup=False):
        tmp = self.policy_path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.policy_path)
        if signal_hup and self.proc:
            self.proc.send_signal(signal.SIGHUP)

    def reload(self, text):
        """Writes the policy and waits until the proxy has loaded it."""
        before = self.metric("fy_policy_reloads_total") + self.metric("fy_policy_reload_failures_total")
        self.write_policy(text, signal_hup=True)
        wait_until(
            lambda: self.metric("fy_policy_reloads_total") + self.metric("fy_policy_reload_failures_total") > before,
            what="the policy reload",
        )

    def rows(self):
        try:
            with open(self.netlog) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def wait_rows(self, pred=lambda r: True, n=1, timeout=10):
        return wait_until(lambda: (lambda rs: rs if len(rs) >= n else None)([r for r in self.rows() if pred(r)]),
                          timeout=timeout, what=f"{n} matching Network Log rows")

    def admin(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
            return r.read().decode()

    def metrics(self):
        out = {}
        for line in self.admin("/metrics").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def metric(self, name):
        return self.metrics().get(name, 0.0)


# ---------------------------------------------------------------------------
# Clients


def curl(*args, proxy=None, cacert=None, timeout=20, check=False):
    cmd = ["curl", "-sS", "--max-time", str(timeout)]
    if proxy:
        cmd += ["-x", proxy, "--noproxy", ""]
    if cacert:
        cmd += ["--cacert", cacert]
    cmd += list(args)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(cmd, capture_output=True, env=env, timeout=timeout + 10, check=check)


def raw_exchange(port, data, timeout=5.0, host="127.0.0.1", half_close=False, until=None):
    """Sends raw bytes to host:port and returns everything read until the peer
    closes (or `until` bytes appear, or the timeout passes)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([s], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                break
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                out += b"<RESET>"
                break
            if not chunk:
                break
            out += chunk
            if until is not None and until in out:
                break
        return out
    finally:
        s.close()


def http_status(resp):
    """The status code of the first response in raw bytes."""
    line = resp.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _main():
    """Runs an origin as its own process (e.g. inside a test's network namespace):
        python3 fytest.py origin --host 198.51.100.80 --port 443 [--cert C --key K] [--log FILE]
    With --log, every request is appended as one JSON line (method, path, headers)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["origin"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--log")
    a = ap.parse_args()
    o = Origin(a.cert, a.key, host=a.host, port=a.port)
    if a.log:
        lock = threading.Lock()

        def record(req, _o=o):
            with lock, open(a.log, "a") as f:
                f.write(json.dumps({"method": req["method"], "path": req["path"],
                                    "headers": req["headers"],
                                    "trailers": req["trailers"]}) + "\n")
        o.record = record
    print(f"listening {a.host}:{o.port}", flush=True)
    o.server.serve_forever()


if __name__ == "__main__":
    _main()

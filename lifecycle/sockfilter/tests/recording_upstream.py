"""A recording stand-in for podman's API socket, for fy-sockfilter's tests.

It reads requests the way podman's Go server does, not the way the filter
does, so a request the filter let through in a form Go would read otherwise
shows up here as what Go would have seen:
  - lines end in LF with an optional CR (Go's textproto accepts a bare LF);
  - Transfer-Encoding is ignored on HTTP/1.0 (net/http, issue 12785), so the
    chunk data is read as the next request;
  - Content-Length frames a body, chunked (HTTP/1.1 only) is de-chunked;
  - a request carrying Upgrade is answered framed and the connection kept,
    unless it is an attach with `Connection: Upgrade` (101, then raw echo);
  - an attach without Upgrade is answered with a bare 200 and no framing,
    then raw echo, as libpod/util.go writeHijackHeader does;
and decodes create bodies as podman's json-iterator does (podman_view):
keys matched case-insensitively, repeated keys merged, trailing data ignored.
"""
import json
import os
import socket
import threading


def _merge_pairs(pairs):
    out = {}
    for k, v in pairs:
        lk = k.lower()
        if lk in out and isinstance(out[lk], dict) and isinstance(v, dict):
            out[lk].update(v)  # Go reuses the map: a union
        else:
            out[lk] = v
    return out


def podman_view(body):
    """The create body as podman binds it: a dict with lower-cased keys at
    every level (field names match case-insensitively, maps merge), the first
    JSON value only (trailing data ignored)."""
    if not body:
        return {}
    value, _ = json.JSONDecoder(object_pairs_hook=_merge_pairs).raw_decode(body.decode())
    return value


def runtime_selection(body, family):
    """What runtime selection a decoded create body carries: a list of
    strings, empty when none."""
    v = podman_view(body)
    found = []
    if family == "libpod":
        if "oci_runtime" in v:
            found.append("oci_runtime=%s" % v["oci_runtime"])
        ann = v.get("annotations") or {}
    else:
        hc = v.get("hostconfig") or {}
        if "runtime" in hc:
            found.append("HostConfig.Runtime=%s" % hc["runtime"])
        ann = hc.get("annotations") or {}
    for k in ann:
        lk = k.lower()
        if lk.startswith("dev.gvisor.") or lk in (
                "io.kubernetes.cri.sandbox-id", "io.kubernetes.cri.container-type",
                "io.kubernetes.cri-o.sandboxid", "io.kubernetes.cri-o.containertype"):
            found.append("annotation %s" % k)
    return found


class Request:
    def __init__(self, method, target, version, headers, body):
        self.method, self.target, self.version = method, target, version
        self.headers, self.body = headers, body

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def __repr__(self):
        return "%s %s %s %r" % (self.method, self.target, self.version, self.body[:80])


class Upstream:
    def __init__(self, path):
        self.path = path
        self.requests = []
        self.raw = []  # every connection's raw bytes, in order
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.sock.bind(path)
        self.sock.listen(64)
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.stop = True
        try:
            self.sock.close()
        except OSError:
            pass
        if os.path.exists(self.path):
            os.unlink(self.path)

    def reset(self):
        with self.lock:
            self.requests.clear()
            self.raw.clear()

    def _accept(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = bytearray()
        raw = bytearray()  # everything this connection received, for the Go oracle
        with self.lock:
            self.raw.append(raw)

        def read_more():
            d = c.recv(65536)
            if not d:
                raise EOFError
            buf.extend(d)
            raw.extend(d)

        def line():
            while b"\n" not in buf:
                read_more()
            i = buf.index(b"\n")
            ln = bytes(buf[:i])
            del buf[:i + 1]
            return ln[:-1] if ln.endswith(b"\r") else ln

        def take(n):
            while len(buf) < n:
                read_more()
            d = bytes(buf[:n])
            del buf[:n]
            return d

        try:
            while True:
                rl = line()
                while rl == b"":
                    rl = line()
                parts = rl.decode("latin-1").split(" ")
                if len(parts) != 3:
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                method, target, version = parts
                headers = []
                while True:
                    h = line()
                    if h == b"":
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers.append((k, v.strip(" \t")))
                req = Request(method, target, version, headers, b"")
                te = req.header("transfer-encoding")
                if te is not None and version == "HTTP/1.1" and te.lower() == "chunked":
                    body = bytearray()
                    while True:
                        size = int(line().split(b";")[0], 16)
                        if size == 0:
                            while line() != b"":
                                pass
                            break
                        body.extend(take(size))
                        take(2)
                    req.body = bytes(body)
                elif req.header("content-length") is not None:
                    req.body = take(int(req.header("content-length")))
                with self.lock:
                    self.requests.append(req)
                if not self._answer(c, req, buf):
                    return
        except (EOFError, OSError, ValueError):
            pass
        finally:
            c.close()

    def _answer(self, c, req, buf):
        path = req.target.split("?")[0]
        up = req.header("upgrade")
        conn = (req.header("connection") or "").lower()
        if path.endswith("/attach") or path.endswith("/start") and "/exec/" in path:
            if up and "upgrade" in conn:
                c.sendall(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                          b"Connection: Upgrade\r\nUpgrade: " + up.encode() + b"\r\n\r\nhello ")
            else:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\nhello ")
            # raw echo until the client half-closes, then say bye and close
            if buf:
                c.sendall(bytes(buf))
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
            c.sendall(b"bye")
            c.shutdown(socket.SHUT_WR)
            return False
        answer = req.header("x-fy-answer") or ""  # the tests' way to ask for a 1xx or a 204
        if answer == "1xx":
            c.sendall(b"HTTP/1.1 102 Processing\r\n\r\n")
        if answer == "204":
            c.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            return True
        body = json.dumps({"ok": True, "n": len(self.requests)}).encode()
        if req.method == "HEAD":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            return True
        status = b"201 Created" if path.endswith("/create") else b"200 OK"
        close = req.version == "HTTP/1.0" and "keep-alive" not in conn or "close" in conn
        c.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
                  % (len(body), b"Connection: close\r\n" if close else b"") + body)
        return not close

"""fy-sockfilter on real unix sockets, against a recording upstream that reads
what it receives the way podman does (recording_upstream.py). Each bypass
class of the issue has a test; each checks what reached the upstream by
decoding it as podman would, not by comparing bytes with what was sent."""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recording_upstream import Upstream, podman_view, runtime_selection  # noqa: E402

BIN = os.environ.get("FY_SOCKFILTER")
UNPARSEABLE = b"foldyard socket filter: unparseable create body refused"
UNREACHABLE = b"foldyard socket filter: upstream engine socket unreachable"


class Filter:
    def __init__(self, tmp, upstream_path, extra_cfg="", name="f"):
        self.path = os.path.join(tmp, name + ".sock")
        args = [BIN, upstream_path, self.path, "--log-level", "warn"]
        if extra_cfg:
            cfg = os.path.join(tmp, name + ".toml")
            with open(cfg, "w") as f:
                f.write("[sockfilter]\n" + extra_cfg)
            args += ["--config", cfg]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE)
        for _ in range(200):
            if os.path.exists(self.path):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("fy-sockfilter exited: %s" % self.proc.stderr.read().decode())
            time.sleep(0.01)
        raise RuntimeError("fy-sockfilter did not listen")

    def stop(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        return rc

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(self.path)
        return s


class Reader:
    def __init__(self, s):
        self.s, self.buf = s, bytearray()

    def _more(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf.extend(d)

    def line(self):
        while b"\r\n" not in self.buf:
            self._more()
        i = self.buf.index(b"\r\n")
        ln = bytes(self.buf[:i])
        del self.buf[:i + 2]
        return ln

    def take(self, n):
        while len(self.buf) < n:
            self._more()
        d = bytes(self.buf[:n])
        del self.buf[:n]
        return d

    def response(self, head_only=False):
        st = self.line().split(b" ", 2)
        status = int(st[1])
        headers = {}
        while True:
            h = self.line()
            if not h:
                break
            k, _, v = h.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        if head_only or status in (101, 204, 304) or 100 <= status < 200:
            return status, headers, b""
        n = int(headers.get("content-length", "0"))
        return status, headers, self.take(n)

    def rest(self):
        try:
            while True:
                self._more()
        except (EOFError, ConnectionResetError):
            pass
        return bytes(self.buf)


def req(method, target, body=None, headers=(), version="HTTP/1.1"):
    h = "%s %s %s\r\nHost: d\r\n" % (method, target, version)
    for k, v in headers:
        h += "%s: %s\r\n" % (k, v)
    if body is not None and not any(k.lower() in ("transfer-encoding", "content-length") for k, _ in headers):
        h += "Content-Length: %d\r\n" % len(body)
    return h.encode() + b"\r\n" + (body or b"")


def exchange(f, data, n=1, head_only=False):
    s = f.connect()
    s.sendall(data)
    r = Reader(s)
    out = [r.response(head_only) for _ in range(n)]
    s.close()
    return out


def wait_requests(up, n, timeout=2.0):
    end = time.time() + timeout
    while time.time() < end and len(up.requests) < n:
        time.sleep(0.005)
    time.sleep(0.05)  # and nothing more arrives
    return list(up.requests)


LIBPOD_CROSS = {"image": "bb", "oci_runtime": "crun", "Memory": 9223372036854775807,
                "annotations": {"dev.gvisor.spec.rootfs.source": "/", "io.kubernetes.cri.sandbox-id": "x",
                                "keep.me": "1"}}

# ---------------------------------------------------------------- the tests


def t_ping_passes(f, up):
    (st, _, body), = exchange(f, req("GET", "/_ping"))
    assert st == 200
    rs = wait_requests(up, 1)
    assert [r.target for r in rs] == ["/_ping"], rs


def t_version_spellings(f, up):
    body = json.dumps(LIBPOD_CROSS).encode()
    prefixes = ["/v4.0.0", "/v5.0.0-dev", "/v1.41-x", "/v9abc", "/v1.", "/v0", "/v6.0.0"]
    for p in prefixes:
        (st, _, _), = exchange(f, req("POST", p + "/libpod/containers/create?name=a", body))
        assert st == 201, (p, st)
    for p in ["", "/v1.41", "/v1.41-x", "/v9abc"]:
        cbody = json.dumps({"Image": "bb", "HostConfig": {"Runtime": "crun",
                            "Annotations": {"dev.gvisor.x": "1", "k": "v"}}}).encode()
        (st, _, _), = exchange(f, req("POST", p + "/containers/create", cbody))
        assert st == 201, (p, st)
    rs = wait_requests(up, len(prefixes) + 4)
    assert len(rs) == len(prefixes) + 4, rs
    for r in rs[:len(prefixes)]:
        assert runtime_selection(r.body, "libpod") == [], r
        v = podman_view(r.body)
        assert v["annotations"] == {"keep.me": "1"} and v["memory"] == 9223372036854775807, v
        assert b"9223372036854775807" in r.body  # the number as written
        assert r.header("content-length") == str(len(r.body))
    for r in rs[len(prefixes):]:
        assert runtime_selection(r.body, "compat") == [], r
        assert podman_view(r.body)["hostconfig"]["annotations"] == {"k": "v"}


def t_case_variant_keys(f, up):
    bodies = [b'{"image":"bb","OCI_Runtime":"crun"}', b'{"image":"bb","Oci_runtime":"crun"}',
              b'{"ANNOTATIONS":{"DEV.GVISOR.spec.mount.0.share":"shared"}}',
              b'{"image":"bb","oci_runtim\\u0065":"crun"}']
    for b in bodies:
        (st, _, _), = exchange(f, req("POST", "/v4/libpod/containers/create", b))
        assert st == 201
    cb = [b'{"hostconfig":{"runtime":"crun"}}', b'{"HOSTCONFIG":{"ANNOTATIONS":{"dev.gvisor.x":"1"}}}']
    for b in cb:
        (st, _, _), = exchange(f, req("POST", "/containers/create", b))
        assert st == 201
    rs = wait_requests(up, len(bodies) + len(cb))
    assert len(rs) == len(bodies) + len(cb)
    for r in rs[:len(bodies)]:
        assert runtime_selection(r.body, "libpod") == [], r
    for r in rs[len(bodies):]:
        assert runtime_selection(r.body, "compat") == [], r


def t_duplicate_keys_refused(f, up):
    bodies = [b'{"oci_runtime":"runsc-fy","oci_runtime":"crun"}',
              b'{"oci_runtime":"runsc-fy","OCI_RUNTIME":"crun"}',
              b'{"annotations":{},"Annotations":{"dev.gvisor.x":"1"}}',
              b'{"annotations":{"a":"1","A":"2"}}']
    for b in bodies:
        (st, h, body), = exchange(f, req("POST", "/v4/libpod/containers/create", b))
        assert st == 400 and body.startswith(UNPARSEABLE), (st, body)
        assert h.get("connection") == "close" and h.get("content-type") == "text/plain"
    (st, _, body), = exchange(f, req("POST", "/containers/create", b'{"HostConfig":{},"hostconfig":{"Runtime":"crun"}}'))
    assert st == 400 and body.startswith(UNPARSEABLE)
    assert wait_requests(up, 1, 0.3) == []


def t_trailing_data_refused(f, up):
    for b in [b'{"image":"bb"}{"oci_runtime":"crun"}', b'{"image":"bb"} x', b'not json', b'[1]']:
        (st, _, body), = exchange(f, req("POST", "/v4/libpod/containers/create", b))
        assert st == 400 and body.startswith(UNPARSEABLE), (b, st, body)
    assert wait_requests(up, 1, 0.3) == []


def t_te_on_http10_refused(f, up):
    # Go ignores TE on 1.0: the chunk would be read as a second request.
    smuggled = req("POST", "/v4/libpod/containers/create", b'{"image":"bb","oci_runtime":"crun"}')
    chunk = b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"
    data = (b"POST /v4/libpod/containers/json HTTP/1.0\r\nHost: d\r\nConnection: keep-alive\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk)
    (st, _, body), = exchange(f, data)
    assert st == 400 and b"HTTP/1.0" in body, body
    assert wait_requests(up, 1, 0.3) == []


def t_h2c_and_preface_refused(f, up):
    for data in [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9,
                 req("GET", "/_ping", headers=[("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
                                                ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")]),
                 req("GET", "/_ping", headers=[("Upgrade", "H2C"), ("Connection", "Upgrade")])]:
        (st, _, body), = exchange(f, data)
        assert st == 400 and b"HTTP/2" in body, (st, body)
    assert wait_requests(up, 1, 0.3) == []


def t_upgrade_without_101_then_create(f, up):
    s = f.connect()
    r = Reader(s)
    s.sendall(req("GET", "/_ping", headers=[("Upgrade", "tcp"), ("Connection", "Upgrade")]))
    st, _, _ = r.response()
    assert st == 200
    s.sendall(req("POST", "/v4/libpod/containers/create", b'{"image":"bb","oci_runtime":"crun"}'))
    st, _, _ = r.response()
    assert st == 201
    s.close()
    rs = wait_requests(up, 2)
    assert len(rs) == 2 and runtime_selection(rs[1].body, "libpod") == [], rs


def t_pipelined_creates(f, up):
    one = req("POST", "/v4/libpod/containers/create", b'{"image":"bb","oci_runtime":"crun"}')
    two = req("POST", "/v1.41/containers/create", b'{"Image":"bb","HostConfig":{"Runtime":"crun"}}')
    res = exchange(f, one + two + one, n=3)
    assert [x[0] for x in res] == [201, 201, 201]
    rs = wait_requests(up, 3)
    assert len(rs) == 3
    assert runtime_selection(rs[0].body, "libpod") == [] and runtime_selection(rs[2].body, "libpod") == []
    assert runtime_selection(rs[1].body, "compat") == []


def t_chunked_and_expect_creates(f, up):
    b = b'{"image":"bb","oci_runtime":"crun"}'
    chunked = (b"POST /v4/libpod/containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\n" + b[:5] + b"\r\n%x\r\n" % (len(b) - 5) + b[5:] + b"\r\n0\r\n\r\n")
    (st, _, _), = exchange(f, chunked)
    assert st == 201
    # Expect: the filter answers 100 itself, before the body is sent.
    s = f.connect()
    r = Reader(s)
    s.sendall(req("POST", "/v4/libpod/containers/create", None,
                  headers=[("Content-Length", str(len(b))), ("Expect", "100-continue")]))
    st, _, _ = r.response()
    assert st == 100
    s.sendall(b)
    st, _, _ = r.response()
    assert st == 201
    s.close()
    rs = wait_requests(up, 2)
    assert len(rs) == 2
    for x in rs:
        assert runtime_selection(x.body, "libpod") == [] and podman_view(x.body) == {"image": "bb"}
        assert x.header("transfer-encoding") is None and x.header("expect") is None
        assert x.header("content-length") == str(len(x.body))


def t_other_creating_endpoints_refused(f, up):
    cases = [("/v4/libpod/play/kube", "kube play"), ("/v5.0.0/libpod/kube/play", "kube play"),
             ("/v5.0.0/libpod/kube/apply", "kube play"),
             ("/v4/libpod/containers/c1/restore?import=true", "restore"),
             ("/v4/libpod/build?isolation=chroot", "isolation"), ("/build?isolation=chroot", "isolation"),
             ("/v4/libpod/build?volume=/:/host", "volume"), ("/v4/libpod/local/build", "path"),
             ("/v6.0.0/libpod/quadlets", "quadlet")]
    for target, why in cases:
        (st, _, body), = exchange(f, req("POST", target, b"x"))
        assert st == 400, (target, st)
        assert target.split("?")[0].encode() in body and why.encode() in body, (target, body)
    assert wait_requests(up, 1, 0.3) == []


def t_paths_as_the_router_reads_them(f, up):
    b = b'{"image":"bb","oci_runtime":"crun"}'
    # Refused: paths the engine would only redirect or re-escape.
    for t in ["/v4/libpod//containers/create", "/v4/libpod/./containers/create",
              "/v4/libpod/x/../containers/create", "/v4/libpod/containers/cre\"ate"]:
        (st, _, _), = exchange(f, req("POST", t, b))
        assert st == 400, t
    assert wait_requests(up, 1, 0.3) == []
    # Not a route of podman's (the router would 404 it): refused as unknown,
    # naming the endpoint.
    (st, _, body), = exchange(f, req("POST", "/v4/libpod/containers/%63reate", b))
    assert st == 400 and b"POST /v4/libpod/containers/%63reate refused: no engine endpoint" in body, body
    assert wait_requests(up, 1, 0.3) == []


def t_malformed_heads_refused(f, up):
    for data in [b"GET /_ping HTTP/1.1\nHost: d\n\n", b"GET /_ping HTTP/1.1\r\nHost: d\r\n x\r\n\r\n",
                 b"GET /_ping HTTP/1.1\r\nHost: d\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
                 b"POST /x HTTP/1.1\r\nHost: d\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 b"GET /_ping HTTP/1.1\r\nHo st: d\r\n\r\n", b"get /_ping HTTP/1.1\r\n\r\n"]:
        (st, _, _), = exchange(f, data)
        assert st == 400, data
    assert wait_requests(up, 1, 0.3) == []


def t_bodies_reframed(f, up):
    # A chunked non-create body goes up chunked (one framing header), a
    # Content-Length one with exactly that length.
    (st, _, _), = exchange(f, b"POST /v4/libpod/images/load HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"3;x=y\r\nabc\r\n0\r\n\r\n")
    (st2, _, _), = exchange(f, req("POST", "/v4/libpod/images/load", b"hello"))
    rs = wait_requests(up, 2)
    assert st == 200 and st2 == 200
    assert rs[0].body == b"abc" and rs[0].header("transfer-encoding") == "chunked"
    assert rs[1].body == b"hello" and rs[1].header("content-length") == "5"


def t_raw_after_101_and_unframed_200(f, up):
    for headers in ([("Upgrade", "tcp"), ("Connection", "Upgrade")], []):
        s = f.connect()
        s.sendall(req("POST", "/v4/libpod/containers/c1/attach?stream=true", headers=headers))
        r = Reader(s)
        st, h, _ = r.response(head_only=True)
        assert st == (101 if headers else 200), st
        # raw both ways: HTTP-looking bytes are stream data now
        payload = req("POST", "/v4/libpod/containers/create", b'{"oci_runtime":"crun"}')
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)  # the half-close reaches the engine
        got = r.rest()
        assert got == b"hello " + payload + b"bye", got
        s.close()
    rs = wait_requests(up, 2)
    assert len(rs) == 2  # the payloads were stream data, not requests


def t_head_204_1xx(f, up):
    s = f.connect()
    r = Reader(s)
    s.sendall(req("HEAD", "/_ping") + req("POST", "/v4/libpod/containers/c1/stop", headers=[("X-Fy-Answer", "204")])
              + req("GET", "/v4/libpod/info", headers=[("X-Fy-Answer", "1xx")]) + req("GET", "/_ping"))
    st, h, _ = r.response(head_only=True)
    assert st == 200 and h["content-length"] != "0"
    st, _, _ = r.response()
    assert st == 204
    st, _, _ = r.response()
    assert st == 102
    st, _, body = r.response()
    assert st == 200 and body.startswith(b"{")
    st, _, body = r.response()
    assert st == 200
    s.close()


def t_keep_alive_many(f, up):
    s = f.connect()
    r = Reader(s)
    for i in range(50):
        s.sendall(req("GET", "/_ping"))
        st, _, _ = r.response()
        assert st == 200
    s.close()
    assert len(wait_requests(up, 50)) == 50


def t_http10_close(f, up):
    s = f.connect()
    s.sendall(req("GET", "/_ping", version="HTTP/1.0"))
    r = Reader(s)
    st, _, _ = r.response()
    assert st == 200
    assert r.rest() == b""  # closed after the answer
    s.close()


def t_socket_mode(f, up):
    m = stat.S_IMODE(os.stat(f.path).st_mode)
    assert m == 0o660, oct(m)


def t_limits(tmp, up):
    f = Filter(tmp, up.path, "create_body_max_kib = 1\nrequest_timeout_ms = 300\nbody_max_mib = 1\n", "lim")
    try:
        (st, _, body), = exchange(f, req("POST", "/v4/libpod/containers/create", b"{" + b" " * 2000 + b"}"))
        assert st == 413, st
        big = b"POST /v4/libpod/containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
        big += (b"400\r\n" + b" " * 1024 + b"\r\n") * 2
        (st, _, _), = exchange(f, big)
        assert st == 413, st
        (st, _, _), = exchange(f, req("POST", "/v4/libpod/images/load", None, headers=[("Content-Length", str(2 << 20))]))
        assert st == 413, st
        s = f.connect()
        s.sendall(req("POST", "/v4/libpod/containers/create", None, headers=[("Content-Length", "20")]) + b'{"im')
        t0 = time.time()
        st, _, body = Reader(s).response()
        assert st == 408 and 0.2 < time.time() - t0 < 3, (st, time.time() - t0)
        s.close()
        s = f.connect()
        s.sendall(b"GET /_ping HTTP/1.1\r\nHost")
        st, _, _ = Reader(s).response()
        assert st == 408
        s.close()
        assert wait_requests(up, 1, 0.3) == []
    finally:
        f.stop()


def t_unknown_routes_refused(f, up):
    # Default deny: only the routes of podman's API are forwarded.
    for m, t in [("POST", "/v4/libpod/containers/create/"), ("POST", "/V4.0.0/libpod/containers/create"),
                 ("POST", "/libpod/containers/create"), ("GET", "/v4/libpod/nothing"),
                 ("OPTIONS", "/_ping"), ("PATCH", "/v4/libpod/containers/c1/update"),
                 ("POST", "/v4/libpod/containers%2Fcreate"), ("POST", "/v4/libpod/%2e%2e/containers/create"),
                 ("POST", "/v4/libpod/containers/create;x"), ("HEAD", "/containers/json")]:
        (st, h, body), = exchange(f, req(m, t, b"{}"), head_only=(m == "HEAD"))
        assert st == 400, (m, t, st)
        if m != "HEAD":
            assert (m + " " + t + " refused: no engine endpoint").encode() in body, body
            assert b"check the method and the path" in body
    assert wait_requests(up, 1, 0.3) == []


def t_pods_create_forwarded(f, up):
    # podman's pod create makes an infra container with the engine's default
    # runtime: the pod spec has no runtime field. Forwarded as it is.
    b = b'{"name":"p1","infra_image":"localhost/bb:1"}'
    (st, _, _), = exchange(f, req("POST", "/v4.0.0/libpod/pods/create", b))
    assert st == 201, st
    rs = wait_requests(up, 1)
    assert len(rs) == 1 and rs[0].body == b, rs


def t_hostile_targets(f, up):
    # Targets podman's Go parser reads differently: none reaches a create
    # unstripped, none goes up at all.
    b = b'{"image":"bb","oci_runtime":"crun"}'
    for t in ["http://x/v4/libpod/containers/create", "http://x/containers/create",
              "//x/containers/create", "/v4/libpod/containers/create#x", "/containers/create#",
              "/v4/libpod/containers/cre%61te", "/v4/libpod/containers/create%2F",
              "/v4/libpod/containers/create/.", "/v4.0.0//libpod/containers/create",
              "/v4/libpod/containers/create\\", "/%76%34/libpod/containers/create",
              "/v4/libpod/containers/create%3Fx=1"]:
        (st, _, _), = exchange(f, req("POST", t, b))
        assert st == 400, (t, st)
    assert wait_requests(up, 1, 0.3) == []
    # An odd but valid version is a version: stripped.
    (st, _, _), = exchange(f, req("POST", "/v1.a-b.c/libpod/containers/create", b))
    rs = wait_requests(up, 1)
    assert st == 201 and runtime_selection(rs[0].body, "libpod") == [], rs


def t_hostile_framing(f, up):
    b = b'{"image":"bb","oci_runtime":"crun"}'
    bad = [("Content-Length", "+%d" % len(b)), ("Content-Length", "%d, %d" % (len(b), len(b))),
           ("Content-Length", "-1"), ("Content-Length", "0x10"), ("Content-Length", " ")]
    for k, v in bad:
        (st, _, _), = exchange(f, req("POST", "/v4/libpod/containers/create", b, headers=[(k, v)]))
        assert st == 400, (k, v, st)
    for hs in [[("Content-Length", str(len(b))), ("Content-Length", str(len(b)))],
               [("Transfer-Encoding", "chunked, chunked")], [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")],
               [("Transfer-Encoding", "identity, chunked")], [("Transfer-Encoding", "gzip")],
               [("Transfer-Encoding", "chunked"), ("Content-Length", "3")]]:
        data = req("POST", "/v4/libpod/containers/create", None, headers=hs) + b"%x\r\n" % len(b) + b + b"\r\n0\r\n\r\n"
        (st, _, _), = exchange(f, data)
        assert st == 400, (hs, st)
    assert wait_requests(up, 1, 0.3) == []
    # Leading zeros: both parsers read the same number; it goes up canonical.
    (st, _, _), = exchange(f, req("POST", "/v4/libpod/containers/create", b, headers=[("Content-Length", "000%d" % len(b))]))
    rs = wait_requests(up, 1)
    assert st == 201 and len(rs) == 1 and rs[0].header("content-length") == str(len(rs[0].body)), rs
    assert runtime_selection(rs[0].body, "libpod") == []


def t_grpc_content_type_any_value(f, up):
    # podman's router sends a request to its gRPC server when any
    # Content-Type value matches application/grpc (an unanchored regexp).
    for hs in [[("Content-Type", "application/json"), ("Content-Type", "application/grpc")],
               [("Content-Type", "text/plain; x=application/grpc")]]:
        (st, _, body), = exchange(f, req("POST", "/v4/libpod/containers/c1/start", b"", headers=hs))
        assert st == 400 and b"gRPC" in body, (hs, st, body)
    assert wait_requests(up, 1, 0.3) == []


def t_body_bounds_by_default(f, up):
    # The default filter bounds other bodies too: 4 GiB.
    (st, _, body), = exchange(f, req("POST", "/v4/libpod/images/load", None,
                                     headers=[("Content-Length", str(5 << 30))]))
    assert st == 413 and b"body_max" in body, (st, body)
    assert wait_requests(up, 1, 0.3) == []


def t_body_whole_time_bound(tmp, up):
    # A body that trickles (never idle long enough for the idle bound) is cut
    # at body_timeout_s.
    f = Filter(tmp, up.path, "body_timeout_s = 1\nbody_idle_timeout_ms = 5000\n", "tb")
    try:
        s = f.connect()
        s.sendall(req("POST", "/v4/libpod/images/load", None, headers=[("Content-Length", "1000")]))
        t0 = time.time()
        r = Reader(s)
        try:
            for _ in range(20):
                s.sendall(b"x")
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, _, body = r.response()
        el = time.time() - t0
        assert st == 408 and b"body_timeout_s" in body and 0.8 < el < 3.5, (st, body, el)
        s.close()
    finally:
        f.stop()


def t_stats_socket(tmp, up):
    sp = os.path.join(tmp, "stats.sock")
    f = Filter(tmp, up.path, 'stats = "%s"\n' % sp, "st")
    try:
        assert stat.S_IMODE(os.stat(sp).st_mode) == 0o600
        cb = json.dumps({"image": "bb", "oci_runtime": "crun",
                         "annotations": {"dev.gvisor.a": "1", "io.kubernetes.cri.sandbox-id": "x"}}).encode()
        exchange(f, req("GET", "/_ping"))
        exchange(f, req("POST", "/v4/libpod/containers/create", cb))
        exchange(f, req("POST", "/v1.41/containers/create", b'{"HostConfig":{"Runtime":"crun"}}'))
        exchange(f, req("POST", "/v4/libpod/kube/play", b"x"))
        exchange(f, req("GET", "/v4/libpod/nothing"))
        exchange(f, req("GET", "/v4/libpod/nothing2"))
        exchange(f, req("POST", "/v4/libpod/containers/create", b'{"a":1,"A":2}'))
        exchange(f, b"GET /_ping HTTP/1.1\nHost: d\n\n")
        wait_requests(up, 3)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(5)
        c.connect(sp)
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        st, h, text = Reader(c).response()
        c.close()
        assert st == 200 and h["content-type"].startswith("text/plain"), (st, h)
        got = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                got[k] = int(v)
        want = {'fy_sockfilter_requests_total{class="known"}': 1,
                'fy_sockfilter_requests_total{class="create"}': 3,
                'fy_sockfilter_requests_total{class="door"}': 1,
                'fy_sockfilter_requests_total{class="unknown"}': 2,
                'fy_sockfilter_refusals_total{reason="unknown_route"}': 2,
                'fy_sockfilter_refusals_total{reason="kube_play"}': 1,
                'fy_sockfilter_refusals_total{reason="create_unparseable"}': 1,
                'fy_sockfilter_refusals_total{reason="head_malformed"}': 1,
                'fy_sockfilter_refusals_total{reason="build_isolation"}': 0,
                'fy_sockfilter_stripped_total{field="oci_runtime"}': 1,
                'fy_sockfilter_stripped_total{field="HostConfig.Runtime"}': 1,
                'fy_sockfilter_stripped_total{field="annotation:dev.gvisor.*"}': 1,
                'fy_sockfilter_stripped_total{field="annotation:cri-sandbox"}': 1,
                'fy_sockfilter_creates_rewritten_total': 2,
                'fy_sockfilter_connections_total': 8}
        for k, v in want.items():
            assert got.get(k) == v, (k, got.get(k), text.decode())
    finally:
        rc = f.stop()
        assert rc == 0 and not os.path.exists(sp), rc


def t_unreachable(tmp, up):
    f = Filter(tmp, os.path.join(tmp, "nothing.sock"), name="unr")
    try:
        (st, h, body), = exchange(f, req("GET", "/_ping"))
        assert st == 400 and body.strip() == UNREACHABLE and h["connection"] == "close", body
    finally:
        f.stop()


def t_cli(tmp, up):
    r = subprocess.run([BIN, "--help"], capture_output=True)
    assert r.returncode == 0 and b"usage: fy-sockfilter" in r.stdout
    r = subprocess.run([BIN, "only-one"], capture_output=True)
    assert r.returncode == 2 and b"usage: fy-sockfilter <upstream.sock> <listen.sock>" in r.stderr
    r = subprocess.run([BIN, "--bogus", "a", "b"], capture_output=True)
    assert r.returncode == 2
    cfg = os.path.join(tmp, "bad.toml")
    with open(cfg, "w") as fh:
        fh.write("[sockfilter]\nmode = \"9\"\nnope = 1\n")
    r = subprocess.run([BIN, "--config", cfg, "a", "b"], capture_output=True)
    assert r.returncode == 2 and b"bad.toml:2" in r.stderr and b"nope" in r.stderr, r.stderr
    r = subprocess.run([BIN, up.path, os.path.join(tmp, "no/such/dir.sock")], capture_output=True)
    assert r.returncode == 3 and b"cannot listen" in r.stderr, r


def t_provision_templates(tmp, up):
    prov = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "provision")
    w = open(os.path.join(prov, "runsc-fy.in")).read()
    assert "allow-flag-override" not in w.replace("No --allow-flag-override", "")
    out = os.path.join(tmp, "runsc-fy")
    with open(out, "w") as fh:
        fh.write(w.replace("@RUNSC@", "/bin/echo").replace("@RUNSC_FLAGS@", "--ignore-cgroups --host-uds=all"))
    os.chmod(out, 0o755)
    r = subprocess.run([out, "--allow-flag-override", "create", "x"], capture_output=True, text=True)
    # the fixed flags come first, the caller's after: runsc reads its flags
    # before the subcommand, so nothing the caller adds can precede them
    assert r.stdout.split() == ["--ignore-cgroups", "--host-uds=all", "--allow-flag-override", "create", "x"]
    conf = open(os.path.join(prov, "runsc.conf.in")).read()
    assert 'runtime = "runsc-fy"' in conf and "@RUNSC_FY@" in conf
    # podman >= 5's platform table (wasi/wasm -> crun-wasm) is sent to runsc-fy
    table = conf.split("[engine.platform_to_oci_runtime]", 1)[1]
    for plat in ("wasi/wasm", "wasi/wasm32", "wasi/wasm64"):
        assert '"%s" = "runsc-fy"' % plat in table, plat
    unit = open(os.path.join(prov, "podman-runsc-filter.service.in")).read()
    assert "podman-runsc.sock %t/podman/podman-runsc-filtered.sock" in unit


def main():
    if not BIN or not os.path.exists(BIN):
        print("FY_SOCKFILTER is not set to the built binary")
        return 1
    tmp = tempfile.mkdtemp(prefix="fy-sf-%d-" % os.getpid())
    up = Upstream(os.path.join(tmp, "engine.sock"))
    f = Filter(tmp, up.path)
    failed = 0
    only = sys.argv[1:]
    try:
        tests = [(n, fn) for n, fn in globals().items() if n.startswith("t_") and (not only or n in only)]
        for name, fn in tests:
            up.reset()
            try:
                if fn.__code__.co_varnames[0] == "tmp":
                    fn(tmp, up)
                else:
                    fn(f, up)
                print("ok   %s" % name)
            except Exception:
                failed += 1
                print("FAIL %s" % name)
                traceback.print_exc()
        rc = f.stop()
        if rc != 0:
            print("FAIL fy-sockfilter exited %s on SIGTERM: %s" % (rc, f.proc.stderr.read().decode()[-2000:]))
            failed += 1
    finally:
        if f.proc.poll() is None:
            f.proc.kill()
        up.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

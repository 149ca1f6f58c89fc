"""fy-sockfilter on real unix sockets, judged by the Go oracle (oracle/oracle.go):
what reached the engine is decoded as podman 4.3, 5.8 and 6.0 decode create
bodies (encoding/json, json-iterator, podman's real field sets) and read as
net/http's server reads a connection (ReadRequest, each body to its end).

  - keys: every spelling Go's case mapping binds to oci_runtime, annotations,
    HostConfig, HostConfig.Runtime or HostConfig.Annotations, in both families;
    nothing the oracle binds to a protected field reaches the engine, and a
    non-ASCII key no decoder binds is forwarded (podman accepts it);
  - trailers: a chunked request with a trailer field is refused (a create) or
    never ended (a streamed body); no trailer reaches the engine;
  - framing: every connection's bytes, as the engine received them, read by
    net/http as exactly the requests the client sent (method, target, body),
    with no trailer, no extension, nothing left over.

Exits 77 (skip) when the oracle was not built (Go not installed)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recording_upstream import Upstream  # noqa: E402
from test_sockfilter import BIN, Filter, Reader, exchange, req, wait_requests  # noqa: E402

ORACLE = os.environ.get("FY_SOCKFILTER_ORACLE", "")


class Oracle:
    def __init__(self, path):
        self.p = subprocess.Popen([path, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, kind, payload):
        self.p.stdin.write(kind + struct.pack(">I", len(payload)) + payload)
        self.p.stdin.flush()
        n, = struct.unpack(">I", self.p.stdout.read(4))
        a = json.loads(self.p.stdout.read(n))
        if kind == b"H":  # bytes come in hex; here as latin-1 text
            a["rest"] = bytes.fromhex(a["rest_hex"]).decode("latin-1")
            for r in a["requests"]:
                r["target"] = bytes.fromhex(r["target_hex"]).decode("latin-1")
                r["body"] = bytes.fromhex(r["body_hex"]).decode("latin-1")
        return a

    def protected(self, family, body):
        """The protected fields some podman binds in `body`: a list of
        '<engine>: <what>' strings, empty when none (or when every engine
        that would bind refuses the body)."""
        found = []
        for v in self.ask(b"L" if family == "libpod" else b"C", body)["views"]:
            if v["error"] is not None:
                continue
            if v["runtime"] is not None:
                found.append("%s: runtime=%s" % (v["engine"], v["runtime"]))
            for k in v["annotations"] or {}:
                lk = k.lower()
                if lk.startswith("dev.gvisor.") or lk in (
                        "io.kubernetes.cri.sandbox-id", "io.kubernetes.cri.container-type",
                        "io.kubernetes.cri-o.sandboxid", "io.kubernetes.cri-o.containertype"):
                    found.append("%s: annotation %s" % (v["engine"], k))
        return found

    def close(self):
        self.p.stdin.close()
        self.p.wait(5)


I = "\u0130"       # LATIN CAPITAL LETTER I WITH DOT ABOVE: json-iterator's ToLower gives 'i'
LONG_S = "\u017f"  # LATIN SMALL LETTER LONG S: encoding/json folds it to 's'
KELVIN = "\u212a"  # KELVIN SIGN: both give 'k'
ANN = {"dev.gvisor.spec.rootfs.source": "/", "io.kubernetes.cri.sandbox-id": "x", "keep.me": "1"}


def spellings(name):
    """The protected name with each letter, in turn, replaced by each rune Go
    maps onto it (the three above), plus every letter at once."""
    subs = {"i": [I], "s": [LONG_S], "k": [KELVIN]}
    out = []
    for i, ch in enumerate(name):
        for r in subs.get(ch.lower(), []):
            out.append(name[:i] + r + name[i + 1:])
    out.append("".join(subs.get(ch.lower(), [ch])[0] for ch in name))
    return out


def key_cases():
    cases = []
    for k in spellings("oci_runtime"):
        cases.append(("libpod", "/v4.0.0/libpod/containers/create", {"image": "bb", k: "crun"}))
    for k in spellings("annotations"):
        cases.append(("libpod", "/v4.0.0/libpod/containers/create", {"image": "bb", k: ANN}))
    for target in ("/v1.41/containers/create", "/containers/create"):
        for k in spellings("HostConfig"):
            cases.append(("compat", target, {"Image": "bb", k: {"Runtime": "crun", "Annotations": ANN}}))
        for k in spellings("Runtime"):
            cases.append(("compat", target, {"Image": "bb", "HostConfig": {k: "crun"}}))
        for k in spellings("Annotations"):
            cases.append(("compat", target, {"Image": "bb", "HostConfig": {k: ANN}}))
    return cases


def t_go_mapped_keys_never_reach_the_engine(f, up, o):
    bound_before = 0
    leaks = []
    for family, target, obj in key_cases():
        body = json.dumps(obj, ensure_ascii=False).encode()
        bound_before += bool(o.protected(family, body))
        up.reset()
        (st, _, text), = exchange(f, req("POST", target, body))
        assert st == 201, (st, text, body)
        rs = wait_requests(up, 1)
        assert len(rs) == 1, (body, rs)
        left = o.protected(family, rs[0].body)
        if left:
            leaks.append("%s %s reached the engine: %s" % (target, body.decode(), left))
    assert leaks == [], "\n".join(leaks)
    # The spellings are not idle: the engines bind most of them (those that
    # put a rune where its decoder maps no letter bind nowhere, and pass).
    assert bound_before >= len(key_cases()) // 2, bound_before


def t_non_ascii_keys_no_decoder_binds_are_forwarded(f, up, o):
    # U+0131 (dotless i) and U+00CD (I acute) map onto no ASCII letter in Go:
    # podman accepts these keys as unknown fields, and so does the filter.
    for k in ("oci_runt\u0131me", "annotat\u00cdons", "\u00e9tiquette"):
        body = json.dumps({"image": "bb", k: "x"}, ensure_ascii=False).encode()
        up.reset()
        (st, _, _), = exchange(f, req("POST", "/v4.0.0/libpod/containers/create", body))
        assert st == 201
        rs = wait_requests(up, 1)
        assert len(rs) == 1 and rs[0].body == body, rs


def chunked(target, pieces, end=b"0\r\n\r\n", extra_headers=b""):
    out = (b"POST " + target + b" HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n" + extra_headers
           + b"\r\n")
    for p in pieces:
        out += b"%x\r\n" % len(p) + p + b"\r\n"
    return out + end


def go_reads(o, up):
    """What net/http reads from each connection the engine accepted."""
    time.sleep(0.1)
    return [o.ask(b"H", bytes(raw)) for raw in list(up.raw) if raw]


def t_trailers_refused(f, up, o):
    body = b'{"image":"bb"}'
    head_like = (b"0\r\nPOST /v4.0.0/libpod/containers/create HTTP/1.1\r\nHost: d\r\n"
                 b"Content-Length: 30\r\n\r\n" + b'{"image":"bb","oci_runtime":"crun"}')
    for trailer in (b"0\r\nX-T: 1\r\n\r\n", b"0\r\nContent-Length: 5\r\n\r\n", head_like,
                    b"0\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n"):
        # A create: refused before anything reaches the engine.
        up.reset()
        s = f.connect()
        s.sendall(chunked(b"/v4.0.0/libpod/containers/create", [body], trailer))
        try:
            st, _, text = Reader(s).response()
        except (EOFError, ConnectionResetError):
            st, text = None, b""
        s.close()
        assert st == 400 and (b"trailer" in text or b"malformed" in text), (trailer, st, text)
        assert wait_requests(up, 1, 0.3) == [], trailer
        # A streamed body: its head and chunks are up already; the body never
        # ends for the engine, and no trailer or next request is read from it.
        up.reset()
        s = f.connect()
        s.sendall(chunked(b"/v4.0.0/libpod/images/load", [b"abc", b"defg"], trailer))
        s.settimeout(2)
        try:
            got = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            got = b""
        s.close()
        assert got == b"", (trailer, got)
        reads = go_reads(o, up)
        assert len(reads) == 1, reads
        rs = reads[0]["requests"]
        assert len(rs) == 1 and rs[0]["target"] == "/v4.0.0/libpod/images/load", reads
        assert rs[0]["trailer"] is None and rs[0]["body_error"], reads  # unexpected EOF
        assert reads[0]["rest"] == "", reads


def t_framing_read_by_net_http(f, up, o):
    """Each client stream through the filter; what the engine got, read by
    net/http, is the requests the client meant, and nothing else."""
    create = b'{"image":"bb","oci_runtime":"crun"}'
    cases = [
        # (client bytes, [(method, target, body)] the engine must read)
        (chunked(b"/v4.0.0/libpod/images/load", [b"abc", b"defgh"]),
         [("POST", "/v4.0.0/libpod/images/load", "abcdefgh")]),
        (b"POST /v4.0.0/libpod/images/load HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"3;ext=\"a\"\r\nabc\r\n2;x\r\nde\r\n0;last=1\r\n\r\n",
         [("POST", "/v4.0.0/libpod/images/load", "abcde")]),
        (chunked(b"/v4.0.0/libpod/containers/create", [create[:7], create[7:]]),
         [("POST", "/v4.0.0/libpod/containers/create", '{"image":"bb"}')]),
        (req("POST", "/v4.0.0/libpod/containers/create", create, headers=[("Expect", "100-continue")]),
         [("POST", "/v4.0.0/libpod/containers/create", '{"image":"bb"}')]),
        (req("GET", "/v4.0.0/libpod/_ping") + req("POST", "/v4.0.0/libpod/images/load", b"xyz")
         + req("GET", "/_ping"),
         [("GET", "/v4.0.0/libpod/_ping", ""), ("POST", "/v4.0.0/libpod/images/load", "xyz"),
          ("GET", "/_ping", "")]),
        (req("POST", "/v4.0.0/libpod/images/load", b"0\r\n\r\nGET / HTTP/1.1\r\n\r\n", version="HTTP/1.0"),
         [("POST", "/v4.0.0/libpod/images/load", "0\r\n\r\nGET / HTTP/1.1\r\n\r\n")]),
    ]
    for client, want in cases:
        up.reset()
        s = f.connect()
        s.sendall(client)
        r = Reader(s)
        for _ in want:
            st, _, _ = r.response()
            while st == 100:  # the filter answers Expect itself
                st, _, _ = r.response()
            assert st in (200, 201), (client, st)
        s.close()
        reads = go_reads(o, up)
        got = [(x["method"], x["target"], x["body"]) for rd in reads for x in rd["requests"]]
        assert got == want, (client, got)
        for rd in reads:
            assert rd["rest"] == "" and rd["error"] == "", (client, rd)
            for x in rd["requests"]:
                assert x["trailer"] is None and x["body_error"] == "", (client, x)
                assert len(x["transfer_encoding"] or []) + ("Content-Length" in x["header"]) <= 1


def main():
    if not BIN or not os.path.exists(BIN):
        print("FY_SOCKFILTER is not set to the built binary")
        return 1
    if not ORACLE or not os.access(ORACLE, os.X_OK):
        print("skipped: go is not installed (golang-go, golang-github-json-iterator-go-dev; "
              "scripts/install-deps), so the Go oracle was not built")
        return 77
    tmp = tempfile.mkdtemp(prefix="fy-sfo-%d-" % os.getpid())
    up = Upstream(os.path.join(tmp, "engine.sock"))
    f = Filter(tmp, up.path)
    o = Oracle(ORACLE)
    failed = 0
    only = sys.argv[1:]
    try:
        for name, fn in [(n, fn) for n, fn in globals().items() if n.startswith("t_")]:
            if only and name not in only:
                continue
            up.reset()
            try:
                fn(f, up, o)
                print("ok   %s" % name)
            except Exception:
                failed += 1
                print("FAIL %s" % name)
                traceback.print_exc()
        if f.stop() != 0:
            failed += 1
            print("FAIL fy-sockfilter did not stop cleanly")
    finally:
        if f.proc.poll() is None:
            f.proc.kill()
        o.close()
        up.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

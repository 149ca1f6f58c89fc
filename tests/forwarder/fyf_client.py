#!/usr/bin/env python3
"""A raw TCP client for the forwarder tests, run inside a namespace.

It can first put itself where a test needs it to be: into a cgroup
(--cgroup, writes its pid to cgroup.procs), under another name (--comm, via
prctl: a "pasta" helper), as another uid (--uid, after the cgroup move). Then
it makes --count connections, each sending the same bytes, and prints one JSON
line per connection:

  {"ok": true, "status": 200, "response": "...", "elapsed_ms": 1.2, "local": "ip:port"}
  {"ok": false, "error": "ECONNREFUSED", "elapsed_ms": 0.1}

--until length: read the response head and Content-Length bytes, then close
first; --until eof (default): read until the server side closes.
--cuts 10,40 --gap-ms 50: send the bytes in pieces cut at those offsets, each
its own segment, with a pause between.
--delay-read-ms N: wait N ms after sending before reading the answer.
--bind ADDR: connect from this source address (one the namespace holds).
--shut-after-ms N: half-close (shutdown SHUT_WR) N ms after sending, then read
on. --upload-after-eof N: once the server side has closed, send N more bytes
(the server may still read), then close.
"""

import argparse
import base64
import ctypes
import errno
import json
import os
import socket
import sys
import time


def exchange(host, port, data, timeout, until, hold_ms, shut_after_ms=None, upload=0, cuts=(),
             gap_ms=0, delay_read_ms=0, bind=None):
    t0 = time.monotonic()
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(timeout)
    out = {}
    try:
        if bind:
            s.bind((bind, 0))
        s.connect((host, port))
        out["local"] = "%s:%d" % s.getsockname()[:2]
        if data and cuts:
            # Each piece its own segment: TCP_NODELAY, and a pause between.
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            at = 0
            for cut in list(cuts) + [len(data)]:
                s.sendall(data[at:cut])
                at = cut
                if at < len(data):
                    time.sleep(gap_ms / 1000.0)
        elif data:
            s.sendall(data)
        if shut_after_ms is not None:
            time.sleep(shut_after_ms / 1000.0)
            s.shutdown(socket.SHUT_WR)
            out["shut"] = True
        if delay_read_ms:
            time.sleep(delay_read_ms / 1000.0)
        buf = b""
        need = None
        while True:
            if until == "length" and need is not None and len(buf) >= need:
                break
            chunk = s.recv(1 << 20)
            if not chunk:
                out["eof"] = True
                break
            buf += chunk
            if until == "length" and need is None and b"\r\n\r\n" in buf:
                head = buf[:buf.index(b"\r\n\r\n") + 4].decode("latin-1")
                length = 0
                for line in head.split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                need = len(head) + length
        if upload and out.get("eof"):
            s.sendall(b"u" * upload)
            out["uploaded"] = upload
        if hold_ms:
            time.sleep(hold_ms / 1000.0)
        out["ok"] = True
        text = buf.decode("latin-1")
        out["bytes"] = len(buf)
        out["response"] = text[:65536]
        if text.startswith("HTTP/"):
            out["status"] = int(text.split(" ", 2)[1])
    except OSError as e:
        out["ok"] = False
        out["error"] = errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
    finally:
        s.close()
    out["elapsed_ms"] = round((time.monotonic() - t0) * 1000, 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True, help="host:port")
    ap.add_argument("--send-b64", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--until", choices=["eof", "length"], default="eof")
    ap.add_argument("--hold-ms", type=int, default=0, help="wait before closing")
    ap.add_argument("--shut-after-ms", type=int, help="half-close this long after sending")
    ap.add_argument("--upload-after-eof", type=int, default=0,
                    help="after the server's EOF, send this many bytes before closing")
    ap.add_argument("--cuts", default="", help="offsets to cut the bytes at (comma-separated)")
    ap.add_argument("--gap-ms", type=int, default=50)
    ap.add_argument("--delay-read-ms", type=int, default=0, help="wait before reading the answer")
    ap.add_argument("--bind", help="source address to connect from")
    ap.add_argument("--cgroup")
    ap.add_argument("--comm")
    ap.add_argument("--uid", type=int)
    a = ap.parse_args()
    if a.cgroup:
        with open(os.path.join(a.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if a.comm:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, a.comm.encode(), 0, 0, 0)  # PR_SET_NAME
    if a.uid is not None:
        os.setgroups([])
        os.setgid(a.uid)
        os.setuid(a.uid)
    host, _, port = a.connect.rpartition(":")
    data = base64.b64decode(a.send_b64) if a.send_b64 else b""
    for _ in range(a.count):
        print(json.dumps(exchange(host.strip("[]"), int(port), data, a.timeout, a.until,
                                  a.hold_ms, a.shut_after_ms, a.upload_after_eof,
                                  [int(c) for c in a.cuts.split(",") if c], a.gap_ms,
                                  a.delay_read_ms, a.bind)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

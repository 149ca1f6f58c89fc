#!/usr/bin/env python3
"""A recording stand-in for fy-proxy in the forwarder tests (not the real proxy).

It does what the tests need the proxy role to do, and records it:
  - reads each connection's first request head; finds every Fy-Stamp header;
    verifies the stamp with its own HMAC (fyf_stamp.py) and a replay guard, as
    fy-proxy must: exactly one valid, never-seen stamp is "valid"; anything
    else is recorded as unattributed with the reason;
  - strips every stamp header and forwards to the origin: CONNECT host:port
    (200, then a byte relay) or absolute-form (rewritten to origin-form);
  - built-in targets for the close tests: http://close-first.test/ answers
    itself and closes first; http://client-first.test/ answers and waits for
    the client to close first; http://close-after.test/<ms> waits <ms> after
    the head, then answers (Connection: close) and closes;
    http://half-close.test/<ms> answers (Connection: close) and half-closes at
    once, reads nothing for <ms>, then reads what the client still sends,
    slowly (64 KiB every 10 ms), and records it as a second row
    {"upload_of": target, "upload_bytes": n, "upload_end": "eof"|"reset"};
    http://reset-after.test/<ms> answers and half-closes the same way, reads
    nothing for <ms>, then resets the connection (SO_LINGER {1,0}) and records
    {"reset_of": target}.
One JSON line per connection goes to --log (flushed at once). With
--cpp-verifier (fyf-stamp-tool), every stamp is also judged by the C++
verify() and ReplayGuard of core/stamp.h, recorded as "cpp_status"; the two
verdicts must agree.

    recording_proxy.py --listen 192.168.5.2:42600 --key FILE --log FILE
                       [--cpp-verifier build/tests/forwarder/fyf-stamp-tool]
"""

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fyf_stamp  # noqa: E402

lock = threading.Lock()
guard = fyf_stamp.ReplayGuard()
cpp = None  # a running `fyf-stamp-tool serve`, used under `lock`


def cpp_judge(value):
    cpp.stdin.write(value + "\n")
    cpp.stdin.flush()
    answer = cpp.stdout.readline().strip()
    verdict, _, rest = answer.partition(" ")
    if verdict in ("valid", "replayed"):
        return verdict, json.loads(rest)
    return "invalid: " + rest, None


def read_head(sock, limit=65536):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, data
        data += chunk
        if len(data) > limit:
            return None, data
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def relay(a, b):
    def pump(src, dst):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                dst.sendall(d)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    t = threading.Thread(target=pump, args=(b, a), daemon=True)
    t.start()
    pump(a, b)
    t.join(30)


def handle(conn, peer, key, logf, conn_no):
    conn.settimeout(30)
    row = {"conn": conn_no, "peer": "%s:%d" % peer[:2], "t": time.time()}
    try:
        head, rest = read_head(conn)
        if head is None:
            row["error"] = "no complete head"
            return
        text = head.decode("latin-1")
        lines = text.split("\r\n")[:-2]
        method, target, version = lines[0].split(" ")
        row.update(method=method, target=target, version=version)
        stamps, kept, names = [], [lines[0]], []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            names.append(name)
            if name.strip().lower() == "fy-stamp":
                stamps.append(value.strip())
            else:
                kept.append(line)
                if name.lower() == "proxy-authorization":
                    row["proxy_authorization"] = value.strip()
        row["header_names"] = names
        row["stamp_headers"] = len(stamps)
        if len(stamps) == 1:
            row["stamp_raw"] = stamps[0]
            try:
                f = fyf_stamp.verify(stamps[0], key)
                with lock:
                    fresh = guard.accept(f["boot"], f["seq"])
                row["stamp"] = f
                row["stamp_status"] = "valid" if fresh else "replayed"
            except fyf_stamp.StampError as e:
                row["stamp_status"] = "invalid: %s" % e
            if cpp is not None:
                with lock:
                    row["cpp_status"], cpp_fields = cpp_judge(stamps[0])
                py_verdict = row["stamp_status"].split(":")[0]
                if (row["cpp_status"].split(":")[0] != py_verdict or
                        (cpp_fields is not None and cpp_fields != row.get("stamp"))):
                    row["cpp_mismatch"] = [row["cpp_status"], cpp_fields]
        else:
            row["stamp_status"] = "none" if not stamps else "multiple"
        if row["stamp_status"] != "valid":
            row.pop("stamp", None)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            write_row(logf, row)  # before the answer: a client that has it finds the row
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                up.sendall(rest)
            relay(conn, up)
            up.close()
            return
        # absolute-form
        scheme, _, after = target.partition("://")
        authority, slash, path = after.partition("/")
        path = slash + path if slash else "/"
        host, _, port = authority.partition(":")
        if host == "close-first.test":
            write_row(logf, row)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n"
                         b"close-first")
            conn.close()  # the proxy side closes first
            return
        if host == "close-after.test":
            write_row(logf, row)
            time.sleep(int(path.strip("/") or "0") / 1000.0)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n"
                         b"close-after")
            conn.close()  # the proxy side closes first
            return
        if host == "half-close.test":
            write_row(logf, row)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
                         b"half-close")
            conn.shutdown(socket.SHUT_WR)  # the proxy side finishes first, and reads on
            time.sleep(int(path.strip("/") or "0") / 1000.0)
            got, end = len(rest), "timeout"
            try:
                while True:
                    d = conn.recv(65536)
                    if not d:
                        end = "eof"
                        break
                    got += len(d)
                    time.sleep(0.01)
            except ConnectionResetError:
                end = "reset"
            except OSError as e:
                end = repr(e)
            write_row(logf, {"conn": conn_no, "upload_of": target, "upload_bytes": got,
                             "upload_end": end})
            return
        if host == "reset-after.test":
            write_row(logf, row)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n"
                         b"reset-after")
            conn.shutdown(socket.SHUT_WR)
            time.sleep(int(path.strip("/") or "0") / 1000.0)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            write_row(logf, {"conn": conn_no, "reset_of": target})
            return
        if host == "client-first.test":
            write_row(logf, row)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nclient-first")
            while conn.recv(65536):
                pass  # until the client's FIN
            conn.close()
            return
        up = socket.create_connection((host, int(port or 80)), timeout=10)
        fwd = ["%s %s %s" % (method, path, version)]
        fwd += [l for l in kept[1:] if not l.lower().startswith("proxy-")]
        up.sendall(("\r\n".join(fwd) + "\r\n\r\n").encode("latin-1") + rest)
        write_row(logf, row)
        relay(conn, up)
        up.close()
    except Exception as e:  # recorded, never fatal for the stand-in
        row["error"] = repr(e)
        write_row(logf, row)
    finally:
        try:
            conn.close()
        except OSError:
            pass


def write_row(logf, row):
    if row.get("_written"):
        return
    row["_written"] = True
    out = {k: v for k, v in row.items() if k != "_written"}
    with lock:
        logf.write(json.dumps(out) + "\n")
        logf.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--key", required=True, help="the stamp key file (64 hex)")
    ap.add_argument("--log", required=True)
    ap.add_argument("--cpp-verifier", help="fyf-stamp-tool, to judge with core/stamp.cc too")
    a = ap.parse_args()
    key = bytes.fromhex(open(a.key).read().strip())
    global cpp
    if a.cpp_verifier:
        import subprocess
        cpp = subprocess.Popen([a.cpp_verifier, "serve", key.hex()], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    host, _, port = a.listen.rpartition(":")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(1024)
    logf = open(a.log, "a")
    n = 0
    while True:
        conn, peer = srv.accept()
        n += 1
        threading.Thread(target=handle, args=(conn, peer, key, logf, n), daemon=True).start()


if __name__ == "__main__":
    main()

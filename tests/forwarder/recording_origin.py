#!/usr/bin/env python3
"""An origin server for the forwarder tests: answers every request with
"origin ok <path>" (or, for /big/<n>, n bytes) and records each request's head
(one JSON line per request), so a test can check that no stamp ever reaches an
origin.

    recording_origin.py --listen 198.51.100.80:80 --log FILE
"""

import argparse
import json
import socket
import threading


def handle(conn, logf, lock):
    conn.settimeout(30)
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                d = conn.recv(65536)
                if not d:
                    return
                buf += d
            end = buf.index(b"\r\n\r\n") + 4
            head, buf = buf[:end].decode("latin-1"), buf[end:]
            lines = head.split("\r\n")[:-2]
            headers = [l.partition(":")[0] for l in lines[1:]]
            raw = [l for l in lines[1:]]
            with lock:
                logf.write(json.dumps({"request_line": lines[0], "header_names": headers,
                                       "headers": raw}) + "\n")
                logf.flush()
            path = lines[0].split(" ")[1] if " " in lines[0] else "?"
            if path.startswith("/big/"):
                # /big/<n>: n bytes, for relaying and throughput tests.
                n = int(path[5:])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                block = bytes(range(256)) * 4096
                while n > 0:
                    conn.sendall(block[:min(n, len(block))])
                    n -= min(n, len(block))
                continue
            body = ("origin ok %s" % path).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            if any(l.lower() == "connection: close" for l in raw):
                return
    except OSError:
        pass
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(1024)
    logf = open(a.log, "a")
    lock = threading.Lock()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn, logf, lock), daemon=True).start()


if __name__ == "__main__":
    main()

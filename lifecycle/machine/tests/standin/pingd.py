#!/usr/bin/python3
# A stand-in for the engine socket lima or podman machine forwards: "ok"
# answers GET /_ping with 200 OK (as libpod does), "wedged" accepts and never
# answers, "dead" leaves a socket file nobody listens on. Used only by the
# limactl/podman stand-ins; the real socket contract is test_socket.py's.
import os, socket, sys, threading, time

mode, path = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
if mode == "dead":
    sys.exit(0)  # the file stays; nobody listens
s.listen(16)
held = []

def serve(c):
    try:
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(4096)
            if not d:
                return
            buf += d
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
                  b"Connection: close\r\n\r\nOK")
    finally:
        c.close()

while True:
    c, _ = s.accept()
    if mode == "wedged":
        held.append(c)
        continue
    threading.Thread(target=serve, args=(c,), daemon=True).start()

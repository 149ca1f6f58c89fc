#!/usr/bin/python3
"""A deputy for fy-wall's escape proofs: a process of another uid (or of the
guest agent's cgroup) that dials for whoever reaches it, as Lima's guest
agent's Tunnel call, a local SOCKS relay or a caching resolver do.

    deputy.py NAME LISTEN   LISTEN = tcp:ADDR:PORT | unix:PATH | unix:@NAME

Prints "READY", then for each client: reads one line "HOST PORT", connects
to HOST:PORT itself (TCP, 2 s), and answers "relayed <the target's first
line>" or "relay-failed <errno name>". Records one line per request on
stdout: "relay HOST:PORT ok|<errno>".
"""
import errno
import os
import socket
import sys
import threading


def serve(conn):
    with conn:
        try:
            conn.settimeout(5)
            req = conn.makefile().readline().split()
            host, port = req[0], int(req[1])
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(fam, socket.SOCK_STREAM) as out:
                out.settimeout(2)
                try:
                    out.connect((host, port))
                    line = out.recv(4096).decode(errors="replace").strip()
                    conn.sendall(f"relayed {line}\n".encode())
                    print(f"relay {host}:{port} ok", flush=True)
                except OSError as e:
                    name = errno.errorcode.get(e.errno, "timeout") if e.errno else "timeout"
                    conn.sendall(f"relay-failed {name}\n".encode())
                    print(f"relay {host}:{port} {name}", flush=True)
        except (OSError, IndexError, ValueError):
            pass


def main():
    kind, rest = sys.argv[2].split(":", 1)
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("\0" + rest[1:] if rest.startswith("@") else rest)
    else:
        host, port = rest.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
    s.listen(16)
    print("READY", flush=True)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()

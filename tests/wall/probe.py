#!/usr/bin/python3
"""One connection attempt, as a client of fy-wall's proofs sees it.

    probe.py KIND HOST PORT [--timeout S] [--bind-dev DEV] [--bind-port P]
             [--payload TEXT]

KIND: tcp, udp (IPv4 or IPv6 by the address), tcp-mapped (an AF_INET6 socket
to ::ffff:HOST), tcp-fastopen (data in the SYN), udp-broadcast, icmp (an
unprivileged ping socket), raw (a SOCK_RAW socket), packet (an AF_PACKET
socket), hold (connect, print, then wait for a line on stdin before sending).

Prints one JSON object: {"outcome": ok|refused|reset|unreachable|eperm|
timeout|error, "stage": socket|bind|connect|send|recv, "errno": NAME,
"reply": first line received, "ms": elapsed}. "refused" is ECONNREFUSED (a
TCP reset to the SYN, or an ICMP port unreachable); "unreachable" is
EHOSTUNREACH/ENETUNREACH/EACCES from an ICMP error; "eperm" is the kernel
refusing the send itself.
"""
import argparse
import errno
import json
import socket
import struct
import sys
import time

OUTCOMES = {
    errno.ECONNREFUSED: "refused",
    errno.ECONNRESET: "reset",
    errno.EPIPE: "reset",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
    errno.EACCES: "unreachable",
    errno.EPERM: "eperm",
    errno.ETIMEDOUT: "timeout",
}


class Result(Exception):
    pass


def finish(outcome, stage, err=None, reply="", t0=0.0):
    print(json.dumps({
        "outcome": outcome,
        "stage": stage,
        "errno": errno.errorcode.get(err, str(err)) if err else "",
        "reply": reply,
        "ms": round((time.monotonic() - t0) * 1000, 1),
    }), flush=True)
    sys.exit(0)


def attempt(stage, fn, t0):
    try:
        return fn()
    except socket.timeout:
        finish("timeout", stage, t0=t0)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EINPROGRESS):
            finish("timeout", stage, e.errno, t0=t0)
        finish(OUTCOMES.get(e.errno, "error"), stage, e.errno, t0=t0)


def read_line(s, t0):
    data = attempt("recv", lambda: s.recv(4096), t0)
    if not data:
        finish("reset", "recv", t0=t0)
    return data.decode(errors="replace").strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--bind-dev", default="")
    ap.add_argument("--bind-port", type=int, default=0)
    ap.add_argument("--sockopt", default="", choices=["", "mark", "transparent", "freebind"])
    ap.add_argument("--payload", default="ping")
    a = ap.parse_args()
    t0 = time.monotonic()
    kind, host, port = a.kind, a.host, a.port
    v6 = ":" in host
    fam = socket.AF_INET6 if v6 else socket.AF_INET

    if kind == "raw":
        attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW,
                                                 socket.IPPROTO_TCP), t0)
        finish("ok", "socket", t0=t0)
    if kind == "packet":
        attempt("socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW), t0)
        finish("ok", "socket", t0=t0)

    if kind in ("tcp", "tcp-mapped", "tcp-fastopen", "hold"):
        if kind == "tcp-mapped":
            fam, host = socket.AF_INET6, "::ffff:" + host
        s = attempt("socket", lambda: socket.socket(fam, socket.SOCK_STREAM), t0)
        s.settimeout(a.timeout)
        if a.bind_dev:
            attempt("bind", lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE,
                                                 a.bind_dev.encode()), t0)
        if a.sockopt == "mark":  # route or match by fwmark: needs CAP_NET_ADMIN
            attempt("setsockopt", lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 1), t0)
        if a.sockopt == "transparent":  # send from a foreign address
            attempt("setsockopt", lambda: s.setsockopt(socket.SOL_IP, 19, 1), t0)
        if a.bind_port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            attempt("bind", lambda: s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0",
                                            a.bind_port)), t0)
        if kind == "tcp-fastopen":
            s.setblocking(True)  # a timeout makes the socket non-blocking: EINPROGRESS
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                         struct.pack("ll", int(a.timeout), 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                         struct.pack("ll", int(a.timeout), 0))
            attempt("connect", lambda: s.sendto(a.payload.encode(), socket.MSG_FASTOPEN,
                                                (host, port)), t0)
        else:
            attempt("connect", lambda: s.connect((host, port)), t0)
        if kind == "hold":
            banner = read_line(s, t0)
            print(json.dumps({"outcome": "connected", "reply": banner}), flush=True)
            sys.stdin.readline()
            t0 = time.monotonic()
            attempt("send", lambda: s.sendall(a.payload.encode()), t0)
            # The peer answers nothing more: a reset shows as ECONNRESET (or
            # EOF), a timeout means the data went out and nothing came back.
            data = attempt("recv", lambda: s.recv(4096), t0)
            finish("ok" if data else "reset", "recv", reply=(data or b"").decode(), t0=t0)
        reply = read_line(s, t0)
        finish("ok", "recv", reply=reply, t0=t0)

    if kind in ("udp", "udp-broadcast"):
        s = attempt("socket", lambda: socket.socket(fam, socket.SOCK_DGRAM), t0)
        s.settimeout(a.timeout)
        if kind == "udp-broadcast":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        if a.bind_dev:
            attempt("bind", lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE,
                                                 a.bind_dev.encode()), t0)
        if a.bind_port:
            attempt("bind", lambda: s.bind(("::" if v6 else "0.0.0.0", a.bind_port)), t0)
        attempt("connect", lambda: s.connect((host, port)), t0)
        attempt("send", lambda: s.send(a.payload.encode()), t0)
        reply = read_line(s, t0)
        finish("ok", "recv", reply=reply, t0=t0)

    if kind == "icmp":
        s = attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM,
                                                     socket.IPPROTO_ICMP), t0)
        s.settimeout(a.timeout)
        echo = bytes([8, 0, 0, 0, 0, 0, 0, 1]) + b"fy"
        attempt("send", lambda: s.sendto(echo, (host, 0)), t0)
        data = attempt("recv", lambda: s.recv(4096), t0)
        finish("ok" if data and data[0] == 0 else "error", "recv", t0=t0)

    finish("error", "usage", t0=t0)


if __name__ == "__main__":
    main()

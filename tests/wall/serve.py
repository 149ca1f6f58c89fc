#!/usr/bin/python3
"""Listeners for fy-wall's namespace proofs.

    serve.py NAME SPEC...     SPEC = KIND:ADDR:PORT, KIND = tcp | udp | fwd | hold
                              (ADDR may be an IPv6 literal in brackets)

Binds every SPEC, prints "READY" on stdout, then serves until killed. Every
TCP connection accepted and every UDP datagram received is answered with one
line naming this listener, and recorded as one line on stdout:

    accept tcp 203.0.113.10:443 from 192.168.5.15:40312
    recv udp 203.0.113.10:53 from 192.168.5.15:51234

`fwd` is a TCP listener standing in for the forwarder: its answer and its
record also carry the connection's original destination (SO_ORIGINAL_DST),
which is what the real forwarder reads to keep the port. `hold` answers as
tcp does, then keeps the connection open and records what arrives on it:

    data hold 192.168.5.2:41000 from 192.168.5.15:40312 b'after'
"""
import selectors
import socket
import struct
import sys

SO_ORIGINAL_DST = 80


def parse(spec):
    kind, rest = spec.split(":", 1)
    host, port = rest.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return kind, family, host, int(port)


def fmt(addr):
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def original_dst(conn):
    try:
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:
        return "none"
    port, ip = struct.unpack("!2xH4s8x", raw)
    return f"{socket.inet_ntoa(ip)}:{port}"


def main():
    name = sys.argv[1]
    sel = selectors.DefaultSelector()
    for spec in sys.argv[2:]:
        kind, family, host, port = parse(spec)
        stype = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
        s = socket.socket(family, stype)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, port))
        if stype == socket.SOCK_STREAM:
            s.listen(128)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, kind)
    print("READY", flush=True)
    while True:
        for key, _ in sel.select():
            s, kind = key.fileobj, key.data
            if kind == "held":
                try:
                    more = s.recv(4096)
                except OSError as e:
                    more = b""
                    print(f"error held {e.errno}", flush=True)
                if more:
                    print(f"data hold {fmt(s.getsockname())} from {fmt(s.getpeername())} "
                          f"{more!r}", flush=True)
                else:
                    sel.unregister(s)
                    s.close()
                continue
            local = fmt(s.getsockname())
            try:
                if kind == "udp":
                    data, peer = s.recvfrom(65535)
                    print(f"recv udp {local} from {fmt(peer)}", flush=True)
                    s.sendto(f"{name} udp {local}\n".encode(), peer)
                    continue
                conn, peer = s.accept()
            except OSError:
                continue
            if kind == "hold":
                print(f"accept hold {local} from {fmt(peer)}", flush=True)
                try:
                    conn.sendall(f"{name} tcp {local}\n".encode())
                except OSError:
                    pass
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, "held")
                continue
            with conn:
                line = f"{name} tcp {local}"
                rec = f"accept {kind} {local} from {fmt(peer)}"
                if kind == "fwd":
                    orig = original_dst(conn)
                    line += f" orig={orig}"
                    rec += f" orig={orig}"
                print(rec, flush=True)
                try:
                    conn.sendall((line + "\n").encode())
                    # Hold the connection briefly so a client's later send is
                    # seen by the kernel while the socket still exists.
                    conn.settimeout(0.2)
                    try:
                        more = conn.recv(4096)
                        if more:
                            print(f"data {kind} {local} from {fmt(peer)} {more!r}", flush=True)
                    except OSError:
                        pass
                except OSError:
                    pass


if __name__ == "__main__":
    main()

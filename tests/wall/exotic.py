#!/usr/bin/python3
"""Attempts probe.py does not make: other socket families, socket options and
deputies, for docs/wall-escapes.md's rows 52 on.

    exotic.py KIND ARG... [--timeout S]

Prints one JSON object as probe.py does: {"outcome": ok|refused|reset|
unreachable|eperm|timeout|unsupported|error, "stage", "errno", "reply",
...}. "unsupported" is EAFNOSUPPORT/EPROTONOSUPPORT/ESOCKTNOSUPPORT/ENODEV
(no such family or transport in this kernel). KINDs:

  family AF TYPE [PROTO]    socket(AF, TYPE, PROTO) only
  sweep                     socket() for AF 1-45 x STREAM, DGRAM, SEQPACKET,
                            RAW; "reply" lists "AF/TYPE" pairs that succeeded
  vsock CID PORT            connect an AF_VSOCK stream socket
  ask LISTEN HOST PORT      connect to a deputy (tcp:ADDR:PORT, unix:PATH,
                            unix:@NAME), ask it for HOST PORT, read its answer
  mptcp HOST PORT           an IPPROTO_MPTCP connection
  udplite HOST PORT         one UDP-Lite datagram
  sctp HOST PORT            an SCTP one-to-one connection
  lsrr HOP HOST PORT        a UDP datagram to HOST with IP_OPTIONS loose
                            source route [HOP]: the header's destination is HOP
  freebind SRC HOST PORT    IP_FREEBIND, bind SRC, send a UDP datagram
  gso HOST PORT             one UDP_SEGMENT (GSO) send of 4 segments
  frag HOST PORT            one 3000-byte UDP datagram (fragments, DF off)
  tos HOST PORT             IP_TOS 0xb8 and IP_TTL 3 set, one UDP datagram
  bindpriv PORT             bind TCP 0.0.0.0:PORT
  join GROUP                join an IPv4 multicast group (the kernel reports it)
  tun NODE DEV SRC DST DPORT  write one UDP packet into the tun device DEV,
                            opened through the device node NODE
  packet DEV DSTMAC SRC DST DPORT   one Ethernet frame with a UDP packet on an
                            AF_PACKET socket (needs CAP_NET_RAW)
  uring HOST PORT           (io_uring is not reachable from Python: reports
                            "unsupported", stage "probe")
"""
import errno
import json
import socket
import struct
import sys
import time

OUT = {
    errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset", errno.EPIPE: "reset",
    errno.EHOSTUNREACH: "unreachable", errno.ENETUNREACH: "unreachable",
    errno.EACCES: "unreachable", errno.EPERM: "eperm", errno.ETIMEDOUT: "timeout",
    errno.EAFNOSUPPORT: "unsupported", errno.EPROTONOSUPPORT: "unsupported",
    errno.ESOCKTNOSUPPORT: "unsupported", errno.ENODEV: "unsupported",
    errno.EOPNOTSUPP: "unsupported", errno.EINVAL: "einval",
    errno.EADDRNOTAVAIL: "unavailable",
}
T0 = time.monotonic()
TIMEOUT = 2.0


def finish(outcome, stage, err=None, reply="", **more):
    print(json.dumps({"outcome": outcome, "stage": stage,
                      "errno": errno.errorcode.get(err, str(err)) if err else "",
                      "reply": reply, "ms": round((time.monotonic() - T0) * 1000, 1),
                      **more}), flush=True)
    sys.exit(0)


def attempt(stage, fn):
    try:
        return fn()
    except socket.timeout:
        finish("timeout", stage)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EINPROGRESS):
            finish("timeout", stage, e.errno)
        finish(OUT.get(e.errno, "error"), stage, e.errno)


def recv_line(s):
    data = attempt("recv", lambda: s.recv(4096))
    if not data:
        finish("reset", "recv")
    finish("ok", "recv", reply=data.decode(errors="replace").strip())


def udp(host, port, fam=socket.AF_INET, proto=0):
    s = attempt("socket", lambda: socket.socket(fam, socket.SOCK_DGRAM, proto))
    s.settimeout(TIMEOUT)
    return s


def csum(b):
    b += b"\0" * (len(b) % 2)
    v = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    v = (v >> 16) + (v & 0xFFFF)
    return ~(v + (v >> 16)) & 0xFFFF


def ipv4_udp(src, dst, dport, payload=b"fy-exotic"):
    udp_h = struct.pack("!HHHH", 40999, dport, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp_h), 0, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return ip + udp_h


def main():
    global TIMEOUT
    args = sys.argv[1:]
    if "--timeout" in args:
        i = args.index("--timeout")
        TIMEOUT = float(args[i + 1])
        del args[i:i + 2]
    kind, a = args[0], args[1:]

    if kind == "family":
        proto = int(a[2]) if len(a) > 2 else 0
        attempt("socket", lambda: socket.socket(int(a[0]), int(a[1]), proto)).close()
        finish("ok", "socket")
    if kind == "sweep":
        ok = []
        for af in range(1, 46):
            for ty in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET,
                       socket.SOCK_RAW):
                try:
                    socket.socket(af, ty).close()
                    ok.append(f"{af}/{ty}")
                except OSError:
                    pass
        finish("ok", "socket", reply=" ".join(ok))
    if kind == "vsock":
        s = attempt("socket", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))
        s.settimeout(TIMEOUT)
        attempt("connect", lambda: s.connect((int(a[0]), int(a[1]))))
        recv_line(s)
    if kind == "ask":
        k, rest = a[0].split(":", 1)
        if k == "unix":
            s = attempt("socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            where = "\0" + rest[1:] if rest.startswith("@") else rest
        else:
            h, p = rest.rsplit(":", 1)
            s = attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            where = (h, int(p))
        s.settimeout(TIMEOUT + 3)
        attempt("connect", lambda: s.connect(where))
        attempt("send", lambda: s.sendall(f"{a[1]} {a[2]}\n".encode()))
        recv_line(s)
    if kind == "mptcp":
        s = attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262))
        s.settimeout(TIMEOUT)
        attempt("connect", lambda: s.connect((a[0], int(a[1]))))
        recv_line(s)
    if kind == "udplite":
        s = udp(a[0], a[1], proto=136)
        attempt("send", lambda: s.sendto(b"fy-udplite", (a[0], int(a[1]))))
        recv_line(s)
    if kind == "sctp":
        s = attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
        s.settimeout(TIMEOUT)
        attempt("connect", lambda: s.connect((a[0], int(a[1]))))
        recv_line(s)
    if kind == "lsrr":
        hop, host, port = a[0], a[1], int(a[2])
        s = udp(host, port)
        # NOP, LSRR(type 131, len 7, ptr 4, one address): the kernel puts the
        # first hop in the header and the final destination in the option.
        opt = bytes([1, 131, 7, 4]) + socket.inet_aton(host)
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, opt))
        attempt("send", lambda: s.sendto(b"fy-lsrr", (hop, port)))
        recv_line(s)
    if kind == "freebind":
        s = udp(a[1], a[2])
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP, 15, 1))  # IP_FREEBIND
        attempt("bind", lambda: s.bind((a[0], 0)))
        attempt("send", lambda: s.sendto(b"fy-freebind", (a[1], int(a[2]))))
        recv_line(s)
    if kind == "gso":
        s = udp(a[0], a[1])
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_UDP, 103, 100))  # UDP_SEGMENT
        attempt("send", lambda: s.sendto(b"g" * 400, (a[0], int(a[1]))))
        recv_line(s)
    if kind == "frag":
        s = udp(a[0], a[1])
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP, 10, 0))  # PMTUDISC_DONT
        attempt("send", lambda: s.sendto(b"f" * 3000, (a[0], int(a[1]))))
        recv_line(s)
    if kind == "tos":
        s = udp(a[0], a[1])
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0xb8))
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 3))
        attempt("send", lambda: s.sendto(b"fy-tos", (a[0], int(a[1]))))
        recv_line(s)
    if kind == "bindpriv":
        s = attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        attempt("bind", lambda: s.bind(("0.0.0.0", int(a[0]))))
        finish("ok", "bind")
    if kind == "join":
        s = udp(a[0], 0)
        mreq = socket.inet_aton(a[0]) + socket.inet_aton("0.0.0.0")
        attempt("setsockopt", lambda: s.setsockopt(socket.IPPROTO_IP,
                                                    socket.IP_ADD_MEMBERSHIP, mreq))
        time.sleep(TIMEOUT)
        finish("ok", "setsockopt")
    if kind == "tun":
        import fcntl
        import os
        fd = attempt("open", lambda: os.open(a[0], os.O_RDWR))
        ifr = struct.pack("16sH", a[1].encode(), 0x0001 | 0x1000)  # IFF_TUN | IFF_NO_PI
        attempt("attach", lambda: fcntl.ioctl(fd, 0x400454ca, ifr))  # TUNSETIFF
        attempt("send", lambda: os.write(fd, ipv4_udp(a[2], a[3], int(a[4]))))
        finish("ok", "send")
    if kind == "packet":
        dev, mac, src, dst, dport = a[0], a[1], a[2], a[3], int(a[4])
        s = attempt("socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
        frame = bytes.fromhex(mac.replace(":", "")) + b"\x02\0\0\0\0\x01" + b"\x08\x00" + \
            ipv4_udp(src, dst, dport)
        attempt("send", lambda: s.sendto(frame, (dev, 0)))
        finish("ok", "send")
    if kind == "uring":
        finish("unsupported", "probe", reply="no io_uring binding in Python")
    finish("error", "usage")


if __name__ == "__main__":
    main()

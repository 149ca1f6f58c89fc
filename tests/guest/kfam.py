#!/usr/bin/python3
"""The kernel-socket families' attempts, for the rows of docs/wall-escapes.md
that need a distro guest's kernel (run in the qemu guest by guest_rows.py, as
the walled uid through setpriv). Python's socket module cannot address
AF_RXRPC or AF_SMC, so these go through libc with ctypes.

    kfam.py rxrpc HOST PORT   one RxRPC client call (one DATA packet) to HOST:PORT;
                              the kernel's UDP socket of the local endpoint sends it
    kfam.py smc HOST PORT     an AF_SMC stream connect to HOST:PORT (its CLC TCP
                              socket is the kernel's), then read a line
    kfam.py rds SRC HOST PORT AF_RDS over TCP (SO_RDS_TRANSPORT = TCP), bound to
                              SRC, one datagram to HOST:PORT; rds_tcp's kernel
                              TCP socket carries it
    kfam.py tipc              an AF_TIPC RDM socket, one message to a service
                              name no local node publishes (it would go out over
                              whatever bearer exists)

Prints one JSON object as exotic.py does: {"outcome", "stage", "errno", ...}.
"""
import ctypes
import errno
import json
import signal
import socket
import struct
import sys
import time

T0 = time.monotonic()
libc = ctypes.CDLL(None, use_errno=True)


def finish(outcome, stage, err=None, **more):
    print(json.dumps({"outcome": outcome, "stage": stage,
                      "errno": errno.errorcode.get(err, str(err)) if err else "",
                      "ms": round((time.monotonic() - T0) * 1000, 1), **more}), flush=True)
    sys.exit(0)


def check(stage, rc):
    if rc < 0:
        e = ctypes.get_errno()
        finish("timeout" if e == errno.EINTR else "error", stage, e)
    return rc


class SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_uint16), ("port", ctypes.c_uint16),
                ("addr", ctypes.c_uint8 * 4), ("zero", ctypes.c_uint8 * 8)]


def sin(host, port):
    a = SockaddrIn()
    a.family = socket.AF_INET
    a.port = socket.htons(port)
    a.addr[:] = list(socket.inet_aton(host))
    return a


class SockaddrRxrpc(ctypes.Structure):
    _fields_ = [("srx_family", ctypes.c_uint16), ("srx_service", ctypes.c_uint16),
                ("transport_type", ctypes.c_uint16), ("transport_len", ctypes.c_uint16),
                ("transport", SockaddrIn), ("pad", ctypes.c_uint8 * 12)]


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(Iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


def alarm(seconds):
    def on_alarm(*_):
        pass  # the blocked call returns EINTR: "timeout"
    signal.signal(signal.SIGALRM, on_alarm)
    signal.siginterrupt(signal.SIGALRM, True)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def rxrpc(host, port):
    fd = check("socket", libc.socket(33, socket.SOCK_DGRAM, socket.AF_INET))
    dst = SockaddrRxrpc()
    dst.srx_family = 33
    dst.srx_service = 52
    dst.transport_type = socket.SOCK_DGRAM
    dst.transport_len = ctypes.sizeof(SockaddrIn)
    dst.transport = sin(host, port)
    payload = ctypes.create_string_buffer(b"fy-rxrpc-exfil")
    iov = Iovec(ctypes.cast(payload, ctypes.c_void_p), len(payload.raw) - 1)
    # RXRPC_USER_CALL_ID (SOL_RXRPC 272, type 1): the call's user id, an unsigned long.
    cmsg = struct.pack("=QiiQ", 24, 272, 1, 1)
    ctl = ctypes.create_string_buffer(cmsg, len(cmsg))
    msg = Msghdr(ctypes.cast(ctypes.pointer(dst), ctypes.c_void_p), ctypes.sizeof(dst),
                 ctypes.pointer(iov), 1, ctypes.cast(ctl, ctypes.c_void_p), len(cmsg), 0)
    alarm(3)
    n = check("sendmsg", libc.sendmsg(fd, ctypes.byref(msg), 0))
    time.sleep(1.0)  # the DATA packet (and its retransmissions) leave meanwhile
    finish("sent", "sendmsg", sent=n)


def smc(host, port):
    fd = check("socket", libc.socket(43, socket.SOCK_STREAM, 0))
    a = sin(host, port)
    alarm(4)
    check("connect", libc.connect(fd, ctypes.byref(a), ctypes.sizeof(a)))
    buf = ctypes.create_string_buffer(256)
    n = check("recv", libc.read(fd, buf, 255))
    finish("ok", "recv", reply=buf.raw[:n].decode(errors="replace").strip())


def rds(src, host, port):
    try:
        s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
    except OSError as e:
        finish("error", "socket", e.errno)
    try:
        # SOL_RDS 276, SO_RDS_TRANSPORT 8, RDS_TRANS_TCP 2
        s.setsockopt(276, 8, 2)
    except OSError as e:
        finish("error", "setsockopt", e.errno)
    try:
        s.bind((src, 0))
    except OSError as e:
        finish("error", "bind", e.errno)
    alarm(4)
    try:
        s.sendto(b"fy-rds-exfil", socket.MSG_DONTWAIT, (host, port))
    except InterruptedError:
        finish("timeout", "sendto")
    except OSError as e:
        finish("error", "sendto", e.errno)
    time.sleep(1.5)  # rds_tcp connects from its kernel socket meanwhile
    finish("sent", "sendto")


def tipc():
    try:
        s = socket.socket(socket.AF_TIPC, socket.SOCK_RDM)
    except OSError as e:
        finish("error", "socket", e.errno)
    try:
        s.sendto(b"fy-tipc-exfil", (socket.TIPC_ADDR_NAME, 4747, 1, 0))
    except OSError as e:
        finish("error", "sendto", e.errno)
    finish("sent", "sendto")


def main():
    kind, a = sys.argv[1], sys.argv[2:]
    if kind == "rxrpc":
        rxrpc(a[0], int(a[1]))
    if kind == "smc":
        smc(a[0], int(a[1]))
    if kind == "rds":
        rds(a[0], a[1], int(a[2]))
    if kind == "tipc":
        tipc()
    finish("error", "usage")


if __name__ == "__main__":
    main()

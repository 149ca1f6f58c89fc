#!/usr/bin/python3
"""DNS stand-ins for fy-dnsfwd's proofs and benchmark (no DNS library: the
few bytes they need are built here).

  dnsserve.py auth ADDR            an authoritative server for every name: TXT
                                   "ok" and A 203.0.113.10; prints one JSON line
                                   per query ({"name", "qtype", "from", "tcp"}),
                                   the iodine-style channel's receiving end. A
                                   name whose first label is "large" has a TXT
                                   answer of BIG_TXT bytes (over 512): over UDP
                                   only its question with TC set (past 512, or
                                   past the query's EDNS size), whole over TCP
  dnsserve.py recursor ADDR UP     a recursing resolver (Lima's hostagent, a home
                                   router): relays every UDP datagram and TCP
                                   message to UP:53 over UDP and the answer back;
                                   a TCP message whose UDP answer has TC set is
                                   asked again over TCP (as a resolver does);
                                   prints {"dgram"|"conn"|"tcpmsg", "from", "len"}
                                   for everything it receives, DNS or not
  dnsserve.py tcpbad ADDR PORT     a broken upstream on TCP ADDR:PORT only: each
                                   connection's first message is answered as its
                                   name's first label says: "reset" (RST, no
                                   answer), "close" (FIN, no answer), "zero" (a
                                   zero length prefix), "garbage" (64 bytes, not
                                   the query's id), "otherq" (a response to
                                   another question), "hang" (nothing, held open),
                                   "drop2" (answered, then the connection closed
                                   under the next query, unanswered: an idle close
                                   crossing a reused connection's query);
                                   prints {"name", "from"} for each

  dnsserve.py slow ADDR PORT SECS [RELEASE]
                                   the authoritative answers, on UDP ADDR:PORT only,
                                   each SECS late (a thread a query); prints
                                   {"received", "from"} as a query arrives. With
                                   RELEASE (a path), a name whose first label is
                                   "held" is answered only once that file exists:
                                   upstream across whatever the test waits for

The first two listen on UDP and TCP ADDR:53, print READY when listening, and run until
killed. UDP is served in order; TCP by a thread per connection.
"""
import json
import os
import socket
import struct
import sys
import time
import threading

lock = threading.Lock()


def emit(obj):
    with lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def qname(msg):
    """The question's name and type, or (None, None) when it is not one."""
    try:
        at, labels = 12, []
        while msg[at]:
            n = msg[at]
            labels.append(msg[at + 1:at + 1 + n].decode("ascii", "replace"))
            at += 1 + n
        qtype = struct.unpack("!H", msg[at + 1:at + 3])[0]
        return ".".join(labels).lower(), qtype, at + 5
    except (IndexError, struct.error):
        return None, None, None


# The large TXT answer's strings: 8 of 200 bytes, 1600 bytes of TXT data.
BIG_STRINGS = [bytes([0x61 + i]) * 200 for i in range(8)]


def udp_limit(msg, end):
    """512, or the EDNS size a query's OPT record (right after the question) says."""
    if struct.unpack("!H", msg[10:12])[0] and len(msg) >= end + 5 and msg[end] == 0 \
            and struct.unpack("!H", msg[end + 1:end + 3])[0] == 41:
        return max(512, struct.unpack("!H", msg[end + 3:end + 5])[0])
    return 512


def auth_answer(msg, tcp=True):
    name, qtype, end = qname(msg)
    if name is None or len(msg) < 12:
        return None, name, qtype
    flags = 0x8400 | (struct.unpack("!H", msg[2:4])[0] & 0x0100)
    q = msg[12:end]
    if qtype == 16 and name.split(".")[0] == "large":
        rdata = b"".join(bytes([len(s)]) + s for s in BIG_STRINGS)
        rr = b"\xc0\x0c" + struct.pack("!HHIH", 16, 1, 0, len(rdata)) + rdata
        a = msg[:2] + struct.pack("!HHHHH", flags, 1, 1, 0, 0) + q + rr
        if not tcp and len(a) > udp_limit(msg, end):
            return msg[:2] + struct.pack("!HHHHH", flags | 0x0200, 1, 0, 0, 0) + q, name, qtype
        return a, name, qtype
    head = msg[:2] + struct.pack("!HHHHH", flags, 1, 1, 0, 0)
    if qtype == 16:
        rdata = b"\x02ok"
        rr = b"\xc0\x0c" + struct.pack("!HHIH", 16, 1, 0, len(rdata)) + rdata
    else:
        rr = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 0, 4) + socket.inet_aton("203.0.113.10")
    return head + q + rr, name, qtype


def serve_tcp(addr, on_msg, note_conn, port=53):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)

    def conn(c, peer):
        note_conn(peer)
        buf = b""
        try:
            c.settimeout(10)
            while True:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
                while len(buf) >= 2 and len(buf) >= 2 + struct.unpack("!H", buf[:2])[0]:
                    n = struct.unpack("!H", buf[:2])[0]
                    m, buf = buf[2:2 + n], buf[2 + n:]
                    a = on_msg(m, peer, True)
                    if a:
                        c.sendall(struct.pack("!H", len(a)) + a)
        except OSError:
            pass
        finally:
            c.close()

    def loop():
        while True:
            c, peer = s.accept()
            threading.Thread(target=conn, args=(c, peer), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


def serve_slow(addr, port, delay, release=None):
    """An authoritative stand-in on (addr, port) that answers each datagram
    after `delay` seconds (a thread each): a query is upstream that long; a
    "held" one, with `release`, until that file exists."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((addr, port))
    print("READY", flush=True)

    def answer(m, peer):
        name = qname(m)[0]
        emit({"received": name, "from": f"{peer[0]}:{peer[1]}"})
        if release and (name or "").split(".")[0] == "held":
            while not os.path.exists(release):
                time.sleep(0.01)
        else:
            time.sleep(delay)
        a, name, qtype = auth_answer(m)
        emit({"name": name, "qtype": qtype, "from": f"{peer[0]}:{peer[1]}", "slow": delay})
        if a:
            udp.sendto(a, peer)
    while True:
        m, peer = udp.recvfrom(65536)
        threading.Thread(target=answer, args=(m, peer), daemon=True).start()


def serve_tcpbad(addr, port):
    """A TCP-only upstream that breaks each connection as its first query's
    first label says (the docstring's list)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)
    print("READY", flush=True)
    held = []

    def conn(c, peer):
        try:
            c.settimeout(10)
            buf = b""
            while len(buf) < 2 or len(buf) < 2 + struct.unpack("!H", buf[:2])[0]:
                d = c.recv(65536)
                if not d:
                    c.close()
                    return
                buf += d
            m = buf[2:2 + struct.unpack("!H", buf[:2])[0]]
            name, qtype, end = qname(m)
            how = (name or "").split(".")[0]
            emit({"name": name, "from": f"{peer[0]}:{peer[1]}", "how": how})
            if how == "reset":
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif how == "zero":
                c.sendall(b"\0\0")
                time.sleep(0.5)
            elif how == "garbage":
                c.sendall(struct.pack("!H", 64) + bytes([m[0] ^ 0xFF, m[1]]) + b"\x80" * 62)
                time.sleep(0.5)
            elif how == "otherq":
                a, _, _ = auth_answer(m[:12] + b"\x05other" + m[12 + 1 + m[12]:])
                c.sendall(struct.pack("!H", len(a)) + a)
                time.sleep(0.5)
            elif how == "hang":
                held.append(c)
                return
            elif how == "drop2":
                a, _, _ = auth_answer(m)
                c.sendall(struct.pack("!H", len(a)) + a)
                c.recv(65536)  # the next query: closed under it
            c.close()
        except OSError:
            pass

    while True:
        c, peer = s.accept()
        threading.Thread(target=conn, args=(c, peer), daemon=True).start()


def main():
    mode, addr = sys.argv[1], sys.argv[2]
    if mode == "slow":
        return serve_slow(addr, int(sys.argv[3]), float(sys.argv[4]),
                          sys.argv[5] if len(sys.argv) > 5 else None)
    if mode == "tcpbad":
        return serve_tcpbad(addr, int(sys.argv[3]))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((addr, 53))
    if mode == "auth":
        def on_msg(m, peer, tcp):
            a, name, qtype = auth_answer(m, tcp)
            emit({"name": name, "qtype": qtype, "from": f"{peer[0]}:{peer[1]}", "tcp": tcp})
            return a
        serve_tcp(addr, on_msg, lambda peer: None)
        print("READY", flush=True)
        while True:
            m, peer = udp.recvfrom(65536)
            a = on_msg(m, peer, False)
            if a:
                udp.sendto(a, peer)
    elif mode == "recursor":
        up = (sys.argv[3], 53)

        def relay(m):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(2)
            try:
                u.sendto(m, up)
                return u.recv(65536)
            except OSError:
                return None
            finally:
                u.close()

        def relay_tcp(m):
            u = socket.create_connection(up, timeout=2)
            try:
                u.sendall(struct.pack("!H", len(m)) + m)
                buf = b""
                while len(buf) < 2 or len(buf) < 2 + struct.unpack("!H", buf[:2])[0]:
                    d = u.recv(65536)
                    if not d:
                        return None
                    buf += d
                return buf[2:2 + struct.unpack("!H", buf[:2])[0]]
            except OSError:
                return None
            finally:
                u.close()

        def on_tcp(m, peer, tcp):
            emit({"tcpmsg": True, "from": f"{peer[0]}:{peer[1]}", "len": len(m)})
            a = relay(m)
            if a and len(a) > 2 and a[2] & 0x02:  # TC: asked again over TCP
                a = relay_tcp(m)
            return a
        serve_tcp(addr, on_tcp, lambda peer: emit({"conn": True, "from": f"{peer[0]}:{peer[1]}"}))
        print("READY", flush=True)

        # UDP is relayed in order on one socket: the proofs and the benchmark
        # ask one query at a time, and a thread a query would only add jitter.
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.connect(up)
        u.settimeout(2)
        while True:
            m, peer = udp.recvfrom(65536)
            emit({"dgram": True, "from": f"{peer[0]}:{peer[1]}", "len": len(m)})
            if qname(m)[0] is None:
                continue  # not DNS: recorded (it arrived), not relayed
            try:
                u.send(m)
                a = u.recv(65536)
                while a[:2] != m[:2]:  # a late answer to an earlier query
                    a = u.recv(65536)
                udp.sendto(a, peer)
            except OSError:
                pass
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()

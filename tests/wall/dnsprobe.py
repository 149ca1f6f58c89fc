#!/usr/bin/python3
"""A DNS client for fy-dnsfwd's proofs and benchmark, run as the walled user.
Prints one JSON line.

  dnsprobe.py query SERVER NAME [--qtype T] [--tcp] [--count N] [--timeout S]
                    [--pad N] [--port P]
      N queries one after another: {"answered", "rcodes", "timeouts", "closed",
      "from", "lat_us", "tc" (answers with TC set), "lens" (answers' bytes),
      "ancounts"}; --pad adds an EDNS OPT record with N bytes of padding
  dnsprobe.py raw SERVER TEXT [--tcp] [--port P] [--timeout S]
      non-DNS bytes: {"outcome": reply|closed|timeout|refused|eperm, "reply"}
  dnsprobe.py channel SERVER ZONE SECONDS [--port P]
      iodine's way out: TXT queries for <data>.<data>.<data>.<n>.ZONE, each
      label 63 base32 characters of fresh data; {"queries", "answered",
      "data_bytes" (the bytes the answered queries carried), "seconds"}
"""
import argparse
import base64
import errno
import json
import os
import socket
import struct
import time

QTYPES = {"A": 1, "TXT": 16, "AAAA": 28}


def build(name, qtype, qid, pad=0):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1 if pad else 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack("!HH", qtype, 1)
    if pad:
        opt = struct.pack("!HH", 12, pad) + b"\0" * pad  # EDNS padding option
        q += b"\0" + struct.pack("!HHIH", 41, 1232, 0, len(opt)) + opt
    return q


def ask(sock, tcp, msg, timeout):
    sock.settimeout(timeout)
    if tcp:
        sock.sendall(struct.pack("!H", len(msg)) + msg)
        head = b""
        while len(head) < 2:
            d = sock.recv(2 - len(head))
            if not d:
                raise ConnectionResetError("closed")
            head += d
        n = struct.unpack("!H", head)[0]
        body = b""
        while len(body) < n:
            d = sock.recv(n - len(body))
            if not d:
                raise ConnectionResetError("closed")
            body += d
        return body
    sock.send(msg)
    while True:
        a = sock.recv(65536)
        if a[:2] == msg[:2]:
            return a


def connect(server, port, tcp, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
    s.settimeout(timeout)
    s.connect((server, port))
    return s


def query(a):
    out = {"answered": 0, "rcodes": {}, "timeouts": 0, "closed": 0, "from": None, "lat_us": [],
           "tc": 0, "lens": [], "ancounts": []}
    s = connect(a.server, a.port, a.tcp, a.timeout)
    out["from"] = "%s:%d" % s.getpeername()
    for i in range(a.count):
        msg = build(a.name, QTYPES.get(a.qtype, 1), (os.getpid() + i) & 0xFFFF, a.pad)
        t0 = time.perf_counter_ns()
        try:
            r = ask(s, a.tcp, msg, a.timeout)
        except socket.timeout:
            out["timeouts"] += 1
            continue
        except (ConnectionResetError, BrokenPipeError, ConnectionRefusedError):
            out["closed"] += 1
            if a.tcp:
                break
            continue
        out["lat_us"].append((time.perf_counter_ns() - t0) / 1000)
        out["answered"] += 1
        rc = str(r[3] & 0xF)
        out["tc"] += 1 if r[2] & 0x02 else 0
        out["lens"].append(len(r))
        out["ancounts"].append(struct.unpack("!H", r[6:8])[0] if len(r) >= 8 else -1)
        out["rcodes"][rc] = out["rcodes"].get(rc, 0) + 1
    if not a.keep_lat:
        out["lat_us"] = out["lat_us"][:3]
        out["lens"] = out["lens"][:3]
        out["ancounts"] = out["ancounts"][:3]
    return out


def raw(a):
    try:
        s = connect(a.server, a.port, a.tcp, a.timeout)
        if a.tcp:
            s.sendall(a.text.encode())
        else:
            s.send(a.text.encode())
        d = s.recv(4096)
        if a.tcp and not d:
            return {"outcome": "closed", "reply": ""}
        return {"outcome": "reply", "reply": d.decode("latin-1")}
    except socket.timeout:
        return {"outcome": "timeout", "reply": ""}
    except ConnectionRefusedError:
        return {"outcome": "refused", "reply": ""}
    except ConnectionResetError:
        return {"outcome": "closed", "reply": ""}
    except OSError as e:
        if e.errno == errno.EPERM:
            return {"outcome": "eperm", "reply": ""}
        raise


def channel(a):
    s = connect(a.server, a.port, False, 1.0)
    end = time.monotonic() + a.seconds
    n = answered = data = 0
    while time.monotonic() < end:
        chunk = os.urandom(39 * 3)  # 39 bytes = 63 base32 characters less one
        labels = [base64.b32encode(chunk[i:i + 39]).decode().rstrip("=").lower()
                  for i in range(0, len(chunk), 39)]
        name = ".".join(labels + [str(n), a.zone])
        n += 1
        try:
            r = ask(s, False, build(name, 16, n & 0xFFFF), 1.0)
        except (socket.timeout, ConnectionRefusedError):
            continue
        if r[3] & 0xF == 0 and struct.unpack("!H", r[6:8])[0] > 0:
            answered += 1
            data += len(chunk)
    return {"queries": n, "answered": answered, "data_bytes": data, "seconds": a.seconds}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("server")
    p.add_argument("arg")
    p.add_argument("seconds", nargs="?", type=float, default=0)
    p.add_argument("--port", type=int, default=53)
    p.add_argument("--qtype", default="A")
    p.add_argument("--tcp", action="store_true")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--keep-lat", action="store_true")
    a = p.parse_args()
    if a.mode == "query":
        a.name = a.arg
        r = query(a)
    elif a.mode == "raw":
        a.text = a.arg
        r = raw(a)
    elif a.mode == "channel":
        a.zone = a.arg
        r = channel(a)
    else:
        raise SystemExit(f"unknown mode {a.mode}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A walled client hammering the wall while it is being re-applied.

    storm.py SECONDS GW PUBLIC [KIND,...]

Until SECONDS pass, it cycles through four attempts: TCP to PUBLIC:443, UDP
to PUBLIC:443, TCP to GW:41095 (refused by every wall the test applies), and
TCP to GW:41000 (admitted by every wall). Prints one JSON object of counts
per kind: attempts, ok (a connection or a reply: on a refused kind, a packet
got through), refused (ECONNREFUSED or EPERM: the wall said no), timeout and
other. KINDs narrow it to some of pub_tcp443, pub_udp443, gw_offband, gw_band.
"""
import errno
import json
import socket
import sys
import time


def classify(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    if e.errno in (errno.ECONNREFUSED, errno.EPERM):
        return "refused"
    return "other"


def tcp(host, port, timeout=1.0):
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        return "ok"
    except OSError as e:
        return classify(e)
    finally:
        s.close()


def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.05)
    try:
        s.connect((host, port))
        s.send(b"storm")
        s.recv(100)
        return "ok"
    except OSError as e:
        return classify(e)
    finally:
        s.close()


def main():
    secs, gw, pub = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    kinds = {
        "pub_tcp443": lambda: tcp(pub, 443),
        "pub_udp443": lambda: udp(pub, 443),
        "gw_offband": lambda: tcp(gw, 41095),
        "gw_band": lambda: tcp(gw, 41000, timeout=3.0),
    }
    if len(sys.argv) > 4:
        kinds = {k: kinds[k] for k in sys.argv[4].split(",")}
    counts = {k: {"attempts": 0, "ok": 0, "refused": 0, "timeout": 0, "other": 0}
              for k in kinds}
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        for k, fn in kinds.items():
            counts[k]["attempts"] += 1
            counts[k][fn()] += 1
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A walled client hammering the wall while it is being re-applied.

    storm.py SECONDS|stdin GW PUBLIC [KIND,...]

Until SECONDS pass (with `stdin`: until its stdin gives a line or ends, so
the test that drives it decides how long the storm lasts; it then prints
"storming" once its first cycle is done), it cycles through four attempts: TCP to PUBLIC:443, UDP
to PUBLIC:443, TCP to GW:41095 (refused by every wall the test applies), and
TCP to GW:41000 (admitted by every wall). Prints one JSON object of counts
per kind: attempts, ok (a connection or a reply: on a refused kind, a packet
got through), refused (ECONNREFUSED or EPERM: the wall said no), timeout and
other. KINDs narrow it to some of pub_tcp443, pub_udp443, gw_offband, gw_band.
"""
import errno
import json
import select
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


def told_to_stop():
    """Whether stdin has a line or has ended (readable either way)."""
    return bool(select.select([sys.stdin], [], [], 0)[0])


def main():
    until, gw, pub = sys.argv[1], sys.argv[2], sys.argv[3]
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
    if until == "stdin":
        going = lambda: not told_to_stop()
    else:
        deadline = time.monotonic() + float(until)
        going = lambda: time.monotonic() < deadline
    first = True
    while going():
        for k, fn in kinds.items():
            counts[k]["attempts"] += 1
            counts[k][fn()] += 1
        if first and until == "stdin":
            print("storming", flush=True)
        first = False
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Multicast memberships with chosen source lists, and a capture of the
membership reports on a link, for tests/wall/test_multicast.py.

    mcast.py join IFNAME V4ADDR SECONDS
        Joins the source-specific groups 232.1.2.3 (IGMPv3, on the interface
        holding V4ADDR) and ff3e::4242:1 (MLDv2, on IFNAME) with the sources of
        SOURCES4 and SOURCE6: addresses whose bytes spell MARKER. Holds the
        sockets SECONDS, then leaves. Prints one JSON object: per option, "ok"
        or the errno's name.

    mcast.py capture IFNAME SECONDS
        Reads every frame on IFNAME (AF_PACKET, as root) for SECONDS and prints
        one JSON object: the IGMP and MLD reports seen, each with its groups
        and sources, and whether MARKER's bytes appear in any frame.
"""
import errno
import json
import socket
import struct
import sys
import time

MARKER = b"fy-chosen-bytes!"  # 16 bytes: four IPv4 sources, one IPv6 source
SOURCES4 = [socket.inet_ntoa(MARKER[i:i + 4]) for i in range(0, 16, 4)]
SOURCE6 = socket.inet_ntop(socket.AF_INET6, MARKER)
GROUP4 = "232.1.2.3"
GROUP6 = "ff3e::4242:1"
MCAST_JOIN_SOURCE_GROUP = 46
IP_ADD_SOURCE_MEMBERSHIP = 39  # linux/in.h (Python 3.11 does not name it)


def group_source_req(ifindex, group, source):
    """struct group_source_req for AF_INET6: the interface, then two
    sockaddr_storage (128 bytes each), aligned to 8."""
    def ss(addr):
        sa = struct.pack("=HHI16sI", socket.AF_INET6, 0, 0,
                         socket.inet_pton(socket.AF_INET6, addr), 0)
        return sa + b"\0" * (128 - len(sa))
    return struct.pack("=I4x", ifindex) + ss(group) + ss(source)


def join(ifname, v4addr, seconds):
    out = {}
    s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i, src in enumerate(SOURCES4):
        # struct ip_mreq_source: multiaddr, interface, sourceaddr
        mreq = socket.inet_aton(GROUP4) + socket.inet_aton(v4addr) + socket.inet_aton(src)
        try:
            s4.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, mreq)
            out[f"v4_source_{i}"] = "ok"
        except OSError as e:
            out[f"v4_source_{i}"] = errno.errorcode.get(e.errno, str(e.errno))
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s6.setsockopt(socket.IPPROTO_IPV6, MCAST_JOIN_SOURCE_GROUP,
                      group_source_req(socket.if_nametoindex(ifname), GROUP6, SOURCE6))
        out["v6_source"] = "ok"
    except OSError as e:
        out["v6_source"] = errno.errorcode.get(e.errno, str(e.errno))
    # A plain any-source join too: its group address alone is chosen bytes.
    try:
        s4.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton("239.102.121.45") + socket.inet_aton(v4addr))
        out["v4_group"] = "ok"
    except OSError as e:
        out["v4_group"] = errno.errorcode.get(e.errno, str(e.errno))
    print(json.dumps(out), flush=True)
    time.sleep(seconds)


def ipv4_reports(pkt, out):
    ihl = (pkt[0] & 0x0F) * 4
    if pkt[9] != 2:  # IGMP
        return
    igmp = pkt[ihl:]
    if not igmp:
        return
    if igmp[0] == 0x22:  # IGMPv3 membership report
        n = struct.unpack("!H", igmp[6:8])[0]
        at = 8
        for _ in range(n):
            rtype, aux, nsrc = igmp[at], igmp[at + 1], struct.unpack("!H", igmp[at + 2:at + 4])[0]
            group = socket.inet_ntoa(igmp[at + 4:at + 8])
            srcs = [socket.inet_ntoa(igmp[at + 8 + 4 * i:at + 12 + 4 * i]) for i in range(nsrc)]
            out.append({"proto": "igmpv3", "type": rtype, "group": group, "sources": srcs})
            at += 8 + 4 * nsrc + 4 * aux
    elif igmp[0] in (0x12, 0x16, 0x17):  # v1/v2 report, leave
        out.append({"proto": "igmpv2", "type": igmp[0], "group": socket.inet_ntoa(igmp[4:8]),
                    "sources": []})


def ipv6_reports(pkt, out):
    nxt, at = pkt[6], 40
    while nxt in (0, 43, 60):  # hop-by-hop (router alert), routing, destination options
        nxt, at = pkt[at], at + (pkt[at + 1] + 1) * 8
    if nxt != 58:
        return
    icmp = pkt[at:]
    if icmp[0] == 143:  # MLDv2 report
        n = struct.unpack("!H", icmp[6:8])[0]
        p = 8
        for _ in range(n):
            rtype, aux, nsrc = icmp[p], icmp[p + 1], struct.unpack("!H", icmp[p + 2:p + 4])[0]
            group = socket.inet_ntop(socket.AF_INET6, icmp[p + 4:p + 20])
            srcs = [socket.inet_ntop(socket.AF_INET6, icmp[p + 20 + 16 * i:p + 36 + 16 * i])
                    for i in range(nsrc)]
            out.append({"proto": "mldv2", "type": rtype, "group": group, "sources": srcs})
            p += 20 + 16 * nsrc + 4 * aux
    elif icmp[0] in (131, 132):  # MLDv1 report, done
        out.append({"proto": "mldv1", "type": icmp[0],
                    "group": socket.inet_ntop(socket.AF_INET6, icmp[8:24]), "sources": []})


def capture(ifname, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind((ifname, 0))
    s.settimeout(0.2)
    reports, marker, frames = [], False, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            frame = s.recv(65535)
        except socket.timeout:
            continue
        except OSError as e:
            # ENETDOWN is reported once, for a link that went down before the
            # bind took (a veth whose peer was just set up); the socket goes on.
            if e.errno == errno.ENETDOWN:
                continue
            raise
        frames += 1
        marker = marker or MARKER[:4] in frame or MARKER in frame
        ethertype = struct.unpack("!H", frame[12:14])[0]
        try:
            if ethertype == 0x0800:
                ipv4_reports(frame[14:], reports)
            elif ethertype == 0x86DD:
                ipv6_reports(frame[14:], reports)
        except (IndexError, struct.error, ValueError):
            pass
    print(json.dumps({"frames": frames, "marker": marker, "reports": reports}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "join":
        join(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1] == "capture":
        capture(sys.argv[2], float(sys.argv[3]))
    else:
        raise SystemExit(__doc__)

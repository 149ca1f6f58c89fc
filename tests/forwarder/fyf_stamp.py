"""An independent implementation of the Fy-Stamp format (docs/stamp.md, v=1).

Written from the specification, not from core/stamp.cc, so the tests can check
that the C++ and the specification agree: hmac/hashlib from Python's standard
library, the grammar as regular expressions.
"""

import hashlib
import hmac
import ipaddress
import re

HEADER = "Fy-Stamp"
DOMAIN = b"fy-stamp\n"
MAX_VALUE = 512

_SIGNED = re.compile(
    r"v=1"
    r";src=(?P<src>[0-9a-f.:]+)"
    r";net=(?P<net>[A-Za-z0-9_.-]{1,64})"
    r"(?:;who=(?P<who>[A-Za-z0-9_.:@-]{1,160}))?"
    r";seq=(?P<seq>[1-9][0-9]{0,19})"
    r";boot=(?P<boot>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_MAC = re.compile(r"[0-9a-f]{64}")


class StampError(ValueError):
    pass


def canonical_ip(s):
    try:
        a = ipaddress.ip_address(s)
    except ValueError:
        return False
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        # inet_ntop writes a mapped address as ::ffff:a.b.c.d.
        return s == "::ffff:" + str(a.ipv4_mapped)
    return str(a) == s


def mac(key, signed):
    return hmac.new(key, DOMAIN + signed.encode(), hashlib.sha256).hexdigest()


def format_stamp(key, src, net, seq, boot, who=""):
    v = "v=1;src=%s;net=%s" % (src, net)
    if who:
        v += ";who=" + who
    v += ";seq=%d;boot=%s" % (seq, boot)
    return v + ";mac=" + mac(key, v)


def verify(value, key):
    """Returns the fields as a dict, or raises StampError saying why."""
    if len(value) > MAX_VALUE:
        raise StampError("too long")
    at = value.rfind(";mac=")
    if at < 0:
        raise StampError("no mac")
    signed, given = value[:at], value[at + 5:]
    if not _MAC.fullmatch(given):
        raise StampError("mac is not 64 lower-case hex characters")
    if not hmac.compare_digest(mac(key, signed), given):
        raise StampError("mac does not match")
    m = _SIGNED.fullmatch(signed)
    if not m:
        raise StampError("fields do not follow the grammar")
    if not canonical_ip(m["src"]):
        raise StampError("src is not a canonical IP address")
    seq = int(m["seq"])
    if seq >= 2 ** 64:
        raise StampError("seq out of range")
    return {"src": m["src"], "net": m["net"], "who": m["who"] or "", "seq": seq,
            "boot": m["boot"]}


class ReplayGuard:
    """Each (boot, seq) is accepted once; sequences more than WINDOW below the
    highest seen for a boot are refused (as core/stamp.h's ReplayGuard)."""

    WINDOW = 1 << 16

    def __init__(self):
        self.seen = {}

    def accept(self, boot, seq):
        high, s = self.seen.setdefault(boot, [0, set()])
        if seq > high:
            self.seen[boot][0] = seq
            s.add(seq)
            s.difference_update({x for x in s if x + self.WINDOW <= seq})
            return True
        if high - seq >= self.WINDOW or seq in s:
            return False
        s.add(seq)
        return True

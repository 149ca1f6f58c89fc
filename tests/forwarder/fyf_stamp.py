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


def ntop(a):
    """An address as glibc's inet_ntop(3) writes it, the one spelling of `src`.

    IPv4: the dotted quad. IPv6: RFC 5952 section 4 (lower-case hex without
    leading zeros; the longest run of two or more zero groups, the first of
    equal ones, as "::"), except two embedded-IPv4 forms: when the first six
    groups are the longest zero run (the seventh group is not zero) it is
    "::a.b.c.d"; when the first five are and the sixth is ffff (IPv4-mapped),
    "::ffff:a.b.c.d". Python's str() differs on both (it writes "::102:304",
    and before 3.13 "::ffff:102:304"), so it is not used for IPv6.
    """
    if isinstance(a, ipaddress.IPv4Address):
        return str(a)
    packed = a.packed
    words = [int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2)]
    base, length, i = -1, 0, 0
    while i < 8:
        if words[i]:
            i += 1
            continue
        j = i
        while j < 8 and words[j] == 0:
            j += 1
        if j - i > length:
            base, length = i, j - i
        i = j
    if length < 2:
        base, length = -1, 0
    if base == 0 and (length == 6 or (length == 5 and words[5] == 0xffff)):
        return ("::" if length == 6 else "::ffff:") + str(ipaddress.IPv4Address(packed[12:]))
    hexes = ["%x" % w for w in words]
    if base < 0:
        return ":".join(hexes)
    return ":".join(hexes[:base]) + "::" + ":".join(hexes[base + length:])


def canonical_ip(s):
    """True for an IP literal spelled exactly as ntop() writes it."""
    try:
        a = ipaddress.IPv6Address(s) if ":" in s else ipaddress.IPv4Address(s)
    except ValueError:
        return False
    return ntop(a) == s


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
    """Each (boot, seq) is accepted once; sequences WINDOW or more below the
    highest seen for a boot are refused; at most MAX_BOOTS boots are kept, and
    a new one makes the least recently presented (accepted or not) forgotten
    (as docs/stamp.md step 5 and core/stamp.h's ReplayGuard)."""

    WINDOW = 1 << 16
    MAX_BOOTS = 64

    def __init__(self):
        self.seen = {}  # boot -> [high, set of seqs]; least recently used first

    def accept(self, boot, seq):
        entry = self.seen.pop(boot, None)
        if entry is None:
            if len(self.seen) >= self.MAX_BOOTS:
                del self.seen[next(iter(self.seen))]
            entry = [0, set()]
        self.seen[boot] = entry  # now the most recently used
        high, s = entry
        if seq > high:
            entry[0] = seq
            s.add(seq)
            s.difference_update({x for x in s if x + self.WINDOW <= seq})
            return True
        if high - seq >= self.WINDOW or seq in s:
            return False
        s.add(seq)
        return True

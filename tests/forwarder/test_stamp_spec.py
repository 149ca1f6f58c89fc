#!/usr/bin/env python3
"""docs/stamp.md against both implementations.

Reads every vector from docs/stamp.md and checks it with the independent Python
implementation (fyf_stamp.py, hmac from the standard library) and with the C++
one (fyf-stamp-tool over core/stamp.cc): valid vectors verify and re-format to
the same bytes in both; refused vectors are refused by both. Then random stamps
made by each implementation verify in the other (their `src` drawn to include
the IPv6 spellings where inet_ntop and RFC 5952 part: ::a.b.c.d, ::ffff:a.b.c.d),
other spellings of the same address are refused by both, and the Python replay
guard answers as the C++ one (fyf-stamp-tool guard) on the same sequences.
"""

import ipaddress
import json
import os
import random
import subprocess
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fyf_stamp  # noqa: E402
from fyf_topology import build_dir, source_dir  # noqa: E402

TOOL = os.path.join(build_dir(), "tests", "forwarder", "fyf-stamp-tool")


def doc_vectors():
    key, valid, refused = None, [], []
    with open(os.path.join(source_dir(), "docs", "stamp.md")) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("key "):
                key = bytes.fromhex(line[4:])
            elif line.startswith("value v="):
                valid.append(line[6:])
            elif line.startswith("refuse v="):
                refused.append(line[7:])
    return key, valid, refused


def cpp_verify(key, value):
    r = subprocess.run([TOOL, "verify", key.hex(), value], capture_output=True, text=True,
                       timeout=10)
    return (json.loads(r.stdout) if r.returncode == 0 else None), r.stdout.strip()


def cpp_guard(ops):
    """The C++ ReplayGuard's answer (True: accept) for each (boot, seq), in order."""
    r = subprocess.run([TOOL, "guard"], input="".join(f"{b} {q}\n" for b, q in ops),
                       capture_output=True, text=True, timeout=60, check=True)
    return [line == "accept" for line in r.stdout.splitlines()]


def random_ip(rnd):
    """An address of a family where spellings are easy to get wrong, as bytes."""
    kind = rnd.randrange(8)
    if kind == 0:  # ::a.b.c.d, the IPv4-compatible form (sometimes with a zero 7th group)
        return bytes(12) + bytes(rnd.choice([0, rnd.randrange(256)]) for _ in range(2)) + rnd.randbytes(2)
    if kind == 1:  # ::ffff:a.b.c.d, IPv4-mapped
        return bytes(10) + b"\xff\xff" + rnd.randbytes(4)
    if kind == 2:
        return rnd.choice([bytes(15) + b"\x01", bytes(16), bytes(11) + b"\xff" + bytes(4),
                           bytes(10) + b"\xff\xff" + bytes(4), bytes(12) + b"\x01\x02\x03\x04"])
    if kind in (3, 4):  # zero runs of every length and place, ties, single zero groups
        return b"".join(rnd.choice([bytes(2), bytes(2), rnd.randbytes(2), b"\x00\x01"]) for _ in range(8))
    if kind == 5:
        return b"\xfd\x00" + bytes(8) + rnd.randbytes(6)
    return rnd.randbytes(4)  # IPv4


def spellings(packed):
    """Other ways to write the same address; the canonical one is fyf_stamp.ntop."""
    a = ipaddress.ip_address(packed)
    out = {str(a), a.exploded, a.compressed.upper()}
    if a.version == 6:
        groups = [x.lstrip("0") or "0" for x in a.exploded.split(":")]
        quad = str(ipaddress.IPv4Address(packed[12:]))
        out |= {":".join(groups),                 # no "::"
                ":".join(groups[:6]) + ":" + quad}  # any address may end in a dotted quad
        if packed[:12] == bytes(12):
            out.add("::" + quad)
        if packed[:12] == bytes(10) + b"\xff\xff":
            out |= {"::ffff:" + quad, "::ffff:%x:%x" % (packed[12] << 8 | packed[13],
                                                      packed[14] << 8 | packed[15])}
    assert all(ipaddress.ip_address(x) == a for x in out), out
    return out


def cpp_format(key, f):
    r = subprocess.run([TOOL, "format", key.hex(), f["src"], f["net"], f["who"] or "-",
                        str(f["seq"]), f["boot"]], capture_output=True, text=True, timeout=10,
                       check=True)
    return r.stdout.strip()


class StampSpec(unittest.TestCase):
    def setUp(self):
        self.key, self.valid, self.refused = doc_vectors()
        self.assertIsNotNone(self.key, "docs/stamp.md has no key line")
        self.assertGreaterEqual(len(self.valid), 5)
        self.assertGreaterEqual(len(self.refused), 10)

    def test_valid_vectors(self):
        for v in self.valid:
            with self.subTest(v=v):
                py = fyf_stamp.verify(v, self.key)
                cc, why = cpp_verify(self.key, v)
                self.assertIsNotNone(cc, why)
                self.assertEqual(py, cc)
                self.assertEqual(fyf_stamp.format_stamp(self.key, py["src"], py["net"],
                                                        py["seq"], py["boot"], py["who"]), v)
                self.assertEqual(cpp_format(self.key, cc), v)

    def test_refused_vectors(self):
        for v in self.refused:
            with self.subTest(v=v):
                with self.assertRaises(fyf_stamp.StampError):
                    fyf_stamp.verify(v, self.key)
                cc, why = cpp_verify(self.key, v)
                self.assertIsNone(cc)
                self.assertNotIn("mac", why, "refused at the MAC, not at the grammar: " + why)

    def test_mac_refusals(self):
        v = self.valid[0]
        bad = [v[:9] + "9" + v[10:], v[:-64] + v[-64:].upper(), v + " ", v[:-1]]
        for b in bad:
            with self.subTest(b=b):
                self.assertIsNone(cpp_verify(self.key, b)[0])
                with self.assertRaises(fyf_stamp.StampError):
                    fyf_stamp.verify(b, self.key)
        self.assertIsNone(cpp_verify(bytes(32), v)[0])

    def test_random_cross_check(self):
        rnd = random.Random(4)
        whos = ["", "user", "uid:0", "container:" + "%064x" % rnd.getrandbits(256),
                "build:crun-buildah-b%d.scope" % rnd.randrange(10 ** 6)]
        for i in range(60):
            key = bytes(rnd.getrandbits(8) for _ in range(32))
            if i % 3 == 0:
                src = "fd00::%x:%x" % (rnd.randrange(1, 65536), rnd.randrange(1, 65536))
            elif i % 3 == 1:
                src = fyf_stamp.ntop(ipaddress.ip_address(random_ip(rnd)))
            else:
                src = "10.89.%d.%d" % (rnd.randrange(256), rnd.randrange(256))
            f = {"src": src, "net": rnd.choice(["podman1", "podman2", "host", "unknown"]),
                 "who": rnd.choice(whos), "seq": rnd.randrange(1, 2 ** 64),
                 "boot": str(uuid.UUID(int=rnd.getrandbits(128)))}
            py = fyf_stamp.format_stamp(key, f["src"], f["net"], f["seq"], f["boot"], f["who"])
            cc = cpp_format(key, f)
            self.assertEqual(py, cc)
            self.assertEqual(cpp_verify(key, py)[0], f)
            self.assertEqual(fyf_stamp.verify(cc, key), f)

    def test_src_has_one_spelling_in_both(self):
        rnd = random.Random(6)
        boot = str(uuid.UUID(int=rnd.getrandbits(128)))
        fixed = [bytes(12) + b"\x01\x02\x03\x04", bytes(10) + b"\xff\xff\x01\x02\x03\x04",
                 bytes(15) + b"\x01", bytes(16), bytes(12) + b"\x00\x00\x01\x02"]
        for packed in fixed + [random_ip(rnd) for _ in range(40)]:
            canonical = fyf_stamp.ntop(ipaddress.ip_address(packed))
            for src in spellings(packed) | {canonical}:
                with self.subTest(src=src):
                    v = fyf_stamp.format_stamp(self.key, src, "podman1", 1, boot)
                    cc = cpp_verify(self.key, v)[0]
                    try:
                        py = fyf_stamp.verify(v, self.key)
                    except fyf_stamp.StampError:
                        py = None
                    self.assertEqual(py, cc)
                    self.assertEqual(cc is not None, src == canonical)
        self.assertEqual(fyf_stamp.ntop(ipaddress.ip_address(fixed[0])), "::1.2.3.4")

    def test_replay_guard_semantics_match(self):
        W, top = fyf_stamp.ReplayGuard.WINDOW, 2 ** 64 - 1
        rnd = random.Random(5)
        ops = [("b", 1), ("b", 1), ("b", 3), ("b", 2), ("c", 1), ("b", 1 + 2 * W), ("b", 5)]
        # Window edges: just inside, just outside, slot aliasing (s and s + W
        # share a bit), jumps of W - 1, W and W + 1, and the top of the range.
        h = 10 * W
        ops += [("w", h), ("w", h - W + 1), ("w", h - W), ("w", h - W + 1), ("w", h - 1),
                ("w", h + W - 1), ("w", h), ("w", h + W - 1 - W), ("w", h + W - 1 - W + 1),
                ("w", h + 2 * W - 1), ("w", h + W), ("w", h + 3 * W), ("w", h + 2 * W + 1),
                ("w", h + 4 * W + 1), ("w", h + 3 * W + 1), ("w", h + 3 * W + 2),
                ("t", top - W), ("t", top), ("t", top - W), ("t", top - W + 1), ("t", top),
                ("t", top - 1), ("t", 1), ("u", top), ("u", top - 1)]
        # Reordering: sequences arriving out of order, some twice, some far behind.
        base = 1
        for _ in range(3000):
            base += rnd.randrange(0, 40)
            ops.append(("r", max(1, base + rnd.randrange(-W - 200, 200))))
        # Boots: 64 are kept, the least recently presented one goes first; a
        # refused presentation counts as use too.
        boots = ["%08x-0000-4000-8000-%012x" % (i, i) for i in range(70)]
        ops += [(b, 1) for b in boots[:64]] + [(boots[0], 1), (boots[64], 1), (boots[1], 1),
                                               (boots[0], 1), (boots[2], 1), (boots[3], 1)]
        for _ in range(4000):
            b = boots[min(int(rnd.expovariate(1 / 20)), 69)]
            ops.append((b, rnd.randrange(1, 60)))
        g = fyf_stamp.ReplayGuard()
        py = [g.accept(b, q) for b, q in ops]
        cc = cpp_guard(ops)
        self.assertEqual(len(cc), len(ops))
        for i, (op, p, c) in enumerate(zip(ops, py, cc)):
            self.assertEqual(p, c, f"op {i} {op}: python {'accepts' if p else 'refuses'}, "
                                   f"C++ {'accepts' if c else 'refuses'}")
        # Both kinds of answer are exercised, eviction included.
        self.assertIn(True, py)
        self.assertIn(False, py)
        self.assertEqual(py[len(ops) - 4000 - 6:len(ops) - 4000],
                         [False, True, True, False, True, True])


if __name__ == "__main__":
    unittest.main(verbosity=2)

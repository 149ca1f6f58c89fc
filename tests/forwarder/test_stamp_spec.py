#!/usr/bin/env python3
"""docs/stamp.md against both implementations.

Reads every vector from docs/stamp.md and checks it with the independent Python
implementation (fyf_stamp.py, hmac from the standard library) and with the C++
one (fyf-stamp-tool over core/stamp.cc): valid vectors verify and re-format to
the same bytes in both; refused vectors are refused by both. Then random stamps
made by each implementation verify in the other.
"""

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
        for i in range(40):
            key = bytes(rnd.getrandbits(8) for _ in range(32))
            if i % 3 == 0:
                src = "fd00::%x:%x" % (rnd.randrange(1, 65536), rnd.randrange(1, 65536))
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

    def test_replay_guard_semantics_match(self):
        g = fyf_stamp.ReplayGuard()
        self.assertTrue(g.accept("b", 1))
        self.assertFalse(g.accept("b", 1))
        self.assertTrue(g.accept("b", 3))
        self.assertTrue(g.accept("b", 2))
        self.assertTrue(g.accept("c", 1))
        self.assertTrue(g.accept("b", 1 + 2 * g.WINDOW))
        self.assertFalse(g.accept("b", 5))


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/python3
"""The host wall, proven with real cgroup v2 processes in a namespace.

A namespace stands for the Linux host: loopback listeners on the project's
band (41000, 41199) and off it (42000), and a veth to a "public" namespace
(TCP 443 and 53, UDP 53 and 443, TCP 443 over IPv6). The VM's processes are
real processes moved into a real cgroup v2 slice (fyw-<pid>-.../
fy-machine-test.slice under the cgroup2 mount) before they make their sockets.
The real `fy-wall apply host` installs the per-VM table, resolving the slice
through its own private cgroup2 mount (this host is hybrid: /sys/fs/cgroup is
not cgroup2).

Where fy-wall's host table departs from the reference's (`ct direction reply`
instead of `ct state established,related` first in both judging chains), the
escape is also tried against the reference's exact table as the control, as
test_escapes.py does for the machine wall.

The VM's processes run as a VM user of their own (docs/fy-wall.md, "The VM
user"), whose uid and gid the wall matches beside the slice: a uid made of
this run's pid (no other run's processes have it, so `status` here never
sees another run's as strays), in the test's passwd file only. Where the
wall keyed on the slice alone (as on main), the escapes that key lets out are
tried against that table as the control: fy-wall's rendering with the uid
and gid rules taken out.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import fywnet as n

PUB, PUB6 = "203.0.113.10", "2001:db8:2::10"
HOST = "203.0.113.1"  # the host's own address on the "public" link
PUB_OTHER = "203.0.113.11"  # another host on the way, not the host's resolver
BAND = ["41000-41199"]
# The VM user: unique to this run (pids are unique among live processes, and
# stay below 2^22), far from the walled guest uids and subuids.
VM_UID = 5_000_000 + n.PID
VM_NAME = f"fywvm{n.PID}"

# Run as the VM user in a slice: move into the cgroup argv[1] (writing 0 to
# its cgroup.procs), say whether that worked and where the process is now,
# then exec argv[2:].
MOVE = """import json, os, sys
try:
    with open(sys.argv[1] + "/cgroup.procs", "w") as f:
        f.write("0")
    moved = "moved"
except OSError as e:
    moved = os.strerror(e.errno)
with open("/proc/self/cgroup") as f:
    cg = [l[3:] for l in f.read().splitlines() if l.startswith("0::")][0]
print(json.dumps({"move": moved, "cgroup": cg}), flush=True)
os.execv(sys.argv[2], sys.argv[2:])
"""

# Ask the deputy on the unix socket argv[1] to dial argv[2]:argv[3]; print its answer.
ASK = """import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(f"{sys.argv[2]} {sys.argv[3]}\\n".encode())
print(s.makefile().readline().strip())
"""


def as_vm_user(*cmd):
    return ["setpriv", f"--reuid={VM_UID}", f"--regid={VM_UID}", "--clear-groups", *cmd]


def reference_host_wall(vm, cgroup, bands, base):
    """The reference's exact host table (wall-lifecycle-filter.md section 1,
    hostwall.py), for the controls."""
    level = len([c for c in cgroup.split("/") if c])
    sel = f'socket cgroupv2 level {level} "{cgroup}"'
    mark = "%#010x" % ((0xF4 << 24) | base)
    table = f"fy_host_wall_{vm}"
    return f"""table inet {table}
delete table inet {table}
table inet {table} {{
  chain output {{
    type filter hook output priority filter; policy accept;
    {sel} jump vm
  }}
  chain vm {{
    ct state established,related accept
    udp dport 53 accept
    tcp dport 53 accept
    oif "lo" ct mark set {mark} accept
    meta l4proto tcp counter reject with tcp reset
    counter reject with icmpx type admin-prohibited
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iif "lo" ct mark {mark} jump lo
  }}
  chain lo {{
    ct state established,related accept
    {sel} accept
    tcp dport {{ {", ".join(bands)} }} accept
    meta l4proto tcp counter reject with tcp reset
    counter reject with icmpx type admin-prohibited
  }}
}}
"""


class HostWall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.ns = n.netns("hw")
        cls.pub = n.netns("hwpub")
        n.veth(cls.ns, ["203.0.113.1/24", "2001:db8:2::1/64"],
               cls.pub, ["203.0.113.10/24", "2001:db8:2::10/64"])
        cls.base = f"fyw-{n.PID}-hw"
        cls.slice_rel = f"{cls.base}/fy-machine-test.slice"
        cls.slice = n.cgroup(cls.slice_rel)
        cls.sibling = n.cgroup(f"{cls.base}/other.slice")
        cls.lo_srv = n.Server(cls.ns, "lo", "tcp:127.0.0.1:41000", "tcp:127.0.0.1:41199",
                              "tcp:127.0.0.1:42000")
        cls.pub_srv = n.Server(cls.pub, "public", f"tcp:{PUB}:443", f"tcp:{PUB}:53",
                               f"udp:{PUB}:53", f"udp:{PUB}:443", f"tcp:[{PUB6}]:443")
        # A listener of the VM itself (inside its slice), off the band.
        cls.vm_srv = n.Server(cls.ns, "vm", "tcp:127.0.0.1:42001", cgroup=cls.slice)
        for _ in range(30):  # IPv6 neighbour discovery settles
            if n.probe(cls.ns, 0, "tcp", PUB6, 443, timeout=1)["outcome"] == "ok":
                break
        # A real host tracks connections whether or not the wall is up (any
        # firewall, podman, a NAT rule); a namespace only once a rule needs it.
        # Without this, a flow opened before the wall would be picked up
        # mid-stream as "new" and even the reference's table would cut it.
        n.sh(*n.nsexec(cls.ns, "nft", "-f", "-"), input=(
            "table inet fyw_conntrack {\n chain c {\n"
            "  type filter hook output priority 100; policy accept;\n"
            "  ct state invalid counter\n }\n}\n"))
        cls.ident = n.Identity()
        with open(cls.ident.passwd, "a") as f:
            f.write(f"{VM_NAME}:x:{VM_UID}:{VM_UID}::/nonexistent:/usr/sbin/nologin\n")
        # The host's own resolver is the public host's first address; the
        # second (203.0.113.11) answers on 53 too, as any host on the way could.
        rc = os.path.join(cls.ident.dir, "resolv.conf")
        with open(rc, "w") as f:
            f.write(f"nameserver {PUB}\n")
        os.environ["FY_WALL_RESOLV_CONF"] = rc
        n.sh("ip", "-n", cls.pub, "addr", "add", f"{PUB_OTHER}/24", "dev",
             n.in_ns(cls.pub, "ip", "-o", "-4", "addr").stdout.split(f" {PUB}/")[0].split()[-2])
        cls.other53 = n.Server(cls.pub, "other", f"tcp:{PUB_OTHER}:53", f"udp:{PUB_OTHER}:53")
        cls.before = {
            "offband": cls.vm(cls, "tcp", "127.0.0.1", 42000),
            "pub443": cls.vm(cls, "tcp", PUB, 443),
        }
        cls.args = ["--vm", "test", "--user", VM_NAME, "--cgroup", cls.slice_rel, "--ports",
                    ",".join(BAND)]
        cls.apply_fy_wall()

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    @classmethod
    def apply_fy_wall(cls):
        r = cls.ident.fy_wall(cls.ns, "apply", "host", *cls.args)
        assert r.returncode == 0, r.stderr

    def apply_reference(self):
        """The reference's table, loaded with nft as its unit does."""
        self.load(reference_host_wall("test", self.slice_rel, BAND, 41000))

    def load(self, text):
        """Loads a ruleset with nft (nft resolves the slice against
        /sys/fs/cgroup: a private cgroup2 mount on a hybrid host)."""
        n.sh("unshare", "-m", "--propagation", "private", "sh", "-c",
             '[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || '
             'mount -t cgroup2 none /sys/fs/cgroup; exec "$@"', "sh",
             *n.nsexec(self.ns, "nft", "-f", "-"), input=text)

    def rendering(self, vm, cgroup, drop=()):
        """`fy-wall render host` for `vm` and `cgroup`, without the rules that
        hold any of `drop`: ("meta skuid", "meta skgid") is the host wall as
        it was, keyed on the slice alone."""
        r = self.ident.fy_wall(None, "render", "host", "--vm", vm, "--user", VM_NAME, "--cgroup",
                               cgroup, "--ports", ",".join(BAND))
        self.assertEqual(r.returncode, 0, r.stderr)
        return "".join(l + "\n" for l in r.stdout.splitlines() if not any(d in l for d in drop))

    def leave_then(self, slice, dest, kind, host, port):
        """A process of the VM user in `slice` writes its own pid into `dest`'s
        cgroup.procs, then makes one probe. Returns (the move, the probe)."""
        r = n.sh(*n.in_cgroup(slice, n.nsexec(self.ns, *as_vm_user(
            n.PY, "-c", MOVE, dest, n.PY, n.PROBE, kind, host, port, "--timeout", "2"))),
            check=False, timeout=30)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(len(lines), 2, r.stdout + r.stderr)
        return json.loads(lines[0]), json.loads(lines[1])

    def status(self):
        return self.ident.fy_wall(self.ns, "status", "host", *self.args)

    def vm(self, kind, host, port, *extra, **kw):
        return n.probe(self.ns, 0, kind, host, port, *extra, cgroup=self.slice, **kw)

    def outside(self, kind, host, port, *extra, cgroup=None):
        return n.probe(self.ns, 0, kind, host, port, *extra, cgroup=cgroup)

    def held_flow(self, host, port, apply):
        """A VM process opens a TCP flow to host:port (a `hold` listener outside
        the slice) while no wall is up, then `apply` puts a wall up, then the
        process sends. Returns what the client saw and the data that arrived."""
        r = self.ident.fy_wall(self.ns, "remove", "host", "--vm", "test")
        self.assertEqual(r.returncode, 0, r.stderr)
        try:
            srv = n.Server(self.pub if host == PUB else self.ns, "hold", f"hold:{host}:{port}")
            h = n.spawn(n.in_cgroup(self.slice, n.nsexec(
                self.ns, n.PY, n.PROBE, "hold", host, port, "--timeout", "2",
                "--payload", "after-wall")),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            first = h.stdout.readline()
            self.assertIn('"connected"', first)
            apply()
            h.stdin.write("go\n")
            h.stdin.flush()
            after = json.loads(h.stdout.readline())
            h.wait(timeout=10)
            time.sleep(0.2)
            return after, [r for r in srv.records() if r.startswith("data ")]
        finally:
            self.apply_fy_wall()

    def ok(self, r, reply):
        self.assertEqual(r["outcome"], "ok", r)
        self.assertIn(reply, r["reply"])

    def test_00_without_the_wall_the_vm_got_out(self):
        self.ok(self.before["offband"], "lo tcp 127.0.0.1:42000")
        self.ok(self.before["pub443"], "public tcp")

    def test_vm_reaches_its_band_on_loopback(self):
        self.ok(self.vm("tcp", "127.0.0.1", 41000), "lo tcp 127.0.0.1:41000")
        self.ok(self.vm("tcp", "127.0.0.1", 41199), "lo tcp 127.0.0.1:41199")

    def test_vm_reaches_dns(self):
        self.ok(self.vm("udp", PUB, 53), "public udp")
        self.ok(self.vm("tcp", PUB, 53), "public tcp")

    def test_port_53_only_to_the_hosts_resolvers(self):
        """The host wall admitted port 53 to any address, as the reference's
        table does (the control): any protocol to any host on 53. Now only to
        the host's own resolvers (its resolv.conf)."""
        try:
            self.apply_reference()
            for kind in ("tcp", "udp"):
                self.ok(self.vm(kind, PUB_OTHER, 53), f"other {kind} {PUB_OTHER}:53")
        finally:
            self.apply_fy_wall()
        self.assertEqual(self.vm("tcp", PUB_OTHER, 53)["outcome"], "refused")
        self.assertEqual(self.vm("udp", PUB_OTHER, 53)["outcome"], "eperm")
        self.ok(self.vm("tcp", PUB, 53), "public tcp")

    def test_vm_refused_ipv6_loopback_off_the_band(self):
        srv = n.Server(self.ns, "lo6", "tcp:[::1]:42002")
        r = self.vm("tcp", "::1", 42002)
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(srv.records(), [])

    def test_vm_refused_udp_on_loopback_to_the_band(self):
        srv = n.Server(self.ns, "lo-udp", "udp:127.0.0.1:41001")
        r = self.vm("udp", "127.0.0.1", 41001, timeout=1.0)
        # the lo chain's ICMP admin-prohibited: EACCES at recv
        self.assertEqual(r["outcome"], "unreachable", r)
        self.assertEqual(srv.records(), [])

    def test_a_socket_made_outside_the_slice_is_not_the_vms(self):
        """A process makes its socket outside the slice, then moves into it
        and connects: the socket's cgroup is fixed when it is made, so the
        wall does not judge it (by design: only processes already outside
        the VM's slice can do this, and they are not walled)."""
        code = ("import socket,sys\n"
                "s=socket.socket();s.settimeout(3)\n"
                "open(sys.argv[1]+'/cgroup.procs','w').write('0')\n"
                f"s.connect(('{PUB}',443));print(s.recv(99).decode().strip())\n")
        r = n.sh(*n.nsexec(self.ns, n.PY, "-c", code, self.slice), check=False)
        self.assertEqual(r.stdout.strip(), f"public tcp {PUB}:443", r.stderr)
        # The same process, its socket made after the move: refused.
        r = self.vm("tcp", PUB, 443)
        self.assertEqual(r["outcome"], "refused", r)

    def test_vm_reaches_its_own_listeners(self):
        self.ok(self.vm("tcp", "127.0.0.1", 42001), "vm tcp 127.0.0.1:42001")
        # Past the handshake too: the packet that completes it meets a request
        # socket (no cgroup), and data follows; the flow is admitted whole.
        srv = n.Server(self.ns, "vm-hold", "hold:127.0.0.1:42005", cgroup=self.slice)
        h = n.spawn(n.in_cgroup(self.slice, n.nsexec(
            self.ns, n.PY, n.PROBE, "hold", "127.0.0.1", 42005, "--timeout", "1",
            "--payload", "vm-to-vm")), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.assertIn('"connected"', h.stdout.readline())
        h.stdin.write("go\n")
        h.stdin.flush()
        after = json.loads(h.stdout.readline())
        h.wait(timeout=10)
        self.assertEqual(after["outcome"], "timeout", after)  # sent; the listener answers no more
        deadline = time.monotonic() + 2
        while not [r for r in srv.records() if "vm-to-vm" in r] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue([r for r in srv.records() if "vm-to-vm" in r], srv.records())

    def test_vm_refused_off_band_loopback(self):
        seen = len(self.lo_srv.seen_from("127.0.0.1", "127.0.0.1:42000"))
        r = self.vm("tcp", "127.0.0.1", 42000)
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(len(self.lo_srv.seen_from("127.0.0.1", "127.0.0.1:42000")), seen)

    def test_vm_refused_everything_else_outside(self):
        seen = len(self.pub_srv.records())
        self.assertEqual(self.vm("tcp", PUB, 443)["outcome"], "refused")
        r = self.vm("udp", PUB, 443)
        self.assertEqual(r["outcome"], "eperm", r)
        r = self.vm("tcp", PUB6, 443, timeout=4.0)
        self.assertEqual(r["outcome"], "refused", r)  # the inet table's TCP reset
        self.assertEqual(len(self.pub_srv.records()), seen, self.pub_srv.records()[seen:])

    def test_processes_outside_the_slice_are_unaffected(self):
        for where in (None, self.sibling):
            with self.subTest(cgroup=where):
                self.ok(self.outside("tcp", "127.0.0.1", 42000, cgroup=where), "lo tcp")
                self.ok(self.outside("tcp", PUB, 443, cgroup=where), "public tcp")
                self.ok(self.outside("udp", PUB, 443, cgroup=where), "public udp")
                self.ok(self.outside("tcp", PUB6, 443, cgroup=where), "public tcp")
                self.ok(self.outside("tcp", "127.0.0.1", 42001, cgroup=where), "vm tcp")

    def test_status_counts_the_refusals(self):
        self.vm("tcp", "127.0.0.1", 42000)
        self.vm("tcp", PUB, 443)
        st = self.ident.fy_wall(self.ns, "status", "host", *self.args)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertIn("table inet fy_host_wall_test: PRESENT, as rendered", st.stdout)
        counts = [l for l in st.stdout.splitlines() if l.startswith("refused (")]
        self.assertEqual(len(counts), 4, st.stdout)
        self.assertTrue(any("the VM's output" in l and "packets 0 " not in l for l in counts))
        self.assertTrue(any("loopback input" in l and "packets 0 " not in l for l in counts))

    # ---- escapes: conntrack is keyed by address and port, not by owner ----

    def test_reusing_another_processs_conntrack_entry(self):
        """A process outside the slice finishes a UDP exchange with a public
        host (QUIC's port: not DNS); a VM process bound to the same source
        port sends the same 5-tuple. The reference's `ct state established`
        accepts it first; fy-wall judges the VM's packet like any other."""
        results = {}
        for which, port in (("reference", 40201), ("fy-wall", 40202)):
            if which == "reference":
                self.apply_reference()
            try:
                r = self.outside("udp", PUB, 443, "--bind-port", port)
                self.assertEqual(r["outcome"], "ok", r)  # the entry now exists, "established"
                seen = len(self.pub_srv.seen_from(HOST))
                results[which] = (self.vm("udp", PUB, 443, "--bind-port", port),
                                  len(self.pub_srv.seen_from(HOST)) - seen)
            finally:
                self.apply_fy_wall()
        self.assertEqual(results["reference"][0]["outcome"], "ok",
                         f"the control: the reference's table held? {results}")
        self.assertEqual(results["reference"][1], 1)
        self.assertEqual(results["fy-wall"][0]["outcome"], "eperm", results)
        self.assertEqual(results["fy-wall"][1], 0, "the public host saw the VM's datagram")

    def test_a_flow_opened_before_the_wall(self):
        """A VM process's TCP flow to a public host, opened before the wall,
        used after it: the reference's table lets the data through, fy-wall's
        resets the flow at its next packet."""
        ref_after, ref_data = self.held_flow(PUB, 4443, self.apply_reference)
        fy_after, fy_data = self.held_flow(PUB, 4444, self.apply_fy_wall)
        self.assertTrue(ref_data, f"the control: the reference cut the flow? {ref_after}")
        self.assertFalse(fy_data, f"data passed fy-wall: {fy_data}")
        self.assertEqual(fy_after["outcome"], "reset", fy_after)

    def test_a_loopback_flow_off_the_band_opened_before_the_wall(self):
        """The same on loopback, to a listener off the band (outside the slice):
        the reference accepts the flow as established before it marks it, so
        its input chain never judges it; fy-wall marks every packet the VM
        sends on lo and the input chain resets it."""
        ref_after, ref_data = self.held_flow("127.0.0.1", 42002, self.apply_reference)
        fy_after, fy_data = self.held_flow("127.0.0.1", 42003, self.apply_fy_wall)
        self.assertTrue(ref_data, f"the control: the reference cut the flow? {ref_after}")
        self.assertFalse(fy_data, f"data passed fy-wall: {fy_data}")
        self.assertEqual(fy_after["outcome"], "reset", fy_after)

    def test_an_inbound_connection_answered_by_a_vm_listener_is_admitted_by_design(self):
        """Replies on flows others opened to the VM's listeners pass (a port
        the VM forwards on a non-loopback address), as under the reference."""
        srv = n.Server(self.ns, "vm-any", "tcp:0.0.0.0:42004", cgroup=self.slice)
        r = n.probe(self.pub, 0, "tcp", HOST, 42004)
        self.assertEqual(r["outcome"], "ok", r)
        self.assertTrue(srv.seen_from(PUB), srv.records())

    # ---- the VM user: what keys the wall is what the process cannot change ----

    def test_the_vm_user_in_its_slice_is_walled_like_any_vm_process(self):
        """The VM's own processes, as the VM user in the slice: the band, DNS
        and their own listeners, and nothing else."""
        def vm_user(kind, host, port):
            return n.probe(self.ns, VM_UID, kind, host, port, cgroup=self.slice)
        self.ok(vm_user("tcp", "127.0.0.1", 41000), "lo tcp 127.0.0.1:41000")
        self.ok(vm_user("udp", PUB, 53), "public udp")
        self.ok(vm_user("tcp", "127.0.0.1", 42001), "vm tcp 127.0.0.1:42001")
        seen = len(self.pub_srv.records())
        self.assertEqual(vm_user("tcp", PUB, 443)["outcome"], "refused")
        self.assertEqual(vm_user("udp", PUB, 443)["outcome"], "eperm")
        self.assertEqual(vm_user("tcp", "127.0.0.1", 42000)["outcome"], "refused")
        self.assertEqual(len(self.pub_srv.records()), seen)

    def test_a_process_that_leaves_its_slice(self):
        """Under a delegated user@UID.service (what docs/fy-wall.md gave), the
        VM user owns the slice's ancestors: a process in the slice writes its
        own pid into a sibling's cgroup.procs and is out of it. Keyed on the
        slice alone (the control), it then reached the public host. fy-wall
        refuses that layout, and loaded anyway its uid rule still judges the
        process; in a slice only root can write, the move itself fails."""
        deleg_rel = f"{self.base}/deleg"  # user@UID.service: Delegate=yes, its user owns it
        slice_rel = f"{deleg_rel}/fy-machine-d.slice"
        for d in (n.cgroup(deleg_rel), n.cgroup(slice_rel), n.cgroup(f"{deleg_rel}/other.slice")):
            for f in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
                os.chown(os.path.join(d, f), VM_UID, VM_UID)  # as systemd delegates
        slice, other = n.cgroup(slice_rel), n.cgroup(f"{deleg_rel}/other.slice")
        # Only the walls of this slice, while they are tried (the class's wall
        # for the other slice names the same VM user).
        self.assertEqual(self.ident.fy_wall(self.ns, "remove", "host", "--vm", "test").returncode,
                         0)
        try:
            seen = len(self.pub_srv.seen_from(HOST))
            self.load(self.rendering("d", slice_rel, drop=("meta skuid", "meta skgid")))
            move, r = self.leave_then(slice, other, "tcp", PUB, 443)
            self.assertEqual(move, {"move": "moved", "cgroup": f"/{deleg_rel}/other.slice"})
            self.assertEqual(r["outcome"], "ok", f"the control: the slice alone held? {r}")
            self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen + 1)

            a = self.ident.fy_wall(self.ns, "apply", "host", "--vm", "d", "--user", VM_NAME,
                                   "--cgroup", slice_rel, "--ports", ",".join(BAND))
            self.assertEqual(a.returncode, 4, a.stdout + a.stderr)
            self.assertIn(f"the cgroup '{deleg_rel}', an ancestor of the VM's slice "
                          f"'{slice_rel}', has a cgroup.procs the VM user '{VM_NAME}' can write "
                          f"(owner uid {VM_UID}", a.stderr)
            self.assertIn("not under a user@UID.service", a.stderr)

            self.load(self.rendering("d", slice_rel))
            seen = len(self.pub_srv.seen_from(HOST))
            for kind, want in (("tcp", "refused"), ("udp", "eperm")):
                move, r = self.leave_then(slice, other, kind, PUB, 443)
                self.assertEqual(move["move"], "moved")
                self.assertEqual(r["outcome"], want, f"{kind}: {r}")
            self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen, "the public host saw it")
        finally:
            n.in_ns(self.ns, "nft", "delete", "table", "inet", "fy_host_wall_d", check=False)
            self.apply_fy_wall()

        move, r = self.leave_then(self.slice, self.sibling, "tcp", PUB, 443)
        self.assertEqual(move, {"move": "Permission denied", "cgroup": f"/{self.slice_rel}"})
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen)

    def test_a_deputy_of_the_vm_user_outside_the_slice(self):
        """A process of the VM user outside the slice — what `systemd-run --user`,
        D-Bus activation, a lingering user manager or cron would start — dials
        for a process in the slice that asks it over a unix socket. Keyed on
        the slice alone (the control) the public host answered; keyed on the
        VM user, the deputy is refused, and `status` names it."""
        d = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-deputy-")
        n.on_cleanup(lambda: shutil.rmtree(d, ignore_errors=True), f"dir {d}")
        os.chmod(d, 0o755)
        os.chown(d, VM_UID, VM_UID)
        path = os.path.join(d, "bus")
        dep = n.Server(self.ns, "vmdeputy", f"unix:{path}", uid=VM_UID, cgroup=self.sibling,
                       script=n.DEPUTY)
        try:
            def ask():
                r = n.sh(*n.in_cgroup(self.slice, n.nsexec(self.ns, *as_vm_user(
                    n.PY, "-c", ASK, path, PUB, 443))), check=False, timeout=30)
                return r.stdout.strip() + r.stderr.strip()
            seen = len(self.pub_srv.seen_from(HOST))
            try:
                self.load(self.rendering("test", self.slice_rel, drop=("meta skuid", "meta skgid")))
                self.assertEqual(ask(), f"relayed public tcp {PUB}:443",
                                 "the control: the slice alone held?")
            finally:
                self.apply_fy_wall()
            self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen + 1)
            self.assertEqual(ask(), "relay-failed ECONNREFUSED")
            r = n.probe(self.ns, VM_UID, "udp", PUB, 443, cgroup=self.sibling)
            self.assertEqual(r["outcome"], "eperm", r)
            self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen + 1)
            st = self.status()
            self.assertEqual(st.returncode, 1, st.stdout)
            self.assertIn(f"VM user {VM_NAME} (uid {VM_UID}, gid {VM_UID}): 1 process(es) "
                          "OUTSIDE the slice", st.stdout)
            self.assertIn(f"  pid {dep.p.pid} (python3) uid {VM_UID} gid {VM_UID} in "
                          f"/{self.base}/other.slice: ", st.stdout)
        finally:
            os.killpg(dep.p.pid, signal.SIGKILL)
            dep.p.wait(timeout=10)

    def test_a_set_user_id_program_keeps_the_vm_users_group(self):
        """A set-user-ID program (owned by another uid) that the VM user runs
        outside the slice makes its sockets as that uid; its group stays the
        VM user's, and the wall's gid rule judges them. Without that rule
        (the control) the program reached the public host."""
        d = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-suid-")
        n.on_cleanup(lambda: shutil.rmtree(d, ignore_errors=True), f"dir {d}")
        os.chmod(d, 0o755)
        prog = os.path.join(d, "python3")
        shutil.copy(os.path.realpath(n.PY), prog)
        os.chown(prog, n.OTHER_UID, 0)
        os.chmod(prog, 0o4755)

        def run(*args):
            return n.sh(*n.in_cgroup(self.sibling, n.nsexec(self.ns, *as_vm_user(prog, *args))),
                        check=False, timeout=30).stdout.strip()
        ids = run("-c", "import os; print(os.getuid(), os.geteuid(), os.getegid())")
        self.assertEqual(ids, f"{VM_UID} {n.OTHER_UID} {VM_UID}", "not a set-user-ID run")
        probe = (n.PROBE, "tcp", PUB, 443, "--timeout", "2")
        try:
            self.load(self.rendering("test", self.slice_rel, drop=("meta skgid",)))
            r = json.loads(run(*probe))
            self.assertEqual(r["outcome"], "ok", f"the control: the uid rule held? {r}")
        finally:
            self.apply_fy_wall()
        seen = len(self.pub_srv.seen_from(HOST))
        r = json.loads(run(*probe))
        self.assertEqual(r["outcome"], "refused", r)
        self.assertEqual(len(self.pub_srv.seen_from(HOST)), seen)

    def test_status_names_the_vm_users_processes_outside_the_slice(self):
        """`status host` lists every process of the VM user outside the slice
        (a sibling slice, the test's own cgroup), not the ones in it, and exits
        1 until they are gone."""
        procs = {where: n.spawn(n.in_cgroup(cg, as_vm_user("sleep", "60")) if cg
                                else as_vm_user("sleep", "60"))
                 for where, cg in (("inside", self.slice), ("sibling", self.sibling),
                                   ("own", None))}
        deadline = time.monotonic() + 10
        for p in procs.values():  # until each has exec'd sleep, in its cgroup
            while True:
                with open(f"/proc/{p.pid}/cmdline") as f:
                    if f.read().startswith("sleep"):
                        break
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.02)
        try:
            st = self.status()
            self.assertEqual(st.returncode, 1, st.stdout)
            self.assertIn("table inet fy_host_wall_test: PRESENT, as rendered", st.stdout)
            self.assertIn(f"VM user {VM_NAME} (uid {VM_UID}, gid {VM_UID}): 2 process(es) "
                          "OUTSIDE the slice (1 in it):", st.stdout)
            self.assertIn(f"  pid {procs['sibling'].pid} (sleep) uid {VM_UID} gid {VM_UID} in "
                          f"/{self.base}/other.slice: sleep 60", st.stdout)
            self.assertIn(f"  pid {procs['own'].pid} (sleep) uid {VM_UID}", st.stdout)
            self.assertNotIn(f"pid {procs['inside'].pid} ", st.stdout)
            self.assertIn("find what started each", st.stdout)
        finally:
            for where in ("sibling", "own"):
                os.killpg(procs[where].pid, signal.SIGKILL)
                procs[where].wait(timeout=10)
        st = self.status()
        self.assertEqual(st.returncode, 0, st.stdout)
        self.assertIn(f"VM user {VM_NAME} (uid {VM_UID}, gid {VM_UID}): 1 process(es), every one "
                      "in the slice", st.stdout)
        self.assertIn(f"slice {self.slice_rel}: only root can move a process out of it",
                      st.stdout)

    def test_a_missing_slice_is_refused(self):
        r = self.ident.fy_wall(self.ns, "apply", "host", "--vm", "absent", "--user", VM_NAME,
                               "--cgroup", f"{self.base}/absent.slice", "--ports", "41000-41199")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"the cgroup '{self.base}/absent.slice' does not exist", r.stderr)
        self.assertIn("start the VM's slice first", r.stderr)

    def test_a_recreated_slice_needs_a_reapply_and_status_says_so(self):
        rel = f"{self.base}/fy-machine-stale.slice"
        path = n.cgroup(rel)
        args = ["--vm", "stale", "--user", VM_NAME, "--cgroup", rel, "--ports", "41000-41199"]
        self.assertEqual(self.ident.fy_wall(self.ns, "apply", "host", *args).returncode, 0)
        self.assertEqual(self.ident.fy_wall(self.ns, "status", "host", *args).returncode, 0)
        os.rmdir(path)
        os.mkdir(path)  # same path, new cgroup id: the rule no longer matches it
        st = self.ident.fy_wall(self.ns, "status", "host", *args)
        self.assertEqual(st.returncode, 1, st.stdout)
        self.assertIn("DIFFERS", st.stdout)
        self.assertEqual(self.ident.fy_wall(self.ns, "apply", "host", *args).returncode, 0)
        self.assertEqual(self.ident.fy_wall(self.ns, "status", "host", *args).returncode, 0)
        r = self.ident.fy_wall(self.ns, "remove", "host", "--vm", "stale")
        self.assertIn("removed inet fy_host_wall_stale", r.stdout)


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)

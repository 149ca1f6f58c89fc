"""Real network namespaces, listeners, probes and cgroups for fy-wall's proofs.

Everything a test makes is named fyw-<pid>-... and registered for undoing the
moment it exists; the undo list runs LIFO at the end of each test class, at
interpreter exit, and on SIGTERM/SIGINT/SIGHUP (meson's timeout sends SIGTERM),
so a failing or killed test leaves nothing behind. Leftovers of a test process
that died by SIGKILL are swept by the next run (their pid is gone).

Traffic only ever goes to addresses inside namespaces made here, or loopback.
"""
import errno
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("FY_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("FY_BUILD_DIR", os.path.join(SOURCE, "build-wall"))
FY_WALL = os.path.join(BUILD, "wall", "fy-wall")
PROBE = os.path.join(HERE, "probe.py")
SERVE = os.path.join(HERE, "serve.py")
DEPUTY = os.path.join(HERE, "deputy.py")
EXOTIC = os.path.join(HERE, "exotic.py")
PID = os.getpid()
# fy-wall's resolver defaults come from this resolv.conf, not the machine's.
os.environ.setdefault("FY_WALL_RESOLV_CONF", os.path.join(HERE, "resolv.conf"))

# The walled test user. It exists only in the passwd file fy-wall is shown
# (bind-mounted over /etc/passwd in a private mount namespace), so the
# machine's own passwd database is never touched.
WALLED_NAME = "fywalice"
WALLED_ALIAS = "fywalias"
WALLED_UID = 4242
SUBUID_START, SUBUID_COUNT = 100000, 65536
OTHER_UID = 4343  # a user who is not walled
# The host wall's VM user in the configs that are only rendered and applied
# (no process runs as it: `status host` would name any outside the slice).
VM_NAME, VM_UID = "fywvm", 4646


# ---- undo list ---------------------------------------------------------

_undo = []


def on_cleanup(fn, what):
    _undo.append((fn, what))
    return len(_undo)


def cleanup(to=0):
    """Runs the undo list down to `to` entries, newest first."""
    while len(_undo) > to:
        fn, what = _undo.pop()
        try:
            fn()
        except Exception as e:  # keep undoing the rest
            print(f"cleanup of {what} failed: {e}", file=sys.stderr)


def _on_signal(signum, _frame):
    cleanup()
    os._exit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, _on_signal)
import atexit  # noqa: E402

# The shared primitives (tests/lib); the tests use fywnet.sh, .cgroup2_root,
# .in_cgroup and .remove_cgroup_tree through this module.
from fyproc import alive as _alive, sh  # noqa: E402,F401
from fynet import (cgroup2_root, in_cgroup, make_cgroup, netns_add,  # noqa: E402,F401
                   netns_del, nsenter, remove_cgroup_tree, sweep_netns, veth_pair)

atexit.register(cleanup)


def sweep_stale():
    """Deletes fyw-<pid>-* namespaces and cgroups whose test process is gone."""
    sweep_netns(r"fyw-(\d+)-")
    root = cgroup2_root()
    for name in os.listdir(root):
        m = re.match(r"fyw-(\d+)-", name)
        if m and not _alive(int(m.group(1))):
            remove_cgroup_tree(os.path.join(root, name))


def set_nf_log_all_netns():
    """Lets nf_log write from non-initial namespaces (net.netfilter.nf_log_all_netns).

    It is one host-wide switch, off by default, and the deny lines are only
    seen with it on. It is left on: turning it off here could hide another
    concurrently running test's log lines; on, it only lets namespaces log.
    """
    path = "/proc/sys/net/netfilter/nf_log_all_netns"
    with open(path) as f:
        if f.read().strip() == "1":
            return
    with open(path, "w") as f:
        f.write("1")


# ---- namespaces, links, processes --------------------------------------

def netns(role):
    name = f"fyw-{PID}-{secrets.token_hex(2)}-{role}"
    netns_add(name, lo_up=False)
    on_cleanup(lambda: netns_del(name), f"netns {name}")
    sh("ip", "-n", name, "link", "set", "lo", "up")
    return name


def nsexec(ns, *cmd):
    return nsenter(ns, *cmd)


def in_ns(ns, *cmd, check=True, timeout=30):
    return sh(*nsexec(ns, *cmd), check=check, timeout=timeout)


def veth(ns_a, addrs_a, ns_b, addrs_b):
    """A veth pair between two namespaces; addrs are "ip/len" strings."""
    tag = secrets.token_hex(3)
    a, b = f"fyw{tag}a", f"fyw{tag}b"
    veth_pair(a, b)
    # If the move fails, the pair is still in this namespace: undo it here.
    on_cleanup(lambda: sh("ip", "link", "del", a, check=False), f"veth {a}")
    sh("ip", "link", "set", a, "netns", ns_a)
    sh("ip", "link", "set", b, "netns", ns_b)
    for ns, dev, addrs in ((ns_a, a, addrs_a), (ns_b, b, addrs_b)):
        for ad in addrs:
            extra = ["nodad"] if ":" in ad else []
            sh("ip", "-n", ns, "addr", "add", ad, "dev", dev, *extra)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    return a, b


def spawn(cmd, **kw):
    p = subprocess.Popen([str(c) for c in cmd], start_new_session=True, **kw)

    def stop():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=10)
        for f in (p.stdin, p.stdout, p.stderr):
            if f:
                f.close()

    on_cleanup(stop, f"process {cmd[:4]}")
    return p


def cgroup(relative):
    """Makes a cgroup (and its parents) below the cgroup2 mount; removed at
    cleanup, after the processes started in it later are gone."""
    path, made = make_cgroup(cgroup2_root(), relative)
    for d in made:
        on_cleanup(lambda d=d: os.rmdir(d), f"cgroup {d}")
    return path


class Server:
    """serve.py in a namespace (as root unless `uid`); `records()` are its stdout lines."""

    def __init__(self, ns, name, *specs, cgroup=None, uid=0, script=None):
        fd, self.log = tempfile.mkstemp(prefix=f"fyw-{PID}-serve-")
        on_cleanup(lambda: os.unlink(self.log), f"log {self.log}")
        inner = [PY, script or SERVE, name, *specs]
        if uid:
            inner = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner]
        cmd = nsexec(ns, *inner)
        if cgroup:
            cmd = in_cgroup(cgroup, cmd)
        self.p = spawn(cmd, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)
        deadline = time.monotonic() + 10
        while "READY" not in self._text():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"listener {name} did not start: {self._text()}")
            time.sleep(0.02)

    def _text(self):
        with open(self.log) as f:
            return f.read()

    def records(self):
        return [l for l in self._text().splitlines() if l and l != "READY"]

    def seen_from(self, src_ip, local=None):
        """Records of connections or datagrams from src_ip (to `local` if given)."""
        out = []
        for r in self.records():
            if f" from {src_ip}:" not in r and f" from [{src_ip}]:" not in r:
                continue
            if local and f" {local} " not in r + " ":
                continue
            out.append(r)
        return out


def probe(ns, uid, kind, host, port, *extra, timeout=2.0, gid=None, cgroup=None):
    """One probe.py attempt in `ns` as `uid` (0 = root); returns its JSON.

    With `cgroup`, the process joins that cgroup (a path under the cgroup2
    mount) before it makes its socket, so the socket belongs to it.
    """
    inner = [PY, PROBE, kind, host, str(port), "--timeout", str(timeout), *map(str, extra)]
    if uid != 0:
        g = uid if gid is None else gid
        inner = ["setpriv", f"--reuid={uid}", f"--regid={g}", "--clear-groups", *inner]
    cmd = nsexec(ns, *inner)
    if cgroup:
        cmd = in_cgroup(cgroup, cmd)
    r = sh(*cmd, check=False, timeout=timeout + 15)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"probe gave no result: rc={r.returncode} {r.stdout!r} {r.stderr!r}")


# The two below run as root inside a namespace (python -c under nsenter).
_CT_FLUSH = """
import socket, struct
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
# IPCTNL_MSG_CT_DELETE (ctnetlink = subsystem 1) with no tuple: every IPv4 entry
s.send(struct.pack("=LHHLL", 20, (1 << 8) | 2, 0x5, 1, 0) + struct.pack("=BBH", 2, 0, 0))
err = struct.unpack("=i", s.recv(4096)[16:20])[0]
raise SystemExit(f"ctnetlink flush failed: errno {-err}" if err else 0)
"""

_TCP_INJECT = """
import socket, struct, sys
src, sport, dst, dport, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def csum(b):
    b += b"\\0" * (len(b) % 2)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
sa, da = socket.inet_aton(src), socket.inet_aton(dst)
tcp = struct.pack("!HHLLBBHHH", sport, dport, 12345, 67890, 5 << 4, 0x18, 65535, 0, 0) + b"x"
tcp = tcp[:16] + struct.pack("!H", csum(sa + da + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, sa, da)
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
s.sendto(ip + tcp, (dst, 0))
"""


def conntrack_flush(ns):
    """Deletes every IPv4 conntrack entry of `ns` (ctnetlink), as their
    expiry or eviction would."""
    in_ns(ns, PY, "-c", _CT_FLUSH)


def inject_tcp(ns, src, sport, dst, dport, mark):
    """Sends one TCP segment (ACK|PSH, one byte, arbitrary sequence numbers)
    from src:sport to dst:dport through a raw socket in `ns`, with SO_MARK
    `mark` (so a test rule can exempt it from conntrack)."""
    in_ns(ns, PY, "-c", _TCP_INJECT, src, sport, dst, dport, mark)


class KernelLog:
    """Reads the kernel log records written after mark()."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        fd = self.fd
        on_cleanup(lambda: os.close(fd), "kmsg fd")
        self.seen = []
        self.mark()

    def mark(self):
        os.lseek(self.fd, 0, os.SEEK_END)
        self.seen = []

    def _read(self):
        while True:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue
                raise
            text = rec.decode(errors="replace")
            self.seen.append(text.split(";", 1)[-1].split("\n", 1)[0])

    def wait_for(self, *needles, timeout=10.0):
        """The first record since mark() holding every needle, or None after
        `timeout` seconds. The default is for a line that is expected (it
        returns as soon as it is there; 3 s once flaked under ASan): a wait that
        asserts a line does NOT come passes a short timeout of its own."""
        deadline = time.monotonic() + timeout
        while True:
            self._read()
            for line in self.seen:
                if all(n in line for n in needles):
                    return line
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def count(self, *needles):
        self._read()
        return sum(1 for line in self.seen if all(n in line for n in needles))


# ---- fy-wall as the tests run it ----------------------------------------

class Identity:
    """A passwd file holding the machine's entries plus the walled test user
    and the host wall's VM user, and a subuid file, in a private temp dir."""

    def __init__(self, with_subuid=True):
        self.dir = tempfile.mkdtemp(prefix=f"fyw-{PID}-id-")
        on_cleanup(lambda: sh("rm", "-rf", self.dir, check=False), f"dir {self.dir}")
        os.chmod(self.dir, 0o755)
        with open("/etc/passwd") as f:
            base = f.read()
        self.passwd = os.path.join(self.dir, "passwd")
        with open(self.passwd, "w") as f:
            f.write(base)
            f.write(f"{WALLED_NAME}:x:{WALLED_UID}:{WALLED_UID}::/nonexistent:/bin/sh\n")
            f.write(f"{VM_NAME}:x:{VM_UID}:{VM_UID}::/nonexistent:/usr/sbin/nologin\n")
            # A second login name of the same uid: shadow's newuidmap takes its
            # subuid lines as the user's too (test_subid.py, test_render.py).
            f.write(f"{WALLED_ALIAS}:x:{WALLED_UID}:{WALLED_UID}::/nonexistent:/bin/sh\n")
        os.chmod(self.passwd, 0o644)
        self.subuid = os.path.join(self.dir, "subuid")
        with open(self.subuid, "w") as f:
            if with_subuid:
                f.write(f"{WALLED_NAME}:{SUBUID_START}:{SUBUID_COUNT}\n")
        os.chmod(self.subuid, 0o644)

    def fy_wall(self, ns, *args, timeout=60, env=None, binds=()):
        """Runs fy-wall (in `ns`, or in no particular namespace when None)
        seeing the test's passwd file as /etc/passwd, and each (file, over)
        of `binds` bind-mounted over `over` (e.g. an nsswitch.conf)."""
        return self.run_as_system(ns, FY_WALL, *args, timeout=timeout, env=env, binds=binds)

    def run_as_system(self, ns, *cmd, timeout=60, env=None, binds=(), input=None):
        """Runs `cmd` in a private mount namespace where the test's passwd
        file is /etc/passwd (and `binds` are mounted), in `ns` if given."""
        inner = list(map(str, cmd))
        if ns:
            inner = nsexec(ns, *inner)
        mounts = "".join(f'mount --bind "{src}" "{dst}" && ' for src, dst in binds)
        script = 'mount --bind "$0" /etc/passwd && ' + mounts + 'exec "$@"'
        full = ["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                self.passwd, *inner]
        return sh(*full, check=False, timeout=timeout, env=env, input=input)


def status_denied(stdout):
    """The deny lines `fy-wall status` printed (after its "denied:" line)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("denied: "):
            return [l.strip() for l in lines[i + 1:] if l.startswith("  [")]
    return None


def machine_args(ident, ports="41000-41089,41100-41189", user=WALLED_NAME):
    return ["--user", user, "--gateway", "192.168.5.2", "--ports", ports,
            "--subuid-file", ident.subuid]


def guard_args(ident, ports="41000-41089,41100-41189", user=WALLED_NAME):
    return machine_args(ident, ports, user)


class GuestTopology:
    """The guest, the host and the internet, as the machine wall sees them.

        guest  192.168.5.15/24  fd00:5::15/64   (the walled user, root, the forwarder)
          | veth
        host   192.168.5.2/24   fd00:5::2/64    (the gateway: band 41000, off-band 41095,
          |                                       a private resolver on 53)
          | veth, forwarding
        public 203.0.113.10/24  2001:db8:1::10/64  (TCP 443 and 53, UDP 53 and 443)
               host side 203.0.113.1, 2001:db8:1::1

    With `container`, a fourth namespace stands for a rootful container whose
    traffic the guest forwards: ctr 10.89.0.2/24 via the guest's 10.89.0.1.
    """

    GW = "192.168.5.2"
    GUEST = "192.168.5.15"
    PUBLIC = "203.0.113.10"
    PUBLIC6 = "2001:db8:1::10"
    HOST_OTHER = "203.0.113.1"
    CTR = "10.89.0.2"

    def __init__(self, container=False):
        self.guest = netns("guest")
        self.host = netns("host")
        self.pub = netns("pub")
        veth(self.guest, ["192.168.5.15/24", "fd00:5::15/64"],
             self.host, ["192.168.5.2/24", "fd00:5::2/64"])
        veth(self.host, ["203.0.113.1/24", "2001:db8:1::1/64"],
             self.pub, ["203.0.113.10/24", "2001:db8:1::10/64"])
        sh("ip", "-n", self.guest, "route", "add", "default", "via", self.GW)
        sh("ip", "-n", self.guest, "-6", "route", "add", "default", "via", "fd00:5::2")
        sh("ip", "-n", self.pub, "route", "add", "default", "via", "203.0.113.1")
        sh("ip", "-n", self.pub, "-6", "route", "add", "default", "via", "2001:db8:1::1")
        for ns in (self.host, self.guest):
            in_ns(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        if container:
            self.ctr = netns("ctr")
            veth(self.ctr, ["10.89.0.2/24"], self.guest, ["10.89.0.1/24"])
            sh("ip", "-n", self.ctr, "route", "add", "default", "via", "10.89.0.1")
            sh("ip", "-n", self.host, "route", "add", "10.89.0.0/24", "via", self.GUEST)
            sh("ip", "-n", self.pub, "route", "add", "10.89.0.0/24", "via", "203.0.113.1")
        self.host_srv = Server(self.host, "host",
                               f"tcp:{self.GW}:41000", f"tcp:{self.GW}:41100",
                               f"tcp:{self.GW}:41095", f"udp:{self.GW}:53",
                               f"tcp:{self.GW}:53", f"udp:{self.GW}:41000",
                               f"tcp:{self.HOST_OTHER}:41000")
        self.pub_srv = Server(self.pub, "public",
                              f"tcp:{self.PUBLIC}:443", f"tcp:{self.PUBLIC}:53",
                              f"udp:{self.PUBLIC}:53", f"udp:{self.PUBLIC}:443",
                              f"udp:{self.PUBLIC}:5353",
                              f"tcp:[{self.PUBLIC6}]:443")

    def warm_up(self):
        """Root reaches the public v4 and v6 listeners before any wall: the
        routes work, and neighbour discovery has settled (a first IPv6
        connect can time out while it does)."""
        for kind, host, port in (("tcp", self.PUBLIC, 443), ("tcp", self.PUBLIC6, 443),
                                 ("tcp", self.GW, 41000)):
            deadline = time.monotonic() + 15
            while True:
                r = probe(self.guest, 0, kind, host, port, timeout=1.0)
                if r["outcome"] == "ok":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topology broken: root cannot reach {host}:{port}: {r}")


def log_addr(ip):
    """An address as nf_log prints it (IPv6 fully expanded)."""
    import ipaddress
    a = ipaddress.ip_address(ip)
    return a.exploded if a.version == 6 else str(a)


def reference_machine_wall():
    """The reference's exact tables (wall-lifecycle-filter.md section 1), for
    the controls that show why fy-wall departs from them (docs/wall-escapes.md)."""
    u = f"{WALLED_UID}, {SUBUID_START}-{SUBUID_START + SUBUID_COUNT - 1}"
    private = "{ 127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 }"
    return f"""table inet fy_wall
delete table inet fy_wall
table ip6 fy_wall6
delete table ip6 fy_wall6
table inet fy_wall {{
  chain output {{
    type filter hook output priority 0; policy accept;
    oifname "lo" accept
    ct state established,related accept
    meta skuid != {{ {u} }} accept
    ip daddr {private} udp dport 53 accept
    ip daddr {private} tcp dport 53 accept
    ip daddr {GuestTopology.GW} tcp dport {{ 41000-41089, 41100-41189 }} accept
    log prefix "fy-wall-deny " counter
    meta l4proto tcp reject with tcp reset
    reject
  }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    ct state established,related accept
    ip daddr {private} accept
    log prefix "fy-wall-deny-fwd " counter
    reject
  }}
}}
table ip6 fy_wall6 {{
  chain output {{
    type filter hook output priority 0; policy accept;
    meta skuid != {{ {u} }} accept
    oifname "lo" accept
    log prefix "fy-wall-deny6 " counter
    reject
  }}
}}
"""

"""The DNS path as fy-dnsfwd's proofs and benchmark build it (fywnet's undo
list and naming: everything is fyw-<pid>-..., undone at the end).

    ctr     10.89.0.2/24        a container in the bridge namespace
      |
    bridge  10.89.0.1/24        the rootless bridge namespace: fy-dnsfwd's
      |                         second listener, 10.89.0.1:53 (as aardvark's)
      |  (no route out: the proofs need only its listener)
    guest   192.168.5.15/24     walled uid 4242 (+subuid); fy-dnsfwd as root on
      |                         127.42.0.53:53; fy-wall's machine wall
    host    192.168.5.2/24, 192.168.5.3/24   the resolver stand-in on
      |                         192.168.5.3:53 (Lima's address), recursing to pub
      |  (and lan 10.9.0.9, a private host whose :53 is a plain listener)
    pub     203.0.113.10/24     the authoritative stand-in for every name: the
                                other end of a DNS tunnel
"""
import json
import os
import resource
import subprocess
import tempfile
import time

import fywnet as n

DNSSERVE = os.path.join(n.HERE, "dnsserve.py")
DNSPROBE = os.path.join(n.HERE, "dnsprobe.py")
FY_DNSFWD = os.path.join(n.BUILD, "wall", "dnsfwd", "fy-dnsfwd")
FY_DNSFWD_ALLOW = os.path.join(n.BUILD, "wall", "dnsfwd", "fy-dnsfwd-allow")
DNSFWD_STATUS = os.path.join(n.BUILD, "tests", "wall", "dnsfwd_status_probe")
FWD = "127.42.0.53"
RESOLVER = "192.168.5.3"
LAN = "10.9.0.9"
GUEST = "192.168.5.15"
CTR = "10.89.0.2"
BRIDGE_GW = "10.89.0.1"
ALLOW = ["github.com", "pypi.org"]


class Stand:
    """A dnsserve.py (or any READY-printing listener) whose stdout lines are
    JSON records."""

    def __init__(self, ns, *args):
        fd, self.path = tempfile.mkstemp(prefix=f"fyw-{n.PID}-dns-")
        n.on_cleanup(lambda: os.unlink(self.path), f"log {self.path}")
        self.p = n.spawn(n.nsexec(ns, n.PY, DNSSERVE, *args), stdout=fd,
                         stderr=subprocess.STDOUT)
        os.close(fd)
        deadline = time.monotonic() + 10
        while "READY" not in self.text():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dnsserve {args} did not start: {self.text()}")
            time.sleep(0.02)

    def text(self):
        with open(self.path) as f:
            return f.read()

    def records(self):
        out = []
        for line in self.text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


class DnsTopology:
    def __init__(self):
        self.guest = n.netns("guest")
        self.host = n.netns("host")
        self.pub = n.netns("pub")
        self.lan = n.netns("lan")
        self.bridge = n.netns("bridge")
        self.ctr = n.netns("ctr")
        n.veth(self.guest, [f"{GUEST}/24"], self.host, ["192.168.5.2/24", f"{RESOLVER}/24"])
        n.veth(self.host, ["203.0.113.1/24"], self.pub, ["203.0.113.10/24"])
        n.veth(self.host, ["10.9.0.1/24"], self.lan, [f"{LAN}/24"])
        n.veth(self.ctr, [f"{CTR}/24"], self.bridge, [f"{BRIDGE_GW}/24"])
        n.sh("ip", "-n", self.guest, "route", "add", "default", "via", "192.168.5.2")
        n.sh("ip", "-n", self.pub, "route", "add", "default", "via", "203.0.113.1")
        n.sh("ip", "-n", self.lan, "route", "add", "default", "via", "10.9.0.1")
        n.sh("ip", "-n", self.ctr, "route", "add", "default", "via", BRIDGE_GW)
        n.in_ns(self.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.auth = Stand(self.pub, "auth", "203.0.113.10")
        self.resolver = Stand(self.host, "recursor", RESOLVER, "203.0.113.10")
        self.lan_srv = n.Server(self.lan, "lan", f"tcp:{LAN}:53", f"udp:{LAN}:53")
        self.ident = n.Identity()

    # ---- fy-wall ----

    def wall(self, forwarder=True, resolvers=RESOLVER):
        """The machine wall; `forwarder`: with dns_forwarder (the new rules),
        else as it is on main (DNS admitted to `resolvers`)."""
        fd, cfg = tempfile.mkstemp(prefix=f"fyw-{n.PID}-wall-", suffix=".toml")
        n.on_cleanup(lambda: os.unlink(cfg), f"file {cfg}")
        with os.fdopen(fd, "w") as f:
            f.write("[machine]\n")
            if forwarder:
                f.write(f'dns_forwarder = "{FWD}"\n')
        os.chmod(cfg, 0o644)
        r = self.ident.fy_wall(self.guest, "apply", "machine", "--config", cfg,
                               *n.machine_args(self.ident), "--resolvers", resolvers)
        assert r.returncode == 0, r.stderr
        self.wall_config = cfg
        return r

    # ---- fy-dnsfwd ----

    def dnsfwd_config(self, upstream=RESOLVER, rate=20, burst=20, allow=None, listen=None,
                      extra="", timeout_ms=500):
        fd, path = tempfile.mkstemp(prefix=f"fyw-{n.PID}-dnsfwd-", suffix=".toml")
        n.on_cleanup(lambda: os.unlink(path), f"file {path}")
        allow = ALLOW if allow is None else allow
        listen = listen if listen is not None else [
            (FWD, "", "vm"), (BRIDGE_GW, f"/run/netns/{self.bridge}", "bridge")]
        with os.fdopen(fd, "w") as f:
            f.write(f'upstream = ["{upstream}"]\n')
            f.write("allow = [" + ", ".join(f'"{a}"' for a in allow) + "]\n")
            f.write(f"rate = {rate}\nburst = {burst}\ntimeout_ms = {timeout_ms}\n{extra}")
            for addr, ns, name in listen:
                f.write(f'[[listen]]\naddress = "{addr}"\nname = "{name}"\n')
                if ns:
                    f.write(f'netns = "{ns}"\n')
        return path

    def start_dnsfwd(self, config, nofile=None):
        """fy-dnsfwd as root in the guest, with RLIMIT_NOFILE raised to
        `nofile` (soft and hard) when given; returns (process, query log path,
        stderr path)."""
        fd, log = tempfile.mkstemp(prefix=f"fyw-{n.PID}-dnslog-")
        n.on_cleanup(lambda: os.unlink(log), f"log {log}")
        efd, err = tempfile.mkstemp(prefix=f"fyw-{n.PID}-dnserr-")
        n.on_cleanup(lambda: os.unlink(err), f"log {err}")
        limit = None
        if nofile:
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        p = n.spawn(n.nsexec(self.guest, FY_DNSFWD, "--config", config), stdout=fd, stderr=efd,
                    preexec_fn=limit)
        os.close(fd)
        os.close(efd)
        deadline = time.monotonic() + 10
        while True:
            with open(err) as f:
                text = f.read()
            if " ready" in text:
                break
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fy-dnsfwd did not start: {text}")
            time.sleep(0.02)
        return p, log, err


def stop_dnsfwd(p, err):
    """SIGTERM, then the exit code and stderr; a sanitizer's report (the
    ASan+UBSan build runs these proofs too) or an unclean exit is an error."""
    p.terminate()
    rc = p.wait(timeout=10)
    with open(err) as f:
        text = f.read()
    for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        if bad in text:
            raise AssertionError(f"fy-dnsfwd: {bad}\n{text[-3000:]}")
    if rc != 0:
        raise AssertionError(f"fy-dnsfwd exited {rc} on SIGTERM: {text[-2000:]}")
    return text


def read_log(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.startswith("{")]


def _dnsprobe_cmd(ns, uid, args):
    inner = [n.PY, DNSPROBE, *map(str, args)]
    if uid:
        inner = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner]
    return [str(c) for c in n.nsexec(ns, *inner)]


def _dnsprobe_json(out, err):
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"dnsprobe gave no result: {out!r} {err!r}")


def dnsprobe(ns, uid, *args, timeout=20):
    r = n.sh(*_dnsprobe_cmd(ns, uid, args), check=False, timeout=timeout)
    return _dnsprobe_json(r.stdout, r.stderr)


def dnsprobe_start(ns, uid, *args):
    """dnsprobe in the background (a query to hold upstream while the test
    asks others); its result is dnsprobe_result()'s."""
    return subprocess.Popen(_dnsprobe_cmd(ns, uid, args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def dnsprobe_result(q, timeout=10):
    out, err = q.communicate(timeout=timeout)
    return _dnsprobe_json(out, err)

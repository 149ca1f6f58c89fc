"""A network-namespace topology for fy-forwarder tests and benchmarks.

The shape of a walled Lima VM with rootless podman (ADR-0034), on one machine:

    fyf-<tag>-<pid>-c<i>  "containers": eth0 10.89.<n>.<10+i>/24, default via the bridge
          |  veth
    fyf-<tag>-<pid>-rl    "rootless" bridge namespace: bridges podman1 (10.89.0.1/24),
                     podman2 (10.89.1.1/24), ...; fy-forwarder's bridge listener
                     lives here, and the forwarder itself installs the redirect
                     that sends <gateway>:<daemon ports> to it, keeping the port
                     (table ip fy_forwarder_redirect, made anew in every namespace
                     it follows, as podman re-creates this one). No route out: the
                     forwarder is the only way to the proxy; a connection to the
                     gateway's daemon ports that nothing redirected is reset
                     (table ip fyf_way_out, standing in for the VM's walls).
    fyf-<tag>-<pid>-vm    the VM's own namespace: eth0 192.168.5.15/24; fy-forwarder runs
          |  veth    here and dials the proxy from here
    fyf-<tag>-<pid>-host  "host": eth0 192.168.5.2/24 (the gateway the VM sees), where the
                     proxy listens; the origin is 198.51.100.80 on lo

Use it as a context manager; it tears everything down whatever happens:

    with Topology("t1", containers=[("podman1", 2), ("podman2", 1)]) as topo:
        proxy = topo.start_in_host(["python3", "recording_proxy.py", ...])
        fwd = topo.start_forwarder(config_text)
        topo.run_in_container(0, ["curl", ...])

Topology(preinstall_redirect=True) puts a redirect of the topology's own (table
ip fyf_redirect) into every rootless namespace it makes, as something other than
the forwarder would; with forwarder_config(redirect=False) that is the only one.

Every name starts with "fyf-" (namespaces, cgroups, files); nothing outside
namespaces this module made is touched, except cgroups under
/sys/fs/cgroup/unified/fyf-<tag>-<pid> (the VM-namespace tests) and files in the
topology's own temporary directory.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from fynet import make_cgroup, netns_add, netns_del, remove_cgroup, remove_cgroup_tree, \
    sweep_netns, veth_pair
from fyproc import alive as _alive, sh  # noqa: F401  (the tests use fyf_topology.sh)

# The VM-namespace tests' cgroups live here (the forwarder reads this hierarchy).
CGROUP_BASE = "/sys/fs/cgroup/unified"


def control_request(sock, command="status", timeout=5.0):
    """One line to fy-forwarder's control socket `sock`, its one-line answer."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect(sock)
        s.sendall((command + "\n").encode())
        data = b""
        while b"\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode().strip()
    finally:
        s.close()

GATEWAY = "192.168.5.2"      # the host as the VM sees it (Lima's default)
VM_ADDR = "192.168.5.15"
ORIGIN = "198.51.100.80"     # an "internet" host in the host namespace
PROXY_PORT = 42600
TOKEN_PORT = 42700           # a token-service port: forwarded, not stamped
VM_LISTEN = "127.42.0.1"
# Every fixed port above lives below EPHEMERAL_FROM, and every namespace the
# topology makes hands out ephemeral ports only from EPHEMERAL_FROM up: a probe
# or a client in the host namespace (source 192.168.5.2) could otherwise be
# given 192.168.5.2:42700 before the token service binds it (seen once in CI:
# "Address already in use" in a namespace made a moment before).
EPHEMERAL_FROM = 50000


def build_dir():
    return os.environ.get("FY_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                       "build-fwd"))


def source_dir():
    return os.environ.get("FY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def new_key_hex():
    return os.urandom(32).hex()


def _die_with_parent():
    # A test runner killed by its timeout takes what it started with it.
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def clean_leftovers(tag):
    """Removes what an earlier run with this tag left behind when it was killed:
    every name carries its runner's pid (fyf-<tag>-<pid>-...), and only runs whose
    pid is gone are cleaned, so concurrent runs of the same test (a CI clone and
    a developer, say) never touch each other."""
    pat = re.compile(r"fyf-%s-(\d+)-" % re.escape(tag))
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                m = pat.search(f.read().decode("latin-1"))
        except OSError:
            continue
        if m and not _alive(int(m.group(1))):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    sweep_netns(pat)
    tmp = tempfile.gettempdir()
    # Mounts a killed run left in its directory (the namespace-visibility tests
    # bind namespaces there), innermost first.
    try:
        with open("/proc/self/mountinfo") as f:
            points = [l.split()[4] for l in f]
    except OSError:
        points = []
    for point in sorted(points, key=len, reverse=True):
        rel = os.path.relpath(point, tmp)
        m = pat.match(rel)
        if not rel.startswith("..") and m and not _alive(int(m.group(1))):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    for name in os.listdir(tmp):
        m = pat.match(name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    try:
        for name in os.listdir(CGROUP_BASE):
            m = pat.match(name + "-")
            if m and not _alive(int(m.group(1))):
                remove_cgroup_tree(os.path.join(CGROUP_BASE, name), kill=True)
    except OSError:
        pass


class Proc:
    """A process started in a namespace; stopped (and waited for) on close()."""

    def __init__(self, popen, name, log_path):
        self.p = popen
        self.name = name
        self.log_path = log_path

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill9(self):
        if self.alive():
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(timeout=10)

    def stop(self, timeout=10):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        return self.p.returncode


class Topology:
    def __init__(self, tag, containers=(("podman1", 2),), route_direct=False,
                 preinstall_redirect=False, ports=(PROXY_PORT, TOKEN_PORT), keep_dir=False):
        if len(tag) > 6:
            raise ValueError("tag must be at most 6 characters (interface name limits)")
        self.tag = tag
        # Global names carry the runner's pid: concurrent runs never collide.
        # (Interface names need not: each is made directly in its own namespace.)
        self.name = "fyf-%s-%d" % (tag, os.getpid())
        self.nets = []       # [(bridge name, subnet index)]
        self.containers = []  # [(ns name, ip, bridge)]
        for n, (bridge, count) in enumerate(containers):
            self.nets.append((bridge, n))
            for i in range(count):
                self.containers.append(("%s-c%d" % (self.name, len(self.containers)),
                                        "10.89.%d.%d" % (n, 10 + i), bridge))
        self.route_direct = route_direct
        self.preinstall_redirect = preinstall_redirect
        self.ports = list(ports)
        self.host = self.name + "-host"
        self.vm = self.name + "-vm"
        self.rl = self.name + "-rl"
        self.dir = tempfile.mkdtemp(prefix=self.name + "-")
        self.keep_dir = keep_dir
        self.procs = []
        self.cgroups = []

    # -- building ---------------------------------------------------------------------------

    def __enter__(self):
        try:
            clean_leftovers(self.tag)  # what an earlier, killed run left behind
            self.teardown(quiet=True)
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            try:
                p.stop(timeout=5)
            except Exception:
                pass
        self.teardown(quiet=True)
        for cg in reversed(self.cgroups):
            remove_cgroup(cg, kill=True)
        # A sanitizer report in any process we ran fails the test (CI runs the
        # suites against an ASan + UBSan build).
        reports = []
        for p in self.procs:
            log = p.log()
            for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
                if marker in log:
                    reports.append("%s:\n%s" % (p.name, log[log.index(marker) - 200:][:4000]))
                    break
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        if reports and exc[0] is None:
            raise AssertionError("sanitizer reports:\n" + "\n".join(reports))
        return False

    def nsexec(self, ns, *cmd, check=True, timeout=30):
        return sh("ip", "netns", "exec", ns, *cmd, check=check, timeout=timeout)

    def _ns_basics(self, ns):
        """lo up, and ephemeral ports kept above the fixed ones (EPHEMERAL_FROM)."""
        self.nsexec(ns, "ip", "link", "set", "lo", "up")
        self.nsexec(ns, "sysctl", "-qw",
                    "net.ipv4.ip_local_port_range=%d 60999" % EPHEMERAL_FROM)

    def _build(self):
        t = self.tag
        netns_add(self.host, lo_up=False)
        netns_add(self.vm, lo_up=False)
        for ns in (self.host, self.vm):
            self._ns_basics(ns)
        # vm <-> host
        veth_pair("fyf%sv" % t, "fyf%sh" % t, ns_a=self.vm, ns_b=self.host)
        self.nsexec(self.vm, "ip", "link", "set", "fyf%sv" % t, "name", "eth0")
        self.nsexec(self.host, "ip", "link", "set", "fyf%sh" % t, "name", "eth0")
        self.nsexec(self.vm, "ip", "addr", "add", VM_ADDR + "/24", "dev", "eth0")
        self.nsexec(self.host, "ip", "addr", "add", GATEWAY + "/24", "dev", "eth0")
        self.nsexec(self.vm, "ip", "link", "set", "eth0", "up")
        self.nsexec(self.host, "ip", "link", "set", "eth0", "up")
        self.nsexec(self.vm, "ip", "route", "add", "default", "via", GATEWAY)
        self.nsexec(self.host, "ip", "addr", "add", ORIGIN + "/32", "dev", "lo")
        self.nsexec(self.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.make_rootless()

    def make_rootless(self):
        """(Re-)creates the rootless namespace, its bridges and the containers (and, with
        preinstall_redirect, a redirect of its own; the forwarder installs its own)."""
        t = self.tag
        netns_add(self.rl, lo_up=False)
        self._ns_basics(self.rl)
        for bridge, n in self.nets:
            self.nsexec(self.rl, "ip", "link", "add", bridge, "type", "bridge")
            self.nsexec(self.rl, "ip", "addr", "add", "10.89.%d.1/24" % n, "dev", bridge)
            self.nsexec(self.rl, "ip", "link", "set", bridge, "up")
        ports = ", ".join(str(p) for p in self.ports)
        # What a container's connection to the gateway's daemon ports meets when
        # nothing redirected it: in the VM, pasta carries it out of this namespace
        # and the walls refuse it; here, a reset at once. A filter after dstnat,
        # so a connection the forwarder's redirect rewrote never matches. (Without
        # it the namespace would drop such a SYN silently, and the client's
        # retransmission a second later could find the forwarder after all.)
        rules = ("table ip fyf_way_out {\n"
                 " chain pre { type filter hook prerouting priority filter; policy accept;\n"
                 "  ip daddr %s tcp dport { %s } reject with tcp reset\n }\n}\n" % (GATEWAY, ports))
        subprocess.run(["ip", "netns", "exec", self.rl, "nft", "-f", "-"], input=rules,
                       text=True, check=True, timeout=30)
        if self.preinstall_redirect:
            rules = ("table ip fyf_redirect {\n"
                     " chain pre { type nat hook prerouting priority dstnat; policy accept;\n"
                     "  ip daddr %s tcp dport { %s } redirect\n }\n}\n" % (GATEWAY, ports))
            subprocess.run(["ip", "netns", "exec", self.rl, "nft", "-f", "-"], input=rules,
                           text=True, check=True, timeout=30)
        if self.route_direct:
            # A routed way from the rootless namespace to the host, through the VM
            # namespace: only for the benchmark's "direct" arm.
            veth_pair("fyf%sr" % t, "fyf%sq" % t, ns_a=self.rl, ns_b=self.vm)
            self.nsexec(self.rl, "ip", "addr", "add", "10.254.0.2/30", "dev", "fyf%sr" % t)
            self.nsexec(self.vm, "ip", "addr", "add", "10.254.0.1/30", "dev", "fyf%sq" % t)
            self.nsexec(self.rl, "ip", "link", "set", "fyf%sr" % t, "up")
            self.nsexec(self.vm, "ip", "link", "set", "fyf%sq" % t, "up")
            self.nsexec(self.rl, "ip", "route", "add", "default", "via", "10.254.0.1")
            self.nsexec(self.rl, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.nsexec(self.vm, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.nsexec(self.vm, "ip", "route", "replace", "10.89.0.0/16", "via", "10.254.0.2")
            self.nsexec(self.host, "ip", "route", "replace", "10.89.0.0/16", "via", VM_ADDR)
            self.nsexec(self.host, "ip", "route", "replace", "10.254.0.0/30", "via", VM_ADDR)
        for i, (ns, ip, bridge) in enumerate(self.containers):
            netns_del(ns)
            netns_add(ns, lo_up=False)
            self._ns_basics(ns)
            veth_pair("fyf%sc%d" % (t, i), "fyf%sb%d" % (t, i), ns_a=ns, ns_b=self.rl)
            self.nsexec(ns, "ip", "link", "set", "fyf%sc%d" % (t, i), "name", "eth0")
            self.nsexec(ns, "ip", "addr", "add", ip + "/24", "dev", "eth0")
            self.nsexec(ns, "ip", "link", "set", "eth0", "up")
            n = int(ip.split(".")[2])
            self.nsexec(ns, "ip", "route", "add", "default", "via", "10.89.%d.1" % n)
            self.nsexec(self.rl, "ip", "link", "set", "fyf%sb%d" % (t, i), "master", bridge)
            self.nsexec(self.rl, "ip", "link", "set", "fyf%sb%d" % (t, i), "up")

    def destroy_rootless(self):
        """Tears the rootless namespace down with its containers (as podman does)."""
        for ns, _, _ in self.containers:
            netns_del(ns)
        netns_del(self.rl)

    def teardown(self, quiet=False):
        for ns, _, _ in self.containers:
            netns_del(ns)
        for ns in (self.rl, self.vm, self.host):
            netns_del(ns)

    # -- processes --------------------------------------------------------------------------

    def path(self, name):
        return os.path.join(self.dir, name)

    def start(self, ns, argv, name, env=None):
        """Starts argv with only its network namespace switched (the mount namespace,
        /sys/fs/cgroup included, stays the caller's)."""
        log_path = self.path(name + ".log")
        logf = open(log_path, "w")
        full = ["nsenter", "--net=/run/netns/" + ns, "--"] + list(argv)
        e = dict(os.environ)
        if env:
            e.update(env)
        p = subprocess.Popen(full, stdout=logf, stderr=subprocess.STDOUT, env=e,
                             preexec_fn=_die_with_parent)
        logf.close()
        proc = Proc(p, name, log_path)
        self.procs.append(proc)
        return proc

    def start_in_host(self, argv, name="proxy", env=None):
        """Starts an arbitrary command in the host namespace (e.g. the proxy)."""
        return self.start(self.host, argv, name, env)

    def wait_listening(self, ns, ip, port, timeout=10.0, proc=None):
        """Waits until ip:port accepts a TCP connection from inside `ns`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.nsexec(ns, "python3", "-c",
                            "import socket,sys\n"
                            "s=socket.socket(); s.settimeout(0.5)\n"
                            "sys.exit(s.connect_ex((%r,%d)))" % (ip, port), check=False)
            if r.returncode == 0:
                return True
            if proc is not None and not proc.alive():
                raise RuntimeError("%s exited before listening:\n%s" % (proc.name, proc.log()))
            time.sleep(0.05)
        raise RuntimeError("nothing listens on %s:%d in %s after %.1fs%s" % (
            ip, port, ns, timeout, ("\n" + proc.log()) if proc else ""))

    def write_key(self, name="forwarder.key", key_hex=None):
        key_hex = key_hex or new_key_hex()
        p = self.path(name)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, (key_hex + "\n").encode())
        os.close(fd)
        return p, key_hex

    def forwarder_config(self, key_file, bridge=True, vm=False, extra="", upstream=GATEWAY,
                         walled=("1000", "100000-165535"), attribution="bpf", stamp_ports=None,
                         connect_timeout_ms=2000, redials=8, redirect=True, workers=2,
                         attribution_timeout_ms=None, port_ranges=None):
        """A fy-forwarder config for this topology (docs/fy-forwarder.md). `redirect`:
        the bridge listener's [bridge] redirect (the forwarder installs the redirect).
        `port_ranges`: [("LO-HI", stamp), ...], one `[[port]] ports = "LO-HI"` each,
        instead of one `[[port]] port = N` per port of the topology.
        `workers`: [limits] workers, 2 unless `extra` sets it: the tests run the data
        path on more than one loop whatever this machine's default would be."""
        stamp_ports = self.ports[:1] if stamp_ports is None else stamp_ports
        lines = [
            'key_file = "%s"' % key_file,
            'state_dir = "%s"' % self.path("state"),
            'log_level = "info"',
            "",
            "[upstream]",
            'host = "%s"' % upstream,
            "connect_timeout_ms = %d" % connect_timeout_ms,
            "redials = %d" % redials,
            "",
        ]
        if port_ranges is not None:
            for spec, stamp in port_ranges:
                lines += ["[[port]]", 'ports = "%s"' % spec,
                          "stamp = %s" % ("true" if stamp else "false"), ""]
        else:
            for p in self.ports:
                lines += ["[[port]]", "port = %d" % p, "stamp = %s" % (
                    "true" if p in stamp_ports else "false"), ""]
        if bridge:
            lines += ["[bridge]", 'netns = "/run/netns/%s"' % self.rl, 'listen = "0.0.0.0"',
                      'net = "auto"', "poll_ms = 250",
                      "redirect = %s" % ("true" if redirect else "false"), ""]
        if vm:
            lines += ["[vm]", 'listen = "%s"' % VM_LISTEN,
                      "walled_uids = [%s]" % ", ".join('"%s"' % w for w in walled),
                      'attribution = "%s"' % attribution]
            if attribution_timeout_ms is not None:
                lines.append("attribution_timeout_ms = %d" % attribution_timeout_ms)
            lines.append("")
        if workers and not re.search(r"^workers\s*=", extra, re.M):
            if "[limits]\n" in extra:
                extra = extra.replace("[limits]\n", "[limits]\nworkers = %d\n" % workers, 1)
            else:
                extra += "\n[limits]\nworkers = %d\n" % workers
        return "\n".join(lines) + "\n" + extra

    def start_forwarder(self, config_text, name="forwarder", wait=True, args=(), exe=None,
                        env=None):
        """Starts fy-forwarder (`exe`, default: the build directory's) in the VM namespace."""
        exe = exe or os.path.join(build_dir(), "forwarder", "fy-forwarder")
        cfg = self.path(name + ".toml")
        with open(cfg, "w") as f:
            f.write(config_text)
        proc = self.start(self.vm, [exe, "--config", cfg] + list(args), name, env=env)
        self.forwarder_cfg = cfg
        if wait:
            self.wait_status(proc, lambda s: s.startswith("ok "), timeout=10)
        return proc

    def control(self, command="status", timeout=5.0):
        return control_request(os.path.join(self.path("state"), "control.sock"), command, timeout)

    def stats(self):
        return json.loads(self.control("stats"))

    def wait_status(self, proc, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError("%s exited (%s):\n%s" % (proc.name, proc.p.returncode,
                                                            proc.log()))
            try:
                last = self.control("status", timeout=1.0)
                if pred(last):
                    return last
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError("status never matched; last: %s\n%s" % (last, proc.log()))

    def run_in_container(self, i, argv, timeout=30, check=False, input=None):
        ns = self.containers[i][0]
        return subprocess.run(["ip", "netns", "exec", ns] + list(argv), capture_output=True,
                              text=True, timeout=timeout, check=check, input=input)

    # -- cgroups (VM-namespace attribution) -------------------------------------------------

    def cgroup(self, *parts):
        """Makes /sys/fs/cgroup/unified/fyf-<tag>-<pid>/<parts...>; removed at exit."""
        path, made = make_cgroup(os.path.join(CGROUP_BASE, self.name), *parts)
        self.cgroups.extend(made)
        return path

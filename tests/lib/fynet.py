"""Network-namespace and cgroup primitives shared by the test suites (proxy,
forwarder, wall). Before, the forwarder's fyf_topology.py and the wall's
fywnet.py each made, entered and removed namespaces, veth pairs and cgroups in
their own words.

These are the primitives only: none registers its own undoing, since the
suites undo in their own ways (fywnet.py: an undo list run LIFO at the end of a
class, at exit and on a signal; fyf_topology.py: a Topology's teardown). What a
suite builds from them (addresses, bridges, routes, the names it gives) stays
in the suite.

    netns_add(name, lo_up=True)     `ip netns add`, then loopback up
    netns_del(name)                 `ip netns del`, a missing one is no error
    netns_names()                   the named namespaces (/run/netns)
    sweep_netns(pattern)            deletes the named namespaces whose owner is
                                    gone (pattern's group 1 is the owner's pid)
    nsenter(ns, *cmd)               argv running cmd with only its network
                                    namespace switched to ns (the mount
                                    namespace, /sys/fs/cgroup included, stays)
    in_netns(ns, *cmd, ...)         runs that argv (fyproc.sh)
    veth_pair(a, b, ns_a, ns_b)     a veth pair a <-> b, each end made directly
                                    in its namespace (None: this one)
    cgroup2_root()                  the cgroup2 mount (unified on a hybrid host)
    make_cgroup(base, *parts)       makes base/parts..., returns (path, the
                                    directories it made, outermost first)
    in_cgroup(path, cmd)            argv whose process joins the cgroup first
    remove_cgroup(path, kill=...)   rmdir, with kill its processes killed first
                                    (retried for 2.5 s); False if it stayed
    remove_cgroup_tree(path, ...)   the same for a cgroup and all below it,
                                    deepest first
"""

import os
import re
import signal
import time

from fyproc import alive, sh

NETNS_DIR = "/run/netns"


# ---- network namespaces --------------------------------------------------

def netns_add(name, lo_up=True):
    """Makes the named network namespace `name`; with lo_up its loopback is up."""
    sh("ip", "netns", "add", name)
    if lo_up:
        sh("ip", "-n", name, "link", "set", "lo", "up")
    return name


def netns_del(name, timeout=30):
    """Deletes the named network namespace; one that is not there is no error.
    Returns `ip netns del`'s CompletedProcess."""
    return sh("ip", "netns", "del", name, check=False, timeout=timeout)


def netns_names():
    """The named network namespaces (what `ip netns list` shows)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def sweep_netns(pattern):
    """Deletes every named namespace whose name + "-" matches `pattern` (a
    compiled regex or its text, matched at the start) and whose group 1, the pid
    of the test process that made it, is no longer alive. Returns the names."""
    pat = re.compile(pattern) if isinstance(pattern, str) else pattern
    swept = []
    for name in netns_names():
        m = pat.match(name + "-")
        if m and not alive(int(m.group(1))):
            netns_del(name)
            swept.append(name)
    return swept


def nsenter(ns, *cmd):
    """argv: `cmd` with its network namespace switched to the named `ns`, and
    only that (unlike `ip netns exec`, /sys and the mount namespace stay)."""
    return ["nsenter", f"--net={NETNS_DIR}/{ns}", "--", *map(str, cmd)]


def in_netns(ns, *cmd, check=True, timeout=30, **kw):
    """Runs `cmd` in the named `ns` (nsenter); fyproc.sh's CompletedProcess."""
    return sh(*nsenter(ns, *cmd), check=check, timeout=timeout, **kw)


def veth_pair(a, b, ns_a=None, ns_b=None):
    """Makes the veth pair a <-> b; each end is made in its named namespace
    (None: the caller's), neither is up or addressed."""
    argv = ["ip", "link", "add", a]
    if ns_a:
        argv += ["netns", ns_a]
    argv += ["type", "veth", "peer", "name", b]
    if ns_b:
        argv += ["netns", ns_b]
    sh(*argv)
    return a, b


# ---- cgroups -------------------------------------------------------------

def cgroup2_root():
    """The cgroup2 mount: /sys/fs/cgroup/unified on a hybrid host, else
    /sys/fs/cgroup if that is cgroup2."""
    for cand in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(cand, "cgroup.procs")) and \
                os.path.exists(os.path.join(cand, "cgroup.subtree_control")):
            return cand
    raise RuntimeError("no cgroup2 mount at /sys/fs/cgroup/unified or /sys/fs/cgroup")


def make_cgroup(base, *parts):
    """Makes the cgroup base/parts[0]/parts[1]/... (base too if missing; a part
    may itself hold slashes). Returns (its path, the directories made here,
    outermost first) so the caller can undo exactly what it made."""
    made = []
    path = base
    if not os.path.isdir(path):
        os.mkdir(path)
        made.append(path)
    for part in parts:
        for piece in part.split("/"):
            path = os.path.join(path, piece)
            if not os.path.isdir(path):
                os.mkdir(path)
                made.append(path)
    return path, made


def in_cgroup(path, cmd):
    """argv: `cmd`, run by a process that first moves itself into the cgroup
    `path` (so every socket it makes belongs to that cgroup)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', path, *map(str, cmd)]


def remove_cgroup(path, kill=False, tries=50):
    """Removes the (leaf) cgroup `path`; True once it is gone. Without kill, one
    rmdir. With kill, every process in it is SIGKILLed and the rmdir retried up
    to `tries` times 50 ms apart (a killed process leaves its cgroup late)."""
    if not kill:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False
    for _ in range(tries):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                procs = f.read().split()
        except OSError:
            return True  # gone (or never a cgroup)
        for pid in procs:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return True
        except OSError:
            time.sleep(0.05)
    return False


def remove_cgroup_tree(path, kill=False):
    """Removes the cgroup at `path` and every cgroup below it, deepest first
    (remove_cgroup on each); one that still holds a process stays."""
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -len(t[0])):
        remove_cgroup(dirpath, kill=kill)

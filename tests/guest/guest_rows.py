#!/usr/bin/python3
"""Runs IN the qemu guest (Debian 12's stock kernel), as root, for
tests/guest/test_wall.py: the rows of docs/wall-escapes.md this machine's
kernel cannot try, the kernel closures of the boot provisioning, and their
controls. It observes and records; the host-side test asserts.

    guest_rows.py CLOSURES_SH     (beside fywnet.py, exotic.py, probe.py,
                                   serve.py and kfam.py; fy-wall and
                                   fy-novsock under /usr/local/bin)

CLOSURES_SH is the boot provisioning's kernel-closures fragment exactly as
fy-machine renders it (render_kernel_closures). Prints one JSON object on
stdout, progress on stderr. The order matters and is the test's:
  1. before provisioning: the families' modules are not loaded; vsock is open
     to the walled uid (a root listener on the loopback transport, CID 1);
  2. the fragment runs, as the provisioning runs it (bash, set -euo pipefail,
     $user and $uid set);
  3. after: socket() of each blocked family fails for the walled uid and
     root, no module loads; AF_VSOCK is refused to the walled uid, its
     subuids and a user namespace of it, not to root or another uid;
  4. the families' control: the modprobe.d file removed, the same socket()
     calls succeed (so step 3 was the file's doing);
  5. the escape rows, in fywnet's namespaces with fy-wall's machine wall, the
     families now loaded: each under fy-wall, then under fy-wall without its
     ownerless chain (the wall as it was: the control).
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fywnet as n  # noqa: E402

U = n.WALLED_UID
SUB = n.SUBUID_START + 11
OTHER = n.OTHER_UID
KFAM = os.path.join(HERE, "kfam.py")
MCAST = os.path.join(HERE, "mcast.py")
VSOCK_PORT = 4747
PUB2 = "203.0.113.11"  # the controls' destination (a second address of public)
OUT = {}

# The families the rows try, as (name, af, type, proto) for exotic.py's
# "family" kind, and the module each loads.
FAMILIES = [("AF_RXRPC", 33, 2, 2, "rxrpc"), ("AF_RDS", 21, 5, 0, "rds"),
            ("AF_TIPC", 30, 4, 0, "tipc"), ("AF_SMC", 43, 1, 0, "smc"),
            ("AF_KCM", 41, 2, 0, "kcm"), ("AF_CAN", 29, 3, 1, "can"),
            ("AF_QRTR", 42, 2, 0, "qrtr"), ("SCTP", 2, 1, 132, "sctp")]


def say(*a):
    print("guest_rows:", *a, file=sys.stderr, flush=True)


def run(*cmd, check=False, timeout=60, input=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, input=input, check=check)


def as_uid(uid, *cmd):
    if uid == 0:
        return [str(c) for c in cmd]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *map(str, cmd)]


def last_json(r):
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"outcome": "noresult", "stdout": r.stdout[-500:], "stderr": r.stderr[-500:]}


def exotic(uid, *args, ns=None, timeout=2.0, pre=()):
    cmd = as_uid(uid, *pre, n.PY, n.EXOTIC, *args, "--timeout", timeout)
    if ns:
        cmd = n.nsexec(ns, *cmd)
    return last_json(run(*cmd, timeout=timeout + 30))


def kfam(uid, *args, ns):
    try:
        return last_json(run(*n.nsexec(ns, *as_uid(uid, n.PY, KFAM, *args)), timeout=40))
    except subprocess.TimeoutExpired:
        return {"outcome": "hung", "stage": "", "errno": ""}


def loaded():
    with open("/proc/modules") as f:
        mods = {l.split()[0] for l in f}
    return sorted(m for m in ("rxrpc", "rds", "rds_tcp", "tipc", "smc", "kcm", "can",
                              "can_raw", "qrtr", "sctp", "vsock", "vsock_loopback")
                  if m in mods)


def families(uid):
    return {name: exotic(uid, "family", af, ty, proto)
            for name, af, ty, proto, _ in FAMILIES}


def vsock_probes():
    """The walled uid to root's loopback listener (CID 1) and to the host
    (CID 2); the same from a user and network namespace of its own; a subuid;
    then the uids that keep vsock: another user, and root."""
    ns_cmd = ("unshare", "-Urn")
    return {
        "walled_cid1": exotic(U, "vsock", 1, VSOCK_PORT),
        "walled_cid2": exotic(U, "vsock", 2, VSOCK_PORT),
        "walled_userns_cid1": exotic(U, "vsock", 1, VSOCK_PORT, pre=ns_cmd),
        "subuid_cid1": exotic(SUB, "vsock", 1, VSOCK_PORT),
        "other_cid1": exotic(OTHER, "vsock", 1, VSOCK_PORT),
        "root_cid1": exotic(0, "vsock", 1, VSOCK_PORT),
        "root_cid2": exotic(0, "vsock", 2, VSOCK_PORT),
    }


VSOCK_SERVER = f"""
import socket
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
s.bind((socket.VMADDR_CID_ANY, {VSOCK_PORT}))
s.listen(16)
print("READY", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"root-vsock-listener\\n")
    c.close()
"""


def main():
    closures = sys.argv[1]
    run("mount", "-t", "securityfs", "securityfs", "/sys/kernel/security")
    with open("/sys/kernel/security/lsm") as f:
        OUT["lsm"] = f.read().strip()
    OUT["kernel"] = os.uname().release
    with open("/etc/subuid", "w") as f:
        f.write(f"{n.WALLED_NAME}:{n.SUBUID_START}:{n.SUBUID_COUNT}\n")
    # The walled user in the guest's own passwd (the guest runs on an overlay):
    # the fragment's `fy-novsock apply --user` reads it, with /etc/subuid, as
    # fy-wall does.
    with open("/etc/passwd") as f:
        known = f.read()
    if f"\n{n.WALLED_NAME}:" not in known:
        with open("/etc/passwd", "a") as f:
            f.write(f"{n.WALLED_NAME}:x:{U}:{U}::/nonexistent:/bin/sh\n")

    # 1. Before provisioning.
    OUT["modules_at_boot"] = loaded()
    r = run("modprobe", "vsock_loopback")
    OUT["vsock_loopback_load"] = r.returncode
    srv = subprocess.Popen([n.PY, "-c", VSOCK_SERVER], stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "READY"
    say("vsock before")
    OUT["vsock_before"] = vsock_probes()

    # 2. The provisioning's fragment, as the boot script runs it.
    say("provisioning")
    t0 = time.monotonic()
    r = run("bash", "-c", 'set -euo pipefail; user="$1"; uid="$2"; . "$3"', "closures",
            n.WALLED_NAME, U, closures)
    OUT["provision"] = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                        "seconds": round(time.monotonic() - t0, 2)}
    OUT["families_file"] = os.path.exists("/etc/modprobe.d/fy-wall-families.conf")

    # 3. After.
    say("after provisioning")
    OUT["families_after"] = {"walled": families(U), "root": families(0)}
    OUT["modprobe_after"] = {m: run("modprobe", m).returncode for m in ("rxrpc", "rds", "tipc")}
    OUT["modules_after"] = loaded()
    OUT["vsock_after"] = vsock_probes()
    OUT["novsock_status"] = run("/usr/local/bin/fy-novsock", "status").stdout.strip()
    # Re-applied with uid 4343 added: the attached program's ranges change in
    # place; then as provisioned again; then removed, and applied once more.
    nv = "/usr/local/bin/fy-novsock"
    wide = run(nv, "apply", "--uids", f"{U},{n.SUBUID_START}-{n.SUBUID_START + n.SUBUID_COUNT - 1},{OTHER}")
    OUT["novsock_reapply"] = {"rc": wide.returncode, "stdout": wide.stdout.strip(),
                              "other": exotic(OTHER, "vsock", 1, VSOCK_PORT),
                              "status": run(nv, "status").stdout.strip()}
    narrow = run(nv, "apply", "--uids", f"{U},{n.SUBUID_START}-{n.SUBUID_START + n.SUBUID_COUNT - 1}")
    OUT["novsock_reapply"]["back"] = {"rc": narrow.returncode,
                                      "other": exotic(OTHER, "vsock", 1, VSOCK_PORT)}
    gone = run(nv, "remove")
    OUT["novsock_removed"] = {"rc": gone.returncode, "walled": exotic(U, "vsock", 1, VSOCK_PORT),
                              "status_rc": run(nv, "status").returncode}
    again = run(nv, "apply", "--uids", f"{U},{n.SUBUID_START}-{n.SUBUID_START + n.SUBUID_COUNT - 1}")
    OUT["novsock_again"] = {"rc": again.returncode, "walled": exotic(U, "vsock", 1, VSOCK_PORT)}

    # 4. The families' control: the file gone, the same calls.
    os.unlink("/etc/modprobe.d/fy-wall-families.conf")
    say("families without the file")
    OUT["families_without_file"] = {"walled": families(U)}
    OUT["modules_without_file"] = loaded()
    # RDS and TIPC have no net-pf alias in Debian's kernel: socket() never
    # loads them; root's explicit modprobe does, without the file.
    OUT["modprobe_without_file"] = {m: run("modprobe", m).returncode for m in ("rds", "tipc")}
    OUT["families_after_modprobe"] = {"walled": families(U)}
    srv.kill()

    # 5. The escape rows.
    say("topology")
    n.set_nf_log_all_netns()
    t = n.GuestTopology()
    t.warm_up()
    ident = n.Identity()
    g = t.guest
    # A second public address: each control goes there and each fy-wall
    # attempt to PUBLIC, counted apart, so a kernel socket of one phase that
    # keeps retransmitting cannot be counted for the other.
    pub_dev = n.in_ns(t.pub, "ip", "-o", "-4", "addr", "show", "to", t.PUBLIC).stdout.split()[1]
    n.in_ns(t.pub, "ip", "addr", "add", PUB2 + "/24", "dev", pub_dev)
    n.Server(t.pub, "public2", f"tcp:{PUB2}:443")
    # Counted after public's own conntrack (priority -150): packets of flows
    # the guest opened (ct state new: a SYN and its retransmissions, a first
    # datagram), apart from the guest's answers on flows public opened (an
    # rds_tcp in public connects back to the guest's rds_tcp listener).
    n.sh(*n.nsexec(t.pub, "nft", "-f", "-"), input=(
        "table inet fyw_obs {\n chain pre {\n"
        "  type filter hook prerouting priority -150; policy accept;\n"
        f"  ip saddr {t.GUEST} ip daddr {t.PUBLIC} ct state new counter\n"
        f"  ip saddr {t.GUEST} ip daddr {PUB2} ct state new counter\n"
        f"  ip saddr {t.GUEST} ip daddr {t.PUBLIC} ct state != new counter\n"
        f"  ip saddr {t.GUEST} ip daddr {PUB2} ct state != new counter\n }}\n}}\n"))
    log = n.KernelLog()

    def counters():
        out = n.in_ns(t.pub, "nft", "list", "table", "inet", "fyw_obs").stdout
        return re.findall(r"ip daddr (\S+) ct state (new|!= new) counter packets (\d+)", out)

    def arrived(dst, state="new"):
        return int({(d, st): c for d, st, c in counters()}[(dst, state)])

    def fy_wall():
        r = ident.fy_wall(g, "apply", "machine", *n.machine_args(ident))
        assert r.returncode == 0, r.stderr

    text = ident.fy_wall(None, "render", "machine", *n.machine_args(ident)).stdout
    assert "\t\tjump ownerless\n" in text
    old = text.replace("\t\tjump ownerless\n", "")

    def under(rules, attempt, wait=1.0):
        """One attempt under `rules`: "fy-wall" (to PUBLIC) or "old", fy-wall
        without its ownerless chain (to PUB2): its result, the packets of the
        guest's address that reached that destination, and whether the
        ownerless chain (or the deny rule) logged."""
        if rules == "fy-wall":
            fy_wall()
        else:
            n.sh(*n.nsexec(g, "nft", "-f", "-"), input=old)
        dst = t.PUBLIC if rules == "fy-wall" else PUB2
        n.conntrack_flush(g)
        log.mark()
        before, other = arrived(dst), arrived(dst, "!= new")
        res = attempt(dst)
        time.sleep(wait)
        return {"dst": dst, "result": res, "arrived": arrived(dst) - before,
                "other_packets": arrived(dst, "!= new") - other,
                "ownerless_logged": log.count("fy-wall-ownerless ") > 0,
                "deny_logged": log.count("fy-wall-deny") > 0}

    both = ("old", "fy-wall")  # the control first, on a fresh kernel state

    rows = OUT["rows"] = {}
    say("rxrpc")
    rows["rxrpc"] = {w: under(w, lambda d: kfam(U, "rxrpc", d, 7001, ns=g)) for w in both}
    say("smc")
    rows["smc"] = {w: under(w, lambda d: kfam(U, "smc", d, 443, ns=g)) for w in both}
    say("rds")
    # rds is loaded (root's modprobe, step 4), rds_tcp is not: the walled
    # user's SO_RDS_TRANSPORT = TCP loads it.
    rows["rds_modules_before"] = loaded()
    rows["rds"] = {w: under(w, lambda d: kfam(U, "rds", t.GUEST, d, 4000, ns=g), wait=2.0)
                   for w in both}
    rows["rds_modules_after"] = loaded()
    say("tipc")
    fy_wall()
    rows["tipc_walled_send"] = kfam(U, "tipc", ns=g)
    def bearer(dst):
        return ("tipc", "bearer", "enable", "media", "udp", "name", "fyb", "localip", t.GUEST,
                "remoteip", dst)
    rows["tipc_load"] = run("modprobe", "tipc").returncode
    # The walled user enables a UDP bearer itself (6.1's TIPC asks for no
    # capability), under each wall; its kernel socket sends discovery.
    def walled_bearer(dst):
        run(*n.nsexec(g, *as_uid(U, "tipc", "bearer", "disable", "media", "udp", "name", "fyb")))
        r = run(*n.nsexec(g, *as_uid(U, *bearer(dst))))
        return {"rc": r.returncode, "stderr": r.stderr.strip()[-300:],
                "bearers": run(*n.nsexec(g, "tipc", "bearer", "list")).stdout}
    rows["tipc_bearer"] = {w: under(w, walled_bearer, wait=3.0) for w in both}
    run(*n.nsexec(g, "tipc", "bearer", "disable", "media", "udp", "name", "fyb"))
    say("kcm can qrtr")
    fy_wall()
    before = arrived(t.PUBLIC)
    rows["kcm_can_qrtr"] = {
        "kcm": exotic(U, "family", 41, 2, 0, ns=g),
        "can": exotic(U, "family", 29, 3, 1, ns=g),
        "qrtr": exotic(U, "family", 42, 2, 0, ns=g),
        "can_devices": run(*n.nsexec(g, "ip", "-o", "link", "show", "type", "can")).stdout,
        "arrived": arrived(t.PUBLIC) - before}
    say("sctp")
    rows["sctp"] = {"public": under("fy-wall", lambda d: exotic(U, "sctp", d, 443, ns=g)),
                    "resolver": under("fy-wall", lambda d: exotic(U, "sctp", t.GW, 53, ns=g)),
                    "root_public": under("fy-wall", lambda d: exotic(0, "sctp", d, 443, ns=g))}
    # Multicast memberships with chosen sources (issue 26, part 3): under
    # fy-wall, with fy-novsock attached (step 3 left it so), the walled uid's
    # joins; another uid's; and the walled uid's again with fy-novsock removed
    # (the control). The host end of the guest's veth is captured each time.
    say("multicast")
    fy_wall()
    nv = "/usr/local/bin/fy-novsock"

    def dev_with(ns, addr):
        out = n.in_ns(ns, "ip", "-o", "-4", "addr", "show").stdout
        return next(l.split()[1] for l in out.splitlines() if f" {addr}/" in l)

    gdev, hdev = dev_with(g, t.GUEST), dev_with(t.host, t.GW)

    def mjoin(uid):
        cap = subprocess.Popen(n.nsexec(t.host, n.PY, MCAST, "capture", hdev, 4),
                               stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        j = run(*n.nsexec(g, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                          n.PY, MCAST, "join", gdev, t.GUEST, 2.5))
        out, _ = cap.communicate(timeout=60)
        try:
            answers = json.loads(j.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            answers = {"error": j.stderr[-500:]}
        return {"answers": answers, "seen": json.loads(out)}

    OUT["mcast"] = {"walled": mjoin(U), "other": mjoin(OTHER),
                    "status": run(nv, "status").stdout.strip()}
    run(nv, "remove")
    OUT["mcast"]["walled_without"] = mjoin(U)
    print(json.dumps(OUT), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the host test shows what was recorded so far
        OUT["error"] = repr(e)
        print(json.dumps(OUT), flush=True)
        raise

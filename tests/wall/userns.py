#!/usr/bin/python3
"""User namespaces mapped by shadow's real newuidmap and newgidmap, for
tests/wall/test_subid.py. Run as the walled user (setpriv), in a mount
namespace where /etc/passwd, /etc/subuid and /etc/subgid are the test's.

    userns.py try KIND LOWER:COUNT...
        For each request, a child makes a user namespace and newKINDmap is
        asked to map ids 0..COUNT-1 in it onto LOWER..LOWER+COUNT-1. Prints a
        JSON list: true where newKINDmap accepted (exit 0), false where it
        refused, in order.

    userns.py exec --uid-map "IN OUT N ..." --gid-map "IN OUT N ..." --become ID -- CMD...
        A child makes a user namespace; the parent maps it with newuidmap and
        newgidmap (the maps as their arguments); the child becomes gid 0 and
        uid ID of the namespace (setresgid, setresuid: the kernel checks the
        ids are mapped) and execs CMD. Exits with CMD's status.

Only user namespaces are made: the child stays in the caller's network
namespace, so its sockets are the guest's, judged by the wall under the
kernel uid the map gives ID.
"""
import ctypes
import json
import os
import subprocess
import sys

CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)


def child_in_userns():
    """Forks a child that unshares a user namespace and waits. Returns
    (pid, go): writing a byte to `go` lets it continue, closing it ends it."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os.write(ready_w, b"E")
            os._exit(2)
        os.write(ready_w, b"R")
        if os.read(go_r, 1) != b"G":
            os._exit(0)
        return 0, None
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"R":
        raise SystemExit("userns.py: unshare(CLONE_NEWUSER) failed in the child")
    os.close(ready_r)
    return pid, go_w


def newmap(kind, pid, words):
    return subprocess.run([f"/usr/bin/new{kind}map", str(pid), *map(str, words)],
                          capture_output=True, text=True)


def cmd_try(kind, requests):
    out = []
    for req in requests:
        lower, count = req.split(":")
        pid, go = child_in_userns()
        r = newmap(kind, pid, [0, lower, count])
        out.append(r.returncode == 0)
        os.close(go)
        os.waitpid(pid, 0)
    print(json.dumps(out))


def cmd_exec(uid_map, gid_map, become, cmd):
    pid, go = child_in_userns()
    if pid == 0:
        # The child, mapped by now: become the namespace's ids and exec.
        if libc.setresgid(0, 0, 0) != 0 or libc.setresuid(become, become, become) != 0:
            e = ctypes.get_errno()
            sys.stderr.write(f"userns.py: cannot become uid {become}: {os.strerror(e)}\n")
            os._exit(3)
        os.execvp(cmd[0], cmd)
    for kind, words in (("uid", uid_map.split()), ("gid", gid_map.split())):
        r = newmap(kind, pid, words)
        if r.returncode != 0:
            os.close(go)
            os.waitpid(pid, 0)
            raise SystemExit(f"userns.py: new{kind}map {' '.join(words)} refused: "
                             f"{r.stderr.strip()}")
    os.write(go, b"G")
    os.close(go)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


def main(argv):
    if len(argv) >= 3 and argv[0] == "try":
        return cmd_try(argv[1], argv[2:])
    if argv and argv[0] == "exec" and "--" in argv:
        opts, cmd = argv[1:argv.index("--")], argv[argv.index("--") + 1:]
        o = dict(zip(opts[::2], opts[1::2]))
        return cmd_exec(o["--uid-map"], o["--gid-map"], int(o["--become"]), cmd)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

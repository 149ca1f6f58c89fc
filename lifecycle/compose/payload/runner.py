# fy-compose runner: runs the payload's podman-compose in the guest, as the VM
# user, for one request from the host:
#   {"argv": [...], "files": [abs -f paths], "project": name, "env": {...},
#    "cwd": dir, "wait_s": 6, "answer": "" | "services" | "config"}
# Contracts (docs/fy-compose.md):
#   - the env is the host's request over a few names the guest's own podman
#     needs (PATH, HOME, USER, LOGNAME, XDG_RUNTIME_DIR); REGISTRY_AUTH_FILE
#     names no login: an in-memory file (memfd) holding {"auths": {}}, reached
#     as /proc/<runner>/fd/N, so no registry login in the VM is used and
#     nothing is written to disk (podman 4.3's create refuses an authfile that
#     does not exist, so "a missing file" cannot be used as the seed's was);
#   - CONTAINER_HOST must be set, so podman-compose's `podman` is a remote
#     client of the API socket (without it, podman would run containers
#     locally under crun, past the socket filter): refused otherwise, rc 3;
#   - a cwd missing in the guest is refused naming it, rc 4 (never a fall-back
#     to ~);
#   - each -f file may be missing for up to wait_s after the host replaced it;
#   - the runner leads its process group and ends it when its parent (sshd)
#     goes, so `logs -f` stops with the ssh connection;
#   - answers the host parses are one JSON line {"fy-compose-answer": ...,
#     "project": ...} on stdout, after podman-compose's own output.
import json
import os
import select
import signal
import sys
import threading
import time

GUEST_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "XDG_RUNTIME_DIR")


def no_login_file():
    fd = os.memfd_create("fy-compose-no-registry-login", os.MFD_CLOEXEC)
    os.write(fd, b'{"auths": {}}\n')
    return "/proc/%d/fd/%d" % (os.getpid(), fd)  # lives as long as this process


def fail(rc, msg):
    sys.stderr.write("fy-compose (guest): " + msg + "\n")
    sys.stderr.flush()
    os._exit(rc)


def end_group(sig):
    try:
        os.killpg(os.getpgrp(), sig)
    except OSError:
        pass


def watch_parent(ppid):
    # sshd gives a command without a terminal no SIGHUP when the client goes.
    # Two signs it went: the reader of our stdout or stderr (sshd) closed its
    # end (POLLERR on the pipe's write end, whoever our parent is: a shell that
    # did not exec us may still be alive), or we were re-parented.
    p = select.poll()
    for fd in (1, 2):
        try:
            os.fstat(fd)
            p.register(fd, 0)  # errors and hang-ups only
        except OSError:
            pass
    while True:
        gone = any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
                   for _, ev in p.poll(200))
        if gone or os.getppid() != ppid:
            end_group(signal.SIGTERM)
            time.sleep(1.0)
            end_group(signal.SIGKILL)
            os._exit(129)


def wait_for(files, wait_s):
    deadline = time.monotonic() + wait_s
    for f in files:
        while not os.path.exists(f) and time.monotonic() < deadline:
            time.sleep(0.05)


def render(pc, answer, project):
    services = {}
    for name, srv in sorted((pc.services or {}).items()):
        services[name] = {k: v for k, v in srv.items() if not k.startswith("_")}
    body = sorted(services) if answer == "services" else {"services": services}
    return {"fy-compose-answer": answer, "project": project, "body": body}


def main(req, manifest, sha256):
    ppid = os.getppid()
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group (and session) leader: sshd made us one
    threading.Thread(target=watch_parent, args=(ppid,), daemon=True).start()

    env = {k: os.environ[k] for k in GUEST_KEEP if k in os.environ}
    env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    env["REGISTRY_AUTH_FILE"] = no_login_file()
    env.pop("PODMAN_COMPOSE_PROVIDER", None)
    if not env.get("CONTAINER_HOST"):
        fail(3, "CONTAINER_HOST is not set in the request, so podman would run containers "
                "here directly, past the engine socket: refused. Pass the guest-side socket "
                "(fy-compose --guest-socket).")
    cwd = req.get("cwd") or ""
    try:
        os.chdir(cwd)
    except OSError as e:
        fail(4, "the working directory %s does not exist in the guest (%s): the checkout "
                "must be mounted at the same path in the VM (fy machine recreate)."
                % (cwd, e.strerror))
    files = [str(f) for f in req.get("files") or []]
    wait_for(files, float(req.get("wait_s", 6)))
    os.environ.clear()
    os.environ.update(env)

    argv = ["podman-compose"]
    for f in files:
        argv += ["-f", f]
    if req.get("project"):
        argv += ["-p", req["project"]]
    answer = req.get("answer") or ""
    # An answer is rendered by podman-compose's own parser (Debian's 1.0.3 has
    # no `config` command): its argv only has to parse, hence `version`.
    sys.argv = argv + (["version"] if answer else list(req.get("argv") or []))

    import podman_compose
    pc = podman_compose.podman_compose
    rc = 0
    try:
        if answer:
            pc._parse_args()
            pc._parse_compose_file()
            sys.stdout.flush()
            print(json.dumps(render(pc, answer, pc.project_name), sort_keys=True, default=str))
        else:
            podman_compose.main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc & 0xFF if rc >= 0 else 1)

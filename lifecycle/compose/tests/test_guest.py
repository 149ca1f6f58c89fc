#!/usr/bin/env python3
"""fy-compose against a real guest stand-in (root; exit 77 saying why without).

The stand-in: Debian's sshd on a loopback port (its own host key, config and
pid file; the system sshd is never touched), reached as a throwaway
unprivileged VM user, and a real rootful `podman system service` socket the VM
user may use (machine.md: a private mount namespace with pure cgroup2, its own
storage, a busybox image made with `podman import`).

The guest's view differs from the host's: sshd runs in that same private mount
namespace and puts the VM user in a ChrootDirectory (set up before privileges
drop, so the user cannot undo it) whose /usr is this machine's (read-only),
whose /etc/passwd is the guest's own, whose "outside the checkout" directory
holds other files, and where the checkout itself is bind-mounted at the same
path (as a VM mounts it). So a path resolved in the guest and the same path
resolved on the host name different files exactly where a real VM would
differ, and both views share the checkout, which is where a box writes.

Through fy-compose: config --services, config, build (a local image), up -d,
ps, logs, logs -f ended by a hang-up (its guest processes gone), down. A
logging podman and podman-compose first on the host's PATH show that no
compose client and no build ran here. The seed's red-first controls: with the
client on the host each of env_file: /etc/passwd, a file outside the checkout
(extends: file:, as Debian's podman-compose 1.0.3 has no include:) and a
symlink planted after a check reads the host's file; through fy-compose, the
guest's.
"""
import json
import os
import pty
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

FYC = os.environ.get("FY_COMPOSE", "")
PID = os.getpid()
B = "/run/fyc16-%d" % PID          # root-owned: ChrootDirectory's rule for every component
ROOT = B + "/guest"                 # the guest's /
USER = "fyc16vm%d" % (PID % 100000)
SOCK = B + "/sock/podman.sock"
URL = "unix://" + SOCK
failures = []
procs = []


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def sh(*argv, check_rc=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check_rc and r.returncode != 0:
        raise RuntimeError("%s: rc %d\n%s%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
    return r


def write(path, text, mode=0o644, owner=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    if owner:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def podman_host(*args, **kw):
    return sh("/usr/bin/podman", "--remote", "--url", URL, *args, **kw)


def setup():
    for need in ("/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/podman", "/usr/bin/podman-compose",
                 "/bin/busybox", "/usr/sbin/useradd"):
        if not os.path.exists(need):
            skip("%s is missing (scripts/install-deps)" % need)
    if os.geteuid() != 0:
        skip("needs root (sshd with a ChrootDirectory, rootful podman, a throwaway user)")
    if not FYC:
        skip("FY_COMPOSE is not set (run through meson test)")

    os.makedirs(B, mode=0o755)
    sh("/usr/sbin/useradd", "-M", "-s", "/bin/sh", "-d", "/home/" + USER,
       "-c", "FYC16_VIEW=host-passwd", USER)  # the host's /etc/passwd line a reader shows
    sh("/usr/sbin/usermod", "-p", "*", USER)  # no password, but not locked (sshd refuses that)
    u = pwd.getpwnam(USER)

    # The guest's root: this machine's /usr, its own /etc, /tmp, /home.
    for d in ("usr", "dev", "proc", "etc", "tmp", "home/" + USER, B[1:] + "/work",
              B[1:] + "/sock", B[1:] + "/outside"):
        os.makedirs(os.path.join(ROOT, d), exist_ok=True)
    for l in ("bin", "lib", "lib64", "sbin"):
        os.symlink("usr/" + l, os.path.join(ROOT, l))
    os.chmod(ROOT + "/tmp", 0o1777)
    os.chown(ROOT + "/home/" + USER, u.pw_uid, u.pw_gid)
    write(ROOT + "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:vm:/home/%s:/bin/sh\n"
          "FYC16_VIEW=guest-passwd\n" % (USER, u.pw_uid, u.pw_gid, USER))
    write(ROOT + "/etc/group", "root:x:0:\n%s:x:%d:\n" % (USER, u.pw_gid))
    shutil.copytree("/etc/containers", ROOT + "/etc/containers")
    # outside the checkout: the host's files and the guest's differ
    write(B + "/outside/base.yml", "services:\n  base:\n    environment:\n      MARK: host-outside\n")
    write(ROOT + B + "/outside/base.yml",
          "services:\n  base:\n    environment:\n      MARK: guest-outside\n")

    # ssh: keys, sshd config, the client's config fy-compose is given
    os.makedirs(B + "/ssh", mode=0o755)
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", B + "/ssh/host_key")
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", B + "/ssh/client_key")
    shutil.copy(B + "/ssh/client_key.pub", B + "/ssh/authorized_keys")
    port = free_port()
    write(B + "/ssh/sshd_config", "\n".join([
        "Port %d" % port, "ListenAddress 127.0.0.1", "HostKey %s/ssh/host_key" % B,
        "PidFile %s/ssh/sshd.pid" % B, "AuthorizedKeysFile %s/ssh/authorized_keys" % B,
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "AllowUsers " + USER, "ChrootDirectory " + ROOT, "X11Forwarding no",
        "AllowTcpForwarding no", "PermitUserEnvironment no", "LogLevel VERBOSE", ""]))
    hostpub = open(B + "/ssh/host_key.pub").read().split()
    write(B + "/ssh/known_hosts", "[127.0.0.1]:%d %s %s\n" % (port, hostpub[0], hostpub[1]))
    write(B + "/ssh/ssh_config", "\n".join([
        "Host fyc16-guest", "  HostName 127.0.0.1", "  Port %d" % port, "  User " + USER,
        "  IdentityFile %s/ssh/client_key" % B, "  IdentitiesOnly yes",
        "  UserKnownHostsFile %s/ssh/known_hosts" % B, "  StrictHostKeyChecking yes",
        "  GlobalKnownHostsFile /dev/null", ""]))

    # podman: own storage, no cgroups (the machine's layout is hybrid)
    ml = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    write(B + "/containers.conf", '[containers]\ncgroups = "disabled"\nnetns = "host"\n'
          'default_ulimits = ["nofile=1024:1024", "nproc=1000:1000", "memlock=%d:%d"]\n'
          % (ml[0], ml[1]) +
          '[network]\nnetwork_config_dir = "%s/cni"\n' % B +
          '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    # the guest's own podman reads its own containers.conf (CONTAINERS_CONF is never sent)
    shutil.copy(B + "/containers.conf", ROOT + "/etc/containers/containers.conf")
    store = ["--root", B + "/storage", "--runroot", B + "/runroot"]
    rootfs = B + "/bbroot"
    os.makedirs(rootfs + "/bin")
    shutil.copy("/bin/busybox", rootfs + "/bin/busybox")
    for app in ("sh", "cat", "echo", "env", "sleep", "ls", "true"):
        os.symlink("busybox", rootfs + "/bin/" + app)
    env = dict(os.environ, CONTAINERS_CONF=B + "/containers.conf")
    tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
    sh("/usr/bin/podman", *store, "import", "-", "localhost/bb:1", stdin=tar.stdout, env=env)
    tar.wait()

    inner = f"""
set -e
umount -l /sys/fs/cgroup; mount -t cgroup2 none /sys/fs/cgroup
mount --bind /usr {ROOT}/usr; mount -o remount,bind,ro {ROOT}/usr
mount --rbind /dev {ROOT}/dev
mount -t proc proc {ROOT}/proc
mount --bind {B}/work {ROOT}{B}/work
mount --bind {B}/sock {ROOT}{B}/sock
/usr/bin/podman {' '.join(store)} system service --time=0 {URL} &
echo $! > {B}/podman.pid
/usr/sbin/sshd -D -f {B}/ssh/sshd_config -E {B}/ssh/sshd.log &
echo $! > {B}/sshd.pid
wait
"""
    os.makedirs(B + "/work", exist_ok=True)
    os.makedirs(B + "/sock", exist_ok=True)
    os.chown(B + "/work", u.pw_uid, u.pw_gid)
    if not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege separation directory
    procs.append(subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                                  env=env, stdout=open(B + "/ns.log", "w"),
                                  stderr=subprocess.STDOUT))
    deadline = time.time() + 30
    while time.time() < deadline and not (os.path.exists(SOCK) and port_open(port)):
        time.sleep(0.1)
    if not os.path.exists(SOCK):
        raise RuntimeError("podman system service did not start: " + open(B + "/ns.log").read())
    os.chown(SOCK, u.pw_uid, u.pw_gid)
    os.chmod(B + "/sock", 0o755)
    return u, port


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def teardown():
    try:
        if os.path.exists(SOCK):
            podman_host("pod", "rm", "-af", check_rc=False, timeout=60)
            podman_host("rm", "-af", "-t", "0", check_rc=False, timeout=60)
            # the networks' configs are ours (network_config_dir), their bridges the host's
            podman_host("network", "prune", "-f", check_rc=False, timeout=60)
    except Exception as e:  # keep tearing down
        print("teardown: %s" % e)
    for f in ("sshd.pid", "podman.pid"):
        try:
            os.kill(int(open(os.path.join(B, f)).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    # whatever the throwaway VM user still runs is this test's: end it by pid
    left = subprocess.run(["pgrep", "-u", USER], capture_output=True, text=True).stdout.split()
    for pid in left:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["/usr/sbin/userdel", USER], capture_output=True)
    subprocess.run(["umount", "-R", B + "/storage/overlay"], capture_output=True)
    shutil.rmtree(B, ignore_errors=True)


# -- the host side ---------------------------------------------------------

def host_bin():
    d = B + "/hostbin"
    os.makedirs(d, exist_ok=True)
    for name, real in (("podman", "/usr/bin/podman"), ("podman-compose", "/usr/bin/podman-compose")):
        write(d + "/" + name, "#!/bin/sh\nprintf '%%s\\n' \"%s $*\" >> %s/host-calls.log\n"
              "exec %s \"$@\"\n" % (name, B, real), mode=0o755)
    return d


def fyc(proj, *args, timeout=120, files=("compose.yml",), popen=False):
    cwd = os.path.join(B, "work", proj)
    argv = [FYC, "--ssh-config", B + "/ssh/ssh_config", "--ssh-host", "fyc16-guest",
            "--guest-socket", URL, "--project", proj]
    for f in files:
        argv += ["-f", f]
    argv += list(args)
    env = {"PATH": B + "/hostbin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "CONTAINER_HOST": URL}
    if popen:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def host_client_config(proj, u):
    """The same podman-compose, run by the host's python3 on the host."""
    cwd = os.path.join(B, "work", proj)
    s = subprocess.run([FYC, "--guest-socket", URL, "--project", proj, "-f", "compose.yml",
                        "script", "config"], cwd=cwd, capture_output=True, check=True).stdout
    return subprocess.run(["/usr/bin/python3", "-I", "-"], input=s, cwd=cwd, capture_output=True,
                          env={"PATH": "/usr/bin:/bin"}).stdout.decode()


def project(name, compose, files=None, owner=None):
    d = os.path.join(B, "work", name)
    write(d + "/compose.yml", compose, owner=owner)
    for rel, text in (files or {}).items():
        write(os.path.join(d, rel), text, owner=owner)
    return d


def main():
    u, port = setup()
    hb = host_bin()
    del hb

    # -- the stack verbs --------------------------------------------------
    project("app", "services:\n"
            "  web:\n    image: localhost/bb:1\n"
            "    command: [\"sh\", \"-c\", \"echo hello-from-web; i=0; while true; do echo tick $$i;"
            " i=$$((i+1)); sleep 0.3; done\"]\n"
            "  built:\n    build: ./ctx\n    image: localhost/fyc16built:1\n"
            "    command: [\"sh\", \"-c\", \"cat /hello.txt; sleep 300\"]\n",
            {"ctx/Dockerfile": "FROM localhost/bb:1\nCOPY hello.txt /hello.txt\n",
             "ctx/hello.txt": "hello-from-a-guest-build\n"}, owner=u)
    r = fyc("app", "config", "--services")
    check(r.returncode == 0 and r.stdout.split() == ["built", "web"],
          "config --services: %r %r" % (r.stdout, r.stderr[-300:]))
    r = fyc("app", "config")
    check(r.returncode == 0 and json.loads(r.stdout)["services"]["web"]["image"] == "localhost/bb:1",
          "config renders the project")
    r = fyc("app", "build", "built", timeout=300)
    img = podman_host("image", "exists", "localhost/fyc16built:1", check_rc=False)
    check(r.returncode == 0 and img.returncode == 0,
          "build: the image was built by the engine, from the guest (rc %d) %s" %
          (r.returncode, r.stderr[-400:]))
    r = fyc("app", "up", "-d", timeout=300)
    check(r.returncode == 0, "up -d (rc %d) %s" % (r.returncode, r.stderr[-400:]))
    r = fyc("app", "ps")
    check(r.returncode == 0 and "app_web_1" in r.stdout and "app_built_1" in r.stdout,
          "ps lists the project's containers: %r" % r.stdout[-300:])
    time.sleep(1)
    r = fyc("app", "logs", "web")
    check(r.returncode == 0 and "hello-from-web" in r.stdout, "logs web: %r" % r.stdout[:200])
    r = fyc("app", "logs", "built")
    check("hello-from-a-guest-build" in r.stdout, "the built image's file is in its container")

    # logs -f, ended by a hang-up: the ssh client dies; the guest side must go too. A quiet
    # service (one line, then nothing), so no write fails to tell podman logs the reader left.
    p = fyc("app", "logs", "-f", "built", popen=True)
    time.sleep(3)
    guest = lambda: sh("pgrep", "-u", USER, "-f", "logs", check_rc=False).stdout.split()
    during = guest()
    kids = sh("pgrep", "-P", str(p.pid), "ssh", check_rc=False).stdout.split()
    for k in kids:
        os.kill(int(k), signal.SIGKILL)
    out, _ = p.communicate(timeout=20)
    t0 = time.time()
    while guest() and time.time() - t0 < 5:
        time.sleep(0.1)
    left = guest()
    check(bool(during) and bool(kids) and "hello-from-a-guest-build" in out and not left,
          "logs -f: streamed, and after the hang-up its %d guest processes are gone "
          "(left: %s, %.1fs)" % (len(during), left, time.time() - t0))

    # shell: not through the payload; the engine's compose labels, then podman exec -it
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(B + "/work/app")
        os.execve(FYC, [FYC, "--engine", URL, "--project", "app", "shell", "web", "sh", "-c",
                        "echo in-the-web-shell; tty"],
                  {"PATH": B + "/hostbin:/usr/bin:/bin", "TERM": "dumb"})
    out = b""
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, st = os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace")
    check(os.WEXITSTATUS(st) == 0 and "in-the-web-shell" in text and "/dev/pts/" in text,
          "shell web: podman exec -it on a terminal (%r)" % text[-200:])

    r = fyc("app", "down", timeout=300)
    ps = podman_host("ps", "-a", "--filter", "label=io.podman.compose.project=app",
                     "--format", "{{.Names}}")
    check(r.returncode == 0 and ps.stdout.strip() == "",
          "down removes the project's containers: %r" % ps.stdout)

    # -- no compose client, no build on the host ----------------------------
    calls = open(B + "/host-calls.log").read().splitlines() if os.path.exists(
        B + "/host-calls.log") else []
    subs = []
    for c in calls:
        t = c.split()
        if t[0] != "podman":
            subs.append(t[0])
            continue
        t = t[1:]
        while t and t[0].startswith("--"):
            t = t[2:] if t[0] in ("--url", "--root", "--runroot") else t[1:]
        subs.append(t[0] if t else "")
    check(subs == ["ps", "exec"] and "-it" in calls[-1],
          "on the host ran only the shell's engine calls, ps then exec -it: no compose client, "
          "no build (host calls: %s)" % calls)

    # -- red-first controls -------------------------------------------------
    # 1. env_file: /etc/passwd
    project("envf", "services:\n  show:\n    image: localhost/bb:1\n"
            "    env_file: /etc/passwd\n    command: [\"env\"]\n", owner=u)
    hr = sh("/usr/bin/podman-compose", "-p", "envfhost", "-f", "compose.yml", "up", "-d",
            cwd=B + "/work/envf", env={"PATH": "/usr/bin:/bin", "CONTAINER_HOST": URL,
                                       "CONTAINERS_CONF": B + "/containers.conf"},
            check_rc=False, timeout=120)
    time.sleep(1)
    hl = podman_host("logs", "envfhost_show_1", check_rc=False)
    host_seen = hr.stdout + hr.stderr + hl.stdout + hl.stderr
    check("FYC16_VIEW=host-passwd" in hl.stdout,
          "control: the client on the host reads the host's /etc/passwd (%r)" % host_seen[-300:])
    r = fyc("envf", "up", "-d", timeout=120)
    time.sleep(1)
    gl = podman_host("logs", "envf_show_1", check_rc=False)
    guest_seen = r.stdout + r.stderr + gl.stdout + gl.stderr
    check("FYC16_VIEW=guest-passwd" in gl.stdout and "host-passwd" not in guest_seen,
          "through fy-compose, env_file: /etc/passwd is the guest's (%r)" % guest_seen[-300:])
    fyc("envf", "down", timeout=120)
    podman_host("rm", "-af", "-t", "0", check_rc=False)

    # 2. a file outside the checkout (extends: file:)
    project("outside", "services:\n  web:\n    image: localhost/bb:1\n"
            "    extends:\n      file: %s/outside/base.yml\n      service: base\n" % B, owner=u)
    host = host_client_config("outside", u)
    check("host-outside" in host, "control: the client on the host reads the host's file "
          "outside the checkout (%r)" % host[-200:])
    r = fyc("outside", "config")
    check(r.returncode == 0 and "guest-outside" in r.stdout and "host-outside" not in r.stdout,
          "through fy-compose, the file outside the checkout is the guest's: %r" % r.stdout[-200:])

    # 3. a symlink planted after a check
    d = project("swap", "services:\n  web:\n    image: localhost/bb:1\n"
                "    extends:\n      file: base.yml\n      service: base\n",
                {"base.yml": "services:\n  base:\n    environment:\n      MARK: checked\n"}, owner=u)
    base = os.path.join(d, "base.yml")
    checked = not os.path.islink(base) and os.path.realpath(base).startswith(d + "/")
    os.unlink(base)
    os.symlink(B + "/outside/base.yml", base)  # the box's move, after the check
    host = host_client_config("swap", u)
    check(checked and "host-outside" in host,
          "control: after the check, the client on the host follows the planted symlink to the "
          "host's file")
    r = fyc("swap", "config")
    check(r.returncode == 0 and "guest-outside" in r.stdout and "host-outside" not in r.stdout,
          "through fy-compose, the planted symlink resolves in the guest's view")

    # -- refusals ------------------------------------------------------------
    r = fyc("app", "ps", files=("compose.yml",))
    r2 = subprocess.run([FYC, "--guest-socket", URL, "--project", "app", "ps"],
                        cwd=B + "/work/app", env={"PATH": B + "/hostbin"}, capture_output=True,
                        text=True)
    check(r2.returncode == 69 and "ssh is not installed" in r2.stderr,
          "no ssh on PATH: refused, saying so (%r)" % r2.stderr)
    r3 = subprocess.run([FYC, "--guest-socket", URL, "--project", "app", "ps"],
                        cwd=B + "/work/app", env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                        text=True)
    check(r3.returncode == 69 and "fy-machine is not on PATH" in r3.stderr,
          "no route and no fy-machine: refused, saying so (%r)" % r3.stderr)
    # the route from fy-machine (built elsewhere; here a stand-in recording its argv)
    fm = B + "/fmbin"
    os.makedirs(fm)
    for name, body in (("ok", "printf '%%s\\n' \"$*\" >> %s/fm-calls.log\n"
                        "echo '{\"config\": \"%s/ssh/ssh_config\", \"host\": \"fyc16-guest\", "
                        "\"user\": \"%s\", \"known_hosts\": \"%s/ssh/known_hosts\"}'\n"
                        % (B, B, USER, B)),
                       ("down", "echo 'fy-machine: the VM is stopped' >&2; exit 3\n")):
        write("%s/%s/fy-machine" % (fm, name), "#!/bin/sh\n" + body, mode=0o755)
    env = {"PATH": fm + "/ok:/usr/bin:/bin"}
    r5 = subprocess.run([FYC, "--guest-socket", URL, "--project", "app", "-f", "compose.yml",
                         "config", "--services"], cwd=B + "/work/app", env=env,
                        capture_output=True, text=True)
    fm_calls = open(B + "/fm-calls.log").read().splitlines() if os.path.exists(
        B + "/fm-calls.log") else []
    check(r5.returncode == 0 and r5.stdout.split() == ["built", "web"]
          and fm_calls == ["ssh-target --json"],
          "no --ssh-*: the route is fy-machine ssh-target --json's (calls %s)" % fm_calls)
    r6 = subprocess.run([FYC, "--guest-socket", URL, "--project", "app", "ps"],
                        cwd=B + "/work/app", env={"PATH": fm + "/down:/usr/bin:/bin"},
                        capture_output=True, text=True)
    check(r6.returncode == 69 and "fy-machine ssh-target --json failed (rc 3)" in r6.stderr
          and "the VM is stopped" in r6.stderr,
          "fy-machine failing: refused, saying so (%r)" % r6.stderr)
    # the stream damaged on its way (a real ssh behind a filter that cuts or alters stdin)
    for name, filt, rc, text in (
            ("cut", "head -c 40000", 70, "did not arrive whole"),
            ("flip", "/usr/bin/python3 -c \"import sys; d = bytearray(sys.stdin.buffer.read()); "
                     "i = d.index(b'_fy_boot(') + 30000; d[i] = 65 if d[i] != 65 else 66; "
                     "sys.stdout.buffer.write(d)\"", 97, "arrived corrupt")):
        d = B + "/damage-" + name
        write(d + "/ssh", "#!/bin/sh\n%s | /usr/bin/ssh \"$@\"\n" % filt, mode=0o755)
        r7 = subprocess.run([FYC, "--ssh-config", B + "/ssh/ssh_config", "--ssh-host",
                             "fyc16-guest", "--guest-socket", URL, "--project", "app", "-f",
                             "compose.yml", "config", "--services"], cwd=B + "/work/app",
                            env={"PATH": d + ":/usr/bin:/bin"}, capture_output=True, text=True)
        check(r7.returncode == rc and text in r7.stderr and not r7.stdout,
              "payload %s on the way: rc %d, %r" % (name, r7.returncode, r7.stderr[-160:]))
    os.makedirs(B + "/hostonly", exist_ok=True)
    r4 = subprocess.run([FYC, "--ssh-config", B + "/ssh/ssh_config", "--ssh-host", "fyc16-guest",
                         "--guest-socket", URL, "--project", "app", "ps"], cwd=B + "/hostonly",
                        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    check(r4.returncode == 4 and B + "/hostonly" in r4.stderr,
          "a cwd the guest lacks fails naming it (rc %d, %r)" % (r4.returncode, r4.stderr[-200:]))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        import traceback
        traceback.print_exc()
        failures.append(str(e))
        for f in ("ns.log", "ssh/sshd.log"):
            try:
                print("--- %s\n%s" % (f, open(os.path.join(B, f)).read()[-3000:]))
            except OSError:
                pass
    finally:
        teardown()
    if failures:
        print("%d failed" % len(failures))
        sys.exit(1)

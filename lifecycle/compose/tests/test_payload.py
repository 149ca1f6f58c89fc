#!/usr/bin/env python3
"""The payload, run by this machine's /usr/bin/python3 -I - exactly as the guest
runs it (the stdin is the one `fy-compose script` prints, i.e. what a call
sends). No guest is needed for these: they check the payload itself.

  - the build is reproducible (two builds, same bytes, the hash --version shows);
  - it imports from memory: an audit hook sees no file opened for writing and
    no read of an installed podman_compose, yaml or dotenv;
  - a corrupt stream fails the size/hash check (rc 97) before any import; a
    truncated one is a SyntaxError and nothing runs;
  - the runner refuses a request without CONTAINER_HOST (rc 3) and a cwd
    missing here (rc 4, naming it); it waits for a -f file that appears late
    (and, with --wait 0, the same call fails: the control);
  - podman-compose's podman (a recording stand-in first on PATH, the only fake
    here) gets REGISTRY_AUTH_FILE naming an in-memory file with no login and CONTAINER_HOST.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

FYC = os.environ["FY_COMPOSE"]
ZIP = os.environ["FY_COMPOSE_ZIP"]
SRC = os.environ["FY_COMPOSE_SRC"]
PY = "/usr/bin/python3"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def script(cwd, *args, env=None):
    e = dict(os.environ if env is None else env)
    return subprocess.run([FYC, "--project", "p1", "--guest-socket", "unix:///nonexistent/e.sock",
                           *args], cwd=cwd, env=e, check=True, capture_output=True).stdout


def run_py(stdin, cwd, path_prefix=None, timeout=60):
    env = {"PATH": (path_prefix + ":" if path_prefix else "") + "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([PY, "-I", "-"], input=stdin, cwd=cwd, env=env, capture_output=True,
                          timeout=timeout)


AUDIT = b'''import sys as _s
def _fy_audit(ev, args):
    if ev == "open":
        p, mode = str(args[0]), args[1]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or \\
           (isinstance(args[2], int) and args[2] & 3):
            _s.stderr.write("AUDIT-WRITE %s\\n" % p)
        if re.search(r"(podman_compose|/yaml/|/dotenv/|_yaml)", p):
            _s.stderr.write("AUDIT-READ %s\\n" % p)
import re
_s.addaudithook(_fy_audit)
'''


def main():
    tmp = tempfile.mkdtemp(prefix="fyc16-payload-%d-" % os.getpid())
    try:
        # 1. reproducible
        outs = []
        for i in range(2):
            z, cc = os.path.join(tmp, "p%d.zip" % i), os.path.join(tmp, "p%d.cc" % i)
            r = subprocess.run([PY, os.path.join(SRC, "payload/build_payload.py"), "--runner",
                                os.path.join(SRC, "payload/runner.py"), "--bootstrap",
                                os.path.join(SRC, "payload/bootstrap.py"), "--out-zip", z,
                                "--out-cc", cc], check=True, capture_output=True, text=True)
            outs.append(open(z, "rb").read())
        ver = subprocess.run([FYC, "--version"], check=True, capture_output=True, text=True).stdout
        h = hashlib.sha256(outs[0]).hexdigest()
        check(outs[0] == outs[1], "two builds give the same bytes")
        check(h in ver and h == hashlib.sha256(open(ZIP, "rb").read()).hexdigest(),
              "fy-compose --version reports the built payload's sha256")
        check(re.search(r"podman-compose=\S+ python3-dotenv=\S+ python3-yaml=\S+", ver) is not None,
              "--version names the pinned Debian versions")

        proj = os.path.join(tmp, "proj")
        os.mkdir(proj)
        with open(os.path.join(proj, "compose.yml"), "w") as f:
            f.write("services:\n  web:\n    image: localhost/bb:1\n    environment:\n"
                    "      A: ${FOO:-unset}\n  db:\n    image: localhost/bb:1\n")

        # 2. from memory
        s = script(proj, "-f", "compose.yml", "script", "ps")
        s_services = script(proj, "-f", "compose.yml", "script", "config", "--services")
        m = re.search(rb'b"([A-Za-z0-9+/=]+)"\)\n$', s)
        req = json.loads(base64.b64decode(m.group(1)))
        r = run_py(AUDIT + s_services, proj)
        out = r.stdout.decode()
        check(r.returncode == 0 and '"body": ["db", "web"]' in out,
              "config --services answers from the payload: %r" % out[-200:])
        check(b"AUDIT-WRITE" not in r.stderr, "no file is opened for writing (%r)"
              % r.stderr[-300:])
        check(b"AUDIT-READ" not in r.stderr, "no installed podman_compose/yaml/dotenv is read")

        r = run_py(AUDIT + b"import sys\nsys.path.append('/usr/lib/python3/dist-packages')\n"
                   b"import yaml\nopen('/dev/null', 'w')\n", proj)
        check(b"AUDIT-READ" in r.stderr and b"AUDIT-WRITE" in r.stderr,
              "control: the audit hook does see an installed yaml read and a write")

        # 3. corrupt and truncated
        body_at = s.index(b'_fy_boot(b"""\n') + 20000
        flip = bytearray(s)
        flip[body_at] = ord("A") if flip[body_at] != ord("A") else ord("B")
        r = run_py(bytes(flip), proj)
        check(r.returncode == 97 and b"arrived corrupt" in r.stderr,
              "a corrupted payload fails the size/hash check (rc %d, %r)" % (r.returncode,
                                                                            r.stderr[-200:]))
        r = run_py(s[: len(s) * 2 // 3], proj)
        check(r.returncode == 1 and b"SyntaxError" in r.stderr and not r.stdout,
              "a truncated payload runs nothing (rc %d)" % r.returncode)

        # 4. CONTAINER_HOST unset in the request
        req2 = dict(req, answer="")
        req2["env"] = {k: v for k, v in req["env"].items() if k not in ("CONTAINER_HOST",)}
        r = run_py(s.replace(m.group(1), base64.b64encode(json.dumps(req2).encode())), proj)
        check(r.returncode == 3 and b"CONTAINER_HOST is not set" in r.stderr,
              "no CONTAINER_HOST: refused (rc %d)" % r.returncode)

        # 5. a cwd missing here
        gone = os.path.join(tmp, "gone-dir")
        os.mkdir(gone)
        s_gone = script(gone, "-f", os.path.join(proj, "compose.yml"), "script", "ps")
        os.rmdir(gone)
        r = run_py(s_gone, proj)
        check(r.returncode == 4 and gone.encode() in r.stderr and b"does not exist" in r.stderr,
              "a missing cwd fails naming it (rc %d, %r)" % (r.returncode, r.stderr[-200:]))

        # 6. a -f file that appears late: waited for; with --wait 0 the same fails
        late = os.path.join(proj, "late.yml")
        for wait, want_ok in (("0", False), ("6", True)):
            s_late = script(proj, "--wait", wait, "-f", "late.yml", "script", "config",
                            "--services")
            t = threading.Timer(3.0, lambda: open(late, "w").write(
                "services:\n  late:\n    image: localhost/bb:1\n"))
            t.start()
            t0 = time.monotonic()
            r = run_py(s_late, proj)
            t.join()
            ok = r.returncode == 0 and b'"late"' in r.stdout
            check(ok == want_ok, "--wait %s: a -f file created after 3 s %s (rc %d, %.1fs)"
                  % (wait, "is read" if want_ok else "is missing", r.returncode,
                     time.monotonic() - t0))
            os.unlink(late)

        # 7. what podman-compose's podman is given
        fake = os.path.join(tmp, "fakebin")
        os.mkdir(fake)
        log = os.path.join(tmp, "podman.log")
        with open(os.path.join(fake, "podman"), "w") as f:
            f.write("#!/usr/bin/python3\nimport json,os,sys\nopen(%r,'a').write(json.dumps("
                    "{'argv':sys.argv[1:],'env':dict(os.environ),'auth':open(os.environ['REGISTRY_AUTH_FILE'])"
                    ".read()})+'\\n')\n"
                    "if sys.argv[1:2] == ['--version']: print('podman version 4.3.1')\n" % log)
        os.chmod(os.path.join(fake, "podman"), 0o755)
        env = dict(os.environ, HOME="/home/host-op", REGISTRY_AUTH_FILE="/home/host-op/auth.json")
        s_ps = script(proj, "-f", "compose.yml", "script", "ps", env=env)
        r = run_py(s_ps, proj, path_prefix=fake)
        calls = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
        check(r.returncode == 0 and calls and calls[-1]["argv"][0] == "ps",
              "ps reaches podman-compose's podman (%d calls, rc %d)" % (len(calls), r.returncode))
        if calls:
            e = calls[-1]["env"]
            check(re.match(r"^/proc/\d+/fd/\d+$", e.get("REGISTRY_AUTH_FILE", "")) is not None
                  and json.loads(calls[-1]["auth"]) == {"auths": {}}
                  and not os.path.exists(e["REGISTRY_AUTH_FILE"]),
                  "REGISTRY_AUTH_FILE is the runner's in-memory empty login, gone with it: %s"
                  % e.get("REGISTRY_AUTH_FILE"))
            check(e.get("CONTAINER_HOST") == "unix:///nonexistent/e.sock",
                  "podman gets the guest-side CONTAINER_HOST")
            check(e.get("HOME") != "/home/host-op", "the host's HOME is not sent")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("%d failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()

"""The provisioned user units (provision/*.service.in), rendered as the
lifecycle renders them, pass `systemd-analyze verify`, in system and in user
mode, with nothing said about them. The check is shown able to fail: a copy
with an unknown key and one with a relative ExecStart are reported. Exits 77,
saying why, without systemd-analyze."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROV = os.path.join(os.path.dirname(HERE), "provision")
BIN = os.path.abspath(os.environ["FY_SOCKFILTER"]) if os.environ.get("FY_SOCKFILTER") else None


def verify(tmp, names, user):
    cmd = ["systemd-analyze"] + (["--user"] if user else []) + ["verify", "--man=no"] + names
    env = dict(os.environ, XDG_RUNTIME_DIR=tmp, HOME=tmp)
    r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=120, env=env)
    return r.returncode, (r.stdout + r.stderr).strip()


def main():
    if not shutil.which("systemd-analyze"):
        print("SKIP: systemd-analyze is not installed (Debian package systemd)")
        return 77
    if not BIN or not os.path.exists(BIN):
        print("FY_SOCKFILTER is not set to the built binary")
        return 1
    podman = shutil.which("podman") or "/usr/bin/podman"
    if not os.path.exists(podman):
        print("SKIP: podman is not installed (the unit's ExecStart must exist to verify)")
        return 77
    tmp = tempfile.mkdtemp(prefix="fy-sf-units-%d-" % os.getpid())
    failed = 0
    try:
        units = {"podman-runsc.service": {"@PODMAN@": podman, "@DOCDIR@": "/usr/share/doc/foldyard"},
                 "podman-runsc-filter.service": {"@FY_SOCKFILTER@": BIN}}
        for name, subs in units.items():
            text = open(os.path.join(PROV, name + ".in")).read()
            for k, v in subs.items():
                assert k in text, (name, k)
                text = text.replace(k, v)
            assert "@" not in text.replace("%h", "").replace("%t", ""), (name, "placeholder left")
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        for user in (False, True):
            rc, out = verify(tmp, list(units), user)
            mode = "user" if user else "system"
            if rc == 0 and not any(n in out for n in units):
                print("ok   systemd-analyze %s verify: %s" % (mode, " ".join(units)))
            else:
                failed += 1
                print("FAIL systemd-analyze %s verify (rc %d):\n%s" % (mode, rc, out))
        # The check can fail.
        good = open(os.path.join(tmp, "podman-runsc-filter.service")).read()
        for bad, why in [(good.replace("[Service]\n", "[Service]\nBogusKey=1\n"), "Unknown key"),
                         (good.replace("ExecStart=" + BIN, "ExecStart=relative/fy-sockfilter"),
                          "executable")]:
            with open(os.path.join(tmp, "fy-sf-bad.service"), "w") as f:
                f.write(bad)
            rc, out = verify(tmp, ["fy-sf-bad.service"], False)
            if "fy-sf-bad.service" in out and why in out:
                print("ok   a broken copy is reported (%s)" % why)
            else:
                failed += 1
                print("FAIL a broken copy was not reported (%s): rc %d %s" % (why, rc, out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

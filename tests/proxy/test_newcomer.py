"""The README's first command, as a new user meets it: a new, empty HOME (no
~/.local at all), the command line `scripts/run` starts (scripts/run is
install-deps + build + scripts/serve, and this test runs scripts/serve itself,
with no flag of its own), plain and HTTPS requests through it with the CA path
it prints, and `fy-netlog` with no arguments in that HOME showing the host.

It runs the defaults as they are, 127.0.0.1:8088 and the admin on
127.0.0.1:8089, inside a network namespace of its own (fy12nc-<pid>), so it
cannot collide with a proxy already running on the machine. In that namespace
the origin is origin.test on 127.0.0.1:80 and :443, with a certificate from a
throwaway CA; the namespace's processes see an /etc/hosts that names it and a
system trust bundle that includes that CA (bind mounts in the mount namespace
`ip netns exec` makes), as a real origin is trusted by the real system roots.

Needs root (namespaces, mounts); without it the test exits 77 and says why."""

import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

from fynet import netns_add, netns_del
from fytest import BUILD, SOURCE, TestCA, binary, wait_until

NS = f"fy12nc-{os.getpid()}"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
FYTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib", "fytest.py")


def skip_whole_file(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(77)


if __name__ == "__main__":
    if os.geteuid() != 0:
        skip_whole_file("needs root: it makes a network namespace and bind mounts")
    for tool in ("ip", "curl", "mount"):
        if not shutil.which(tool):
            skip_whole_file(f"{tool} is not installed")
    if not os.path.exists(SYSTEM_BUNDLE):
        skip_whole_file(f"{SYSTEM_BUNDLE} is missing (ca-certificates)")


def fresh_env(home):
    """What a new login has: HOME, PATH, a locale; no XDG_*, no proxies."""
    return {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


class Namespace:
    """A network namespace with loopback up; in() prefixes argv to run there
    with this test's /etc/hosts and trust bundle bind-mounted."""

    def __init__(self, hosts, bundle):
        self.hosts, self.bundle = hosts, bundle

    def __enter__(self):
        netns_del(NS)
        netns_add(NS)
        return self

    def __exit__(self, *exc):
        netns_del(NS)

    def argv(self, *cmd):
        mounts = (f'mount --bind "{self.hosts}" /etc/hosts && '
                  f'mount --bind "{self.bundle}" {SYSTEM_BUNDLE} && exec "$@"')
        return ["ip", "netns", "exec", NS, "sh", "-c", mounts, "sh", *cmd]


def read_line(stream, timeout, what):
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        ch = os.read(stream.fileno(), 1)
        if not ch:
            break
        buf += ch
        if ch == b"\n":
            return buf.decode()
    raise AssertionError(f"no {what} within {timeout} s (got {buf!r})")


class Newcomer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=f"fy12nc-{os.getpid()}-")
        self.home = os.path.join(self.tmp, "home")
        os.mkdir(self.home)
        self.procs = []
        ca = TestCA(self.tmp)
        self.cert, self.key = ca.issue(["origin.test"])
        self.hosts = os.path.join(self.tmp, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.1 localhost\n127.0.0.1 origin.test\n::1 localhost\n")
        self.bundle = os.path.join(self.tmp, "ca-certificates.crt")
        with open(self.bundle, "w") as out, open(SYSTEM_BUNDLE) as sys_roots, open(ca.cert_path) as ours:
            out.write(sys_roots.read() + ours.read())

    def tearDown(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_origin(self, ns, port, tls):
        log = os.path.join(self.tmp, f"origin-{port}.jsonl")
        argv = ["python3", FYTEST, "origin", "--host", "127.0.0.1", "--port", str(port), "--log", log]
        if tls:
            argv += ["--cert", self.cert, "--key", self.key]
        p = subprocess.Popen(ns.argv(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(p)
        self.assertIn("listening", read_line(p.stdout, 10, f"the origin on :{port}"))
        return log

    def test_the_first_command_works_in_an_empty_home(self):
        self.assertFalse(os.path.exists(os.path.join(self.home, ".local")))
        with Namespace(self.hosts, self.bundle) as ns:
            plain_log = self.start_origin(ns, 80, tls=False)
            tls_log = self.start_origin(ns, 443, tls=True)

            # What scripts/run execs after it built: scripts/serve build [the user's flags: none].
            err_path = os.path.join(self.tmp, "serve.stderr")
            with open(err_path, "wb") as err:
                proxy = subprocess.Popen(ns.argv(os.path.join(SOURCE, "scripts/serve"), BUILD),
                                         stdout=subprocess.PIPE, stderr=err, env=fresh_env(self.home))
            self.procs.append(proxy)
            try:
                ready = read_line(proxy.stdout, 30, "ready line")
            except AssertionError:
                proxy.wait(timeout=10)
                with open(err_path) as f:
                    raise AssertionError(f"fy-proxy did not start (exit {proxy.returncode}):\n{f.read()}")
            with open(err_path) as f:
                said = f.read()
            self.assertTrue(ready.startswith("fy-proxy ready: listening on 127.0.0.1:8088 · admin 127.0.0.1:8089"),
                            ready)

            # The state directory and CA path scripts/serve printed are the ones fy-proxy made and uses.
            state = os.path.join(self.home, ".local/state/foldyard/egress")
            self.assertIn(f"(state: {state})", said)
            m = re.search(r"--cacert (\S+) https://", said)
            self.assertIsNotNone(m, said)
            cacert = m.group(1)
            self.assertEqual(cacert, os.path.join(state, "ca-cert.pem"))
            self.assertIn(f"CA {cacert} ", ready)
            self.assertEqual(stat.S_IMODE(os.stat(state).st_mode), 0o700)
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(state, "logs")).st_mode), 0o700)
            self.assertIn(f"made the state directory {state}", said)
            self.assertEqual(said.count("made the state directory"), 1, said)

            env = fresh_env(self.home)
            plain = subprocess.run(ns.argv("curl", "-sS", "--max-time", "20", "-x", "http://127.0.0.1:8088",
                                           "http://origin.test/newcomer-plain"),
                                   capture_output=True, env=env, timeout=30)
            self.assertEqual(plain.returncode, 0, plain.stderr)
            self.assertIn(b"/newcomer-plain", plain.stdout)
            https = subprocess.run(ns.argv("curl", "-sS", "--max-time", "20", "-x", "http://127.0.0.1:8088",
                                           "--cacert", cacert, "https://origin.test/newcomer-tls"),
                                   capture_output=True, env=env, timeout=30)
            self.assertEqual(https.returncode, 0, https.stderr)
            self.assertIn(b"/newcomer-tls", https.stdout)
            for log, path in ((plain_log, "/newcomer-plain"), (tls_log, "/newcomer-tls")):
                with open(log) as f:
                    self.assertIn(path, f.read())

            # fy-netlog, as scripts/serve told the user to run it: no arguments.
            m = re.search(r"^  (\S+/fy-netlog)\s+# who used which host$", said, re.M)
            self.assertIsNotNone(m, f"scripts/serve did not print a bare fy-netlog command:\n{said}")
            self.assertEqual(os.path.realpath(m.group(1)), os.path.realpath(binary("fy-netlog")))

            def summary():
                r = subprocess.run([m.group(1)], capture_output=True, text=True, env=fresh_env(self.home),
                                   cwd=SOURCE, timeout=10)
                return r.stdout if r.returncode == 0 and "origin.test" in r.stdout else None
            out = wait_until(summary, timeout=10, what="fy-netlog to show origin.test")
            self.assertIn("origin.test", out)

            proxy.send_signal(signal.SIGTERM)
            self.assertEqual(proxy.wait(timeout=20), 0)
        with open(err_path) as f:
            err = f.read()
        self.assertNotIn("AddressSanitizer", err)
        self.assertNotIn("runtime error:", err)

    def test_a_state_directory_that_cannot_be_made_names_the_path_the_reason_and_the_flag(self):
        with open(os.path.join(self.home, ".local"), "w") as f:
            f.write("a file where a directory should be\n")
        r = subprocess.run([binary("fy-proxy"), "--listen", "127.0.0.1:0", "--admin", "off"],
                           capture_output=True, text=True, env=fresh_env(self.home), timeout=20)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(f"{self.home}/.local exists and is not a directory", r.stderr)
        self.assertIn("pick another with --state-dir DIR", r.stderr)
        self.assertNotIn("ready", r.stdout)

    def test_fy_proxy_and_fy_netlog_agree_on_the_state_directory(self):
        # A relative XDG_STATE_HOME is ignored by both (the XDG spec); an
        # absolute one is used by both; without HOME the passwd entry's home.
        cases = [({"XDG_STATE_HOME": "relative/state"}, os.path.join(self.home, ".local/state")),
                 ({"XDG_STATE_HOME": os.path.join(self.tmp, "xdg")}, os.path.join(self.tmp, "xdg"))]
        for extra, state_home in cases:
            env = dict(fresh_env(self.home), **extra)
            state = subprocess.run([binary("fy-proxy"), "--print-state-dir"], capture_output=True, text=True,
                                   env=env, check=True).stdout.strip()
            self.assertEqual(state, os.path.join(state_home, "foldyard/egress"), extra)
            r = subprocess.run([binary("fy-netlog")], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn(os.path.join(state, "logs/egress.jsonl"), r.stderr, extra)


if __name__ == "__main__":
    unittest.main(verbosity=2)

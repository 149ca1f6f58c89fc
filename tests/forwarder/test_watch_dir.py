#!/usr/bin/env python3
"""The bridge directory watch (watch = "events") with a directory that is
missing at start, created late, removed and re-created, renamed away, and a
namespace file bind-mounted at the path and unmounted.

Regression for an abort in a slow (TCG) guest: with the directory missing at
start, fy-forwarder died in uv__finish_close (!(handle->flags &
UV_HANDLE_CLOSED)) when start() took longer than poll_ms, because the poll
timer, due in the loop's first turn, re-initialised the watch's handle while
its close was pending. A fast host never takes that long, so the slow start is
made here: strace delays every openat by 20 ms (strace -e inject). Without
strace the test is skipped (exit 77), never passed.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_topology import build_dir, control_request  # noqa: E402
from fynet import netns_add, netns_del  # noqa: E402
from fyproc import sh  # noqa: E402

PREFIX = "fyfwa-%d" % os.getpid()


def control(sock, cmd="status"):
    return control_request(sock, cmd, timeout=1.0)


class WatchDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=PREFIX + "-")
        self.nets = []
        self.mounts = []
        self.proc = None

    def tearDown(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m], capture_output=True)
        for n in self.nets:
            netns_del(n)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log(self):
        with open(os.path.join(self.tmp, "fwd.log"), errors="replace") as f:
            return f.read()

    def wait_status(self, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail("fy-forwarder exited (%s):\n%s" % (self.proc.returncode, self.log()))
            try:
                last = control(self.sock)
                if pred(last):
                    return last
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        self.fail("status never matched; last: %s\n%s" % (last, self.log()))

    def new_netns(self, path):
        name = "%s-%d" % (PREFIX, len(self.nets))
        netns_add(name, lo_up=False)
        self.nets.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        open(path, "w").close()
        subprocess.run(["mount", "--bind", "/run/netns/" + name, path], check=True)
        self.mounts.append(path)
        return os.stat(path).st_ino

    def test_missing_late_removed_recreated_renamed(self):
        strace = shutil.which("strace")
        if not strace:
            print("SKIP: strace is not installed (it makes the slow start)")
            sys.exit(77)
        key = os.path.join(self.tmp, "key")
        with open(key, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(key, 0o600)
        state = os.path.join(self.tmp, "state")
        os.mkdir(state)
        self.sock = os.path.join(state, "control.sock")
        run_user = os.path.join(self.tmp, "run-user")  # /run/user/<uid>, missing at start
        nsdir = os.path.join(run_user, "netns")
        nspath = os.path.join(nsdir, "rootless-netns")
        cfg = os.path.join(self.tmp, "fwd.toml")
        with open(cfg, "w") as f:
            f.write('key_file = "%s"\nstate_dir = "%s"\n[upstream]\nhost = "127.0.0.1"\n'
                    '[[port]]\nport = 42991\n[bridge]\nnetns = "%s"\npoll_ms = 10\n'
                    'watch = "events"\nredirect = false\n' % (key, state, nspath))
        exe = os.path.join(build_dir(), "forwarder", "fy-forwarder")
        logf = open(os.path.join(self.tmp, "fwd.log"), "w")
        # LeakSanitizer cannot run under ptrace (it stops the process with a
        # fatal error at exit), so an ASan build runs here with leak checking
        # off; ASan's and UBSan's other checks stay on. The leak check of this
        # code is forwarder_test.cc's DirWatch case, which runs untraced.
        env = dict(os.environ)
        asan = env.get("ASAN_OPTIONS", "")
        env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0"
        self.proc = subprocess.Popen(
            [strace, "-f", "-o", "/dev/null", "-e", "inject=openat:delay_exit=20000",
             exe, "--config", cfg, "--log-level", "debug"],
            stdout=logf, stderr=subprocess.STDOUT, env=env)
        self.wait_status(lambda s: "bridge=" in s, timeout=30)
        time.sleep(0.5)  # many poll ticks with the directory missing
        self.assertIsNone(self.proc.poll(), self.log())

        # Created late, then a namespace mounted in it: served.
        os.makedirs(nsdir)
        self.new_netns(nspath)
        self.wait_status(lambda s: "bridge=listening" in s, timeout=20)

        # Unmounted, the directory removed and re-created, a new namespace.
        subprocess.run(["umount", "-l", nspath], check=True)
        self.mounts.remove(nspath)
        shutil.rmtree(run_user)
        time.sleep(0.3)
        os.makedirs(nsdir)
        self.new_netns(nspath)
        self.wait_status(lambda s: "bridge=listening" in s, timeout=20)

        # Renamed away, another directory at the path, a new namespace.
        gone = os.path.join(self.tmp, "gone")
        os.rename(run_user, gone)
        subprocess.run(["umount", "-l", os.path.join(gone, "netns", "rootless-netns")])
        self.mounts.remove(nspath)
        time.sleep(0.3)
        os.makedirs(nsdir)
        self.new_netns(nspath)
        self.wait_status(lambda s: "bridge=listening" in s, timeout=20)

        # SIGTERM to the forwarder itself (its pid file), not to strace.
        with open(os.path.join(state, "pid")) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        rc = self.proc.wait(timeout=20)
        self.assertEqual(rc, 0, self.log())
        self.assertIn("stopped", self.log())
        self.assertNotIn("Assertion", self.log())


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Never fail open.

kill -9 the forwarder: every new connection from a container is reset at once
(nothing else listens), an open tunnel is cut, nothing reaches the proxy, and
there is no other way out of the rootless namespace. The liveness probe and the
OCI hook report it. A restart serves again, says loudly that it follows a
crash, and continues the stamp sequence (no stamp is refused as a replay). A
SIGTERM is a clean stop. The systemd unit passes systemd-analyze.

A bridge namespace the forwarder cannot see is not taken for "no bridge
namespace": the status says bridge=absent:never-found, `--probe
--require-bridge` fails, and the hook, which looks at the path itself from the
runtime's mount namespace, holds the container when it sees a namespace there
that the forwarder does not serve. The shipped unit's ProtectHome= leaves the
namespace visible: the forwarder run in a mount namespace set up the way systemd
sets up that setting (a slave of this one, the /run/user stand-in made
read-only) follows a namespace mounted there later; with ProtectHome=yes (the
stand-in covered by an empty directory) it would not, and the probe and the hook
say so.
"""

import ctypes
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import (FORWARDER, GATEWAY, HOOK, ORIGIN, PROXY_PORT, Rig,  # noqa: E402
                      answer_budget_ms, get)
from fyf_topology import source_dir  # noqa: E402

UNIT = os.path.join(source_dir(), "forwarder", "exe", "fy-forwarder.service")


def unit_protect_home():
    with open(UNIT) as f:
        m = re.search(r"^ProtectHome=(\S+)", f.read(), re.M)
    return m.group(1) if m else "no"


def probe(sock, *extra):
    return subprocess.run([FORWARDER, "--probe", "--control", sock] + list(extra),
                          capture_output=True, text=True, timeout=10)


def hook(sock, timeout_ms=None, wrap=None):
    """Runs the hook; `timeout_ms`: its budget (default: answer_budget_ms);
    `wrap`: a shell line run first in a private mount namespace of the hook's
    own (the runtime's mount namespace, seeing what the forwarder may not)."""
    if timeout_ms is None:
        timeout_ms = answer_budget_ms(sock)
    argv = [HOOK, "--control", sock, "--timeout-ms", str(timeout_ms)]
    if wrap:
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                wrap + " && exec " + " ".join(argv)]
    return subprocess.run(argv, input="{}", capture_output=True, text=True,
                          timeout=30 + timeout_ms / 1000)

TUNNEL = r"""
import socket, sys, time
s = socket.create_connection((%r, %d), timeout=5)
s.sendall(b"CONNECT %s:80 HTTP/1.1\r\nHost: x\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(4096)
print("open", head.split(b"\r\n")[0].decode(), flush=True)
sys.stdin.readline()  # the test kills the forwarder, then says go
try:
    s.sendall(b"GET /after-kill HTTP/1.1\r\nHost: o\r\n\r\n")
    data = s.recv(4096)
    print("after", "eof" if not data else "data:" + data.decode("latin-1"), flush=True)
except OSError as e:
    print("after", type(e).__name__, flush=True)
""" % (GATEWAY, PROXY_PORT, ORIGIN)


class FailClosed(unittest.TestCase):
    def test_kill9_resets_clients_and_nothing_gets_round(self):
        with Rig("fcl", containers=(("podman1", 2),)) as rig:
            ok = rig.client(0, get("http://%s/before" % ORIGIN))[0]
            self.assertEqual(ok["status"], 200, ok)
            seq_before = rig.proxy_row_for("http://%s/before" % ORIGIN)["stamp"]["seq"]

            tunnel = subprocess.Popen(
                ["ip", "netns", "exec", rig.topo.containers[1][0], "python3", "-c", TUNNEL],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                self.assertIn("200", tunnel.stdout.readline())
                rows_before = len(rig.proxy_rows())

                rig.fwd.kill9()

                tunnel.stdin.write("go\n")
                tunnel.stdin.flush()
                after = tunnel.stdout.readline().split()
                self.assertEqual(after[0], "after")
                self.assertIn(after[1], ("eof", "ConnectionResetError", "BrokenPipeError"),
                              "an open tunnel must be cut when the forwarder dies")
            finally:
                tunnel.kill()
                tunnel.wait(timeout=10)

            for i in range(2):
                results = rig.client(i, get("http://%s/dead" % ORIGIN), count=20, timeout=3)
                for r in results:
                    self.assertFalse(r["ok"], r)
                    self.assertEqual(r["error"], "ECONNREFUSED", r)  # an RST, at once
                    self.assertLess(r["elapsed_ms"], 500, r)
            # No other way out of the rootless namespace: not the gateway's other
            # ports, not the origin, not the VM.
            for target in ("%s:80" % ORIGIN, "%s:22" % GATEWAY, "192.168.5.15:%d" % PROXY_PORT):
                r = rig.client(0, get("http://%s/round" % ORIGIN), connect=target, timeout=2)[0]
                self.assertFalse(r["ok"], (target, r))
                self.assertIn(r["error"], ("ENETUNREACH", "EHOSTUNREACH", "TimeoutError"),
                              (target, r))
            time.sleep(0.3)
            self.assertEqual(len(rig.proxy_rows()), rows_before,
                             "something reached the proxy while the forwarder was dead")
            self.assertFalse([r for r in rig.proxy_rows()
                              if "/dead" in r.get("target", "") or "/round" in r.get("target", "")
                              or "after-kill" in r.get("target", "")])

            # The probe and the hook say so.
            sock = os.path.join(rig.topo.path("state"), "control.sock")
            p = subprocess.run([FORWARDER, "--probe", "--control", sock], capture_output=True,
                               text=True, timeout=10)
            self.assertEqual(p.returncode, 1)
            self.assertTrue(p.stdout.startswith("fail "), p.stdout)
            h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", "300"], input="{}",
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(h.returncode, 1)
            self.assertIn("not listening", h.stderr)
            self.assertIn("container is not started", h.stderr)
            h = subprocess.run([HOOK, "--control", sock, "--timeout-ms", "300", "--on-timeout",
                                "continue"], input="{}", capture_output=True, text=True,
                               timeout=10)
            self.assertEqual(h.returncode, 0)

            # A restart (as systemd's Restart=always would) serves again, loudly.
            fwd = rig.start_forwarder(name="restarted")
            self.assertIn("stopped without a clean shutdown", fwd.log())
            self.assertIn("restarted_after_crash=1", rig.topo.control("status"))
            res = rig.client(0, get("http://%s/after" % ORIGIN))[0]
            self.assertEqual(res["status"], 200, res)
            row = rig.proxy_row_for("http://%s/after" % ORIGIN)
            self.assertEqual(row["stamp_status"], "valid", row)
            self.assertGreater(row["stamp"]["seq"], seq_before)

            # SIGTERM: a clean stop; new connections are reset; the next start is quiet.
            self.assertEqual(fwd.stop(), 0)
            self.assertFalse(os.path.exists(sock))
            self.assertFalse(os.path.exists(os.path.join(rig.topo.path("state"), "pid")))
            r = rig.client(0, get("http://%s/stopped" % ORIGIN), timeout=3)[0]
            self.assertEqual(r.get("error"), "ECONNREFUSED", r)
            fwd = rig.start_forwarder(name="clean")
            self.assertNotIn("without a clean shutdown", fwd.log())

            # One forwarder per state_dir (an flock): a second is refused,
            # naming the first...
            t = rig.topo
            second = t.start_forwarder(t.forwarder_config(rig.key_file), name="second", wait=False)
            self.assertEqual(second.p.wait(timeout=10), 3)
            self.assertIn("another fy-forwarder (pid %d) is running with state_dir" % fwd.pid,
                          second.log())
            self.assertTrue(t.control("status").startswith("ok "))
            # ...while a pid file naming some other live process that happens
            # to be called fy-forwarder (a reused pid: the probe, the hook) does
            # not stop a start after a crash.
            self.assertEqual(fwd.stop(), 0)
            impostor_exe = t.path("fy-forwarder")
            os.symlink(shutil.which("sleep"), impostor_exe)
            impostor = subprocess.Popen([impostor_exe, "60"])
            try:
                def comm():
                    with open("/proc/%d/comm" % impostor.pid) as f:
                        return f.read().strip()
                deadline = time.monotonic() + 5
                while comm() != "fy-forwarder" and time.monotonic() < deadline:
                    time.sleep(0.01)  # until the exec
                self.assertEqual(comm(), "fy-forwarder")
                with open(os.path.join(t.path("state"), "pid"), "w") as f:
                    f.write("%d\n" % impostor.pid)
                fwd = rig.start_forwarder(name="after-impostor")
                self.assertIn("stopped without a clean shutdown", fwd.log())
                res = rig.client(0, get("http://%s/after-impostor" % ORIGIN))[0]
                self.assertEqual(res["status"], 200, res)
            finally:
                impostor.kill()
                impostor.wait()

    def test_the_control_socket_survives_what_any_vm_user_can_send(self):
        # The socket is 0666. A line, then more bytes and a hang-up while the
        # answer is in flight, used to close the pipe twice (libuv aborts).
        # A peer that sends nothing is closed after 2 s instead of holding a
        # descriptor; an overlong line is closed; an unknown command is named.
        with Rig("fcctl", containers=(("podman1", 1),)) as rig:
            t = rig.topo
            sock = os.path.join(t.path("state"), "control.sock")

            def send(data, shut=True):
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(5)
                s.connect(sock)
                s.sendall(data)
                if shut:
                    s.shutdown(socket.SHUT_WR)
                out = b""
                try:
                    while chunk := s.recv(65536):
                        out += chunk
                except (ConnectionResetError, BrokenPipeError):
                    pass
                s.close()
                return out

            for extra in (505, 512, 4096, 65536):
                for cmd in (b"status\n", b"stats\n", b"ready\n"):
                    out = send(cmd + b"\0" * extra)
                    self.assertTrue(out.endswith(b"\n"), (cmd, extra, out[:200]))
            self.assertEqual(send(b"x" * 300), b"")  # no line, too long: closed
            self.assertTrue(send(b"frobnicate\n").startswith(b"error unknown command"))
            idle = socket.socket(socket.AF_UNIX)
            idle.settimeout(10)
            idle.connect(sock)
            t0 = time.monotonic()
            self.assertEqual(idle.recv(1), b"")
            waited = time.monotonic() - t0
            idle.close()
            self.assertGreater(waited, 1.5)
            self.assertLess(waited, 6)
            self.assertTrue(rig.fwd.alive(), rig.fwd.log()[-2000:])
            self.assertTrue(t.control("status").startswith("ok "))
            r = rig.client(0, get("http://%s/after-control" % ORIGIN))[0]
            self.assertEqual(r.get("status"), 200, r)

    def test_a_wedged_worker_fails_the_probe_and_the_watchdog(self):
        # Worker 1's thread alone is stopped (ptrace stops one thread; the main
        # loop, which answers the probe, runs on). Its share of new
        # connections would wait in its backlog: the status line must fail
        # within the stall bound, and say ok again once it runs.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH = 0x4206, 0x4207, 17
        with Rig("fcwdg", containers=(("podman1", 1),), forwarder=False) as rig:
            t = rig.topo
            # systemd's side of the watchdog: a datagram socket for sd_notify.
            notify_path = t.path("notify.sock")
            notes = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            notes.bind(notify_path)
            notes.setblocking(False)

            def pings():
                n = 0
                while True:
                    try:
                        n += notes.recv(4096).count(b"WATCHDOG=1")
                    except BlockingIOError:
                        return n
            rig.fwd = t.start_forwarder(
                t.forwarder_config(rig.key_file, workers=2), name="wdg",
                env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "1000000"})  # ping each 0.5 s
            pid = rig.fwd.pid
            time.sleep(1.2)
            self.assertGreaterEqual(pings(), 1, "no watchdog pings while healthy")
            sock = os.path.join(t.path("state"), "control.sock")
            tids = {}
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    tids[f.read().strip()] = int(tid)
            self.assertIn("fy-fwd-w1", tids, tids)
            self.assertEqual(probe(sock).returncode, 0)
            tid = tids["fy-fwd-w1"]
            self.assertEqual(libc.ptrace(PTRACE_SEIZE, tid, None, None), 0, ctypes.get_errno())
            try:
                self.assertEqual(libc.ptrace(PTRACE_INTERRUPT, tid, None, None), 0)
                os.waitpid(tid, 0x40000000)  # __WALL: the thread is stopped
                t0 = time.monotonic()
                status = ""
                while time.monotonic() - t0 < 10:
                    status = t.control("status")
                    if status.startswith("fail "):
                        break
                    time.sleep(0.2)
                waited = time.monotonic() - t0
                self.assertTrue(status.startswith("fail worker 1 has not turned its loop for "),
                                status)
                self.assertIn("(its connections stall)", status)
                self.assertGreater(waited, 3.5)
                p = probe(sock)
                self.assertEqual(p.returncode, 1, p.stdout)
                pings()
                time.sleep(1.5)
                self.assertEqual(pings(), 0, "the watchdog was pinged with a worker wedged")
                self.assertIn("withholding the watchdog ping", rig.fwd.log())
            finally:
                libc.ptrace(PTRACE_DETACH, tid, None, None)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not t.control("status").startswith("ok "):
                time.sleep(0.1)
            self.assertTrue(t.control("status").startswith("ok "))
            pings()
            time.sleep(1.2)
            self.assertGreaterEqual(pings(), 1, "no watchdog pings once it runs again")
            notes.close()
            for _ in range(6):  # whichever worker each lands on
                res = rig.client(0, get("http://%s/after-wedge" % ORIGIN))[0]
                self.assertEqual(res["status"], 200, res)

    def test_example_config_and_hook_json_are_valid(self):
        example = os.path.join(source_dir(), "forwarder", "exe", "forwarder.example.toml")
        r = subprocess.run([FORWARDER, "--check-config", "--config", example],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run([FORWARDER, "--check-config", "--config", "/nonexistent/fyf.toml"],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot be read", r.stderr)
        import json
        with open(os.path.join(source_dir(), "forwarder", "exe", "fy-forwarder-hook.json")) as f:
            spec = json.load(f)
        self.assertEqual(spec["stages"], ["prestart"])
        self.assertEqual(spec["hook"]["path"], "/usr/libexec/fy/fy-forwarder-hook")
        self.assertGreater(spec["hook"]["timeout"], 5)  # longer than the hook's own bound

    def test_a_namespace_it_cannot_see_is_not_taken_for_none(self):
        with Rig("fcnf", containers=(("podman1", 1),), forwarder=False) as rig:
            t = rig.topo
            d = t.path("netns-dir")
            os.makedirs(d)
            path = os.path.join(d, "rootless-netns")
            cfg = t.forwarder_config(rig.key_file).replace(
                'netns = "/run/netns/%s"' % t.rl, 'netns = "%s"' % path)
            rig.fwd = t.start_forwarder(cfg)
            sock = os.path.join(t.path("state"), "control.sock")
            # Nothing there yet: serving (the VM side, image pulls, may need it
            # before any bridge container exists), but the bridge side says it has
            # never found its namespace, and --require-bridge fails.
            self.assertIn("bridge=absent:never-found", t.control("status"))
            p = probe(sock)
            self.assertEqual(p.returncode, 0, p.stdout)
            p = probe(sock, "--require-bridge")
            self.assertEqual(p.returncode, 1, p.stdout)
            self.assertTrue(p.stdout.startswith(
                "fail the bridge listener serves no namespace (bridge=absent:never-found)"),
                p.stdout)
            self.assertIn("ProtectHome", p.stdout)
            self.assertEqual(hook(sock).returncode, 0)  # no namespace anywhere: nothing to wait for
            # The namespace exists where the hook looks (a mount only the runtime's
            # mount namespace has) and not where the forwarder looks.
            open(path, "w").close()
            mount = "mount --bind /run/netns/%s %s" % (t.rl, path)
            h = hook(sock, wrap=mount)
            self.assertEqual(h.returncode, 1, h.stderr)
            self.assertIn("sees network namespace %d at %s" % (os.stat("/run/netns/" + t.rl).st_ino,
                                                               path), h.stderr)
            self.assertIn("The forwarder cannot see the namespace the container uses", h.stderr)
            self.assertIn("ProtectHome=yes hides /run/user", h.stderr)
            # Once the forwarder sees it too (a mount in its own mount namespace), it
            # serves it, and the probe, the strict probe and the hook agree.
            subprocess.run(["mount", "--bind", "/run/netns/" + t.rl, path], check=True, timeout=10)
            try:
                t.wait_status(rig.fwd, lambda s: "bridge=listening" in s, timeout=5)
                self.assertEqual(probe(sock, "--require-bridge").returncode, 0)
                h = hook(sock, wrap="true")
                self.assertEqual(h.returncode, 0, h.stderr)
                res = rig.client(0, get("http://%s/seen" % ORIGIN))[0]
                self.assertEqual(res.get("status"), 200, res)
            finally:
                subprocess.run(["umount", path], timeout=10)
            # Torn down: absent, holding the old namespace, no longer never-found.
            st = t.wait_status(rig.fwd, lambda s: "bridge=absent:holding=" in s, timeout=5)
            self.assertTrue(st.startswith("ok "), st)

    def sandboxed(self, rig, protect_home):
        """Starts the forwarder the way systemd runs it with ProtectHome=`protect_home`
        (systemd.exec(5)): in a mount namespace of its own, a slave of this one,
        where a stand-in for /run/user is made read-only (read-only) or covered by
        an empty inaccessible directory (yes). Returns (forwarder, the path it
        follows, which podman would mount later, under the stand-in)."""
        t = rig.topo
        run_user = t.path("run-user")
        os.makedirs(os.path.join(run_user, "1000", "netns"))
        # The stand-in is a mount point of its own that propagates, as /run/user is.
        subprocess.run(["mount", "--bind", run_user, run_user], check=True, timeout=10)
        self.addCleanup(subprocess.run, ["umount", "-R", "-l", run_user], timeout=10)
        subprocess.run(["mount", "--make-shared", run_user], check=True, timeout=10)
        path = os.path.join(run_user, "1000", "netns", "rootless-netns")
        cfg = t.path("sandboxed.toml")
        with open(cfg, "w") as f:
            f.write(t.forwarder_config(rig.key_file).replace(
                'netns = "/run/netns/%s"' % t.rl, 'netns = "%s"' % path))
        prep = {"read-only": "mount --bind {d} {d} && mount -o remount,bind,ro {d}",
                "yes": "mount -t tmpfs -o ro,mode=000 fyf-inaccessible {d}",
                "no": "true"}[protect_home].format(d=run_user)
        fwd = t.start(t.vm, ["unshare", "-m", "--propagation", "slave", "sh", "-c",
                             prep + " && exec %s --config %s" % (FORWARDER, cfg)],
                      "sandboxed-" + protect_home)
        rig.fwd = fwd
        t.wait_status(fwd, lambda s: s.startswith("ok "), timeout=10)
        return fwd, path

    def podman_makes_the_namespace(self, rig, path):
        open(path, "w").close()
        subprocess.run(["mount", "--bind", "/run/netns/" + rig.topo.rl, path], check=True,
                       timeout=10)  # removed with the stand-in's umount -R

    def test_the_units_protecthome_leaves_the_namespace_visible(self):
        value = unit_protect_home()
        self.assertIn(value, ("read-only", "no", "false"),
                      "ProtectHome=%s hides /run/user, where the namespace lives" % value)
        with Rig("fcph", containers=(("podman1", 1),), forwarder=False) as rig:
            fwd, path = self.sandboxed(rig, "no" if value == "false" else value)
            sock = os.path.join(rig.topo.path("state"), "control.sock")
            self.assertIn("bridge=absent:never-found", rig.topo.control("status"))
            self.podman_makes_the_namespace(rig, path)
            rig.topo.wait_status(fwd, lambda s: "bridge=listening" in s, timeout=5)
            self.assertEqual(probe(sock, "--require-bridge").returncode, 0)
            self.assertEqual(hook(sock).returncode, 0)
            res = rig.client(0, get("http://%s/sandboxed" % ORIGIN))[0]
            self.assertEqual(res.get("status"), 200, res)

    def test_protecthome_yes_would_hide_it_and_the_probe_and_hook_say_so(self):
        with Rig("fcpy", containers=(("podman1", 1),), forwarder=False) as rig:
            fwd, path = self.sandboxed(rig, "yes")
            sock = os.path.join(rig.topo.path("state"), "control.sock")
            self.podman_makes_the_namespace(rig, path)
            time.sleep(0.6)  # more than two polls
            status = rig.topo.control("status")
            self.assertIn("bridge=absent:never-found", status)
            self.assertEqual(probe(sock).returncode, 0)  # what it can see, it serves
            p = probe(sock, "--require-bridge")
            self.assertEqual(p.returncode, 1, p.stdout)
            h = hook(sock)
            self.assertEqual(h.returncode, 1, h.stderr)
            self.assertIn("The forwarder cannot see the namespace", h.stderr)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
    def test_systemd_unit_is_valid(self):
        unit = UNIT
        with open(unit) as f:
            text = f.read()
        self.assertIn("Restart=always", text)
        self.assertIn("StartLimitIntervalSec=0", text)
        self.assertIn("Type=notify", text)
        self.assertIn("WatchdogSec=", text)
        tmp = "/tmp/fyf-unit-%d" % os.getpid()
        os.makedirs(tmp, exist_ok=True)
        try:
            copy = os.path.join(tmp, "fy-forwarder.service")
            with open(copy, "w") as f:
                f.write(text.replace("/usr/libexec/fy/fy-forwarder", FORWARDER))
            r = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True,
                               text=True, timeout=60)
            problems = [l for l in (r.stdout + r.stderr).splitlines()
                        if "fy-forwarder.service" in l]
            self.assertEqual(problems, [], r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)

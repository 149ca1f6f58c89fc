#!/usr/bin/python3
"""fy-machine's lifecycle against recording stand-ins for limactl and podman
(tests/standin/, first on PATH: neither a lima VM nor a podman machine can run
here). The stand-ins record every argv and play scripted states; the guest's
sshd is a real one on loopback, so the host-key pin is checked against real
ssh-keyscan answers."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
BIN = os.environ.get("FY_MACHINE_BIN", "")
ASSETS = os.environ.get("FY_MACHINE_ASSETS", os.path.join(HERE, "..", "..", ".."))
WANT = "wall on 41000-41089, 41100-41189"


class Sshd:
    """A real sshd on 127.0.0.1 with a host key of its own (the guest's). The
    test holds the listening socket (bound to port 0, open until close(), so no
    other process can take the port between a pick and sshd's bind) and hands
    each connection it accepts to `sshd -i` (inetd mode), which reads its
    config and host key anew per connection. While stopped, a connection is
    closed at once."""

    def __init__(self, root):
        self.root = root
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.cfg = None
        self.children = []
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.new_key()

    def _serve(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                if self.cfg:
                    self.children.append(subprocess.Popen(
                        ["/usr/sbin/sshd", "-i", "-e", "-f", self.cfg], stdin=conn.fileno(),
                        stdout=conn.fileno(), stderr=subprocess.DEVNULL))
            conn.close()

    def new_key(self):
        key = os.path.join(self.root, "host_ed25519")
        for f in (key, key + ".pub"):
            if os.path.exists(f):
                os.unlink(f)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        self.key = key

    def start(self):
        cfg = os.path.join(self.root, "sshd_config")
        with open(cfg, "w") as f:
            f.write("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nPidFile %s/sshd.pid\n"
                    "UsePAM no\nStrictModes no\nPasswordAuthentication no\n"
                    % (self.port, self.key, self.root))
        os.makedirs("/run/sshd", exist_ok=True)
        with self.lock:
            self.cfg = cfg
        for _ in range(100):
            r = subprocess.run(["ssh-keyscan", "-T", "1", "-p", str(self.port), "127.0.0.1"],
                               capture_output=True, text=True)
            if "ssh-ed25519" in r.stdout:
                return
            time.sleep(0.05)
        raise RuntimeError("sshd did not come up")

    def stop(self):
        with self.lock:
            self.cfg = None
            children, self.children = self.children, []
        for p in children:
            if p.poll() is None:
                p.terminate()
            p.wait(5)

    def close(self):
        self.stop()
        self.closed = True
        self.thread.join(5)
        self.sock.close()


@unittest.skipUnless(os.access(BIN, os.X_OK), "FY_MACHINE_BIN is not built")
class Lifecycle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("sshd", path="/usr/sbin:/usr/bin") or not shutil.which("ssh-keyscan"):
            raise unittest.SkipTest("openssh-server/openssh-client missing")
        cls.sshroot = tempfile.mkdtemp(prefix="fym-sshd-%d-" % os.getpid())
        cls.sshd = Sshd(cls.sshroot)
        cls.sshd.start()

    @classmethod
    def tearDownClass(cls):
        cls.sshd.close()
        shutil.rmtree(cls.sshroot, ignore_errors=True)

    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="fym-%d-" % os.getpid())
        self.repo = os.path.join(self.d, "app")
        os.makedirs(self.repo)
        self.lima = {"vmTypes": ["qemu", "vz"], "instances": {},
                     "create_as": {"ssh_port": self.sshd.port, "user": "root"}}
        self.save_lima()

    def tearDown(self):
        # End every process the stand-ins started (their pids are in the state).
        for p in self.stand_in_pids():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.d, ignore_errors=True)

    def stand_in_pids(self):
        pids = []
        for root, _, files in os.walk(os.path.join(self.d, "lima")):
            for f in files:
                if f.endswith(".pid"):
                    try:
                        pids.append(int(open(os.path.join(root, f)).read()))
                    except ValueError:
                        pass
        try:
            for m in json.load(open(os.path.join(self.d, "podman.json")))["machines"].values():
                if m.get("pid"):
                    pids.append(m["pid"])
        except FileNotFoundError:
            pass
        return pids + getattr(self, "extra_pids", [])

    # ---- helpers ----
    def save_lima(self):
        json.dump(self.lima, open(os.path.join(self.d, "lima.json"), "w"))

    def load_lima(self):
        self.lima = json.load(open(os.path.join(self.d, "lima.json")))
        return self.lima

    def fy(self, *args, path=None, **env):
        e = {"PATH": path or (STANDIN + ":/usr/bin:/bin:/usr/sbin"),
             "HOME": self.d, "STANDIN_DIR": self.d, "LIMA_HOME": os.path.join(self.d, "lima"),
             "FY_MACHINE_STATE_DIR": os.path.join(self.d, "state"),
             "FY_MACHINE_ASSETS": ASSETS, "FY_MACHINE_TIME_SCALE": "0.02"}
        e.update(env)
        r = subprocess.run([BIN] + list(args) + ["--repo", self.repo], env=e,
                           capture_output=True, text=True, timeout=120)
        self.last = r
        return r

    def calls(self):
        try:
            with open(os.path.join(self.d, "calls.log")) as f:
                return [json.loads(l) for l in f]
        except FileNotFoundError:
            return []

    def clear_calls(self):
        open(os.path.join(self.d, "calls.log"), "w").close()

    def verbs(self):
        return [c[:3] if c[0] == "podman" else c[:2] for c in self.calls()]

    def ok(self, r):
        self.assertEqual(r.returncode, 0, "rc %d\n%s" % (r.returncode, r.stderr))

    # ---- lima ----
    def test_create_argv_set_expression_and_ready(self):
        r = self.fy("ensure", MACHINE_CPUS="3", MACHINE_MEMORY="4001", MACHINE_DISK="70")
        self.ok(r)
        create = [c for c in self.calls() if c[:2] == ["limactl", "create"]]
        wt = self.repo + ".worktrees"
        self.assertEqual(create, [[
            "limactl", "create", "--tty=false", "--name", "app", "template://podman", "--set",
            '.cpus = 3 | .memory = "4001MiB" | .disk = "70GiB" | .mounts = ['
            '{"location": "%s", "mountPoint": "%s", "writable": true}, '
            '{"location": "%s", "mountPoint": "%s", "writable": true}] | .vmType = "vz"'
            % (self.repo, self.repo, wt, wt)]])
        self.assertIn("▶ hypervisor (vmType): vz", r.stderr)
        self.assertTrue(os.path.isdir(wt))
        # Provisioning recorded on the stopped VM, before the start.
        v = self.verbs()
        self.assertLess(v.index(["limactl", "edit"]), v.index(["limactl", "start"]))
        edit = [c for c in self.calls() if c[:2] == ["limactl", "edit"]][0]
        self.assertEqual(edit[:5], ["limactl", "edit", "--tty=false", "app", "--set"])
        self.assertTrue(edit[5].startswith('.provision = ([ (.provision // [])[] | select((.script'
                                           ' // "") | test("# fy-provision ") | not) ] + [{"mode":'
                                           ' "system", "script": "#!/bin/bash\\n# fy-provision '))
        self.assertIn("✓ 'app' (lima) is ready: unix://%s/lima/app/sock/podman.sock" % self.d,
                      r.stderr)
        # The guest was checked: state file, each unit, the masked rootful socket.
        shell = [" ".join(c[c.index("--") + 1:]) for c in self.calls() if c[1] == "shell"]
        self.assertEqual(shell, ["cat /run/fy-wall/state", "systemctl is-active fy-dnsfwd.service",
                                 "systemctl is-active fy-wall.service",
                                 "systemctl is-active fy-forwarder-guard.service",
                                 "systemctl is-active fy-forwarder.service",
                                 "systemctl is-enabled podman.socket"])
        # A second ensure on a ready VM changes nothing.
        self.clear_calls()
        self.ok(self.fy("ensure"))
        self.assertFalse([c for c in self.calls() if c[1] in ("create", "edit", "start", "stop")])

    def test_mib_rule_never_rounds_to_gib(self):
        self.lima["vmTypes"] = []
        self.save_lima()
        self.ok(self.fy("ensure", MACHINE_MEMORY="3.91GiB"))
        expr = [c for c in self.calls() if c[1] == "create"][0][-1]
        self.assertIn('.memory = "8192MiB"', expr)
        self.assertNotIn("vmType", expr)  # none resolved: lima's own default
        self.assertNotIn("3.91", expr)

    def test_stale_provisioning_refused_on_running_rerecorded_on_stopped(self):
        self.ok(self.fy("ensure"))
        self.clear_calls()
        # The port band changed: the provision id with it.
        r = self.fy("ensure", FY_PORT_BASE="41200")
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ 'app' is running with STALE boot provisioning", r.stderr)
        self.assertIn("fy-machine stop && fy-machine ensure", r.stderr)
        self.assertIn("fy machine stop && fy up", r.stderr)
        self.assertFalse([c for c in self.calls() if c[1] in ("edit", "start", "stop")])
        r = self.fy("status", FY_PORT_BASE="41200")
        self.assertIn("STALE", r.stderr)
        self.ok(self.fy("stop"))
        self.clear_calls()
        self.lima = self.load_lima()
        self.lima["want"] = "wall on 41200-41289, 41300-41389"
        self.save_lima()
        self.ok(self.fy("ensure", FY_PORT_BASE="41200"))
        v = self.verbs()
        self.assertLess(v.index(["limactl", "edit"]), v.index(["limactl", "start"]))

    def test_revive_running_but_dead_socket(self):
        self.ok(self.fy("ensure"))
        inst = os.path.join(self.d, "lima", "app")
        drv = int(open(os.path.join(inst, "qemu.pid")).read())
        os.kill(drv, signal.SIGKILL)  # the forward's engine dies; its socket file stays
        time.sleep(0.1)
        self.assertTrue(os.path.exists(os.path.join(inst, "sock", "podman.sock")))
        r = self.fy("status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is running but its socket is dead: a dead socket file", r.stderr)
        self.assertIn("run: fy-machine ensure", r.stderr)
        self.clear_calls()
        r = self.fy("ensure")
        self.ok(r)
        self.assertIn("is running but its socket is dead", r.stderr)
        v = [c for c in self.calls() if c[1] in ("stop", "start")]
        self.assertEqual(v, [["limactl", "stop", "app"], ["limactl", "start", "app"]])
        self.assertEqual(self.load_lima()["instances"]["app"]["starts"], 2)

    def test_revive_fails_loudly_when_the_socket_stays_dead(self):
        self.ok(self.fy("ensure"))
        self.lima = self.load_lima()
        self.lima["instances"]["app"]["socket_after_start"] = "wedged"
        self.save_lima()
        os.kill(int(open(os.path.join(self.d, "lima", "app", "qemu.pid")).read()), signal.SIGKILL)
        r = self.fy("ensure")
        self.assertEqual(r.returncode, 1)
        self.assertIn("was restarted but its socket is still dead: the socket accepts but never "
                      "answers", r.stderr)

    def test_broken_is_force_stopped_before_start(self):
        self.ok(self.fy("ensure"))
        self.ok(self.fy("stop"))
        self.lima = self.load_lima()
        self.lima["instances"]["app"]["status"] = "Broken"
        self.save_lima()
        self.clear_calls()
        r = self.fy("ensure")
        self.ok(r)
        v = [c for c in self.calls() if c[1] in ("stop", "start")]
        self.assertEqual(v, [["limactl", "stop", "--force", "app"], ["limactl", "start", "app"]])
        self.assertIn("is Broken", r.stderr)

    def test_orphaned_host_agent_is_reaped_before_start(self):
        self.ok(self.fy("ensure"))
        self.ok(self.fy("stop"))
        inst = os.path.join(self.d, "lima", "app")
        ha = subprocess.Popen(["sleep", "600"])
        self.extra_pids = [ha.pid]
        open(os.path.join(inst, "ha.pid"), "w").write("%d\n" % ha.pid)
        r = self.fy("ensure")
        self.ok(r)
        self.assertIn("orphaned host agent (pid %d" % ha.pid, r.stderr)
        self.assertIsNotNone(ha.poll(), "the orphaned host agent is still alive")

    def test_stop_graceful_then_forced(self):
        self.ok(self.fy("ensure"))
        self.lima = self.load_lima()
        self.lima["instances"]["app"]["stop_hangs"] = True
        self.save_lima()
        self.clear_calls()
        r = self.fy("stop")
        self.ok(r)
        self.assertEqual([c for c in self.calls() if c[1] == "stop"],
                         [["limactl", "stop", "app"], ["limactl", "stop", "--force", "app"]])
        r = self.fy("status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ 'app' is stopped — run: fy-machine ensure", r.stderr)

    def test_guest_that_did_not_apply_is_refused(self):
        self.lima["create_as"]["guest"] = {"systemctl is-active fy-forwarder.service": "failed"}
        self.save_lima()
        r = self.fy("ensure")
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ 'app' did not apply its boot provisioning:", r.stderr)
        self.assertIn("fy-forwarder.service is failed", r.stderr)
        self.assertIn("cat /run/fy-wall/boot.log", r.stderr)
        self.lima = self.load_lima()
        self.lima["instances"]["app"]["guest"] = {"cat /run/fy-wall/state": ""}
        self.save_lima()
        r = self.fy("ensure")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no /run/fy-wall/state", r.stderr)

    def test_host_key_pinned_then_a_changed_key_refused(self):
        self.ok(self.fy("ensure"))
        r = self.fy("ssh-target", "--json")
        self.ok(r)
        t = json.loads(r.stdout)
        self.assertEqual(t["host"], "fy-app")
        self.assertEqual(t["user"], "root")
        self.assertEqual(t["port"], self.sshd.port)
        kh = open(t["known_hosts"]).read()
        self.assertTrue(kh.startswith("fy-app ssh-ed25519 "), kh)
        self.assertIn("StrictHostKeyChecking yes", open(t["config"]).read())
        # The pinned config is one real ssh accepts, and it verifies the key.
        v = subprocess.run(["ssh", "-G", "-F", t["config"], "fy-app"], capture_output=True, text=True)
        self.assertIn("stricthostkeychecking true", v.stdout)
        # The guest now answers with another key: refused, pin untouched.
        self.sshd.stop()
        self.sshd.new_key()
        self.sshd.start()
        try:
            r = self.fy("ssh-target", "--json")
            self.assertEqual(r.returncode, 1)
            self.assertIn("ssh host key CHANGED since it was pinned", r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertEqual(open(t["known_hosts"]).read(), kh)
            r = self.fy("ensure")
            self.assertEqual(r.returncode, 1)
            self.assertIn("CHANGED", r.stderr)
            # rm drops the pin with the VM.
            self.ok(self.fy("rm"))
            self.assertFalse(os.path.exists(t["known_hosts"]))
        finally:
            pass

    # ---- selection and missing CLIs ----
    def test_retired_native_and_unknown_names_fall_back_to_podman(self):
        for cmd in ("status", "socket", "stop"):
            r = self.fy(cmd, MACHINE_BACKEND="native")
            self.assertIn("⚠ MACHINE_BACKEND = 'native' is RETIRED (ADR-0027)", r.stderr, cmd)
        self.assertTrue(all(c[0] == "podman" for c in self.calls()), self.calls())
        self.assertTrue(self.calls())
        open(os.path.join(self.repo, "foldyard.toml"), "w").write('[machine]\nbackend = "Qemu2"\n')
        self.clear_calls()
        r = self.fy("status", "--config", os.path.join(self.repo, "foldyard.toml"))
        self.assertIn("⚠ unknown [machine].backend 'Qemu2' — falling back to podman", r.stderr)
        self.assertIn("backend: podman (from [machine].backend), named 'qemu2'", r.stderr)
        self.assertTrue(all(c[0] == "podman" for c in self.calls()))

    def test_missing_cli_messages(self):
        r = self.fy("ensure", path="/usr/bin:/bin")  # no limactl, real podman present
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ `limactl` isn't installed, and 'lima' is foldyard's DEFAULT "
                      "[machine].backend — so there is no VM to target. Refusing to fall back to "
                      "this host's own podman socket", r.stderr)
        self.assertIn('[machine] backend = "podman"', r.stderr)
        self.assertNotIn("native", r.stderr)
        self.assertEqual(self.calls(), [])
        r = self.fy("ensure", path="/usr/bin:/bin", MACHINE_BACKEND="lima")
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ [machine].backend = 'lima' but 'limactl' isn't installed.\n  Install it "
                      "(https://lima-vm.io — `brew install lima` on macOS) or name a different "
                      "[machine].backend.", r.stderr)

    # ---- podman machine ----
    def podman_state(self, machines):
        json.dump({"machines": machines}, open(os.path.join(self.d, "podman.json"), "w"))

    def test_podman_one_vm_policy(self):
        self.podman_state({"other": {"state": "running"}})
        r = self.fy("ensure", MACHINE_BACKEND="podman")
        self.assertEqual(r.returncode, 1)
        self.assertIn("✗ podman machine 'other' is already running, and macOS runs only ONE", r.stderr)
        self.assertIn("podman machine stop other", r.stderr)
        self.assertIn('backend = "lima"', r.stderr)
        init = [c for c in self.calls() if c[2] == "init"]
        wt = self.repo + ".worktrees"
        self.assertEqual(init, [["podman", "machine", "init", "app", "--cpus", "4", "--memory",
                                 "8192", "--disk-size", "60", "--volume",
                                 self.repo + ":" + self.repo, "--volume", wt + ":" + wt]])
        self.assertFalse([c for c in self.calls() if c[2] == "start"])

    def test_podman_stuck_starting_is_recovered(self):
        self.podman_state({"app": {"state": "starting", "user": "root", "port": self.sshd.port}})
        json.dump({"Mounts": [{"Target": self.repo}, {"Target": self.repo + ".worktrees"}]},
                  open(os.path.join(self.d, "app.json"), "w"))
        r = self.fy("status", MACHINE_BACKEND="podman")
        self.assertIn("a stuck start", r.stderr)
        self.clear_calls()
        r = self.fy("ensure", MACHINE_BACKEND="podman")
        self.ok(r)
        self.assertIn("says Starting but no VM process is alive", r.stderr)
        v = [c for c in self.calls() if c[2] in ("stop", "start")]
        self.assertEqual(v, [["podman", "machine", "stop", "app"], ["podman", "machine", "start", "app"]])
        self.assertIn("cannot be provisioned with the in-VM wall", r.stderr)
        r = self.fy("socket", MACHINE_BACKEND="podman")
        self.assertEqual(r.stdout.strip(), "unix://%s/podman-app-api.sock" % self.d)


if __name__ == "__main__":
    unittest.main(verbosity=2)

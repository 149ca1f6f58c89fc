#!/usr/bin/env python3
"""Who used each host, end to end with the real parts: a real podman API
service (podman system service, in the topology's VM namespace, in a private
mount namespace with a pure cgroup2 mount), real containers on its default
bridge, the real fy-forwarder stamping them (as tests/forwarder/test_podman.py
sets it up), the real fy-proxy writing the Network Log with the stamp key, the
real fy-engine-watch following the API socket, and fy-netlog naming them.

It proves:
  - two containers on one bridge make requests, and the log names each (one by
    its name, one as its compose service); the refusal names who asked;
  - a container is removed and its address is taken by a new one: the first
    container's rows still name it, the new rows name the second;
  - the watcher is killed (SIGKILL) mid-run and restarted: every snapshot from
    before is still there, the container that ran through the gap resolves,
    and the one that came and went inside it says why it cannot;
  - with fy-forwarder-hook recording each start (the OCI prestart hook, run
    by the API service's runtime), a container that makes its request and is
    gone within milliseconds is named: once while the watcher is frozen
    (SIGSTOP), so no list can have seen it running, and twice as it comes;
    and a later container on the same address that the hook did not record is
    stamped by address only (the forwarder's record died with the first);
  - the engine restarted under the watcher (the API service stopped by its pid
    and started again): the probe says the engine is unreachable meanwhile,
    the watcher records a re-sync that bounds the gap (gaps=1, no restart of
    its own, nothing before it lost), and a container started after the
    restart is named.

Up to the hook part, the API service runs no hook (its wrapper does nothing
until a marker file exists), so those rows are stamped by address alone and
test the watcher's address timeline.

The API service has a storage, run root and event log of its own (in the
test's directory, the image imported into it), so other containers on this
machine neither show in its lists nor break them (a container of another
podman whose network namespace this service's mount namespace cannot see
makes every list fail with 500). It shares the CNI configuration and the
bridge; every check here is about containers this test named.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "forwarder"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from fyf_topology import GATEWAY, ORIGIN, PROXY_PORT, Topology, build_dir  # noqa: E402

FYTEST = os.path.join(HERE, "..", "lib", "fytest.py")


def have_podman():
    from shutil import which
    return which("podman") is not None


def read_text(path):
    with open(path) as f:
        return f.read()


def read_lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


class EnginePodman(unittest.TestCase):
    def setUp(self):
        if not have_podman():
            self.skipTest("podman is not installed (apt-get install podman crun)")
        from test_podman import IMAGE, default_bridge, ensure_image
        self.image = IMAGE
        ensure_image()
        self.bridge, self.bridge_ip = default_bridge()
        # Static addresses of our own in podman's default 10.88.0.0/16, so that
        # one can be reused on purpose and none collides with a dynamic one.
        base = 20 + os.getpid() % 200
        self.ip = ["10.88.213.%d" % (base + i) for i in range(6)]

    def podman(self, *args, timeout=120, check=True):
        r = subprocess.run(["podman", "--remote", "--url", "unix://" + self.sock] + list(args),
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("podman %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def run_ctr(self, name, ip, script, detach=False, labels=(), linger=True):
        """Runs a container. `linger`: it stays up a second after its script, so
        the watcher, which learns a container's address by listing it after its
        start event, sees it running. A container that starts, sends and is gone
        within one event round trip is the watcher's known blind spot
        (docs/engine-watch.md, "Limits"): its snapshot has no address."""
        self.names.append(name)
        if linger and not detach:
            script = "%s; sleep 1" % script
        argv = ["run", "--name", name, "--ip", ip, "--cgroups=disabled",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000",
                "-e", "http_proxy=http://%s:%d" % (GATEWAY, PROXY_PORT)]
        for l in labels:
            argv += ["--label", l]
        argv += ["-d"] if detach else ["--rm"]
        return self.podman(*(argv + [self.image, "sh", "-c", script]), check=False)

    def snapshots(self):
        return read_lines(self.engine_log)

    def wait_snapshot(self, name, pred, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in self.snapshots():
                if s.get("kind") == "container" and s["claims"].get("name") == name and pred(s):
                    return s
            time.sleep(0.1)
        raise AssertionError("no snapshot of %s as wanted: %s" % (name, self.snapshots()[-5:]))

    def wait_row(self, path, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [r for r in read_lines(self.netlog) if r.get("path") == path]
            if rows:
                return rows[-1]
            time.sleep(0.1)
        raise AssertionError("no Network Log row for %s: %s" % (path, read_lines(self.netlog)[-3:]))

    def netlog_json(self, *args):
        r = subprocess.run([os.path.join(build_dir(), "proxy", "netlog", "fy-netlog")] +
                           list(args) + ["--json", self.netlog], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def start_watcher(self, t, name):
        return self.start_watcher_at(t, name, self.sock, self.state)

    def start_watcher_at(self, t, name, sock, state):
        return t.start_in_host([os.path.join(build_dir(), "proxy", "engine", "fy-engine-watch"),
                                "--socket", sock, "--state-dir", state,
                                "--list-interval-ms", "500", "--log-level", "debug"], name=name)

    def test_the_log_names_each_container(self):
        self.names = []
        with Topology("eng", containers=()) as t:
            try:
                self._run(t)
            finally:
                for n in self.names:
                    self.podman("rm", "-f", "-t", "0", n, check=False, timeout=60)

    def _run(self, t):
        key_file, _ = t.write_key()
        self.state = t.path("state")
        os.makedirs(os.path.join(self.state, "logs"))
        self.netlog = os.path.join(self.state, "logs", "egress.jsonl")
        self.engine_log = os.path.join(self.state, "logs", "engine.jsonl")
        self.sock = t.path("podman.sock")
        policy = t.path("policy.toml")
        with open(policy, "w") as f:
            f.write('mode = "enforce"\nallow = ["%s"]\n' % ORIGIN)
        t.start_in_host(["python3", FYTEST, "origin", "--host", ORIGIN, "--port", "80",
                         "--log", t.path("origin.jsonl")], name="origin")
        proxy = t.start_in_host(
            [os.path.join(build_dir(), "proxy", "fy-proxy"), "--listen",
             "%s:%d" % (GATEWAY, PROXY_PORT), "--admin", "off", "--state-dir",
             t.path("proxy-state"), "--policy", policy, "--netlog", self.netlog,
             "--stamp-key", key_file], name="fy-proxy")
        t.wait_listening(t.host, GATEWAY, PROXY_PORT, proc=proxy)
        t.wait_listening(t.host, ORIGIN, 80)
        # The forwarder's OCI hook, behind a wrapper that runs it only once
        # self.hook_on exists (until then, containers start with no hook).
        hooks = t.path("hooks")
        os.makedirs(hooks)
        self.hook_on = t.path("hook-on")
        wrapper = os.path.join(hooks, "fy-hook-wrapper.sh")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\n[ -e %s ] || exec cat >/dev/null\nexec %s --control %s "
                    "--timeout-ms 5000 2>>%s\n" % (
                        self.hook_on, os.path.join(build_dir(), "forwarder", "fy-forwarder-hook"),
                        os.path.join(t.path("state"), "control.sock"), t.path("hook.stderr")))
        os.chmod(wrapper, 0o755)
        with open(os.path.join(HERE, "..", "..", "forwarder", "exe",
                               "fy-forwarder-hook.json")) as f:
            spec = json.load(f)
        spec["hook"]["path"] = wrapper
        spec["hook"]["args"] = ["fy-hook-wrapper.sh"]
        with open(os.path.join(hooks, "fy-forwarder-hook.json"), "w") as f:
            json.dump(spec, f)
        # The API service, in the VM's namespace, as the machine's notes run
        # podman, on a store of its own with the test image imported into it.
        store = "--root %s --runroot %s --tmpdir %s" % (t.path("store"), t.path("runroot"),
                                                        t.path("podman-tmp"))
        exported = t.path("image.tar")
        subprocess.run(["podman", "save", "-o", exported, self.image], check=True,
                       capture_output=True, timeout=120)
        subprocess.run(["podman"] + store.split() + ["load", "-i", exported], check=True,
                       capture_output=True, timeout=120)

        def start_service(name):
            # unshare and sh exec: the process started is podman's own (its pid is the service's).
            svc = t.start(t.vm, ["unshare", "-m", "--propagation", "private", "sh", "-c",
                                 "umount -l /sys/fs/cgroup; mount -t cgroup2 none /sys/fs/cgroup "
                                 "&& exec podman %s --cgroup-manager=cgroupfs --hooks-dir %s "
                                 "system service --time=0 unix://%s" % (store, hooks, self.sock)],
                          name=name)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if self.podman("version", timeout=30, check=False).returncode == 0:
                    return svc
                self.assertTrue(svc.alive(), svc.log())
                time.sleep(0.2)
            raise AssertionError("the podman API service did not answer: " + svc.log())

        service = start_service("podman-service")
        cfg = t.forwarder_config(key_file).replace(
            'netns = "/run/netns/%s"' % t.rl, 'netns = "/run/netns/%s"' % t.vm).replace(
            'listen = "0.0.0.0"', 'listen = "%s"' % self.bridge_ip)
        t.start_forwarder(cfg)
        watch = self.start_watcher(t, "watch")
        deadline = time.monotonic() + 15
        while not any(s.get("event") == "start" for s in self.snapshots()):
            self.assertLess(time.monotonic(), deadline, watch.log())
            time.sleep(0.1)
        probe = subprocess.run([os.path.join(build_dir(), "proxy", "engine", "fy-engine-watch"),
                                "--probe", "--state-dir", self.state],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(probe.returncode, 0, probe.stdout + probe.stderr)
        self.assertTrue(probe.stdout.startswith("ok "), probe.stdout)
        # A second watcher on the same log is refused, naming why.
        second = subprocess.run([os.path.join(build_dir(), "proxy", "engine", "fy-engine-watch"),
                                 "--socket", self.sock, "--state-dir", self.state],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(second.returncode, 1, second.stderr)
        self.assertIn("another fy-engine-watch is writing", second.stderr)
        # With no engine behind its socket, the probe fails and says so.
        lost = self.start_watcher_at(t, "lost", t.path("no-such.sock"), t.path("lost-state"))
        deadline = time.monotonic() + 10
        while True:
            p = subprocess.run([os.path.join(build_dir(), "proxy", "engine", "fy-engine-watch"),
                                "--probe", "--state-dir", t.path("lost-state")],
                               capture_output=True, text=True, timeout=30)
            if p.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertTrue(p.stdout.startswith("fail engine unreachable: cannot connect"), p.stdout)
        lost.stop()

        tag = t.name
        c1, c2, c3, c4, c5, c6, c7, c8, c9 = (
            "%s-%s" % (tag, n)
            for n in ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine"))
        # Two containers on one bridge; the first is also refused once.
        r = self.run_ctr(c1, self.ip[0], "wget -q -O - http://%s/eng-c1; "
                         "wget -q -O - http://refused.example/eng-c1-refused; true" % ORIGIN)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = self.run_ctr(c2, self.ip[1], "wget -q -O - http://%s/eng-c2" % ORIGIN,
                         labels=("com.docker.compose.project=shop",
                                 "com.docker.compose.service=web"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        row1 = self.wait_row("/eng-c1")
        self.assertEqual(row1["src"], self.ip[0], row1)
        self.assertEqual(row1["net"], self.bridge, row1)
        self.wait_row("/eng-c1-refused")
        self.wait_row("/eng-c2")
        s1 = self.wait_snapshot(c1, lambda s: s["endpoints"])
        self.assertEqual(s1["endpoints"][0]["ip"], self.ip[0])
        self.assertEqual(s1["endpoints"][0]["iface"], self.bridge)
        self.wait_snapshot(c1, lambda s: s["state"] == "removed")
        # c1's address, reused by a new container.
        r = self.run_ctr(c3, self.ip[0], "wget -q -O - http://%s/eng-c3" % ORIGIN)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.wait_row("/eng-c3")
        self.wait_snapshot(c3, lambda s: s["state"] == "removed")
        self.wait_snapshot(c2, lambda s: s["state"] == "removed")

        # The watcher killed mid-run: c5 runs through the gap and asks inside
        # it; c4 comes and goes inside it, on c2's old address.
        r = self.run_ctr(c5, self.ip[2], "sleep 3; wget -q -O - http://%s/eng-c5; sleep 600"
                         % ORIGIN, detach=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.wait_snapshot(c5, lambda s: s["endpoints"])
        watch.kill9()
        before = read_text(self.engine_log)  # all the killed watcher ever wrote
        r = self.run_ctr(c4, self.ip[1], "wget -q -O - http://%s/eng-c4" % ORIGIN)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.wait_row("/eng-c5")
        self.wait_row("/eng-c4")
        watch = self.start_watcher(t, "watch2")
        deadline = time.monotonic() + 15
        while True:
            after = read_text(self.engine_log)
            new = [json.loads(l) for l in after[len(before):].splitlines() if l.strip()]
            if any(s.get("claims", {}).get("name") == c5 for s in new):
                break
            self.assertLess(time.monotonic(), deadline, watch.log())
            time.sleep(0.1)
        self.assertTrue(after.startswith(before), "a snapshot from before the kill was lost")
        self.assertEqual(new[0]["kind"], "watch")
        self.assertEqual(new[0]["event"], "start")  # the re-sync that bounds the gap

        # The hook on: each start is recorded with the forwarder before the
        # container runs. c6 asks and is gone while the watcher is frozen, so
        # the watcher learns of it only after it is removed (the race, made
        # certain); c7 and c8 ask and exit at once, with no sleep.
        open(self.hook_on, "w").close()
        os.kill(watch.pid, signal.SIGSTOP)
        try:
            r = self.run_ctr(c6, self.ip[3], "wget -q -O - http://%s/eng-c6" % ORIGIN,
                             linger=False, labels=("com.docker.compose.project=quick",
                                                   "com.docker.compose.service=job"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            row6 = self.wait_row("/eng-c6")
        finally:
            os.kill(watch.pid, signal.SIGCONT)
        self.assertEqual(row6["src"], self.ip[3], row6)
        self.assertRegex(row6.get("who", ""), r"^container:[0-9a-f]{64}$", row6)
        for name, ip in ((c7, self.ip[4]), (c8, self.ip[5])):
            r = self.run_ctr(name, ip, "wget -q -O - http://%s/eng-%s" % (ORIGIN, name),
                             linger=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.wait_row("/eng-" + name)
        for name in (c6, c7, c8):
            self.wait_snapshot(name, lambda s: s["state"] == "removed")
        # The hook off again: c9 takes c6's address unrecorded, and is stamped
        # by its address only (the forwarder's record of c6 died with it).
        os.unlink(self.hook_on)
        r = self.run_ctr(c9, self.ip[3], "wget -q -O - http://%s/eng-c9" % ORIGIN)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        row9 = self.wait_row("/eng-c9")
        self.assertNotIn("who", row9)
        self.wait_snapshot(c9, lambda s: s["state"] == "removed")

        # fy-netlog names them.
        doc = self.netlog_json("--by", "principal")
        by = {p["principal"]: p for p in doc["principals"]}
        self.assertIn("ctr:" + c1, by, sorted(by))
        self.assertEqual(by["ctr:" + c1]["hosts"], {ORIGIN: 1, "refused.example": 1})
        self.assertEqual(by["ctr:" + c1]["blocked"], 1)
        self.assertEqual(by["ctr:" + c1]["basis"], "engine_claim")
        self.assertEqual(by["svc:shop/web"]["hosts"], {ORIGIN: 1})
        self.assertEqual(by["svc:shop/web"]["claims"]["name"], c2)
        self.assertEqual(by["ctr:" + c3]["hosts"], {ORIGIN: 1})  # not c1's
        self.assertEqual(by["ctr:" + c5]["hosts"], {ORIGIN: 1})  # across the gap
        gap = [p for k, p in by.items() if k == "unresolved %s@%s" % (self.ip[1], self.bridge)]
        self.assertEqual(len(gap), 1, sorted(by))
        self.assertIn("fy-engine-watch was not running", gap[0]["reason"])
        self.assertNotIn("ctr:" + c4, by)  # never seen: not guessed either
        # Gone at once, each named: c6 from the start event's own claims (the
        # container was removed before the watcher could ask), by its id.
        self.assertEqual(by["svc:quick/job"]["hosts"], {ORIGIN: 1}, sorted(by))
        self.assertEqual(by["svc:quick/job"]["claims"]["name"], c6)
        for name in (c7, c8, c9):
            self.assertIn("ctr:" + name, by, sorted(by))
        self.assertEqual(by["ctr:" + c9]["hosts"], {ORIGIN: 1})  # not c6's

        summary = self.netlog_json()
        host = [h for h in summary["hosts"] if h["host"] == ORIGIN][0]
        for who in ("ctr:" + c1, "svc:shop/web", "ctr:" + c3, "ctr:" + c5):
            self.assertEqual(host["principals"].get(who), 1, host)
        # The refusal names who asked, and the grant says so.
        r = subprocess.run([os.path.join(build_dir(), "proxy", "netlog", "fy-netlog"),
                            "refusals", "--width", "200", self.netlog], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [l for l in r.stdout.splitlines() if "refused.example" in l and "block" in l][0]
        self.assertTrue(line.endswith("ctr:" + c1), line)
        self.assertIn("asked by ctr:%s 1x (Wget)" % c1, r.stdout)

        # The engine restarted under the watcher: the API service stopped (by
        # its pid) and started again. c5, the one container still up, goes
        # first: its network namespace lives in the stopped service's private
        # mount namespace, which the new service cannot see (its lists would fail).
        self.podman("rm", "-f", "-t", "0", c5, timeout=60)
        self.wait_snapshot(c5, lambda s: s["state"] == "removed")
        before = read_text(self.engine_log)
        service.stop(timeout=20)  # SIGTERM to its pid (SIGKILL if it does not go)
        self.assertFalse(service.alive())
        deadline = time.monotonic() + 15
        while True:  # the watcher saw the stream end and says the engine is gone
            p = self.probe()
            if p.stdout.startswith("fail engine unreachable") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertTrue(p.stdout.startswith("fail engine unreachable"), p.stdout)
        self.assertIn(" gaps=0 ", p.stdout)
        service = start_service("podman-service2")
        deadline = time.monotonic() + 20
        while True:  # back: a re-sync, from a full list, bounds the gap
            new = [json.loads(l) for l in read_text(self.engine_log)[len(before):].splitlines()
                   if l.strip()]
            if any(s.get("kind") == "watch" and s.get("event") == "resync" for s in new):
                break
            self.assertLess(time.monotonic(), deadline, watch.log())
            time.sleep(0.1)
        self.assertTrue(read_text(self.engine_log).startswith(before))
        self.assertFalse(any(s.get("kind") == "watch" and s.get("event") == "start" for s in new),
                         new)  # the watcher itself did not restart
        p = self.probe()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(" gaps=1 ", p.stdout)
        self.assertIn(" connects=2 ", p.stdout)
        # A container started after the restart is named.
        c10 = "%s-ten" % tag
        r = self.run_ctr(c10, self.ip[2], "wget -q -O - http://%s/eng-c10" % ORIGIN)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.wait_row("/eng-c10")
        self.wait_snapshot(c10, lambda s: s["state"] == "removed")
        doc = self.netlog_json("--by", "principal")
        by = {p["principal"]: p for p in doc["principals"]}
        self.assertEqual(by.get("ctr:" + c10, {}).get("hosts"), {ORIGIN: 1}, sorted(by))
        self.assertEqual(by["ctr:" + c5]["hosts"], {ORIGIN: 1})  # not c10's (same address)
        watch.stop()

    def probe(self):
        return subprocess.run([os.path.join(build_dir(), "proxy", "engine", "fy-engine-watch"),
                               "--probe", "--state-dir", self.state],
                              capture_output=True, text=True, timeout=30)


if __name__ == "__main__":
    if not have_podman():
        # meson counts 77 as a skip; say why.
        print("SKIP: podman is not installed (apt-get install podman crun busybox-static)")
        sys.exit(77)
    unittest.main(verbosity=2)

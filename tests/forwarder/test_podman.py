#!/usr/bin/env python3
"""A real rootful podman container's request arrives at the proxy stamped with
the container's own address, and the real OCI prestart hook gates its start.

podman runs inside the topology's VM namespace (so its bridge, podman0 under
netavark or cni-podman0 under CNI, and the backend's rules live there, not on
this machine), in a private mount namespace with a pure cgroup2 mount
(../shared/machine.md). The forwarder's bridge listener follows that namespace
and binds the bridge's address; the forwarder's own redirect (table ip
fy_forwarder_redirect, here `dnat to <bridge address>` as the listener is bound
to one address) sends the container's gateway:42600 to it, keeping the port.
The container is a local busybox image; busybox wget honours http_proxy.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fyf_base import GATEWAY, HOOK, ORIGIN, PROXY_PORT, Rig  # noqa: E402
from fyf_topology import source_dir  # noqa: E402

IMAGE = "localhost/fyf-bb:1"


def default_bridge():
    """(interface, gateway) of podman's default network: podman0 under netavark,
    cni-podman0 under CNI (which podman 4.3 picks when netavark is absent)."""
    r = subprocess.run(["podman", "network", "inspect", "podman", "--format",
                        "{{.NetworkInterface}} {{range .Subnets}}{{.Gateway}} {{end}}"],
                       capture_output=True, text=True, timeout=60, check=True)
    words = r.stdout.split()
    if len(words) < 2:
        raise AssertionError("podman network inspect said %r" % r.stdout)
    return words[0], words[1]


def ensure_image():
    if subprocess.run(["podman", "image", "exists", IMAGE], timeout=60).returncode == 0:
        return
    busybox = shutil.which("busybox") or "/bin/busybox"
    tmp = tempfile.mkdtemp(prefix="fyf-img-")
    try:
        tar_path = os.path.join(tmp, "rootfs.tar")
        with tarfile.open(tar_path, "w") as tar:
            tar.add(busybox, arcname="bin/busybox")
            for tool in ("sh", "ip", "wget", "cat", "echo", "sleep", "ls"):
                info = tarfile.TarInfo("bin/" + tool)
                info.type = tarfile.SYMTYPE
                info.linkname = "busybox"
                tar.addfile(info)
        with open(tar_path, "rb") as f:
            subprocess.run(["podman", "import", "-", IMAGE], stdin=f, check=True,
                           capture_output=True, timeout=120)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hook_dir(base, name, control, timeout_ms, marker):
    """A hooks.d with fy-forwarder-hook behind a wrapper that records each run."""
    d = os.path.join(base, name)
    os.makedirs(d)
    wrapper = os.path.join(d, "fyf-hook-wrapper.sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\necho ran >> %s\nexec %s --control %s --timeout-ms %d \"$@\" "
                "2>>%s.stderr\n" % (marker, HOOK, control, timeout_ms, marker))
    os.chmod(wrapper, 0o755)
    # The shipped JSON, pointed at the wrapper.
    with open(os.path.join(source_dir(), "forwarder", "exe", "fy-forwarder-hook.json")) as f:
        spec = json.load(f)
    spec["hook"]["path"] = wrapper
    spec["hook"]["args"] = ["fyf-hook-wrapper.sh"]
    with open(os.path.join(d, "fy-forwarder-hook.json"), "w") as f:
        json.dump(spec, f)
    return d


class Podman(unittest.TestCase):
    def podman_run(self, rig, hooks, name, script, timeout=120):
        inner = ("mount -t cgroup2 none /sys/fs/cgroup && "
                 "podman --cgroup-manager=cgroupfs --hooks-dir %s run --rm --name %s "
                 "--cgroups=disabled --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 "
                 "-e http_proxy=http://%s:%d %s sh -c '%s'" % (
                     hooks, name, GATEWAY, PROXY_PORT, IMAGE, script))
        try:
            return subprocess.run(["ip", "netns", "exec", rig.topo.vm, "unshare", "-m",
                                   "--propagation", "private", "sh", "-c", inner],
                                  capture_output=True, text=True, timeout=timeout)
        finally:
            subprocess.run(["ip", "netns", "exec", rig.topo.vm, "unshare", "-m", "--propagation",
                            "private", "sh", "-c",
                            "mount -t cgroup2 none /sys/fs/cgroup && podman rm -f %s" % name],
                           capture_output=True, timeout=60)

    @unittest.skipUnless(shutil.which("podman"), "podman is not installed")
    def test_real_container_is_stamped_with_its_address(self):
        ensure_image()
        bridge, bridge_ip = default_bridge()
        with Rig("pod", containers=(), forwarder=False) as rig:
            t = rig.topo
            cfg = t.forwarder_config(rig.key_file).replace(
                'netns = "/run/netns/%s"' % t.rl, 'netns = "/run/netns/%s"' % t.vm).replace(
                'listen = "0.0.0.0"', 'listen = "%s"' % bridge_ip)
            rig.fwd = t.start_forwarder(cfg)
            sock = os.path.join(t.path("state"), "control.sock")
            marker = t.path("hook-ran")
            hooks = hook_dir(t.dir, "hooks", sock, 5000, marker)

            r = self.podman_run(rig, hooks, t.name + "-c1",
                                "echo host=$(cat /etc/hostname); ip -4 -o addr show eth0; "
                                "wget -q -O - http://%s/podman-1" % ORIGIN)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("origin ok /podman-1", r.stdout)
            ip = r.stdout.split("inet ")[1].split("/")[0]
            self.assertTrue(ip.startswith(bridge_ip.rsplit(".", 2)[0] + "."), r.stdout)
            row = rig.proxy_row_for("http://%s/podman-1" % ORIGIN)
            self.assertEqual(row["stamp_status"], "valid", row)
            self.assertEqual(row["cpp_status"], "valid", row)
            self.assertEqual(row["stamp"]["src"], ip)
            self.assertEqual(row["stamp"]["net"], bridge)
            # The hook recorded the start: the stamp names the container by its
            # id (podman's hostname is the id's first 12 digits).
            short = r.stdout.split("host=")[1].split()[0]
            self.assertRegex(row["stamp"]["who"], r"^container:%s[0-9a-f]{52}$" % short)
            for o in rig.origin_rows():
                self.assertNotIn("Fy-Stamp", o["header_names"])
            with open(marker) as f:
                self.assertEqual(f.read().split(), ["ran"], "the prestart hook did not run once")
            # It went through the forwarder's own redirect, to the bound address.
            table = subprocess.run(["ip", "netns", "exec", t.vm, "nft", "list", "table", "ip",
                                    "fy_forwarder_redirect"], capture_output=True, text=True,
                                   timeout=10)
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("dnat to %s" % bridge_ip, table.stdout)

            # With the forwarder gone, the hook refuses the start, and says why.
            rig.fwd.stop()
            hooks2 = hook_dir(t.dir, "hooks-short", sock, 1000, marker)
            r = self.podman_run(rig, hooks2, t.name + "-c2", "echo started")
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertNotIn("started", r.stdout)
            self.assertIn("error executing hook", r.stderr)
            with open(marker + ".stderr") as f:
                said = f.read()
            self.assertIn("fy-forwarder is not listening", said)
            self.assertIn("The container is not started", said)


if __name__ == "__main__":
    unittest.main(verbosity=2)

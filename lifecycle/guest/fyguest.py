"""Boots the Debian guest that lifecycle/guest/build-image made, under KVM where
/dev/kvm can boot a stock kernel and under qemu's emulator where it cannot, and
drives it over ssh: the qemu backend's engine, for development and CI.

    with Guest.boot(image_dir, share=build_dir, guestfwd={"10.0.2.100:8088": 18088}) as g:
        g.ssh("uname -r")

The guest's network is qemu's user network with restrict=on: it reaches nothing
on the host or beyond except what a `guestfwd` names (a guest address:port
that qemu connects to a host loopback port), and the host reaches it only
through the ssh port forward. The base image is never written: each boot runs
on a qcow2 overlay of its own, removed at the end. `share` is exported read-only
as 9p tag `fybuild`, mounted at /fy in the guest (the host's build, so the
guest runs the binaries under test). Every boot is bounded: a guest that does
not answer ssh within `boot_timeout` is killed and its console's tail raised.
"""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build_image():
    """Returns the cached image folder, building it first if needed (minutes)."""
    p = subprocess.run([os.path.join(HERE, "build-image")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("build-image failed:\n" + p.stderr[-4000:])
    return p.stdout.strip().splitlines()[-1]


def qemu_missing():
    """Why the guest cannot boot here, or None."""
    if not shutil.which("qemu-system-x86_64"):
        return "qemu-system-x86_64 is not installed (Debian qemu-system-x86)"
    return None


def accelerator():
    """("kvm", why) when /dev/kvm is a hardware KVM that boots a stock kernel, else
    ("tcg", why): qemu's own emulator, slower but the same kernel and devices.
    A /dev/kvm served by kvm_pvm (the pagetable-based nested KVM some cloud VMs
    offer, this one included) runs only kernels built as PVM guests: Debian's
    stock kernel hangs in its decompressor under it, so it is not used."""
    if os.path.isdir("/sys/module/kvm_pvm") and not (
            os.path.isdir("/sys/module/kvm_intel") or os.path.isdir("/sys/module/kvm_amd")):
        return "tcg", "/dev/kvm is kvm_pvm (boots only PVM guest kernels, not Debian's stock one)"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as e:
        return "tcg", "no usable /dev/kvm (%s)" % e.strerror
    os.close(fd)
    return "kvm", "hardware KVM"


class Guest:
    def __init__(self, image_dir, work, proc, ssh_port, console):
        self.accel = accelerator()
        self.image_dir = image_dir
        self.work = work
        self.proc = proc
        self.ssh_port = ssh_port
        self.console = console
        self.key = os.path.join(image_dir, "id_ed25519")
        self.known_hosts = os.path.join(work, "known_hosts")
        self.boot_seconds = None
        self._forwards = []

    @classmethod
    def boot(cls, image_dir, share=None, guestfwd=None, memory_mib=1536, cpus=2,
             boot_timeout=None):
        work = tempfile.mkdtemp(prefix="fyguest-%d-" % os.getpid())
        overlay = os.path.join(work, "overlay.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        os.path.join(image_dir, "rootfs.img"), overlay], check=True)
        mon = os.path.join(work, "monitor.sock")
        console = os.path.join(work, "console.log")
        net = "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:0-:22"
        for guest_ep, host_port in (guestfwd or {}).items():
            # cmd: a new relay per guest connection (qemu's tcp: form connects
            # once, at start, and carries a single stream).
            net += ",guestfwd=tcp:%s-cmd:socat - TCP:127.0.0.1:%d" % (guest_ep, host_port)
        accel, _ = accelerator()
        accel_args = (["-enable-kvm", "-cpu", "host"] if accel == "kvm"
                      else ["-accel", "tcg,thread=multi", "-cpu", "max"])
        argv = ["qemu-system-x86_64", *accel_args, "-m", str(memory_mib),
                "-smp", str(cpus), "-display", "none", "-no-reboot",
                "-kernel", os.path.join(image_dir, "vmlinuz"),
                "-initrd", os.path.join(image_dir, "initrd.img"),
                "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=-1 init=/sbin/fy-init quiet",
                "-drive", "file=%s,if=virtio,format=qcow2" % overlay,
                "-netdev", net, "-device", "virtio-net-pci,netdev=n0",
                "-serial", "file:" + console,
                "-monitor", "unix:%s,server,nowait" % mon]
        if share:
            argv += ["-virtfs", "local,path=%s,mount_tag=fybuild,security_model=none,readonly=on"
                     % share]
        if boot_timeout is None:
            boot_timeout = 60.0 if accel == "kvm" else 300.0
        t0 = time.monotonic()
        qlog = open(os.path.join(work, "qemu.log"), "wb")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=qlog,
                                stderr=subprocess.STDOUT)
        qlog.close()
        g = None
        try:
            port = cls._ssh_port(mon, proc, t0 + 10)
            g = cls(image_dir, work, proc, port, console)
            g._wait_ssh(t0 + boot_timeout)
            g.boot_seconds = time.monotonic() - t0
            return g
        except BaseException:
            if g is None:
                g = cls(image_dir, work, proc, 0, console)
            g.close()
            raise

    @staticmethod
    def _ssh_port(mon, proc, deadline):
        """Asks qemu's monitor which host port the ssh forward got (it bound port 0)."""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                with open(os.path.join(os.path.dirname(mon), "qemu.log"), errors="replace") as f:
                    raise RuntimeError("qemu exited at once: %s" % f.read()[-2000:])
            buf = b""
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                try:
                    s.connect(mon)
                    s.sendall(b"info usernet\n")
                    end = time.monotonic() + 2
                    while time.monotonic() < end and not re.search(rb"HOST_FORWARD.*\n", buf):
                        d = s.recv(4096)
                        if not d:
                            break
                        buf += d
                except OSError:
                    time.sleep(0.05)
                    continue
            m = re.search(rb"TCP\[HOST_FORWARD\]\s+\d+\s+127\.0\.0\.1\s+(\d+)", buf)
            if m:
                return int(m.group(1))
            time.sleep(0.1)
        raise RuntimeError("qemu's monitor never named the ssh forward's port")

    def ssh_argv(self, *extra):
        return ["ssh", "-i", self.key, "-p", str(self.ssh_port),
                "-o", "UserKnownHostsFile=" + self.known_hosts,
                "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", *extra, "root@127.0.0.1"]

    def _wait_ssh(self, deadline):
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the guest stopped while booting; console:\n" + self.console_tail())
            p = subprocess.run(self.ssh_argv() + ["true"], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=30)
            if p.returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("the guest did not answer ssh within the boot timeout; console:\n"
                           + self.console_tail())

    def ssh(self, cmd, check=True, timeout=120, input=None):
        """Runs a shell command in the guest as root; returns CompletedProcess (text)."""
        p = subprocess.run(self.ssh_argv() + [cmd], input=input, capture_output=True,
                           text=True, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise RuntimeError("guest: %r exited %d\nstdout: %s\nstderr: %s"
                               % (cmd, p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
        return p

    def forward_socket(self, guest_path, host_path, timeout=15.0):
        """Exposes a unix socket of the guest (its podman API socket) on the host
        through ssh's stream forwarding; returns the ssh process, which the
        caller ends (or close() does). Waits until the host path exists."""
        try:
            os.unlink(host_path)
        except FileNotFoundError:
            pass
        p = subprocess.Popen(self.ssh_argv("-N", "-o", "ExitOnForwardFailure=yes",
                                           "-o", "StreamLocalBindUnlink=yes",
                                           "-L", "%s:%s" % (host_path, guest_path)),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        self._forwards.append(p)
        deadline = time.monotonic() + timeout
        while not os.path.exists(host_path):
            if p.poll() is not None:
                raise RuntimeError("ssh could not forward %s: %s" % (guest_path, p.stderr.read().decode()))
            if time.monotonic() > deadline:
                raise RuntimeError("ssh did not make %s in %.0f s" % (host_path, timeout))
            time.sleep(0.05)
        return p

    def console_tail(self, n=40):
        try:
            with open(self.console, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no console log)"

    def close(self):
        for p in self._forwards:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        if self.proc and self.proc.poll() is None:
            # The overlay is thrown away: nothing in the guest needs a clean stop.
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

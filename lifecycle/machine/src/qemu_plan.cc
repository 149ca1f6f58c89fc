#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "qemu.h"

namespace fy::machine {

using nlohmann::json;

std::string render_qemu_vm(const QemuVm& v) {
  json j = {{"image", v.image}, {"cpus", v.cpus}, {"memory_mib", v.memory_mib}, {"mounts", v.mounts}};
  return j.dump(2) + "\n";
}

std::optional<QemuVm> parse_qemu_vm(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto img = j.find("image");
  if (img == j.end() || !img->is_string() || img->get<std::string>().empty()) return std::nullopt;
  QemuVm v;
  v.image = img->get<std::string>();
  auto num = [&](const char* k, int64_t lo, int64_t hi, int64_t* out) {
    auto it = j.find(k);
    if (it == j.end()) return true;
    if (!it->is_number_integer()) return false;
    int64_t n = it->get<int64_t>();
    if (n < lo || n > hi) return false;
    *out = n;
    return true;
  };
  if (!num("cpus", 1, 256, &v.cpus) || !num("memory_mib", 128, 1 << 24, &v.memory_mib))
    return std::nullopt;
  if (auto m = j.find("mounts"); m != j.end()) {
    if (!m->is_array()) return std::nullopt;
    for (const auto& e : *m) {
      if (!e.is_string()) return std::nullopt;
      std::string p = e.get<std::string>();
      // Absolute, and nothing a 9p option string or the hook's quoting could misread.
      if (p.empty() || p[0] != '/' || p.find_first_of(",\n\r") != std::string::npos) return std::nullopt;
      v.mounts.push_back(p);
    }
  }
  return v;
}

std::string qemu_mount_tag(size_t i) { return fmt::format("fym{}", i); }

std::vector<std::string> qemu_argv(const QemuLaunch& l) {
  std::string net = fmt::format("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{}-:22", l.ssh_port);
  // cmd: a new relay per guest connection (qemu's tcp: form connects once, at
  // start, and carries a single stream). Its log goes to /dev/null: qemu gives
  // the command the guest's stream as stderr too, so socat's own error text
  // (a host port nobody serves) would reach the guest as if the daemon said it;
  // the guest sees the connection close, as a refused dial.
  for (int64_t lo : {l.port_base, l.port_base + 100})
    for (int64_t p = lo; p < lo + 90; ++p)
      net += fmt::format(",guestfwd=tcp:{}:{}-cmd:socat -lf /dev/null - TCP:127.0.0.1:{}", l.gateway, p, p);
  std::vector<std::string> a = {"qemu-system-x86_64"};
  if (l.kvm) a.insert(a.end(), {"-enable-kvm", "-cpu", "host"});
  else a.insert(a.end(), {"-accel", "tcg,thread=multi", "-cpu", "max"});
  const std::string& d = l.dir;
  const std::string& img = l.vm.image;
  a.insert(a.end(),
           {"-name", "fy-machine:" + d, "-m", std::to_string(l.vm.memory_mib), "-smp",
            std::to_string(l.vm.cpus), "-display", "none", "-no-reboot",
            "-kernel", img + "/vmlinuz", "-initrd", img + "/initrd.img",
            "-append",
            "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=-1 init=/sbin/fy-init quiet",
            "-drive", "file=" + d + "/overlay.qcow2,if=virtio,format=qcow2",
            "-netdev", net, "-device", "virtio-net-pci,netdev=n0",
            "-serial", "file:" + d + "/console.log",
            "-monitor", "unix:" + d + "/monitor.sock,server,nowait",
            "-virtfs", "local,path=" + d + "/boot,mount_tag=fyboot,security_model=none,readonly=on"});
  if (!l.share.empty())
    a.insert(a.end(), {"-virtfs", "local,path=" + l.share +
                                      ",mount_tag=fybuild,security_model=none,readonly=on"});
  for (size_t i = 0; i < l.vm.mounts.size(); ++i)
    a.insert(a.end(), {"-virtfs", "local,path=" + l.vm.mounts[i] + ",mount_tag=" + qemu_mount_tag(i) +
                                      ",security_model=none"});
  a.insert(a.end(), {"-daemonize", "-pidfile", d + "/qemu.pid"});
  return a;
}

std::string qemu_boot_hook(const std::vector<std::string>& mounts, const std::string& guest_socket) {
  // guest_socket is the backend's own constant path (no quoting needed inside su -c '...').
  std::string m;
  for (size_t i = 0; i < mounts.size(); ++i)
    m += fmt::format("mkdir -p {p} && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 {t} {p} "
                     "|| echo \"fy-boot: cannot mount {t} at \"{p}\n",
                     fmt::arg("p", shell_quote(mounts[i])), fmt::arg("t", qemu_mount_tag(i)));
  std::string dir = guest_socket.substr(0, guest_socket.rfind('/'));
  return fmt::format(R"__(#!/bin/sh
# fy-machine's qemu backend: run by the guest's fy-init at every boot, as root
# (lifecycle/machine/src/qemu_plan.cc writes it).
set -u
rm -f /run/fyboot.rc /run/fyboot.done
# The ssh host key fy-machine made on the host (and pinned there, never
# scanned): it replaces fy-init's own, and sshd re-reads its keys on SIGHUP.
# Until then the host's strict ssh refuses the guest.
if [ -f /run/fyboot/{key} ] && ! cmp -s /run/fyboot/{key} /etc/ssh/{key}; then
  install -m 0600 -o root -g root /run/fyboot/{key} /etc/ssh/{key}
  install -m 0644 -o root -g root /run/fyboot/{key}.pub /etc/ssh/{key}.pub
  i=0
  while [ ! -s /run/sshd.pid ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  kill -HUP "$(cat /run/sshd.pid)" && echo "fy-boot: sshd serves the host-made host key"
fi
mount --make-rshared /  # rootless podman wants a shared root mount
echo "fy-boot: start $(date -u +%T)"
# The project's folders, at their host paths.
{mounts}# The build's binaries where the units and the boot script expect them.
if [ -x /fy/wall/fy-wall ]; then ln -sf /fy/wall/fy-wall /usr/local/bin/fy-wall; fi
if [ -x /fy/wall/novsock/fy-novsock ]; then ln -sf /fy/wall/novsock/fy-novsock /usr/local/bin/fy-novsock; fi
if [ -x /fy/forwarder/fy-forwarder ]; then
  mkdir -p /usr/libexec/fy && ln -sf /fy/forwarder/fy-forwarder /usr/libexec/fy/fy-forwarder
fi
if [ -x /fy/wall/dnsfwd/fy-dnsfwd ]; then
  mkdir -p /usr/libexec/fy && ln -sf /fy/wall/dnsfwd/fy-dnsfwd /usr/libexec/fy/fy-dnsfwd
fi
# The VM user's runtime dir (no logind here).
install -d -m 0700 -o {uid} -g {uid} /run/user/{uid}
# The boot provisioning, as lima runs it: root, bash, at every boot.
bash /run/fyboot/provision.sh
rc=$?
echo "$rc" >/run/fyboot.rc
echo "fy-boot: provisioning exited $rc $(date -u +%T)"
# The engine: the VM user's rootless podman (the walled principal's), on the
# socket fy-machine forwards to the host. Started whatever the provisioning
# did: fy-machine checks that and refuses ensure, with the reason.
su -s /bin/sh {user} -c 'export XDG_RUNTIME_DIR=/run/user/{uid}; mkdir -p {dir};
  exec setsid podman system service --time=0 unix://{sock}' </dev/null >/run/fyboot-podman.log 2>&1 &
i=0
while [ ! -S {sock} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
echo "fy-boot: engine socket $( [ -S {sock} ] && echo up || echo MISSING ) $(date -u +%T)"
touch /run/fyboot.done
)__",
                     fmt::arg("mounts", m), fmt::arg("key", kQemuHostKeyFile), fmt::arg("uid", kQemuUid), fmt::arg("user", kQemuUser),
                     fmt::arg("dir", dir), fmt::arg("sock", guest_socket));
}

std::string fill_lima_fields(std::string script, std::string_view user, int uid) {
  for (auto [from, to] : {std::pair<std::string_view, std::string>{"{{.User}}", std::string(user)},
                          {"{{.UID}}", std::to_string(uid)}}) {
    size_t pos = 0;
    while ((pos = script.find(from, pos)) != std::string::npos) {
      script.replace(pos, from.size(), to);
      pos += to.size();
    }
  }
  return script;
}

bool qemu_use_kvm(bool kvm_pvm, bool kvm_hw, bool dev_kvm_opens, std::string* why) {
  if (kvm_pvm && !kvm_hw) {
    *why = "TCG: /dev/kvm is kvm_pvm (boots only PVM guest kernels, not Debian's stock one)";
    return false;
  }
  if (!dev_kvm_opens) {
    *why = "TCG: no usable /dev/kvm";
    return false;
  }
  *why = "KVM: hardware KVM";
  return true;
}

}  // namespace fy::machine

// The qemu backend (development and CI, beyond the reference): a Debian 12
// guest built by lifecycle/guest/build-image, booted by qemu directly (no
// lima, no podman machine), with the same boot provisioning and the same
// downstream contract, a libpod socket on the host.
//
// A VM is a folder, <qemu home>/<name>/ (FY_QEMU_HOME, default
// <fy-machine state>/qemu):
//   vm.json          what create decided: the image, cpus, memory, the mounts
//   overlay.qcow2    the VM's disk: a qcow2 overlay of the cached image (never written)
//   boot/hook        run by the guest's fy-init at every boot (9p tag fyboot, read-only)
//   boot/provision.sh  the rendered boot script, the Lima fields filled in
//   qemu.pid, ssh.port, fwd.pid   the running VM, its ssh forward, the socket relay
//   podman.sock      the guest's libpod socket on the host (an ssh stream forward)
//   boot/ssh_host_ed25519_key(.pub)  the guest's host key, made here (the hook installs it)
//   console.log, qemu.log, fwd.log, known_hosts (the backend's own ssh: that key, strict)
// The pure parts (argv, the hook, vm.json) are here; the I/O is in qemu.cc.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "plan.h"

namespace fy::machine {

// The guest's VM user (build-image makes it): lima's {{.User}} / {{.UID}}.
inline constexpr std::string_view kQemuUser = "fy";
inline constexpr int kQemuUid = 1000;
// The guest's ssh host key, in the VM's boot/ folder (ssh-keygen on the host
// at its first start; <file>.pub beside it). The boot hook installs it over
// fy-init's own before anything else, so the host knows the key it pins
// without scanning it over the network.
inline constexpr std::string_view kQemuHostKeyFile = "ssh_host_ed25519_key";
// The guest address qemu's user network connects to the host's loopback
// (guestfwd), the qemu backend's [machine].gateway.
inline constexpr std::string_view kQemuGateway = "10.0.2.100";

struct QemuVm {
  std::string image;  // build-image's folder: rootfs.img, vmlinuz, initrd.img, id_ed25519
  int64_t cpus = 2;
  int64_t memory_mib = 2048;
  std::vector<std::string> mounts;  // host paths, mounted at the same path in the guest
};
std::string render_qemu_vm(const QemuVm& v);
// vm.json; nullopt when it is not an object with a string "image" (a file
// left half-written, or not ours).
std::optional<QemuVm> parse_qemu_vm(std::string_view json_text);

struct QemuLaunch {
  std::string dir;    // the VM's folder
  QemuVm vm;
  bool kvm = false;   // hardware KVM; else TCG
  int ssh_port = 0;   // host 127.0.0.1 port forwarded to the guest's 22
  std::string share;  // the host build exported read-only at /fy ("" for none)
  std::string gateway = std::string(kQemuGateway);
  int64_t port_base = 41000;  // the band: gateway:p -> host 127.0.0.1:p for every p in it
};
// qemu-system-x86_64 ... -daemonize -pidfile <dir>/qemu.pid: the whole argv.
// The user network is restrict=on: the guest reaches the host only on the
// band's ports at the gateway address, and nothing beyond.
std::vector<std::string> qemu_argv(const QemuLaunch& l);

// The 9p tag of the i-th mount (fym0, fym1, ...).
std::string qemu_mount_tag(size_t i);
// boot/hook: installs the host-made ssh host key (and has sshd re-read it
// when it was not the one served), mounts the project's folders at their host paths, links the
// build's fy-wall and fy-forwarder where the units expect them, runs the
// boot script (its status in /run/fyboot.rc), then starts the VM user's
// rootless engine on guest_socket, and writes /run/fyboot.done.
std::string qemu_boot_hook(const std::vector<std::string>& mounts, const std::string& guest_socket);

// The script with Lima's template fields filled in as lima would (the guest's
// user and uid).
std::string fill_lima_fields(std::string script, std::string_view user, int uid);

// KVM when /dev/kvm is a hardware KVM that boots a stock kernel (kvm_intel,
// kvm_amd); kvm_pvm boots only PVM guest kernels, so TCG there. `why` says
// which and why (fyguest.accelerator() decides alike).
bool qemu_use_kvm(bool kvm_pvm, bool kvm_hw, bool dev_kvm_opens, std::string* why);

struct QemuOptions {
  std::string home;          // the VMs' folders
  std::string build_image;   // lifecycle/guest/build-image
  std::string share;         // the build exported at /fy
  std::string gateway = std::string(kQemuGateway);
  int64_t port_base = 41000;
};
std::unique_ptr<Backend> make_qemu(Env e, QemuOptions o);

}  // namespace fy::machine

// The guest's boot provisioning: one bash script, recorded as a lima system
// provision entry under the "# fy-provision <id>" marker, run as root at every
// boot. Pure: the renderer takes every byte it writes into the guest (unit
// files, the forwarder's key and config) as input, so its id is a function of
// those inputs alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fy::machine {

struct BootSpec {
  int64_t port_base = 41000;            // the project's daemon band (proxy b..b+89, minter +100..)
  std::string gateway = "192.168.5.2";  // lima's user-mode host gateway
  std::string wall_bin = "/usr/local/bin/fy-wall";
  std::string novsock_bin = "/usr/local/bin/fy-novsock";  // wall/novsock
  std::string forwarder_bin = "/usr/libexec/fy/fy-forwarder";
  std::string dnsfwd_bin = "/usr/libexec/fy/fy-dnsfwd";  // wall/dnsfwd
  std::string wall_unit;       // wall/dist/fy-wall.service
  std::string guard_unit;      // wall/dist/fy-forwarder-guard.service
  std::string forwarder_unit;  // forwarder/exe/fy-forwarder.service
  std::string dnsfwd_unit;     // wall/dnsfwd/exe/fy-dnsfwd.service
  std::string forwarder_key;   // 64 hex: the stamp key shared with the host proxy
  bool gvisor = false;         // ADR-0025's posture: the socket filter's user units too
  std::string sockfilter_bin = "/usr/local/bin/fy-sockfilter";
  std::string runsc_bin = "/usr/local/bin/runsc";
  int64_t journal_max_mib = 512;
  // The forwarder's [bridge] watch: "" leaves its default (events); the qemu
  // guest says "poll" (there fy-forwarder's events watch aborts in libuv,
  // uv__finish_close, within seconds of its start).
  std::string bridge_watch;
  // The DNS allow list's channel from the host (fy-machine dns-allow): the
  // public half of the key fy-machine made for it ("ssh-ed25519 <base64>"),
  // installed for root with `restrict` and a forced command, the install
  // below; "" installs no key (and removes an old one).
  std::string dns_allow_key;
  std::string dns_install_bin = "/usr/local/libexec/fy-dnsfwd-install";
  // sshd's PermitRootLogin, in a drop-in read before every other file
  // (sshd_config.d/00-fy-root.conf; the first value sshd reads wins):
  // forced-commands-only, so root's only door is a key with a forced command.
  // The qemu guest says prohibit-password: its image's root key (held by the
  // host, never in the guest) is the backend's own way in (docs/fy-machine.md).
  std::string root_login = "forced-commands-only";
};

// root's authorized_keys line of the allow list's key: restrict, the forced
// command, and the marker comment the boot script replaces it by; "" when
// the key is empty or not one "<type> <base64>" pair.
std::string dns_allow_key_line(const BootSpec& s);
inline constexpr std::string_view kDnsAllowKeyComment = "fy-machine-dns-allow";

// The forced command (dns_install_bin): reads the new allow list on stdin
// (under 1 MiB), checks it with `fy-dnsfwd --check-allow`, installs it
// atomically (root:root 0644) and has fy-dnsfwd re-read it. Exit 0
// installed, 3 refused (the old list kept; each bad line as stdin:line), 4
// installed but fy-dnsfwd did not reload.
std::string render_dns_install(const BootSpec& s);

// What the guest's state file says when the script ran to its end.
std::string boot_want(const BootSpec& s);

// The units the guest must have active after boot, as `systemctl is-active`
// names them (system units), and the user units (`systemctl --user`).
std::vector<std::string> boot_system_units(const BootSpec& s);
std::vector<std::string> boot_user_units(const BootSpec& s);

// The boot script's kernel closures, alone (a bash fragment that expects
// $user and $uid): fy-wall's modprobe.d file of the socket families a dev box
// never needs, and fy-novsock's AF_VSOCK refusal for the VM user and its
// subuids. render_boot includes it after the sudo narrowing.
std::string render_kernel_closures(const BootSpec& s);

struct Rendered {
  std::string script;  // line 2 is "# fy-provision <id>"
  std::string id;      // sha256 of the script with @@ID@@ still in it, 16 hex
};
Rendered render_boot(const BootSpec& s);

// The Lima template fields the script may contain, and a check that it uses
// no other `{{...}}`.
bool uses_only_lima_fields(const std::string& script, std::string* bad = nullptr);

}  // namespace fy::machine

// fy-machine's pure decisions: what to run and what a tool's output means.
// No I/O here: every function takes the bytes or values it judges and returns
// argv vectors, expressions, parsed records or messages, so each rule of
// ADR-0011 / ADR-0027 (and the reference's lifecycle, wall-lifecycle-filter.md
// section 2) is unit-tested without a VM, a limactl or a podman.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fy::machine {

// ---- sizing -----------------------------------------------------------------

struct Resources {
  int64_t cpus = 4;
  std::string memory = "8192";  // as configured (MACHINE_MEMORY / memory_mib)
  int64_t disk_gib = 60;
};

// The MiB rule: the configured memory as a whole number of MiB, verbatim;
// 8192 when it is not one. Never a rounded GiB: Virtualization.framework
// rejects a memory size that is not whole MiB at every boot ("3.91GiB" bricks
// the VM), so the value is neither converted nor rounded.
int64_t memory_mib(std::string_view configured);

struct Mount {
  std::string location;     // host path
  std::string mount_point;  // guest path (the same path: worktrees resolve alike)
};

// Exactly the isolation set: the repo and the worktrees root, nothing else.
std::vector<Mount> isolation_mounts(const std::string& repo, const std::string& wt_root);

// ---- lima -------------------------------------------------------------------

// JSON string literal (UTF-8 passed through, as Python's ensure_ascii=False).
std::string json_quote(std::string_view s);
// A POSIX shell single-quoted word.
std::string shell_quote(std::string_view s);

// `.cpus = C | .memory = "MMiB" | .disk = "DGiB" | .mounts = [...]`, plus
// `| .vmType = "t"` only when one was resolved.
std::string lima_set_expr(const Resources& r, const std::vector<Mount>& mounts,
                          const std::optional<std::string>& vm_type);
std::vector<std::string> lima_create_argv(const std::string& limactl, const std::string& name,
                                          const std::string& set_expr);

// vmType: MACHINE_VMTYPE / [machine].vmtype verbatim; else the first of vz,
// qemu that `limactl info` lists in .vmTypes; else none (lima's own default).
// krunkit is never chosen automatically.
std::optional<std::string> resolve_vm_type(const std::optional<std::string>& configured,
                                           std::string_view limactl_info_json);

struct LimaInstance {
  std::string name;
  std::string status;  // as lima says it: Running, Stopped, Broken, ...
  std::string dir;
  int64_t ssh_port = 0;
};
// `limactl list --json`: one JSON object a line. Lines that are not an object
// with a string "name" lima would accept (valid_machine_name) are skipped
// (lima prints warnings on stderr only, but a broken line must not hide the
// others); an sshLocalPort that is not a port reads as 0 (unknown).
std::vector<LimaInstance> parse_lima_list(std::string_view json_lines);

// The provisioning marker and its record.
inline constexpr std::string_view kProvisionMarker = "# fy-provision ";
// The yq expression that replaces every provision entry carrying `marker`
// with one system-mode entry holding `script`, keeping the others (lima's own,
// the guest monitor's `# fy-monitor ` entry).
std::string provision_set_expr(std::string_view script, std::string_view marker);
// The first stripped line of lima.yaml that starts with the marker, minus the
// marker; "" when there is none.
std::string parse_provision_id(std::string_view lima_yaml, std::string_view marker);
// lima.yaml's mounts: the location:/mountPoint: values, in order.
std::vector<std::string> parse_lima_mounts(std::string_view lima_yaml);

// ---- ssh --------------------------------------------------------------------

struct SshConfig {
  std::string host;  // the Host alias (lima-<name>)
  std::string hostname = "127.0.0.1";
  int64_t port = 0;
  std::string user;
  std::string identity;  // the first IdentityFile
};
// The first Host block's HostName/Port/User/IdentityFile (quotes removed).
// A config without a port or a user yields nullopt.
std::optional<SshConfig> parse_ssh_config(std::string_view text);

struct HostKey {
  std::string type;  // ssh-ed25519, ecdsa-sha2-nistp256, ...
  std::string blob;  // base64
  bool operator==(const HostKey&) const = default;
};
// ssh-keyscan output or a known_hosts file: "<host> <type> <blob> [comment]".
// Comments (#) and malformed lines are skipped.
std::vector<HostKey> parse_host_keys(std::string_view text);

enum class PinVerdict { first_contact, match, changed, no_keys };
// Every key the guest offers now must be one pinned at first contact; an
// empty pin is the first contact. A guest that offers no key is no_keys.
PinVerdict judge_host_keys(const std::vector<HostKey>& pinned, const std::vector<HostKey>& seen);

// The ssh config fy-machine writes: lima's user, port and key, but strict
// host key checking against the pinned file (lima's own turns it off).
std::string render_pinned_ssh_config(const std::string& alias, const SshConfig& c,
                                     const std::string& known_hosts);
std::string render_known_hosts(const std::string& alias, const std::vector<HostKey>& keys);

// {"config": ..., "host": ..., "user": ..., "known_hosts": ...} (fy-compose
// reads it), plus "port" and "identity".
std::string ssh_target_json(const std::string& config, const std::string& alias,
                            const SshConfig& c, const std::string& known_hosts);

// ---- the DNS allow list's channel (fy-machine dns-allow) -------------------

// ssh to root at the guest's ssh target with the allow-list key alone (no
// ssh config, no agent, no other identity: lima's root would take the VM
// user's key into cloud-init's "login as the user" command), strict host key
// checking against the pinned file; the list on its stdin. The command is
// the forced one's name only for the guest's log: sshd runs the forced one.
std::vector<std::string> dns_allow_push_argv(const SshConfig& target, const std::string& key,
                                             const std::string& known_hosts,
                                             const std::string& alias);
// `fy-dnsfwd-allow POLICY --out FILE`.
std::vector<std::string> dns_allow_render_argv(const std::string& bin, const std::string& policy,
                                               const std::string& out);
// The guest's refusal, its "stdin:LINE:" made "<file>:LINE:" (the file that
// was sent, on the host).
std::string name_sent_file(std::string_view guest_err, std::string_view file);
// `path` is `dir` or below it (both absolute, lexically normalized).
bool path_within(const std::string& path, const std::string& dir);

// ---- podman machine ---------------------------------------------------------

std::vector<std::string> podman_init_argv(const std::string& podman, const std::string& name,
                                          const Resources& r, const std::vector<Mount>& mounts);
struct PodmanListed {
  std::string name;
  bool running = false;
};
// `podman machine list --format {{.Name}}|{{.Running}}`; the default machine's
// trailing '*' is dropped.
std::vector<PodmanListed> parse_podman_list(std::string_view text);
// The Mounts[].Target values of <ConfigDir>/<name>.json.
std::vector<std::string> parse_podman_mounts(std::string_view machine_json);

// ---- selection --------------------------------------------------------------

struct Selection {
  std::string name;           // "lima", "podman" or "qemu": always a VM backend
  bool explicit_ = false;     // somebody named a backend (env or config)
  std::string named;          // what was named, lowercased ("" when inherited)
  std::string from;           // "MACHINE_BACKEND", "[machine].backend" or "default"
  std::vector<std::string> warnings;  // printed on every command
};
// MACHINE_BACKEND, then [machine].backend, lowercased; default lima. `native`
// is retired (ADR-0027): a loud warning naming the ADR, then podman. Any other
// unknown name: a warning, then podman. An empty value counts as unset.
Selection select_backend(const std::optional<std::string>& env,
                         const std::optional<std::string>& config);

struct CliInfo {
  std::string cli;   // limactl, podman
  std::string hint;  // where to get it
};
CliInfo cli_info(std::string_view backend);

// The refusal when the backend's CLI is missing: explicit names get "install
// it or name another"; the inherited default gets the fail-closed message with
// its two ways out (install it, or name podman), never a VM-less one.
std::string missing_cli_message(const Selection& s);

// The one-VM policy (podman machine on macOS, podman#26281).
std::string one_vm_refusal(std::string_view other);

// Machine names: [A-Za-z0-9][A-Za-z0-9._-]*.
bool valid_machine_name(std::string_view name);

// ---- the port band ----------------------------------------------------------

// The walled band: proxy base+0..89 and minter base+100..189, "b-b+89, ...".
std::string wall_ports(int64_t port_base);

// ---- host processes ---------------------------------------------------------

// True when one of the NUL-separated arguments of a /proc/<pid>/cmdline names
// the machine `name` as a whole word: bounded on each side by the argument's
// edge or a character that cannot be part of a machine name ('/', ':', ',',
// '=', ...), or by '-', '_' or '.' followed or preceded by more of the file
// name ("podman-app-api.sock", "qmp_app.sock", "app.json"). A name that only
// occurs inside a longer word ("app" in qemu's "-append") does not count.
bool cmdline_names_machine(std::string_view cmdline, std::string_view name);

}  // namespace fy::machine

// fy-wall's configuration: a TOML file with one section per wall, and flags
// that override it. Reading (read_config) is syntax and value checking only,
// with file:line errors, and is what the fuzz target drives; resolving
// (machine_spec, guard_spec, host_spec) adds what needs the system: the
// passwd database, /etc/subuid, the environment.
//
//   [machine]                 # the machine wall, in the guest
//   user = "alice"            # or 1000; default FY_WALL_UID, then SUDO_UID
//   gateway = "192.168.5.2"
//   ports = ["41000-41089", "41100-41189"]
//   resolvers = [...]         # default: resolv.conf's IPv4 nameservers (not
//                             # loopback: lo is open), else Lima's 192.168.5.3
//   agent_cgroup = "system.slice/lima-guestagent.service"  # default: that, if it exists
//   dns_forwarder = "127.42.0.53"  # walled port 53 goes there (fy-dnsfwd); default none
//   forward_allow = [...]     # default: the same four
//   subuid_file = "/etc/subuid"
//
//   [guard]                   # the forwarder's guard, in the guest
//   listener = "127.42.0.1"   # user, gateway, ports, subuid_file: as [machine],
//   route_table = 4747        # taken from [machine] when not given here
//   rule_priority = 4747
//
//   [host]                    # the host wall, on a Linux host
//   vm = "dev"
//   user = "fyvm-dev"         # the VM's own account (wall/vmuser.h); required
//   cgroup = "user.slice/…/fy-machine-dev.slice"
//   ports = ["41000-41199"]
//   proxy_port_base = 41000   # default: the lowest port
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "wall/parse.h"
#include "wall/spec.h"

namespace fy::wall {

enum class Wall { machine, guard, host };
const char* wall_name(Wall w);

// A value and where it came from: "file:line:col" for the config, "--flag"
// for a flag, "FY_WALL_UID" for the environment. Every later error about the
// value names `where`.
template <class T>
struct Sourced {
  T value;
  std::string where;
};

// The keys [machine] and [guard] share.
struct WallKeys {
  std::optional<Sourced<UserRef>> user;
  std::optional<Sourced<uint32_t>> gateway;
  std::optional<Sourced<std::vector<PortRange>>> ports;
  std::optional<Sourced<std::string>> subuid_file;
};

struct MachineKeys : WallKeys {
  std::optional<Sourced<std::vector<Cidr4>>> resolvers;
  std::optional<Sourced<std::vector<Cidr4>>> forward_allow;
  std::optional<Sourced<std::string>> agent_cgroup;  // "" = none
  std::optional<Sourced<uint32_t>> dns_forwarder;    // fy-dnsfwd's 127/8 address
};

struct GuardKeys : WallKeys {
  std::optional<Sourced<uint32_t>> listener;
  std::optional<Sourced<uint32_t>> route_table;
  std::optional<Sourced<uint32_t>> rule_priority;
};

struct HostKeys {
  std::optional<Sourced<std::string>> vm;
  std::optional<Sourced<UserRef>> user;  // the VM user: no default
  std::optional<Sourced<std::string>> cgroup;
  std::optional<Sourced<std::vector<PortRange>>> ports;
  std::optional<Sourced<uint16_t>> proxy_port_base;
};

struct Settings {
  std::string path;  // the config file, or "" when there is none
  bool has_machine = false, has_guard = false, has_host = false;
  MachineKeys machine;
  GuardKeys guard;
  HostKeys host;
};

// Parses a config text. Every problem is reported, one per line, as
// "path:line:col: [section].key: what is wrong — what to do"; unknown
// sections and keys are refused.
Result<Settings> read_config(std::string_view text, const std::string& path);
Result<Settings> read_config_file(const std::string& path);

// The flags that name a value. Each is applied to the section of the wall
// being acted on, over the config file's value.
struct Flags {
  std::optional<std::string> user, gateway, ports, resolvers, forward_allow, subuid_file;
  std::optional<std::string> listener, route_table, rule_priority;
  std::optional<std::string> vm, cgroup, proxy_port_base;
  std::optional<std::string> agent_cgroup;
  bool any() const;
};

// Applies `flags` to the section for `wall`; refuses a flag that does not
// belong to that wall (e.g. --vm for the machine wall) or a bad value.
Result<void> apply_flags(Settings& s, Wall wall, const Flags& flags);

// Where the walled uid comes from when neither config nor flags name it.
struct Env {
  std::optional<std::string> fy_wall_uid;  // FY_WALL_UID
  std::optional<std::string> sudo_uid;     // SUDO_UID
  // The resolv.conf the defaults of the resolvers are read from: the file
  // FY_WALL_RESOLV_CONF names, else /etc/resolv.conf ("" when unreadable).
  std::string resolv_conf;
  // Whether kLimaAgentCgroup exists under the cgroup2 root.
  bool lima_agent_cgroup = false;
  // Resolves and checks the host wall's VM user named at `where`
  // (resolve_vm_user over VmUserSources::from_system, wall/vmuser.h);
  // unset, host_spec refuses.
  std::function<Result<VmUser>(const UserRef&, const std::string& where)> resolve_vm_user;
  static Env from_process();
};

// Resolve the settings into a spec, consulting the passwd database and the
// subuid file. Refuses a missing required key, uid 0, a user with no passwd
// entry, and a subuid range that holds the user's own uid; for the host wall,
// a VM user that is not the VM's own (resolve_vm_user, wall/vmuser.h).
Result<MachineSpec> machine_spec(const Settings& s, const Env& env);
Result<GuardSpec> guard_spec(const Settings& s, const Env& env);
Result<HostSpec> host_spec(const Settings& s, const Env& env);

// The walled principals alone: [machine]'s user and subuid_file (or the
// flags), resolved as machine_spec resolves them. What `fy-wall render
// principals` prints, for the forwarder's walled_uids and fy-novsock.
Result<Principal> walled_principal(const Settings& s, const Env& env);

// The defaults of the resolvers, from a resolv.conf text: the machine wall
// takes its IPv4 nameservers that are not loopback (else kLimaResolver); the
// host wall takes every nameserver (else 127.0.0.1, libc's default).
std::vector<Cidr4> default_machine_resolvers(std::string_view resolv_conf);
std::vector<std::string> default_host_resolvers(std::string_view resolv_conf);

// Just the guard's routing table and rule priority (defaults when absent):
// enough to remove its policy routes without resolving the user.
std::pair<uint32_t, uint32_t> guard_route_ids(const Settings& s);

}  // namespace fy::wall

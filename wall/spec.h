// What each of fy-wall's three rulesets is rendered from, fully resolved and
// validated. A spec holds no file paths and no unresolved names: the renderers
// (wall/render.h) are pure functions of it, which is what the golden files pin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/subid.h"

namespace fy::wall {

// An inclusive port range; lo == hi for one port. Always 1 <= lo <= hi <= 65535.
struct PortRange {
  uint16_t lo = 0;
  uint16_t hi = 0;
  bool operator==(const PortRange&) const = default;
};

// An inclusive uid range (core/subid.h's).
using IdRange = fy::subid::Range;

// An IPv4 prefix; `net` is in host byte order with no host bits set.
struct Cidr4 {
  uint32_t net = 0;
  uint8_t prefix = 32;
  bool operator==(const Cidr4&) const = default;
};

// The walled principals: the VM user and every uid it can map (its /etc/subuid
// ranges, as core/subid.h reads them: every rootless container's uids).
// Never contains uid 0.
struct Principal {
  uint32_t uid = 0;
  std::string name;              // from the passwd database
  std::vector<IdRange> subuids;  // sorted, disjoint; empty when the user has none
  // The uid first, then the subuid ranges: what `meta skuid` and the policy
  // routes' uidrange match.
  std::vector<IdRange> ranges() const;
};

// The machine wall (inet fy_wall + ip6 fy_wall6), in the guest.
struct MachineSpec {
  Principal walled;
  uint32_t gateway = 0;              // host order
  std::vector<PortRange> ports;      // the project's daemon port bands, sorted, disjoint
  std::vector<Cidr4> resolvers;      // where DNS (udp/tcp 53) may go
  std::vector<Cidr4> forward_allow;  // what the forward chain admits
  // The guest agent's cgroup (relative to the cgroup2 root), or "" for none:
  // its sockets may reach only local destinations (it dials for whoever can
  // reach its unix socket, the walled user among them).
  std::string agent_cgroup;
  // The DNS forwarder's address in the guest (fy-dnsfwd, a 127.0.0.0/8 host
  // address), or 0 for none. When set, every udp/tcp port-53 packet of a
  // walled principal is redirected to it (port 53 kept), whatever its
  // destination, and the resolvers are no longer reachable directly.
  uint32_t dns_forwarder = 0;
};

// The forwarder's guard (ip fy_guard + uid-scoped policy routes), in the guest.
struct GuardSpec {
  Principal walled;
  uint32_t gateway = 0;
  std::vector<PortRange> ports;
  uint32_t listener = 0;       // the forwarder's VM listener, a 127.0.0.0/8 address
  uint32_t route_table = 0;    // the routing table the policy rules look up
  uint32_t rule_priority = 0;  // the priority of every policy rule fy-wall owns
};

// The host wall's VM user (wall/vmuser.h): the account dedicated to the VM,
// whose processes the wall judges wherever they run. Never uid or gid 0.
struct VmUser {
  std::string name;  // from the passwd database
  uint32_t uid = 0;
  uint32_t gid = 0;  // its primary group, which no other account has
};

// The host wall (inet fy_host_wall_<vm>), on a Linux host.
struct HostSpec {
  std::string vm;                // the VM's name as given; the table name is made nft-safe
  VmUser user;                   // the VM's processes: its uid and gid (`meta skuid/skgid`)
  std::string cgroup;            // the VM's slice, relative to the cgroup2 root, no leading '/'
  std::vector<PortRange> ports;  // the project's port band
  uint16_t proxy_port_base = 0;  // the ct mark is (0xF4 << 24) | proxy_port_base
  // The host's own resolvers (its resolv.conf), canonical IPv4 or IPv6 text:
  // the only destinations of the VM's port 53.
  std::vector<std::string> resolvers;
};

// Table names. Each wall owns only its own tables; nothing here ever flushes
// the ruleset.
inline constexpr const char* kMachineTable = "fy_wall";    // family inet
inline constexpr const char* kMachineTable6 = "fy_wall6";  // family ip6
inline constexpr const char* kGuardTable = "fy_guard";     // family ip

// The defaults the reference uses.
inline constexpr const char* kDefaultListener = "127.42.0.1";
inline constexpr uint32_t kDefaultRouteTable = 4747;
inline constexpr uint32_t kDefaultRulePriority = 4747;
inline constexpr const char* kDefaultSubuidFile = "/etc/subuid";
// The resolver a Lima guest uses when its resolv.conf names none (the
// hostagent's DNS on the user-mode network).
inline constexpr const char* kLimaResolver = "192.168.5.3";
// The guest agent's unit, where a Lima guest runs it.
inline constexpr const char* kLimaAgentCgroup = "system.slice/lima-guestagent.service";
// Where Lima's guest agent serves its gRPC API when no vsock or virtio-serial
// carries it (the QEMU driver): owned by the main user, mode 0600.
inline constexpr const char* kLimaAgentSocket = "/run/lima-guestagent.sock";
// RFC 1918 plus loopback: the reference's private resolvers and forward targets.
inline constexpr const char* kPrivateRanges =
    "127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16";

}  // namespace fy::wall

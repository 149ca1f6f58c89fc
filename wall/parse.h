// Parsers for the values an operator writes in fy-wall's config and flags,
// and the formatters the renderers use. Pure functions: no files, no system
// calls, so the fuzz target and the unit tests reach all of them.
//
// Every error message says what is wrong with the value and what to write
// instead; callers prefix it with where the value came from (file:line or
// the flag's name).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "wall/spec.h"

namespace fy::wall {

// "41000-41089, 41100-41189" or "41000": a comma-separated list of ports and
// inclusive ranges. The result is sorted; overlapping entries are refused
// (they would mean the operator's two bands collide), an empty list too.
Result<std::vector<PortRange>> parse_ports(std::string_view list);
// Same, over the elements of a TOML array of strings.
Result<std::vector<PortRange>> parse_ports(const std::vector<std::string>& items);

// A dotted-quad IPv4 address, four decimal octets, no leading zeros (which
// some parsers read as octal). Returns host byte order.
Result<uint32_t> parse_ipv4(std::string_view s);

// "10.0.0.0/8", or a bare address meaning /32. Host bits must be zero.
Result<Cidr4> parse_cidr4(std::string_view s);
// A comma-separated list of prefixes; refuses an empty list.
Result<std::vector<Cidr4>> parse_cidrs(std::string_view list);
Result<std::vector<Cidr4>> parse_cidrs(const std::vector<std::string>& items);

// The walled user as written: a login name or a decimal uid.
struct UserRef {
  bool numeric = false;
  uint32_t uid = 0;
  std::string name;
};
Result<UserRef> parse_user(std::string_view s);

// A VM name: 1..64 printable ASCII characters, no spaces or quotes.
Result<std::string> parse_vm_name(std::string_view s);
// The reference's table name: "fy_host_wall_" + the name with every
// character outside [A-Za-z0-9_./] replaced by '_'.
std::string host_table_name(std::string_view vm);

// A cgroup path relative to the cgroup2 root, e.g.
// "user.slice/user-1000.slice/user@1000.service/fy.slice/fy-machine-dev.slice".
// Leading and trailing '/' are dropped; empty components, "." and "..", and
// characters nft strings or systemd unit names cannot hold are refused.
Result<std::string> parse_cgroup_path(std::string_view s);
// The number of components: nft's `socket cgroupv2 level`.
int cgroup_level(std::string_view normalized);

// Formatters, in nft's own spelling.
// The `nameserver` addresses of a resolv.conf text, in order, canonical
// (inet_ntop) text; malformed lines are skipped, as the resolver does.
std::vector<std::string> parse_resolv_conf(std::string_view text);

// One listening socket from /proc/net/{tcp,tcp6,udp,udp6}: TCP in LISTEN,
// UDP bound and unconnected. `addr` is canonical text.
struct Listener {
  std::string proto;  // "tcp", "udp"
  std::string addr;
  uint16_t port = 0;
  uint32_t uid = 0;
  bool operator==(const Listener&) const = default;
};
// Parses a /proc/net table (the kernel's text; malformed lines are skipped).
std::vector<Listener> parse_proc_net_listeners(std::string_view text, std::string_view proto,
                                               bool v6);

std::string format_range(const PortRange& r);   // "41000-41089", "41000"
std::string format_id_range(const IdRange& r);  // "4242", "100000-165535"
std::string format_ipv4(uint32_t host_order);
std::string format_cidr(const Cidr4& c);
std::string format_ports(const std::vector<PortRange>& ports);  // "41000-41089, 41100"
std::string format_ids(const std::vector<IdRange>& ids);        // "1000, 100000-165535"
std::string format_cidrs(const std::vector<Cidr4>& cidrs);      // "10.0.0.0/8, ..."
// The host wall's ct mark, written as the reference does (%#010x).
std::string format_mark(uint16_t proxy_port_base);
// The mark the host wall gives a loopback flow it admitted, at its first
// packet, to one of the VM's own listeners: (0xF4 << 24) | (1 << 16) | base.
std::string format_local_mark(uint16_t proxy_port_base);

}  // namespace fy::wall

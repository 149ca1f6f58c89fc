// The three rulesets as nft text, pure functions of their specs. The text is
// what `fy-wall render` prints, what the golden files pin, and what `apply`
// hands libnftables as one transaction. Each ruleset begins by declaring and
// flushing its own tables, so the whole text replaces their rules atomically,
// and `nft -f` on a saved copy does the same: never `flush ruleset`. No rule
// uses an anonymous set (render.cc says why).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "wall/spec.h"

namespace fy::wall {

// A table fy-wall owns: family ("inet", "ip", "ip6") and name.
struct TableRef {
  std::string family;
  std::string name;
  std::string str() const { return family + " " + name; }
  bool operator==(const TableRef&) const = default;
};

std::vector<TableRef> machine_tables();
std::vector<TableRef> guard_tables();
std::vector<TableRef> host_tables(const HostSpec& h);
std::vector<TableRef> host_tables_for(const std::string& vm);

std::string render_machine(const MachineSpec& m);
std::string render_guard(const GuardSpec& g);  // the nft part; the routes follow as comments
std::string render_host(const HostSpec& h);

// Deletes `tables` if present, in one transaction ("table X" then
// "delete table X": declaring an existing table is a no-op).
std::string render_remove(const std::vector<TableRef>& tables);

// The names of the chains a rendered text defines in `table`, in order.
std::vector<std::string> rendered_chains(const std::string& text, const TableRef& table);

// One uid-scoped policy rule of the guard: the walled uid range's TCP
// connections to gateway:dport look up `table`, whose one route sends them
// out through lo.
struct PolicyRule {
  IdRange uids;
  PortRange dport;
  uint32_t to = 0;  // the gateway, /32
  uint32_t table = 0;
  uint32_t priority = 0;
  bool operator==(const PolicyRule&) const = default;
  // In `ip rule` syntax, for messages and the rendered comments.
  std::string str() const;
};
std::vector<PolicyRule> guard_rules(const GuardSpec& g);

// A socket family the guest's kernel need not offer: its modprobe alias
// (net-pf-N, or net-pf-F-proto-P for an IP protocol module) and why.
struct BlockedFamily {
  std::string alias;
  std::string module;
  std::string why;
};
// The families a dev box does not need. Most transmit through a kernel
// socket (no socket file: `meta skuid` cannot match them, the machine wall's
// ownerless chain drops their new flows) or are link layers with no place in
// a VM. vsock is not among them: Lima's vz driver carries its guest agent
// over it (docs/fy-wall.md, "vsock").
const std::vector<BlockedFamily>& blocked_families();
// The modprobe.d text for them: `install ALIAS /bin/false` makes both the
// autoload on socket() and an explicit modprobe fail. Pure; the guest's boot
// provisioning installs it as /etc/modprobe.d/fy-wall-families.conf.
std::string render_families();

// One-line summaries for the operator, in the reference's words.
std::string describe_machine(const MachineSpec& m);
std::string describe_guard(const GuardSpec& g);
std::string describe_host(const HostSpec& h);

}  // namespace fy::wall

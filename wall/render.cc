#include "wall/render.h"

#include <fmt/format.h>

#include <algorithm>

#include "wall/parse.h"

namespace fy::wall {
namespace {

// Why every rule matches one value or one range, never an anonymous set
// (`{ 4242, 100000-165535 }`): while a transaction commits, a packet that is
// still walking the old rules looks set elements up in the new generation,
// where the old rules' sets are already deleted. The lookup misses, and a
// walled packet passes as not walled (or a band port is refused). The
// storm test in tests/wall/test_apply.py measured it; docs/wall-escapes.md
// has the numbers. Rules of plain comparisons and ranges have no such state.

// The preamble that makes a ruleset text replace its tables in one
// transaction: declare (a no-op when present) and flush (delete every rule).
// The definitions that follow re-declare the same chains and add the rules.
// Flushing keeps each base chain, so a packet meets exactly one chain per
// hook, holding either all the old rules or all the new ones.
std::string flush_preamble(const std::vector<TableRef>& tables) {
  std::string out;
  for (const TableRef& t : tables)
    out += fmt::format("table {}\nflush table {}\n", t.str(), t.str());
  return out;
}

std::string describe_walled(const Principal& p) {
  std::string out = fmt::format("uid {} ({})", p.uid, p.name);
  if (!p.subuids.empty()) out += " +subuid " + format_ids(p.subuids);
  return out;
}

}  // namespace

std::vector<TableRef> machine_tables() {
  return {{"inet", kMachineTable}, {"ip6", kMachineTable6}};
}

std::vector<TableRef> guard_tables() {
  return {{"ip", kGuardTable}};
}

std::vector<TableRef> host_tables(const HostSpec& h) {
  return host_tables_for(h.vm);
}

std::vector<TableRef> host_tables_for(const std::string& vm) {
  return {{"inet", host_table_name(vm)}};
}

std::string render_machine(const MachineSpec& m) {
  const std::vector<IdRange> walled = m.walled.ranges();
  std::string out;
  out += "# fy-wall machine wall: the guest's egress wall.\n";
  out += "# Walled: " + describe_walled(m.walled) + ".\n";
  out += "# Apply with `fy-wall apply machine`; `nft -f` on this text does the same: the\n";
  out += "# first lines make it replace both tables' rules in one transaction. It never\n";
  out += "# flushes the ruleset: it owns only its own tables.\n";
  out += flush_preamble(machine_tables());
  out += fmt::format("table inet {} {{\n", kMachineTable);
  out += "\tchain output {\n";
  out += "\t\ttype filter hook output priority 0; policy accept;\n";
  if (!m.agent_cgroup.empty()) {
    out += "\t\t# The guest agent dials any address as root for whoever reaches its socket\n";
    out += "\t\t# (Lima's Tunnel call): its sockets reach only this machine.\n";
    out += fmt::format("\t\tsocket cgroupv2 level {} \"{}\" jump agent\n",
                       cgroup_level(m.agent_cgroup), m.agent_cgroup);
  }
  out += "\t\t# loopback is always open\n";
  out += "\t\toifname \"lo\" accept\n";
  out += "\t\t# The policy is accept: only what a walled principal's socket sends is\n";
  out += "\t\t# judged. The reference wrote `meta skuid != { ... } accept`, which never\n";
  out += "\t\t# matches a packet without a user socket (neighbour discovery, MLD, IGMP),\n";
  out += "\t\t# so it refused the kernel's own packets for everyone (docs/wall-escapes.md).\n";
  for (const IdRange& r : walled) {
    out += fmt::format("\t\tmeta skuid {} jump walled\n", format_id_range(r));
  }
  out += "\t\t# every other user's socket is not walled\n";
  out += "\t\tmeta skuid 0-4294967295 accept\n";
  out += "\t\t# No socket file: `meta skuid` cannot say whose it is (a kernel socket, a\n";
  out += "\t\t# TIME_WAIT or closed socket, a listener's SYN-ACK). Judged by what the\n";
  out += "\t\t# kernel itself sends, so no socket family that transmits through a kernel\n";
  out += "\t\t# socket (rxrpc, rds_tcp, tipc's UDP bearer, an MPTCP join) carries anyone out.\n";
  out += "\t\tjump ownerless\n";
  out += "\t}\n";
  if (!m.agent_cgroup.empty()) {
    out += "\tchain agent {\n";
    out += "\t\toifname \"lo\" accept\n";
    out += "\t\tlog prefix \"fy-wall-agent \" counter\n";
    out += "\t\tmeta l4proto tcp reject with tcp reset\n";
    out += "\t\treject\n";
    out += "\t}\n";
  }
  out += "\tchain ownerless {\n";
  out += "\t\t# replies on flows others opened: SYN-ACKs, the kernel's resets and ICMP errors\n";
  out += "\t\tct direction reply accept\n";
  out += "\t\t# ICMP errors about a tracked flow\n";
  out += "\t\tct state related meta l4proto icmp accept\n";
  out += "\t\tct state related meta l4proto ipv6-icmp accept\n";
  out += "\t\t# a TIME_WAIT or closed socket's ACK, FIN or RST on a tracked flow (its SYN\n";
  out += "\t\t# was judged when its socket still had a file)\n";
  out += "\t\tct state established meta l4proto tcp tcp flags & syn == 0 accept\n";
  out += "\t\t# neighbour discovery and multicast listener reports: link-local, hop limit 1\n";
  for (const char* t : {"nd-router-solicit", "nd-neighbor-solicit", "nd-neighbor-advert"})
    out += fmt::format("\t\ticmpv6 type {} ip6 hoplimit 255 accept\n", t);
  for (const char* t : {"mld-listener-report", "mld-listener-done", "mld2-listener-report"})
    out += fmt::format("\t\ticmpv6 type {} ip6 hoplimit 1 accept\n", t);
  out += "\t\tip protocol igmp ip ttl 1 accept\n";
  out += "\t\t# anything else: a new flow no user socket opened\n";
  out += "\t\tlog prefix \"fy-wall-ownerless \" counter\n";
  out += "\t\tdrop\n";
  out += "\t}\n";
  out += "\tchain walled {\n";
  out += "\t\t# Replies on flows others opened to them. Not `ct state established`, which\n";
  out += "\t\t# the reference accepted for everyone first: a walled socket bound to the\n";
  out += "\t\t# port of root's finished UDP exchange met root's conntrack entry and got\n";
  out += "\t\t# out (docs/wall-escapes.md). Their own flows meet the rules below again.\n";
  out += "\t\tct direction reply accept\n";
  if (m.dns_forwarder) {
    // The nat chain rewrote the destination, not the route: this chain still
    // sees the original output device, so the forwarder is admitted by address.
    out += "\t\t# DNS only through fy-dnsfwd (dns_redirect rewrote every :53 to it)\n";
    out += fmt::format("\t\tip daddr {} udp dport 53 accept\n", format_ipv4(m.dns_forwarder));
    out += fmt::format("\t\tip daddr {} tcp dport 53 accept\n", format_ipv4(m.dns_forwarder));
  } else {
    out += "\t\t# DNS only to the resolvers the VM uses: any other :53 carries any protocol\n";
    for (const Cidr4& c : m.resolvers) {
      out += fmt::format("\t\tip daddr {} udp dport 53 accept\n", format_cidr(c));
      out += fmt::format("\t\tip daddr {} tcp dport 53 accept\n", format_cidr(c));
    }
  }
  out += "\t\t# the project's daemon ports on the host gateway, and nothing else there\n";
  for (const PortRange& p : m.ports) {
    out += fmt::format("\t\tip daddr {} tcp dport {} accept\n", format_ipv4(m.gateway),
                       format_range(p));
  }
  out += "\t\t# everything else: logged, then refused (TCP reset, ICMP otherwise)\n";
  out += "\t\tlog prefix \"fy-wall-deny \" counter\n";
  out += "\t\tmeta l4proto tcp reject with tcp reset\n";
  out += "\t\treject\n";
  out += "\t}\n";
  if (m.dns_forwarder) {
    // Every port-53 packet of theirs, to any address (the resolver, a LAN
    // host, a stub on loopback), goes to fy-dnsfwd, which passes only
    // well-formed queries for names the policy could allow; the reply is
    // un-NATed by conntrack, so the client sees its resolver answer.
    out += "\tchain dns_redirect {\n";
    out += "\t\ttype nat hook output priority -100; policy accept;\n";
    for (const IdRange& r : walled) {
      for (const char* proto : {"udp", "tcp"}) {
        out += fmt::format("\t\tmeta skuid {} meta nfproto ipv4 {} dport 53 dnat ip to {}:53\n",
                           format_id_range(r), proto, format_ipv4(m.dns_forwarder));
      }
    }
    out += "\t}\n";
  }
  out += "\tchain forward {\n";
  out += "\t\ttype filter hook forward priority 0; policy accept;\n";
  out += "\t\t# replies; the first direction of a flow is judged on every packet\n";
  out += "\t\tct direction reply accept\n";
  out += "\t\t# forwarded traffic (no uid to match) may go to private destinations only\n";
  for (const Cidr4& c : m.forward_allow) {
    out += fmt::format("\t\tip daddr {} accept\n", format_cidr(c));
  }
  out += "\t\tlog prefix \"fy-wall-deny-fwd \" counter\n";
  out += "\t\treject\n";
  out += "\t}\n";
  out += "}\n";
  out += fmt::format("table ip6 {} {{\n", kMachineTable6);
  out += "\tchain output {\n";
  out += "\t\ttype filter hook output priority 0; policy accept;\n";
  out += "\t\t# only what a walled principal's socket sends is judged, as in inet fy_wall\n";
  for (const IdRange& r : walled) {
    out += fmt::format("\t\tmeta skuid {} jump walled\n", format_id_range(r));
  }
  out += "\t}\n";
  out += "\tchain walled {\n";
  if (m.dns_forwarder) {
    // fy-dnsfwd listens on IPv4 only, and its redirect is IPv4's: a :53 on
    // IPv6 loopback (a root stub on [::1]) would be a deputy the redirect
    // misses. Refused at once, so a resolver library moves on to its IPv4
    // nameserver, which is redirected.
    out += "\t\t# DNS only through fy-dnsfwd, on IPv4: every IPv6 :53 is refused\n";
    out += "\t\tudp dport 53 log prefix \"fy-wall-deny6 \" counter reject\n";
    out += "\t\ttcp dport 53 log prefix \"fy-wall-deny6 \" counter reject with tcp reset\n";
  }
  out += "\t\t# IPv6 only on loopback: the walled principals take the IPv4 proxy path\n";
  out += "\t\toifname \"lo\" accept\n";
  out += "\t\tlog prefix \"fy-wall-deny6 \" counter\n";
  out += "\t\treject\n";
  out += "\t}\n";
  out += "}\n";
  return out;
}

std::string render_guard(const GuardSpec& g) {
  const std::string gw = format_ipv4(g.gateway);
  const std::vector<IdRange> walled = g.walled.ranges();
  std::string out;
  out += "# fy-wall guard: the forwarder's own table (ADR-0034, amended). It leaves the\n";
  out += "# machine wall's tables and boot script untouched.\n";
  out += "# Walled: " + describe_walled(g.walled) + ".\n";
  out += "# Apply with `fy-wall apply guard`: this text replaces the table's rules in one\n";
  out += "# transaction, and the policy routes listed at the end are set through netlink.\n";
  out += flush_preamble(guard_tables());
  out += fmt::format("table ip {} {{\n", kGuardTable);
  out += "\t# the walled principals' connections to the daemon ports go to the\n";
  out += "\t# forwarder's VM listener; the destination port is kept\n";
  out += "\tchain to_forwarder {\n";
  out += "\t\ttype nat hook output priority -100; policy accept;\n";
  for (const IdRange& r : walled) {
    for (const PortRange& p : g.ports) {
      out += fmt::format("\t\tmeta skuid {} ip daddr {} tcp dport {} dnat to {}\n",
                         format_id_range(r), gw, format_range(p), format_ipv4(g.listener));
    }
  }
  out += "\t}\n";
  out += "\t# anything of theirs still addressed to the daemon ports is refused: a reject\n";
  out += "\t# in any base chain is final, whatever the machine wall's table accepts\n";
  out += "\tchain guard {\n";
  out += "\t\ttype filter hook output priority 0; policy accept;\n";
  for (const IdRange& r : walled) {
    for (const PortRange& p : g.ports) {
      out += fmt::format(
          "\t\tmeta skuid {} ip daddr {} tcp dport {} log prefix \"fy-guard-deny \" counter "
          "reject with tcp reset\n",
          format_id_range(r), gw, format_range(p));
      out += fmt::format(
          "\t\tmeta skuid {} ip daddr {} udp dport {} log prefix \"fy-guard-deny \" counter "
          "reject\n",
          format_id_range(r), gw, format_range(p));
    }
  }
  out += "\t\t# What a user socket sent has been judged. A packet without one (a TIME_WAIT\n";
  out += "\t\t# or closed socket's ACK, FIN or RST, the kernel's reset for a closed port)\n";
  out += "\t\t# matches no uid rule and no policy route: only conntrack's NAT redirects it.\n";
  out += "\t\t# If conntrack did not put it on a tracked flow (the entry expired, was\n";
  out += "\t\t# replaced or dropped, or the packet is out of its window), it would go to the\n";
  out += "\t\t# host: dropped, whoever's it was. A tracked flow's packets all pass.\n";
  out += "\t\tmeta skuid 0-4294967295 accept\n";
  for (const PortRange& p : g.ports) {
    out += fmt::format(
        "\t\tip daddr {} tcp dport {} ct state invalid,new,untracked log prefix "
        "\"fy-guard-drop \" counter drop\n",
        gw, format_range(p));
  }
  out += "\t}\n";
  out += "}\n";
  out += "# Policy routes (netlink, owned by priority and table): the walled principals'\n";
  out += "# connections to the daemon ports leave through lo, which the machine wall's\n";
  out += "# first rule admits, so the redirect needs no accept rule of its own.\n";
  for (const PolicyRule& r : guard_rules(g)) out += "#   ip rule add " + r.str() + "\n";
  out += fmt::format("#   ip route replace {}/32 dev lo table {}\n", gw, g.route_table);
  return out;
}

std::string render_host(const HostSpec& h) {
  const std::string table = host_table_name(h.vm);
  const std::string cg =
      fmt::format("socket cgroupv2 level {} \"{}\"", cgroup_level(h.cgroup), h.cgroup);
  const std::string mark = format_mark(h.proxy_port_base);
  const std::string local = format_local_mark(h.proxy_port_base);
  std::string out;
  out += fmt::format("# fy-wall host wall for VM '{}': its processes (user {}, uid {}, gid {};\n",
                     h.vm, h.user.name, h.user.uid, h.user.gid);
  out += fmt::format("# cgroup {})\n", h.cgroup);
  out += "# may reach the host's resolvers, and loopback only on the project's port band.\n";
  out += "# Apply with `fy-wall apply host`: this text replaces the table's rules in one\n";
  out += "# transaction. The cgroup must exist when it is applied (nft keys on its id).\n";
  out += flush_preamble(host_tables(h));
  out += fmt::format("table inet {} {{\n", table);
  out += "\tchain output {\n";
  out += "\t\ttype filter hook output priority filter; policy accept;\n";
  out += "\t\t# A socket is the VM's if its file was made by the VM user (uid), wherever the\n";
  out += "\t\t# process runs: one that left the slice, or that a daemon of the same user\n";
  out += "\t\t# started outside it (systemd-run --user, D-Bus activation, cron), is still\n";
  out += "\t\t# its; a set-user-ID program it runs keeps its group (gid); a set-ID program\n";
  out += "\t\t# that changes both stays in its slice, whose ancestors only root can write.\n";
  out += fmt::format("\t\tmeta skuid {} jump vm\n", h.user.uid);
  out += fmt::format("\t\tmeta skgid {} jump vm\n", h.user.gid);
  out += fmt::format("\t\t{} jump vm\n", cg);
  out += "\t}\n";
  out += "\tchain vm {\n";
  out += "\t\t# Replies on flows others opened to the VM's listeners. Not `ct state\n";
  out += "\t\t# established`, as the reference wrote: conntrack entries are keyed by\n";
  out += "\t\t# address and port, not owner, so a VM socket bound to the port of another\n";
  out += "\t\t# process's finished exchange met its entry and got out, and a flow opened\n";
  out += "\t\t# before the wall stayed open (docs/wall-escapes.md). The VM's own flows\n";
  out += "\t\t# meet the rules below on every packet.\n";
  out += "\t\tct direction reply accept\n";
  out += "\t\t# DNS only to the host's own resolvers (its resolv.conf): port 53 to anywhere\n";
  out += "\t\t# carried any protocol to any host\n";
  for (const std::string& r : h.resolvers) {
    const char* fam = r.find(':') == std::string::npos ? "ip" : "ip6";
    out += fmt::format("\t\t{} daddr {} udp dport 53 accept\n", fam, r);
    out += fmt::format("\t\t{} daddr {} tcp dport 53 accept\n", fam, r);
  }
  out += "\t\t# a loopback flow the input chain admitted to one of the VM's own listeners\n";
  out += fmt::format("\t\toif \"lo\" ct mark {} accept\n", local);
  out += "\t\t# any other loopback packet is marked as the project's and judged on input\n";
  out += fmt::format("\t\toif \"lo\" ct mark set {} accept\n", mark);
  out += "\t\tmeta l4proto tcp counter reject with tcp reset\n";
  out += "\t\tcounter reject with icmpx type admin-prohibited\n";
  out += "\t}\n";
  out += "\tchain input {\n";
  out += "\t\ttype filter hook input priority filter; policy accept;\n";
  out += fmt::format("\t\tiif \"lo\" ct mark {} jump lo\n", mark);
  out += "\t}\n";
  out += "\tchain lo {\n";
  out += "\t\t# replies to the VM's loopback flows; its own packets are judged every time\n";
  out += "\t\tct direction reply accept\n";
  out += "\t\t# the VM's own listeners: marked at the first packet, because the packet that\n";
  out += "\t\t# completes a TCP handshake meets a request socket, which has no cgroup\n";
  out += fmt::format("\t\t{} ct mark set {} accept\n", cg, local);
  out += "\t\t# the project's port band\n";
  for (const PortRange& p : h.ports) {
    out += fmt::format("\t\ttcp dport {} accept\n", format_range(p));
  }
  out += "\t\tmeta l4proto tcp counter reject with tcp reset\n";
  out += "\t\tcounter reject with icmpx type admin-prohibited\n";
  out += "\t}\n";
  out += "}\n";
  return out;
}

std::string render_remove(const std::vector<TableRef>& tables) {
  std::string out;
  for (const TableRef& t : tables)
    out += fmt::format("table {}\ndelete table {}\n", t.str(), t.str());
  return out;
}

std::vector<std::string> rendered_chains(const std::string& text, const TableRef& table) {
  std::vector<std::string> out;
  const std::string open = fmt::format("table {} {{\n", table.str());
  size_t at = text.find(open);
  if (at == std::string::npos) return out;
  size_t end = text.find("\n}\n", at);
  std::string_view body(text.data() + at, (end == std::string::npos ? text.size() : end) - at);
  size_t pos = 0;
  while ((pos = body.find("\n\tchain ", pos)) != std::string_view::npos) {
    pos += 8;
    size_t sp = body.find(' ', pos);
    out.emplace_back(body.substr(pos, sp - pos));
  }
  return out;
}

std::string PolicyRule::str() const {
  return fmt::format("priority {} uidrange {}-{} to {}/32 ipproto tcp dport {} lookup {}", priority,
                     uids.lo, uids.hi, format_ipv4(to), format_range(dport), table);
}

std::vector<PolicyRule> guard_rules(const GuardSpec& g) {
  std::vector<PolicyRule> out;
  for (const IdRange& ids : g.walled.ranges()) {
    for (const PortRange& p : g.ports) {
      out.push_back(PolicyRule{ids, p, g.gateway, g.route_table, g.rule_priority});
    }
  }
  return out;
}

const std::vector<BlockedFamily>& blocked_families() {
  static const std::vector<BlockedFamily> v = {
      {"net-pf-33", "rxrpc", "AF_RXRPC: sends through the kernel's UDP socket"},
      {"net-pf-21", "rds", "AF_RDS: rds_tcp carries it on kernel TCP connections"},
      {"net-pf-30", "tipc", "AF_TIPC: a UDP bearer sends through a kernel socket"},
      {"net-pf-43", "smc", "AF_SMC: its CLC handshake is a kernel TCP socket"},
      {"net-pf-41", "kcm", "AF_KCM: multiplexes over attached TCP sockets"},
      {"net-pf-29", "can", "AF_CAN: a bus, not in a VM"},
      {"net-pf-42", "qrtr", "AF_QRTR: Qualcomm IPC router, not in a VM"},
      {"net-pf-45", "mctp", "AF_MCTP: management bus transport"},
      {"net-pf-36", "ieee802154", "AF_IEEE802154: a radio link layer"},
      {"net-pf-31", "bluetooth", "AF_BLUETOOTH: no radio in a VM"},
      {"net-pf-35", "phonet", "AF_PHONET: a modem link layer"},
      {"net-pf-37", "caif", "AF_CAIF: a modem link layer"},
      {"net-pf-39", "nfc", "AF_NFC: no radio in a VM"},
      {"net-pf-3", "ax25", "AF_AX25: amateur radio"},
      {"net-pf-6", "netrom", "AF_NETROM: amateur radio"},
      {"net-pf-11", "rose", "AF_ROSE: amateur radio"},
      {"net-pf-9", "x25", "AF_X25: a legacy WAN link layer"},
      {"net-pf-5", "appletalk", "AF_APPLETALK: a legacy network layer, not IP"},
      {"net-pf-4", "ipx", "AF_IPX: a legacy network layer, not IP"},
      {"net-pf-8", "atm", "AF_ATMPVC: no ATM in a VM"},
      {"net-pf-20", "atm", "AF_ATMSVC: no ATM in a VM"},
      {"net-pf-24", "pppoe", "AF_PPPOX: PPPoE and L2TP sessions, kernel-sent frames"},
      {"net-pf-15", "af_key", "AF_KEY: IPsec keys (root only, but a kernel sender)"},
      {"net-pf-2-proto-132", "sctp", "SCTP: not named by any wall rule"},
      {"net-pf-10-proto-132", "sctp", "SCTP over IPv6"},
      {"net-pf-2-proto-33", "dccp", "DCCP (gone from kernel 6.16)"},
      {"net-pf-10-proto-33", "dccp", "DCCP over IPv6"},
      {"net-pf-2-proto-115", "l2tp_ip", "L2TP over IP: kernel-sent tunnels"},
      {"net-pf-10-proto-115", "l2tp_ip6", "L2TP over IPv6"},
  };
  return v;
}

std::string render_families() {
  std::string out;
  out += "# fy-wall: socket families a foldyard guest never needs (`fy-wall render families`).\n";
  out += "# Most send through kernel sockets, which have no socket file, so the machine\n";
  out += "# wall's uid rules cannot say whose their packets are; its ownerless chain\n";
  out += "# drops their new flows, and this file keeps the kernel from loading them at\n";
  out += "# all: `install ALIAS /bin/false` fails socket()'s autoload (kmod looks\n";
  out += "# install commands up by the name asked for, before modules.alias), and\n";
  out += "# `install MODULE /bin/false` an explicit modprobe.\n";
  out += "# vsock is not here: Lima's vz driver carries the guest agent over it.\n";
  std::vector<std::string> modules;
  for (const BlockedFamily& f : blocked_families()) {
    out += fmt::format("# {}\ninstall {} /bin/false\n", f.why, f.alias);
    if (std::find(modules.begin(), modules.end(), f.module) == modules.end()) {
      modules.push_back(f.module);
      out += fmt::format("install {} /bin/false\n", f.module);
    }
  }
  return out;
}

std::string describe_machine(const MachineSpec& m) {
  const std::string dns = m.dns_forwarder
                              ? "every :53 redirected to fy-dnsfwd at " + format_ipv4(m.dns_forwarder)
                              : "DNS to " + format_cidrs(m.resolvers);
  return fmt::format("{} default-deny; open: lo, {}, {} tcp {{{}}}; v6: lo only{}",
                     describe_walled(m.walled), dns, format_ipv4(m.gateway),
                     format_ports(m.ports), m.dns_forwarder ? ", :53 refused" : "");
}

std::string describe_guard(const GuardSpec& g) {
  return fmt::format(
      "{}: {} tcp {{{}}} redirected to {} (port kept) through lo; direct "
      "connections refused",
      describe_walled(g.walled), format_ipv4(g.gateway), format_ports(g.ports),
      format_ipv4(g.listener));
}

std::string describe_host(const HostSpec& h) {
  std::string dns;
  for (const std::string& r : h.resolvers) dns += (dns.empty() ? "" : ", ") + r;
  return fmt::format(
      "user {} (uid {}, gid {}) and cgroup {} may reach DNS at {} and loopback tcp {{{}}} (ct "
      "mark {})",
      h.user.name, h.user.uid, h.user.gid, h.cgroup, dns, format_ports(h.ports),
      format_mark(h.proxy_port_base));
}

}  // namespace fy::wall

// Unit tests for fy-wall's parsers, config reader and renderers: the pure
// parts, without nftables, netlink or the passwd database (those are proven
// by the namespace tests beside this file).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <optional>
#include <string>

#include "wall/config.h"
#include "wall/coverage.h"
#include "wall/dns.h"
#include "wall/parse.h"
#include "wall/render.h"
#include "wall/vmuser.h"

using namespace fy::wall;

namespace {

std::string err(const fy::Error& e) {
  return e.message;
}

MachineSpec machine() {
  MachineSpec m;
  m.walled = Principal{4242, "fywalice", {{100000, 165535}}};
  m.gateway = *parse_ipv4("192.168.5.2");
  m.ports = *parse_ports("41000-41089, 41100-41189");
  m.resolvers = *parse_cidrs(kPrivateRanges);
  m.forward_allow = *parse_cidrs(kPrivateRanges);
  return m;
}

}  // namespace

TEST_CASE("ports: single ports, ranges, sorted, overlaps and bounds refused") {
  auto p = parse_ports(" 41100-41189 ,41000, 42000-42000");
  REQUIRE(p.ok());
  CHECK(format_ports(*p) == "41000, 41100-41189, 42000");
  CHECK(err(parse_ports("41000-41089,41089").error()).find("overlap") != std::string::npos);
  CHECK(err(parse_ports("0").error()).find("out of range (1..65535)") != std::string::npos);
  CHECK(err(parse_ports("65536").error()).find("out of range") != std::string::npos);
  CHECK(err(parse_ports("2-1").error()).find("runs backwards") != std::string::npos);
  CHECK_FALSE(parse_ports("").ok());
  CHECK_FALSE(parse_ports("1-2-3").ok());
  CHECK_FALSE(parse_ports("+5").ok());
  CHECK_FALSE(parse_ports(std::vector<std::string>{"1,2"}).ok());  // one per element
  CHECK(parse_ports(std::vector<std::string>{"1", "3-4"}).ok());
}

TEST_CASE("IPv4 addresses: dotted quad, no leading zeros, nothing else") {
  CHECK(*parse_ipv4("192.168.5.2") == 0xc0a80502u);
  CHECK(*parse_ipv4("0.0.0.0") == 0u);
  CHECK(*parse_ipv4("255.255.255.255") == 0xffffffffu);
  for (const char* bad : {"", "1.2.3", "1.2.3.4.", "01.2.3.4", "1.2.3.256", "1.2.3.-4", "1..2.3",
                          "a.b.c.d", "1.2.3.4 ", "::1", "1.2.3.4/8"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_ipv4(bad).ok());
  }
  CHECK(format_ipv4(0xc0a80502u) == "192.168.5.2");
}

TEST_CASE("prefixes: host bits, lengths, overlaps") {
  auto c = parse_cidr4("10.0.0.0/8");
  REQUIRE(c.ok());
  CHECK(c->prefix == 8);
  CHECK(format_cidr(*parse_cidr4("127.0.0.53")) == "127.0.0.53");
  CHECK(format_cidr(*parse_cidr4("0.0.0.0/0")) == "0.0.0.0/0");
  CHECK(err(parse_cidr4("10.0.0.1/8").error()).find("write 10.0.0.0/8") != std::string::npos);
  CHECK_FALSE(parse_cidr4("10.0.0.0/33").ok());
  CHECK_FALSE(parse_cidr4("10.0.0.0/").ok());
  CHECK_FALSE(parse_cidr4("10.0.0.0/008").ok());
  CHECK(err(parse_cidrs("10.0.0.0/8, 10.9.0.0/16").error()).find("overlap") != std::string::npos);
  CHECK(format_cidrs(*parse_cidrs(kPrivateRanges)) ==
        "127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16");
}

TEST_CASE("users: names and uids") {
  CHECK(parse_user("alice")->name == "alice");
  CHECK(parse_user("1000")->numeric);
  CHECK(parse_user("1000")->uid == 1000u);
  CHECK(parse_user("machine$")->name == "machine$");
  CHECK_FALSE(parse_user("").ok());
  CHECK_FALSE(parse_user("-rf").ok());
  CHECK_FALSE(parse_user("a b").ok());
  CHECK_FALSE(parse_user("a$b").ok());
  CHECK_FALSE(parse_user("4294967295").ok());
}

TEST_CASE("coverage: every place the rendering keys on the walled uids, held to the live one") {
  MachineSpec m;
  m.walled = Principal{4242, "fywalice", {{100000, 165535}, {300000, 365535}}};
  m.gateway = *parse_ipv4("192.168.5.2");
  m.ports = *parse_ports("41000-41089");
  m.resolvers = *parse_cidrs("192.168.5.2");
  m.forward_allow = *parse_cidrs(kPrivateRanges);
  m.dns_forwarder = *parse_ipv4("127.42.0.53");
  const std::string both = render_machine(m);
  auto places = skuid_places(both);
  // output's jump in inet and ip6 (one key: the same text), dns_redirect's udp and tcp.
  REQUIRE(places.size() == 3);
  CHECK(places.count("chain output: meta skuid * jump walled") == 1);
  CHECK(places["chain output: meta skuid * jump walled"].size() == 6);
  // The "anyone else" rule is no place.
  for (const auto& [k, v] : places) CHECK(k.find("accept") == std::string::npos);
  CHECK(skuid_gaps(m.walled.ranges(), both, both).empty());
  // A wall applied before the second line: that range is missing everywhere.
  MachineSpec first = m;
  first.walled.subuids.pop_back();
  auto gaps = skuid_gaps(m.walled.ranges(), both, render_machine(first));
  REQUIRE(gaps.size() == 3);
  for (const Gap& g : gaps) CHECK(g.missing == std::vector<IdRange>{{300000, 365535}});
  // A place the live table lacks misses every walled uid.
  MachineSpec plain = m;
  plain.dns_forwarder = 0;
  gaps = skuid_gaps(m.walled.ranges(), both, render_machine(plain));
  REQUIRE(gaps.size() == 2);
  CHECK(gaps[0].missing.size() == 3);

  GuardSpec g;
  g.walled = m.walled;
  g.gateway = m.gateway;
  g.ports = *parse_ports("41000-41089,41100-41189");
  g.listener = *parse_ipv4(kDefaultListener);
  g.route_table = kDefaultRouteTable;
  g.rule_priority = kDefaultRulePriority;
  GuardSpec gfirst = g;
  gfirst.walled.subuids.pop_back();
  CHECK(skuid_places(render_guard(g)).size() == 6);  // nat per band, tcp and udp refusals
  CHECK(skuid_gaps(g.walled.ranges(), render_guard(g), render_guard(gfirst)).size() == 6);
  auto rg = rule_gaps(g.walled.ranges(), guard_rules(g), guard_rules(gfirst));
  REQUIRE(rg.size() == 2);
  CHECK(rg[0].missing == std::vector<IdRange>{{300000, 365535}});
  CHECK(rule_gaps(g.walled.ranges(), guard_rules(g), guard_rules(g)).empty());
}

TEST_CASE("host wall names: nft-safe table, cgroup paths and levels") {
  CHECK(host_table_name("my-vm+2") == "fy_host_wall_my_vm_2");
  CHECK(host_table_name("a.b/c_D9") == "fy_host_wall_a.b/c_D9");
  CHECK(*parse_cgroup_path("/user.slice/fy.slice/") == "user.slice/fy.slice");
  CHECK(cgroup_level("user.slice/fy.slice") == 2);
  CHECK(cgroup_level("a") == 1);
  CHECK_FALSE(parse_cgroup_path("a//b").ok());
  CHECK_FALSE(parse_cgroup_path("a/../b").ok());
  CHECK_FALSE(parse_cgroup_path("a/\"b").ok());
  CHECK_FALSE(parse_cgroup_path("a/fy\\x2dm.slice").ok());
  CHECK_FALSE(parse_cgroup_path("//").ok());
  CHECK_FALSE(parse_vm_name("a b").ok());
  CHECK_FALSE(parse_vm_name(std::string(65, 'a')).ok());
  CHECK(format_mark(41000) == "0xf400a028");
  CHECK(format_local_mark(41000) == "0xf401a028");
  CHECK(format_local_mark(65535) == "0xf401ffff");
}

TEST_CASE("config: sections, types, unknown keys, file:line errors") {
  auto s = read_config(
      "[machine]\nuser = 1000\ngateway = \"192.168.5.2\"\nports = \"41000-41089\"\n"
      "[guard]\nroute_table = 100\n[host]\nvm = \"dev\"\ncgroup = \"a/b\"\n"
      "ports = [\"41000-41199\"]\nuser = \"fywvm\"\n",
      "t.toml");
  REQUIRE(s.ok());
  CHECK(s->has_machine);
  CHECK(s->machine.user->value.uid == 1000u);
  CHECK(s->machine.gateway->where == "t.toml:3:11");
  CHECK(guard_route_ids(*s) == std::pair<uint32_t, uint32_t>{100, kDefaultRulePriority});
  Env env;
  env.resolv_conf = "nameserver 127.0.0.53\n";
  std::string asked_where;
  env.resolve_vm_user = [&](const UserRef& u, const std::string& where) -> fy::Result<VmUser> {
    asked_where = where;
    return VmUser{u.name, 4646, 4647};
  };
  auto h = host_spec(*s, env);
  REQUIRE(h.ok());
  CHECK(h->proxy_port_base == 41000);
  CHECK(h->resolvers == std::vector<std::string>{"127.0.0.53"});
  CHECK(h->user.uid == 4646);
  CHECK(h->user.gid == 4647);
  CHECK(asked_where == "t.toml:11:8");
  // No default for the VM user: not SUDO_UID, not FY_WALL_UID.
  Settings no_user = *s;
  no_user.host.user.reset();
  env.sudo_uid = "1000";
  CHECK(err(host_spec(no_user, env).error()).find("t.toml: [host].user is not set") == 0);

  auto bad = read_config("[machine]\nports = [\"1\", 2]\nuser = true\nwhat = 1\n[x]\n", "b.toml");
  REQUIRE_FALSE(bad.ok());
  const std::string& m = bad.error().message;
  CHECK(m.find("b.toml:2:15: [machine].ports[1]: expected a string") != std::string::npos);
  CHECK(m.find("b.toml:3:8: [machine].user: expected a login name or a uid") != std::string::npos);
  CHECK(m.find("b.toml:4:8: unknown key 'what' in [machine]") != std::string::npos);
  CHECK(m.find("unknown key 'x' in the top level") != std::string::npos);
  CHECK(read_config("not toml = = 1", "c.toml").error().message.find("c.toml:1:") == 0);
}

TEST_CASE("flags: override the config, and belong to one wall") {
  Settings s;
  Flags f;
  f.ports = "41000";
  f.gateway = "192.168.5.2";
  REQUIRE(apply_flags(s, Wall::machine, f).ok());
  CHECK(s.machine.ports->where == "--ports");
  Flags g;
  g.vm = "dev";
  CHECK(err(apply_flags(s, Wall::machine, g).error()).find("--vm belongs to the host wall") !=
        std::string::npos);
  Flags r;
  r.route_table = "254";
  CHECK(err(apply_flags(s, Wall::guard, r).error()).find("reserved") != std::string::npos);
  r.route_table = "x";
  CHECK_FALSE(apply_flags(s, Wall::guard, r).ok());
  Flags l;
  l.listener = "10.0.0.1";
  CHECK_FALSE(apply_flags(s, Wall::guard, l).ok());
  Flags p;
  p.rule_priority = "32766";
  CHECK_FALSE(apply_flags(s, Wall::guard, p).ok());
  Flags u;  // the host wall takes a user (its VM user), not a gateway
  u.user = "fywvm";
  REQUIRE(apply_flags(s, Wall::host, u).ok());
  CHECK(s.host.user->where == "--user");
  u.gateway = "192.168.5.2";
  CHECK(err(apply_flags(s, Wall::host, u).error()).find("--gateway belongs to the machine") !=
        std::string::npos);
}

TEST_CASE("render: one value per rule, flushing preamble, walled chain first") {
  std::string t = render_machine(machine());
  CHECK(t.find("table inet fy_wall\nflush table inet fy_wall\n") != std::string::npos);
  CHECK(t.find("flush ruleset") == std::string::npos);
  CHECK(t.find("meta skuid 4242 jump walled\n\t\tmeta skuid 100000-165535 jump walled") !=
        std::string::npos);
  CHECK(t.find("ip daddr 192.168.5.2 tcp dport 41100-41189 accept") != std::string::npos);
  std::string rules;  // the text without its comments
  for (size_t at = 0; at < t.size();) {
    size_t nl = t.find('\n', at);
    std::string line = t.substr(at, nl - at);
    at = nl == std::string::npos ? t.size() : nl + 1;
    if (line.find_first_not_of('\t') != std::string::npos &&
        line[line.find_first_not_of('\t')] != '#') {
      rules += line + "\n";
    }
  }
  // Never the reference's `ct state established` accept; the one established
  // rule is the ownerless chain's, for packets without a socket file.
  CHECK(rules.find("ct state established accept") == std::string::npos);
  CHECK(rules.find("ct state established,related") == std::string::npos);
  CHECK(rules.find("ct state established meta l4proto tcp tcp flags & syn == 0 accept") <
        rules.find("chain walled"));
  CHECK(rules.find("{ ") == std::string::npos);  // no anonymous sets
  CHECK(rendered_chains(t, {"inet", "fy_wall"}) ==
        std::vector<std::string>{"output", "ownerless", "walled", "forward"});
  CHECK(rendered_chains(t, {"ip6", "fy_wall6"}) == std::vector<std::string>{"output", "walled"});
  CHECK(render_remove(machine_tables()) ==
        "table inet fy_wall\ndelete table inet fy_wall\ntable ip6 fy_wall6\n"
        "delete table ip6 fy_wall6\n");
}

TEST_CASE("host render: replies only, every VM packet judged, the local mark") {
  HostSpec h;
  h.vm = "dev";
  h.cgroup = "fy.slice/fy-machine-dev.slice";
  h.ports = *parse_ports("41000-41089, 41100-41189");
  h.proxy_port_base = 41000;
  h.user = VmUser{"fywvm", 4646, 4647};
  std::string t = render_host(h);
  std::string rules;  // the text without its comments
  for (size_t at = 0; at < t.size();) {
    size_t nl = t.find('\n', at);
    std::string line = t.substr(at, nl - at);
    at = nl == std::string::npos ? t.size() : nl + 1;
    size_t first = line.find_first_not_of('\t');
    if (first != std::string::npos && line[first] != '#') rules += line + "\n";
  }
  CHECK(rules.find("ct state") == std::string::npos);
  CHECK(rules.find("{ ") == std::string::npos);  // no anonymous sets
  // The VM user's uid and gid, then its slice: any of the three makes a socket the VM's.
  CHECK(rules.find("\tchain output {\n\t\ttype filter hook output priority filter; policy "
                   "accept;\n\t\tmeta skuid 4646 jump vm\n\t\tmeta skgid 4647 jump vm\n"
                   "\t\tsocket cgroupv2 level 2 \"fy.slice/fy-machine-dev.slice\" jump vm\n"
                   "\t}\n") != std::string::npos);
  // Both judging chains start with replies; the VM's own packets meet the rest.
  CHECK(rules.find("\tchain vm {\n\t\tct direction reply accept\n") != std::string::npos);
  CHECK(rules.find("\tchain lo {\n\t\tct direction reply accept\n") != std::string::npos);
  // A flow admitted to the VM's own listener passes before loopback is marked.
  size_t local = rules.find("\t\toif \"lo\" ct mark 0xf401a028 accept\n");
  size_t mark = rules.find("\t\toif \"lo\" ct mark set 0xf400a028 accept\n");
  REQUIRE(local != std::string::npos);
  REQUIRE(mark != std::string::npos);
  CHECK(local < mark);
  CHECK(rules.find("socket cgroupv2 level 2 \"fy.slice/fy-machine-dev.slice\" ct mark set "
                   "0xf401a028 accept\n") != std::string::npos);
  CHECK(rules.find("\t\ttcp dport 41100-41189 accept\n") != std::string::npos);
  CHECK(rendered_chains(t, {"inet", "fy_host_wall_dev"}) ==
        std::vector<std::string>{"output", "vm", "input", "lo"});
}

TEST_CASE("guard: the rule product and its routes") {
  GuardSpec g;
  g.walled = Principal{4242, "fywalice", {{100000, 165535}}};
  g.gateway = *parse_ipv4("192.168.5.2");
  g.ports = *parse_ports("41000-41089,41100-41189");
  g.listener = *parse_ipv4(kDefaultListener);
  g.route_table = 4747;
  g.rule_priority = 4747;
  auto rules = guard_rules(g);
  REQUIRE(rules.size() == 4);
  CHECK(rules[3].str() ==
        "priority 4747 uidrange 100000-165535 to 192.168.5.2/32 ipproto tcp dport "
        "41100-41189 lookup 4747");
  std::string t = render_guard(g);
  CHECK(t.find("meta skuid 4242 ip daddr 192.168.5.2 tcp dport 41000-41089 dnat to 127.42.0.1") !=
        std::string::npos);
  CHECK(t.find("#   ip route replace 192.168.5.2/32 dev lo table 4747") != std::string::npos);
}

TEST_CASE("resolv.conf: the nameservers, canonical, malformed lines skipped") {
  auto v = parse_resolv_conf(
      "# c\nsearch x\nnameserver 10.0.0.1\n nameserver\t192.168.5.3 # x\nnameserver 999.1.1.1\n"
      "nameserver fd00:0::3\nnameserver\nnameserverx 1.2.3.4\nnameserver 10.0.0.1\n"
      "nameserver 127.0.0.53");
  CHECK(v == std::vector<std::string>{"10.0.0.1", "192.168.5.3", "fd00::3", "127.0.0.53"});
  CHECK(parse_resolv_conf("").empty());
  // The machine wall: IPv4, not loopback; none left means Lima's resolver.
  auto m = default_machine_resolvers("nameserver 127.0.0.53\nnameserver fd00::3\n");
  REQUIRE(m.size() == 1);
  CHECK(format_cidr(m[0]) == "192.168.5.3");
  m = default_machine_resolvers("nameserver 10.255.255.53\nnameserver 127.0.0.1\n");
  REQUIRE(m.size() == 1);
  CHECK(format_cidr(m[0]) == "10.255.255.53");
  // The host wall: every nameserver, else libc's default.
  CHECK(default_host_resolvers("") == std::vector<std::string>{"127.0.0.1"});
  CHECK(default_host_resolvers("nameserver ::1\n") == std::vector<std::string>{"::1"});
}

TEST_CASE("/proc/net listeners: LISTEN and bound UDP, addresses in the kernel's word order") {
  const char* tcp =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n"
      "   0: 0100007F:0438 00000000:0000 0A 00000000:00000000 00:00000000 00000000  4343 "
      "       0 1 1 0000000000000000 100 0 0 10 0\n"
      "   1: 0F05A8C0:A2F2 0205A8C0:0035 01 00000000:00000000 00:00000000 00000000  4242 "
      "       0 2 1\n"
      "   2: garbage\n"
      "   3: 3500007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 "
      "       0 3 1\n";
  auto v = parse_proc_net_listeners(tcp, "tcp", false);
  REQUIRE(v.size() == 2);
  CHECK(v[0] == Listener{"tcp", "127.0.0.1", 1080, 4343});
  CHECK(v[1] == Listener{"tcp", "127.0.0.53", 53, 0});
  const char* tcp6 =
      "  sl  local_address                         remote_address                        st "
      "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A "
      "00000000:00000000 00:00000000 00000000   998        0 4 1\n";
  auto w = parse_proc_net_listeners(tcp6, "tcp", true);
  REQUIRE(w.size() == 1);
  CHECK(w[0] == Listener{"tcp", "::1", 8080, 998});
  const char* udp =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode ref pointer drops\n"
      "  1: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000   104 "
      "       0 5 2 0 0\n";
  auto u = parse_proc_net_listeners(udp, "udp", false);
  REQUIRE(u.size() == 1);
  CHECK(u[0] == Listener{"udp", "0.0.0.0", 5353, 104});
}

namespace {
std::vector<uint8_t> dns_query(const std::string& name, uint16_t qtype = 1, uint16_t flags = 0x0100,
                               bool opt = false) {
  std::vector<uint8_t> w = {0x12, 0x34, uint8_t(flags >> 8), uint8_t(flags), 0, 1, 0, 0, 0, 0,
                            0, uint8_t(opt ? 1 : 0)};
  size_t at = 0;
  while (at < name.size()) {
    size_t dot = name.find('.', at);
    if (dot == std::string::npos) dot = name.size();
    w.push_back(uint8_t(dot - at));
    for (size_t i = at; i < dot; ++i) w.push_back(uint8_t(name[i]));
    at = dot + 1;
  }
  w.push_back(0);
  w.insert(w.end(), {uint8_t(qtype >> 8), uint8_t(qtype), 0, 1});
  if (opt) w.insert(w.end(), {0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0});
  return w;
}
}  // namespace

TEST_CASE("dns: one standard query, strictly; anything else is refused with its reason") {
  using namespace fy::wall::dns;
  auto w = dns_query("WWW.Example.com", 28, 0x0100, true);
  auto q = parse_query(w);
  REQUIRE(q.ok());
  CHECK(q->id == 0x1234);
  CHECK(q->name == "www.example.com");
  CHECK(q->qtype == 28);
  CHECK(q->edns);
  CHECK(parse_query(dns_query("")).ok());  // the root

  auto refused = [](std::vector<uint8_t> b, const char* why) {
    auto r = parse_query(b);
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.error().message.find(why) != std::string::npos, r.error().message);
  };
  const std::string ssh = "SSH-2.0-OpenSSH_9.2\r\n";
  refused(std::vector<uint8_t>(ssh.begin(), ssh.end()), "");
  refused(dns_query("example.com", 1, 0x8180), "QR set");
  refused(dns_query("example.com", 1, 0x2800), "opcode 5");
  refused(dns_query("example.com", 1, 0x0300), "TC set");
  refused(dns_query("exa mple.com"), "byte 0x20 in a label");
  refused(dns_query(std::string(64, 'a') + ".com"), "label type 0x40");
  std::string long_name;
  for (int i = 0; i < 5; ++i) long_name += std::string(60, 'a') + ".";
  refused(dns_query(long_name + "com"), "longer than 253");
  auto b = dns_query("example.com");
  b.push_back(0);
  refused(b, "1 bytes after the question");
  b = dns_query("example.com");
  b[b.size() - 1] = 3;  // class CH
  refused(b, "class 3");
  b = dns_query("example.com");
  b[12] = 0xC0;  // a pointer
  refused(b, "label type 0xc0");
  b = dns_query("example.com");
  b[5] = 2;
  refused(b, "QDCOUNT 2");
  b = dns_query("example.com");
  b[7] = 1;
  refused(b, "answer or authority");
  refused(std::vector<uint8_t>(600, 0), "at most 512");
  b = dns_query("example.com", 1, 0x0100, true);
  b[b.size() - 9] = 40;  // not OPT
  refused(b, "not an EDNS OPT");
}

TEST_CASE("dns: names the policy allows, and the forwarder's own answer") {
  using namespace fy::wall::dns;
  const std::vector<std::string> allow = {"example.com", "github.com"};
  CHECK(name_allowed("example.com", allow));
  CHECK(name_allowed("api.github.com", allow));
  CHECK_FALSE(name_allowed("badexample.com", allow));
  CHECK_FALSE(name_allowed("com", allow));
  CHECK_FALSE(name_allowed("mzxw6ytboi.c2.attacker.test", allow));
  CHECK_FALSE(name_allowed("x", {""}));
  auto w = dns_query("t.attacker.test", 16, 0x0100, true);
  auto q = parse_query(w);
  REQUIRE(q.ok());
  auto a = local_answer(w, *q, 5);
  CHECK(a.size() == q->question_end);
  CHECK(a[0] == 0x12);
  CHECK(a[2] == 0x81);  // QR, RD kept
  CHECK(a[3] == 0x85);  // RA, REFUSED
  CHECK(a[11] == 0);    // the OPT record is not echoed
}

TEST_CASE("the VM user: subordinate ids, nsswitch, the checks in order") {
  VmUserSources src;
  std::vector<PasswdEntry> users = {
      {"fyvm", 4646, 4646}, {"alice", 1000, 1000}, {"rootgrp", 4700, 0}, {"fyvm2", 4646, 4646}};
  src.find = [&](const UserRef& u) -> fy::Result<std::optional<PasswdEntry>> {
    for (const PasswdEntry& e : users)
      if (u.numeric ? e.uid == u.uid : e.name == u.name) return std::optional<PasswdEntry>(e);
    return std::optional<PasswdEntry>();
  };
  src.all = [&] { return users; };
  // core/subid's reading of these texts, as read() reads the files.
  std::string subuid, subgid, nsswitch;
  src.subids = [&](fy::subid::Kind k, const fy::subid::Owner& who, const std::string& path) {
    auto name_to_uid = [&](const std::string& login) -> std::optional<uint32_t> {
      for (const PasswdEntry& e : users)
        if (e.name == login) return e.uid;
      return std::nullopt;
    };
    return fy::subid::from_texts(k, who, nsswitch, "/etc/nsswitch.conf",
                                 k == fy::subid::Kind::uid ? subuid : subgid, path, name_to_uid);
  };
  auto named = [](const char* n) { return UserRef{false, 0, n}; };
  auto why = [&](const char* n) {
    auto r = resolve_vm_user(named(n), "--user", src);
    return r ? std::string() : r.error().message;
  };
  auto ok = resolve_vm_user(UserRef{true, 4646, ""}, "--user", src);
  REQUIRE(ok.ok());
  CHECK(ok->name == "fyvm");
  CHECK(ok->gid == 4646);
  CHECK(why("nobody").find("--user: the VM user 'nobody' has no passwd entry") == 0);
  users.push_back({"root", 0, 0});
  CHECK(why("root").find("the VM user is root (uid 0)") != std::string::npos);
  CHECK(why("rootgrp").find("has primary group 0 (root)") != std::string::npos);
  users.push_back({"share", 4800, 4646});
  CHECK(why("fyvm").find("gid 4646, the primary group of the VM user 'fyvm', is also the primary "
                         "group of 'share' (uid 4800)") != std::string::npos);
  users.pop_back();
  subuid = "alice:100000:65536\nfyvm:200000:65536\n";
  CHECK(why("fyvm").find("/etc/subuid:2: the VM user 'fyvm' has subordinate uids") == 0);
  CHECK(why("fyvm").find("(usermod --del-subuids 200000-265535 fyvm)") != std::string::npos);
  // Every line keyed to it: by name, by uid, by another name of its uid, and
  // lines that grant nothing (COUNT 0, a CRLF line) too. Comments and lines
  // newuidmap does not parse are not keyed to it.
  subuid = "4646:7:0\n#fyvm:1:1\nfyvm\nfyvm2:9:1\nfyvm:5:5\r\n";
  CHECK(why("fyvm").find("/etc/subuid:1,4,5: ") == 0);
  CHECK(why("fyvm").find("remove every line naming 'fyvm' or 4646 (or another login name of "
                         "uid 4646)") != std::string::npos);
  CHECK(why("fyvm").find("usermod") == std::string::npos);  // not every line has a range
  subuid = "fyvm:300000:10\n4646:400000:5\n";
  CHECK(
      why("fyvm").find("(usermod --del-subuids 300000-300009 --del-subuids 400000-400004 fyvm)") !=
      std::string::npos);
  // START 0 COUNT 0 grants every id (shadow's wrap): core refuses it outright.
  subuid = "fyvm:0:0\n";
  CHECK(why("fyvm").find("/etc/subuid:1: the line 'fyvm:0:0' grants 'fyvm' id 0") == 0);
  CHECK(why("fyvm").find("the host wall's VM user 'fyvm' must have no subordinate uids") !=
        std::string::npos);
  subuid = "";
  subgid = "fyvm:300000:10\n";
  CHECK(why("fyvm").find("/etc/subgid:1: the VM user 'fyvm' has subordinate gids — newgidmap") ==
        0);
  subgid = "";
  nsswitch = "passwd: files\nsubid: sss\n";
  CHECK(why("fyvm").find("/etc/nsswitch.conf:2: 'subid: sss' — newuidmap asks the NSS module") ==
        0);
  CHECK(
      why("fyvm").find("must have no subordinate uids, and fy-wall cannot tell that it has none") !=
      std::string::npos);
  nsswitch = "passwd: files\nsubid: files\n";  // the files decide, and they name no line
  CHECK(why("fyvm").empty());
  src.subids = nullptr;
  CHECK(why("fyvm").find("no reader of subordinate ids") != std::string::npos);
}

TEST_CASE("the VM user's tasks: /proc status and cgroup, ancestors, who may write") {
  auto t = parse_proc_status(
      "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t4646\t4343\t4343\t4343\n"
      "Gid:\t4646\t4646\t4646\t4646\nGroups:\t\n");
  REQUIRE(t.has_value());
  CHECK(t->name == "python3");
  CHECK(t->uid[0] == 4646);
  CHECK(t->uid[3] == 4343);
  CHECK(task_is_vm_users(*t, VmUser{"fyvm", 4646, 4646}));
  CHECK(task_is_vm_users(*t, VmUser{"x", 1, 4646}));  // by its group alone
  CHECK_FALSE(task_is_vm_users(*t, VmUser{"x", 1, 2}));
  CHECK_FALSE(parse_proc_status("Name:\tx\nUid:\t1\t2\t3\nGid:\t1\t2\t3\t4\n").has_value());
  CHECK_FALSE(parse_proc_status("Name:\tx\nUid:\t1\t2\t3\t4\n").has_value());
  CHECK_FALSE(parse_proc_status("Uid:\t1\t2\t3\tx\nGid:\t1\t2\t3\t4\n").has_value());
  CHECK_FALSE(parse_proc_status("Uid:\t1\t2\t3\t4294967296\nGid:\t1\t2\t3\t4\n").has_value());

  CHECK(proc_cgroup_v2("12:pids:/a\n1:name=systemd:/b\n0::/fy.slice/x.slice\n") ==
        std::optional<std::string>("/fy.slice/x.slice"));
  CHECK_FALSE(proc_cgroup_v2("1:name=systemd:/b\n").has_value());
  CHECK(cgroup_within("/fy.slice/vm.slice", "fy.slice/vm.slice"));
  CHECK(cgroup_within("/fy.slice/vm.slice/qemu.scope", "fy.slice/vm.slice"));
  CHECK_FALSE(cgroup_within("/fy.slice/vm.slice2", "fy.slice/vm.slice"));
  CHECK_FALSE(cgroup_within("/fy.slice", "fy.slice/vm.slice"));
  CHECK_FALSE(cgroup_within("/../../fy.slice/vm.slice", "fy.slice/vm.slice"));
  CHECK_FALSE(cgroup_within("fy.slice/vm.slice", "fy.slice/vm.slice"));

  CHECK(cgroup_proper_ancestors("a/b/c") == std::vector<std::string>{"a/b", "a", ""});
  CHECK(cgroup_proper_ancestors("a") == std::vector<std::string>{""});

  const std::vector<uint32_t> groups{4646, 27};
  CHECK_FALSE(writable_by(0, 0, 0644, 4646, groups));     // root's: the slice holds
  CHECK(writable_by(4646, 4646, 0644, 4646, groups));     // a delegated subtree
  CHECK_FALSE(writable_by(4646, 0, 0464, 4646, groups));  // owner bits decide for the owner
  CHECK(writable_by(0, 27, 0664, 4646, groups));          // a supplementary group's
  CHECK_FALSE(writable_by(0, 28, 0664, 4646, groups));
  CHECK(writable_by(0, 0, 0666, 4646, groups));  // anyone's
  CHECK(only_root_writes(0, 0, 0644));
  CHECK(only_root_writes(0, 0, 0664));              // group root's
  CHECK(only_root_writes(1000, 0, 0444));           // no one writes it
  CHECK_FALSE(only_root_writes(1000, 1000, 0644));  // a user@1000.service of another user
  CHECK_FALSE(only_root_writes(0, 1000, 0664));
  CHECK_FALSE(only_root_writes(0, 0, 0646));
}

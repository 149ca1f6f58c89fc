#include "wall/config.h"

#include <sys/stat.h>
#include <cstdio>

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/config.h"
#include "core/subid.h"
#include "core/text.h"
#include "wall/vmuser.h"

namespace fy::wall {
namespace {

// ---- value checks shared by the config reader and the flags --------------

Result<uint32_t> check_gateway(uint32_t ip) {
  uint32_t top = ip >> 24;
  if (top == 0 || top == 127 || top >= 224) {
    return make_error(Errc::invalid_argument,
                      "{} cannot be the host gateway (it is a zero, loopback, multicast or "
                      "reserved address) — give the address the guest reaches the host at, "
                      "e.g. Lima's 192.168.5.2",
                      format_ipv4(ip));
  }
  return ip;
}

Result<uint32_t> check_dns_forwarder(uint32_t ip) {
  if ((ip >> 24) != 127 || (ip & 0xffffff) == 0 || (ip & 0xffffff) == 0xffffff) {
    return make_error(Errc::invalid_argument,
                      "{} is not a loopback host address — fy-dnsfwd's address must be in "
                      "127.0.0.0/8 (e.g. 127.42.0.53), so the redirected queries stay on this "
                      "machine",
                      format_ipv4(ip));
  }
  return ip;
}

Result<uint32_t> check_listener(uint32_t ip) {
  if ((ip >> 24) != 127 || (ip & 0xffffff) == 0 || (ip & 0xffffff) == 0xffffff) {
    return make_error(Errc::invalid_argument,
                      "{} is not a loopback host address — the forwarder's VM listener must be "
                      "in 127.0.0.0/8 (default 127.42.0.1), because the guard routes the "
                      "redirected connections through lo",
                      format_ipv4(ip));
  }
  return ip;
}

Result<uint32_t> check_route_table(uint64_t t) {
  if (t == 0 || (t >= 253 && t <= 255) || t > 0xffffffffULL) {
    return make_error(Errc::invalid_argument,
                      "routing table {} is reserved (0 unspec, 253 default, 254 main, 255 "
                      "local) or out of range — pick an unused table number, e.g. 4747",
                      t);
  }
  return static_cast<uint32_t>(t);
}

Result<uint32_t> check_rule_priority(uint64_t p) {
  if (p == 0 || p >= 32766) {
    return make_error(Errc::invalid_argument,
                      "rule priority {} must be 1..32765: 0 is the local table's rule, and a "
                      "rule at or after 32766 (main) would never be consulted — e.g. 4747",
                      p);
  }
  return static_cast<uint32_t>(p);
}

Result<uint16_t> check_port_base(uint64_t v) {
  if (v < 1 || v > 65535)
    return make_error(Errc::invalid_argument, "proxy_port_base {} is out of range (1..65535)", v);
  return static_cast<uint16_t>(v);
}

// Records an error from a Result at `key`, or returns the value.
template <class T>
std::optional<T> take(cfg::Table& t, std::string_view key, Result<T> r) {
  if (!r) {
    t.error(key, r.error().message);
    return std::nullopt;
  }
  return std::move(r).value();
}

template <class T>
void set(std::optional<Sourced<T>>& out, cfg::Table& t, std::string_view key, std::optional<T> v) {
  if (v) out = Sourced<T>{std::move(*v), t.where(key)};
}

// A key that may be written as one comma-separated string or an array of strings.
template <class T, class Fn>
std::optional<T> string_or_list(cfg::Table& t, std::string_view key, Fn parse) {
  std::string ty = t.type_of(key);
  if (ty.empty()) return std::nullopt;
  if (ty == "string") return take(t, key, parse(*t.string(key)));
  if (ty == "array") {
    auto items = t.strings(key);
    if (!items) return std::nullopt;
    return take(t, key, parse(*items));
  }
  t.error(key, fmt::format("expected an array of strings (or one string), found {}", ty));
  return std::nullopt;
}

std::optional<UserRef> read_user(cfg::Table& t) {
  std::string ty = t.type_of("user");
  if (ty.empty()) return std::nullopt;
  if (ty == "integer") {
    auto v = t.integer("user", 0, 0xfffffffeLL);
    if (!v) return std::nullopt;
    return UserRef{true, static_cast<uint32_t>(*v), {}};
  }
  if (ty == "string") return take(t, "user", parse_user(*t.string("user")));
  t.error("user", fmt::format("expected a login name or a uid, found {}", ty));
  return std::nullopt;
}

void read_wall_keys(cfg::Table& t, WallKeys& k) {
  set(k.user, t, "user", read_user(t));
  if (auto g = t.string("gateway")) {
    auto ip = parse_ipv4(*g);
    std::optional<uint32_t> v;
    if (ip)
      v = take(t, "gateway", check_gateway(*ip));
    else
      t.error("gateway", ip.error().message);
    set(k.gateway, t, "gateway", v);
  }
  set(k.ports, t, "ports", string_or_list<std::vector<PortRange>>(t, "ports", [](const auto& x) {
        return parse_ports(x);
      }));
  if (auto f = t.string("subuid_file")) {
    if (f->empty() || (*f)[0] != '/') {
      t.error("subuid_file", "must be an absolute path, e.g. \"/etc/subuid\"");
    } else {
      set(k.subuid_file, t, "subuid_file", std::optional<std::string>(*f));
    }
  }
}

template <class T, class Check>
std::optional<T> read_uint(cfg::Table& t, std::string_view key, Check check) {
  auto v = t.integer(key, 0, 0xffffffffLL);
  if (!v) return std::nullopt;
  return take(t, key, check(static_cast<uint64_t>(*v)));
}

// ---- flags -------------------------------------------------------------

template <class T>
Result<void> flag(std::optional<Sourced<T>>& out, const char* name, Result<T> r) {
  if (!r) return make_error(Errc::invalid_argument, "{}: {}", name, r.error().message);
  out = Sourced<T>{std::move(r).value(), name};
  return ok();
}

Result<uint64_t> flag_number(std::string_view s) {
  auto v = parse_u64(s);
  if (!v) return make_error(Errc::invalid_argument, "'{}' is not a decimal number", s);
  return *v;
}

Result<void> apply_wall_flags(WallKeys& k, const Flags& f) {
  if (f.user) FY_TRY(flag(k.user, "--user", parse_user(*f.user)));
  if (f.gateway) {
    auto ip = parse_ipv4(*f.gateway);
    if (!ip) return make_error(Errc::invalid_argument, "--gateway: {}", ip.error().message);
    FY_TRY(flag(k.gateway, "--gateway", check_gateway(*ip)));
  }
  if (f.ports) FY_TRY(flag(k.ports, "--ports", parse_ports(*f.ports)));
  if (f.subuid_file) {
    if (f.subuid_file->empty() || (*f.subuid_file)[0] != '/') {
      return make_error(Errc::invalid_argument,
                        "--subuid-file: must be an absolute path, e.g. /etc/subuid");
    }
    k.subuid_file = Sourced<std::string>{*f.subuid_file, "--subuid-file"};
  }
  return ok();
}

Result<void> refuse_flag(const std::optional<std::string>& v, const char* name, Wall wall,
                         const char* belongs) {
  if (!v) return ok();
  return make_error(Errc::invalid_argument,
                    "{} belongs to the {}, not the {} wall — drop it, or name the wall it is for",
                    name, belongs, wall_name(wall));
}

// ---- resolution --------------------------------------------------------

Error missing(const Settings& s, const char* section, const char* key, const char* flag_name,
              const char* example) {
  if (s.path.empty()) {
    return make_error(Errc::invalid_argument, "{} is required (e.g. {} {}), or give --config",
                      flag_name, flag_name, example);
  }
  return make_error(Errc::invalid_argument,
                    "{}: [{}].{} is not set — write {} = {} in [{}], or pass {}", s.path, section,
                    key, key, example, section, flag_name);
}

// A config file is small; 16 MiB is surely the wrong file.
constexpr size_t kMaxConfigBytes = 16 << 20;

Result<std::string> read_small_file(const std::string& path, bool* absent) {
  *absent = false;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) {
      *absent = true;
      return std::string();
    }
    return make_error(Errc::io, "{} cannot be read: {} — check its permissions", path,
                      strerror(errno));
  }
  std::string out;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (out.size() > kMaxConfigBytes)
      return make_error(Errc::too_large, "{} is over 16 MiB; is it the right file?", path);
  }
  return out;
}

Result<Principal> resolve_principal(const Sourced<UserRef>& who, const Sourced<std::string>& subf) {
  const UserRef& u = who.value;
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  int rc = u.numeric ? getpwuid_r(u.uid, &pw, buf.data(), buf.size(), &found)
                     : getpwnam_r(u.name.c_str(), &pw, buf.data(), buf.size(), &found);
  std::string shown = u.numeric ? fmt::format("uid {}", u.uid) : fmt::format("user '{}'", u.name);
  if (rc != 0 && rc != ENOENT && rc != ESRCH) {
    return make_error(Errc::io, "{}: looking up {} in the passwd database failed: {}", who.where,
                      shown, strerror(rc));
  }
  if (!found) {
    return make_error(Errc::not_found,
                      "{}: {} has no passwd entry (getent passwd {} finds nothing) — create the "
                      "user first, or name the VM user that owns the containers",
                      who.where, shown, u.numeric ? std::to_string(u.uid) : u.name);
  }
  Principal p;
  p.uid = pw.pw_uid;
  p.name = pw.pw_name ? pw.pw_name : "";
  if (p.uid == 0) {
    return make_error(Errc::invalid_argument,
                      "{}: the walled user is root (uid 0) — walling root would wall the "
                      "forwarder, the wall itself and every system service; name the VM user",
                      who.where);
  }
  // Every uid the user can map, as newuidmap grants them (core/subid.h): every
  // line keyed by its name, its uid or a name sharing its uid.
  auto ids = subid::read(subid::Kind::uid, subid::Owner{p.name, p.uid}, subf.value);
  if (!ids) {
    Error e = std::move(ids).take_error();
    // The system's subid configuration is the operator's input, as the file is.
    if (e.code == Errc::refused || e.code == Errc::parse) e.code = Errc::invalid_argument;
    return e;
  }
  for (const IdRange& r : ids->ranges) {
    if (r.lo <= p.uid && p.uid <= r.hi) {
      return make_error(Errc::invalid_argument,
                        "{}: the subuid range {}-{} of '{}' contains its own uid {} — give the "
                        "user a range that does not (usermod --del-subuids/--add-subuids)",
                        subf.value, r.lo, r.hi, p.name, p.uid);
    }
  }
  p.subuids = std::move(ids->ranges);
  return p;
}

Result<Sourced<UserRef>> pick_user(const std::optional<Sourced<UserRef>>& configured,
                                   const Env& env) {
  if (configured) return *configured;
  if (env.fy_wall_uid && !env.fy_wall_uid->empty()) {
    auto u = parse_user(*env.fy_wall_uid);
    if (!u) return make_error(Errc::invalid_argument, "FY_WALL_UID: {}", u.error().message);
    return Sourced<UserRef>{*u, "FY_WALL_UID"};
  }
  if (env.sudo_uid && !env.sudo_uid->empty() && *env.sudo_uid != "0") {
    auto u = parse_user(*env.sudo_uid);
    if (!u) return make_error(Errc::invalid_argument, "SUDO_UID: {}", u.error().message);
    return Sourced<UserRef>{*u, "SUDO_UID"};
  }
  return make_error(Errc::invalid_argument,
                    "can't resolve the walled uid — give user = … in the config or --user, set "
                    "FY_WALL_UID, or run via sudo from the VM user");
}

Sourced<std::string> pick_subuid_file(const std::optional<Sourced<std::string>>& a,
                                      const std::optional<Sourced<std::string>>& b) {
  if (a) return *a;
  if (b) return *b;
  return {kDefaultSubuidFile, "default"};
}

}  // namespace

const char* wall_name(Wall w) {
  switch (w) {
    case Wall::machine:
      return "machine";
    case Wall::guard:
      return "guard";
    case Wall::host:
      return "host";
  }
  return "?";
}

bool Flags::any() const {
  return user || gateway || ports || resolvers || forward_allow || subuid_file || listener ||
         route_table || rule_priority || vm || cgroup || proxy_port_base || agent_cgroup;
}

Env Env::from_process() {
  Env e;
  if (const char* v = getenv("FY_WALL_UID")) e.fy_wall_uid = v;
  if (const char* v = getenv("SUDO_UID")) e.sudo_uid = v;
  const char* rc = getenv("FY_WALL_RESOLV_CONF");
  if (FILE* f = fopen(rc && *rc ? rc : "/etc/resolv.conf", "re")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0 && e.resolv_conf.size() < (1 << 20))
      e.resolv_conf.append(buf, n);
    fclose(f);
  }
  e.resolve_vm_user = [](const UserRef& u, const std::string& where) -> Result<VmUser> {
    return fy::wall::resolve_vm_user(u, where, VmUserSources::from_system());
  };
  for (const char* root : {"/sys/fs/cgroup/unified/", "/sys/fs/cgroup/"}) {
    struct stat st;
    std::string probe = std::string(root) + "cgroup.procs";
    if (stat(probe.c_str(), &st) != 0) continue;
    e.lima_agent_cgroup = stat((std::string(root) + kLimaAgentCgroup).c_str(), &st) == 0;
    break;
  }
  return e;
}

Result<Settings> read_config(std::string_view text, const std::string& path) {
  auto doc = cfg::Doc::parse(text, path);
  if (!doc) return std::move(doc).take_error();
  Settings s;
  s.path = path;
  cfg::Table root = doc->root();
  if (auto m = root.table("machine")) {
    s.has_machine = true;
    read_wall_keys(*m, s.machine);
    set(s.machine.resolvers, *m, "resolvers",
        string_or_list<std::vector<Cidr4>>(*m, "resolvers",
                                           [](const auto& x) { return parse_cidrs(x); }));
    set(s.machine.forward_allow, *m, "forward_allow",
        string_or_list<std::vector<Cidr4>>(*m, "forward_allow",
                                           [](const auto& x) { return parse_cidrs(x); }));
    if (auto v = m->string("agent_cgroup")) {
      if (v->empty())
        set(s.machine.agent_cgroup, *m, "agent_cgroup", std::optional<std::string>(""));
      else
        set(s.machine.agent_cgroup, *m, "agent_cgroup",
            take(*m, "agent_cgroup", parse_cgroup_path(*v)));
    }
    // fy-dnsfwd's address: a 127/8 host address, as the guard's listener (the
    // redirected packets must stay on this machine).
    if (auto l = m->string("dns_forwarder")) {
      auto ip = parse_ipv4(*l);
      std::optional<uint32_t> v;
      if (ip)
        v = take(*m, "dns_forwarder", check_dns_forwarder(*ip));
      else
        m->error("dns_forwarder", ip.error().message);
      set(s.machine.dns_forwarder, *m, "dns_forwarder", v);
    }
    m->finish();
  }
  if (auto g = root.table("guard")) {
    s.has_guard = true;
    read_wall_keys(*g, s.guard);
    if (auto l = g->string("listener")) {
      auto ip = parse_ipv4(*l);
      std::optional<uint32_t> v;
      if (ip)
        v = take(*g, "listener", check_listener(*ip));
      else
        g->error("listener", ip.error().message);
      set(s.guard.listener, *g, "listener", v);
    }
    set(s.guard.route_table, *g, "route_table",
        read_uint<uint32_t>(*g, "route_table", check_route_table));
    set(s.guard.rule_priority, *g, "rule_priority",
        read_uint<uint32_t>(*g, "rule_priority", check_rule_priority));
    g->finish();
  }
  if (auto h = root.table("host")) {
    s.has_host = true;
    if (auto v = h->string("vm")) set(s.host.vm, *h, "vm", take(*h, "vm", parse_vm_name(*v)));
    set(s.host.user, *h, "user", read_user(*h));
    if (auto v = h->string("cgroup"))
      set(s.host.cgroup, *h, "cgroup", take(*h, "cgroup", parse_cgroup_path(*v)));
    set(s.host.ports, *h, "ports",
        string_or_list<std::vector<PortRange>>(*h, "ports",
                                               [](const auto& x) { return parse_ports(x); }));
    set(s.host.proxy_port_base, *h, "proxy_port_base",
        read_uint<uint16_t>(*h, "proxy_port_base", check_port_base));
    h->finish();
  }
  root.finish();
  FY_TRY(doc->result());
  return s;
}

Result<Settings> read_config_file(const std::string& path) {
  bool absent = false;
  auto text = read_small_file(path, &absent);
  if (!text) return std::move(text).take_error();
  if (absent) {
    return make_error(Errc::not_found,
                      "{} does not exist — give the path of an fy-wall config (--config), or "
                      "the values as flags",
                      path);
  }
  return read_config(*text, path);
}

Result<void> apply_flags(Settings& s, Wall wall, const Flags& f) {
  switch (wall) {
    case Wall::machine:
      FY_TRY(refuse_flag(f.listener, "--listener", wall, "guard"));
      FY_TRY(refuse_flag(f.route_table, "--route-table", wall, "guard"));
      FY_TRY(refuse_flag(f.rule_priority, "--rule-priority", wall, "guard"));
      FY_TRY(refuse_flag(f.vm, "--vm", wall, "host wall"));
      FY_TRY(refuse_flag(f.cgroup, "--cgroup", wall, "host wall"));
      FY_TRY(refuse_flag(f.proxy_port_base, "--proxy-port-base", wall, "host wall"));
      FY_TRY(apply_wall_flags(s.machine, f));
      if (f.resolvers) FY_TRY(flag(s.machine.resolvers, "--resolvers", parse_cidrs(*f.resolvers)));
      if (f.forward_allow) {
        FY_TRY(flag(s.machine.forward_allow, "--forward-allow", parse_cidrs(*f.forward_allow)));
      }
      if (f.agent_cgroup) {
        if (f.agent_cgroup->empty())
          s.machine.agent_cgroup = Sourced<std::string>{"", "--agent-cgroup"};
        else
          FY_TRY(flag(s.machine.agent_cgroup, "--agent-cgroup",
                      parse_cgroup_path(*f.agent_cgroup)));
      }
      return ok();
    case Wall::guard:
      FY_TRY(refuse_flag(f.resolvers, "--resolvers", wall, "machine wall"));
      FY_TRY(refuse_flag(f.forward_allow, "--forward-allow", wall, "machine wall"));
      FY_TRY(refuse_flag(f.agent_cgroup, "--agent-cgroup", wall, "machine wall"));
      FY_TRY(refuse_flag(f.vm, "--vm", wall, "host wall"));
      FY_TRY(refuse_flag(f.cgroup, "--cgroup", wall, "host wall"));
      FY_TRY(refuse_flag(f.proxy_port_base, "--proxy-port-base", wall, "host wall"));
      FY_TRY(apply_wall_flags(s.guard, f));
      if (f.listener) {
        auto ip = parse_ipv4(*f.listener);
        if (!ip) return make_error(Errc::invalid_argument, "--listener: {}", ip.error().message);
        FY_TRY(flag(s.guard.listener, "--listener", check_listener(*ip)));
      }
      if (f.route_table) {
        auto n = flag_number(*f.route_table);
        if (!n) return make_error(Errc::invalid_argument, "--route-table: {}", n.error().message);
        FY_TRY(flag(s.guard.route_table, "--route-table", check_route_table(*n)));
      }
      if (f.rule_priority) {
        auto n = flag_number(*f.rule_priority);
        if (!n) return make_error(Errc::invalid_argument, "--rule-priority: {}", n.error().message);
        FY_TRY(flag(s.guard.rule_priority, "--rule-priority", check_rule_priority(*n)));
      }
      return ok();
    case Wall::host:
      FY_TRY(refuse_flag(f.gateway, "--gateway", wall, "machine wall and the guard"));
      FY_TRY(refuse_flag(f.subuid_file, "--subuid-file", wall, "machine wall and the guard"));
      FY_TRY(refuse_flag(f.resolvers, "--resolvers", wall, "machine wall"));
      FY_TRY(refuse_flag(f.forward_allow, "--forward-allow", wall, "machine wall"));
      FY_TRY(refuse_flag(f.agent_cgroup, "--agent-cgroup", wall, "machine wall"));
      FY_TRY(refuse_flag(f.listener, "--listener", wall, "guard"));
      FY_TRY(refuse_flag(f.route_table, "--route-table", wall, "guard"));
      FY_TRY(refuse_flag(f.rule_priority, "--rule-priority", wall, "guard"));
      if (f.vm) FY_TRY(flag(s.host.vm, "--vm", parse_vm_name(*f.vm)));
      if (f.user) FY_TRY(flag(s.host.user, "--user", parse_user(*f.user)));
      if (f.cgroup) FY_TRY(flag(s.host.cgroup, "--cgroup", parse_cgroup_path(*f.cgroup)));
      if (f.ports) FY_TRY(flag(s.host.ports, "--ports", parse_ports(*f.ports)));
      if (f.proxy_port_base) {
        auto n = flag_number(*f.proxy_port_base);
        if (!n) {
          return make_error(Errc::invalid_argument, "--proxy-port-base: {}", n.error().message);
        }
        FY_TRY(flag(s.host.proxy_port_base, "--proxy-port-base", check_port_base(*n)));
      }
      return ok();
  }
  return ok();
}

Result<Principal> walled_principal(const Settings& s, const Env& env) {
  auto who = pick_user(s.machine.user, env);
  if (!who) return std::move(who).take_error();
  return resolve_principal(*who, pick_subuid_file(s.machine.subuid_file, std::nullopt));
}

Result<MachineSpec> machine_spec(const Settings& s, const Env& env) {
  const MachineKeys& k = s.machine;
  if (!k.gateway) return missing(s, "machine", "gateway", "--gateway", "\"192.168.5.2\"");
  if (!k.ports) return missing(s, "machine", "ports", "--ports", "\"41000-41089,41100-41189\"");
  auto who = pick_user(k.user, env);
  if (!who) return std::move(who).take_error();
  auto p = resolve_principal(*who, pick_subuid_file(k.subuid_file, std::nullopt));
  if (!p) return std::move(p).take_error();
  MachineSpec m;
  m.walled = std::move(*p);
  m.gateway = k.gateway->value;
  m.ports = k.ports->value;
  m.resolvers = k.resolvers ? k.resolvers->value : default_machine_resolvers(env.resolv_conf);
  m.agent_cgroup = k.agent_cgroup  ? k.agent_cgroup->value
                   : env.lima_agent_cgroup ? std::string(kLimaAgentCgroup)
                                           : std::string();
  m.forward_allow = k.forward_allow ? k.forward_allow->value : *parse_cidrs(kPrivateRanges);
  m.dns_forwarder = k.dns_forwarder ? k.dns_forwarder->value : 0;
  return m;
}

Result<GuardSpec> guard_spec(const Settings& s, const Env& env) {
  const GuardKeys& g = s.guard;
  const MachineKeys& m = s.machine;
  auto gateway = g.gateway ? g.gateway : m.gateway;
  auto ports = g.ports ? g.ports : m.ports;
  if (!gateway) return missing(s, "guard", "gateway", "--gateway", "\"192.168.5.2\"");
  if (!ports) return missing(s, "guard", "ports", "--ports", "\"41000-41089,41100-41189\"");
  auto who = pick_user(g.user ? g.user : m.user, env);
  if (!who) return std::move(who).take_error();
  auto p = resolve_principal(*who, pick_subuid_file(g.subuid_file, m.subuid_file));
  if (!p) return std::move(p).take_error();
  GuardSpec out;
  out.walled = std::move(*p);
  out.gateway = gateway->value;
  out.ports = ports->value;
  out.listener = g.listener ? g.listener->value : *parse_ipv4(kDefaultListener);
  auto [table, prio] = guard_route_ids(s);
  out.route_table = table;
  out.rule_priority = prio;
  return out;
}

std::pair<uint32_t, uint32_t> guard_route_ids(const Settings& s) {
  return {s.guard.route_table ? s.guard.route_table->value : kDefaultRouteTable,
          s.guard.rule_priority ? s.guard.rule_priority->value : kDefaultRulePriority};
}

std::vector<Cidr4> default_machine_resolvers(std::string_view resolv_conf) {
  std::vector<Cidr4> out;
  for (const std::string& a : parse_resolv_conf(resolv_conf)) {
    auto ip = parse_ipv4(a);
    if (!ip || (*ip >> 24) == 127) continue;  // IPv6, or loopback (lo is open already)
    out.push_back(Cidr4{*ip, 32});
  }
  if (out.empty()) out.push_back(Cidr4{*parse_ipv4(kLimaResolver), 32});
  return out;
}

std::vector<std::string> default_host_resolvers(std::string_view resolv_conf) {
  std::vector<std::string> out = parse_resolv_conf(resolv_conf);
  if (out.empty()) out.emplace_back("127.0.0.1");  // what libc asks when none is named
  return out;
}

Result<HostSpec> host_spec(const Settings& s, const Env& env) {
  const HostKeys& h = s.host;
  if (!h.vm) return missing(s, "host", "vm", "--vm", "\"dev\"");
  if (!h.cgroup) {
    return missing(s, "host", "cgroup", "--cgroup",
                   "\"user.slice/user-1000.slice/user@1000.service/fy.slice/"
                   "fy-machine-dev.slice\"");
  }
  if (!h.ports) return missing(s, "host", "ports", "--ports", "\"41000-41199\"");
  if (!h.user) {
    // No default (not SUDO_UID: that is the desktop user, whose other
    // processes would act for the VM): the VM's own account.
    const char* why =
        "the host wall judges the VM's processes by their user's uid and gid, which they "
        "cannot change, and not by their cgroup alone, which they can leave — create an "
        "account for the VM alone and run the VM as it (docs/fy-wall.md, \"The VM user\")";
    if (s.path.empty()) {
      return make_error(Errc::invalid_argument, "--user is required (e.g. --user fyvm-{}): {}",
                        h.vm->value, why);
    }
    return make_error(Errc::invalid_argument,
                      "{}: [host].user is not set — write user = \"fyvm-{}\" in [host], or pass "
                      "--user: {}",
                      s.path, h.vm->value, why);
  }
  if (!env.resolve_vm_user) {
    return make_error(Errc::internal, "the VM user cannot be resolved here (no passwd access)");
  }
  auto user = env.resolve_vm_user(h.user->value, h.user->where);
  if (!user) return std::move(user).take_error();
  HostSpec out;
  out.vm = h.vm->value;
  out.user = std::move(*user);
  out.cgroup = h.cgroup->value;
  out.ports = h.ports->value;
  out.proxy_port_base = h.proxy_port_base ? h.proxy_port_base->value : h.ports->value.front().lo;
  out.resolvers = default_host_resolvers(env.resolv_conf);
  return out;
}

}  // namespace fy::wall

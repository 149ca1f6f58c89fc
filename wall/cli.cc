#include "wall/cli.h"

#include <fmt/format.h>

#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>
#include <string>
#include <string_view>
#include <vector>

#include "core/args.h"
#include "core/subid.h"
#include "core/text.h"
#include "wall/config.h"
#include "wall/coverage.h"
#include "wall/dnsfwd_status.h"
#include "wall/hostcheck.h"
#include "wall/nft.h"
#include "wall/render.h"
#include "wall/routes.h"
#include "wall/system.h"

namespace fy::wall {
namespace {

std::vector<std::string_view> split_lines(std::string_view t) {
  std::vector<std::string_view> v;
  while (!t.empty()) {
    size_t nl = t.find('\n');
    v.push_back(t.substr(0, nl));
    t.remove_prefix(nl == std::string_view::npos ? t.size() : nl + 1);
  }
  return v;
}

constexpr const char* kVersion = "0.1.0";

constexpr const char* kHelp =
    R"(fy-wall — foldyard's nftables walls, applied atomically with libnftables.

usage: fy-wall <command> <wall> [options]

commands:
  render   print the ruleset the config renders (needs no privileges);
           `render families` prints the guest's modprobe.d file that keeps
           the kernel from loading the socket families a dev box never
           needs (wall/dist/fy-wall-families.conf); `render principals`
           prints the walled uids, e.g. 1000,100000-165535,300000-365535:
           the user and every range /etc/subuid grants it (--user,
           --subuid-file, or [machine] of --config)
  apply    replace the wall's tables whole, in one transaction, and for the
           guard set its policy routes; with --check, validate only
  remove   delete the wall's tables (and the guard's policy routes)
  status   is each table present and equal to the rendered one? and the
           newest deny lines of the kernel log

walls:
  machine  inet fy_wall + ip6 fy_wall6: the guest's egress wall
  guard    ip fy_guard + uid-scoped policy routes: the forwarder's table
  host     inet fy_host_wall_<vm>: the per-VM wall on a Linux host

options:
  --config FILE          TOML config with [machine], [guard] and/or [host]
  --user NAME|UID        the walled user (machine, guard); default FY_WALL_UID,
                         then SUDO_UID; the host wall's VM user, the account
                         the VM runs as and nothing else (host; required)
  --gateway IPV4         the host gateway (machine, guard)
  --ports LIST           port bands, e.g. 41000-41089,41100-41189
  --resolvers LIST       where DNS may go (machine); default the IPv4 nameservers
                         of /etc/resolv.conf (FY_WALL_RESOLV_CONF) that are not
                         loopback, else 192.168.5.3 (Lima's)
  --forward-allow LIST   what the forward chain admits (machine); default the
                         private ranges
  --agent-cgroup PATH    the guest agent's cgroup, which may reach only local
                         addresses (machine; default
                         system.slice/lima-guestagent.service if it exists;
                         "" for none)
  --subuid-file FILE     the subuid database (default /etc/subuid)
  --listener IPV4        the forwarder's VM listener (guard; default 127.42.0.1)
  --route-table N        the guard's routing table (default 4747)
  --rule-priority N      the guard's policy rule priority (default 4747)
  --vm NAME              the VM (host)
  --cgroup PATH          the VM's slice below the cgroup2 root (host)
  --proxy-port-base N    the port in the ct mark (host; default the lowest port)
  --check                with apply: check config and transaction, change nothing
  --log-lines N          with status: deny lines to print (default 5)
  -h, --help             this text
  --version              the version

Flags override the config file's values. `status` with neither --config nor
value flags reports only whether the tables are present.

exit codes:
  0  done; status: every table present and as rendered
  1  status: a table is absent or differs, or (host) the VM user runs outside
     its slice or could leave it — the wall is NOT enforcing as configured
  2  usage: an unknown command, wall or option
  3  refused input: a bad config or flag value (the message says where)
  4  the system refused: the kernel, netlink, permissions, a missing cgroup

See docs/fy-wall.md.
)";

struct Options {
  std::string command;
  std::optional<Wall> wall;
  std::optional<std::string> config;
  Flags flags;
  bool check = false;
  size_t log_lines = 5;
  bool families = false;    // `render families`
  bool principals = false;  // `render principals`
};

class Cli {
 public:
  Cli(FILE* out, FILE* err) : out_(out), err_(err) {}

  int run(int argc, char** argv);

 private:
  int fail(int code, std::string_view msg) {
    // Every line of a multi-line message is kept; the first carries the mark.
    fmt::print(err_, "✗ {}\n", msg);
    return code;
  }
  int fail(const Error& e) { return fail(exit_for(e), e.message); }
  static int exit_for(const Error& e) {
    switch (e.code) {
      case Errc::invalid_argument:
      case Errc::parse:
        return kExitBadInput;
      case Errc::not_found:
        // A user with no passwd entry, a missing config file: the operator's
        // input. A missing cgroup is reported as Errc::not_found too but
        // comes from the system; callers map that one themselves.
        return kExitBadInput;
      default:
        return kExitSystem;
    }
  }

  int parse_args(int argc, char** argv);
  Result<Settings> settings();
  int cmd_render();
  int cmd_apply();
  int cmd_remove();
  int cmd_status();
  void print_deputies(const std::vector<IdRange>& walled, const std::string& agent_cgroup);
  bool print_vm_user(const HostSpec& h);
  int status_tables(Nft& nft, const std::vector<TableRef>& tables,
                    const std::optional<std::string>& rendered, bool* all_good);

  FILE* out_;
  FILE* err_;
  Options o_;
};

int Cli::parse_args(int argc, char** argv) {
  Flags& f = o_.flags;
  ArgParser p;
  p.stop("-h,--help").stop("--version").flag("--check", &o_.check);
  auto into = [&p](const char* name, std::optional<std::string>* slot) {
    p.value(name, [slot](const std::string& v) -> ArgParser::Refusal {
      *slot = v;
      return std::nullopt;
    });
  };
  into("--config", &o_.config);
  into("--user", &f.user);
  into("--gateway", &f.gateway);
  into("--ports", &f.ports);
  into("--resolvers", &f.resolvers);
  into("--forward-allow", &f.forward_allow);
  into("--agent-cgroup", &f.agent_cgroup);
  into("--subuid-file", &f.subuid_file);
  into("--listener", &f.listener);
  into("--route-table", &f.route_table);
  into("--rule-priority", &f.rule_priority);
  into("--vm", &f.vm);
  into("--cgroup", &f.cgroup);
  into("--proxy-port-base", &f.proxy_port_base);
  p.value("--log-lines", [this](const std::string& v) -> ArgParser::Refusal {
    auto n = parse_u64(v);
    if (!n || *n > 10000) return fmt::format("--log-lines wants a number 0..10000, not '{}'", v);
    o_.log_lines = static_cast<size_t>(*n);
    return std::nullopt;
  });
  ParsedArgs a = p.parse(argc, argv);
  if (a.stopped_at) {
    o_.command = *a.stopped_at == "--version" ? "version" : "help";
    return kExitOk;
  }
  if (a.problem) {
    switch (a.problem->kind) {
      case ArgProblem::Kind::needs_value:
        return fail(kExitUsage,
                    fmt::format("{} needs a value — see fy-wall --help", a.problem->option));
      case ArgProblem::Kind::bad_value:
        return fail(kExitUsage, a.problem->message);
      case ArgProblem::Kind::no_value:
      case ArgProblem::Kind::unknown:
        return fail(kExitUsage, fmt::format("unknown option '{}' — see fy-wall --help",
                                            a.problem->option));
    }
  }
  const std::vector<std::string>& positional = a.positional;
  if (positional.empty()) {
    return fail(kExitUsage,
                "no command — apply|remove|status|render (e.g. fy-wall apply machine --config "
                "/etc/fy-wall/fy-wall.toml; see fy-wall --help)");
  }
  o_.command = positional[0];
  if (o_.command != "apply" && o_.command != "remove" && o_.command != "status" &&
      o_.command != "render") {
    return fail(kExitUsage,
                fmt::format("unknown command '{}' — apply|remove|status|render", o_.command));
  }
  if (positional.size() < 2) {
    return fail(kExitUsage, fmt::format("name the wall to {}: machine, guard or host (e.g. "
                                        "fy-wall {} machine --config FILE)",
                                        o_.command, o_.command));
  }
  if (o_.command == "render" && positional[1] == "families" && positional.size() == 2) {
    o_.families = true;  // the guest's modprobe.d file: no wall, no config
    return kExitOk;
  }
  if (o_.command == "render" && positional[1] == "principals" && positional.size() == 2) {
    o_.principals = true;  // the machine wall's walled uids: its user and subuid file
    o_.wall = Wall::machine;
    return kExitOk;
  }
  if (positional[1] == "machine")
    o_.wall = Wall::machine;
  else if (positional[1] == "guard")
    o_.wall = Wall::guard;
  else if (positional[1] == "host")
    o_.wall = Wall::host;
  else {
    return fail(kExitUsage, fmt::format("unknown wall '{}' — machine|guard|host", positional[1]));
  }
  if (positional.size() > 2) {
    return fail(kExitUsage,
                fmt::format("unexpected argument '{}' — one command and one wall", positional[2]));
  }
  if (o_.check && o_.command != "apply") {
    return fail(kExitUsage, "--check goes with apply (fy-wall apply <wall> --check)");
  }
  return kExitOk;
}

Result<Settings> Cli::settings() {
  Settings s;
  if (o_.config) {
    auto r = read_config_file(*o_.config);
    if (!r) return std::move(r).take_error();
    s = std::move(*r);
    bool has = *o_.wall == Wall::machine ? s.has_machine
               : *o_.wall == Wall::guard ? (s.has_guard || s.has_machine)
                                         : s.has_host;
    if (!has && !o_.flags.any()) {
      return make_error(Errc::invalid_argument,
                        "{} has no [{}] section — add one, or pass the values as flags", *o_.config,
                        wall_name(*o_.wall));
    }
  }
  FY_TRY(apply_flags(s, *o_.wall, o_.flags));
  return s;
}

// The resolved spec of the wall, rendered, with its tables and a summary.
struct Rendered {
  std::string text;
  std::vector<TableRef> tables;
  std::string summary;
  std::optional<GuardSpec> guard;
  std::optional<HostSpec> host;
  std::string agent_cgroup;  // the machine wall's, "" for none
  std::vector<IdRange> walled;  // the machine wall's or the guard's walled uids
};

Result<Rendered> render_wall(Wall w, const Settings& s) {
  Rendered r;
  Env env = Env::from_process();
  switch (w) {
    case Wall::machine: {
      auto m = machine_spec(s, env);
      if (!m) return std::move(m).take_error();
      r.text = render_machine(*m);
      r.tables = machine_tables();
      r.agent_cgroup = m->agent_cgroup;
      r.walled = m->walled.ranges();
      r.summary = describe_machine(*m);
      break;
    }
    case Wall::guard: {
      auto g = guard_spec(s, env);
      if (!g) return std::move(g).take_error();
      r.text = render_guard(*g);
      r.tables = guard_tables();
      r.summary = describe_guard(*g);
      r.walled = g->walled.ranges();
      r.guard = *g;
      break;
    }
    case Wall::host: {
      auto h = host_spec(s, env);
      if (!h) return std::move(h).take_error();
      r.text = render_host(*h);
      r.tables = host_tables(*h);
      r.summary = describe_host(*h);
      r.host = *h;
      break;
    }
  }
  return r;
}

// What a table holds besides chains, as nft lists it ("\tset NAME {") and as
// `delete` names it. The renderings define none of these.
struct ObjectKind {
  std::string_view listed;
  std::string_view del;
};
constexpr ObjectKind kObjectKinds[] = {
    {"set ", "set"},
    {"map ", "map"},
    {"flowtable ", "flowtable"},
    {"counter ", "counter"},
    {"quota ", "quota"},
    {"limit ", "limit"},
    {"ct helper ", "ct helper"},
    {"ct timeout ", "ct timeout"},
    {"ct expectation ", "ct expectation"},
    {"secmark ", "secmark"},
    {"synproxy ", "synproxy"},
};

// What apply sends: the rendered text, plus the deletion of what the live
// tables hold that the rendering does not define — sets, maps, flowtables and
// stateful objects first (a verdict map can hold a jump to a chain), then
// chains — after the flush, in the same transaction. The flush has already
// dropped every rule that used them, so the kernel lets them go; the base
// chains stay, one per hook, as with a plain re-apply.
struct Plan {
  std::string text;
  bool existed = false;
  int extra_chains = 0;
  std::vector<std::string> extra_objects;  // "set NAME", "counter NAME", ...
};

Result<Plan> plan_apply(Nft& nft, const std::string& text, const std::vector<TableRef>& tables) {
  Plan p;
  std::string objects, chains;
  for (const TableRef& t : tables) {
    auto live = nft.list(t, true);
    if (!live) return std::move(live).take_error();
    if (!*live) continue;
    p.existed = true;
    std::vector<std::string> want = rendered_chains(text, t);
    for (std::string_view raw : split_lines(**live)) {
      // Only the table's own members: one tab in, opening a block.
      if (!raw.starts_with("\t") || raw.starts_with("\t\t")) continue;
      std::string_view line = trim_ows(raw);
      if (!line.ends_with("{")) continue;
      if (line.starts_with("chain ")) {
        std::string name(line.substr(6, line.find(' ', 6) - 6));
        if (std::find(want.begin(), want.end(), name) != want.end()) continue;
        chains += fmt::format("delete chain {} {}\n", t.str(), name);
        ++p.extra_chains;
        continue;
      }
      for (const ObjectKind& k : kObjectKinds) {
        if (!line.starts_with(k.listed)) continue;
        std::string_view rest = trim_ows(line.substr(k.listed.size()));
        std::string name(trim_ows(rest.substr(0, rest.size() - 1)));
        if (name.empty() ||
            text.find(fmt::format("\t{}{} {{\n", k.listed, name)) != std::string::npos) {
          break;
        }
        objects += fmt::format("delete {} {} {}\n", k.del, t.str(), name);
        p.extra_objects.push_back(fmt::format("{} {}", k.del, name));
        break;
      }
    }
  }
  std::string deletes = objects + chains;
  size_t defs = text.find(fmt::format("table {} {{\n", tables.front().str()));
  p.text = defs == std::string::npos ? text + deletes
                                     : text.substr(0, defs) + deletes + text.substr(defs);
  return p;
}

// The same ruleset with the tables deleted instead of flushed: replaces
// chains whatever their shape, still in one transaction.
std::string replace_whole(const std::string& text) {
  std::string out;
  for (std::string_view line : split_lines(text)) {
    if (line.starts_with("flush table ")) {
      out += "delete table ";
      out += line.substr(12);
    } else {
      out += line;
    }
    out += '\n';
  }
  return out;
}

// Makes /sys/fs/cgroup a cgroup2 view when the host wall needs one.
Result<void> host_prepare(const std::optional<HostSpec>& h) {
  bool mounted = false;
  if (auto v = ensure_cgroup2_view(&mounted); !v) {
    return Error{v.error().code == Errc::permission ? Errc::permission : Errc::io,
                 v.error().message};  // the system's state, not input
  }
  if (h) {
    auto e = check_cgroup_exists(h->cgroup);
    if (!e) return Error{Errc::io, e.error().message};  // the system's state, not input
  }
  return ok();
}

int Cli::cmd_render() {
  auto s = settings();
  if (!s) return fail(s.error());
  if (o_.principals) {
    auto p = walled_principal(*s, Env::from_process());
    if (!p) return fail(p.error());
    std::string list;
    for (const IdRange& r : p->ranges()) list += (list.empty() ? "" : ",") + format_id_range(r);
    fmt::print(out_, "{}\n", list);
    return kExitOk;
  }
  auto r = render_wall(*o_.wall, *s);
  if (!r) return fail(r.error());
  fmt::print(out_, "{}", r->text);
  return kExitOk;
}

int Cli::cmd_apply() {
  auto s = settings();
  if (!s) return fail(s.error());
  auto r = render_wall(*o_.wall, *s);
  if (!r) return fail(r.error());
  if (*o_.wall == Wall::host) {
    if (auto p = host_prepare(r->host); !p) return fail(p.error());
    // A slice its processes could leave would leave the wall to the uid and
    // gid alone, and a set-ID program run from it outside the wall.
    if (auto c = check_slice_holds(r->host->cgroup, r->host->user); !c) return fail(c.error());
  }
  if (!r->agent_cgroup.empty()) {  // nft resolves the agent's cgroup as the host wall's
    if (auto p = host_prepare(std::nullopt); !p) return fail(p.error());
    if (auto e = check_cgroup_exists(r->agent_cgroup); !e) {
      return fail(Error{Errc::io, e.error().message + " (the guest agent's, --agent-cgroup; "
                                                      "\"\" for none)"});
    }
  }
  auto nft = Nft::open();
  if (!nft) return fail(nft.error());
  std::string names;
  for (const TableRef& t : r->tables) names += (names.empty() ? "" : ", ") + t.str();
  auto plan = plan_apply(*nft, r->text, r->tables);
  if (!plan) return fail(plan.error());
  std::string how;
  if (auto a = nft->run(plan->text, o_.check); !a) {
    // A live chain of another shape (type, hook, priority: an older fy-wall,
    // or a hand edit) cannot be redefined in place. Replace the tables whole
    // instead: still one transaction.
    auto not_applied = [&](const Error& e) {
      return fail(kExitSystem, fmt::format("{} wall not {}: {}", wall_name(*o_.wall),
                                           o_.check ? "valid" : "applied", e.message));
    };
    if (!plan->existed) return not_applied(a.error());
    auto whole = nft->run(replace_whole(r->text), o_.check);
    if (!whole) return not_applied(whole.error());
    how =
        " — replaced whole: the live tables could not be changed in place (a chain of "
        "another shape, or something of the table's still in use)";
  } else {
    if (plan->extra_chains > 0)
      how = fmt::format(" — {} chain(s) it no longer defines deleted", plan->extra_chains);
    if (!plan->extra_objects.empty()) {
      std::string list;
      for (const std::string& o : plan->extra_objects) list += (list.empty() ? "" : ", ") + o;
      how += fmt::format("{}{} object(s) it does not define deleted ({})",
                         how.empty() ? " — " : "; ", plan->extra_objects.size(), list);
    }
  }
  if (o_.check) {
    std::string extra =
        r->guard ? " (netlink has no dry run: the policy routes were only validated)" : "";
    fmt::print(out_,
               "✓ check passed: the {} wall's config is valid and the kernel accepts its "
               "transaction ({}); nothing was changed{}\n",
               wall_name(*o_.wall), names, extra);
    return kExitOk;
  }
  if (r->guard) {
    auto routes = PolicyRoutes::open();
    if (!routes) return fail(routes.error());
    auto sync = routes->sync(guard_rules(*r->guard), r->guard->gateway, r->guard->route_table,
                             r->guard->rule_priority);
    if (!sync) {
      return fail(kExitSystem,
                  fmt::format("guard table applied, but its policy routes were not: {} — the "
                              "redirected connections are refused until they are (fail "
                              "closed); fix the cause and apply again",
                              sync.error().message));
    }
  }
  fmt::print(out_, "✓ fy-wall {} applied ({}): {}{}\n", wall_name(*o_.wall), names, r->summary,
             how);
  return kExitOk;
}

int Cli::cmd_remove() {
  auto s = settings();
  if (!s) return fail(s.error());
  std::vector<TableRef> tables;
  switch (*o_.wall) {
    case Wall::machine:
      tables = machine_tables();
      break;
    case Wall::guard:
      tables = guard_tables();
      break;
    case Wall::host:
      if (!s->host.vm) {
        return fail(kExitBadInput, o_.config ? fmt::format("{}: [host].vm is not set — write "
                                                           "vm = \"…\" or pass --vm",
                                                           *o_.config)
                                             : "--vm is required to remove a host wall");
      }
      tables = host_tables_for(s->host.vm->value);
      break;
  }
  int rules = 0, routes_n = 0;
  if (*o_.wall == Wall::guard) {
    auto [table, prio] = guard_route_ids(*s);
    auto routes = PolicyRoutes::open();
    if (!routes) return fail(routes.error());
    auto rm = routes->remove(table, prio);
    if (!rm) return fail(rm.error());
    rules = rm->rules_deleted;
    routes_n = rm->routes_deleted;
  }
  auto nft = Nft::open();
  if (!nft) return fail(nft.error());
  auto before = nft->tables();
  if (!before) return fail(before.error());
  std::string removed, absent;
  for (const TableRef& t : tables) {
    bool present = false;
    for (const TableRef& x : *before) present = present || x == t;
    std::string& into = present ? removed : absent;
    into += (into.empty() ? "" : ", ") + t.str();
  }
  if (auto a = nft->run(render_remove(tables)); !a) {
    return fail(kExitSystem,
                fmt::format("{} wall not removed: {}", wall_name(*o_.wall), a.error().message));
  }
  std::string msg = removed.empty() ? "nothing to remove" : "removed " + removed;
  if (!absent.empty()) msg += fmt::format(" (already absent: {})", absent);
  if (*o_.wall == Wall::guard) {
    msg += fmt::format("; {} policy rule(s) and {} route(s) deleted", rules, routes_n);
  }
  fmt::print(out_, "✓ fy-wall {}: {}\n", wall_name(*o_.wall), msg);
  return kExitOk;
}

// A line diff (longest common subsequence): "-" live only, "+" rendered only.
std::vector<std::string> diff_lines(std::string_view live, std::string_view want) {
  auto a = split_lines(live), b = split_lines(want);
  if (a.size() > 2000 || b.size() > 2000) return {"(too long to compare line by line)"};
  std::vector<std::vector<uint16_t>> l(a.size() + 1, std::vector<uint16_t>(b.size() + 1, 0));
  for (size_t i = a.size(); i-- > 0;)
    for (size_t j = b.size(); j-- > 0;)
      l[i][j] = a[i] == b[j] ? l[i + 1][j + 1] + 1 : std::max(l[i + 1][j], l[i][j + 1]);
  std::vector<std::string> out;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (i < a.size() && j < b.size() && a[i] == b[j]) {
      ++i, ++j;
    } else if (j < b.size() && (i == a.size() || l[i][j + 1] >= l[i + 1][j])) {
      out.push_back(fmt::format("+ {}", b[j++]));
    } else {
      out.push_back(fmt::format("- {}", a[i++]));
    }
  }
  return out;
}

namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string uid_name(uint32_t uid) {
  struct passwd* pw = getpwuid(uid);
  return pw ? fmt::format("{} ({})", uid, pw->pw_name) : std::to_string(uid);
}

}  // namespace

// The deputies a walled principal could ask to dial for it (loopback is open
// to it, and AF_UNIX is not netfilter's): the guest agent's socket, and every
// listener of a uid that is not walled. Reported, not judged: which of them
// relays is theirs to say (docs/wall-escapes.md, rows 91-95).
void Cli::print_deputies(const std::vector<IdRange>& walled, const std::string& agent_cgroup) {
  const char* env = getenv("FY_WALL_AGENT_SOCKET");  // the tests' stand-in
  const char* agent = env && *env ? env : kLimaAgentSocket;
  struct stat st {};
  if (stat(agent, &st) == 0) {
    bool theirs = false;
    for (const IdRange& r : walled) theirs = theirs || (st.st_uid >= r.lo && st.st_uid <= r.hi);
    fmt::print(out_, "guest agent socket {}: owner {}, mode {:04o}{}\n", agent,
               uid_name(st.st_uid), st.st_mode & 07777,
               theirs || (st.st_mode & 0006) == 0006
                   ? " — a walled principal can ask the agent to dial for it"
                   : "");
  } else {
    fmt::print(out_, "guest agent socket {}: absent\n", agent);
  }
  fmt::print(out_, "guest agent cgroup: {}\n",
             agent_cgroup.empty() ? std::string("none named (its sockets are not limited)")
                                  : agent_cgroup + " (reaches only local addresses)");
  std::vector<Listener> all;
  for (auto [file, proto, v6] : {std::tuple{"/proc/net/tcp", "tcp", false},
                                 std::tuple{"/proc/net/tcp6", "tcp", true},
                                 std::tuple{"/proc/net/udp", "udp", false},
                                 std::tuple{"/proc/net/udp6", "udp", true}}) {
    for (Listener& l : parse_proc_net_listeners(read_small_file(file), proto, v6))
      all.push_back(std::move(l));
  }
  std::vector<Listener> others;
  for (const Listener& l : all) {
    bool w = false;
    for (const IdRange& r : walled) w = w || (l.uid >= r.lo && l.uid <= r.hi);
    if (!w) others.push_back(l);
  }
  fmt::print(out_, "listeners of other uids (each could relay for a walled client): {}\n",
             others.size());
  size_t shown = 0;
  for (const Listener& l : others) {
    if (++shown > 20) {
      fmt::print(out_, "  ... and {} more\n", others.size() - 20);
      break;
    }
    const std::string at = l.addr.find(':') != std::string::npos ? "[" + l.addr + "]" : l.addr;
    fmt::print(out_, "  {} {}:{} uid {}\n", l.proto, at, l.port, uid_name(l.uid));
  }
}

// Whether the VM user is held as the host wall assumes: its slice is one only
// root can move processes out of, and none of its processes runs outside it.
// A process outside is still walled by uid and gid; that it exists at all
// means something started the VM user where the wall did not put it.
bool Cli::print_vm_user(const HostSpec& h) {
  bool held = true;
  if (auto c = check_slice_holds(h.cgroup, h.user); !c) {
    fmt::print(out_, "slice {}: NOT held — {}\n", h.cgroup, c.error().message);
    held = false;
  } else {
    fmt::print(out_, "slice {}: only root can move a process out of it\n", h.cgroup);
  }
  const UserTasks t = vm_user_tasks(h.user, h.cgroup);
  const std::string who =
      fmt::format("VM user {} (uid {}, gid {})", h.user.name, h.user.uid, h.user.gid);
  if (t.outside.empty()) {
    fmt::print(out_, "{}: {} process(es), every one in the slice\n", who, t.inside);
    return held;
  }
  fmt::print(out_, "{}: {} process(es) OUTSIDE the slice ({} in it):\n", who, t.outside.size(),
             t.inside);
  for (const Stray& p : t.outside) {
    fmt::print(out_, "  pid {} ({}) uid {} gid {} in {}: {}\n", p.pid, p.name, p.uid, p.gid,
               p.cgroup, p.cmdline);
  }
  fmt::print(out_,
             "  their sockets are still walled by uid and gid, but the VM user runs where the "
             "wall did not put it (a login, cron or at, a lingering user manager, a daemon of "
             "its own, a process that left a slice it could write) — find what started each "
             "(ps -o pid,ppid,lstart,args -p PID; systemctl status PID), stop it, and keep the "
             "VM user to the slice (docs/fy-wall.md, \"The VM user\")\n");
  return false;
}

int Cli::cmd_status() {
  const Wall w = *o_.wall;
  bool compare = o_.config.has_value();
  {
    Flags f = o_.flags;
    f.vm.reset();  // --vm alone names the host wall's table; it renders nothing
    compare = compare || f.any();
  }
  auto s = settings();
  if (!s) return fail(s.error());
  std::optional<Rendered> r;
  std::vector<TableRef> tables;
  if (compare) {
    auto rr = render_wall(w, *s);
    if (!rr) return fail(rr.error());
    r = std::move(*rr);
    tables = r->tables;
  } else if (w == Wall::machine) {
    tables = machine_tables();
  } else if (w == Wall::guard) {
    tables = guard_tables();
  } else {
    if (!s->host.vm) return fail(kExitBadInput, "--vm (or --config) is required for a host wall");
    tables = host_tables_for(s->host.vm->value);
  }
  if (w == Wall::host || w == Wall::machine) {  // the machine wall may name the agent's cgroup
    if (auto p = host_prepare(std::nullopt); !p) return fail(p.error());
  }
  std::vector<std::string> want;
  if (r && r->host) {
    if (auto e = check_cgroup_exists(r->host->cgroup); !e) {
      // The rule names a cgroup id that no longer exists: nothing it matches can run.
      fmt::print(out_, "cgroup {}: ABSENT — {}\n", r->host->cgroup, e.error().message);
      return kExitNotEnforcing;
    }
  }
  if (r) {
    auto c = canonical_listing(r->text, tables);
    if (!c) return fail(c.error());
    want = std::move(*c);
  }
  auto nft = Nft::open();
  if (!nft) return fail(nft.error());

  bool good = true;
  bool uncovered = false;
  for (size_t i = 0; i < tables.size(); ++i) {
    auto live = nft->list(tables[i], true);
    if (!live) return fail(live.error());
    if (!*live) {
      good = false;
      fmt::print(out_, "table {}: ABSENT — the {} wall is NOT enforcing; run `fy-wall apply {}`\n",
                 tables[i].str(), wall_name(w), wall_name(w));
      continue;
    }
    if (!r) {
      fmt::print(out_, "table {}: PRESENT (not compared: give --config or the flags)\n",
                 tables[i].str());
      continue;
    }
    **live = sorted_chains(**live);
    // Every walled uid in every place the rendering keys on them: a uid the
    // user can map but the live rules do not name is not walled there.
    for (const Gap& g : skuid_gaps(r->walled, want[i], **live)) {
      uncovered = true;
      fmt::print(out_, "walled uids NOT covered by table {}: {} — {}\n", tables[i].str(),
                 subid::format_ranges(g.missing), g.place);
    }
    if (**live == want[i]) {
      fmt::print(out_, "table {}: PRESENT, as rendered\n", tables[i].str());
      continue;
    }
    good = false;
    fmt::print(out_,
               "table {}: PRESENT but DIFFERS from the rendered ruleset (changed by hand, or "
               "applied from another config) — run `fy-wall apply {}` to replace it:\n",
               tables[i].str(), wall_name(w));
    for (const std::string& d : diff_lines(**live, want[i])) fmt::print(out_, "    {}\n", d);
  }

  if (w == Wall::guard) {
    auto [table, prio] = guard_route_ids(*s);
    auto routes = PolicyRoutes::open();
    if (!routes) return fail(routes.error());
    auto live = routes->rules(table, prio);
    if (!live) return fail(live.error());
    auto rts = routes->routes(table);
    if (!rts) return fail(rts.error());
    std::vector<PolicyRule> expect = r ? guard_rules(*r->guard) : std::vector<PolicyRule>{};
    std::vector<bool> used(live->size(), false);
    int missing = 0;
    for (const PolicyRule& e : expect) {
      bool found = false;
      for (size_t i = 0; i < live->size() && !found; ++i) {
        if (!used[i] && (*live)[i].exact && (*live)[i].rule == e) used[i] = found = true;
      }
      if (!found) {
        ++missing;
        fmt::print(out_, "policy rule MISSING: {}\n", e.str());
      }
    }
    int extra = 0;
    for (size_t i = 0; i < live->size(); ++i) {
      if (used[i]) continue;
      if (!r) {
        fmt::print(out_, "policy rule: {}\n", (*live)[i].rule.str());
        continue;
      }
      ++extra;
      fmt::print(out_, "policy rule EXTRA (a duplicate or from another config): {}\n",
                 (*live)[i].rule.str());
    }
    bool route_ok = false;
    for (const LiveRoute& rt : *rts) {
      bool want_rt = r && rt.exact && rt.dst == r->guard->gateway;
      route_ok = route_ok || want_rt;
      fmt::print(out_, "route table {}: {}{}\n", table, rt.str,
                 !r || want_rt ? "" : " (EXTRA: not the guard's)");
      if (r && !want_rt) good = false;
    }
    if (rts->empty()) fmt::print(out_, "route table {}: EMPTY\n", table);
    if (r) {
      std::vector<PolicyRule> exact;
      for (const auto& l : *live)
        if (l.exact) exact.push_back(l.rule);
      for (const Gap& g : rule_gaps(r->walled, expect, exact)) {
        uncovered = true;
        fmt::print(out_, "walled uids NOT covered by the policy routes: {} — {}\n",
                   subid::format_ranges(g.missing), g.place);
      }
    }
    if (r) {
      if (missing == 0 && extra == 0 && route_ok) {
        fmt::print(out_,
                   "policy routes: {} rule(s) at priority {} and the lo route, as "
                   "rendered\n",
                   expect.size(), prio);
      } else {
        good = false;
        fmt::print(out_, "policy routes: NOT as rendered — run `fy-wall apply guard`\n");
      }
    } else if (live->empty() || rts->empty()) {
      good = false;
    }
  }
  if (r) fmt::print(out_, "rendered: {}\n", r->summary);
  if (uncovered) {
    good = false;
    fmt::print(out_,
               "the live {} wall does NOT cover every uid the walled user can map "
               "(/etc/subuid changed since it was applied?) — run `fy-wall apply {}`\n",
               wall_name(w), wall_name(w));
  }
  if (w == Wall::machine && r) print_deputies(r->walled, r->agent_cgroup);
  if (w == Wall::host && r && !print_vm_user(*r->host)) good = false;
  if (w == Wall::machine) print_dnsfwd_status(out_, *nft);

  if (w == Wall::host) {
    // The host wall counts its refusals instead of logging them.
    auto live = nft->list(tables[0], false);
    if (live && *live) {
      std::string_view chain;
      for (std::string_view line : split_list(**live, '\n')) {
        line = trim_ows(line);
        if (line.starts_with("chain ")) chain = line.substr(6, line.find(' ', 6) - 6);
        if (line.find("reject") != std::string_view::npos &&
            line.find("counter packets") != std::string_view::npos) {
          fmt::print(out_, "refused ({}): {}\n",
                     chain == "vm" ? "the VM's output" : "loopback input", line);
        }
      }
    }
  } else if (o_.log_lines > 0) {
    std::vector<std::string> needles = w == Wall::machine
                                           ? std::vector<std::string>{"fy-wall-deny"}
                                           : std::vector<std::string>{"fy-guard-deny"};
    size_t total = 0;
    auto lines = kernel_log_lines(needles, o_.log_lines, &total);
    if (!lines) {
      fmt::print(out_, "denied: (the kernel log could not be read: {})\n", lines.error().message);
    } else {
      fmt::print(out_, "denied: {} line(s) in the kernel log{}\n", total,
                 total > lines->size() ? fmt::format(", the newest {}", lines->size()) : "");
      for (const std::string& l : *lines) fmt::print(out_, "  {}\n", l);
    }
  }
  return good ? kExitOk : kExitNotEnforcing;
}

int Cli::run(int argc, char** argv) {
  if (int rc = parse_args(argc, argv); rc != kExitOk) return rc;
  if (o_.command == "help") {
    fmt::print(out_, "{}", kHelp);
    return kExitOk;
  }
  if (o_.command == "version") {
    fmt::print(out_, "fy-wall {}\n", kVersion);
    return kExitOk;
  }
  if (o_.families) {
    fmt::print(out_, "{}", render_families());
    return kExitOk;
  }
  if (o_.command == "render") return cmd_render();
  if (o_.command == "apply") return cmd_apply();
  if (o_.command == "remove") return cmd_remove();
  return cmd_status();
}

}  // namespace

int run_cli(int argc, char** argv, FILE* out, FILE* err) {
  Cli cli(out, err);
  int rc = cli.run(argc, argv);
  fflush(out);
  fflush(err);
  return rc;
}

}  // namespace fy::wall

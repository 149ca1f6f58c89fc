// libFuzzer target: fy-wall's config reader and value parsers over arbitrary
// bytes (the config is operator input). /etc/subuid's reader is core's, with
// its own target (tests/unit/core/fuzz_subid.cc). Whatever
// reads cleanly is also rendered, with a made-up principal in place of the
// passwd lookup, so the renderers see every value the reader accepts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "wall/config.h"
#include "wall/parse.h"
#include "wall/render.h"
#include "wall/vmuser.h"

using namespace fy::wall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)parse_ports(text);
  (void)parse_cidrs(text);
  (void)parse_cgroup_path(text);
  (void)parse_user(text);
  // What the host wall's VM user checks read: the subid files and
  // nsswitch.conf (through core/subid, whose own target is fuzz_subid; here
  // the refusal's message over whatever it reads), and /proc (a task's comm is
  // any process's to choose).
  {
    VmUserSources src;
    src.find = [](const UserRef&) -> fy::Result<std::optional<PasswdEntry>> {
      return std::optional<PasswdEntry>(PasswdEntry{"fuzz", 4646, 4646});
    };
    src.subids = [text](fy::subid::Kind k, const fy::subid::Owner& who, const std::string& p) {
      return fy::subid::from_texts(k, who, text, "nsswitch.conf", text, p, nullptr);
    };
    (void)resolve_vm_user(UserRef{false, 0, "fuzz"}, "--user", src);
  }
  if (auto t = parse_proc_status(text)) (void)task_is_vm_users(*t, VmUser{"fuzz", 4646, 4646});
  if (auto cg = proc_cgroup_v2(text)) (void)cgroup_within(*cg, "fy.slice/vm.slice");

  auto s = read_config(text, "fuzz.toml");
  if (!s) return 0;
  Principal who{4242, "fuzz", {{100000, 165535}}};
  const MachineKeys& mk = s->machine;
  if (mk.gateway && mk.ports) {
    MachineSpec m{who, mk.gateway->value, mk.ports->value,
                  mk.resolvers ? mk.resolvers->value : *parse_cidrs(kPrivateRanges),
                  mk.forward_allow ? mk.forward_allow->value : *parse_cidrs(kPrivateRanges)};
    std::string t = render_machine(m);
    (void)rendered_chains(t, {"inet", kMachineTable});
  }
  const GuardKeys& gk = s->guard;
  auto gw = gk.gateway ? gk.gateway : mk.gateway;
  auto ports = gk.ports ? gk.ports : mk.ports;
  if (gw && ports) {
    auto [table, prio] = guard_route_ids(*s);
    GuardSpec g{who,          gw->value,
                ports->value, gk.listener ? gk.listener->value : *parse_ipv4(kDefaultListener),
                table,        prio};
    (void)render_guard(g);
  }
  Env env;
  env.resolve_vm_user = [](const UserRef&, const std::string&) -> fy::Result<VmUser> {
    return VmUser{"fuzz", 4646, 4646};
  };
  if (auto h = host_spec(*s, env)) (void)render_host(*h);
  return 0;
}

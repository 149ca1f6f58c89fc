#include "wall/routes.h"

#include <arpa/inet.h>
#include <linux/fib_rules.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netlink/addr.h>
#include <netlink/cache.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/route/nexthop.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>

#include <cstring>

#include "wall/parse.h"

namespace fy::wall {
namespace {

// libnl 3.7's rtnl_rule has no uid range, so the guard's rules are built and
// read as raw RTM_*RULE messages over libnl's socket; its routes go through
// rtnl_route.

struct NlMsgFree {
  void operator()(nl_msg* m) const noexcept { nlmsg_free(m); }
};
using NlMsgPtr = std::unique_ptr<nl_msg, NlMsgFree>;

struct NlCacheFree {
  void operator()(nl_cache* c) const noexcept { nl_cache_free(c); }
};
struct RouteFree {
  void operator()(rtnl_route* r) const noexcept { rtnl_route_put(r); }
};
struct AddrFree {
  void operator()(nl_addr* a) const noexcept { nl_addr_put(a); }
};

Error nl_failure(int err, std::string_view what) {
  Errc code = err == -NLE_PERM ? Errc::permission : Errc::io;
  std::string hint = err == -NLE_PERM ? " — fy-wall needs CAP_NET_ADMIN: run it as root" : "";
  return make_error(code, "netlink refused to {}: {}{}", what, nl_geterror(err), hint);
}

uint32_t rule_table(const fib_rule_hdr* frh, nlattr** tb) {
  return tb[FRA_TABLE] ? nla_get_u32(tb[FRA_TABLE]) : frh->table;
}

struct DumpState {
  uint32_t table = 0, priority = 0;
  std::vector<LiveRule>* out = nullptr;
};

int on_rule(nl_msg* msg, void* arg) {
  auto* st = static_cast<DumpState*>(arg);
  nlmsghdr* nlh = nlmsg_hdr(msg);
  if (nlh->nlmsg_type != RTM_NEWRULE) return NL_OK;
  if (nlmsg_datalen(nlh) < static_cast<int>(sizeof(fib_rule_hdr))) return NL_OK;
  auto* frh = static_cast<fib_rule_hdr*>(nlmsg_data(nlh));
  nlattr* tb[FRA_MAX + 1] = {};
  if (nlmsg_parse(nlh, sizeof(fib_rule_hdr), tb, FRA_MAX, nullptr) < 0) return NL_OK;
  if (frh->family != AF_INET) return NL_OK;
  uint32_t prio = tb[FRA_PRIORITY] ? nla_get_u32(tb[FRA_PRIORITY]) : 0;
  if (prio != st->priority || rule_table(frh, tb) != st->table) return NL_OK;

  LiveRule lr;
  lr.raw.assign(static_cast<const char*>(nlmsg_data(nlh)), static_cast<size_t>(nlmsg_datalen(nlh)));
  PolicyRule& r = lr.rule;
  r.table = st->table;
  r.priority = prio;
  bool shape = frh->action == FR_ACT_TO_TBL && frh->dst_len == 32 && frh->src_len == 0 &&
               frh->tos == 0 && (frh->flags & FIB_RULE_INVERT) == 0;
  if (tb[FRA_DST] && nla_len(tb[FRA_DST]) == 4) {
    uint32_t be;
    memcpy(&be, nla_data(tb[FRA_DST]), 4);
    r.to = ntohl(be);
  } else {
    shape = false;
  }
  if (tb[FRA_UID_RANGE] && nla_len(tb[FRA_UID_RANGE]) == sizeof(fib_rule_uid_range)) {
    fib_rule_uid_range u;
    memcpy(&u, nla_data(tb[FRA_UID_RANGE]), sizeof u);
    r.uids = {u.start, u.end};
  } else {
    shape = false;
  }
  if (tb[FRA_DPORT_RANGE] && nla_len(tb[FRA_DPORT_RANGE]) == sizeof(fib_rule_port_range)) {
    fib_rule_port_range p;
    memcpy(&p, nla_data(tb[FRA_DPORT_RANGE]), sizeof p);
    r.dport = {p.start, p.end};
  } else {
    shape = false;
  }
  if (!tb[FRA_IP_PROTO] || nla_get_u8(tb[FRA_IP_PROTO]) != IPPROTO_TCP) shape = false;
  // Any further selector narrows or changes what the rule matches.
  for (int a : {FRA_SRC, FRA_IIFNAME, FRA_OIFNAME, FRA_FWMARK, FRA_FWMASK, FRA_SPORT_RANGE,
                FRA_L3MDEV, FRA_GOTO, FRA_TUN_ID}) {
    if (tb[a]) shape = false;
  }
  lr.exact = shape;
  st->out->push_back(std::move(lr));
  return NL_OK;
}

int lo_index() {
  unsigned idx = if_nametoindex("lo");
  return idx == 0 ? 1 : static_cast<int>(idx);
}

}  // namespace

void NlSockFree::operator()(nl_sock* s) const noexcept {
  nl_socket_free(s);
}

Result<PolicyRoutes> PolicyRoutes::open() {
  NlSockPtr sock(nl_socket_alloc());
  if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket (out of memory)");
  if (int err = nl_connect(sock.get(), NETLINK_ROUTE); err < 0)
    return nl_failure(err, "open a NETLINK_ROUTE socket");
  return PolicyRoutes(std::move(sock));
}

Result<std::vector<LiveRule>> PolicyRoutes::rules(uint32_t table, uint32_t priority) {
  std::vector<LiveRule> out;
  DumpState st{table, priority, &out};
  fib_rule_hdr frh{};
  frh.family = AF_INET;
  if (int err = nl_send_simple(sock_.get(), RTM_GETRULE, NLM_F_DUMP, &frh, sizeof frh); err < 0)
    return nl_failure(err, "list the policy rules");
  nl_socket_modify_cb(sock_.get(), NL_CB_VALID, NL_CB_CUSTOM, on_rule, &st);
  int err = nl_recvmsgs_default(sock_.get());
  nl_socket_modify_cb(sock_.get(), NL_CB_VALID, NL_CB_DEFAULT, nullptr, nullptr);
  if (err < 0) return nl_failure(err, "list the policy rules");
  return out;
}

Result<void> PolicyRoutes::add_rule(const PolicyRule& r) {
  NlMsgPtr msg(nlmsg_alloc_simple(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL));
  if (!msg) return make_error(Errc::io, "cannot allocate a netlink message");
  fib_rule_hdr frh{};
  frh.family = AF_INET;
  frh.dst_len = 32;
  frh.table = static_cast<uint8_t>(r.table < 256 ? r.table : uint32_t{RT_TABLE_UNSPEC});
  frh.action = FR_ACT_TO_TBL;
  uint32_t dst = htonl(r.to);
  fib_rule_uid_range uids{r.uids.lo, r.uids.hi};
  fib_rule_port_range dport{r.dport.lo, r.dport.hi};
  if (nlmsg_append(msg.get(), &frh, sizeof frh, NLMSG_ALIGNTO) < 0 ||
      nla_put_u32(msg.get(), FRA_TABLE, r.table) < 0 ||
      nla_put_u32(msg.get(), FRA_PRIORITY, r.priority) < 0 ||
      nla_put(msg.get(), FRA_DST, 4, &dst) < 0 ||
      nla_put_u8(msg.get(), FRA_IP_PROTO, IPPROTO_TCP) < 0 ||
      nla_put(msg.get(), FRA_DPORT_RANGE, sizeof dport, &dport) < 0 ||
      nla_put(msg.get(), FRA_UID_RANGE, sizeof uids, &uids) < 0) {
    return make_error(Errc::internal, "a policy rule message did not fit");
  }
  if (int err = nl_send_auto(sock_.get(), msg.get()); err < 0)
    return nl_failure(err, "add the rule `" + r.str() + "`");
  if (int err = nl_wait_for_ack(sock_.get()); err < 0)
    return nl_failure(err, "add the rule `" + r.str() + "`");
  return ok();
}

Result<void> PolicyRoutes::delete_rule(const LiveRule& r) {
  NlMsgPtr msg(nlmsg_alloc_simple(RTM_DELRULE, 0));
  if (!msg) return make_error(Errc::io, "cannot allocate a netlink message");
  if (nlmsg_append(msg.get(), const_cast<char*>(r.raw.data()), r.raw.size(), NLMSG_ALIGNTO) < 0)
    return make_error(Errc::internal, "a policy rule message did not fit");
  if (int err = nl_send_auto(sock_.get(), msg.get()); err < 0)
    return nl_failure(err, "delete the rule `" + r.rule.str() + "`");
  if (int err = nl_wait_for_ack(sock_.get()); err < 0)
    return nl_failure(err, "delete the rule `" + r.rule.str() + "`");
  return ok();
}

Result<std::vector<LiveRoute>> PolicyRoutes::routes(uint32_t table) {
  nl_cache* raw = nullptr;
  if (int err = rtnl_route_alloc_cache(sock_.get(), AF_INET, 0, &raw); err < 0)
    return nl_failure(err, "list the routes");
  std::unique_ptr<nl_cache, NlCacheFree> cache(raw);
  std::vector<LiveRoute> out;
  const int lo = lo_index();
  for (nl_object* o = nl_cache_get_first(cache.get()); o; o = nl_cache_get_next(o)) {
    auto* r = reinterpret_cast<rtnl_route*>(o);
    if (rtnl_route_get_table(r) != table) continue;
    LiveRoute lr;
    nl_addr* dst = rtnl_route_get_dst(r);
    if (dst && nl_addr_get_family(dst) == AF_INET && nl_addr_get_len(dst) == 4) {
      uint32_t be;
      memcpy(&be, nl_addr_get_binary_addr(dst), 4);
      lr.dst = ntohl(be);
      lr.dst_len = static_cast<int>(nl_addr_get_prefixlen(dst));
    }
    if (rtnl_route_get_nnexthops(r) == 1) {
      rtnl_nexthop* nh = rtnl_route_nexthop_n(r, 0);
      lr.oif = rtnl_route_nh_get_ifindex(nh);
      lr.exact = lr.oif == lo && lr.dst_len == 32 && !rtnl_route_nh_get_gateway(nh) &&
                 rtnl_route_get_type(r) == RTN_UNICAST;
    }
    lr.str = fmt::format("{}/{} {}", format_ipv4(lr.dst), lr.dst_len,
                         lr.oif == lo ? std::string("dev lo") : fmt::format("oif {}", lr.oif));
    out.push_back(std::move(lr));
  }
  return out;
}

Result<void> PolicyRoutes::replace_route(uint32_t gateway, uint32_t table) {
  std::unique_ptr<rtnl_route, RouteFree> route(rtnl_route_alloc());
  uint32_t be = htonl(gateway);
  std::unique_ptr<nl_addr, AddrFree> dst(nl_addr_build(AF_INET, &be, 4));
  rtnl_nexthop* nh = rtnl_route_nh_alloc();
  if (!route || !dst || !nh) {
    if (nh) rtnl_route_nh_free(nh);
    return make_error(Errc::io, "cannot allocate a route (out of memory)");
  }
  nl_addr_set_prefixlen(dst.get(), 32);
  rtnl_route_set_family(route.get(), AF_INET);
  rtnl_route_set_table(route.get(), table);
  rtnl_route_set_dst(route.get(), dst.get());
  rtnl_route_set_scope(route.get(), RT_SCOPE_LINK);
  rtnl_route_set_type(route.get(), RTN_UNICAST);
  rtnl_route_set_protocol(route.get(), RTPROT_STATIC);
  rtnl_route_nh_set_ifindex(nh, lo_index());
  rtnl_route_add_nexthop(route.get(), nh);  // the route owns nh from here
  if (int err = rtnl_route_add(sock_.get(), route.get(), NLM_F_REPLACE); err < 0) {
    return nl_failure(
        err, fmt::format("set the route {}/32 dev lo table {}", format_ipv4(gateway), table));
  }
  return ok();
}

Result<void> PolicyRoutes::delete_route(const LiveRoute& r, uint32_t table) {
  std::unique_ptr<rtnl_route, RouteFree> route(rtnl_route_alloc());
  uint32_t be = htonl(r.dst);
  std::unique_ptr<nl_addr, AddrFree> dst(nl_addr_build(AF_INET, &be, 4));
  if (!route || !dst) return make_error(Errc::io, "cannot allocate a route (out of memory)");
  nl_addr_set_prefixlen(dst.get(), r.dst_len);
  rtnl_route_set_family(route.get(), AF_INET);
  rtnl_route_set_table(route.get(), table);
  rtnl_route_set_dst(route.get(), dst.get());
  rtnl_route_set_scope(route.get(), RT_SCOPE_NOWHERE);  // any scope
  if (int err = rtnl_route_delete(sock_.get(), route.get(), 0); err < 0 && err != -NLE_OBJ_NOTFOUND)
    return nl_failure(err, fmt::format("delete the route {} from table {}", r.str, table));
  return ok();
}

Result<RouteSync> PolicyRoutes::sync(const std::vector<PolicyRule>& want, uint32_t gateway,
                                     uint32_t table, uint32_t priority) {
  RouteSync rs;
  // The route first: a rule pointing at an empty table would fall through to
  // the next rule (main), and the redirected connection would then be refused
  // by the machine wall — closed, but needlessly.
  FY_TRY(replace_route(gateway, table));
  auto live = rules(table, priority);
  if (!live) return std::move(live).take_error();
  std::vector<bool> kept(live->size(), false);
  for (const PolicyRule& w : want) {
    bool have = false;
    for (size_t i = 0; i < live->size(); ++i) {
      if (!kept[i] && (*live)[i].exact && (*live)[i].rule == w) {
        kept[i] = true;
        have = true;
        break;
      }
    }
    if (!have) {
      FY_TRY(add_rule(w));
      ++rs.rules_added;
    }
  }
  for (size_t i = 0; i < live->size(); ++i) {
    if (kept[i]) continue;
    FY_TRY(delete_rule((*live)[i]));
    ++rs.rules_deleted;
  }
  auto rts = routes(table);
  if (!rts) return std::move(rts).take_error();
  for (const LiveRoute& r : *rts) {
    if (r.exact && r.dst == gateway) continue;
    FY_TRY(delete_route(r, table));
    ++rs.routes_deleted;
  }
  return rs;
}

Result<RouteSync> PolicyRoutes::remove(uint32_t table, uint32_t priority) {
  RouteSync rs;
  auto live = rules(table, priority);
  if (!live) return std::move(live).take_error();
  for (const LiveRule& r : *live) {
    FY_TRY(delete_rule(r));
    ++rs.rules_deleted;
  }
  auto rts = routes(table);
  if (!rts) return std::move(rts).take_error();
  for (const LiveRoute& r : *rts) {
    FY_TRY(delete_route(r, table));
    ++rs.routes_deleted;
  }
  return rs;
}

}  // namespace fy::wall

// The guard's uid-scoped policy routes, through libnl. fy-wall owns every
// IPv4 rule whose priority and table are the guard's (rule_priority,
// route_table), and every route in that table; it touches nothing else.
//
// Netlink has no transactions for rules, so changes are ordered to fail
// closed: a sync adds what is missing before it deletes what is extra, and a
// remove deletes the rules before the routes they point at. Without a rule
// the redirected connection is refused by the machine wall, never let out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "wall/render.h"

struct nl_sock;

namespace fy::wall {

struct NlSockFree {
  void operator()(nl_sock* s) const noexcept;
};
using NlSockPtr = std::unique_ptr<nl_sock, NlSockFree>;

// A rule at the guard's (priority, table) as the kernel holds it.
struct LiveRule {
  PolicyRule rule;     // its match, as far as it has the guard's shape
  bool exact = false;  // true when it is exactly a guard rule (no other selectors)
  std::string raw;     // the rule message's body, to delete this very rule
};

// A route in the guard's table, as the kernel holds it.
struct LiveRoute {
  uint32_t dst = 0;
  int dst_len = 0;
  int oif = 0;
  bool exact = false;  // a plain unicast dst/32 route through lo, nothing more
  std::string str;     // for messages: "192.168.5.2/32 dev lo"
};

struct RouteSync {
  int rules_added = 0, rules_deleted = 0, routes_deleted = 0;
};

class PolicyRoutes {
 public:
  // A NETLINK_ROUTE socket in the calling thread's network namespace.
  static Result<PolicyRoutes> open();

  Result<std::vector<LiveRule>> rules(uint32_t table, uint32_t priority);
  Result<std::vector<LiveRoute>> routes(uint32_t table);

  // Leaves exactly `want` at (table, priority) and exactly one route,
  // gateway/32 dev lo, in `table`.
  Result<RouteSync> sync(const std::vector<PolicyRule>& want, uint32_t gateway, uint32_t table,
                         uint32_t priority);

  // Deletes every rule at (table, priority), then every route in `table`.
  Result<RouteSync> remove(uint32_t table, uint32_t priority);

 private:
  explicit PolicyRoutes(NlSockPtr sock) : sock_(std::move(sock)) {}
  Result<void> add_rule(const PolicyRule& r);
  Result<void> delete_rule(const LiveRule& r);
  Result<void> replace_route(uint32_t gateway, uint32_t table);
  Result<void> delete_route(const LiveRoute& r, uint32_t table);
  NlSockPtr sock_;
};

}  // namespace fy::wall

// Principals: who a credential or a grant is scoped to (issue 17, ADR-0034
// step 6; docs/fy-proxy.md, "Scope"). Pure: strings in, a yes or no out.
//
// A principal is named by what the forwarder's stamp carries and its HMAC
// proves (docs/stamp.md): nothing here asks the engine, so a container's
// name or compose service cannot be named (that needs the engine snapshots
// at request time, which the proxy does not have; see the docs).
//
//   box                   what [scope] box lists (default ["user"])
//   user                  who=user: the VM user's own processes (VM listener)
//   build                 who=build:<any>: a build step in the VM; or a connection
//                         that proved a host-started build's secret (attributed or not)
//   build:<scope>         who=build:<scope> exactly
//   container:<64 hex>    who=container:<id>: a container seen by the VM listener
//   uid:<n>               who=uid:<n>
//   net:<name>            a stamp on network <name> (bridge listener: podman1, ...)
//   net:<name>/<address>  ... from that source address (as the stamp spells it)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace fy::policy {

// Who asked, as admission knows it.
struct Asker {
  enum class State : uint8_t {
    unknown,       // no stamp key: nothing is attributed, nothing is scoped
    attributed,    // a valid stamp is bound; src/net/who are its fields
    unattributed,  // a key is configured and this connection has no valid stamp
  };
  State state = State::unknown;
  std::string_view src, net, who;
  bool build = false;  // the connection proved a build secret (docs/fy-proxy.md, "Build secrets")
};

// Why `sel` is not a principal selector, or nullopt when it is one.
std::optional<std::string> selector_error(std::string_view sel);

// Whether the selector (not "box": the policy expands it) names the asker.
// Only "build" names an asker that is not attributed (a proved build secret).
bool selector_names(std::string_view sel, const Asker& a);

// How the asker is named in logs: "user", "container:<id>",
// "net:podman1/10.89.1.2", "unattributed", "unknown".
std::string asker_text(const Asker& a);

}  // namespace fy::policy

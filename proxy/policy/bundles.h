// Named groups of hosts for the passthrough list ("@node", "@python", ...),
// with the reference's names. "@all" is every bundle. The host lists are this
// implementation's (the reference does not publish its own) and are written
// out in docs/fy-proxy.md.
#pragma once

#include <string_view>
#include <vector>

namespace fy::policy {

// The hosts of bundle `name` (without the '@'); empty for an unknown name.
const std::vector<std::string_view>& bundle_hosts(std::string_view name);
const std::vector<std::string_view>& bundle_names();

}  // namespace fy::policy

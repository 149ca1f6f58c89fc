// The host side of fy-dnsfwd's allow list: the names fy-proxy's policy file
// could allow, as the suffixes fy-dnsfwd's `allow_file` takes
// (docs/fy-dnsfwd.md, "The allow list from the policy"). Pure; links the
// proxy's policy library (fypolicy), so a policy is read exactly as the
// proxy reads it. Only fy-dnsfwd-allow, run on the host, links this: the
// guest's daemon never reads the policy (it lives on the host).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::dnsfwd {

struct AllowList {
  std::vector<std::string> names;     // sorted, unique, lowercase, no final dot
  std::vector<std::string> warnings;  // e.g. the policy is not enforcing
};

// The host part of every pattern the policy could admit at `now_ms`:
// `allow`, `build_allow`, every [[grant]] not yet expired, and the hosts
// the proxy admits for injection ([[inject]], [[held]], [[overlap]]).
// "*.example.com" gives "example.com" (a suffix: also the bare domain);
// ports are dropped; IP literals give nothing (DNS has no part in them).
// A policy the proxy would fail closed on is an error here (nothing to
// render: fail closed), with the proxy's own file:line message.
Result<AllowList> allow_from_policy(std::string_view text, const std::string& path,
                                    int64_t now_ms);

// The allow file's text: a header naming the policy, then one name a line.
std::string render_allow_file(const AllowList& a, const std::string& policy_path);

}  // namespace fy::dnsfwd

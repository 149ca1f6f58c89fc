#include "wall/dnsfwd/allow.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/config.h"
#include "core/net.h"
#include "proxy/policy/pattern.h"
#include "proxy/policy/policy.h"

namespace fy::dnsfwd {

Result<AllowList> allow_from_policy(std::string_view text, const std::string& path,
                                    int64_t now_ms) {
  auto pol = policy::Policy::parse(text, path, now_ms);
  if (!pol) return std::move(pol).take_error();
  AllowList out;
  for (const std::string& w : (*pol)->warnings()) out.warnings.push_back(w);
  if (!(*pol)->enforcing(now_ms)) {
    out.warnings.push_back(fmt::format(
        "{}: the policy is in {} mode: the proxy refuses nothing now, but fy-dnsfwd resolves only "
        "the names below — add the hosts you expect, or render again when it enforces",
        path, policy::mode_name((*pol)->mode())));
  }
  auto add = [&](std::string_view pattern) {
    auto p = policy::parse_pattern(pattern, /*allow_port=*/true);
    if (!p || is_ipv4_literal(p->host) || is_ipv6_literal(p->host) || p->host.empty()) return;
    out.names.push_back(p->host);
  };
  // The policy parsed above, so this second read of the same text finds
  // no error; it only walks the patterns Policy keeps in lookup tables.
  auto doc = cfg::Doc::parse(text, path);
  if (!doc) return std::move(doc).take_error();
  cfg::Table root = doc->root();
  for (const char* key : {"allow", "build_allow"}) {
    if (auto v = root.strings(key)) {
      for (const std::string& s : *v) add(s);
    }
  }
  for (cfg::Table g : root.tables("grant")) {
    auto host = g.string("host");
    if (!host) continue;
    if (auto exp = g.timestamp_ms("expires"); exp && *exp <= now_ms) continue;
    if (auto gr = g.timestamp_ms("granted");
        gr && !g.has("expires") && *gr + policy::kOnceGrantMs <= now_ms) {
      continue;
    }
    add(*host);
  }
  const inject::Rules& r = (*pol)->rules();
  for (const auto& x : r.inject) add(x.host);
  for (const auto& x : r.held) add(x.host);
  for (const auto& x : r.overlaps) add(x.host);
  std::sort(out.names.begin(), out.names.end());
  out.names.erase(std::unique(out.names.begin(), out.names.end()), out.names.end());
  return out;
}

std::string render_allow_file(const AllowList& a, const std::string& policy_path) {
  std::string s = fmt::format(
      "# fy-dnsfwd's allow list, rendered by fy-dnsfwd-allow from {} — do not edit: render "
      "again\n# (one host name suffix a line; docs/fy-dnsfwd.md)\n",
      policy_path);
  for (const std::string& n : a.names) s += n + "\n";
  return s;
}

}  // namespace fy::dnsfwd

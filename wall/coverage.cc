#include "wall/coverage.h"

#include <fmt/format.h>

#include "core/subid.h"
#include "core/text.h"
#include "wall/parse.h"

namespace fy::wall {
namespace {

constexpr std::string_view kSkuid = "meta skuid ";

// "4242" or "100000-165535"; false for anything else (a name, a set).
bool parse_ids(std::string_view s, IdRange* out) {
  size_t dash = s.find('-');
  auto lo = parse_u64(s.substr(0, dash));
  auto hi = dash == std::string_view::npos ? lo : parse_u64(s.substr(dash + 1));
  if (!lo || !hi || *lo > *hi || *hi > 0xffffffffULL) return false;
  *out = IdRange{static_cast<uint32_t>(*lo), static_cast<uint32_t>(*hi)};
  return true;
}

}  // namespace

std::map<std::string, std::vector<IdRange>> skuid_places(std::string_view listing) {
  std::map<std::string, std::vector<IdRange>> out;
  std::string chain;
  while (!listing.empty()) {
    size_t nl = listing.find('\n');
    std::string_view line = trim_ows(listing.substr(0, nl));
    listing.remove_prefix(nl == std::string_view::npos ? listing.size() : nl + 1);
    if (line.starts_with("chain ") && line.ends_with("{")) {
      chain = std::string(line.substr(6, line.find(' ', 6) - 6));
      continue;
    }
    size_t at = line.find(kSkuid);
    if (at == std::string_view::npos) continue;
    std::string_view rest = line.substr(at + kSkuid.size());
    std::string_view value = rest.substr(0, rest.find(' '));
    IdRange ids;
    if (!parse_ids(value, &ids) || (ids.lo == 0 && ids.hi == 0xffffffffu)) continue;
    std::string key = fmt::format("chain {}: {}{}*{}", chain, line.substr(0, at), kSkuid,
                                  rest.substr(value.size()));
    out[key].push_back(ids);
  }
  return out;
}

std::vector<Gap> skuid_gaps(const std::vector<IdRange>& walled, std::string_view rendered,
                            std::string_view live) {
  auto want = skuid_places(rendered);
  auto have = skuid_places(live);
  std::vector<Gap> out;
  for (const auto& [place, ids] : want) {
    (void)ids;
    auto it = have.find(place);
    auto missing = subid::uncovered(walled, it == have.end() ? std::vector<IdRange>{} : it->second);
    if (!missing.empty()) out.push_back(Gap{place, std::move(missing)});
  }
  return out;
}

std::vector<Gap> rule_gaps(const std::vector<IdRange>& walled,
                           const std::vector<PolicyRule>& rendered,
                           const std::vector<PolicyRule>& live) {
  auto key = [](const PolicyRule& r) {
    return fmt::format("ip rule priority {} uidrange * to {}/32 ipproto tcp dport {} lookup {}",
                       r.priority, format_ipv4(r.to), format_range(r.dport), r.table);
  };
  std::map<std::string, std::vector<IdRange>> want, have;
  for (const PolicyRule& r : rendered) want[key(r)].push_back(r.uids);
  for (const PolicyRule& r : live) have[key(r)].push_back(r.uids);
  std::vector<Gap> out;
  for (const auto& [place, ids] : want) {
    (void)ids;
    auto it = have.find(place);
    auto missing = subid::uncovered(walled, it == have.end() ? std::vector<IdRange>{} : it->second);
    if (!missing.empty()) out.push_back(Gap{place, std::move(missing)});
  }
  return out;
}

}  // namespace fy::wall

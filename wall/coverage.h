// Which walled uids the live rules cover: `fy-wall status` holds every place
// the rendering keys on the walled uids (a rule of a chain, a policy route)
// against the live one, and names the uids a place does not cover. Pure: it
// reads nft's listings and the policy rules it is given.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "wall/render.h"
#include "wall/spec.h"

namespace fy::wall {

// The rules of a table listing that match `meta skuid <ids>`, by place: the
// chain and the rule's text with the ids written "*". A rule that matches every
// uid (`meta skuid 0-4294967295`: the "anyone else" rule) is no place.
std::map<std::string, std::vector<IdRange>> skuid_places(std::string_view listing);

// One place where the live rules miss walled uids.
struct Gap {
  std::string place;  // "chain output: meta skuid * jump walled", "ip rule ..."
  std::vector<IdRange> missing;
};

// For every place of `rendered` (nft's listing of the rendering), the uids of
// `walled` that the same place of `live` does not hold. A place the live table
// lacks misses them all.
std::vector<Gap> skuid_gaps(const std::vector<IdRange>& walled, std::string_view rendered,
                            std::string_view live);

// The same for the guard's policy rules: a rule is placed by its destination,
// port range, table and priority.
std::vector<Gap> rule_gaps(const std::vector<IdRange>& walled,
                           const std::vector<PolicyRule>& rendered,
                           const std::vector<PolicyRule>& live);

}  // namespace fy::wall

// Build secrets: a host-started build proves itself with
// Proxy-Authorization: Basic base64("fy-build:<secret>"). The proxy keeps
// only SHA-256 hashes with expiries, in a JSON file the supervisor rewrites
// (the reference's shape): {"tokens": {"<sha256 hex>": "<RFC 3339 expiry>"}}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/result.h"

namespace fy::inject {

inline constexpr std::string_view kBuildUser = "fy-build";

class BuildTokens {
 public:
  // Loads the file; an unreadable or malformed file means no valid secrets
  // (fail closed) and the error says why.
  Result<void> load(const std::string& path);
  bool valid(std::string_view secret, int64_t now_ms) const;
  size_t size() const { return tokens_.size(); }
  void clear() { tokens_.clear(); }

 private:
  std::unordered_map<std::string, int64_t> tokens_;  // sha256 hex -> expiry ms
};

// What a Proxy-Authorization value says about a build.
struct BuildClaim {
  bool marker = false;  // user "fy-build" (the public marker)
  std::string secret;   // the password part, possibly empty
};
BuildClaim parse_proxy_authorization(std::string_view value);

}  // namespace fy::inject

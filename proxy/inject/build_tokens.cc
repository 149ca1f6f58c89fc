#include "proxy/inject/build_tokens.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/clock.h"
#include "core/crypto.h"
#include "core/text.h"

namespace fy::inject {

Result<void> BuildTokens::load(const std::string& path) {
  tokens_.clear();
  std::ifstream in(path);
  if (!in) return make_error(Errc::not_found, "build tokens {} cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_object())
    return make_error(Errc::parse, "build tokens {}: expected {{\"tokens\": {{\"<sha256>\": "
                                   "\"<expiry>\"}}}}; no build secret is valid until it is fixed",
                      path);
  std::unordered_map<std::string, int64_t> tokens;
  for (auto& [hash, expiry] : j["tokens"].items()) {
    auto ms = expiry.is_string() ? parse_iso8601(expiry.get<std::string>()) : std::nullopt;
    if (hash.size() != 64 || !unhex(hash) || !ms)
      return make_error(Errc::parse, "build tokens {}: entry '{}' is not a SHA-256 hex digest "
                                     "with an RFC 3339 expiry; no build secret is valid until it "
                                     "is fixed",
                        path, hash.substr(0, 16));
    tokens[to_lower(hash)] = *ms;
  }
  tokens_ = std::move(tokens);
  return {};
}

bool BuildTokens::valid(std::string_view secret, int64_t now_ms) const {
  if (secret.empty()) return false;
  auto it = tokens_.find(hex(sha256(secret)));
  return it != tokens_.end() && now_ms < it->second;
}

BuildClaim parse_proxy_authorization(std::string_view value) {
  BuildClaim c;
  value = trim_ows(value);
  size_t sp = value.find(' ');
  if (sp == std::string_view::npos || !iequals(value.substr(0, sp), "basic")) return c;
  auto decoded = base64_decode(trim_ows(value.substr(sp + 1)));
  if (!decoded) return c;
  size_t colon = decoded->find(':');
  std::string_view user = std::string_view(*decoded).substr(0, colon);
  if (user != kBuildUser) return c;
  c.marker = true;
  if (colon != std::string::npos) c.secret = decoded->substr(colon + 1);
  return c;
}

}  // namespace fy::inject

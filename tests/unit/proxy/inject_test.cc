// Unit tests for credential injection: rules, redaction, minter output,
// build claims.
#include <doctest/doctest.h>

#include <string>

#include "core/crypto.h"
#include "proxy/inject/build_tokens.h"
#include "proxy/inject/redact.h"
#include "proxy/inject/store.h"
#include "proxy/policy/policy.h"

using namespace fy;
using namespace fy::inject;

namespace {
const int64_t kNow = 1764450000000;
std::string errors_of(const std::string& text) {
  auto p = policy::Policy::parse(text, "p.toml", kNow);
  return p ? "" : p.error().message;
}
}  // namespace

TEST_CASE("token-shaped runs are redacted; short words are kept") {
  CHECK(redact_tokens("key sk_live_AAAAAAAAAAAAAAAAAAAAAAAA failed") == "key ‹redacted› failed");
  CHECK(redact_tokens("short words stay") == "short words stay");
  CHECK(redact_tokens("exactly19characters") == "exactly19characters");
  CHECK(redact_tokens("exactly20characters1!") == "‹redacted›!");
  CHECK(stderr_tail("one\ntwo\n\nthree\nfour\n") == "two / three / four");
  CHECK(stderr_tail(std::string(600, 'a') + " x", 3, 500).size() <= 500);
}

TEST_CASE("query parameters are replaced, every spelling of the name") {
  CHECK(set_query_param("/a?token=dummy&x=1", "token", "T") == "/a?x=1&token=T");
  CHECK(set_query_param("/a", "token", "T") == "/a?token=T");
  CHECK(set_query_param("/a?%74oken=1&token=2&tokens=3", "token", "v w") == "/a?tokens=3&token=v%20w");
  CHECK(redact_query_param("/a?x=1&%74ok%65n=secret&token=s2", "token") ==
        "/a?x=1&%74ok%65n=‹redacted›&token=‹redacted›");
  CHECK(redact_query_param("/a", "token") == "/a");
  CHECK(percent_decode("%41%zz%4") == "A%zz%4");
}

TEST_CASE("minter output: value and ttl, or a reason that never quotes stdout") {
  auto ok = parse_minter_output(R"({"value": "abc", "ttl": 90})");
  REQUIRE(ok.ok());
  CHECK(ok->first == "abc");
  CHECK(ok->second == 90);
  CHECK(parse_minter_output(R"({"value": "abc"})")->second == 3600);
  CHECK(parse_minter_output("not json sk_live_123").error().message == "bad JSON on stdout");
  CHECK(parse_minter_output(R"({"ttl": 5})").error().message == "missing key 'value' in its output");
  CHECK_FALSE(parse_minter_output(R"({"value": 5})").ok());
  CHECK_FALSE(parse_minter_output(R"({"value": "a\nb"})").ok());
  CHECK_FALSE(parse_minter_output(R"({"value": "a", "ttl": -1})").ok());
  CHECK_FALSE(parse_minter_output(R"({"value": "a", "ttl": "5"})").ok());
}

TEST_CASE("a build claim is the fy-build marker with an optional secret") {
  auto c = parse_proxy_authorization("Basic " + base64_encode("fy-build:s3cret"));
  CHECK(c.marker);
  CHECK(c.secret == "s3cret");
  CHECK(parse_proxy_authorization("basic " + base64_encode("fy-build")).marker);
  CHECK_FALSE(parse_proxy_authorization("Basic " + base64_encode("someone:pw")).marker);
  CHECK_FALSE(parse_proxy_authorization("Bearer xyz").marker);
  CHECK_FALSE(parse_proxy_authorization("Basic !!!").marker);
}

TEST_CASE("rules: defaults, secret names, validation with file:line") {
  auto p = policy::Policy::parse(
      "[[inject]]\nswitch = \"my-tracker.v2\"\nhost = \"API.Tracker.Example.\"\n", "p.toml", kNow);
  REQUIRE(p.ok());
  const auto& r = (*p)->rules().inject.at(0);
  CHECK(r.host == "api.tracker.example");
  CHECK(r.header == "Authorization");
  CHECK(r.secret_name() == "FY_INJECT_MY_TRACKER_V2");
  CHECK_FALSE(r.replay_on_401);
  CHECK((*p)->judge({"api.tracker.example", 443, policy::Kind::connect}, kNow) ==
        policy::Verdict::allow);
  CHECK((*p)->judge({"api.tracker.example", 80, policy::Kind::cleartext}, kNow) ==
        policy::Verdict::block);
  CHECK_FALSE((*p)->tunnel("api.tracker.example", "api.tracker.example", false));

  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nhost = \"h.test\"\nheader = \"X\"\nquery_param = "
                  "\"q\"\n")
            .find("p.toml:5:") != std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nhost = \"h.test\"\nbogus = 1\n")
            .find("p.toml:4:9: unknown key 'bogus'") != std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nkind = \"command\"\nhost = \"h.test\"\n")
            .find("needs command") != std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nkind = \"command\"\nhost = \"h.test\"\n"
                  "command = [\"mint\"]\n")
            .find("absolute path") != std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nkind = \"github-app\"\nhost = \"h.test\"\n"
                  "app_id = 1\ninstallation_id = 2\n")
            .find("pinned to api.github.com") != std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nhost = \"*.h.test\"\n").find("not a host name") !=
        std::string::npos);
  CHECK(errors_of("[[inject]]\nswitch = \"a\"\nhost = \"h.test\"\n[[inject]]\nswitch = \"a\"\n"
                  "host = \"g.test\"\n")
            .find("declared twice") != std::string::npos);
}

TEST_CASE("nesting rules on one host become an overlap; disjoint ones do not") {
  auto p = policy::Policy::parse(
      "[[inject]]\nswitch = \"a\"\nhost = \"h.test\"\npath_prefix = \"/v1/\"\n"
      "[[inject]]\nswitch = \"b\"\nhost = \"h.test\"\npath_prefix = \"/v1/admin/\"\n"
      "[[inject]]\nswitch = \"c\"\nhost = \"h.test\"\npath_prefix = \"/v2/\"\n",
      "p.toml", kNow);
  REQUIRE(p.ok());
  const auto& rules = (*p)->rules();
  REQUIRE(rules.overlaps.size() == 1);
  CHECK(rules.overlap_for("h.test", "/v1/admin/x") != nullptr);
  CHECK(rules.overlap_for("h.test", "/v1/x") != nullptr);
  CHECK(rules.overlap_for("h.test", "/v2/x") == nullptr);
  CHECK(rules.rule_for("h.test", "/v2/x")->id == "c");
}

TEST_CASE("an overlap between rules takes the wider prefix: neither rule injects anywhere") {
  auto p = policy::Policy::parse(
      "[[inject]]\nswitch = \"all\"\nhost = \"h.test\"\n"
      "[[inject]]\nswitch = \"v1\"\nhost = \"h.test\"\npath_prefix = \"/v1/\"\n",
      "p.toml", kNow);
  REQUIRE(p.ok());
  const auto& rules = (*p)->rules();
  REQUIRE(rules.overlaps.size() == 1);
  CHECK(rules.overlaps[0].path_prefix.empty());
  CHECK(rules.overlap_for("h.test", "/v1/x") != nullptr);  // where both apply
  CHECK(rules.overlap_for("h.test", "/v2/x") != nullptr);  // where only the wider one does
  CHECK(rules.overlap_for("g.test", "/v2/x") == nullptr);
}

TEST_CASE("a github-app JWT is RS256 over iat/exp/iss") {
  // The key is generated by BoringSSL here; the signature is checked by the
  // integration test with an independent implementation (Python).
  CHECK_FALSE(github_app_jwt("not a pem", 1, 0).ok());
}

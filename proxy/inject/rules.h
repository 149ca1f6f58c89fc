// Credential injection rules, as the policy file declares them (docs/fy-proxy.md,
// "Credential injection"). Parsed and validated with the rest of the policy;
// immutable once built.
//
//   [[inject]]                 one switch and one rule
//   switch = "tracker"         the secret is FY_INJECT_TRACKER in the host env file
//   kind = "static"            static | command | github-app
//   host = "api.tracker.example"
//   path_prefix = "/v1/"       optional
//   header = "Authorization"   default; XOR query_param
//   value_prefix = "Bearer "
//   replay_on_401 = false      github-app: true
//   ttl = 43200                static: seconds a read value is kept
//   command = ["/usr/bin/mint", "--org", "x"]      command: argv, no shell
//   env = ["TRACKER_ORG"]      command: names the minter may see
//   app_id = 1, installation_id = 2, repositories = ["o/r"]   github-app
//
//   [[held]]   a switch that is off: its dummy is answered 401 by the proxy
//   [[overlap]] two rules that nest on one host: the proxy answers 502
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fy::cfg {
class Table;
}

namespace fy::inject {

// The largest request body (its bytes as sent, framing included) an exchange
// on a replay_on_401 rule keeps so that a 401 can be answered by a re-mint and
// a re-issue of head and body: the reference's body streaming threshold. A
// larger body is streamed without a copy, and its 401 goes back to the client.
inline constexpr size_t kMaxReplayBody = 1024 * 1024;
// All the bodies kept for a replay at once, proxy-wide: past it a body is
// streamed unkept (a 401 to it goes back to the client), so a crowd of slow
// uploads cannot pin kMaxReplayBody each.
inline constexpr size_t kMaxReplayBodies = 64 * 1024 * 1024;

enum class Kind : uint8_t { static_secret, command, github_app };
const char* kind_name(Kind k);

struct Rule {
  std::string id;      // the switch name: the rule's identity in rows and metrics
  Kind kind = Kind::static_secret;
  std::string host;    // normalized; injection is HTTPS to host:443 only
  std::string path_prefix;
  std::string header;       // "" when query_param is used
  std::string query_param;  // "" when header is used
  std::string value_prefix;
  bool replay_on_401 = false;
  int64_t ttl_s = 12 * 3600;  // static: how long a read value is used
  std::vector<std::string> command;  // command kind
  std::vector<std::string> env;      // command kind: declared names
  int64_t app_id = 0;                // github-app
  int64_t installation_id = 0;
  std::vector<std::string> repositories;
  // Scope (docs/fy-proxy.md, "Scope"): the principals this credential goes to
  // when [scope] mode = "on" (empty: the scope's `credentials` list), and the
  // provider-shaped JSON the others are answered 401 with ("": a [[held]]
  // entry's body for the same host and path, else foldyard's own).
  std::vector<std::string> principals;
  std::string refused_body;
  std::string where;  // file:line, for messages

  // The host env file's variable for this switch: FY_INJECT_<SWITCH>, upper
  // case, non-alphanumerics as '_'.
  std::string secret_name() const;
  // Everything that defines the credential, for cache identity: a rule whose
  // spec and secret are unchanged keeps its token across reloads.
  std::string spec() const;
  bool matches(std::string_view host, std::string_view path) const;
};

struct Held {
  std::string host;
  std::string path_prefix;
  std::string header = "Authorization";  // or query_param
  std::string query_param;
  std::string dummy;
  std::string axis;
  std::string body;   // the provider-shaped JSON answered with the 401
  bool any_scheme = false;  // the dummy may follow one scheme word ("Bearer <dummy>")
  bool matches(std::string_view host, std::string_view path) const;
};

struct Overlap {
  std::string host;
  std::string path_prefix;
  std::string message;
  bool matches(std::string_view host, std::string_view path) const;
};

struct Rules {
  std::vector<Rule> inject;
  std::vector<Held> held;
  std::vector<Overlap> overlaps;  // configured, plus those found between rules
  std::vector<std::pair<std::string, std::string>> defaults;  // [defaults] NAME = value

  // The first rule for (host, path), or nullptr.
  const Rule* rule_for(std::string_view host, std::string_view path) const;
  const Rule* by_id(std::string_view id) const;
  const Held* held_for(std::string_view host, std::string_view path) const;
  const Overlap* overlap_for(std::string_view host, std::string_view path) const;
  // Hosts the proxy must decrypt (and admit at CONNECT :443) so it can act.
  bool is_injector_host(std::string_view host) const;
  bool is_answer_host(std::string_view host) const;  // held or overlap
};

// Reads [[inject]], [[held]], [[overlap]] and [defaults] from the policy's
// root table, recording errors (with file:line) in the document.
void parse_rules(cfg::Table& root, Rules* out);

}  // namespace fy::inject

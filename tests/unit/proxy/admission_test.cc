// Admission (proxy/policy/admission.h), table-driven: each row is one line of
// the order of checks in docs/fy-proxy.md, a real policy (parsed from TOML as
// the proxy parses its file) and the facts of one request, and the Decision
// the proxy must apply.
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proxy/policy/admission.h"
#include "proxy/policy/policy.h"

namespace adm = fy::admission;
using adm::Action;
using adm::Answer;
using adm::Why;
using fy::HostPort;
using fy::netlog::Attribution;
using fy::policy::Kind;
using fy::policy::Policy;

namespace {

constexpr int64_t kNow = 1'800'000'000'000;  // 2027-01-15

// One policy for most rows: an allowlist, a build-only host, passthrough, an
// injector, a held dummy and an overlap.
const char* kPolicy = R"(
allow = ["pypi.org", "api.example.com:8443", "pass.example", "plain.example:80", "both.example"]
build_allow = ["files.pythonhosted.org"]
passthrough = ["pass.example", "api.tracker.example", "both.example"]

[[inject]]
switch = "tracker"
host = "api.tracker.example"
path_prefix = "/v1/"

[[inject]]
switch = "both"
host = "both.example"
path_prefix = "/api/"

[[held]]
host = "api.held.example"
header = "x-api-key"
dummy = "sk-dummy"
axis = "held-axis"

[[held]]
host = "both.example"
header = "x-api-key"
dummy = "sk-both"

[[held]]
host = "api.query.example"
query_param = "key"
dummy = "d1"
any_scheme = false

[[held]]
host = "api.scheme.example"
dummy = "sk-s"
any_scheme = true

[[overlap]]
host = "api.over.example"
path_prefix = "/v1/"
message = "a and b both claim api.over.example/v1/"
)";

std::shared_ptr<const Policy> load(const std::string& text) {
  auto p = Policy::parse(text, "test-policy.toml", kNow);
  REQUIRE_MESSAGE(p, (p ? "" : p.error().message));
  return *p;
}

const Policy& base() {
  static auto p = load(kPolicy);
  return *p;
}
const Policy& require_stamp() {
  static auto p = load(std::string("attribution = \"require\"\n") + kPolicy);
  return *p;
}
const Policy& observe() {
  static auto p = load(std::string("mode = \"observe\"\n") + kPolicy);
  return *p;
}

enum class Pol { base, require_stamp, observe };
const Policy& policy_of(Pol p) {
  switch (p) {
    case Pol::require_stamp: return require_stamp();
    case Pol::observe: return observe();
    default: return base();
  }
}

struct Row {
  const char* what;  // the docs line this row stands for
  Pol pol = Pol::base;
  // The facts.
  const char* method = "GET";
  const char* target = "http://pypi.org/simple/";
  const char* host = "pypi.org";   // the Host header; nullptr: none
  const char* inside = nullptr;    // the CONNECT target ("host:port") the request is inside
  Kind inside_kind = Kind::https;
  const char* sni = "";
  const char* header = nullptr;    // one more header: "name: value"
  bool proved = false, marker = false, proxy_auth = false;
  Attribution attribution = Attribution::none;
  bool complete = true;
  uint8_t minor = 1;
  // The Decision.
  Action action = Action::forward;
  Answer answer = Answer::none;
  bool close_after = false;
  const char* key = nullptr;       // nullptr: not checked
  const char* rule = nullptr;      // forward: the rule's switch, nullptr none
  bool would_block = false;
  bool implicit_only = false;
  Kind inner_kind = Kind::https;   // establish
  const char* detail = nullptr;
};

adm::Decision run(const Row& row, std::vector<fy::http::Header>* headers, adm::Inside* inside) {
  adm::Request r;
  r.principal.attribution = row.attribution;
  r.build = {row.proved, row.marker, row.proxy_auth};
  if (row.inside) {
    auto hp = fy::parse_authority(row.inside, 0);
    REQUIRE(hp);
    *inside = {*hp, row.inside_kind, row.sni};
    r.inside = inside;
  }
  r.method = row.method;
  r.target = row.target;
  if (row.host) r.host = std::string_view(row.host);
  r.http_minor = row.minor;
  if (row.host) headers->push_back({"Host", row.host});
  if (row.header) {
    std::string_view h = row.header;
    size_t colon = h.find(':');
    headers->push_back({h.substr(0, colon), h.substr(colon + 2)});
  }
  r.headers = *headers;
  r.message_complete = row.complete;
  r.now_ms = kNow;
  return adm::decide_request(r, policy_of(row.pol));
}

// The order of checks, "What it does with a request" and its neighbours.
const Row kRows[] = {
    // 0. Who asked (Stamps: attribution = "require").
    {.what = "require: an unattributed connection is refused 403",
     .pol = Pol::require_stamp, .attribution = Attribution::unattributed,
     .action = Action::answer, .answer = Answer::unattributed, .close_after = true},
    {.what = "require: the refusal comes before the scheme is read",
     .pol = Pol::require_stamp, .target = "/origin-form", .attribution = Attribution::unattributed,
     .action = Action::answer, .answer = Answer::unattributed, .close_after = true},
    {.what = "require: an attributed connection goes on", .pol = Pol::require_stamp,
     .attribution = Attribution::attributed, .key = "pypi.org"},
    {.what = "record: an unattributed connection goes on",
     .attribution = Attribution::unattributed, .key = "pypi.org"},

    // 1. Scheme and authority.
    {.what = "absolute-form http:// is judged on its authority", .key = "pypi.org"},
    {.what = "origin-form requests are answered 400", .target = "/simple/",
     .action = Action::answer, .answer = Answer::origin_form, .close_after = true},
    {.what = "other schemes are answered 400", .target = "ftp://pypi.org/x",
     .action = Action::answer, .answer = Answer::bad_scheme, .close_after = true,
     .detail = "ftp"},
    {.what = "userinfo in the URL is not absolute form", .target = "http://u@pypi.org/",
     .action = Action::answer, .answer = Answer::origin_form, .close_after = true},
    {.what = "a URL authority that is not a host is answered 400", .target = "http://a_b!/",
     .host = nullptr, .action = Action::answer, .answer = Answer::bad_authority,
     .close_after = true},
    {.what = "CONNECT needs host:port", .method = "CONNECT", .target = "pypi.org", .host = nullptr,
     .action = Action::answer, .answer = Answer::bad_connect, .close_after = true},
    {.what = "inside a tunnel, a target that is not a path is 400", .method = "CONNECT",
     .target = "pypi.org:443", .host = nullptr, .inside = "pypi.org:443",
     .action = Action::answer, .answer = Answer::bad_head, .close_after = true,
     .detail = "the request target is not a path"},
    {.what = "inside a tunnel, an origin-form path goes to the CONNECT target",
     .target = "/simple/", .inside = "pypi.org:443", .sni = "pypi.org", .key = "pypi.org"},

    // 2. The Host claim.
    {.what = "a Host naming another host is refused 403", .host = "evil.example",
     .action = Action::answer, .answer = Answer::claim, .close_after = false, .key = "pypi.org"},
    {.what = "a Host naming another port is refused 403", .host = "pypi.org:8080",
     .action = Action::answer, .answer = Answer::claim, .key = "pypi.org"},
    {.what = "a refused claim with a body left unread closes", .host = "evil.example",
     .complete = false, .action = Action::answer, .answer = Answer::claim, .close_after = true},
    {.what = "HTTP/1.1 without Host is 400", .host = nullptr, .action = Action::answer,
     .answer = Answer::bad_head, .close_after = true,
     .detail = "an HTTP/1.1 request needs a Host header"},
    {.what = "HTTP/1.0 without Host goes on", .host = nullptr, .minor = 0, .key = "pypi.org"},
    {.what = "a CONNECT's Host names the same authority", .method = "CONNECT",
     .target = "pypi.org:443", .host = "pypi.org:443", .action = Action::establish,
     .key = "pypi.org"},
    {.what = "a CONNECT whose Host disagrees is refused 403 and closed", .method = "CONNECT",
     .target = "pypi.org:443", .host = "other.example:443", .action = Action::answer,
     .answer = Answer::claim, .close_after = true, .key = "pypi.org"},
    {.what = "an absolute URL inside a tunnel naming another host is refused 403",
     .target = "https://evil.example/x", .host = "pypi.org", .inside = "pypi.org:443",
     .action = Action::answer, .answer = Answer::claim, .key = "pypi.org"},
    {.what = "an absolute URL inside a tunnel naming its target goes on",
     .target = "https://pypi.org/x", .host = "pypi.org", .inside = "pypi.org:443",
     .key = "pypi.org"},

    // 3. Overlap (502), held dummy (401): HTTPS the proxy decrypted.
    {.what = "an overlap is answered 502", .target = "/v1/x", .host = "api.over.example",
     .inside = "api.over.example:443", .sni = "api.over.example", .action = Action::answer,
     .answer = Answer::overlap, .key = "api.over.example"},
    {.what = "an overlap answer with a body unread closes", .target = "/v1/x",
     .host = "api.over.example", .inside = "api.over.example:443", .complete = false,
     .action = Action::answer, .answer = Answer::overlap, .close_after = true},
    {.what = "an overlap outside its prefix goes on to the wall", .target = "/v2/x",
     .host = "api.over.example", .inside = "api.over.example:443", .action = Action::answer,
     .answer = Answer::allowlist, .key = "api.over.example"},
    {.what = "a held dummy is answered 401", .target = "/x", .host = "api.held.example",
     .inside = "api.held.example:443", .header = "x-api-key: sk-dummy", .action = Action::answer,
     .answer = Answer::held},
    {.what = "a held host with another value goes on to the wall", .target = "/x",
     .host = "api.held.example", .inside = "api.held.example:443",
     .header = "x-api-key: sk-real", .action = Action::answer, .answer = Answer::allowlist,
     .close_after = false, .key = "api.held.example"},
    {.what = "a held query parameter (percent-encoded name) is answered 401",
     .target = "/x?a=1&%6Bey=d1", .host = "api.query.example", .inside = "api.query.example:443",
     .action = Action::answer, .answer = Answer::held},
    {.what = "any_scheme: one word and the dummy is the dummy", .target = "/x",
     .host = "api.scheme.example", .inside = "api.scheme.example:443",
     .header = "authorization: Bearer sk-s", .action = Action::answer, .answer = Answer::held},
    {.what = "held and overlap apply only to HTTPS the proxy decrypted", .target = "/v1/x",
     .host = "api.over.example", .inside = "api.over.example:80",
     .inside_kind = Kind::cleartext, .action = Action::answer, .answer = Answer::allowlist,
     .key = "api.over.example"},

    // 4. The wall, the build proof and the 407 rule.
    {.what = "not on the allowlist: 403 with the key", .target = "http://blocked.example/",
     .host = "blocked.example", .action = Action::answer, .answer = Answer::allowlist,
     .close_after = false, .key = "blocked.example"},
    {.what = "a refusal with a body left unread closes", .target = "http://blocked.example/",
     .host = "blocked.example", .complete = false, .action = Action::answer,
     .answer = Answer::allowlist, .close_after = true},
    {.what = "a bare pattern covers :80 only in cleartext", .target = "http://pypi.org:443/",
     .host = "pypi.org:443", .action = Action::answer, .answer = Answer::allowlist,
     .key = "pypi.org:443"},
    {.what = "host:port covers exactly that port", .target = "https://api.example.com:8443/x",
     .host = "api.example.com:8443", .key = "api.example.com:8443"},
    {.what = "a build-only host without credentials is challenged 407",
     .target = "http://files.pythonhosted.org/x", .host = "files.pythonhosted.org",
     .action = Action::challenge, .close_after = false, .key = "files.pythonhosted.org"},
    {.what = "a 407 with a body left unread closes", .target = "http://files.pythonhosted.org/x",
     .host = "files.pythonhosted.org", .complete = false, .action = Action::challenge,
     .close_after = true},
    {.what = "credentials sent but not a valid secret: 403, not 407",
     .target = "http://files.pythonhosted.org/x", .host = "files.pythonhosted.org",
     .marker = true, .proxy_auth = true, .action = Action::answer, .answer = Answer::allowlist},
    {.what = "a valid build secret opens build_allow",
     .target = "http://files.pythonhosted.org/x", .host = "files.pythonhosted.org",
     .proved = true, .marker = true, .proxy_auth = true, .key = "files.pythonhosted.org"},
    {.what = "a build-only CONNECT without credentials is challenged, kept open",
     .method = "CONNECT", .target = "files.pythonhosted.org:443", .host = nullptr,
     .action = Action::challenge, .close_after = false, .key = "files.pythonhosted.org"},
    {.what = "never a 407 inside a tunnel", .target = "/x", .host = "files.pythonhosted.org",
     .inside = "files.pythonhosted.org:443", .action = Action::answer,
     .answer = Answer::allowlist},
    {.what = "a refused CONNECT is 403 and closed (no dial, no TLS)", .method = "CONNECT",
     .target = "blocked.example:443", .host = nullptr, .action = Action::answer,
     .answer = Answer::allowlist, .close_after = true, .key = "blocked.example"},
    {.what = "a refused CONNECT off :443 is keyed host:port", .method = "CONNECT",
     .target = "pypi.org:22", .host = nullptr, .action = Action::answer,
     .answer = Answer::allowlist, .close_after = true, .key = "pypi.org:22"},
    {.what = "observing: refused nothing, would_block", .pol = Pol::observe,
     .target = "http://blocked.example/", .host = "blocked.example", .key = "blocked.example",
     .would_block = true},
    {.what = "observing: a CONNECT is admitted, would_block", .pol = Pol::observe,
     .method = "CONNECT", .target = "blocked.example:443", .host = nullptr,
     .action = Action::establish, .would_block = true},

    // 5. Implicit-only CONNECT.
    {.what = "an injector host's CONNECT :443 is admitted only for decryption",
     .method = "CONNECT", .target = "api.tracker.example:443", .host = nullptr,
     .action = Action::establish, .implicit_only = true},
    {.what = "a held host's CONNECT :443 is admitted only for decryption", .method = "CONNECT",
     .target = "api.held.example:443", .host = nullptr, .action = Action::establish,
     .implicit_only = true},
    {.what = "an allowed CONNECT is not implicit only", .method = "CONNECT",
     .target = "pypi.org:443", .host = nullptr, .action = Action::establish,
     .implicit_only = false},
    {.what = "an injector host off :443 is not admitted", .method = "CONNECT",
     .target = "api.tracker.example:8443", .host = nullptr, .action = Action::answer,
     .answer = Answer::allowlist, .close_after = true},
    {.what = "a CONNECT to :80 serves its requests as cleartext", .method = "CONNECT",
     .target = "plain.example:80", .host = nullptr, .action = Action::establish,
     .inner_kind = Kind::cleartext},
    {.what = "an injector host is never admitted in cleartext",
     .target = "http://api.tracker.example/v1/x", .host = "api.tracker.example",
     .action = Action::answer, .answer = Answer::allowlist},

    // 7. Rule selection.
    {.what = "destination, Host and SNI agree: the rule is injected", .target = "/v1/issues",
     .host = "api.tracker.example", .inside = "api.tracker.example:443",
     .sni = "api.tracker.example", .rule = "tracker"},
    {.what = "an SNI that disagrees: nothing injected (the host is still admitted)",
     .target = "/v1/issues", .host = "api.tracker.example", .inside = "api.tracker.example:443",
     .sni = "other.example", .rule = nullptr},
    {.what = "outside the rule's path prefix: nothing injected", .target = "/v2/x",
     .host = "api.tracker.example", .inside = "api.tracker.example:443",
     .sni = "api.tracker.example", .rule = nullptr},
    {.what = "an active rule wins over a held dummy", .target = "/api/x", .host = "both.example",
     .inside = "both.example:443", .sni = "both.example", .header = "x-api-key: sk-both",
     .rule = "both"},
    {.what = "a held dummy where no rule applies is answered", .target = "/other",
     .host = "both.example", .inside = "both.example:443", .sni = "both.example",
     .header = "x-api-key: sk-both", .action = Action::answer, .answer = Answer::held},
};

}  // namespace

TEST_CASE("admission: the order of checks, one row each") {
  for (const Row& row : kRows) {
    std::string what = row.what;
    CAPTURE(what);
    std::vector<fy::http::Header> headers;
    adm::Inside inside;
    adm::Decision d = run(row, &headers, &inside);
    CHECK(static_cast<int>(d.action) == static_cast<int>(row.action));
    CHECK(static_cast<int>(d.answer) == static_cast<int>(row.answer));
    if (row.action == Action::answer || row.action == Action::challenge)
      CHECK(d.close_after == row.close_after);
    if (row.key) CHECK(d.key == row.key);
    if (row.detail) CHECK(d.detail == row.detail);
    if (row.action == Action::forward) {
      CHECK(d.has_dest);
      CHECK(d.would_block == row.would_block);
      if (row.rule) {
        REQUIRE(d.rule);
        CHECK(d.rule->id == row.rule);
      } else {
        CHECK(d.rule == nullptr);
      }
    }
    if (row.action == Action::establish) {
      CHECK(d.kind == Kind::connect);
      CHECK(d.implicit_only == row.implicit_only);
      CHECK(d.would_block == row.would_block);
      CHECK(d.inner_kind == row.inner_kind);
    }
    if (row.answer == Answer::held) CHECK(d.held != nullptr);
    if (row.answer == Answer::overlap) {
      REQUIRE(d.overlap);
      CHECK(d.overlap->message == "a and b both claim api.over.example/v1/");
    }
  }
}

TEST_CASE("admission: the row's destination, kind and path as the Network Log needs them") {
  Row row{.what = "https:// absolute form", .target = "https://api.example.com:8443/a?b=1",
          .host = "api.example.com:8443"};
  std::vector<fy::http::Header> headers;
  adm::Inside inside;
  adm::Decision d = run(row, &headers, &inside);
  CHECK(d.action == Action::forward);
  CHECK(d.dest == HostPort{"api.example.com", 8443});
  CHECK(d.kind == Kind::https);
  REQUIRE(d.path);
  CHECK(*d.path == "/a?b=1");
  // A refusal before the destination is known names none.
  Row early{.what = "origin form", .target = "/x"};
  headers.clear();
  d = run(early, &headers, &inside);
  CHECK(!d.has_dest);
  CHECK(d.key.empty());
  CHECK(!d.path);
  // Inside a tunnel a URL that names another host is keyed on the CONNECT
  // target, and the destination is not taken from the URL.
  Row claim{.what = "claim inside", .target = "https://evil.example/x", .host = "pypi.org",
            .inside = "pypi.org:443"};
  headers.clear();
  d = run(claim, &headers, &inside);
  CHECK(d.answer == Answer::claim);
  CHECK(!d.has_dest);
  CHECK(d.key == "pypi.org");
}

// 6. Decrypt or tunnel: the first bytes after the 200.
TEST_CASE("admission: decrypt or tunnel, one row each") {
  struct HelloRow {
    const char* what;
    adm::Hello::Shape shape;
    const char* dest;
    bool sni_present;
    const char* sni;
    bool implicit_only;
    bool marker;
    Action action;
    adm::TunnelKind tunnel = adm::TunnelKind::passthrough;
    Why why = Why::none;
  };
  using S = adm::Hello::Shape;
  const HelloRow rows[] = {
      {"a passthrough host whose SNI agrees is tunnelled", S::tls, "pass.example:443", true,
       "pass.example", false, false, Action::tunnel},
      {"a passthrough host without SNI is tunnelled", S::tls, "pass.example:443", false, "",
       false, false, Action::tunnel},
      {"an SNI that disagrees with the target is always decrypted", S::tls, "pass.example:443",
       true, "other.example", false, false, Action::decrypt},
      {"an SNI present but not a host name is decrypted", S::tls, "pass.example:443", true, "",
       false, false, Action::decrypt},
      {"a host not in passthrough is decrypted", S::tls, "pypi.org:443", true, "pypi.org", false,
       false, Action::decrypt},
      {"an injector host is decrypted even when listed in passthrough", S::tls,
       "api.tracker.example:443", true, "api.tracker.example", true, false, Action::decrypt},
      {"a build's TLS is passed through", S::tls, "pypi.org:443", true, "pypi.org", false, true,
       Action::tunnel},
      {"a build's TLS to an answer host is decrypted", S::tls, "api.held.example:443", true,
       "api.held.example", true, true, Action::decrypt},
      {"cleartext HTTP inside the CONNECT is served", S::http, "plain.example:80", false, "",
       false, false, Action::serve_plain},
      {"anything else is an opaque tunnel", S::other, "pypi.org:443", false, "", false, false,
       Action::tunnel, adm::TunnelKind::opaque},
      {"silence off :443 is an opaque tunnel", S::silence, "pypi.org:22", false, "", false, false,
       Action::tunnel, adm::TunnelKind::opaque},
      {"implicit only, and not TLS: closed", S::other, "api.tracker.example:443", false, "", true,
       false, Action::close, adm::TunnelKind::passthrough, Why::implicit_only_not_tls},
      {"implicit only, and silent: closed (fails closed)", S::silence, "api.tracker.example:443",
       false, "", true, false, Action::close, adm::TunnelKind::passthrough,
       Why::implicit_only_not_tls},
      {"a malformed ClientHello is closed", S::malformed, "pypi.org:443", false, "", false, false,
       Action::close, adm::TunnelKind::passthrough, Why::malformed_hello},
  };
  for (const HelloRow& row : rows) {
    std::string what = row.what;
    CAPTURE(what);
    auto dest = fy::parse_authority(row.dest, 0);
    REQUIRE(dest);
    adm::Hello h;
    h.shape = row.shape;
    h.dest = &*dest;
    h.sni_present = row.sni_present;
    h.sni = row.sni;
    h.implicit_only = row.implicit_only;
    h.build.marker = row.marker;
    adm::Decision d = adm::decide_hello(h, base());
    CHECK(static_cast<int>(d.action) == static_cast<int>(row.action));
    if (row.action == Action::tunnel) CHECK(d.tunnel == row.tunnel);
    if (row.action == Action::close) CHECK(d.why == row.why);
    if (row.action == Action::decrypt) CHECK(d.inner_kind == Kind::https);
    if (row.action == Action::serve_plain) CHECK(d.inner_kind == Kind::cleartext);
  }
}

TEST_CASE("admission: an open connection re-judged when the policy changes") {
  auto narrower = load(R"(
allow = ["pypi.org"]
passthrough = []
)");
  HostPort pass{"pass.example", 443};
  HostPort pypi{"pypi.org", 443};
  HostPort gone{"gone.example", 80};
  adm::Inside in_pass{pass, Kind::https, "pass.example"};
  adm::Inside in_pypi{pypi, Kind::https, "pypi.org"};

  adm::Open o;
  o.now_ms = kNow;
  o.principal.attribution = Attribution::unattributed;
  CHECK(adm::decide_open(o, require_stamp()).why == Why::require_stamp);
  CHECK(adm::decide_open(o, base()).action == Action::keep);

  o = {};
  o.now_ms = kNow;
  o.inside = &in_pass;
  CHECK(adm::decide_open(o, base()).action == Action::keep);
  CHECK(adm::decide_open(o, *narrower).why == Why::refused_now);

  // A passthrough tunnel whose host would now be decrypted.
  auto still_allowed = load(R"(
allow = ["pass.example"]
passthrough = []
)");
  o.tunnel = true;
  o.passthrough = true;
  CHECK(adm::decide_open(o, base()).action == Action::keep);
  CHECK(adm::decide_open(o, *still_allowed).why == Why::left_passthrough);
  o.passthrough = false;  // decrypted: nothing to leave
  CHECK(adm::decide_open(o, *still_allowed).action == Action::keep);

  // An exchange in flight to a destination now refused is closed.
  o = {};
  o.now_ms = kNow;
  o.exchange = true;
  o.exchange_dest = HostPort{"plain.example", 80};
  o.exchange_kind = Kind::cleartext;
  o.origin = &o.exchange_dest;
  CHECK(adm::decide_open(o, base()).action == Action::keep);
  CHECK(adm::decide_open(o, *narrower).why == Why::refused_now);
  // Idle, with a kept origin now refused: only the origin goes.
  o.exchange = false;
  o.origin = &gone;
  CHECK(adm::decide_open(o, *narrower).action == Action::retire_origin);
  o.origin = nullptr;
  CHECK(adm::decide_open(o, *narrower).action == Action::keep);
  (void)in_pypi;
}

TEST_CASE("admission: a request whose rule changed while its credential was minted") {
  HostPort tracker{"api.tracker.example", 443};
  // Still admitted (an injector host over HTTPS :443): forwarded, no rule.
  adm::Decision d = adm::decide_unruled(tracker, Kind::https, {}, {}, true, kNow, base());
  CHECK(d.action == Action::forward);
  CHECK(d.rule == nullptr);
  // Refused once the rule (and so the implicit admission) is gone.
  auto without = load("allow = []\n");
  d = adm::decide_unruled(tracker, Kind::https, {}, {}, false, kNow, *without);
  CHECK(d.action == Action::answer);
  CHECK(d.answer == Answer::allowlist);
  CHECK(d.close_after);
  CHECK(d.key == "api.tracker.example");
}

// Scope (docs/fy-proxy.md, "Scope"): credentials and grants for the
// principals the policy names, decided at step 7 (and step 4 for grants).
namespace {

constexpr const char* kBoxNet = "podman1";
constexpr const char* kSibling =
    "container:1111111111111111111111111111111111111111111111111111111111111111";

const char* kScoped = R"(
allow = ["pypi.org"]

[scope]
mode = "on"
box = ["user", "net:podman1/10.89.1.2"]

[[inject]]
switch = "tracker"
host = "api.tracker.example"

[[inject]]
switch = "cms"
host = "api.cms.example"
principals = ["box", "net:podman1/10.89.1.7"]
refused_body = '{"errors":[{"message":"Unauthorized"}]}'

[[inject]]
switch = "anth"
host = "api.anthropic.test"

[[inject]]
switch = "bld"
host = "api.build.example"
principals = ["build"]

[[held]]
host = "api.anthropic.test"
header = "x-api-key"
dummy = "sk-ant-dummy"
body = '{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}'

[[grant]]
host = "eval.example"
principals = ["container:1111111111111111111111111111111111111111111111111111111111111111"]

[[grant]]
host = "boxonly.example"
principals = ["box"]
)";

struct Who {
  Attribution attribution;
  const char* src;
  const char* net;
  const char* who;
};
constexpr Who kUser{Attribution::attributed, "127.0.0.1", "host", "user"};
constexpr Who kBoxBridge{Attribution::attributed, "10.89.1.2", kBoxNet, ""};
constexpr Who kService{Attribution::attributed, "10.89.1.7", kBoxNet, ""};
constexpr Who kOtherBridge{Attribution::attributed, "10.89.1.9", kBoxNet, ""};
constexpr Who kSib{Attribution::attributed, "127.0.0.1", "host", kSibling};
constexpr Who kBuild{Attribution::attributed, "127.0.0.1", "host", "build:crun-buildah-x.scope"};
constexpr Who kUnattributed{Attribution::unattributed, "", "", ""};
constexpr Who kNothing{Attribution::none, "", "", ""};

struct ScopeRow {
  const char* what;
  bool on = true;            // false: the same policy with [scope] mode = "off"
  Who who;
  const char* host = "api.tracker.example";
  const char* header = nullptr;
  bool proved = false;         // the connection proved a build secret
  Action action = Action::forward;
  Answer answer = Answer::none;
  const char* rule = nullptr;  // forward: injected; scoped: the rule refused
  const char* body = nullptr;  // scoped: the answer's body starts with this
};

const ScopeRow kScopeRows[] = {
    {.what = "on: the box (the VM user) gets the credential", .who = kUser, .rule = "tracker"},
    {.what = "on: the box (its bridge address, as [scope] box names it) gets it",
     .who = kBoxBridge, .rule = "tracker"},
    {.what = "on: a sibling container's identical request is answered 401, nothing injected",
     .who = kSib, .action = Action::answer, .answer = Answer::scoped, .rule = "tracker",
     .body = "{\"message\":\"foldyard did not send this request: the credential for "
             "api.tracker.example (switch 'tracker') is not for container:1111"},
    {.what = "on: another address on the box's network is not the box", .who = kOtherBridge,
     .action = Action::answer, .answer = Answer::scoped, .rule = "tracker",
     .body = "{\"message\":\"foldyard did not send this request: the credential for "
             "api.tracker.example (switch 'tracker') is not for net:podman1/10.89.1.9"},
    {.what = "on: a build step is not the box", .who = kBuild, .action = Action::answer,
     .answer = Answer::scoped, .rule = "tracker"},
    {.what = "on: an unattributed connection gets no credential", .who = kUnattributed,
     .action = Action::answer, .answer = Answer::scoped, .rule = "tracker",
     .body = "{\"message\":\"foldyard did not send this request: the credential for "
             "api.tracker.example (switch 'tracker') is not for unattributed"},
    {.what = "on, nothing attributed (no stamp key): today's behaviour, injected",
     .who = kNothing, .rule = "tracker"},
    {.what = "on: a rule's own principals name a stack service", .who = kService,
     .host = "api.cms.example", .rule = "cms"},
    {.what = "on: a rule's own principals include the box", .who = kUser,
     .host = "api.cms.example", .rule = "cms"},
    {.what = "on: the rule's refused_body is the provider-shaped answer", .who = kSib,
     .host = "api.cms.example", .action = Action::answer, .answer = Answer::scoped,
     .rule = "cms", .body = "{\"errors\":[{\"message\":\"Unauthorized\"}]}"},
    {.what = "on: without refused_body, a held entry's body for the host is the answer",
     .who = kSib, .host = "api.anthropic.test", .header = "x-api-key: sk-ant-dummy",
     .action = Action::answer, .answer = Answer::scoped, .rule = "anth",
     .body = "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\""},
    {.what = "on: \"build\" names a build step's stamp", .who = kBuild,
     .host = "api.build.example", .rule = "bld"},
    {.what = "on: \"build\" names a proved build secret, stamped or not", .who = kUnattributed,
     .host = "api.build.example", .proved = true, .rule = "bld"},
    {.what = "on: \"build\" is not the box", .who = kUser, .host = "api.build.example",
     .action = Action::answer, .answer = Answer::scoped, .rule = "bld"},
    {.what = "on: a proved build secret is not the box", .who = kUnattributed, .proved = true,
     .action = Action::answer, .answer = Answer::scoped, .rule = "tracker"},
    {.what = "off: a sibling gets the credential, as before", .on = false, .who = kSib,
     .rule = "tracker"},
    {.what = "off: an unattributed connection gets the credential, as before", .on = false,
     .who = kUnattributed, .rule = "tracker"},
    {.what = "off: a rule's own principals are not applied", .on = false, .who = kSib,
     .host = "api.cms.example", .rule = "cms"},
};

const Policy& scoped_policy(bool on) {
  static auto p_on = load(kScoped);
  static auto p_off = [] {
    std::string t = kScoped;
    t.replace(t.find("mode = \"on\""), 11, "mode = \"off\"");
    return load(t);
  }();
  return on ? *p_on : *p_off;
}

adm::Decision run_scoped(const Who& who, const char* host, const char* header, const char* target,
                         Kind kind, const Policy& pol, bool proved = false) {
  std::vector<fy::http::Header> headers;
  headers.push_back({"Host", host});
  if (header) {
    std::string_view h = header;
    size_t colon = h.find(':');
    headers.push_back({h.substr(0, colon), h.substr(colon + 2)});
  }
  adm::Inside inside{{host, static_cast<uint16_t>(kind == Kind::https ? 443 : 80)}, kind, host};
  adm::Request r;
  r.principal = {who.attribution, who.src, who.net, who.who};
  r.build.proved = proved;
  r.build.proxy_auth_seen = proved;
  r.inside = kind == Kind::https ? &inside : nullptr;
  r.method = "GET";
  r.target = target;
  r.host = std::string_view(host);
  r.headers = headers;
  r.now_ms = kNow;
  return adm::decide_request(r, pol);
}

}  // namespace

TEST_CASE("admission: scope, one row each") {
  for (const ScopeRow& row : kScopeRows) {
    CAPTURE(row.what);
    adm::Decision d =
        run_scoped(row.who, row.host, row.header, "/v1/x", Kind::https, scoped_policy(row.on),
                   row.proved);
    CHECK(d.action == row.action);
    CHECK(d.answer == row.answer);
    if (row.rule) {
      REQUIRE(d.rule != nullptr);
      CHECK(d.rule->id == row.rule);
    } else {
      CHECK(d.rule == nullptr);
    }
    if (row.body) CHECK(d.detail.substr(0, std::string_view(row.body).size()) == row.body);
    if (d.answer == Answer::scoped) CHECK_FALSE(d.close_after);
  }
}

TEST_CASE("admission: scoped grants") {
  const Policy& on = scoped_policy(true);
  const Policy& off = scoped_policy(false);
  auto get = [&](const Who& who, const char* host, const Policy& pol) {
    std::string target = std::string("http://") + host + "/";
    return run_scoped(who, host, nullptr, target.c_str(), Kind::cleartext, pol);
  };
  // A grant for one container: that container only.
  CHECK(get(kSib, "eval.example", on).action == Action::forward);
  CHECK(get(kUser, "eval.example", on).answer == Answer::allowlist);
  CHECK(get(kUnattributed, "eval.example", on).answer == Answer::allowlist);
  // A grant for the box: the box's listed principals only.
  CHECK(get(kUser, "boxonly.example", on).action == Action::forward);
  CHECK(get(kBoxBridge, "boxonly.example", on).action == Action::forward);
  CHECK(get(kSib, "boxonly.example", on).answer == Answer::allowlist);
  CHECK(get(kOtherBridge, "boxonly.example", on).answer == Answer::allowlist);
  // An unscoped allow entry is everyone's.
  CHECK(get(kSib, "pypi.org", on).action == Action::forward);
  CHECK(get(kUnattributed, "pypi.org", on).action == Action::forward);
  // Nothing attributed, or scope off: a scoped grant is everyone's.
  CHECK(get(kNothing, "eval.example", on).action == Action::forward);
  CHECK(get(kUser, "eval.example", off).action == Action::forward);
  CHECK(get(kUnattributed, "boxonly.example", off).action == Action::forward);
  // With scope off, principals are warned about, not applied.
  CHECK_FALSE(off.warnings().empty());
  CHECK(on.scope_summary() == "on: credentials to box (box = user, net:podman1/10.89.1.2) · 2 "
                              "scoped grants");
  CHECK(off.scope_summary() == "off");

  // An open connection re-judged: a scoped grant that is not the asker's closes it.
  HostPort eval{"eval.example", 80};
  adm::Open o;
  o.principal = {kUser.attribution, kUser.src, kUser.net, kUser.who};
  o.exchange = true;
  o.exchange_dest = eval;
  o.exchange_kind = Kind::cleartext;
  o.origin = &eval;
  o.now_ms = kNow;
  CHECK(adm::decide_open(o, on).why == Why::refused_now);
  o.principal = {kSib.attribution, kSib.src, kSib.net, kSib.who};
  CHECK(adm::decide_open(o, on).action == Action::keep);
  // And a re-judged request whose rule changed meanwhile.
  CHECK(adm::decide_unruled(eval, Kind::cleartext, o.principal, {}, true, kNow, on).action ==
        Action::forward);
  CHECK(adm::decide_unruled(eval, Kind::cleartext, {Attribution::unattributed, "", "", ""}, {},
                            true, kNow, on)
            .answer == Answer::allowlist);
}

TEST_CASE("admission: a credential minted after the scope changed") {
  const Policy& on = scoped_policy(true);
  const Policy& off = scoped_policy(false);
  const fy::inject::Rule* rule = on.rules().by_id("tracker");
  REQUIRE(rule != nullptr);
  HostPort tracker{"api.tracker.example", 443};
  adm::Principal sib{kSib.attribution, kSib.src, kSib.net, kSib.who};
  adm::Principal user{kUser.attribution, kUser.src, kUser.net, kUser.who};
  adm::Decision d = adm::decide_minted(*rule, tracker, "/v1/x", sib, {}, true, on);
  CHECK(d.action == Action::answer);
  CHECK(d.answer == Answer::scoped);
  CHECK(d.rule == rule);
  CHECK_FALSE(d.close_after);
  CHECK(adm::decide_minted(*rule, tracker, "/v1/x", sib, {}, false, on).close_after);
  d = adm::decide_minted(*rule, tracker, "/v1/x", user, {}, true, on);
  CHECK(d.action == Action::forward);
  CHECK(d.rule == rule);
  const fy::inject::Rule* off_rule = off.rules().by_id("tracker");
  CHECK(adm::decide_minted(*off_rule, tracker, "/v1/x", sib, {}, true, off).action ==
        Action::forward);
}

TEST_CASE("admission: scope's settings are validated") {
  auto bad = [](const std::string& text) {
    auto p = Policy::parse(text, "p.toml", kNow);
    REQUIRE_FALSE(p);
    return p.error().message;
  };
  CHECK(bad("[scope]\nmode = \"yes\"\n").find("not a scope mode") != std::string::npos);
  CHECK(bad("[scope]\nbox = [\"container:web\"]\n").find("64-hex id") != std::string::npos);
  CHECK(bad("[scope]\nbox = [\"box\"]\n").find("box cannot name itself") != std::string::npos);
  CHECK(bad("[scope]\ncredentials = []\n").find("names nobody") != std::string::npos);
  CHECK(bad("[[grant]]\nhost = \"a.example\"\nprincipals = [\"service:proj/web\"]\n")
            .find("a compose service is the engine's claim") != std::string::npos);
  CHECK(bad("[[inject]]\nswitch = \"t\"\nhost = \"a.example\"\nprincipals = [\"root\"]\n")
            .find("'root' is not a principal") != std::string::npos);
  CHECK(bad("[scope]\nmode = \"on\"\nfoo = 1\n").find("foo") != std::string::npos);
}

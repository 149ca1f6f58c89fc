// Admission: every question fy-proxy asks before it forwards, asked in one
// place and in the order docs/fy-proxy.md documents ("What it does with a
// request", "Credential injection", "Build secrets", "Stamps"):
//
//   0. who asked: attribution = "require" and no valid stamp       -> 403
//   1. scheme and authority (absolute form, CONNECT host:port)     -> 400
//   2. the Host claim against the destination                      -> 403 / 400
//   3. an overlap (502), a held dummy (401): HTTPS it decrypted
//   4. the wall, with the build proof and the 407 rule             -> 403 / 407 / would_block
//   5. a CONNECT admitted only for what the proxy decrypts (implicit only)
//   6. decrypt or tunnel, from the first bytes after the 200
//   7. rule selection: the credential a forwarded request carries, and
//      scope: whether it may go to who asked (401, provider-shaped, if not)
//
// Pure: no libuv, no I/O, no TLS library. The input is the facts of one
// request (or one ClientHello, or one open connection when the policy
// changed) and the policy; the output is a Decision that the connection
// applies without asking anything else. Counting, logging and Network Log
// rows stay with the connection: a Decision says what happened, the
// connection records it.
//
// Lifetimes: a Decision's pointers (rule, overlap, held) point into the
// Policy it was taken with, and `path` into the request's target; the
// caller keeps both alive while it applies the Decision.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/net.h"
#include "proxy/http/header.h"
#include "proxy/inject/rules.h"
#include "proxy/netlog/row.h"
#include "proxy/policy/policy.h"

namespace fy::admission {

// Who asked: `attribution` decides step 0; with [scope] mode = "on" the
// stamp's fields decide step 7's scope and which scoped grants apply in
// step 4 (docs/fy-proxy.md, "Scope"). Attribution::none (no stamp key: the
// podman backend) scopes nothing.
struct Principal {
  netlog::Attribution attribution = netlog::Attribution::none;
  std::string_view src, net, who;  // the bound stamp's fields, when attributed
};
// The policy's view of a principal (proxy/policy/principals.h).
// `build_proved`: the connection proved a build secret (the "build" principal).
policy::Asker asker_of(const Principal& p, bool build_proved);

// What the connection has shown about builds (docs/fy-proxy.md, "Build
// secrets"). The secret is checked by the connection (the tokens file is
// hashed with SHA-256); admission sees only the outcome.
struct BuildProof {
  bool proved = false;           // a valid fy-build:<secret> came on this connection
  bool marker = false;           // the fy-build marker, valid or not: asks for tunnels
  bool proxy_auth_seen = false;  // any Proxy-Authorization came on this connection
};

// The CONNECT a request arrives inside.
struct Inside {
  HostPort dest;                             // the CONNECT target: what is judged
  policy::Kind kind = policy::Kind::https;   // https (decrypted) or cleartext (plain inside)
  std::string_view sni;                      // the ClientHello's server name ("" when none)
};

// The facts of one request head.
struct Request {
  Principal principal;
  BuildProof build;
  const Inside* inside = nullptr;          // null: sent to the proxy itself
  std::string_view method;                 // as parsed ("CONNECT", "GET", ...)
  std::string_view target;                 // the request target as sent
  std::optional<std::string_view> host;    // the Host header, when sent
  uint8_t http_minor = 1;
  std::span<const http::Header> headers;   // all of them (a held dummy's header)
  bool message_complete = true;            // no body bytes left to read
  int64_t now_ms = 0;                      // wall clock
};

enum class Action : uint8_t {
  forward,        // send it to `dest` as `kind`, injecting `rule` when set
  establish,      // a CONNECT admitted: answer 200; the first bytes decide (decide_hello)
  answer,         // the proxy answers itself: `answer` says which
  challenge,      // 407 with Proxy-Authenticate: open to builds, no credential came
  tunnel,         // relay the bytes undecrypted (`tunnel` says which kind)
  decrypt,        // TLS with the client under a minted leaf; serve the requests inside
  serve_plain,    // cleartext HTTP inside the CONNECT: serve it as requests
  close,          // close the connection (`why`)
  keep,           // re-judging: nothing changes
  retire_origin,  // re-judging: the idle origin connection goes, the client stays
};

// What the proxy answers (the answers catalogue has each text).
enum class Answer : uint8_t {
  none,
  unattributed,   // 403: attribution = "require", no valid stamp
  bad_head,       // 400: `detail` (a parse-level refusal: no path, no Host)
  origin_form,    // 400: not absolute form
  bad_scheme,     // 400: `detail` is the scheme
  bad_authority,  // 400: `detail` says why
  bad_connect,    // 400: a CONNECT target that is not host:port; `detail` says why
  claim,          // 403: the Host (or a URL inside a tunnel) names another host
  overlap,        // 502: `overlap`
  held,           // 401: `held`'s body
  allowlist,      // 403: not on the allowlist (`key`)
  scoped,         // 401: `rule`'s credential is not for who asked; `detail` is the
                  // provider-shaped body (the rule's refused_body, a [[held]]
                  // entry's, or foldyard's own JSON)
};

enum class TunnelKind : uint8_t { passthrough, opaque };

// Why a connection is closed.
enum class Why : uint8_t {
  none,
  malformed_hello,        // the first bytes after the 200 are a broken ClientHello
  implicit_only_not_tls,  // admitted only for HTTPS the proxy decrypts, and this is not TLS
  require_stamp,          // re-judging: the policy now requires a stamp this connection lacks
  refused_now,            // re-judging: the policy now refuses the destination
  left_passthrough,       // re-judging: the host left passthrough; it would now be decrypted
};
const char* why_text(Why w);

struct Decision {
  Action action = Action::close;
  Answer answer = Answer::none;
  // answer, challenge: close the connection after the answer.
  bool close_after = false;
  // The destination, once parsed (forward, establish, and what is refused
  // after it). `kind` is connect for a CONNECT.
  bool has_dest = false;
  HostPort dest;
  policy::Kind kind = policy::Kind::cleartext;
  // establish: how the requests inside the CONNECT are judged.
  policy::Kind inner_kind = policy::Kind::https;
  // The Network Log's host key ("host", or "host:port" off the default
  // port); empty until the destination is known.
  std::string key;
  // The origin-form path (the row's path), once the destination is known.
  std::optional<std::string_view> path;
  const inject::Rule* rule = nullptr;        // forward: the credential to inject; scoped: refused
  const inject::Overlap* overlap = nullptr;  // answer overlap
  const inject::Held* held = nullptr;        // answer held
  bool would_block = false;    // forward, establish: allowed only because observing
  bool implicit_only = false;  // establish: admitted only for what the proxy decrypts
  TunnelKind tunnel = TunnelKind::passthrough;
  Why why = Why::none;         // close
  std::string detail;          // bad_head, bad_scheme, bad_authority, bad_connect
};

// Steps 0 to 4 and 7 for one request head (step 5's flag for a CONNECT).
// Not asked here: whether the head parses (the HTTP codec's, before this).
Decision decide_request(const Request& r, const policy::Policy& pol);

// Step 0 alone: whether the principal is refused outright. The connection
// asks it before it reads a build claim (a refused connection's claim is
// not counted), and decide_request asks it first.
bool refuses_principal(const Principal& p, const policy::Policy& pol);

// A request held for a credential whose rule changed (or went) meanwhile:
// judged again on the wall alone, nothing injected; forward or the 403.
// (No 407 and no would_block row: the head was judged once already.)
Decision decide_unruled(const HostPort& dest, policy::Kind kind, const Principal& principal,
                        const BuildProof& build, bool message_complete, int64_t now_ms,
                        const policy::Policy& pol);

// A request held for `rule`'s credential (the rule as the policy has it now,
// its spec unchanged), when the credential is ready: the scope may have
// changed meanwhile (step 7 again). forward, with `rule`, or answer scoped.
Decision decide_minted(const inject::Rule& rule, const HostPort& dest, std::string_view path,
                       const Principal& principal, const BuildProof& build,
                       bool message_complete, const policy::Policy& pol);

// The first bytes after a CONNECT's 200 (steps 5 and 6).
struct Hello {
  enum class Shape : uint8_t {
    tls,        // a complete ClientHello
    http,       // cleartext HTTP
    other,      // anything else
    silence,    // nothing within the probe on a port other than 443 (server speaks first)
    malformed,  // a ClientHello that does not parse
  };
  Shape shape = Shape::other;
  const HostPort* dest = nullptr;  // the CONNECT target
  bool sni_present = false;        // the ClientHello has a server_name extension
  std::string_view sni;            // its host name ("" when not a host name)
  bool implicit_only = false;      // from the CONNECT's establish Decision
  BuildProof build;
};
Decision decide_hello(const Hello& h, const policy::Policy& pol);

// An open connection, re-judged when the policy changed or a grant expired.
struct Open {
  Principal principal;
  BuildProof build;
  const Inside* inside = nullptr;  // the CONNECT it is, when it is one
  bool tunnel = false;             // bytes are relayed (blind, or after a 101)
  bool passthrough = false;        // ... undecrypted TLS (a passthrough tunnel)
  bool exchange = false;           // an exchange is in flight
  HostPort exchange_dest;          // the exchange's (or the upgraded tunnel's) destination
  policy::Kind exchange_kind = policy::Kind::cleartext;
  const HostPort* origin = nullptr;  // the origin connection kept, when there is one
  bool origin_tls = false;
  int64_t now_ms = 0;
};
// keep, retire_origin, or close with `why`.
Decision decide_open(const Open& o, const policy::Policy& pol);

// Whether a held entry's dummy is what this request carries: the header (or
// query parameter, percent-decoded) value is the dummy, or with any_scheme
// one word and the dummy. `target` is the origin-form path.
bool holds_dummy(const inject::Held& held, std::string_view target,
                 std::span<const http::Header> headers);

// Splits an absolute-form target "http://authority/path?q" into its parts;
// false when it is not one (or names userinfo).
bool split_absolute(std::string_view target, std::string_view* scheme,
                    std::string_view* authority, std::string_view* path);

}  // namespace fy::admission

// The answers the proxy writes itself, for an operator to read: every body
// of docs/fy-proxy.md's "Answers the proxy writes itself" table comes from
// here, so a reader finds each text once and the tests pin each one.
//
// Each function is one row: its status, its content type and its body. The
// format strings are literals given to fmt::format, which checks them against
// their arguments at compile time (C++20 consteval format strings).
//
// Pure: no libuv, no I/O, no TLS library (fmt and core's JSON helper only).
// It lives in http/ rather than policy/ because most of its rows are not
// policy (a malformed head, an origin that cannot be reached, the connection
// limit) and its callers are the two places that write HTTP answers
// (server/connection.cc and server/server.cc's over-the-limit 503).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fy::answers {

inline constexpr const char* kText = "text/plain; charset=utf-8";
inline constexpr const char* kJson = "application/json";

struct Reply {
  int status = 0;
  std::string body;
  const char* content_type = kText;
};

// 400/431/501/505: a malformed or smuggling-shaped head; `status` is the
// parser's (http::ParseError), `reason` says what is wrong.
Reply bad_head(int status, std::string_view reason);
// 400: an origin-form request (the proxy wants absolute form or CONNECT).
Reply origin_form();
// 400: an absolute-form URL whose scheme is neither http nor https.
Reply bad_scheme(std::string_view scheme);
// 400: an absolute-form URL whose authority is not host[:port].
Reply bad_authority(std::string_view message);
// 400: a CONNECT whose target is not host:port.
Reply bad_connect(std::string_view message);
// 403: attribution = "require" and the connection carries no valid stamp.
Reply unattributed();
// 403: the allowlist refuses `key` ("host", or "host:port" off the default port).
Reply allowlist(std::string_view key);
// 403: the Host header (or a URL inside a tunnel) names another host.
Reply claim();
// 401: a held dummy; the body is the held entry's, as its provider answers.
Reply held(std::string_view body);
// 401: [scope] mode = "on" and the credential of switch `rule` is not for
// `principal`; `body` is the provider-shaped JSON (admission picks it:
// the rule's refused_body, a held entry's body, or scoped_json()).
Reply scoped(std::string_view body);
// foldyard's own body for scoped() when the policy gives none.
std::string scoped_json(std::string_view host, std::string_view rule, std::string_view principal);
// 407: a destination open to builds, no Proxy-Authorization sent. The
// answer also carries kBuildChallengeHeader: kBuildChallengeValue.
Reply build_challenge(std::string_view key);
inline constexpr const char* kBuildChallengeHeader = "Proxy-Authenticate";
inline constexpr const char* kBuildChallengeValue = "Basic realm=\"foldyard build\"";
// 502: two injection rules overlap here (`message` is the overlap's).
Reply overlap(std::string_view message);
// 502: minting a credential for `host` failed; `after_401`: the failure was
// the re-mint after the origin refused the first credential.
Reply mint_failed(std::string_view host, std::string_view reason, bool after_401);
// 408: a request head did not complete within --head-timeout.
Reply head_timeout(uint64_t seconds);
// 502: the origin `dest` could not be reached; `reason` is "<kind>: <detail>".
Reply upstream_failed(std::string_view dest, std::string_view reason);
// 504: connecting to or waiting for `dest` timed out.
Reply upstream_timeout(std::string_view dest, std::string_view reason);
// 503: no file descriptor to spare for the origin `dest`.
Reply out_of_files(std::string_view dest, std::string_view reason);
// 503: the client is over the connection limit `limit`; `by_files`: the
// open-file limit lowered it (so that is what to raise).
Reply connection_limit(size_t limit, bool by_files);

}  // namespace fy::answers

// The answers catalogue (proxy/http/answers.h): one case per row of
// docs/fy-proxy.md's "Answers the proxy writes itself". The expected texts are
// the bytes the proxy wrote before the catalogue existed; tests/proxy/ checks
// the same texts on the wire.
#include <doctest/doctest.h>

#include <string>

#include "proxy/http/answers.h"

namespace answers = fy::answers;

TEST_CASE("400: a malformed head, an origin-form request, a bad scheme, authority or CONNECT") {
  auto r = answers::bad_head(400, "the request has both Content-Length and Transfer-Encoding");
  CHECK(r.status == 400);
  CHECK(std::string(r.content_type) == answers::kText);
  CHECK(r.body ==
        "foldyard's proxy refused this request: the request has both Content-Length and "
        "Transfer-Encoding. Send a well-formed HTTP/1.1 request.\n");
  r = answers::origin_form();
  CHECK(r.status == 400);
  CHECK(r.body ==
        "foldyard's proxy refused this request: it is a proxy, so requests name their "
        "destination in absolute form (GET http://host/path HTTP/1.1) or use CONNECT host:port\n");
  r = answers::bad_scheme("ftp");
  CHECK(r.status == 400);
  CHECK(r.body ==
        "foldyard's proxy refused this request: the scheme 'ftp' is not served; use http:// or "
        "CONNECT\n");
  r = answers::bad_authority("'a b' is not a host name");
  CHECK(r.status == 400);
  CHECK(r.body == "foldyard's proxy refused this request: 'a b' is not a host name\n");
  r = answers::bad_connect("a port is required");
  CHECK(r.status == 400);
  CHECK(r.body ==
        "foldyard's proxy refused this CONNECT: a port is required (write CONNECT host:port)\n");
}

TEST_CASE("403: not on the allowlist") {
  auto r = answers::allowlist("api.example.com:8443");
  CHECK(r.status == 403);
  CHECK(std::string(r.content_type) == answers::kText);
  CHECK(r.body ==
        "refused by the foldyard allowlist - grant it on your computer: `fy allow add "
        "api.example.com:8443`\n");
}

TEST_CASE("403: the Host claim") {
  auto r = answers::claim();
  CHECK(r.status == 403);
  CHECK(r.body ==
        "refused by the foldyard proxy - the request's Host header names a different host than "
        "the one it is sent to\n");
}

TEST_CASE("403: attribution = require and no valid stamp") {
  auto r = answers::unattributed();
  CHECK(r.status == 403);
  CHECK(r.body ==
        "refused by the foldyard proxy - this connection carries no valid stamp from the "
        "forwarder, and the policy requires one (attribution = \"require\"): send it through "
        "fy-forwarder\n");
}

TEST_CASE("401: a held dummy is answered with the held entry's body") {
  std::string body = R"({"type":"error","error":{"type":"authentication_error"}})";
  auto r = answers::held(body);
  CHECK(r.status == 401);
  CHECK(std::string(r.content_type) == answers::kJson);
  CHECK(r.body == body);
}

TEST_CASE("401: a credential not for who asked ([scope]) is answered provider-shaped") {
  std::string body = R"({"errors":[{"message":"Unauthorized"}]})";
  auto r = answers::scoped(body);
  CHECK(r.status == 401);
  CHECK(std::string(r.content_type) == answers::kJson);
  CHECK(r.body == body);
  CHECK(answers::scoped_json("api.tracker.example", "tracker", "net:podman1/10.89.1.9") ==
        R"({"message":"foldyard did not send this request: the credential for )"
        R"(api.tracker.example (switch 'tracker') is not for net:podman1/10.89.1.9 (on your )"
        R"x(computer: the policy's [scope] names who it is for)"})x");
  // The principal is the stamp's (its character set has no quote), but the
  // body is JSON whatever it holds.
  CHECK(answers::scoped_json("h", "s\"x", "p").find(R"(switch 's\"x')") != std::string::npos);
}

TEST_CASE("407: a build-only destination, no credentials sent") {
  auto r = answers::build_challenge("files.pythonhosted.org");
  CHECK(r.status == 407);
  CHECK(r.body ==
        "refused by the foldyard allowlist - grant it on your computer: `fy allow add "
        "files.pythonhosted.org`\n(this host is open to builds: a build proves itself with "
        "fy-build:<secret>)\n");
  CHECK(std::string(answers::kBuildChallengeHeader) == "Proxy-Authenticate");
  CHECK(std::string(answers::kBuildChallengeValue) == "Basic realm=\"foldyard build\"");
}

TEST_CASE("502: a mint failed / rules overlap (JSON, the message escaped)") {
  auto r = answers::mint_failed("api.tracker.example", "exit 1: \"no\"", false);
  CHECK(r.status == 502);
  CHECK(std::string(r.content_type) == answers::kJson);
  CHECK(r.body ==
        "{\"message\":\"foldyard could not mint a credential for api.tracker.example, so this "
        "request was not sent: exit 1: \\\"no\\\" (on your computer, `fy host logs` has the "
        "details)\"}");
  r = answers::mint_failed("api.github.com", "hung: no answer within 30 s", true);
  CHECK(r.status == 502);
  CHECK(r.body ==
        "{\"message\":\"foldyard could not mint a credential for api.github.com after it refused "
        "the one this request carried (401): hung: no answer within 30 s (on your computer, `fy "
        "host logs` has the details)\"}");
  r = answers::overlap("tracker and tracker-admin both claim api.example/v1/");
  CHECK(r.status == 502);
  CHECK(std::string(r.content_type) == answers::kJson);
  CHECK(r.body ==
        "{\"message\":\"foldyard did not send this request: tracker and tracker-admin both claim "
        "api.example/v1/ (on your computer: the mode can't be changed from the box)\"}");
}

TEST_CASE("408: a head did not complete in --head-timeout") {
  auto r = answers::head_timeout(10);
  CHECK(r.status == 408);
  CHECK(r.body ==
        "foldyard's proxy closed this connection: the request head did not arrive within 10 s\n");
}

TEST_CASE("431: head over --max-head-bytes or --max-headers") {
  auto r = answers::bad_head(431, "the request head is larger than 64 KiB");
  CHECK(r.status == 431);
  CHECK(r.body ==
        "foldyard's proxy refused this request: the request head is larger than 64 KiB. Send a "
        "well-formed HTTP/1.1 request.\n");
}

TEST_CASE("501: Transfer-Encoding other than chunked") {
  auto r = answers::bad_head(501, "the request's Transfer-Encoding is not plain \"chunked\"");
  CHECK(r.status == 501);
  CHECK(r.body ==
        "foldyard's proxy refused this request: the request's Transfer-Encoding is not plain "
        "\"chunked\". Send a well-formed HTTP/1.1 request.\n");
}

TEST_CASE("502: DNS, connect, TLS, reset, protocol failure upstream") {
  auto r = answers::upstream_failed("a.test:443", "dns: a.test does not resolve (unknown node)");
  CHECK(r.status == 502);
  CHECK(r.body ==
        "foldyard's proxy could not reach a.test:443: dns: a.test does not resolve (unknown "
        "node)\n");
}

TEST_CASE("503: over --max-connections, or no descriptor to spare for the origin") {
  auto r = answers::connection_limit(100, false);
  CHECK(r.status == 503);
  CHECK(r.body ==
        "foldyard's proxy is at its connection limit (100); retry shortly, or raise "
        "--max-connections\n");
  r = answers::connection_limit(928, true);
  CHECK(r.body ==
        "foldyard's proxy is at its connection limit (928); retry shortly, or raise the proxy's "
        "open-file limit (LimitNOFILE / ulimit -n)\n");
  r = answers::out_of_files("a.test:80", "io: no file descriptor to spare for the origin");
  CHECK(r.status == 503);
  CHECK(r.body ==
        "foldyard's proxy could not open a connection to a.test:80: io: no file descriptor to "
        "spare for the origin. Retry shortly; on the host, raise the proxy's open-file limit "
        "(systemd: LimitNOFILE=; a shell: ulimit -n) or lower --max-connections\n");
}

TEST_CASE("504: connect or response timeout") {
  auto r = answers::upstream_timeout("a.test:443", "timeout: no response within 300 s");
  CHECK(r.status == 504);
  CHECK(r.body ==
        "foldyard's proxy timed out reaching a.test:443: timeout: no response within 300 s\n");
}

// The pure decisions: the route classifier against podman's router grammar,
// the create-body rewrite against podman's decoder, the head checks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "src/http.h"
#include "src/rewrite.h"
#include "src/route.h"
#include "src/stats.h"

using namespace fy::sockfilter;

namespace {
Action act(std::string_view m, std::string_view t, bool body = true, std::string_view ct = "") {
  return classify(m, t, body, ct).action;
}
std::string strip(std::string_view body, Family f = Family::libpod) {
  Rewrite r = rewrite_create(body, f);
  REQUIRE_MESSAGE(r.ok, r.error);
  return r.body;
}
bool refused(std::string_view body, Family f = Family::libpod) {
  return !rewrite_create(body, f).ok;
}
}  // namespace

TEST_CASE("version prefix: podman's [0-9][0-9A-Za-z.-]* after /v") {
  CHECK(version_prefix("/v4.0.0/libpod/x") == 7);
  CHECK(version_prefix("/v5.0.0-dev/x") == 11);
  CHECK(version_prefix("/v1.41-x/x") == 8);
  CHECK(version_prefix("/v9abc/x") == 6);
  CHECK(version_prefix("/v1./x") == 4);
  CHECK(version_prefix("/v0/x") == 3);
  CHECK(version_prefix("/vx1/x") == 0);
  CHECK(version_prefix("/V4/x") == 0);     // case-sensitive
  CHECK(version_prefix("/v/x") == 0);
  CHECK(version_prefix("/v4") == 0);       // needs the following '/'
  CHECK(version_prefix("/v%34/x") == 0);   // escaped: not the grammar
  CHECK(version_prefix("/v4_0/x") == 0);
}

TEST_CASE("creates: every version spelling, both families; compat also unversioned") {
  for (auto v : {"/v4.0.0", "/v5.0.0-dev", "/v1.41-x", "/v9abc", "/v1.", "/v0", "/v00.1"}) {
    std::string lib = std::string(v) + "/libpod/containers/create";
    std::string compat = std::string(v) + "/containers/create";
    CHECK_MESSAGE(act("POST", lib) == Action::create_libpod, lib);
    CHECK_MESSAGE(act("POST", lib + "?name=x&oci_runtime=crun") == Action::create_libpod, lib);
    CHECK_MESSAGE(act("POST", compat) == Action::create_compat, compat);
  }
  CHECK(act("POST", "/containers/create") == Action::create_compat);
  CHECK(act("POST", "/containers/create?name=a") == Action::create_compat);
  // libpod is versioned only; other verbs, case: no route of podman's, so
  // refused as unknown (the engine would 404/405 them).
  for (auto mt : {std::pair{"POST", "/libpod/containers/create"},
                  {"GET", "/v4/libpod/containers/create"},
                  {"POST", "/v4/libpod/containers/Create"},
                  {"POST", "/v4/Libpod/containers/create"},
                  {"POST", "/V4.0.0/libpod/containers/create"}}) {
    // Named copies, not a structured binding: clang 14 (the ASan build) cannot
    // capture a binding in the lambda CHECK_MESSAGE makes.
    const char* m = mt.first;
    const char* t = mt.second;
    Route r = classify(m, t, true, "");
    CHECK_MESSAGE(r.action == Action::refuse, t);
    CHECK_MESSAGE(r.klass == RouteClass::unknown, t);
    CHECK(r.code == "unknown_route");
    CHECK(r.reason.find(std::string(m) + " " + t + " refused: no engine endpoint") == 0);
  }
}

TEST_CASE("escaped paths are what the router matches: %63reate is not create, and is refused") {
  for (auto t : {"/v4/libpod/containers/%63reate", "/v4/libpod/containers%2Fcreate",
                 "/containers/%63reate", "/v4/libpod/containers/create/",  // StrictSlash off: 404
                 "/v4/libpod/%2e%2e/containers/create", "/v4/libpod/containers/create;x",
                 "/v1.41/containers/create/", "/containers/create%00"}) {
    Route r = classify("POST", t, true, "");
    CHECK_MESSAGE(r.action == Action::refuse, t);
    CHECK_MESSAGE(r.klass == RouteClass::unknown, t);
  }
  // An escaped '/' inside a {name} is still that one name: the route matches.
  CHECK(act("GET", "/v4/libpod/containers/a%2Fb/json", false) == Action::pass);
  CHECK(act("POST", "/v1.a-b.c/libpod/containers/create") == Action::create_libpod);
  // A byte Go would re-escape (so the router would see another string): refused.
  CHECK(act("POST", "/v4/libpod/containers/a\"b/restore") == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/cre{ate") == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/cre%6") == Action::refuse);  // invalid escape
  CHECK(act("POST", "/v4/libpod/containers/cre%zzte") == Action::refuse);
}

TEST_CASE("// and dot segments are refused (the engine would only redirect them)") {
  for (auto t : {"//containers/create", "/v4//libpod/containers/create", "/v4/libpod/./containers/create",
                 "/v4/libpod/x/../containers/create", "/containers/create/.", "/containers/create/..",
                 "/v4/libpod/containers//create", "/./containers/create"}) {
    CHECK_MESSAGE(act("POST", t) == Action::refuse, t);
    CHECK_MESSAGE(act("GET", t) == Action::refuse, t);
  }
  CHECK_FALSE(needs_clean("/"));
  CHECK_FALSE(needs_clean("/containers/json/"));
  CHECK_FALSE(needs_clean("/containers/%2e%2e/json"));  // escaped: a name, not a segment
  CHECK(needs_clean("/a//b"));
  CHECK(needs_clean("/a/./b"));
}

TEST_CASE("non-origin targets are refused") {
  CHECK(act("POST", "http://d/v4/libpod/containers/create") == Action::refuse);
  CHECK(act("OPTIONS", "*") == Action::refuse);
  CHECK(act("GET", "") == Action::refuse);
}

TEST_CASE("the other creating doors: refused, the message names the endpoint and why") {
  for (auto t : {"/v4/libpod/play/kube", "/v5.0.0/libpod/kube/play", "/v6/libpod/kube/apply",
                 "/v4/libpod/play/kube?annotations=x"}) {
    Route r = classify("POST", t, true, "");
    CHECK_MESSAGE(r.action == Action::refuse, t);
    CHECK(r.reason.find("POST /v") == 0);
    CHECK(r.reason.find("kube play") != std::string::npos);
  }
  CHECK(act("DELETE", "/v4/libpod/play/kube", false) == Action::pass);  // teardown
  CHECK(act("DELETE", "/v5/libpod/kube/play", false) == Action::pass);
  CHECK(act("GET", "/v4/libpod/kube/play", false) == Action::refuse);  // no such route
  // restore: with import (any case, any value) or with a body: refused.
  CHECK(act("POST", "/v4/libpod/containers/c1/restore?import=true", false) == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/c1/restore?IMPORT=1", false) == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/c1/restore?%69mport=1", false) == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/c1/restore?import=false", false) == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/c1/restore", true) == Action::refuse);
  CHECK(act("POST", "/v4/libpod/containers/c1/restore?keep=1", false) == Action::pass);
  CHECK(classify("POST", "/v4/libpod/containers/c1/restore?import=1", false, "").reason.find("runtime") !=
        std::string::npos);
  // build: isolation other than OCI's, or volumes; both families.
  for (auto t : {"/v4/libpod/build?isolation=chroot", "/v4/libpod/build?isolation=1",
                 "/build?isolation=chroot", "/v1.41/build?Isolation=Chroot",
                 "/v4/libpod/build?i%C5%BFolation=chroot",  // long s folds to s (schema EqualFold)
                 "/v4/libpod/build?volume=/:/host", "/v4/libpod/build?t=x&volume=%2F%3A%2Fh"}) {
    CHECK_MESSAGE(act("POST", t) == Action::refuse, t);
  }
  for (auto t : {"/v4/libpod/build?isolation=oci", "/v4/libpod/build?t=x", "/build",
                 "/v4/libpod/build?isolation=default", "/v4/libpod/build?isolation="}) {
    CHECK_MESSAGE(act("POST", t) == Action::pass, t);
  }
  for (auto t : {"/v4/libpod/local/build", "/v4/libpod/local/images/load",
                 "/v4/libpod/artifacts/local/add", "/v4/libpod/images/scp/img"}) {
    CHECK_MESSAGE(act("POST", t) == Action::refuse, t);
  }
  CHECK(act("POST", "/v6/libpod/quadlets") == Action::refuse);
  CHECK(act("PUT", "/v6/libpod/quadlets/x.container") == Action::refuse);
  CHECK(act("GET", "/v6/libpod/quadlets/json", false) == Action::pass);
  CHECK(act("POST", "/v4/anything", true, "application/grpc") == Action::refuse);
  CHECK(act("POST", "/v4/anything", true, "Application/GRPC+proto") == Action::refuse);
  // mux's HeadersRegexp is unanchored and looks at every value.
  CHECK(act("POST", "/v4/libpod/containers/c1/start", true, "text/plain, application/grpc") ==
        Action::refuse);
  CHECK(classify("GET", "/_ping", false, "x application/grpc").code == "grpc");
  // Not creating: pass.
  for (auto t : {"/v4/libpod/containers/c1/start", "/v4/libpod/containers/c1/attach",
                 "/v4/libpod/pods/create", "/v4/libpod/images/pull", "/containers/prune",
                 "/v4/libpod/containers/c1/exec", "/exec/e1/start", "/images/create"}) {
    Route r = classify("POST", t, true, "");
    CHECK_MESSAGE(r.action == Action::pass, t);
    CHECK_MESSAGE(r.klass == RouteClass::known, t);
  }
  CHECK(act("POST", "/v4/libpod/images/create") == Action::refuse);  // libpod has pull, not create
}

TEST_CASE("default deny: the route table, podman's methods and scopes") {
  // Known, as podman 4.3-6.0 register them: forwarded.
  for (auto mt : {std::pair{"GET", "/_ping"}, {"HEAD", "/_ping"}, {"GET", "/libpod/_ping"},
                  {"GET", "/v4.3.1/libpod/_ping"}, {"GET", "/v1.41/containers/json"},
                  {"GET", "/containers/abc/json"}, {"DELETE", "/v4/libpod/containers/abc"},
                  {"GET", "/v4/libpod/containers/abc/logs"},
                  {"POST", "/v4/libpod/exec/e1/start"}, {"GET", "/v4/libpod/images/a/b:c/json"},
                  {"DELETE", "/v4/libpod/images/reg/x/y"}, {"POST", "/v4/libpod/manifests/create"},
                  {"PUT", "/v5/libpod/manifests/reg/list:1"},
                  {"POST", "/v5/libpod/manifests/l/registry/docker.io/x"},
                  {"GET", "/v4/libpod/containers/a/b/healthcheck"},
                  {"PATCH", "/plugins"}, {"POST", "/v1.41/swarm/init"}, {"GET", "/nodes/"},
                  {"PUT", "/containers/c/archive"}, {"DELETE", "/secret/s1"},
                  {"GET", "/v6/libpod/quadlets/a.container/file"},
                  {"POST", "/v4/libpod/pods/p1/start"}, {"POST", "/v4/libpod/system/check"}}) {
    // Named copies, not a structured binding: clang 14 (the ASan build) cannot
    // capture a binding in the lambda CHECK_MESSAGE makes.
    const char* m = mt.first;
    const char* t = mt.second;
    Route r = classify(m, t, false, "");
    CHECK_MESSAGE(r.action == Action::pass, m, " ", t, " ", r.reason);
  }
  // Unknown: a method the route does not take, a scope it lacks, a path it
  // does not have.
  for (auto mt : {std::pair{"HEAD", "/containers/json"}, {"GET", "/libpod/containers/json"},
                  {"DELETE", "/secret/s1/x"}, {"GET", "/v4/secret/s1"}, {"OPTIONS", "/_ping"},
                  {"PATCH", "/v4/libpod/containers/c/update"}, {"GET", "/v4/libpod/manifests/x"},
                  {"POST", "/v4/libpod/containers/a/b/start"}, {"GET", "/"},
                  {"POST", "/v4/libpod/pods/create/x"}, {"GET", "/v4/libpod/nothing"}}) {
    // Named copies, not a structured binding: clang 14 (the ASan build) cannot
    // capture a binding in the lambda CHECK_MESSAGE makes.
    const char* m = mt.first;
    const char* t = mt.second;
    Route r = classify(m, t, false, "");
    CHECK_MESSAGE(r.action == Action::refuse, m, " ", t);
    CHECK(r.klass == RouteClass::unknown);
  }
  // Where two routes match (a `{name:.*}`), the stricter one decides: scp
  // wins over push whatever podman's registration order.
  CHECK(classify("POST", "/v4/libpod/images/scp/x/push", false, "").code == "image_scp");
  // classes for the counters
  CHECK(classify("POST", "/v4/libpod/containers/create", true, "").klass == RouteClass::create);
  CHECK(classify("POST", "/v4/libpod/kube/play", true, "").klass == RouteClass::door);
  CHECK(classify("POST", "/v4/libpod/build?t=x", true, "").klass == RouteClass::door);
  CHECK(classify("POST", "/v4/libpod/build?t=x", true, "").action == Action::pass);
  CHECK(classify("POST", "//x", true, "").klass == RouteClass::bad_target);
}

TEST_CASE("fold and fold_lower: ASCII plus the runes Go's tables map onto ASCII") {
  CHECK(fold("OCI_Runtime") == "oci_runtime");
  CHECK(fold("\xE2\x84\xAA") == "k");   // KELVIN SIGN
  CHECK(fold("\xC5\xBF") == "s");       // LONG S
  CHECK(fold("\xC4\xB0") == "\xC4\xB0");  // I WITH DOT ABOVE: no simple fold to 'i'
  CHECK(fold("\xC3\x89") == "\xC3\x89");  // others kept
  CHECK(fold_lower("OCI_RUNT\xC4\xB0ME") == "oci_runtime");  // unicode.ToLower(U+0130) = 'i'
  CHECK(fold_lower("\xE2\x84\xAA") == "k");
  CHECK(fold_lower("\xC5\xBF") == "\xC5\xBF");  // LONG S is lower case already
  CHECK(fold_lower("\xE0\x84\xB0") == "\xE0\x84\xB0");  // U+0130 overlong: not U+0130 for Go
  CHECK(fold_lower("a\xC4") == "a\xC4");  // a truncated rune is kept
}

TEST_CASE("rewrite: keys Go maps onto a protected name are stripped, in both families") {
  CHECK(strip("{\"image\":\"bb\",\"oci_runt\xC4\xB0me\":\"crun\"}") == R"({"image":"bb"})");
  CHECK(strip("{\"annotat\xC4\xB0ons\":{\"dev.gvisor.x\":\"1\",\"a\":\"b\"}}") ==
        "{\"annotat\xC4\xB0ons\":{\"a\":\"b\"}}");
  Rewrite r = rewrite_create(
      "{\"HostConf\xC4\xB0g\":{\"Runt\xC4\xB0me\":\"crun\","
      "\"Annotation\xC5\xBF\":{\"dev.gvisor.x\":\"1\"}}}",
      Family::compat);
  REQUIRE(r.ok);
  CHECK(r.body == "{\"HostConf\xC4\xB0g\":{\"Annotation\xC5\xBF\":{}}}");
  CHECK(r.stripped == 2);
}

TEST_CASE("rewrite libpod: oci_runtime in any case is stripped, the rest kept byte for byte") {
  CHECK(strip(R"({"image":"bb","oci_runtime":"crun"})") == R"({"image":"bb"})");
  CHECK(strip(R"({"oci_runtime":"crun","image":"bb"})") == R"({"image":"bb"})");
  CHECK(strip(R"({"OCI_Runtime":"crun", "image":"bb"})") == R"({"image":"bb"})");
  CHECK(strip(R"({"Oci_runtime":"crun"})") == R"({})");
  CHECK(strip(R"({"oci_runtim\u0065":"crun","a":1})") == R"({"a":1})");  // escaped key
  CHECK(strip("{ \"a\" : 1 ,\n \"oci_runtime\":\"crun\" ,\"b\":[1,2] }") == "{ \"a\" : 1 ,\"b\":[1,2] }");
  // numbers as written, key order kept, nothing else touched
  std::string keep = R"({"z":9223372036854775807,"a":-9223372036854775808,"m":1.50e+10,"u":"\u00e9\/","n":null})";
  CHECK(strip(keep) == keep);
  Rewrite r = rewrite_create(keep, Family::libpod);
  CHECK(r.stripped == 0);
  // compat has no oci_runtime: it is left alone there
  CHECK(strip(R"({"oci_runtime":"crun"})", Family::compat) == R"({"oci_runtime":"crun"})");
}

TEST_CASE("rewrite: runtime annotations, any key case, any value; other annotations kept") {
  CHECK(strip(R"({"annotations":{"dev.gvisor.spec.rootfs.source":"/","keep":"1"}})") ==
        R"({"annotations":{"keep":"1"}})");
  CHECK(strip(R"({"Annotations":{"DEV.GVISOR.flag.x":"1","a":"b","dev.gVisor.y":"z"}})") ==
        R"({"Annotations":{"a":"b"}})");
  CHECK(strip(R"({"annotations":{"io.kubernetes.cri.sandbox-id":"abc","io.kubernetes.cri.container-type":"container"}})") ==
        R"({"annotations":{}})");
  CHECK(strip(R"({"annotations":{"io.kubernetes.cri-o.SandboxID":"abc","io.kubernetes.cri-o.ContainerType":"container","x":"y"}})") ==
        R"({"annotations":{"x":"y"}})");
  CHECK(strip(R"({"annotations":null})") == R"({"annotations":null})");
  CHECK(refused(R"({"annotations":"dev.gvisor.x"})"));
  CHECK(refused(R"({"annotations":["a"]})"));
  // compat: HostConfig.Runtime and HostConfig.Annotations, any case
  CHECK(strip(R"({"Image":"bb","HostConfig":{"Runtime":"crun","Memory":0}})", Family::compat) ==
        R"({"Image":"bb","HostConfig":{"Memory":0}})");
  CHECK(strip(R"({"hostconfig":{"runtime":"crun","annotations":{"dev.gvisor.x":"1","k":"v"}}})", Family::compat) ==
        R"({"hostconfig":{"annotations":{"k":"v"}}})");
  CHECK(strip(R"({"HOSTCONFIG":{"RUNTIME":"crun"}})", Family::compat) == R"({"HOSTCONFIG":{}})");
  // the compat top-level "annotations" is not read by the engine: left alone
  CHECK(strip(R"({"Annotations":{"dev.gvisor.x":"1"}})", Family::compat) == R"({"Annotations":{"dev.gvisor.x":"1"}})");
  // libpod "hostconfig" is no field there either
  CHECK(strip(R"({"HostConfig":{"Runtime":"crun"}})") == R"({"HostConfig":{"Runtime":"crun"}})");
}

TEST_CASE("rewrite: duplicate and case-variant keys are refused at every level") {
  CHECK(refused(R"({"oci_runtime":"runsc","oci_runtime":"crun"})"));
  CHECK(refused(R"({"oci_runtime":"runsc","OCI_RUNTIME":"crun"})"));
  CHECK(refused(R"({"annotations":{},"Annotations":{"dev.gvisor.x":"1"}})"));
  CHECK(refused(R"({"annotations":{"a":"1","A":"2"}})"));
  CHECK(refused(R"({"HostConfig":{},"hostconfig":{"Runtime":"crun"}})", Family::compat));
  CHECK(refused(R"({"x":{"y":[{"k":1,"K":2}]}})"));
  CHECK(refused("{\"kind\":1,\"\xE2\x84\xAAind\":2}"));  // KELVIN SIGN folds to k
  CHECK(refused(R"({"a":1,"\u0061":2})"));
}

TEST_CASE("rewrite: trailing data, bad JSON, bad UTF-8, depth are refused") {
  CHECK(refused(R"({"image":"bb"}{"oci_runtime":"crun"})"));
  CHECK(refused(R"({"image":"bb"} x)"));
  CHECK(refused(R"({"image":"bb"},)"));
  CHECK(strip("{\"image\":\"bb\"}\r\n ") == "{\"image\":\"bb\"}\r\n ");
  CHECK(refused("[1]"));
  CHECK(refused("\"x\""));
  CHECK(refused(" "));
  CHECK(refused("{"));
  CHECK(refused(R"({"a":01})"));
  CHECK(refused(R"({"a":1.})"));
  CHECK(refused(R"({"a":tru})"));
  CHECK(refused(R"({"a":"\x"})"));
  CHECK(refused(R"({"a":"\ud800"})"));
  CHECK(refused(R"({"a":"\udc00\ud800"})"));
  CHECK(refused("{\"a\":\"\xC0\xAF\"}"));   // overlong
  CHECK(refused("{\"a\":\"\xED\xA0\x80\"}"));  // encoded surrogate
  CHECK(refused("{\"a\":\"x\ty\"}"));          // raw control
  CHECK(refused("\xEF\xBB\xBF{}"));            // BOM
  CHECK(strip(R"({"a":"\ud83d\ude00"})") == R"({"a":"\ud83d\ude00"})");
  std::string deep(kMaxDepth + 1, '[');
  CHECK(refused("{\"a\":" + deep + std::string(kMaxDepth + 1, ']') + "}"));
  CHECK(rewrite_create("", Family::libpod).ok);  // Content-Length: 0, as the engine reads it
  CHECK(rewrite_create(R"({"a":1} x)", Family::libpod).error.find("data after") != std::string::npos);
}

TEST_CASE("rewrite property on a sample: nlohmann reads the output as the input minus the fields") {
  std::string in = R"({"image":"bb","oci_runtime":"crun","annotations":{"dev.gvisor.x":"1","k":"v"},"n":[1,{"a":2}]})";
  auto want = nlohmann::json::parse(in);
  want.erase("oci_runtime");
  want["annotations"].erase("dev.gvisor.x");
  CHECK(nlohmann::json::parse(strip(in)) == want);
}

TEST_CASE("raw head checks: bare LF, obs-fold, control bytes") {
  CHECK_FALSE(check_raw_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  CHECK(check_raw_head("GET / HTTP/1.1\nHost: x\r\n\r\n"));
  CHECK(check_raw_head("GET / HTTP/1.1\r\nHost: x\n\r\n"));
  CHECK(check_raw_head("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n"));
  CHECK(check_raw_head("GET / HTTP/1.1\r\nHost: x\r\n\tfolded\r\n\r\n"));
  CHECK(check_raw_head("GET / HTTP/1.1\r\nHost: x\ry\r\n\r\n"));
  CHECK(check_raw_head(std::string("GET / HTTP/1.1\r\nHost: x\0y\r\n\r\n", 30)));
  CHECK(check_raw_head("\r\nGET / HTTP/1.1\r\n\r\n"));
  CHECK(check_raw_head("get / HTTP/1.1\r\n\r\n"));
}

TEST_CASE("parsed head checks: versions, h2c, TE") {
  RequestHead h;
  h.method = "POST";
  h.target = "/x";
  CHECK_FALSE(check_head(h));
  h.headers = {{"Transfer-Encoding", "chunked"}};
  CHECK_FALSE(check_head(h));
  h.minor = 0;
  CHECK(check_head(h)->find("HTTP/1.0") != std::string::npos);
  h.minor = 1;
  h.headers = {{"Transfer-Encoding", "gzip, chunked"}};
  CHECK(check_head(h));
  h.headers = {{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}};
  CHECK(check_head(h));
  h.headers = {{"Upgrade", "h2c"}};
  CHECK(check_head(h));
  h.headers = {{"Upgrade", "tcp"}, {"Connection", "Upgrade"}};
  CHECK_FALSE(check_head(h));
  h.headers = {{"HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"}};
  CHECK(check_head(h));
  h.headers = {};
  h.major = 2;
  h.minor = 0;
  CHECK(check_head(h));
  h.major = 1;
  h.minor = 1;
  h.method = "PRI";
  CHECK(check_head(h));
}

TEST_CASE("emit_head: one framing header, never both") {
  RequestHead h;
  h.method = "POST";
  h.target = "/v4/libpod/containers/create";
  h.headers = {{"Host", "d"}, {"Content-Length", "5"}, {"Expect", "100-continue"}, {"X", "y"}};
  CHECK(emit_head(h, false, 17, true) ==
        "POST /v4/libpod/containers/create HTTP/1.1\r\nHost: d\r\nX: y\r\nContent-Length: 17\r\n\r\n");
  h.headers = {{"Transfer-Encoding", "chunked"}, {"Host", "d"}};
  CHECK(emit_head(h, true, std::nullopt, false) ==
        "POST /v4/libpod/containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n");
}

TEST_CASE("stripped members are counted by field") {
  Rewrite r = rewrite_create(
      R"({"oci_runtime":"crun","annotations":{"dev.gvisor.a":"1","DEV.GVISOR.b":"2",)"
      R"("io.kubernetes.cri.sandbox-id":"x","k":"v"}})",
      Family::libpod);
  REQUIRE(r.ok);
  CHECK(r.stripped == 4);
  CHECK(r.by_kind[static_cast<int>(Stripped::oci_runtime)] == 1);
  CHECK(r.by_kind[static_cast<int>(Stripped::gvisor_annotation)] == 2);
  CHECK(r.by_kind[static_cast<int>(Stripped::sandbox_annotation)] == 1);
  Rewrite c = rewrite_create(R"({"HostConfig":{"Runtime":"crun"}})", Family::compat);
  REQUIRE(c.ok);
  CHECK(c.by_kind[static_cast<int>(Stripped::hostconfig_runtime)] == 1);
}

TEST_CASE("the counters' text names every class, reason and field, zeros included") {
  Stats st;
  st.requests[static_cast<int>(RouteClass::unknown)] = 3;
  st.refused("unknown_route");
  st.refused("unknown_route");
  st.stripped[static_cast<int>(Stripped::oci_runtime)] = 5;
  std::string t = st.render();
  CHECK(t.find("fy_sockfilter_requests_total{class=\"unknown\"} 3\n") != std::string::npos);
  CHECK(t.find("fy_sockfilter_requests_total{class=\"known\"} 0\n") != std::string::npos);
  CHECK(t.find("fy_sockfilter_refusals_total{reason=\"unknown_route\"} 2\n") != std::string::npos);
  CHECK(t.find("fy_sockfilter_refusals_total{reason=\"kube_play\"} 0\n") != std::string::npos);
  CHECK(t.find("fy_sockfilter_stripped_total{field=\"oci_runtime\"} 5\n") != std::string::npos);
  CHECK(t.find("# TYPE fy_sockfilter_refusals_total counter\n") != std::string::npos);
}

// The rewrite and the framing against the Go oracle (go_oracle.h): what
// podman's decoders bind, with podman's real field sets, and what net/http's
// reader frames. Skips, saying so, when the oracle was not built (no Go).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "go_oracle.h"
#include "src/go_case_table.h"
#include "src/http.h"
#include "src/rewrite.h"
#include "src/route.h"

using namespace fy::sockfilter;
using fy::sockfilter::test::GoOracle;
using nlohmann::json;

namespace {

bool runtime_annotation(const std::string& k) {
  return is_runtime_annotation(fold(k)) || is_runtime_annotation(fold_lower(k));
}

std::string utf8(char32_t cp) {
  std::string o;
  if (cp < 0x80) {
    o.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    o.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    o.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    o.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    o.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    o.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    o.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    o.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    o.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    o.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return o;
}

// A protected field and a body that sets it under a key.
struct Protected {
  Family family;
  const char* name;    // as podman's struct names it
  std::string before;  // the body around the key
  std::string after;
  bool by_annotations;  // bound shows as an annotation, not as the runtime
};

std::vector<Protected> protected_fields() {
  const std::string ann = "{\"dev.gvisor.spec.rootfs.source\":\"/\",\"keep.me\":\"1\"}";
  return {
      {Family::libpod, "oci_runtime", "{\"image\":\"bb\",\"", "\":\"crun\"}", false},
      {Family::libpod, "annotations", "{\"image\":\"bb\",\"", "\":" + ann + "}", true},
      {Family::compat, "HostConfig", "{\"Image\":\"bb\",\"",
       "\":{\"Runtime\":\"crun\",\"Annotations\":" + ann + "}}", false},
      {Family::compat, "Runtime", "{\"Image\":\"bb\",\"HostConfig\":{\"", "\":\"crun\"}}", false},
      {Family::compat, "Annotations", "{\"Image\":\"bb\",\"HostConfig\":{\"", "\":" + ann + "}}",
       true},
  };
}

bool bound(const json& view, bool by_annotations) {
  if (!view["error"].is_null()) return false;  // podman refuses the create: nothing is made
  if (!by_annotations) return !view["runtime"].is_null();
  return view["annotations"].is_object() &&
         view["annotations"].contains("dev.gvisor.spec.rootfs.source");
}

bool any_protected(const json& answer) {
  for (const json& v : answer["views"]) {
    if (!v["error"].is_null()) continue;
    if (fy::sockfilter::test::binds_protected(v, runtime_annotation)) return true;
  }
  return false;
}

char kind(Family f) {
  return f == Family::libpod ? 'L' : 'C';
}

// The code points tried in each letter of each protected name: every ASCII
// letter, the runes of both Go tables, and whole blocks where case lives
// (Latin, Greek, Cyrillic, Latin Extended Additional, letterlike symbols,
// ligatures, fullwidth, Deseret).
std::vector<char32_t> candidates() {
  std::vector<char32_t> c;
  for (char32_t x = 'A'; x <= 'Z'; ++x) c.push_back(x);
  for (char32_t x = 'a'; x <= 'z'; ++x) c.push_back(x);
  auto range = [&](char32_t a, char32_t b) {
    for (char32_t x = a; x <= b; ++x) c.push_back(x);
  };
  range(0x80, 0x2AF);
  range(0x370, 0x4FF);
  range(0x1E00, 0x1EFF);
  range(0x2100, 0x214F);
  range(0xFB00, 0xFB06);
  range(0xFF21, 0xFF5A);
  range(0x10400, 0x1044F);
  return c;
}

}  // namespace

TEST_CASE("every key podman's decoders bind to a protected field is stripped (Go oracle)") {
  GoOracle* o = GoOracle::get();
  if (!o) {
    MESSAGE("skipped: go is not installed, the oracle was not built");
    return;
  }
  int tried = 0, bound_in = 0, bound_jsoniter_only = 0, bound_encoding_json_only = 0;
  for (const Protected& p : protected_fields()) {
    std::string name = p.name;
    std::string lname = fold(name);
    for (size_t i = 0; i < name.size(); ++i) {
      if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z'))) continue;
      for (char32_t cp : candidates()) {
        std::string key = name.substr(0, i) + utf8(cp) + name.substr(i + 1);
        std::string body = p.before + key + p.after;
        json in = o->ask(kind(p.family), body);
        ++tried;
        bool any = false, by_ej = false, by_ji = false;
        for (const json& v : in["views"]) {
          bool b = bound(v, p.by_annotations);
          bool jsoniter = v["decoder"] == "json-iterator";
          bool has_field = !(p.by_annotations && p.family == Family::compat &&
                             v["engine"] == "podman 4.3.1");  // 4.3 has no HostConfig.Annotations
          // The filter's folds are what the decoders do, rune by rune.
          bool expect = has_field && (jsoniter ? fold_lower(key) == lname : fold(key) == lname);
          INFO("key " << key << " engine " << v["engine"].get<std::string>());
          CHECK(b == expect);
          any = any || b;
          (jsoniter ? by_ji : by_ej) = (jsoniter ? by_ji : by_ej) || b;
        }
        bound_in += any;
        bound_jsoniter_only += by_ji && !by_ej;
        bound_encoding_json_only += by_ej && !by_ji;
        Rewrite r = rewrite_create(body, p.family);
        INFO("body " << body);
        REQUIRE(r.ok);
        if (r.stripped == 0) {
          CHECK(r.body == body);
          CHECK_FALSE(any);
          continue;
        }
        json out = o->ask(kind(p.family), r.body);
        CHECK_FALSE(any_protected(out));
      }
    }
  }
  MESSAGE(tried << " keys tried, " << bound_in << " bound by some podman, " << bound_jsoniter_only
                << " only by json-iterator (podman 6), " << bound_encoding_json_only
                << " only by encoding/json (podman 4.3/5.x)");
  // The classes the issue names are among them.
  CHECK(bound_jsoniter_only > 0);
  CHECK(bound_encoding_json_only > 0);
}

TEST_CASE("the instances of issue 26: oci_runtİme, annotatİons, HostConfİg bind in podman 6") {
  GoOracle* o = GoOracle::get();
  if (!o) {
    MESSAGE("skipped: go is not installed, the oracle was not built");
    return;
  }
  const std::string I = "\xC4\xB0";  // U+0130
  struct Case {
    Family f;
    std::string body;
  };
  for (const Case& c : std::vector<Case>{
           {Family::libpod, "{\"image\":\"bb\",\"oci_runt" + I + "me\":\"crun\"}"},
           {Family::libpod,
            "{\"image\":\"bb\",\"annotat" + I + "ons\":{\"dev.gvisor.spec.rootfs.source\":\"/\"}}"},
           {Family::compat, "{\"Image\":\"bb\",\"HostConf" + I +
                                "g\":{\"Annotations\":{\"dev.gvisor.spec.rootfs.source\":\"/\"}}}"},
           {Family::compat, "{\"Image\":\"bb\",\"Ho\xC5\xBFtConfig\":{\"Runtime\":\"crun\"}}"},
       }) {
    INFO(c.body);
    CHECK(any_protected(o->ask(kind(c.f), c.body)));
    Rewrite r = rewrite_create(c.body, c.f);
    REQUIRE(r.ok);
    CHECK(r.stripped > 0);
    CHECK_FALSE(any_protected(o->ask(kind(c.f), r.body)));
  }
  // A key one decoder binds and another one spelled plainly: merged by that
  // decoder, so refused as a repeat.
  CHECK_FALSE(rewrite_create("{\"annotations\":{},\"annotat" + I + "ons\":{}}", Family::libpod).ok);
  CHECK_FALSE(rewrite_create("{\"annotations\":{},\"annotation\xC5\xBF\":{}}", Family::libpod).ok);
  // A non-ASCII key no decoder binds to a field is kept: podman accepts it.
  Rewrite keep = rewrite_create("{\"image\":\"bb\",\"oci_runt\xC4\xB1me\":\"crun\"}",
                                Family::libpod);  // U+0131 dotless i: no decoder's 'i'
  CHECK(keep.ok);
  CHECK(keep.stripped == 0);
  CHECK_FALSE(any_protected(o->ask('L', keep.body)));
}

TEST_CASE("the table: every rune of it binds in podman's real structs, as its decoder") {
  GoOracle* o = GoOracle::get();
  if (!o) {
    MESSAGE("skipped: go is not installed, the oracle was not built");
    return;
  }
  auto check = [&](const GoCaseFold& f, const char* decoder) {
    for (const Protected& p : protected_fields()) {
      std::string name = p.name;
      size_t i = fold(name).find(f.ascii);
      if (i == std::string::npos) continue;
      std::string body = p.before + name.substr(0, i) + utf8(f.rune) + name.substr(i + 1) + p.after;
      bool seen = false;
      json a = o->ask(kind(p.family), body);
      for (const json& v : a["views"]) {
        if (v["decoder"] == decoder && bound(v, p.by_annotations)) seen = true;
      }
      INFO(body << " " << decoder);
      CHECK(seen);
    }
  };
  for (const GoCaseFold& f : kJsoniterLower) check(f, "json-iterator");
  for (const GoCaseFold& f : kEncodingJsonFold) check(f, "encoding/json");
}

TEST_CASE("framing: what the filter emits, net/http reads as the same request") {
  GoOracle* o = GoOracle::get();
  if (!o) {
    MESSAGE("skipped: go is not installed, the oracle was not built");
    return;
  }
  RequestHead h;
  h.method = "POST";
  h.target = "/v4.0.0/libpod/images/load?x=1";
  h.headers = {{"Host", "d"}, {"Content-Type", "application/x-tar"}, {"X-A", "b c"}};
  std::string body = "0123456789abcdef\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
  SUBCASE("chunked, in pieces, then the last chunk and the next request") {
    std::string wire = emit_head(h, true, std::nullopt, false);
    for (size_t at = 0; at < body.size(); at += 7) {
      std::string piece = body.substr(at, 7);
      wire += chunk_size_line(piece.size()) + piece + "\r\n";
    }
    wire += kLastChunk;
    wire += "GET /v4.0.0/libpod/_ping HTTP/1.1\r\nHost: d\r\n\r\n";
    json a = o->ask('H', wire);
    INFO(a.dump());
    REQUIRE(a["requests"].size() == 2);
    const json& r = a["requests"][0];
    CHECK(r["method"] == "POST");
    CHECK(r["target"] == h.target);
    CHECK(r["transfer_encoding"] == json::array({"chunked"}));
    CHECK(r["body"] == body);
    CHECK(r["trailer"].is_null());
    CHECK(r["header"]["X-A"] == json::array({"b c"}));
    CHECK(a["requests"][1]["target"] == "/v4.0.0/libpod/_ping");
    CHECK(a["error"] == "");
    CHECK(a["rest"] == "");
  }
  SUBCASE("Content-Length, from a head that came chunked or with Expect") {
    h.headers.push_back({"Expect", "100-continue"});
    std::string wire = emit_head(h, false, body.size(), true) + body;
    json a = o->ask('H', wire);
    INFO(a.dump());
    REQUIRE(a["requests"].size() == 1);
    CHECK(a["requests"][0]["content_length"] == body.size());
    CHECK(a["requests"][0]["body"] == body);
    CHECK_FALSE(a["requests"][0]["header"].contains("Expect"));
    CHECK(a["rest"] == "");
  }
  SUBCASE("the oracle sees a trailer when one is sent (it can tell)") {
    std::string wire = emit_head(h, true, std::nullopt, false) + "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
    json a = o->ask('H', wire);
    REQUIRE(a["requests"].size() == 1);
    CHECK(a["requests"][0]["trailer"]["X-T"] == json::array({"1"}));
  }
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  if (!GoOracle::get()) {
    printf("skipped: go is not installed (the oracle was not built)\n");
    return rc ? rc : 77;
  }
  return rc;
}

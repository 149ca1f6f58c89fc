// Unit tests for fy-forwarder's pure parts: the head check and rewrite, the
// stamp vectors of docs/stamp.md, the configuration, cgroup classification
// and the stamp sequence record. The relay, the namespaces and attribution
// are tested with real kernel parts by the Python tests beside this file.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <uv.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/crypto.h"
#include "core/net.h"
#include "core/stamp.h"
#include "forwarder/attrib.h"
#include "forwarder/config.h"
#include "forwarder/dirwatch.h"
#include "forwarder/head.h"
#include "forwarder/ingress.h"
#include "forwarder/netns.h"
#include "forwarder/redirect.h"
#include "forwarder/relay.h"
#include "forwarder/stamper.h"

using namespace fy;
using namespace fy::fwd;

namespace {

struct Parsed {
  ParseResult r;
  Head h;
};

Parsed parse(std::string_view s, size_t max = 16384) {
  Parsed p;
  p.r = parse_head(s, HeadLimits{max, 128}, &p.h);
  return p;
}

Refusal refusal_of(std::string_view s) {
  auto p = parse(s);
  REQUIRE(p.r.status == ParseStatus::refused);
  return p.r.refusal;
}

// The head as it goes upstream.
std::string rewritten(std::string_view s, std::string_view stamp_line) {
  auto p = parse(s);
  REQUIRE(p.r.status == ParseStatus::complete);
  iovec iov[Head::kMaxKeep + 2];
  size_t n = build_iov(p.h, s, stamp_line, iov);
  std::string out;
  for (size_t i = 0; i < n; ++i) out.append(static_cast<char*>(iov[i].iov_base), iov[i].iov_len);
  return out;
}

}  // namespace

TEST_CASE("canonical proxy heads are accepted") {
  auto p = parse("GET http://example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\n\r\nBODY");
  CHECK(p.r.status == ParseStatus::complete);
  CHECK(p.h.method == "GET");
  CHECK(p.h.target == "http://example.com/a?b=1");
  CHECK(p.h.length == 60);
  CHECK_FALSE(p.h.is_connect);

  p = parse(
      "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n"
      "Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\r\n");
  CHECK(p.r.status == ParseStatus::complete);
  CHECK(p.h.is_connect);
  CHECK(p.h.header_count == 2);

  CHECK(parse("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n").r.status == ParseStatus::complete);
  CHECK(parse("GET https://example.com HTTP/1.0\r\n\r\n").r.status == ParseStatus::complete);
  CHECK(parse("M-SEARCH http://h:8080/ HTTP/1.1\r\nX-Tab:\tv\r\n\r\n").r.status ==
        ParseStatus::complete);
  // obs-text in a value is allowed; the proxy decides about it.
  CHECK(parse("GET http://h/ HTTP/1.1\r\nX: caf\xc3\xa9\r\n\r\n").r.status ==
        ParseStatus::complete);
  CHECK(parse("GET http://h/ HTTP/1.1\r\nX:\r\n\r\n").r.status == ParseStatus::complete);
}

TEST_CASE("a head arriving in pieces is incomplete until its blank line") {
  std::string full = "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n";
  for (size_t n = 0; n < full.size(); ++n) {
    CAPTURE(n);
    CHECK(parse(full.substr(0, n)).r.status == ParseStatus::incomplete);
  }
  CHECK(parse(full).r.status == ParseStatus::complete);
}

TEST_CASE("non-canonical heads are refused with the reason") {
  CHECK(refusal_of("GET http://h/ HTTP/1.1\nHost: h\r\n\r\n") == Refusal::bare_lf);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nHost: h\n\r\n") == Refusal::bare_lf);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nHost: h\r\n\n") == Refusal::bare_lf);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nHo\rst: h\r\n\r\n") == Refusal::bare_cr);
  // Refused as soon as the bad line is seen, not at the end of the head.
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nA: \r b") == Refusal::bare_cr);
  CHECK(refusal_of(std::string("GET http://h/ HTTP/1.1\r\nA: \0\r\n\r\n", 30)) == Refusal::nul);
  CHECK(refusal_of("\r\nGET http://h/ HTTP/1.1\r\n\r\n") == Refusal::leading_empty);
  CHECK(refusal_of("GET  http://h/ HTTP/1.1\r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of("GET http://h/  HTTP/1.1\r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of("GET http://h/ HTTP/1.1 \r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of(" GET http://h/ HTTP/1.1\r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of("GET\thttp://h/ HTTP/1.1\r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of("GET http://h/\r\n\r\n") == Refusal::request_line);
  CHECK(refusal_of("get http://h/ HTTP/1.1\r\n\r\n") == Refusal::method_case);
  CHECK(refusal_of("Get http://h/ HTTP/1.1\r\n\r\n") == Refusal::method_case);
  CHECK(refusal_of("G3T http://h/ HTTP/1.1\r\n\r\n") == Refusal::method);
  CHECK(refusal_of("GET http://h/ HTTP/2.0\r\n\r\n") == Refusal::version);
  CHECK(refusal_of("GET http://h/ http/1.1\r\n\r\n") == Refusal::version);
  CHECK(refusal_of("GET /path HTTP/1.1\r\nHost: h\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("OPTIONS * HTTP/1.1\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("GET HTTP://h/ HTTP/1.1\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("GET ftp://h/ HTTP/1.1\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("GET h:80 HTTP/1.1\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("CONNECT http://h:443/ HTTP/1.1\r\n\r\n") == Refusal::target_form);
  CHECK(refusal_of("CONNECT h HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("CONNECT h:0 HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("CONNECT h:99999 HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("CONNECT u@h:443 HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("GET http://u:p@h/ HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("GET http:/// HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("GET http://h/\x7f HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("GET http://h/\xc3\xa9 HTTP/1.1\r\n\r\n") == Refusal::target);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nA: b\r\n c\r\n\r\n") == Refusal::obs_fold);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\n\tA: b\r\n\r\n") == Refusal::obs_fold);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nFy-Stamp : x\r\n\r\n") == Refusal::header_name);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\n: x\r\n\r\n") == Refusal::header_name);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nNo colon\r\n\r\n") == Refusal::header_name);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nA(b): x\r\n\r\n") == Refusal::header_name);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nA: \x01\r\n\r\n") == Refusal::header_value);
  CHECK(refusal_of("GET http://h/ HTTP/1.1\r\nA: \x7f\r\n\r\n") == Refusal::header_value);
}

TEST_CASE("size and header-count limits") {
  std::string big = "GET http://h/ HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n";
  CHECK(parse(big, 1024).r.refusal == Refusal::too_large);
  CHECK(parse(big.substr(0, 1024), 1024).r.refusal == Refusal::too_large);
  CHECK(parse(big, 4096).r.status == ParseStatus::complete);
  std::string many = "GET http://h/ HTTP/1.1\r\n";
  for (int i = 0; i < 129; ++i) many += "A: b\r\n";
  many += "\r\n";
  CHECK(refusal_of(many) == Refusal::too_many_headers);
}

TEST_CASE("every client-written stamp line is removed and ours added once") {
  const std::string ours = "Fy-Stamp: OURS\r\n";
  CHECK(rewritten("GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", ours) ==
        "GET http://h/ HTTP/1.1\r\nHost: h\r\nFy-Stamp: OURS\r\n\r\n");
  CHECK(rewritten("GET http://h/ HTTP/1.1\r\nFy-Stamp: a\r\nHost: h\r\nfy-stamp: b\r\n"
                  "FY-STAMP:c\r\nAccept: */*\r\nfY-sTaMp:  d \r\n\r\nBODY",
                  ours) ==
        "GET http://h/ HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nFy-Stamp: OURS\r\n\r\n");
  CHECK(rewritten("CONNECT h:443 HTTP/1.1\r\nFy-Stamp: a\r\nFy-Stamp: b\r\n\r\n", ours) ==
        "CONNECT h:443 HTTP/1.1\r\nFy-Stamp: OURS\r\n\r\n");
  // Proxy-Authorization passes byte for byte.
  CHECK(rewritten("CONNECT h:443 HTTP/1.1\r\nProxy-Authorization: Basic eDp5\r\n\r\n", ours) ==
        "CONNECT h:443 HTTP/1.1\r\nProxy-Authorization: Basic eDp5\r\nFy-Stamp: OURS\r\n\r\n");
  // Names that only look like the stamp stay.
  CHECK(rewritten("GET http://h/ HTTP/1.1\r\nFy-Stamps: a\r\nX-Fy-Stamp: b\r\n\r\n", "") ==
        "GET http://h/ HTTP/1.1\r\nFy-Stamps: a\r\nX-Fy-Stamp: b\r\n\r\n");
  auto p = parse("GET http://h/ HTTP/1.1\r\nFy-Stamp: a\r\nfy-stamp: b\r\n\r\n");
  CHECK(p.h.stamps_removed == 2);
  // The most stamp lines a head can hold, interleaved, all go.
  std::string many = "GET http://h/ HTTP/1.1\r\n";
  for (int i = 0; i < 64; ++i) many += "Fy-Stamp: x\r\nA: b\r\n";
  many += "\r\n";
  std::string out = rewritten(many, ours);
  CHECK(out.find("Fy-Stamp: x") == std::string::npos);
  CHECK(out.find("Fy-Stamp: OURS") != std::string::npos);
}

TEST_CASE("stamp vectors of docs/stamp.md verify and round-trip") {
  std::string key;
  for (int i = 0; i < 32; ++i) key += static_cast<char>(i);
  const char* valid[] = {
      "v=1;src=10.89.1.2;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "beff60f3252f6a27d28922be9f8fb8f4f2d2b8e831ecb9751cf38dd857117ea1",
      "v=1;src=127.0.0.1;net=host;who=container:0123456789abcdef0123456789abcdef0123456789abcdef"
      "0123456789abcdef;seq=7;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "50d56f8c032da22a13cf228dba7ec252ef011eed1b030277ecaa7f787d641cea",
      "v=1;src=fd00::1:2;net=podman2;who=build:crun-buildah-buildah123.scope;seq="
      "18446744073709551615;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "613018efb7b1a98aed92a2d644f53c4ac3e6c5830e13b06692d6f0387b7c024a",
      "v=1;src=192.168.5.15;net=host;who=user;seq=1;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;"
      "mac=d3fa9fddf186e820772bb5061b83b29a4eb39888385cfe4978dbdd24f4ed7b80",
      "v=1;src=127.0.0.1;net=host;who=uid:0;seq=9000;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;"
      "mac=c4f336f84a657ebfa1482dc7f4f77cb2d8322c0a56fa380d082e304f6ab50cb2",
  };
  for (const char* v : valid) {
    CAPTURE(v);
    auto f = stamp::verify(v, key);
    REQUIRE(f.ok());
    CHECK(stamp::format(*f, key) == v);
  }
  const char* refused[] = {
      "v=1;src=10.089.1.2;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "3311470e197945e21b0e73ee19fa62b80cd9081e59dd1b9458b968c1d044d8b2",
      "v=1;src=FD00::1;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "e97670df9e2f523477c2fb18f46e99c09daadd84e83d27e4ce466edd3677e82a",
      "v=1;src=10.89.1.2;net=podman1;seq=0;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "b2ee7ed9408d405e5fe73e201c4bc92a42d42cd60ddbb24619575500fe1aaba2",
      "v=1;src=10.89.1.2;net=podman1;seq=042;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "ae7335821d5db9278952b99a602964381d587da6d138872aff1487619e94372a",
      "v=1;src=10.89.1.2;net=podman1;seq=18446744073709551616;boot=0f1e2d3c-4b5a-6978-8796-"
      "a5b4c3d2e1f0;mac=0e21101003c7f4cc40d1240ffaa247a6bbb02360cc9c8b58f93cdbd641682852",
      "v=2;src=10.89.1.2;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "eafc09180495b8a455c1156c63e4a92da704a69a7c1f4e7f89072a0353c1764f",
      "v=1;net=podman1;src=10.89.1.2;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "488a3b24f74cb2510173ee5ee9cf039042fb5b743adfbf1dee0125e6cf474cb7",
      "v=1;src=10.89.1.2;net=podman1;who=;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "f55e50103883a1b131703cb33bc1a8c9c3e86d1ecffab75470949f03fe63dbb6",
      "v=1;src=10.89.1.2;net=podman1;seq=42;boot=0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0;mac="
      "d20230a68a6f73c9b3fbd57675478c0438ec982b481b4bee38ce8ee0ada0d5e4",
      "v=1;src=10.89.1.2;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;x=1;mac="
      "5ef357a27ff4a3ce4c4781b283d39ffa268d1363a0084dc922dcb9e40cadda87",
      "v=1;src=10.89.1.2;net=pod man1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;mac="
      "c442ab1529b0d55a88731f87d16c34070f54a77eae098fbdc3beda7c89251107",
      "v=1;src=10.89.1.2;net=podman1;seq=42;boot=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0;;mac="
      "2aeafbb36056f33c4f1bc31885099b8a4da6c42da6e49e53c2006bba7944e223",
  };
  for (const char* v : refused) {
    CAPTURE(v);
    auto f = stamp::verify(v, key);
    REQUIRE_FALSE(f.ok());
    // The MAC was right: the refusal is the grammar's, not the MAC's.
    CHECK(f.error().message.find("mac") == std::string::npos);
  }
  std::string upper = valid[0];
  for (size_t i = upper.rfind(";mac=") + 5; i < upper.size(); ++i)
    upper[i] = static_cast<char>(toupper(upper[i]));
  CHECK_FALSE(stamp::verify(upper, key).ok());
}

TEST_CASE("configuration: a complete file loads; mistakes are refused with file:line") {
  const char* good = R"(
key_file = "/k"
state_dir = "/tmp/x"
[upstream]
host = "192.168.5.2"
[[port]]
port = 42600
[[port]]
port = 42700
stamp = false
[bridge]
netns = "/run/user/1000/netns/rootless-netns"
[vm]
walled_uids = ["1000", "100000-165535"]
attribution = "proc"
)";
  auto c = parse_config(good, "f.toml");
  REQUIRE(c.ok());
  CHECK(c->control_socket == "/tmp/x/control.sock");
  CHECK(c->ports.size() == 2);
  CHECK(c->port_rule(42700)->stamp == false);
  CHECK(c->redials == 8);
  CHECK(c->connect_timeout_ms == 2000);
  CHECK(c->vm.walled(1000));
  CHECK(c->vm.walled(100000));
  CHECK(c->vm.walled(165535));
  CHECK_FALSE(c->vm.walled(0));
  CHECK_FALSE(c->vm.walled(165536));
  CHECK(c->vm.attribution == AttributionMode::proc);
  CHECK(c->vm.attribution_timeout_ms == 5000);
  CHECK(c->pipe_size == 1024 * 1024);  // a bulk direction's pipe; pipes start at 64 KiB
  CHECK(c->workers == 0);              // one per two CPUs

  auto w = parse_config(std::string(good) + "[limits]\nworkers = 4\n", "w.toml");
  REQUIRE(w.ok());
  CHECK(w->workers == 4);
  auto too_many = parse_config(std::string(good) + "[limits]\nworkers = 65\n", "w.toml");
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.error().message.find("workers") != std::string::npos);
  CHECK(c->pump_budget == 4 << 20);
  auto pb = parse_config(std::string(good) + "[limits]\npump_budget_kib = 64\n", "p.toml");
  REQUIRE(pb.ok());
  CHECK(pb->pump_budget == 64 * 1024);
  auto unbounded = parse_config(std::string(good) + "[limits]\npump_budget_kib = 0\n", "p.toml");
  REQUIRE(unbounded.ok());
  CHECK(unbounded->pump_budget == 0);
  REQUIRE_FALSE(
      parse_config(std::string(good) + "[limits]\npump_budget_kib = -1\n", "p.toml").ok());

  auto bad = parse_config("key_file = \"/k\"\n[upstream]\nhost = \"gw\"\nporrt = 1\n", "b.toml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("b.toml:3") != std::string::npos);  // host not an IP
  CHECK(bad.error().message.find("porrt") != std::string::npos);     // unknown key
  CHECK(bad.error().message.find("[[port]]") != std::string::npos);  // no ports
  CHECK(bad.error().message.find("nothing would listen") != std::string::npos);

  auto both = parse_config(
      "key_file = \"/k\"\n[upstream]\nhost = \"1.2.3.4\"\n[[port]]\nport=1\n"
      "[bridge]\nnetns=\"/a\"\nnetns_pid_file=\"/b\"\n",
      "c.toml");
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().message.find("exactly one of netns") != std::string::npos);

  CHECK(parse_uid_range("100000-165535").ok());
  CHECK_FALSE(parse_uid_range("5-4").ok());
  CHECK_FALSE(parse_uid_range("x").ok());
}

TEST_CASE("configuration: a [[port]] range serves every port of a band; overlaps refused") {
  // fy-machine's guest config: the walled band is base+0..89 (the worktrees'
  // proxies, stamped) and base+100..189 (their token minters, not stamped).
  const std::string head = R"(
key_file = "/k"
[upstream]
host = "192.168.5.2"
[bridge]
netns = "/run/user/1000/netns/rootless-netns"
)";
  const std::string band = head +
                           "[[port]]\nports = \"41000-41089\"\nstamp = true\n"
                           "[[port]]\nports = \"41100-41189\"\nstamp = false\n";
  auto c = parse_config(band, "band.toml");
  REQUIRE(c.ok());
  CHECK(c->ports.size() == 180);
  for (uint16_t off : {0, 1, 7, 88, 89}) {
    REQUIRE(c->port_rule(41000 + off) != nullptr);
    CHECK(c->port_rule(41000 + off)->stamp);
    REQUIRE(c->port_rule(41100 + off) != nullptr);
    CHECK_FALSE(c->port_rule(41100 + off)->stamp);
  }
  CHECK(c->port_rule(40999) == nullptr);
  CHECK(c->port_rule(41090) == nullptr);
  CHECK(c->port_rule(41099) == nullptr);
  CHECK(c->port_rule(41190) == nullptr);
  CHECK(format_ports(c->ports, ", ") == "41000-41089, 41100-41189");
  // One rule, the band as intervals of its set.
  CHECK(redirect_ruleset(*c).find("ip daddr 192.168.5.2 tcp dport { 41000-41089, 41100-41189 } "
                                  "redirect\n") != std::string::npos);
  // A range of one and a single port mix; listed ports are sorted and runs merged.
  auto mixed = parse_config(head +
                                "[[port]]\nport = 42700\nstamp = false\n"
                                "[[port]]\nports = \"42600\"\n[[port]]\nport = 42601\n",
                            "m.toml");
  REQUIRE(mixed.ok());
  CHECK(format_ports(mixed->ports, ",") == "42600-42601,42700");
  CHECK(mixed->port_rule(42600)->stamp);  // stamp's default holds for a range too

  auto refused = [&](const std::string& ports, const char* want, const char* where) {
    auto r = parse_config(head + ports, "e.toml");
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message);
    CHECK(r.error().message.find(want) != std::string::npos);
    CHECK(r.error().message.find(where) != std::string::npos);
  };
  // Overlapping bands: refused where the second one is given, naming the first.
  refused("[[port]]\nports = \"41000-41089\"\n[[port]]\nports = \"41080-41099\"\n",
          "41080-41099 overlaps port 41080, already given at e.toml:8:", "e.toml:10:");
  // A port inside a range given before, and a range over a port given before.
  refused("[[port]]\nports = \"41000-41089\"\n[[port]]\nport = 41007\n",
          "is listed twice: 41007 is already given at e.toml:8:", "e.toml:10:");
  refused("[[port]]\nport = 41007\n[[port]]\nports = \"41000-41089\"\n",
          "41000-41089 overlaps port 41007, already given at e.toml:8:", "e.toml:10:");
  refused("[[port]]\nport = 41007\n[[port]]\nport = 41007\n", "is listed twice", "e.toml:10:");
  // Spelling: backwards, out of range, not a number, the wrong type, both keys.
  refused("[[port]]\nports = \"41089-41000\"\n", "is not a port or an inclusive port range",
          "e.toml:8:");
  refused("[[port]]\nports = \"0-10\"\n", "is not a port or an inclusive port range", "e.toml:8:");
  refused("[[port]]\nports = \"65000-65536\"\n", "1-65535", "e.toml:8:");
  refused("[[port]]\nports = \"41000-\"\n", "is not a port", "e.toml:8:");
  refused("[[port]]\nports = \"41000..41089\"\n", "is not a port", "e.toml:8:");
  refused("[[port]]\nports = 41000\n", "expected a string", "e.toml:8:");
  refused("[[port]]\nport = 41000\nports = \"41001-41002\"\n", "has both port and ports",
          "e.toml:7:");
  refused("[[port]]\nstamp = false\n", "needs port = 1..65535 (one port) or ports", "e.toml:7:");
  // Unknown keys are still refused in a range's table.
  refused("[[port]]\nports = \"41000-41001\"\nstanp = false\n", "stanp", "e.toml:9:");
  // Past kMaxPorts in all (a listening socket per port, worker and namespace).
  refused("[[port]]\nports = \"1000-1999\"\n[[port]]\nports = \"3000-3100\"\n",
          "would make 1101 ports in all; at most 1024", "e.toml:10:");
  CHECK(parse_config(head + "[[port]]\nports = \"1000-2023\"\n", "e.toml").ok());
}

TEST_CASE("the bridge redirect: on by default, replaced whole, by the listener's address") {
  const char* base = R"(
key_file = "/k"
[upstream]
host = "192.168.5.2"
[[port]]
port = 42600
[[port]]
port = 42700
stamp = false
[bridge]
netns = "/run/user/1000/netns/rootless-netns"
)";
  auto c = parse_config(base, "r.toml");
  REQUIRE(c.ok());
  CHECK(c->bridge.redirect);
  // One transaction: make sure the table exists, delete it, define it anew,
  // so installing again never adds a second rule.
  CHECK(redirect_ruleset(*c) ==
        "table ip fy_forwarder_redirect {}\n"
        "delete table ip fy_forwarder_redirect\n"
        "table ip fy_forwarder_redirect {\n"
        "  chain prerouting {\n"
        "    type nat hook prerouting priority dstnat; policy accept;\n"
        "    ip daddr 192.168.5.2 tcp dport { 42600, 42700 } redirect\n"
        "  }\n"
        "}\n");

  // A listener bound to one address is reached by dnat to it.
  auto one = parse_config(std::string(base) + "listen = \"10.89.0.1\"\n", "r.toml");
  REQUIRE(one.ok());
  CHECK(redirect_ruleset(*one).find("tcp dport { 42600, 42700 } dnat to 10.89.0.1\n") !=
        std::string::npos);

  // IPv6 upstream: an ip6 table; "::" takes IPv4 too.
  std::string v6 = base;
  v6.replace(v6.find("192.168.5.2"), 11, "fd00::2");
  auto six = parse_config(v6 + "listen = \"::\"\n", "r.toml");
  REQUIRE(six.ok());
  CHECK(redirect_ruleset(*six).find("table ip6 fy_forwarder_redirect {\n") != std::string::npos);
  CHECK(redirect_ruleset(*six).find("ip6 daddr fd00::2 tcp dport") != std::string::npos);
  CHECK(parse_config(std::string(base) + "listen = \"::\"\n", "r.toml").ok());

  // A listener the redirect cannot reach is refused, unless redirect is off.
  auto wrong = parse_config(v6, "r.toml");  // listen 0.0.0.0, upstream IPv6
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message.find("r.toml:") != std::string::npos);
  CHECK(wrong.error().message.find("redirect cannot send") != std::string::npos);
  auto off = parse_config(v6 + "redirect = false\n", "r.toml");
  REQUIRE(off.ok());
  CHECK_FALSE(off->bridge.redirect);
  CHECK_FALSE(parse_config(std::string(base) + "redirect = \"yes\"\n", "r.toml").ok());

  // Loopback: a prerouting DNAT to it is dropped as a martian.
  auto lo = parse_config(std::string(base) + "listen = \"127.0.0.1\"\n", "r.toml");
  REQUIRE_FALSE(lo.ok());
  CHECK(lo.error().message.find("loopback") != std::string::npos);
  CHECK(parse_config(std::string(base) + "listen = \"127.0.0.1\"\nredirect = false\n", "r.toml")
            .ok());
}

TEST_CASE("accepted sockets inherit TCP_NODELAY from the listener") {
  // Connection::start() relies on it instead of a setsockopt per connection.
  auto l = listen_tcp("127.0.0.1", 0, 8);
  REQUIRE(l.ok());
  sockaddr_in a{};
  socklen_t len = sizeof a;
  REQUIRE(getsockname(l->get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(c >= 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&a), len) == 0);
  int s = -1;
  for (int i = 0; i < 100 && s < 0; ++i) {
    s = ::accept4(l->get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) usleep(1000);
  }
  REQUIRE(s >= 0);
  int v = 0;
  socklen_t vl = sizeof v;
  REQUIRE(getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &vl) == 0);
  CHECK(v != 0);
  ::close(s);
  ::close(c);
}

namespace {

// Connects to a listener on `ip` (port 0) and returns (accepted, client).
std::pair<int, int> accept_one(int lfd, int family) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  REQUIRE(getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  int c = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(c >= 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&a), len) == 0);
  int s = -1;
  for (int i = 0; i < 100 && s < 0; ++i) {
    s = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) usleep(1000);
  }
  REQUIRE(s >= 0);
  return {s, c};
}

IfPrefix prefix(const char* local, const char* net, uint8_t len) {
  IfPrefix p;
  p.family = strchr(local, ':') ? AF_INET6 : AF_INET;
  REQUIRE(inet_pton(p.family, local, p.local.data()) == 1);
  REQUIRE(inet_pton(p.family, net, p.net.data()) == 1);
  p.len = len;
  return p;
}

sockaddr_storage peer(const char* ip) {
  sockaddr_storage ss;
  socklen_t len;
  REQUIRE(make_sockaddr(ip, 1234, &ss, &len));
  return ss;
}

IngressVerdict judge(int ifindex, const IfLink* link, const char* ip) {
  sockaddr_storage ss = peer(ip);
  return judge_ingress(ifindex, link, reinterpret_cast<sockaddr*>(&ss));
}

}  // namespace

TEST_CASE("accepted sockets report their ingress interface (IP_PKTINFO, IPV6_MULTICAST_IF)") {
  // What the bridge listener stamps as net: here, loopback.
  const int lo = static_cast<int>(if_nametoindex("lo"));
  REQUIRE(lo > 0);
  {
    auto l = listen_tcp("127.0.0.1", 0, 8);
    REQUIRE(l.ok());
    REQUIRE(enable_ingress_ifindex(l->get(), AF_INET).ok());
    auto [s, c] = accept_one(l->get(), AF_INET);
    CHECK(read_ingress_ifindex(s, AF_INET) == lo);
    ::close(s);
    ::close(c);
  }
  {
    // Without IP_PKTINFO on the listener the kernel says nothing: 0, which
    // the listener refuses rather than guesses.
    auto l = listen_tcp("127.0.0.1", 0, 8);
    REQUIRE(l.ok());
    auto [s, c] = accept_one(l->get(), AF_INET);
    CHECK(read_ingress_ifindex(s, AF_INET) == 0);
    ::close(s);
    ::close(c);
  }
  {
    // An IPv6 listener, native and IPv4-mapped.
    auto l = listen_tcp("::", 0, 8);
    if (!l.ok()) {
      MESSAGE("no IPv6 here: " << l.error().message);
      return;
    }
    REQUIRE(enable_ingress_ifindex(l->get(), AF_INET6).ok());
    sockaddr_in6 a{};
    socklen_t len = sizeof a;
    REQUIRE(getsockname(l->get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    for (const char* ip : {"::1", "127.0.0.1"}) {
      sockaddr_storage to;
      socklen_t tl;
      REQUIRE(make_sockaddr(ip, ntohs(a.sin6_port), &to, &tl));
      int c = ::socket(to.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      REQUIRE(c >= 0);
      if (::connect(c, reinterpret_cast<sockaddr*>(&to), tl) != 0) {
        MESSAGE(ip << ": " << strerror(errno));
        ::close(c);
        continue;
      }
      int s = -1;
      for (int i = 0; i < 100 && s < 0; ++i) {
        s = ::accept4(l->get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (s < 0) usleep(1000);
      }
      REQUIRE(s >= 0);
      CHECK_MESSAGE(read_ingress_ifindex(s, AF_INET6) == lo, ip);
      ::close(s);
      ::close(c);
    }
  }
}

TEST_CASE("a connection is stamped only when its ingress link routes its source") {
  IfLink br{"podman1",
            {prefix("10.89.0.1", "10.89.0.1", 24), prefix("fd00::1", "fd00::1", 64),
             prefix("fe80::1", "fe80::1", 64)}};
  CHECK(judge(0, &br, "10.89.0.10") == IngressVerdict::no_ifindex);
  CHECK(judge(-1, &br, "10.89.0.10") == IngressVerdict::no_ifindex);
  CHECK(judge(7, nullptr, "10.89.0.10") == IngressVerdict::unknown_link);
  CHECK(judge(7, &br, "10.89.0.10") == IngressVerdict::ok);
  CHECK(judge(7, &br, "10.89.0.255") == IngressVerdict::ok);
  CHECK(judge(7, &br, "::ffff:10.89.0.10") == IngressVerdict::ok);       // IPv4-mapped is IPv4
  CHECK(judge(7, &br, "10.89.1.10") == IngressVerdict::outside_prefix);  // another bridge's
  CHECK(judge(7, &br, "10.88.0.10") == IngressVerdict::outside_prefix);
  CHECK(judge(7, &br, "10.89.0.1") == IngressVerdict::own_address);
  CHECK(judge(7, &br, "::ffff:10.89.0.1") == IngressVerdict::own_address);
  CHECK(judge(7, &br, "fd00::a") == IngressVerdict::ok);
  CHECK(judge(7, &br, "fd00:0:0:1::a") == IngressVerdict::outside_prefix);
  CHECK(judge(7, &br, "fe80::1234") == IngressVerdict::ok);  // per link: no scope needed
  CHECK(judge(7, &br, "fd00::1") == IngressVerdict::own_address);
  // Prefix lengths that end inside a byte, /0 and /32.
  IfLink odd{"x",
             {prefix("10.0.2.1", "10.0.2.1", 23), prefix("192.168.7.129", "192.168.7.129", 25),
              prefix("172.16.0.1", "172.16.0.1", 32)}};
  CHECK(judge(1, &odd, "10.0.3.255") == IngressVerdict::ok);
  CHECK(judge(1, &odd, "10.0.4.0") == IngressVerdict::outside_prefix);
  CHECK(judge(1, &odd, "10.0.1.255") == IngressVerdict::outside_prefix);
  CHECK(judge(1, &odd, "192.168.7.200") == IngressVerdict::ok);
  CHECK(judge(1, &odd, "192.168.7.127") == IngressVerdict::outside_prefix);
  CHECK(judge(1, &odd, "172.16.0.2") == IngressVerdict::outside_prefix);
  CHECK(judge(1, &odd, "fd00::a") == IngressVerdict::outside_prefix);  // no IPv6 prefix
  IfLink all{"any", {prefix("10.0.0.1", "10.0.0.1", 0)}};
  CHECK(judge(1, &all, "203.0.113.9") == IngressVerdict::ok);
  // A point-to-point link routes its peer's prefix, not its own address's.
  IfLink ptp{"tun0", {prefix("10.9.0.1", "10.9.0.2", 32)}};
  CHECK(judge(1, &ptp, "10.9.0.2") == IngressVerdict::ok);
  CHECK(judge(1, &ptp, "10.9.0.3") == IngressVerdict::outside_prefix);
  CHECK(judge(1, &ptp, "10.9.0.1") == IngressVerdict::own_address);
  IfLink none{"empty", {}};
  CHECK(judge(1, &none, "10.89.0.10") == IngressVerdict::outside_prefix);
  // What the client and the log are told.
  std::string why = ingress_refusal(IngressVerdict::outside_prefix, 7, &br, "10.89.1.10");
  CHECK(why.find("arrived on podman1 (10.89.0.1/24, fd00::1/64, fe80::1/64)") != std::string::npos);
  CHECK(why.find("source address 10.89.1.10") != std::string::npos);
  CHECK(
      ingress_refusal(IngressVerdict::unknown_link, 7, nullptr, "10.89.0.10").find("interface 7") !=
      std::string::npos);
  CHECK(ingress_refusal(IngressVerdict::own_address, 7, &br, "10.89.0.1")
            .find("own address on podman1") != std::string::npos);
  CHECK(ingress_refusal(IngressVerdict::ok, 7, &br, "10.89.0.10").empty());
  CHECK(describe_prefixes(none) == "no addresses");
}

TEST_CASE("the pipe pool: pipes start at 64 KiB, grow for bulk, shrink before reuse") {
  std::atomic<uint32_t> grown{0};
  PipePool pool(1024 * 1024, 8, &grown);
  int r = -1, w = -1;
  REQUIRE(pool.get(&r, &w));
  CHECK(fcntl(w, F_GETPIPE_SZ) == 64 * 1024);
  bool grew = pool.grow(w);
  // Past fs.pipe-max-size only with CAP_SYS_RESOURCE; either way it is a valid pipe.
  if (grew) CHECK(fcntl(w, F_GETPIPE_SZ) == 1024 * 1024);
  pool.put(r, w, true, grew);
  CHECK(pool.idle() == 1);
  int r2 = -1, w2 = -1;
  REQUIRE(pool.get(&r2, &w2));
  CHECK(r2 == r);
  CHECK(fcntl(w2, F_GETPIPE_SZ) == 64 * 1024);
  pool.put(r2, w2, false, false);  // not empty: closed, not kept
  CHECK(pool.idle() == 0);

  PipePool fixed(0, 8, &grown);
  REQUIRE(fixed.get(&r, &w));
  CHECK_FALSE(fixed.grow(w));
  fixed.put(r, w, true, false);
}

TEST_CASE("the pipe pool grows at most max_grown pipes at once, across the workers' pools") {
  // Two workers' pools share one count: the cap is forwarder-wide.
  std::atomic<uint32_t> grown{0};
  PipePool pool(128 * 1024, 2, &grown);  // 128 KiB: under the default fs.pipe-max-size (1 MiB)
  PipePool other(128 * 1024, 2, &grown);
  int p[3][2];
  bool grew[3];
  for (int i = 0; i < 3; ++i) {
    REQUIRE((i == 1 ? other : pool).get(&p[i][0], &p[i][1]));
    grew[i] = (i == 1 ? other : pool).grow(p[i][1]);
  }
  CHECK(grew[0]);
  CHECK(grew[1]);
  CHECK_FALSE(grew[2]);  // the cap: the third keeps 64 KiB
  CHECK(fcntl(p[2][1], F_GETPIPE_SZ) == 64 * 1024);
  CHECK(grown == 2);
  CHECK(pool.capped() == 1);
  CHECK(other.capped() == 0);
  pool.put(p[0][0], p[0][1], false, true);  // closed (not empty): its grant comes back
  CHECK(grown == 1);
  CHECK(pool.grow(p[2][1]));
  CHECK(fcntl(p[2][1], F_GETPIPE_SZ) == 128 * 1024);
  other.put(p[1][0], p[1][1], true, true);  // kept: shrunk back to 64 KiB
  pool.put(p[2][0], p[2][1], true, true);
  CHECK(grown == 0);
  CHECK(pool.idle() == 1);
  CHECK(other.idle() == 1);
}

TEST_CASE("cgroup paths are classified by their outermost scope") {
  std::string id(64, 'a');
  std::string id2(64, 'b');
  CHECK(Attributor::classify_cgroup("/user.slice/user-1000.slice/user@1000.service/user.slice/"
                                    "libpod-" +
                                    id + ".scope/container") == "container:" + id);
  CHECK(Attributor::classify_cgroup("/libpod-" + id + ".scope/x/libpod-" + id2 + ".scope") ==
        "container:" + id);
  CHECK(Attributor::classify_cgroup("/user.slice/crun-buildah-buildah4242.scope") ==
        "build:crun-buildah-buildah4242.scope");
  CHECK(Attributor::classify_cgroup("/a/crun-buildah-x.scope/libpod-" + id + ".scope") ==
        "build:crun-buildah-x.scope");
  CHECK(Attributor::classify_cgroup("/user.slice/user-1000.slice/session-3.scope") == "user");
  CHECK(Attributor::classify_cgroup("/libpod-conmon-" + id + ".scope") == "user");
  CHECK(Attributor::classify_cgroup("/libpod-" + id.substr(1) + ".scope") == "user");
  CHECK(Attributor::classify_cgroup("/libpod-" + std::string(64, 'A') + ".scope") == "user");
  CHECK(Attributor::classify_cgroup("/") == "user");
  CHECK(Attributor::classify_cgroup("") == "user");
  // Characters outside the stamp's who set are replaced, so the stamp stays valid.
  CHECK(Attributor::classify_cgroup("/crun-buildah-a;b c.scope") ==
        "build:crun-buildah-a_b_c.scope");
}

TEST_CASE("the stamp sequence continues across restarts within a boot") {
  char tmpl[] = "/tmp/fyf-unit-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  std::string dir = tmpl;
  std::string key = dir + "/key", boot = dir + "/boot";
  {
    std::ofstream(key) << std::string(64, 'a') << "\n";
    chmod(key.c_str(), 0600);
    std::ofstream(boot) << "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n";
  }
  std::string k = *unhex(std::string(64, 'a'));
  uint64_t first_seq = 0;
  {
    Stamper s;
    REQUIRE(s.init(key, boot, dir).ok());
    std::string line = s.line("10.89.0.2", "podman1", "");
    REQUIRE(line.rfind("Fy-Stamp: ", 0) == 0);
    REQUIRE(line.size() > 12);
    auto f = stamp::verify(line.substr(10, line.size() - 12), k);
    REQUIRE(f.ok());
    first_seq = f->seq;
    CHECK(first_seq == 1);
    for (int i = 0; i < 5000; ++i) (void)s.line("10.89.0.2", "podman1", "");  // crosses a block
  }
  {
    Stamper s;  // a restart in the same boot: never a sequence already used
    REQUIRE(s.init(key, boot, dir).ok());
    std::string line = s.line("10.89.0.2", "podman1", "");
    auto f = stamp::verify(line.substr(10, line.size() - 12), k);
    REQUIRE(f.ok());
    CHECK(f->seq > 5001);
  }
  {
    std::ofstream(boot) << "11111111-2222-3333-4444-555555555555\n";
    Stamper s;  // a new boot starts again from 1
    REQUIRE(s.init(key, boot, dir).ok());
    std::string line = s.line("10.89.0.2", "podman1", "");
    auto f = stamp::verify(line.substr(10, line.size() - 12), k);
    REQUIRE(f.ok());
    CHECK(f->seq == 1);
  }
  {
    chmod(key.c_str(), 0644);  // a key others can read is refused
    Stamper s;
    auto r = s.init(key, boot, dir);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("chmod 600") != std::string::npos);
  }
  std::string cmd = "rm -rf " + dir;
  CHECK(system(cmd.c_str()) == 0);
}

// ---- The hook's start records (forwarder/starts.h) ---------------------------

#include <signal.h>
#include <sys/wait.h>

#include "forwarder/starts.h"

TEST_CASE("starts: the control line") {
  std::string id;
  pid_t pid = 0;
  const std::string hex(64, 'c');
  CHECK(fy::fwd::parse_start_line("start " + hex + " 4242", &id, &pid));
  CHECK(id == hex);
  CHECK(pid == 4242);
  CHECK_FALSE(fy::fwd::parse_start_line("start " + hex, &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("start " + hex + " 0", &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("start " + hex + " -1", &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("start " + hex + " 12 13", &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("start ../etc 12", &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("start " + std::string(64, 'C') + " 12", &id, &pid));
  CHECK_FALSE(fy::fwd::parse_start_line("begin " + hex + " 12", &id, &pid));
}

TEST_CASE("starts: a process's addresses, for as long as its namespace lives") {
  // A child in a network namespace of its own, with one address on a veth.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(p[0]);
    ::dup2(p[1], 1);
    ::execlp("unshare", "unshare", "-n", "sh", "-c",
             "ip link add fy17v type veth peer name fy17w && ip addr add 10.217.0.5/24 dev fy17v "
             "&& ip link set fy17v up && echo ready && exec sleep 30",
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(p[1]);
  char buf[16] = {};
  ssize_t n = ::read(p[0], buf, sizeof buf - 1);
  ::close(p[0]);
  if (n <= 0 || std::string(buf).rfind("ready", 0) != 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL("cannot make a network namespace with a veth (unshare -n, ip link): this test needs root");
  }
  fy::fwd::Starts starts;
  const std::string id(64, 'd');
  auto r = starts.record(id, child);  // unshare exec'd sh, which exec'd sleep: the same pid
  REQUIRE(r.ok());
  CHECK(*r == 1);  // loopback not counted
  CHECK(starts.holder("10.217.0.5") == id);
  CHECK(starts.holder("10.217.0.6").empty());
  // The same start again changes nothing; a second container in the same
  // namespace (a pod) makes the address name neither.
  REQUIRE(starts.record(id, child).ok());
  CHECK(starts.holder("10.217.0.5") == id);
  REQUIRE(starts.record(std::string(64, 'f'), child).ok());
  CHECK(starts.holder("10.217.0.5").empty());
  // The forwarder's own namespace is never recorded as a container's.
  auto own = starts.record(std::string(64, 'e'), ::getpid());
  REQUIRE(own.ok());
  CHECK(*own == 0);
  CHECK_FALSE(starts.record("xyz", child).ok());
  // In a container's cgroup scope, the pid can be recorded only for that container.
  const std::string other(64, '1');
  std::string cg = "/sys/fs/cgroup/unified/fy17-starts-" + std::to_string(::getpid());
  std::string scope = cg + "/libpod-" + other + ".scope";
  bool cg_made = ::mkdir(cg.c_str(), 0755) == 0 && ::mkdir(scope.c_str(), 0755) == 0;
  if (cg_made) {
    std::ofstream(scope + "/cgroup.procs") << child << "\n";
    fy::fwd::Starts s2;
    auto refused = s2.record(id, child);
    CHECK_FALSE(refused.ok());
    if (!refused.ok()) CHECK(refused.error().message.find("cgroup of container 111111111111") !=
                             std::string::npos);
    CHECK(s2.record(other, child).ok());
    CHECK(s2.holder("10.217.0.5") == other);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  if (cg_made) {
    ::rmdir(scope.c_str());
    ::rmdir(cg.c_str());
  }
  REQUIRE_MESSAGE(cg_made, "cannot make a cgroup under /sys/fs/cgroup/unified (needs root and "
                           "cgroup v2 there, docs/machine.md)");
  // Gone with its namespace: the address is no longer named.
  CHECK(starts.holder("10.217.0.5").empty());
  CHECK(starts.size() == 0);
  CHECK_FALSE(starts.record(id, child).ok());
}

// The bridge directory watch (forwarder/dirwatch.h) with a real loop and real
// directories. The first part is the call sequence that aborted the forwarder
// in a slow guest (uv__finish_close: !(handle->flags & UV_HANDLE_CLOSED)):
// the directory is missing at start, and the poll timer's re-arm ran in the
// same loop turn as the failed first arm, re-initialising a handle whose
// close was still pending.
namespace {
void run_turns(uv_loop_t* loop, int n) {
  for (int i = 0; i < n; ++i) uv_run(loop, UV_RUN_NOWAIT);
}
bool run_until(uv_loop_t* loop, const std::function<bool()>& done) {
  for (int i = 0; i < 200 && !done(); ++i) {
    uv_run(loop, UV_RUN_NOWAIT);
    usleep(5000);
  }
  return done();
}
}  // namespace

TEST_CASE("the bridge directory watch: missing, created late, removed, re-created, renamed") {
  char tmpl[] = "/tmp/fyfwdabort-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string root = tmpl;
  const std::string dir = root + "/run-user";
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    int events = 0;
    fy::fwd::DirWatch w(&loop, [&] { ++events; });

    // Missing: arm fails, twice in one turn, and again after a turn.
    CHECK_FALSE(w.arm(dir));
    CHECK_FALSE(w.arm(dir));
    CHECK_FALSE(w.armed());
    run_turns(&loop, 1);
    CHECK_FALSE(w.arm(dir));

    // Created late: armed; a file made in it is an event.
    REQUIRE(mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(w.arm(dir));
    std::ofstream(dir + "/ns").put('x');
    CHECK(run_until(&loop, [&] { return events > 0; }));

    // Removed: the watch drops itself (libuv says UV_RENAME, status 0).
    REQUIRE(unlink((dir + "/ns").c_str()) == 0);
    REQUIRE(rmdir(dir.c_str()) == 0);
    CHECK(run_until(&loop, [&] { return !w.armed(); }));
    CHECK(w.drops() >= 1);

    // Re-created: re-armed, events flow again.
    REQUIRE(mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(w.arm(dir));
    events = 0;
    std::ofstream(dir + "/ns2").put('x');
    CHECK(run_until(&loop, [&] { return events > 0; }));

    // Renamed away (and another directory put at the path): dropped.
    REQUIRE(rename(dir.c_str(), (root + "/gone").c_str()) == 0);
    REQUIRE(mkdir(dir.c_str(), 0755) == 0);
    CHECK(run_until(&loop, [&] { return !w.armed(); }));

    // Re-arm and drop in one turn, repeatedly, then once more armed at the end.
    for (int i = 0; i < 5; ++i) {
      CHECK(w.arm(dir));
      w.drop();
    }
    CHECK(w.arm(dir));
  }  // the destructor drops the last watch
  run_turns(&loop, 2);
  CHECK(uv_loop_close(&loop) == 0);
  std::string cmd = "rm -rf " + root;
  CHECK(std::system(cmd.c_str()) == 0);
}

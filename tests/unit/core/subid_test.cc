// core/subid: the reader of /etc/subuid and /etc/subgid, held to shadow 4.13's
// reading (core/subid.h). tests/wall/test_subid.py holds it to the real
// newuidmap and newgidmap.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdlib>
#include <random>
#include <string>

#include "core/subid.h"

using namespace fy::subid;

namespace {

const Owner kAlice{"alice", 1000};

// The passwd database of the tests: alice and alice2 share uid 1000.
std::optional<uint32_t> fake_passwd(const std::string& login) {
  if (login == "alice" || login == "alice2") return 1000u;
  if (login == "bob") return 1001u;
  return std::nullopt;
}

std::vector<Range> ranges_of(std::string_view text) {
  auto r = parse(text, kAlice, fake_passwd, "/etc/subuid");
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  return r->ranges;
}

// glibc's strtoul, as shadow's getulong uses it.
std::optional<uint64_t> libc_getulong(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  unsigned long v = strtoul(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<uint64_t>(v);
}

}  // namespace

TEST_CASE("subid: shadow_getulong reads as strtoul(s, &end, 0) does") {
  for (const char* s : {"0",
                        "100000",
                        "0x186a0",
                        "0X186A0",
                        "0400",
                        "08",
                        "0x",
                        "0xg",
                        " 12",
                        "\t12",
                        "12 ",
                        "+5",
                        "-1",
                        "-0",
                        "--1",
                        "+-1",
                        "",
                        " ",
                        "18446744073709551615",
                        "18446744073709551616",
                        "-18446744073709551615",
                        "-18446744073709551616",
                        "0xffffffffffffffff",
                        "0x10000000000000000",
                        "01777777777777777777777",
                        "02000000000000000000000",
                        "1e3",
                        "\v\f\r\n7",
                        "0x0",
                        "00",
                        "0b1",
                        "4294967295"}) {
    CAPTURE(s);
    CHECK(shadow_getulong(s) == libc_getulong(s));
  }
  // And at random, over the characters that matter.
  std::mt19937 rng(4242);
  const std::string alphabet = "0123456789abcdefxX+- \t\r";
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    for (size_t n = rng() % 24; n > 0; --n) s += alphabet[rng() % alphabet.size()];
    CAPTURE(s);
    REQUIRE(shadow_getulong(s) == libc_getulong(s));
  }
}

TEST_CASE("subid: every line keyed to the owner counts, by name, uid or a shared uid's name") {
  CHECK(ranges_of("alice:100000:65536\nalice:300000:65536\n") ==
        std::vector<Range>{{100000, 165535}, {300000, 365535}});
  CHECK(ranges_of("alice:100000:65536\n1000:300000:10\n") ==
        std::vector<Range>{{100000, 165535}, {300000, 300009}});
  // Another login name with the same uid (shadow's second pass, getpwnam).
  CHECK(ranges_of("alice2:500000:5\n") == std::vector<Range>{{500000, 500004}});
  // Others' lines, and a uid written otherwise than "%lu", are not alice's.
  CHECK(ranges_of("bob:100000:5\n1001:200000:5\n01000:300000:5\n 1000:400000:5\n").empty());
  // Overlapping and adjacent lines merge; duplicates are one range.
  CHECK(ranges_of("alice:10:10\nalice:20:5\nalice:12:3\nalice:10:10\n") ==
        std::vector<Range>{{10, 24}});
  auto r = parse("alice:10:10\nalice:20:5\n", kAlice, fake_passwd, "f");
  REQUIRE(r.ok());
  CHECK(r->grants.size() == 2);
  CHECK(r->grants[1].line == 2);
  // Without a lookup only the name and the uid match.
  CHECK(parse("alice2:5:5\n", kAlice, nullptr, "f")->ranges.empty());
}

TEST_CASE("subid: a zero COUNT grants nothing and does not hide later lines") {
  CHECK(ranges_of("alice:100000:0\nalice:300000:65536\n") == std::vector<Range>{{300000, 365535}});
  auto r = parse("alice:100000:0\n", kAlice, fake_passwd, "/etc/subuid");
  REQUIRE(r.ok());
  CHECK(r->ranges.empty());
  REQUIRE(r->ignored.size() == 1);
  CHECK(r->ignored[0].find("/etc/subuid:1:") == 0);
}

TEST_CASE("subid: grants of id 0 are refused, COUNT 0 at START 0 included (every id)") {
  for (const char* text : {"alice:0:5\n", "alice:0:0\n", "x\nalice:1:1\nalice:0x0:0\n",
                           "alice:-1:2\n", "alice:18446744073709551615:3\n"}) {
    CAPTURE(text);
    auto r = parse(text, kAlice, fake_passwd, "/s");
    bool wraps_to_zero = std::string(text).find(":-1:") != std::string::npos ||
                         std::string(text).find("615:3") != std::string::npos;
    if (wraps_to_zero) {
      // START 2^64-1, COUNT 2 or 3: last wraps below START, nothing granted.
      REQUIRE(r.ok());
      CHECK(r->ranges.empty());
      continue;
    }
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("id 0 (root)") != std::string::npos);
    CHECK(r.error().message.find("/s:") == 0);
  }
  CHECK(parse("alice:0:0\n", kAlice, fake_passwd, "/s").error().message.find("every id") !=
        std::string::npos);
}

TEST_CASE("subid: ranges are cut at the kernel's largest id; wrapped ranges grant nothing") {
  CHECK(ranges_of("alice:4294967290:100\n") == std::vector<Range>{{4294967290, kMaxId}});
  CHECK(ranges_of("alice:4294967295:1\n").empty());
  CHECK(ranges_of("alice:5000000000:1\n").empty());
  // COUNT -1 is 2^64-1: START + COUNT - 1 wraps to START - 2, nothing. COUNT -START
  // ends at 2^64-1: every id from START on.
  CHECK(ranges_of("alice:100000:-1\n").empty());
  CHECK(ranges_of("alice:100000:-100000\n") == std::vector<Range>{{100000, kMaxId}});
  // START + COUNT - 1 wraps past 2^64 to below START.
  CHECK(ranges_of("alice:5:18446744073709551612\n").empty());
  CHECK(granted(7, 0) == std::nullopt);
  CHECK(granted(7, 1) == Range{7, 7});
}

TEST_CASE("subid: lines shadow ignores are ignored; no line is an error") {
  CHECK(ranges_of("# alice:1:1\n\n  \nalice:10:5\r\n+alice:20:5\n-alice:30:5\n").empty());
  CHECK(ranges_of("alice:10\nalice::5\n:10:5\nalice:10:\nalice:x:5\n").empty());
  // Past a third ':' is ignored; numbers in hex, octal, with space and sign.
  CHECK(ranges_of("alice:10:5:junk\n") == std::vector<Range>{{10, 14}});
  CHECK(ranges_of("alice:0x10:0x2\nalice:010:2\nalice: 100:+1\n") ==
        std::vector<Range>{{8, 9}, {16, 17}, {100, 100}});
  // A last line without '\n' counts.
  CHECK(ranges_of("alice:10:5") == std::vector<Range>{{10, 14}});
  // shadow's 1024-byte line buffer.
  std::string pad(1024 - std::string("alice:10:5").size() - 1, ' ');
  CHECK(ranges_of("alice:10:5" + std::string(":") + pad + "\n").empty());
  CHECK(ranges_of("alice:10:5" + std::string(":") + pad.substr(1) + "\n") ==
        std::vector<Range>{{10, 14}});
}

TEST_CASE("subid: keyed_lines lists every line keyed to the owner, granting or not") {
  // By name, by uid, by a shared uid's name; COUNT 0 and an unreadable COUNT
  // (a CRLF line) grant nothing and are listed; others' lines, comments and
  // lines newuidmap does not parse (two fields, NIS, a name alone) are not.
  auto r = parse(
      "bob:1:1\nalice:100000:0\n1000:5:5\r\n#alice:1:1\nalice\nalice:7\n"
      "+alice:1:1\nalice2:300000:10\nalice:200000:5\n",
      kAlice, fake_passwd, "/etc/subuid");
  REQUIRE(r.ok());
  CHECK(r->keyed_lines == std::vector<size_t>{2, 3, 8, 9});
  CHECK(r->grants.size() == 2);
  CHECK(r->ignored.size() == 2);
  CHECK(parse("bob:1:1\n", kAlice, fake_passwd, "/s")->keyed_lines.empty());
}

TEST_CASE("subid: from_texts decides as read() does, over texts") {
  auto r = from_texts(Kind::gid, kAlice, "passwd: files\nsubid: sss\n", "/ns", "alice:10:5\n",
                      "/etc/subgid", fake_passwd);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == fy::Errc::refused);
  CHECK(r.error().message.find("/ns:2: 'subid: sss' — newgidmap asks") == 0);
  r = from_texts(Kind::uid, kAlice, "subid: files\n", "/ns", "alice:10:5\n", "/u", fake_passwd);
  REQUIRE(r.ok());
  CHECK(r->ranges == std::vector<Range>{{10, 14}});
  CHECK(from_texts(Kind::uid, kAlice, "", "/ns", "", "/u", nullptr)->keyed_lines.empty());
}

TEST_CASE("subid: a NUL byte or too many ranges is refused") {
  using namespace std::string_literals;
  auto r = parse("alice:10:5\nbob\0x:1:1\n"s, kAlice, fake_passwd, "/s");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("/s:2:") == 0);
  std::string many;
  for (uint32_t i = 0; i <= kMaxRanges; ++i)
    many += "alice:" + std::to_string(100 + 10 * i) + ":5\n";
  r = parse(many, kAlice, fake_passwd, "/s");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("merge them") != std::string::npos);
}

TEST_CASE("subid: merged and uncovered") {
  CHECK(merged({{5, 9}, {1, 2}, {3, 4}, {20, 30}, {25, 26}}) ==
        std::vector<Range>{{1, 9}, {20, 30}});
  CHECK(merged({{kMaxId, kMaxId}, {0, kMaxId}}) == std::vector<Range>{{0, kMaxId}});
  CHECK(uncovered({{100, 200}, {300, 400}}, {{100, 200}}) == std::vector<Range>{{300, 400}});
  CHECK(uncovered({{100, 200}}, {{120, 130}, {150, 150}}) ==
        std::vector<Range>{{100, 119}, {131, 149}, {151, 200}});
  CHECK(uncovered({{100, 200}}, {{0, kMaxId}}).empty());
  CHECK(uncovered({{kMaxId - 1, kMaxId}}, {{kMaxId, kMaxId}}) ==
        std::vector<Range>{{kMaxId - 1, kMaxId - 1}});
  CHECK(format_ranges({{4242, 4242}, {100000, 165535}}) == "4242, 100000-165535");
}

TEST_CASE("subid: nsswitch.conf's subid line, as shadow's nss_init reads it") {
  CHECK(parse_nsswitch("passwd: files\n").files);
  CHECK(parse_nsswitch("").files);
  Source s = parse_nsswitch("passwd: files\nsubid: sss\n");
  CHECK_FALSE(s.files);
  CHECK(s.module == "sss");
  CHECK(s.line == 2);
  CHECK(parse_nsswitch("SUBID:\tfiles sss\n").files);         // any case; the first word decides
  CHECK(parse_nsswitch("subid: files\nsubid: sss\n").files);  // the first deciding line
  CHECK(parse_nsswitch("#subid: sss\n").files);
  CHECK(parse_nsswitch(" subid: sss\n").files);  // not at the line's start
  CHECK(parse_nsswitch("subid:\n").files);       // shorter than 8 bytes
  s = parse_nsswitch("subid: \nsubid: ldap\n");  // no word: the next line decides
  CHECK_FALSE(s.files);
  CHECK(s.module == "ldap");
  CHECK(parse_nsswitch("subid: " + std::string(51, 'm') + "\n").files);  // too long: files
  s = parse_nsswitch("subid:sss");                                       // 9 bytes, no newline
  CHECK_FALSE(s.files);
  s = parse_nsswitch("subid: files\r\n");  // "files\r" is not "files"
  CHECK_FALSE(s.files);
  CHECK(s.module == "files\r");
}

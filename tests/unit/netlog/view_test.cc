// fy-netlog's views (proxy/netlog/view.h): terminal-safe text, display
// widths, cutting to a width, and every view line within the width whatever
// the log holds.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <fstream>
#include <random>
#include <sstream>

#include "core/clock.h"
#include "proxy/netlog/error_kind.h"
#include "proxy/netlog/view.h"
#include "tests/unit/netlog/helpers.h"

using namespace fy;
using namespace fy::netlog;
using namespace fy::netlog::test;

namespace {

bool has_raw_controls(std::string_view s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n') || c == 0x7F) return true;
  // C1 controls and bidi overrides, UTF-8 encoded.
  return s.find("\xc2\x9b") != std::string_view::npos ||
         s.find("\xe2\x80\xae") != std::string_view::npos ||
         s.find("\xe2\x80\x8b") != std::string_view::npos;
}

void check_width(const std::string& text, size_t width) {
  for (const std::string& l : lines_of(text)) {
    INFO(l);
    CHECK(display_width(l) <= width);
  }
}

}  // namespace

TEST_CASE("sanitize shows controls, bidi and invisible characters as escapes") {
  CHECK(sanitize("plain /path?q=1") == "plain /path?q=1");
  CHECK(sanitize("\x1b[31mred") == "\\x1b[31mred");
  CHECK(sanitize("a\nb\tc\rd\x7f") == "a\\x0ab\\x09c\\x0dd\\x7f");
  CHECK(sanitize("\xc2\x9b"
                 "2J") == "\\x9b2J");                                // C1 CSI
  CHECK(sanitize("git\xe2\x80\x8bhub.com") == "git\\u200bhub.com");  // zero width space
  CHECK(sanitize("\xe2\x80\xae"
                 "moc.evil") == "\\u202emoc.evil");  // right-to-left override
  CHECK(sanitize("caf\xc3\xa9 \xe2\x82\xac") == "caf\xc3\xa9 \xe2\x82\xac");
  CHECK(sanitize("\xff\xc3") == "\xef\xbf\xbd\xef\xbf\xbd");
}

TEST_CASE("display width counts columns, not bytes") {
  CHECK(display_width("abc") == 3);
  CHECK(display_width("caf\xc3\xa9") == 4);
  CHECK(display_width("\xe6\x97\xa5\xe6\x9c\xac") == 4);  // two CJK ideographs
  CHECK(display_width("e\xcc\x81") == 1);                 // e + combining acute
  CHECK(display_width("\xf0\x9f\x98\x80") == 2);          // emoji
  CHECK(display_width("…") == 1);
}

TEST_CASE("fit_end and fit_middle cut to the width and say so") {
  CHECK(fit_end("short", 10) == "short");
  CHECK(fit_end("abcdefghij", 5) == "abcd…");
  CHECK(fit_middle("abcdefghijklmnopqrstuvwxyz", 10) == "abc…uvwxyz");
  CHECK(fit_middle("very-long-subdomain.build-cache.internal.example.com:8443", 30) ==
        "very-long…nal.example.com:8443");
  // Wide characters are never split across the limit.
  std::string cjk;
  for (int i = 0; i < 10; ++i) cjk += "\xe6\x97\xa5";
  CHECK(display_width(fit_end(cjk, 7)) <= 7);
  CHECK(display_width(fit_middle(cjk, 7)) <= 7);
  std::mt19937 rng(7);
  for (int n = 0; n < 2000; ++n) {
    std::string s(rng() % 80, ' ');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    s = sanitize(s);
    size_t w = rng() % 40;
    CHECK(display_width(fit_end(s, w)) <= w);
    CHECK(display_width(fit_middle(s, w)) <= w);
  }
}

TEST_CASE("human units") {
  CHECK(human_bytes(0) == "0B");
  CHECK(human_bytes(1023) == "1023B");
  CHECK(human_bytes(1024) == "1.0K");
  CHECK(human_bytes(1536) == "1.5K");
  CHECK(human_bytes(45 * 1024 * 1024 + 300 * 1024) == "45M");
  CHECK(human_bytes(1024ull * 1024 * 1024 - 1) == "1.0G");
  CHECK(human_bytes(UINT64_MAX) == "16E");
  CHECK(compact_count(123456, 6) == "123456");
  CHECK(compact_count(1234567, 6) == "1.2M");
  CHECK(compact_count(UINT64_MAX, 6) == "18E");
  CHECK(format_age(1000, 1000) == "now");
  CHECK(format_age(0, 42000) == "42s ago");
  CHECK(format_age(0, 5 * 60000) == "5m ago");
  CHECK(format_age(0, 3 * 3600000) == "3h ago");
  CHECK(format_age(0, 12 * 86400000LL) == "12d ago");
}

TEST_CASE("who made a row") {
  Row r = make_row(1);
  CHECK(who_of(r) == "-");
  r.attribution = Attribution::unattributed;
  CHECK(who_of(r) == "unattributed");
  r.attribution = Attribution::attributed;
  r.src = "10.89.1.2";
  r.net = "podman1";
  r.who = "container:" + std::string(64, 'b');
  CHECK(who_of(r) == "ctr:bbbbbbbbbbbb podman1 10.89.1.2");
  r.who = "build:ci";
  CHECK(who_of(r) == "build:ci podman1 10.89.1.2");
}

TEST_CASE("every view line fits the width, whatever the log holds") {
  const int64_t now = *parse_iso8601("2026-11-29T21:30:00Z");
  std::vector<Row> rows;
  std::mt19937 rng(11);
  const std::string pieces[] = {"\x1b[2J",
                                "\xe2\x80\xae",
                                "\xe6\x97\xa5\xe6\x9c\xac",
                                "e\xcc\x81",
                                "\xf0\x9f\x98\x80",
                                "\t",
                                "\xc2\x9b",
                                "\"",
                                "x",
                                "-"};
  for (int i = 0; i < 300; ++i) {
    Row r = make_row(static_cast<uint64_t>(i), now - static_cast<int64_t>(rng() % 400000000));
    auto junk = [&](size_t n) {
      std::string s;
      for (size_t k = 0; k < n; ++k) s += pieces[rng() % std::size(pieces)];
      return s;
    };
    r.host = i % 3 ? junk(rng() % 120) + ".example.com:8443" : "h" + std::to_string(i) + ".example";
    r.path = "/" + junk(rng() % 200);
    r.method = i % 5 ? "GET" : junk(12);
    r.status = static_cast<int>(rng() % 1000);
    r.blocked = i % 4 == 0;
    r.would_block = i % 4 == 1;
    r.injected = i % 2;
    r.replayed = i % 3;
    r.build = i % 7 == 0;
    r.held = i % 11 ? "" : junk(30);
    r.error = i % 6 ? "" : junk(3) + ": " + junk(40);
    r.mint_failed = r.overlap = r.passthrough = i % 13 == 0;
    r.attribution = static_cast<Attribution>(i % 3);
    r.src = junk(20);
    r.net = junk(20);
    r.who = "container:" + junk(40);
    r.bytes_up = rng();
    r.bytes_down = uint64_t(rng()) << 30;
    rows.push_back(r);
  }
  for (int width : {64, 80, 132, 200}) {
    INFO("width " << width);
    ViewOptions o{width, now, /*utc=*/true};
    Summary s;
    Grants g;
    RowPrinter rp(RowPrinter::Kind::rows, o), fp(RowPrinter::Kind::refusals, o);
    std::string row_text, ref_text;
    for (const Row& r : rows) {
      s.add(r);
      g.add(r);
      row_text += rp.line(r);
      if (is_refusal(r)) ref_text += fp.line(r);
    }
    std::string sum = render_summary(s.hosts(), s.total(), o);
    check_width(sum, static_cast<size_t>(width));
    check_width(row_text, static_cast<size_t>(width));
    check_width(ref_text, static_cast<size_t>(width));
    CHECK(!has_raw_controls(sum));
    CHECK(!has_raw_controls(row_text));
    CHECK(!has_raw_controls(ref_text));
    std::string grants = g.render(o);
    CHECK(!has_raw_controls(grants));
    // Grant lines: a command is whole or absent (a key that is not a host).
    for (const std::string& l : lines_of(grants)) {
      if (l.find("fy allow add ") == std::string::npos) {
        check_width(l, static_cast<size_t>(width));
        continue;
      }
      std::string cmd = l.substr(l.find("fy allow add "));
      cmd = cmd.substr(0, cmd.find("  #"));
      std::string key = cmd.substr(13, cmd.find(' ', 13) - 13);
      CHECK(is_grantable_key(key));
      CHECK((display_width(l) <= static_cast<size_t>(width) || l == "  " + cmd));
    }
  }
}

TEST_CASE("the summary table and its JSON agree") {
  const int64_t now = *parse_iso8601("2026-11-29T21:30:00Z");
  Summary s;
  Row a = make_row(1, now - 60000);
  a.bytes_up = 2048;
  a.bytes_down = 3 * 1024 * 1024;
  s.add(a);
  Row b = make_row(2, now - 7200000);
  b.host = "github.com:22";
  b.method = "CONNECT";
  b.status = 403;
  b.blocked = true;
  s.add(b);
  ViewOptions o{80, now, true};
  std::string text = render_summary(s.hosts(), s.total(), o);
  auto lines = lines_of(text);
  REQUIRE(lines.size() >= 3);
  CHECK(lines[0].rfind("HOST", 0) == 0);
  CHECK(display_width(lines[0]) == 80);
  CHECK(lines[1].rfind("api.example.com ", 0) == 0);
  CHECK(lines[1].find("2.0K") != std::string::npos);
  CHECK(lines[1].find("3.0M") != std::string::npos);
  CHECK(lines[1].find("1m ago") != std::string::npos);
  CHECK(lines[2].rfind("github.com:22 ", 0) == 0);
  CHECK(lines[2].find("2h ago") != std::string::npos);
  CHECK(text.find("1 blocked, 0 would-block") != std::string::npos);

  ReadStats st;
  st.rows = 2;
  auto j = nlohmann::json::parse(summary_json(s.hosts(), s.total(), st, "/x/egress.jsonl"));
  CHECK(j["log"] == "/x/egress.jsonl");
  CHECK(j["total"]["requests"] == 2);
  CHECK(j["total"]["blocked"] == 1);
  REQUIRE(j["hosts"].size() == 2);
  CHECK(j["hosts"][0]["host"] == "api.example.com");
  CHECK(j["hosts"][0]["bytes_down"] == 3 * 1024 * 1024);
  CHECK(j["hosts"][0]["last_seen"] == "2026-11-29T21:29:00.000Z");
  CHECK(j["hosts"][1]["blocked"] == 1);
}

TEST_CASE("error kinds: docs/netlog.md lists the table's kinds, in its order, with its meanings") {
  std::ifstream f(std::string(FY_SOURCE_ROOT) + "/docs/netlog.md");
  REQUIRE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  size_t at = doc.find("### Error kinds");
  REQUIRE(at != std::string::npos);
  size_t head = doc.find("| kind | means |", at);
  REQUIRE(head != std::string::npos);
  std::istringstream lines(doc.substr(head));
  std::string line;
  std::getline(lines, line);  // | kind | means |
  std::getline(lines, line);  // |---|---|
  for (const ErrorKindRow& r : kErrorKinds) {
    REQUIRE(std::getline(lines, line));
    CHECK(line == fmt::format("| `{}` | {} |", r.name, r.means));
  }
  REQUIRE(std::getline(lines, line));
  CHECK(line.empty());  // no kind on the page that the table lacks
}

TEST_CASE("error kinds: names, Errc mapping, text and parsing") {
  CHECK(error_kind_name(ErrorKind::tls_verify) == "tls_verify");
  CHECK(error_kind_of(Errc::parse) == ErrorKind::protocol);
  CHECK(error_kind_of(Errc::dns) == ErrorKind::dns);
  CHECK(error_kind_of(Errc::permission) == ErrorKind::io);
  CHECK(error_text(ErrorKind::timeout, "the response stalled") == "timeout: the response stalled");
  for (const ErrorKindRow& r : kErrorKinds) {
    CHECK(parse_error_kind(error_text(r.kind, "x")) == r.kind);
    CHECK(parse_error_kind("client: " + error_text(r.kind, "x")) == r.kind);
  }
  CHECK_FALSE(parse_error_kind("client: the request head did not arrive in time"));
  CHECK_FALSE(parse_error_kind("dnsx: y"));
  CHECK_FALSE(parse_error_kind(""));
}

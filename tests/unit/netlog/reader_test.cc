// The Network Log reader (proxy/netlog/reader.h): parsing a row and refusing
// what is not one, the log's files in rotation order, line splitting at any
// chunk boundary, following across rotations with the real writer, filters
// and the summary.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <time.h>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "proxy/netlog/reader.h"
#include "proxy/netlog/writer.h"
#include "tests/unit/netlog/helpers.h"

using namespace fy;
using namespace fy::netlog;
using namespace fy::netlog::test;

namespace {

std::string line_of(const Row& r) {
  std::string l;
  append_json(l, r);
  l.pop_back();
  return l;
}

// Every field set, so a round trip checks each one.
Row full_row() {
  Row r = make_row(42);
  r.ts_ms = 1796074200123;
  r.injected = true;
  r.replayed = true;
  r.ua = "gh/2.60";
  r.status = 401;
  r.error_body = "bad credentials";
  r.passthrough = true;
  r.blocked = true;
  r.would_block = true;
  r.build = true;
  r.mint_failed = true;
  r.overlap = true;
  r.held = "github";
  r.rule = "tracker";
  r.sni = "api.example.com";
  r.duration_ms = 1234;
  r.error = "tls_verify: unable to get local issuer certificate";
  r.attribution = Attribution::attributed;
  r.src = "10.89.1.2";
  r.net = "podman1";
  r.who = "container:" + std::string(64, 'a');
  r.seq = 9;
  r.boot = "6f1c";
  return r;
}

// Collects rows read, by conn id.
struct Collect {
  std::vector<uint64_t> conns;
  RowFn fn() {
    return [this](const Row& r, std::string_view) { conns.push_back(r.conn); };
  }
};

std::vector<uint64_t> range(uint64_t a, uint64_t b) {
  std::vector<uint64_t> v;
  for (uint64_t i = a; i <= b; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("a row written by the writer reads back field for field") {
  Row w = full_row();
  auto r = parse_row(line_of(w));
  REQUIRE(r.ok());
  CHECK(r->ts_ms == w.ts_ms);
  CHECK(r->conn == w.conn);
  CHECK(r->peer == w.peer);
  CHECK(r->method == w.method);
  CHECK(r->host == w.host);
  CHECK(r->path == w.path);
  CHECK(r->status == w.status);
  CHECK(r->injected);
  CHECK(r->replayed);
  CHECK(r->ua == w.ua);
  CHECK(r->error_body == w.error_body);
  CHECK(r->passthrough);
  CHECK(r->blocked);
  CHECK(r->would_block);
  CHECK(r->build);
  CHECK(r->mint_failed);
  CHECK(r->overlap);
  CHECK(r->held == w.held);
  CHECK(r->rule == w.rule);
  CHECK(r->tls == w.tls);
  CHECK(r->sni == w.sni);
  CHECK(r->bytes_up == w.bytes_up);
  CHECK(r->bytes_down == w.bytes_down);
  CHECK(r->duration_ms == w.duration_ms);
  CHECK(r->error == w.error);
  CHECK(r->attribution == Attribution::attributed);
  CHECK(r->src == w.src);
  CHECK(r->net == w.net);
  CHECK(r->who == w.who);
  CHECK(r->seq == w.seq);
  CHECK(r->boot == w.boot);

  Row u = make_row(1);
  u.attribution = Attribution::unattributed;
  auto ru = parse_row(line_of(u));
  REQUIRE(ru.ok());
  CHECK(ru->attribution == Attribution::unattributed);
  auto rn = parse_row(line_of(make_row(1)));
  REQUIRE(rn.ok());
  CHECK(rn->attribution == Attribution::none);
  CHECK(rn->duration_ms == 12);
}

TEST_CASE("the reference's rows read too: seconds, an empty method, no additions") {
  auto r = parse_row(
      R"({"ts": "2026-09-22T10:01:00+00:00", "method": "", "host": "github.com:22", "path": "", )"
      R"("status": 403, "injected": false, "replayed": false, "blocked": true})");
  REQUIRE(r.ok());
  CHECK(r->ts_ms == *parse_iso8601("2026-09-22T10:01:00Z"));
  CHECK(r->host == "github.com:22");
  CHECK(r->blocked);
  CHECK(r->bytes_up == 0);
  CHECK(r->duration_ms == -1);
  // A CRLF line and unknown fields are fine.
  CHECK(parse_row("{\"ts\":\"2026-09-22T10:01:00Z\",\"host\":\"h\",\"status\":0,\"new\":[1]}\r")
            .ok());
}

TEST_CASE("what is not a row is refused with a reason, never thrown") {
  const char* ok = R"({"ts":"2026-11-29T21:30:00.123+00:00","host":"h","status":200)";
  struct Case {
    std::string line;
    const char* reason;
  };
  const Case cases[] = {
      {"", "not JSON"},
      {"garbage", "not JSON"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h","sta)", "not JSON"},  // torn
      {"[1,2]", "not a JSON object"},
      {"42", "not a JSON object"},
      {R"({"host":"h","status":200})", "no `ts`"},
      {R"({"ts":"2026-11-29T21:30:00Z","status":200})", "no `host`"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h"})", "no `status`"},
      {R"({"ts":1796074200,"host":"h","status":200})", "`ts` is not a string"},
      {R"({"ts":"yesterday","host":"h","status":200})", "`ts` is not an ISO"},
      {R"({"ts":"2026-11-29T21:30:00","host":"h","status":200})", "`ts` is not an ISO"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"","status":200})", "`host` is not"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":7,"status":200})", "`host` is not"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h","status":"200"})", "`status` is not"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h","status":200.5})", "`status` is not"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h","status":-1})", "`status` is not"},
      {R"({"ts":"2026-11-29T21:30:00Z","host":"h","status":1000})", "`status` is not"},
      {std::string(ok) + R"(,"blocked":"yes"})", "`blocked` is not true or false"},
      {std::string(ok) + R"(,"bytes_up":-5})", "`bytes_up` is not a non-negative"},
      {std::string(ok) + R"(,"bytes_down":1e3})", "`bytes_down` is not a non-negative"},
      {std::string(ok) + R"(,"bytes_up":18446744073709551616})", "`bytes_up` is not"},
      {std::string(ok) + R"(,"duration_ms":9223372036854775808})", "`duration_ms` is not"},
      {std::string(ok) + R"(,"path":null})", "`path` is not a string"},
      {std::string(ok) + R"(,"who":{"a":1}})", "`who` is not a string"},
      {std::string(ok) + ",\"ua\":\"\xff\"}", "not JSON"},  // invalid UTF-8
      {std::string(ok) + ",\"x\":" + std::string(100, '[') + std::string(100, ']') + "}",
       "nested deeper"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    Result<Row> r = Error{};
    CHECK_NOTHROW(r = parse_row(c.line));
    REQUIRE(!r.ok());
    CHECK(r.error().message.find(c.reason) != std::string::npos);
  }
  CHECK(parse_row(std::string(ok) + "}").ok());
}

TEST_CASE("dated backup names and their order") {
  auto k = parse_backup_name("egress.20261129T213000Z.jsonl", "egress.jsonl");
  REQUIRE(k);
  CHECK(k->stamp == "20261129T213000Z");
  CHECK(k->n == 0);
  k = parse_backup_name("egress.20261129T213000Z-12.jsonl", "egress.jsonl");
  REQUIRE(k);
  CHECK(k->n == 12);
  for (const char* bad : {"egress.jsonl", "egress.20261129T213000.jsonl", "egress.2026.jsonl",
                          "egress.20261129T213000Z-.jsonl", "egress.20261129T213000Z-x.jsonl",
                          "egress.20261129T213000Z.jsonl.gz", "other.20261129T213000Z.jsonl",
                          "egress.20261129t213000Z.jsonl", "egress.20261129T213000Zjsonl"})
    CHECK_MESSAGE(!parse_backup_name(bad, "egress.jsonl"), std::string(bad));
  // Rotation order: stamp, then suffix, numerically.
  auto key = [](const char* n) { return *parse_backup_name(n, "egress.jsonl"); };
  CHECK(key("egress.20261129T213000Z.jsonl") < key("egress.20261129T213000Z-1.jsonl"));
  CHECK(key("egress.20261129T213000Z-2.jsonl") < key("egress.20261129T213000Z-10.jsonl"));
  CHECK(key("egress.20261129T213000Z-10.jsonl") < key("egress.20261129T213001Z.jsonl"));
}

TEST_CASE("the log's files: backups oldest first, then the current file; others ignored") {
  TempDir dir;
  const std::string p = dir.path + "/egress.jsonl";
  for (const char* n :
       {"egress.20261129T213001Z.jsonl", "egress.20261129T213000Z-10.jsonl",
        "egress.20261129T213000Z.jsonl", "egress.20261129T213000Z-2.jsonl", "egress.jsonl.bak",
        "egress.old.jsonl", "other.20261129T213000Z.jsonl", "egress.20261128T000000Z.jsonl"})
    spit(dir.path + "/" + n, "");
  ::mkdir((dir.path + "/egress.20261127T000000Z.jsonl").c_str(), 0700);  // not a file
  auto files = list_log_files(p);
  REQUIRE(files.ok());
  std::vector<std::string> names;
  for (const auto& f : *files) names.push_back(f.path.substr(dir.path.size() + 1));
  CHECK(names == std::vector<std::string>{
                     "egress.20261128T000000Z.jsonl", "egress.20261129T213000Z.jsonl",
                     "egress.20261129T213000Z-2.jsonl", "egress.20261129T213000Z-10.jsonl",
                     "egress.20261129T213001Z.jsonl"});
  spit(p, "");
  files = list_log_files(p);
  REQUIRE(files.ok());
  CHECK(files->back().current);
  CHECK(files->back().path == p);

  auto none = list_log_files(dir.path + "/sub/egress.jsonl");
  REQUIRE(!none.ok());
  CHECK(none.error().code == Errc::not_found);
  TempDir empty;
  none = list_log_files(empty.path + "/egress.jsonl");
  REQUIRE(!none.ok());
  CHECK(none.error().code == Errc::not_found);

  CHECK(resolve_log_path(dir.path) == p);
  CHECK(resolve_log_path(dir.path + "/") == p);
  CHECK(resolve_log_path(p) == p);
  CHECK(resolve_log_path(dir.path + "/x.jsonl") == dir.path + "/x.jsonl");
}

TEST_CASE("the default path follows XDG_STATE_HOME, else ~/.local/state") {
  std::string old_xdg = getenv("XDG_STATE_HOME") ? getenv("XDG_STATE_HOME") : "";
  std::string old_home = getenv("HOME") ? getenv("HOME") : "";
  setenv("XDG_STATE_HOME", "/srv/state", 1);
  CHECK(default_log_path() == "/srv/state/foldyard/egress/logs/egress.jsonl");
  unsetenv("XDG_STATE_HOME");
  setenv("HOME", "/home/op", 1);
  CHECK(default_log_path() == "/home/op/.local/state/foldyard/egress/logs/egress.jsonl");
  setenv("XDG_STATE_HOME", "relative", 1);  // not absolute: ignored, as the spec says
  CHECK(default_log_path() == "/home/op/.local/state/foldyard/egress/logs/egress.jsonl");
  if (old_xdg.empty())
    unsetenv("XDG_STATE_HOME");
  else
    setenv("XDG_STATE_HOME", old_xdg.c_str(), 1);
  setenv("HOME", old_home.c_str(), 1);
}

TEST_CASE("lines split the same at any chunk boundary; bad ones are counted, not fatal") {
  std::string data;
  for (uint64_t i = 1; i <= 5; ++i) data += line_of(make_row(i)) + "\n";
  data += "not json\n";
  data += "\n   \n";  // blank: not a row, not bad
  data += R"({"ts":"2026-11-29T21:30:00Z","host":"h","status":"x"})"
          "\n";
  data += line_of(make_row(6)) + "\r\n";
  data += std::string(kMaxLine + 10, 'x') + "\n";  // overlong
  data += line_of(make_row(7)) + "\n";
  data += line_of(make_row(8)).substr(0, 40);  // torn
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, data.size()}) {
    INFO("chunk " << chunk);
    ReadStats st;
    Collect c;
    std::vector<std::string> raw;
    LineParser p("f");
    auto fn = [&](const Row& r, std::string_view l) {
      c.conns.push_back(r.conn);
      raw.emplace_back(l);
    };
    for (size_t off = 0; off < data.size(); off += chunk)
      p.feed(std::string_view(data).substr(off, chunk), st, fn);
    CHECK(p.has_partial());
    p.finish(st);
    CHECK(c.conns == range(1, 7));
    CHECK(st.rows == 7);
    CHECK(st.bad_lines == 4);
    CHECK(st.first_bad.rfind("f:6: not JSON", 0) == 0);
    CHECK(raw[5] == line_of(make_row(6)));  // the '\r' is not part of the row
  }
}

TEST_CASE("read_log reads backups in rotation order, then the current file") {
  TempDir dir;
  const std::string p = dir.path + "/egress.jsonl";
  std::string a, b, c;
  for (uint64_t i = 1; i <= 3; ++i) a += line_of(make_row(i)) + "\n";
  for (uint64_t i = 4; i <= 6; ++i) b += line_of(make_row(i)) + "\n";
  for (uint64_t i = 7; i <= 9; ++i) c += line_of(make_row(i)) + "\n";
  spit(dir.path + "/egress.20261129T213000Z-9.jsonl", a);
  spit(dir.path + "/egress.20261129T213000Z-10.jsonl", b);
  spit(p, c + "{\"torn");
  ReadStats st;
  Collect col;
  REQUIRE(read_log(p, st, col.fn()).ok());
  CHECK(col.conns == range(1, 9));
  CHECK(st.bad_lines == 1);
  CHECK(st.files.size() == 3);
  CHECK(st.first_bad.find("egress.jsonl:4: torn line") != std::string::npos);

  ReadStats none;
  auto r = read_log(dir.path + "/nothing/egress.jsonl", none, col.fn());
  REQUIRE(!r.ok());
  CHECK(r.error().code == Errc::not_found);
}

TEST_CASE("following the real writer across rotations reads every row once, in order") {
  TempDir dir;
  const std::string p = dir.path + "/logs/egress.jsonl";
  Writer w({p, 1500, 5});
  Follower f(p);
  ReadStats st;
  Collect col;

  // Nothing yet: not_found, and polling again is fine.
  auto r0 = f.poll(st, col.fn());
  REQUIRE(!r0.ok());
  CHECK(r0.error().code == Errc::not_found);

  uint64_t id = 0;
  auto write = [&](int rows, int per_flush) {
    for (int i = 0; i < rows; ++i) {
      w.append(make_row(++id));
      if ((i + 1) % per_flush == 0) w.flush();
    }
    w.flush();
  };
  write(3, 3);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, 3));

  // No rotation between polls.
  write(2, 1);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, 5));
  REQUIRE(f.poll(st, col.fn()).ok());  // nothing new
  CHECK(col.conns == range(1, 5));

  // One rotation between polls: the end of the old file, then the new one.
  uint64_t rot = w.stats().rotations;
  write(4, 2);
  REQUIRE(w.stats().rotations == rot + 1);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));

  // Three rotations between polls: the backups in between are read too.
  rot = w.stats().rotations;
  write(12, 3);  // a rotation per flush at most: at most 4, fewer than the 5 backups kept
  REQUIRE(w.stats().rotations >= rot + 3);
  REQUIRE(w.stats().rotations <= rot + 5);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));

  // A half-written line waits for its end rather than counting as bad.
  std::string next = line_of(make_row(++id)) + "\n";
  spit(p, next.substr(0, 30), /*append=*/true);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id - 1));
  spit(p, next.substr(30), /*append=*/true);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));
  CHECK(st.bad_lines == 0);

  // The log removed and started afresh (not a rotation): read from its start.
  REQUIRE(::unlink(p.c_str()) == 0);
  REQUIRE(f.poll(st, col.fn()).ok());
  spit(p, line_of(make_row(++id)) + "\n");
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));

  // Truncated in place (shorter than what was read): read again from the start.
  spit(p, line_of(make_row(++id)) + "\n", /*append=*/true);
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));
  spit(p, line_of(make_row(++id)) + "\n");
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, id));
  CHECK(st.bad_lines == 0);
}

TEST_CASE("a follower started on an existing log reads it all first") {
  TempDir dir;
  const std::string p = dir.path + "/egress.jsonl";
  {
    Writer w({p, 800, 5});
    for (uint64_t i = 1; i <= 12; ++i) {
      w.append(make_row(i));
      w.flush();
    }
  }
  Follower f(p);
  ReadStats st;
  Collect col;
  REQUIRE(f.poll(st, col.fn()).ok());
  CHECK(col.conns == range(1, 12));
  CHECK(st.files.size() >= 4);
}

TEST_CASE("host patterns: exact, *.suffix, ports, IPv6") {
  auto m = [](const char* pat, const char* key) {
    auto p = parse_host_pattern(pat);
    REQUIRE_MESSAGE(p.ok(), std::string(pat));
    return host_matches(*p, key);
  };
  CHECK(m("api.github.com", "api.github.com"));
  CHECK(m("API.GitHub.com.", "api.github.com"));
  CHECK(m("api.github.com", "API.GITHUB.COM"));
  CHECK(m("api.github.com", "api.github.com:8443"));  // no port: any port
  CHECK(!m("api.github.com", "github.com"));
  CHECK(!m("github.com", "api.github.com"));
  CHECK(m("*.github.com", "api.github.com"));
  CHECK(m("*.github.com", "a.b.github.com:22"));
  CHECK(!m("*.github.com", "github.com"));
  CHECK(!m("*.github.com", "evilgithub.com"));
  CHECK(m("github.com:22", "github.com:22"));
  CHECK(!m("github.com:22", "github.com"));
  CHECK(m("github.com:443", "github.com"));  // the log omits the default port
  CHECK(!m("github.com:443", "github.com:8443"));
  CHECK(m("[::1]", "[::1]:8080"));
  CHECK(m("[::1]:8080", "[::1]:8080"));
  CHECK(!m("[::1]:8080", "[::1]:8081"));
  CHECK(m("10.0.0.1", "10.0.0.1:80"));
  CHECK(m("*", "anything:1"));
  for (const char* bad : {"", "*.", "a.*.com", "h:0", "h:65536", "h:x", "a/b", "**.x"})
    CHECK_MESSAGE(!parse_host_pattern(bad).ok(), std::string(bad));
}

TEST_CASE("status specs") {
  auto in = [](const char* spec, int status) {
    auto s = parse_status_spec(spec);
    REQUIRE_MESSAGE(s.ok(), std::string(spec));
    Filter f;
    f.statuses = *s;
    Row r = make_row(1);
    r.status = status;
    return f.matches(r);
  };
  CHECK(in("403", 403));
  CHECK(!in("403", 404));
  CHECK(in("4xx", 400));
  CHECK(in("4XX", 499));
  CHECK(!in("4xx", 500));
  CHECK(in(">=500", 500));
  CHECK(!in(">=500", 499));
  CHECK(in(">499", 500));
  CHECK(in("<400", 0));
  CHECK(!in("<400", 400));
  CHECK(in("<=399", 399));
  CHECK(in("200-299", 250));
  CHECK(!in("200-299", 300));
  CHECK(in("0", 0));
  CHECK(in("403, 5xx", 502));
  CHECK(in("403,5xx", 403));
  CHECK(!in("403,5xx", 404));
  for (const char* bad : {"", "abc", "4x", "1000", ">=", ">999", "<0", "300-200", "-1", "40 3"})
    CHECK_MESSAGE(!parse_status_spec(bad).ok(), std::string(bad));
}

TEST_CASE("time specs: durations ago, ISO with an offset, local time without one") {
  const int64_t now = *parse_iso8601("2026-11-29T21:30:00Z");
  CHECK(*parse_time_spec("10m", now) == now - 600000);
  CHECK(*parse_time_spec("90s", now) == now - 90000);
  CHECK(*parse_time_spec("2h", now) == now - 7200000);
  CHECK(*parse_time_spec("3d", now) == now - 3 * 86400000LL);
  CHECK(*parse_time_spec("1w", now) == now - 7 * 86400000LL);
  CHECK(*parse_time_spec("now", now) == now);
  CHECK(*parse_time_spec("2026-11-29T20:00:00Z", now) == now - 5400000);
  CHECK(*parse_time_spec("2026-11-29T21:00:00+01:00", now) == now - 5400000);
  std::string old_tz = getenv("TZ") ? getenv("TZ") : "";
  setenv("TZ", "UTC", 1);
  tzset();
  CHECK(*parse_time_spec("2026-11-29T20:00", now) == now - 5400000);
  CHECK(*parse_time_spec("2026-11-29 20:00:30", now) == now - 5370000);
  CHECK(*parse_time_spec("2026-11-29", now) == now - (21 * 3600 + 1800) * 1000LL);
  setenv("TZ", "Europe/Paris", 1);  // UTC+1 in November
  tzset();
  CHECK(*parse_time_spec("2026-11-29T21:00", now) == now - 5400000);
  if (old_tz.empty())
    unsetenv("TZ");
  else
    setenv("TZ", old_tz.c_str(), 1);
  tzset();
  for (const char* bad :
       {"", "10", "10x", "m", "-5m", "yesterday", "2026-13-01", "2026-11-29T25:00", "2026-11-29T21",
        "2026-11-29T21:00:00.5", "99999999999999999999d"})
    CHECK_MESSAGE(!parse_time_spec(bad, now).ok(), std::string(bad));
}

TEST_CASE("filters combine: host, status, window, refusals") {
  Row r = make_row(1);
  r.ts_ms = 1000000;
  r.host = "github.com:22";
  r.status = 403;
  r.blocked = true;
  Filter f;
  CHECK(f.matches(r));
  f.hosts.push_back(*parse_host_pattern("*.example.com"));
  CHECK(!f.matches(r));
  f.hosts.push_back(*parse_host_pattern("github.com"));
  CHECK(f.matches(r));  // any of the patterns
  f.statuses = *parse_status_spec("4xx");
  CHECK(f.matches(r));
  f.since_ms = 1000000;
  f.until_ms = 1000000;
  CHECK(f.matches(r));  // both ends inclusive
  f.since_ms = 1000001;
  CHECK(!f.matches(r));
  f.since_ms.reset();
  f.until_ms = 999999;
  CHECK(!f.matches(r));
  f.until_ms.reset();
  f.refusals_only = true;
  CHECK(f.matches(r));
  r.blocked = false;
  CHECK(!f.matches(r));
  r.would_block = true;
  CHECK(f.matches(r));
}

TEST_CASE("the summary counts per host, newest first") {
  Summary s;
  auto add = [&](const char* host, int64_t ts, int status, uint64_t up, uint64_t down,
                 auto&& tweak) {
    Row r = make_row(1);
    r.host = host;
    r.ts_ms = ts;
    r.status = status;
    r.bytes_up = up;
    r.bytes_down = down;
    tweak(r);
    s.add(r);
  };
  auto none = [](Row&) {};
  add("a.example", 100, 200, 1, 10, none);
  add("A.EXAMPLE", 300, 502, 2, 20, [](Row& r) { r.error = "dns: NXDOMAIN"; });
  add("a.example", 200, 404, 4, 40, none);
  add("b.example", 400, 403, 0, 0, [](Row& r) { r.blocked = true; });
  add("b.example", 500, 0, 0, 0, [](Row& r) { r.would_block = true; });
  add("c.example", 50, 0, UINT64_MAX, 1, [](Row& r) { r.passthrough = true; });
  add("c.example", 60, 0, 5, 1, [](Row& r) { r.passthrough = true; });

  auto h = s.hosts();
  REQUIRE(h.size() == 3);
  CHECK(h[0].host == "b.example");
  CHECK(h[1].host == "a.example");
  CHECK(h[2].host == "c.example");
  CHECK(h[0].requests == 1);
  CHECK(h[0].blocked == 1);
  CHECK(h[0].would_block == 1);
  CHECK(h[0].errors == 0);  // a refusal is counted as blocked, not as an error
  CHECK(h[0].first_ms == 400);
  CHECK(h[0].last_ms == 500);
  CHECK(h[1].requests == 3);
  CHECK(h[1].errors == 2);
  CHECK(h[1].bytes_up == 7);
  CHECK(h[1].bytes_down == 70);
  CHECK(h[1].first_ms == 100);
  CHECK(h[1].last_ms == 300);
  CHECK(h[2].bytes_up == UINT64_MAX);  // saturates, never wraps
  CHECK(s.total().requests == 6);
  CHECK(s.total().would_block == 1);
  CHECK(s.total().errors == 2);
  CHECK(s.rows() == 7);
}

TEST_CASE("grantable keys: hosts, wildcards, IP literals, ports; never shell text") {
  for (const char* k : {"github.com", "github.com:22", "*.github.com", "10.0.0.1:8080", "[::1]",
                        "[2001:db8::1]:443", "my_host.internal"})
    CHECK_MESSAGE(is_grantable_key(k), std::string(k));
  for (const char* k : {"", "a b", "a;rm -rf ~", "$(id)", "h:0", "h:99999", "`x`", "a\nb", "[::1",
                        "[zz]", "-rf", ".x", "a/b"})
    CHECK_MESSAGE(!is_grantable_key(k), std::string(k));
}

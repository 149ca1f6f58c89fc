// Unit tests for libfycore.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <string>

#include "core/args.h"
#include "core/buffer.h"
#include "core/config.h"
#include "core/crypto.h"
#include "core/fd.h"
#include "core/json.h"
#include "core/log.h"
#include "core/net.h"
#include "core/netns_path.h"
#include "core/nft.h"
#include "core/paths.h"
#include "core/stamp.h"
#include "core/text.h"
#include "core/clock.h"

using namespace fy;

TEST_CASE("hmac_sha256 matches RFC 4231 test case 2") {
  auto d = hmac_sha256("Jefe", "what do ya want for nothing?");
  CHECK(hex(d) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("hex round trip and constant-time compare") {
  CHECK(unhex("00ff10") == std::string("\x00\xff\x10", 3));
  CHECK_FALSE(unhex("0g").has_value());
  CHECK_FALSE(unhex("abc").has_value());
  CHECK(ct_equal("abc", "abc"));
  CHECK_FALSE(ct_equal("abc", "abd"));
  CHECK_FALSE(ct_equal("abc", "ab"));
  CHECK(base64_decode(base64_encode("fy-build:s3cret")) == std::string("fy-build:s3cret"));
  CHECK(base64url_encode("\xfb\xff") == "-_8");
}

TEST_CASE("iso8601 formats and parses UTC timestamps") {
  CHECK(iso8601_utc(0) == "1970-01-01T00:00:00+00:00");
  CHECK(iso8601_utc(1758535260123, true) == "2025-09-22T10:01:00.123+00:00");
  CHECK(iso8601_utc(1758535260123, true, true) == "2025-09-22T10:01:00.123Z");
  CHECK(parse_iso8601("2025-09-22T10:01:00+00:00") == 1758535260000);
  CHECK(parse_iso8601("2025-09-22T10:01:00.5Z") == 1758535260500);
  CHECK(parse_iso8601("2025-09-22T12:01:00+02:00") == 1758535260000);
  CHECK_FALSE(parse_iso8601("2025-09-22T10:01:00").has_value());  // naive
  CHECK_FALSE(parse_iso8601("2025-13-22T10:01:00Z").has_value());
  CHECK_FALSE(parse_iso8601("garbage").has_value());
}

TEST_CASE("json strings are escaped and always valid UTF-8") {
  std::string out;
  json_append_string(out, "a\"b\\c\nd\x01");
  CHECK(out == R"("a\"b\\c\nd\u0001")");
  out.clear();
  json_append_string(out, "caf\xc3\xa9 \xff\xfe");
  CHECK(out == "\"caf\xc3\xa9 \xEF\xBF\xBD\xEF\xBF\xBD\"");
  out.clear();
  JsonObject(out).str("k", "v").num("n", -3).boolean("b", true).close();
  CHECK(out == R"({"k":"v","n":-3,"b":true})");
}

TEST_CASE("hosts are normalized and authorities parsed") {
  CHECK(*normalize_host("Example.COM.") == "example.com");
  CHECK_FALSE(normalize_host("exa mple.com").ok());
  CHECK_FALSE(normalize_host("a..b").ok());
  CHECK(*normalize_host("0:0::1") == "::1");

  auto hp = parse_authority("Example.com:8443", 443);
  REQUIRE(hp.ok());
  CHECK(hp->host == "example.com");
  CHECK(hp->port == 8443);
  CHECK(hp->key(443) == "example.com:8443");

  hp = parse_authority("[2001:DB8::1]:443", 0);
  REQUIRE(hp.ok());
  CHECK(hp->host == "2001:db8::1");
  CHECK(hp->authority() == "[2001:db8::1]:443");
  CHECK(hp->key(443) == "[2001:db8::1]");

  CHECK(parse_authority("example.com", 80)->port == 80);
  CHECK_FALSE(parse_authority("example.com", 0).ok());
  CHECK_FALSE(parse_authority("example.com:0", 443).ok());
  CHECK_FALSE(parse_authority("example.com:65536", 443).ok());
  CHECK_FALSE(parse_authority("2001:db8::1", 443).ok());  // needs brackets
  CHECK_FALSE(parse_authority("[2001:db8::1", 443).ok());
  CHECK_FALSE(parse_authority("user@example.com", 443).ok());
}

TEST_CASE("string helpers") {
  CHECK(iequals("Connection", "connection"));
  CHECK(list_has_token("keep-alive, Upgrade", "upgrade"));
  CHECK_FALSE(list_has_token("keep-alive", "close"));
  CHECK(parse_u64("18446744073709551615") == UINT64_MAX);
  CHECK_FALSE(parse_u64("18446744073709551616").has_value());
  CHECK_FALSE(parse_u64("+1").has_value());
  CHECK(split_list(" a, ,b ,").size() == 2);
}

namespace {
const std::string kKey(32, '\x42');
stamp::Fields sample() {
  stamp::Fields f;
  f.src = "10.89.1.2";
  f.net = "podman1";
  f.seq = 42;
  f.boot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
  return f;
}
}  // namespace

TEST_CASE("stamp round trip, tamper and key checks") {
  std::string v = stamp::format(sample(), kKey);
  CHECK(v.rfind("v=1;src=10.89.1.2;net=podman1;seq=42;boot=", 0) == 0);
  auto f = stamp::verify(v, kKey);
  REQUIRE(f.ok());
  CHECK(f->src == "10.89.1.2");
  CHECK(f->seq == 42);
  CHECK(f->who.empty());

  // Any changed byte breaks the MAC.
  std::string t = v;
  t[9] = '9';
  CHECK_FALSE(stamp::verify(t, kKey).ok());
  CHECK_FALSE(stamp::verify(v, std::string(32, '\x43')).ok());
  CHECK_FALSE(stamp::verify(v + " ", kKey).ok());
  CHECK_FALSE(stamp::verify("v=1;src=10.0.0.1", kKey).ok());
  CHECK(stamp::is_stamp_header("fy-STAMP"));

  auto g = sample();
  g.who = "container:" + std::string(64, 'a');
  auto gv = stamp::verify(stamp::format(g, kKey), kKey);
  REQUIRE(gv.ok());
  CHECK(gv->who == g.who);
}

TEST_CASE("stamp test vector from docs/stamp.md") {
  // Key = 32 bytes 0x00..0x1f. If this changes, docs/stamp.md must change too.
  std::string key;
  for (int i = 0; i < 32; ++i) key += static_cast<char>(i);
  auto f = sample();
  std::string v = stamp::format(f, key);
  std::string msg = "fy-stamp\nv=1;src=10.89.1.2;net=podman1;seq=42;boot=" + f.boot;
  CHECK(v == msg.substr(9) + ";mac=" + hex(hmac_sha256(key, msg)));
  CHECK(stamp::verify(v, key).ok());
}

TEST_CASE("replay guard accepts each sequence once") {
  stamp::ReplayGuard g;
  CHECK(g.accept("b1", 1));
  CHECK_FALSE(g.accept("b1", 1));
  CHECK(g.accept("b1", 3));
  CHECK(g.accept("b1", 2));  // late but inside the window
  CHECK_FALSE(g.accept("b1", 2));
  CHECK(g.accept("b2", 1));  // another boot has its own space
  CHECK(g.accept("b1", 1 + stamp::ReplayGuard::kWindow * 2));
  CHECK_FALSE(g.accept("b1", 5));  // now older than the window
}

TEST_CASE("replay guard at the top of the sequence space") {
  // The window slide must end at UINT64_MAX rather than wrap (it looped
  // forever there, hanging the proxy).
  stamp::ReplayGuard g;
  const uint64_t top = UINT64_MAX;
  CHECK(g.accept("b1", top - 5));
  CHECK(g.accept("b1", top));
  CHECK_FALSE(g.accept("b1", top));
  CHECK(g.accept("b1", top - 1));
  CHECK_FALSE(g.accept("b1", top - 5));
}

TEST_CASE("write queue shares chunks and copies generated bytes") {
  {
    ChunkRef c = ChunkPool::alloc();
    memcpy(c->data(), "hello world", 11);
    WriteQueue q;
    q.push_copy("GET ");
    q.push(c, c->data(), 5);
    q.push(c, c->data() + 5, 6);  // adjacent: merged
    CHECK(q.bytes() == 15);
    iovec bufs[4];
    REQUIRE(q.peek(bufs, 4) == 2);
    CHECK(std::string(static_cast<char*>(bufs[1].iov_base), bufs[1].iov_len) == "hello world");
    q.consume(6);
    REQUIRE(q.peek(bufs, 4) == 1);
    CHECK(std::string(static_cast<char*>(bufs[0].iov_base), bufs[0].iov_len) == "llo world");
    CHECK(c->refs() == 2);
    q.clear();
    CHECK(c.unique());
  }
  CHECK(ChunkPool::live() == 0);
}

TEST_CASE("config: values, file:line errors and unknown keys") {
  auto doc = cfg::Doc::parse(
      "port = 8080\nname = 3\n[limits]\nmax = 5\ntypo = 1\n[[grant]]\nhost = \"a.b\"\n"
      "when = 2026-11-29T21:30:00Z\n",
      "test.toml");
  REQUIRE(doc.ok());
  auto root = doc->root();
  CHECK(root.integer("port", 1, 65535) == 8080);
  CHECK_FALSE(root.string("name").has_value());
  auto lim = root.table("limits");
  REQUIRE(lim.has_value());
  CHECK(lim->integer("max", 0, 4) == std::nullopt);  // out of range
  lim->finish();
  auto grants = root.tables("grant");
  REQUIRE(grants.size() == 1);
  CHECK(grants[0].string("host") == "a.b");
  CHECK(grants[0].timestamp_ms("when") == parse_iso8601("2026-11-29T21:30:00Z"));
  grants[0].finish();
  root.finish();
  auto r = doc->result();
  REQUIRE_FALSE(r.ok());
  const std::string& m = r.error().message;
  CHECK(m.find("test.toml:2:8: name: expected a string") != std::string::npos);
  CHECK(m.find("out of range") != std::string::npos);
  CHECK(m.find("test.toml:5:8: unknown key 'typo' in [limits]") != std::string::npos);

  auto bad = cfg::Doc::parse("a = [1,\n", "bad.toml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.rfind("bad.toml:", 0) == 0);
}

TEST_CASE("make_dirs makes what is missing, says what it made, and names what is in the way") {
  char tmpl[] = "/tmp/fy-paths-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  std::string base = tmpl;
  auto made = fy::make_dirs(base + "/a/b/c", 0700);
  REQUIRE(made.ok());
  CHECK(*made == std::vector<std::string>{base + "/a", base + "/a/b", base + "/a/b/c"});
  struct stat st;
  REQUIRE(stat((base + "/a/b/c").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  auto again = fy::make_dirs(base + "/a/b/c/", 0700);  // all there: nothing made
  REQUIRE(again.ok());
  CHECK(again->empty());
  FILE* f = fopen((base + "/file").c_str(), "w");
  REQUIRE(f != nullptr);
  fclose(f);
  auto blocked = fy::make_dirs(base + "/file/x", 0700);
  REQUIRE(!blocked.ok());
  CHECK(blocked.error().message ==
        "cannot make the directory " + base + "/file/x: " + base + "/file exists and is not a directory");
  CHECK(system(("rm -rf " + base).c_str()) == 0);
}

TEST_CASE("the state home: XDG_STATE_HOME only when absolute, else HOME") {
  std::string saved_home = getenv("HOME") ? getenv("HOME") : "";
  const char* xdg = getenv("XDG_STATE_HOME");
  std::string saved_xdg = xdg ? xdg : "";
  setenv("HOME", "/home/newcomer/", 1);
  setenv("XDG_STATE_HOME", "relative", 1);
  CHECK(fy::state_home() == "/home/newcomer/.local/state");
  CHECK(fy::default_proxy_state_dir() == "/home/newcomer/.local/state/foldyard/egress");
  setenv("XDG_STATE_HOME", "/x/state", 1);
  CHECK(fy::default_proxy_state_dir() == "/x/state/foldyard/egress");
  if (xdg) setenv("XDG_STATE_HOME", saved_xdg.c_str(), 1);
  else unsetenv("XDG_STATE_HOME");
  setenv("HOME", saved_home.c_str(), 1);
}

TEST_CASE("json_nesting_exceeds counts objects and arrays, not brackets inside strings") {
  CHECK_FALSE(fy::json_nesting_exceeds(R"({"a":[1,{"b":2}]})", 3));
  CHECK(fy::json_nesting_exceeds(R"({"a":[1,{"b":2}]})", 2));
  CHECK_FALSE(fy::json_nesting_exceeds(R"({"a":"[[[[{{{{"})", 1));
  CHECK_FALSE(fy::json_nesting_exceeds(R"({"a":"\"[[[["})", 1));  // an escaped quote stays in the string
  CHECK(fy::json_nesting_exceeds(std::string(100, '['), 99));
  CHECK_FALSE(fy::json_nesting_exceeds(std::string(99, '['), 99));
  CHECK_FALSE(fy::json_nesting_exceeds("", 0));
}

TEST_CASE("parse_long_in takes digits only, within the range") {
  long v = -1;
  CHECK(fy::parse_long_in("100", 100, 200, &v));
  CHECK(v == 100);
  CHECK_FALSE(fy::parse_long_in("99", 100, 200, &v));
  CHECK_FALSE(fy::parse_long_in("201", 100, 200, &v));
  CHECK_FALSE(fy::parse_long_in("-1", 0, 200, &v));
  CHECK_FALSE(fy::parse_long_in(" 5", 0, 200, &v));
  CHECK_FALSE(fy::parse_long_in("5x", 0, 200, &v));
  CHECK_FALSE(fy::parse_long_in("", 0, 200, &v));
  CHECK_FALSE(fy::parse_long_in("99999999999999999999999", 0, 200, &v));
  CHECK(v == 100);
}

TEST_CASE("Fd closes what it owns once, moves, releases and resets") {
  auto is_open = [](int fd) { return ::fcntl(fd, F_GETFD) != -1; };
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(raw >= 0);
  {
    fy::Fd a(raw);
    CHECK(a);
    CHECK(a.get() == raw);
    fy::Fd b(std::move(a));
    CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): the contract is -1
    CHECK(a.get() == -1);
    CHECK(b.get() == raw);
    fy::Fd c;
    c = std::move(b);
    CHECK(c.get() == raw);
    CHECK(is_open(raw));
  }
  CHECK_FALSE(is_open(raw));  // closed by the last owner, and only by it

  int r1 = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int r2 = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(r1 >= 0);
  REQUIRE(r2 >= 0);
  fy::Fd f(r1);
  f.reset(r2);  // closes r1, takes r2
  CHECK_FALSE(is_open(r1));
  CHECK(f.get() == r2);
  int out = f.release();
  CHECK(out == r2);
  CHECK_FALSE(f);
  f.reset();  // owns nothing: closes nothing
  CHECK(is_open(r2));
  ::close(r2);
}

TEST_CASE("nft::condense keeps each distinct error of nft's buffer, in order") {
  const char* buf =
      "/dev/stdin:3:5-9: Error: syntax error, unexpected junk\n"
      "    junk\n"
      "    ^^^^\n"
      "/dev/stdin:4:1-3: Error: No such file or directory\n"
      "add rule\n"
      "^^^\n"
      "/dev/stdin:7:5-9: Error: syntax error, unexpected junk\n";
  CHECK(fy::nft::condense(buf) ==
        "syntax error, unexpected junk; No such file or directory");
  CHECK(fy::nft::condense("no error lines here\n").empty());
  CHECK(fy::nft::not_permitted("netlink: Error: Operation not permitted"));
  CHECK_FALSE(fy::nft::not_permitted("Error: Could not process rule: No such file or directory"));
}

// The guard and the namespace contract of core/nft.h. Without the guard the
// run() below aborts the test binary: libnftables' socket would be numbered
// past FD_SETSIZE.
TEST_CASE("nft::Ctx works in the opening thread's namespace past FD_SETSIZE descriptors") {
  if (geteuid() != 0) {
    MESSAGE("skipped: a scratch network namespace and nf_tables need root");
    return;
  }
  rlimit was{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0);
  rlimit raised = was;
  raised.rlim_cur = std::max<rlim_t>(raised.rlim_cur, 2 * FD_SETSIZE);
  raised.rlim_max = std::max(raised.rlim_max, raised.rlim_cur);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &raised) == 0);
  std::vector<Fd> held;  // every number below FD_SETSIZE + 16 taken
  while (held.empty() || (held.back() && held.back().get() < FD_SETSIZE + 16))
    held.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  REQUIRE(held.back());
  std::string opened, inside, outside;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      opened = "unshare(CLONE_NEWNET) failed";
      return;
    }
    auto ctx = nft::Ctx::open();
    if (!ctx) {
      opened = ctx.error().message;
      return;
    }
    nft::Reply r = ctx->run("add table ip fy_unit_scratch");
    if (!r.ok) opened = r.err;
    inside = ctx->run("list tables").out;
  });
  t.join();
  CHECK(opened == "");
  CHECK(inside.find("table ip fy_unit_scratch") != std::string::npos);
  {
    auto ctx = nft::Ctx::open();  // the process's namespace: the scratch table is not here
    REQUIRE(ctx);
    outside = ctx->run("list tables").out;
  }
  CHECK(outside.find("fy_unit_scratch") == std::string::npos);
  int closed = 0;  // closed in the context's copy only: every one still open here
  for (const Fd& f : held) closed += fcntl(f.get(), F_GETFD) == -1;
  CHECK(closed == 0);
  held.clear();
  REQUIRE(setrlimit(RLIMIT_NOFILE, &was) == 0);
}

namespace {

fy::ParsedArgs parse_words(const fy::ArgParser& p, std::vector<const char*> words) {
  words.insert(words.begin(), "prog");
  return p.parse(static_cast<int>(words.size()), words.data());
}

}  // namespace

TEST_CASE("ArgParser: long, =, short, grouped, --, positionals, in order") {
  bool follow = false, json = false;
  std::string lines, host;
  fy::ArgParser p;
  p.flag("-f,--follow", &follow)
      .flag("--json", &json)
      .value("-n,--lines", &lines)
      .value("--host", &host)
      .stop("-h,--help");

  auto r = parse_words(p, {"rows", "--lines", "-1", "--host=a.b", "-f", "dir", "--", "--json"});
  REQUIRE(r.ok());
  CHECK(follow);
  CHECK_FALSE(json);  // after --: a positional
  CHECK(lines == "-1");  // a value is the next word whatever it looks like
  CHECK(host == "a.b");
  CHECK(r.positional == std::vector<std::string>{"rows", "dir", "--json"});

  follow = false;
  r = parse_words(p, {"-fn5", "-"});
  REQUIRE(r.ok());
  CHECK(follow);
  CHECK(lines == "5");
  CHECK(r.positional == std::vector<std::string>{"-"});

  r = parse_words(p, {"-n", "7", "--help", "--bogus"});
  REQUIRE(r.ok());
  CHECK(r.stopped_at == "-h");  // the first name, however it was typed
  CHECK(lines == "7");
}

TEST_CASE("ArgParser: each problem, the first one ending the parse") {
  using Kind = fy::ArgProblem::Kind;
  bool check = false;
  std::string ports;
  fy::ArgParser p;
  p.flag("--check", &check)
      .value("--ports", &ports, "a list")
      .value("--n",
             [](const std::string& v) -> fy::ArgParser::Refusal {
               if (v == "x") return "not a number";
               return std::nullopt;
             })
      .stop("--help");

  auto r = parse_words(p, {"--prots", "1", "--help"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::unknown);
  CHECK(r.problem->option == "--prots");
  CHECK_FALSE(r.stopped_at);

  r = parse_words(p, {"--fol"});  // no abbreviations
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::unknown);

  r = parse_words(p, {"--check", "--ports"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::needs_value);
  CHECK(r.problem->option == "--ports");
  CHECK(r.problem->message == "a list");

  r = parse_words(p, {"--check=yes"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::no_value);
  CHECK(r.problem->option == "--check");

  r = parse_words(p, {"--n=x"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::bad_value);
  CHECK(r.problem->message == "not a number");

  r = parse_words(p, {"-z"});
  REQUIRE(r.problem);
  CHECK(r.problem->option == "-z");

  fy::ArgParser strict;
  strict.reject_positionals().stop("--help");
  r = parse_words(strict, {"extra", "--help"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == Kind::unknown);
  CHECK(r.problem->option == "extra");
}

TEST_CASE("ArgParser: any_long takes every undeclared --name with its value") {
  std::vector<std::pair<std::string, std::string>> got;
  fy::ArgParser p;
  p.flag("--print-state-dir", [] { return fy::ArgParser::Refusal(); })
      .any_long([&](std::string_view k, const std::string& v) -> fy::ArgParser::Refusal {
        if (k == "frobnicate") return "unknown option --frobnicate";
        got.emplace_back(k, v);
        return std::nullopt;
      });
  auto r = parse_words(p, {"--listen", "127.0.0.1:0", "--state-dir=/x", "--print-state-dir"});
  REQUIRE(r.ok());
  CHECK(got == std::vector<std::pair<std::string, std::string>>{{"listen", "127.0.0.1:0"},
                                                               {"state-dir", "/x"}});
  r = parse_words(p, {"--frobnicate", "1"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == fy::ArgProblem::Kind::bad_value);
  CHECK(r.problem->message == "unknown option --frobnicate");
  r = parse_words(p, {"--listen"});
  REQUIRE(r.problem);
  CHECK(r.problem->kind == fy::ArgProblem::Kind::needs_value);
}

TEST_CASE("log helpers: the rate-limited line, its suffix, the connection id") {
  CHECK(fy::log::suppressed_suffix(0).empty());
  CHECK(fy::log::suppressed_suffix(3) == " (3 similar lines suppressed)");
  CHECK(fmt::format("{} CONNECT x", fy::log::ConnId{42}) == "c42 CONNECT x");

  fy::log::init("core_tests", fy::log::Level::warn);
  fy::log::RateLimit limit(1, 3'600'000);  // one line an hour: the rest of this test is dropped
  CHECK_FALSE(fy::log::limited(limit, fy::log::Level::info, "below the level: {}", 1));
  CHECK(fy::log::limited(limit, fy::log::Level::warn, "core_tests: the one line {}", 1));
  CHECK_FALSE(fy::log::limited(limit, fy::log::Level::warn, "dropped {}", 2));
  CHECK_FALSE(fy::log::allow_noting(limit, "dropped"));
  uint64_t suppressed = 0;
  CHECK_FALSE(limit.allow(fy::mono_ms(), &suppressed));
}

TEST_CASE("locate_netns: a final '*', another process's mount namespace, the pid file") {
  char tmpl[] = "/tmp/fy-netns-path-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string d = tmpl;
  auto touch = [](const std::string& p, const std::string& text = "") {
    FILE* f = fopen(p.c_str(), "w");
    REQUIRE(f);
    fputs(text.c_str(), f);
    fclose(f);
  };
  // A plain path is itself; a pattern with nothing matching is not_found.
  CHECK(*fy::locate_netns(d + "/rootless-netns", "") == d + "/rootless-netns");
  auto none = fy::locate_netns(d + "/rootless-netns-*", "");
  REQUIRE(!none);
  CHECK(none.error().code == fy::Errc::not_found);
  // The prefix alone does not match: podman 4's name always has its hash.
  touch(d + "/rootless-netns-");
  CHECK(!fy::locate_netns(d + "/rootless-netns-*", ""));
  touch(d + "/rootless-netns-45504c1edf0b6b131c3e");
  touch(d + "/other");
  CHECK(*fy::locate_netns(d + "/rootless-netns-*", "") == d + "/rootless-netns-45504c1edf0b6b131c3e");
  // Two that match: refused, both named.
  touch(d + "/rootless-netns-second");
  auto two = fy::locate_netns(d + "/rootless-netns-*", "");
  REQUIRE(!two);
  CHECK(two.error().code == fy::Errc::invalid_argument);
  CHECK(two.error().message.find("rootless-netns-second") != std::string::npos);
  CHECK(two.error().message.find("rootless-netns-45504c1edf0b6b131c3e") != std::string::npos);
  // Through a process's mount namespace: /proc/<pid>/root + the path.
  touch(d + "/pause.pid", std::to_string(getpid()) + "\n");
  CHECK(*fy::locate_netns("/run/x/rootless-netns", d + "/pause.pid") ==
        "/proc/" + std::to_string(getpid()) + "/root/run/x/rootless-netns");
  CHECK(*fy::locate_netns(d + "/oth*", d + "/pause.pid") ==
        "/proc/" + std::to_string(getpid()) + "/root" + d + "/other");
  // No pid, a malformed one, one that does not run: not_found, saying which.
  auto missing = fy::locate_netns("/run/x", d + "/absent.pid");
  REQUIRE(!missing);
  CHECK(missing.error().code == fy::Errc::not_found);
  CHECK(missing.error().message.find("absent.pid") != std::string::npos);
  touch(d + "/bad.pid", "12x\n");
  CHECK(!fy::locate_netns("/run/x", d + "/bad.pid"));
  touch(d + "/dead.pid", "4194304\n");
  auto dead = fy::locate_netns("/run/x", d + "/dead.pid");
  REQUIRE(!dead);
  CHECK(dead.error().message.find("is not running") != std::string::npos);
  // Config-time: absolute, and a '*' only at the end of the last component.
  CHECK(fy::netns_path_problem("/run/user/1000/netns/rootless-netns-*").empty());
  CHECK(fy::netns_path_problem("/run/netns/bridge").empty());
  CHECK(!fy::netns_path_problem("run/netns/bridge").empty());
  CHECK(!fy::netns_path_problem("/run/*/netns").empty());
  CHECK(!fy::netns_path_problem("/run/netns/*").empty());
  CHECK(!fy::netns_path_problem("/run/netns/a**").empty());
  CHECK(fy::read_pid_file(d + "/pause.pid") == getpid());
  CHECK(fy::read_pid_file(d + "/bad.pid") == 0);
  for (const char* f : {"rootless-netns-", "rootless-netns-45504c1edf0b6b131c3e", "other",
                        "rootless-netns-second", "pause.pid", "bad.pid", "dead.pid"})
    unlink((d + "/" + f).c_str());
  rmdir(d.c_str());
}

TEST_CASE("open_netns: a network namespace opens; other namespaces, files and absences do not") {
  auto own = fy::open_netns("/proc/self/ns/net");
  REQUIRE(own);
  CHECK(own->fd.get() >= 0);
  struct stat st {};
  REQUIRE(stat("/proc/self/ns/net", &st) == 0);
  CHECK(own->id == fy::NsId{st.st_dev, st.st_ino});
  CHECK(own->id.valid());
  // Another type of namespace: a mistake in the config, said as such.
  auto uts = fy::open_netns("/proc/self/ns/uts");
  REQUIRE(!uts);
  CHECK(uts.error().code == fy::Errc::invalid_argument);
  // What podman leaves unbound (an empty file) and an absent path: not (yet).
  char tmpl[] = "/tmp/fy-open-netns-XXXXXX";
  int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  auto plain = fy::open_netns(tmpl);
  REQUIRE(!plain);
  CHECK(plain.error().code == fy::Errc::not_found);
  unlink(tmpl);
  auto absent = fy::open_netns(tmpl);
  REQUIRE(!absent);
  CHECK(absent.error().code == fy::Errc::not_found);
}

TEST_CASE("LocateNotice: 'matches several' is said when it starts, once, and again after it cleared") {
  fy::LocateNotice n;
  fy::Result<std::string> several =
      fy::make_error(fy::Errc::invalid_argument, "/run/x/rootless-netns-* matches a and b");
  fy::Result<std::string> none = fy::make_error(fy::Errc::not_found, "nothing matches");
  fy::Result<std::string> one = std::string("/run/x/rootless-netns-a");
  CHECK(n.update(none).empty());  // not_found is the follower's ordinary wait
  CHECK(n.update(several) == "/run/x/rootless-netns-* matches a and b");
  CHECK(n.update(several).empty());
  CHECK(n.update(several).empty());
  CHECK(n.update(one).empty());
  CHECK(n.update(several) == "/run/x/rootless-netns-* matches a and b");
}

// The Network Log writer (proxy/netlog/writer.h) and row serialization
// (proxy/netlog/row.h), driven with real files: rotation into dated backups
// and pruning, rows that stay one valid JSON line whatever bytes they carry,
// the truncation limits, and write errors that are counted, never thrown,
// never torn, and recovered from when space returns.
#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "core/clock.h"
#include "proxy/netlog/reader.h"
#include "proxy/netlog/writer.h"
#include "tests/unit/netlog/helpers.h"

using namespace fy;
using namespace fy::netlog;
using namespace fy::netlog::test;
using Json = nlohmann::json;

namespace {

// The conn ids of every line of `path`; every line must be a complete JSON row.
std::vector<uint64_t> conns_in(const std::string& path) {
  std::vector<uint64_t> out;
  std::string data = slurp(path);
  if (!data.empty()) CHECK_MESSAGE(data.back() == '\n', path << " ends in a torn line");
  for (const std::string& l : lines_of(data)) {
    Json j = Json::parse(l, nullptr, /*allow_exceptions=*/false);
    REQUIRE_MESSAGE(j.is_object(), path << ": not a JSON row: " << l);
    out.push_back(j.at("conn").get<uint64_t>());
  }
  return out;
}

struct Backup {
  std::string name;
  std::string stamp;
  uint64_t n;
};

// The dated backups in `dir`, in rotation order, parsed here by the name
// format (egress.YYYYmmddTHHMMSSZ[-n].jsonl), not by the reader's parser.
std::vector<Backup> backups_in(const std::string& dir) {
  auto digits = [](const std::string& s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::vector<Backup> out;
  for (const std::string& n : list_dir(dir)) {
    if (n == "egress.jsonl") continue;
    INFO("unexpected file " << n);
    REQUIRE(n.size() >= 29);
    REQUIRE(n.rfind("egress.", 0) == 0);
    REQUIRE(n.substr(n.size() - 6) == ".jsonl");
    std::string mid = n.substr(7, n.size() - 13), stamp = mid.substr(0, 16);
    REQUIRE((digits(stamp.substr(0, 8)) && stamp[8] == 'T' && digits(stamp.substr(9, 6)) &&
             stamp[15] == 'Z'));
    uint64_t k = 0;
    if (mid.size() > 16) {
      REQUIRE(mid[16] == '-');
      REQUIRE(digits(mid.substr(17)));
      k = std::stoull(mid.substr(17));
    }
    out.push_back({n, stamp, k});
  }
  std::sort(out.begin(), out.end(), [](const Backup& a, const Backup& b) {
    return a.stamp != b.stamp ? a.stamp < b.stamp : a.n < b.n;
  });
  return out;
}

// "20261129T213000Z" -> epoch ms.
int64_t stamp_ms(const std::string& s) {
  std::string iso = s.substr(0, 4) + "-" + s.substr(4, 2) + "-" + s.substr(6, 2) + "T" +
                    s.substr(9, 2) + ":" + s.substr(11, 2) + ":" + s.substr(13, 2) + "Z";
  return *parse_iso8601(iso);
}

}  // namespace

TEST_CASE("rotation uses dated backups and prunes to the newest 5") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  const uint64_t kMax = 2000;
  int64_t before = wall_ms();
  const uint64_t kRows = 300;
  {
    Writer w({logs + "/egress.jsonl", kMax, 5});
    for (uint64_t i = 1; i <= kRows; ++i) {
      w.append(make_row(i));
      if (i % 3 == 0) w.flush();  // several rows per write, as the server does
    }
    w.flush();
    CHECK(w.stats().rows == kRows);
    CHECK(w.stats().write_errors == 0);
    CHECK(w.stats().rotations >= 10);  // many more than 5: pruning had work to do
  }
  int64_t after = wall_ms();

  // Exactly the current file and 5 dated backups, each named for its rotation
  // time and no larger than the limit.
  auto backups = backups_in(logs);
  REQUIRE(backups.size() == 5);
  REQUIRE(exists(logs + "/egress.jsonl"));
  for (const Backup& b : backups) {
    CHECK(stamp_ms(b.stamp) >= before / 1000 * 1000);
    CHECK(stamp_ms(b.stamp) <= after);
    struct stat st;
    REQUIRE(::stat((logs + "/" + b.name).c_str(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) <= kMax);
  }

  // The newest rows survive: backups in rotation order, then the current file,
  // hold one unbroken run that ends at the last row written.
  std::vector<uint64_t> all;
  for (const Backup& b : backups) {
    auto c = conns_in(logs + "/" + b.name);
    CHECK(!c.empty());
    all.insert(all.end(), c.begin(), c.end());
  }
  auto cur = conns_in(logs + "/egress.jsonl");
  all.insert(all.end(), cur.begin(), cur.end());
  REQUIRE(!all.empty());
  CHECK(all.back() == kRows);
  CHECK(all.front() > 1);  // the oldest were pruned
  for (size_t i = 1; i < all.size(); ++i) {
    INFO("row " << i << " of the kept files");
    REQUIRE(all[i] == all[i - 1] + 1);
  }
}

TEST_CASE("a rotation in a later second gets its own stamp, in order") {
  TempDir dir;
  Writer w({dir.path + "/egress.jsonl", 600, 5});
  uint64_t id = 0;
  auto burst = [&] {
    for (int i = 0; i < 3; ++i) w.append(make_row(++id));
    w.flush();
  };
  burst();
  burst();  // rotates
  ::usleep(1100 * 1000);
  burst();  // rotates, a second later
  auto backups = backups_in(dir.path);
  REQUIRE(backups.size() == 2);
  CHECK(backups[0].stamp < backups[1].stamp);
  CHECK(backups[0].n == 0);
  CHECK(backups[1].n == 0);
  CHECK(conns_in(dir.path + "/" + backups[0].name) == std::vector<uint64_t>{1, 2, 3});
  CHECK(conns_in(dir.path + "/" + backups[1].name) == std::vector<uint64_t>{4, 5, 6});
  CHECK(conns_in(dir.path + "/egress.jsonl") == std::vector<uint64_t>{7, 8, 9});
}

TEST_CASE("rows are one valid JSON line whatever bytes they carry") {
  // Quotes, backslashes, every kind of control character, invalid UTF-8
  // (stray continuation, overlong, surrogate, truncated, beyond U+10FFFF)
  // and valid multi-byte text, in every string field.
  const std::string nasty =
      "a\"b\\c\n\r\t\x01\x1f\x7f|\xff|\xc3\x28|\xc0\xaf|\xed\xa0\x80|\xe2\x82 |\xf4\x90\x80\x80|"
      "\xe2\x80\xa8|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  const std::string r3 = "\xef\xbf\xbd";  // U+FFFD
  const std::string expected = "a\"b\\c\n\r\t\x01\x1f\x7f|" + r3 + "|" + r3 + "(|" + r3 + r3 + "|" +
                               r3 + r3 + r3 + "|" + r3 + r3 + " |" + r3 + r3 + r3 + r3 +
                               "|\xe2\x80\xa8|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  Row r = make_row(7);
  for (std::string* f : {&r.method, &r.host, &r.path, &r.ua, &r.error_body, &r.held, &r.rule,
                         &r.tls, &r.sni, &r.error, &r.peer, &r.src, &r.net, &r.who, &r.boot})
    *f = nasty;
  r.attribution = Attribution::attributed;
  std::string line;
  append_json(line, r);
  REQUIRE(line.back() == '\n');
  CHECK(std::count(line.begin(), line.end(), '\n') == 1);
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(line));  // nlohmann checks UTF-8 strictly
  for (const char* k : {"method", "host", "path", "ua", "error_body", "held", "rule", "tls", "sni",
                        "error", "peer", "src", "net", "who", "boot"})
    CHECK_MESSAGE(j.at(k).get<std::string>() == expected, k);

  // And the reader takes the row back as it was written.
  auto back = parse_row(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(back.ok());
  CHECK(back->host == expected);
  CHECK(back->attribution == Attribution::attributed);

  // Random bytes, many times: always one line, always JSON, always a row.
  std::mt19937 rng(20261129);
  for (int n = 0; n < 3000; ++n) {
    Row x = make_row(static_cast<uint64_t>(n));
    for (std::string* f : {&x.host, &x.path, &x.ua, &x.error_body, &x.who}) {
      f->resize(rng() % 300);
      for (char& c : *f) c = static_cast<char>(rng() & 0xFF);
    }
    if (x.host.empty()) x.host = "h";
    std::string l;
    append_json(l, x);
    REQUIRE(std::count(l.begin(), l.end(), '\n') == 1);
    REQUIRE(l.back() == '\n');
    l.pop_back();
    REQUIRE(Json::accept(l));
    REQUIRE(parse_row(l).ok());
  }
}

TEST_CASE("truncation limits: path 200, ua 120, error_body 1024 collapsed") {
  auto json_of = [](const Row& r) {
    std::string l;
    append_json(l, r);
    return Json::parse(l);
  };
  Row r = make_row(1);
  r.path = "/" + std::string(299, 'p');
  r.ua = std::string(200, 'u');
  r.status = 502;
  r.error_body = std::string(3000, 'e');
  Json j = json_of(r);
  CHECK(j["path"].get<std::string>() == r.path.substr(0, kMaxPath));
  CHECK(j["ua"].get<std::string>() == std::string(kMaxUa, 'u'));
  CHECK(j["error_body"].get<std::string>().size() <= kMaxErrorBody);

  // A cut never splits a UTF-8 sequence: 3-byte euro signs cut at 200 keep 66.
  std::string euros;
  for (int i = 0; i < 100; ++i) euros += "\xe2\x82\xac";
  r.path = euros;
  r.ua = euros;
  j = json_of(r);
  CHECK(j["path"].get<std::string>() == euros.substr(0, 198));
  CHECK(j["ua"].get<std::string>() == euros.substr(0, 120));

  // error_body as the proxy captures it: whitespace runs collapsed, trimmed, cut.
  CHECK(collapse_whitespace("  a \t\n\r\f\v b  c  ", kMaxErrorBody) == "a b c");
  std::string body;
  for (int i = 0; i < 1000; ++i) body += "word \n\t ";
  std::string c = collapse_whitespace(body, kMaxErrorBody);
  CHECK(c.size() <= kMaxErrorBody);
  CHECK(c.size() >= kMaxErrorBody - 5);
  CHECK(c.find("  ") == std::string::npos);
  CHECK(c.find('\n') == std::string::npos);
  CHECK(c.rfind("word", 0) == 0);
  // The cut lands between characters, never inside one.
  CHECK(collapse_whitespace("\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 4) == "\xe2\x82\xac");
  CHECK(collapse_whitespace("\xe2\x82\xac \xe2\x82\xac", 5) == "\xe2\x82\xac ");
  CHECK(truncate_utf8("ab\xe2\x82\xac", 4) == "ab");
  CHECK(truncate_utf8("ab\xe2\x82\xac", 5) == "ab\xe2\x82\xac");
}

TEST_CASE("a full disk is counted, drops rows without throwing or tearing, and writing resumes") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a tmpfs needs root (the RLIMIT_FSIZE case below still runs)");
    return;
  }
  // A private mount namespace: the tmpfs disappears with this process.
  REQUIRE(::unshare(CLONE_NEWNS) == 0);
  REQUIRE(::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
  TempDir dir;
  REQUIRE(::mount("tmpfs", dir.path.c_str(), "tmpfs", 0, "size=64k,mode=0700") == 0);
  const std::string log = dir.path + "/logs/egress.jsonl";
  {
    Writer w({log, 5 * 1024 * 1024, 5});
    for (uint64_t i = 1; i <= 5; ++i) w.append(make_row(i));
    CHECK_NOTHROW(w.flush());
    REQUIRE(w.stats().rows == 5);

    // Fill the file system: the log's last page still has room for part of
    // the next write, which therefore fails half-way.
    const std::string filler = dir.path + "/filler";
    {
      int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT, 0600);
      REQUIRE(fd >= 0);
      std::string block(4096, 'f');
      while (::write(fd, block.data(), block.size()) > 0) {
      }
      CHECK(errno == ENOSPC);
      ::close(fd);
    }
    for (uint64_t i = 6; i <= 45; ++i) w.append(make_row(i));
    CHECK_NOTHROW(w.flush());
    CHECK(w.stats().write_errors == 1);
    CHECK(w.stats().rows_dropped == 40);
    CHECK(w.stats().rows == 5);
    CHECK(w.last_error().find("No space") != std::string::npos);
    // What is on disk is whole rows only.
    CHECK(conns_in(log) == std::vector<uint64_t>{1, 2, 3, 4, 5});

    // Still full: counted again, still no exception, still nothing torn.
    for (uint64_t i = 6; i <= 45; ++i) w.append(make_row(i));
    CHECK_NOTHROW(w.flush());
    CHECK(w.stats().write_errors == 2);
    CHECK(w.stats().rows_dropped == 80);
    CHECK(conns_in(log) == std::vector<uint64_t>{1, 2, 3, 4, 5});

    // Space returns: writing resumes by itself.
    REQUIRE(::unlink(filler.c_str()) == 0);
    for (uint64_t i = 47; i <= 49; ++i) w.append(make_row(i));
    CHECK_NOTHROW(w.flush());
    CHECK(w.stats().write_errors == 2);
    CHECK(w.stats().rows == 8);
  }
  CHECK(conns_in(log) == std::vector<uint64_t>{1, 2, 3, 4, 5, 47, 48, 49});
  ::umount2(dir.path.c_str(), MNT_DETACH);
}

TEST_CASE("a file-size limit mid-write is counted and leaves no torn row") {
  TempDir dir;
  const std::string log = dir.path + "/egress.jsonl";
  Writer w({log, 5 * 1024 * 1024, 5});
  for (uint64_t i = 1; i <= 3; ++i) w.append(make_row(i));
  w.flush();
  REQUIRE(w.stats().rows == 3);
  struct stat st;
  REQUIRE(::stat(log.c_str(), &st) == 0);

  // Allow 100 more bytes: the next write stops part-way with EFBIG.
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_sig = ::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = static_cast<rlim_t>(st.st_size) + 100;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  for (uint64_t i = 4; i <= 10; ++i) w.append(make_row(i));
  CHECK_NOTHROW(w.flush());
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  ::signal(SIGXFSZ, old_sig);

  CHECK(w.stats().write_errors == 1);
  CHECK(w.stats().rows_dropped == 7);
  CHECK(conns_in(log) == std::vector<uint64_t>{1, 2, 3});

  w.append(make_row(11));
  w.flush();
  CHECK(w.stats().rows == 4);
  CHECK(conns_in(log) == std::vector<uint64_t>{1, 2, 3, 11});
}

TEST_CASE("a log path that cannot be opened is counted, and writing resumes once it can") {
  TempDir dir;
  const std::string blocker = dir.path + "/state";
  spit(blocker, "a file where the log directory should be\n");
  const std::string log = blocker + "/egress.jsonl";
  Writer w({log, 5 * 1024 * 1024, 5});
  w.append(make_row(1));
  w.append(make_row(2));
  CHECK_NOTHROW(w.flush());
  CHECK(w.stats().write_errors == 1);
  CHECK(w.stats().rows_dropped == 2);
  CHECK(w.last_error().find("cannot open") != std::string::npos);

  REQUIRE(::unlink(blocker.c_str()) == 0);
  w.append(make_row(3));
  CHECK_NOTHROW(w.flush());
  CHECK(w.stats().rows == 1);
  CHECK(conns_in(log) == std::vector<uint64_t>{3});
}

TEST_CASE("a log directory removed under the writer is recreated, not written into the void") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  Writer w({logs + "/egress.jsonl", 5 * 1024 * 1024, 5});
  w.append(make_row(1));
  w.flush();
  REQUIRE(conns_in(logs + "/egress.jsonl") == std::vector<uint64_t>{1});
  REQUIRE(std::system(("rm -rf '" + logs + "'").c_str()) == 0);
  w.append(make_row(2));
  CHECK_NOTHROW(w.flush());
  CHECK(conns_in(logs + "/egress.jsonl") == std::vector<uint64_t>{2});
  CHECK(w.stats().rows == 2);
}

TEST_CASE("rows beyond the buffer limit are dropped and counted") {
  TempDir dir;
  const std::string log = dir.path + "/egress.jsonl";
  WriterOptions o{log, 5 * 1024 * 1024, 5, 1000};
  Writer w(o);
  for (uint64_t i = 1; i <= 50; ++i) w.append(make_row(i));
  CHECK(w.stats().rows_dropped > 0);
  w.flush();
  CHECK(w.stats().rows > 0);
  CHECK(w.stats().rows + w.stats().rows_dropped == 50);
  // The rows kept are the first ones, whole.
  std::vector<uint64_t> want;
  for (uint64_t i = 1; i <= w.stats().rows; ++i) want.push_back(i);
  CHECK(conns_in(log) == want);
  // Once flushed, the buffer takes rows again.
  w.append(make_row(51));
  w.flush();
  CHECK(conns_in(log).back() == 51);
}

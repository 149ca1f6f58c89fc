// fy-netlog: the operator's reader of the Network Log (docs/fy-netlog.md).
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <tuple>
#include <set>
#include <string>

#include "core/args.h"
#include "core/clock.h"
#include "core/text.h"
#include "proxy/netlog/reader.h"
#include "proxy/netlog/view.h"

namespace {

using namespace fy;
using namespace fy::netlog;

// Exit codes (docs/fy-netlog.md).
constexpr int kExitOk = 0;
constexpr int kExitRead = 1;   // a read failed part-way (I/O error)
constexpr int kExitUsage = 2;  // bad flag, filter or argument
constexpr int kExitNoLog = 3;  // no Network Log at the path, or not readable

constexpr const char* kUsage = R"(Usage: fy-netlog [VIEW] [OPTIONS] [PATH]

Reads fy-proxy's Network Log (egress.jsonl and its dated backups, oldest first).

Views:
  summary        per-host summary: requests, blocked, would-block, errors,
                 bytes up/down, last seen (the default)
  rows           one line per row: time, status, method, host, path, flags
  refusals       blocked and would-block rows, who made them, and the
                 `fy allow add` command that grants each host (with the
                 principals that asked and their User-Agents)
  credentials    per injection rule, the principals it was injected for

Options:
  -f, --follow         keep reading as rows arrive, across rotations (tail -F);
                       streams the rows view unless `refusals` is given
  -n, --lines N        rows/refusals: only the last N matching rows
                       (default with --follow: 10; 0 = only new rows)
      --host PATTERN   only this host: exact (api.github.com), a wildcard
                       (*.github.com: subdomains only), either with a port
                       (github.com:22); repeat for several
      --status SPEC    only these statuses: 403, 4xx, >=500, <400, 200-299,
                       comma-separated; 0 is a tunnel or would-block row
      --since TIME     only rows at or after TIME: 10m, 2h, 3d (ago), or ISO
                       (2026-11-29T21:30:00Z; without an offset: local time)
      --until TIME     only rows at or before TIME
      --by principal   summary per principal (container or compose service,
                       build, VM user, unattributed): the hosts it used
      --engine PATH    engine snapshots to name principals with (default:
                       engine.jsonl beside the log; fy-engine-watch writes it)
      --json           machine output: the summary as one JSON document, or
                       the matching rows as JSON lines (as the log has them);
                       refusals add `asked_by` to each and end with one
                       `{"grants": [...]}` line
      --utc            print times in UTC (default: local time)
      --width N        columns to fit (default: the terminal's, else 80)
  -h, --help           this text
      --version        the version

PATH is the log file or its directory. Default:
  $XDG_STATE_HOME/foldyard/egress/logs/egress.jsonl
  (~/.local/state/foldyard/egress/logs/egress.jsonl)

Exit status: 0 done (lines that are not rows are skipped and reported on
stderr), 1 a read failed part-way, 2 bad usage, 3 no Network Log at PATH or
it cannot be read.
)";

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

enum class View { summary, rows, refusals, credentials };

struct Args {
  View view = View::summary;
  bool view_given = false;
  bool follow = false;
  bool json = false;
  bool utc = false;
  long lines = -1;  // -1: all
  int width = 0;    // 0: detect
  bool by_principal = false;
  std::string engine;  // "" : beside the log
  std::string path;
  Filter filter;
};

int usage_error(const std::string& msg) {
  fmt::print(stderr, "fy-netlog: {}\nRun `fy-netlog --help` for the views, flags and filters.\n",
             msg);
  return kExitUsage;
}


// Returns -1 to go on, else the exit code.
int parse_args(int argc, char** argv, Args& a, int64_t now_ms) {
  using Refusal = ArgParser::Refusal;
  ArgParser p;
  p.stop("-h,--help")
      .stop("--version")
      .flag("-f,--follow", &a.follow)
      .value("-n,--lines",
             [&](const std::string& v) -> Refusal {
               if (!parse_long_in(v, 0, 100000000, &a.lines))
                 return fmt::format("bad --lines '{}': give a number of rows", v);
               return std::nullopt;
             })
      .value("--host",
             [&](const std::string& v) -> Refusal {
               auto h = parse_host_pattern(v);
               if (!h) return h.error().message;
               a.filter.hosts.push_back(*h);
               return std::nullopt;
             })
      .value("--status",
             [&](const std::string& v) -> Refusal {
               auto st = parse_status_spec(v);
               if (!st) return st.error().message;
               a.filter.statuses.insert(a.filter.statuses.end(), st->begin(), st->end());
               return std::nullopt;
             })
      .flag("--json", &a.json)
      .flag("--utc", &a.utc)
      .value("--width",
             [&](const std::string& v) -> Refusal {
               long w;
               if (!parse_long_in(v, kMinWidth, kMaxWidth, &w))
                 return fmt::format("bad --width '{}': give {}..{} columns", v, kMinWidth,
                                    kMaxWidth);
               a.width = static_cast<int>(w);
               return std::nullopt;
             })
      .value("--by",
             [&](const std::string& v) -> Refusal {
               if (v != "principal")
                 return fmt::format("bad --by '{}': the one grouping is `--by principal`", v);
               a.by_principal = true;
               return std::nullopt;
             })
      .value("--engine", &a.engine);
  for (const char* name : {"since", "until"}) {
    std::optional<int64_t>& slot = name[0] == 's' ? a.filter.since_ms : a.filter.until_ms;
    p.value(std::string("--") + name, [&slot, name, now_ms](const std::string& v) -> Refusal {
      auto t = parse_time_spec(v, now_ms);
      if (!t) return fmt::format("--{}: {}", name, t.error().message);
      slot = *t;
      return std::nullopt;
    });
  }
  ParsedArgs parsed = p.parse(argc, argv);
  if (parsed.stopped_at == "-h") {
    fmt::print("{}", kUsage);
    return kExitOk;
  }
  if (parsed.stopped_at == "--version") {
    fmt::print("fy-netlog 0.1.0\n");
    return kExitOk;
  }
  if (parsed.problem) {
    const ArgProblem& e = *parsed.problem;
    switch (e.kind) {
      case ArgProblem::Kind::needs_value:
        return usage_error(fmt::format("{} needs a value", e.option));
      case ArgProblem::Kind::bad_value:
        return usage_error(e.message);
      case ArgProblem::Kind::no_value:
        return usage_error(fmt::format("{} takes no value", e.option));
      case ArgProblem::Kind::unknown:
        return usage_error(fmt::format("unknown option '{}'", e.option));
    }
  }
  for (const std::string& arg : parsed.positional) {
    if (!a.view_given && a.path.empty() &&
        (arg == "summary" || arg == "rows" || arg == "refusals" || arg == "credentials")) {
      a.view = arg == "summary"    ? View::summary
               : arg == "rows"     ? View::rows
               : arg == "refusals" ? View::refusals
                                   : View::credentials;
      a.view_given = true;
    } else if (a.path.empty()) {
      a.path = arg;
    } else {
      return usage_error(fmt::format("unexpected argument '{}' (one PATH at most)", arg));
    }
  }
  if (a.filter.since_ms && a.filter.until_ms && *a.filter.since_ms > *a.filter.until_ms)
    return usage_error("--since is after --until: nothing could match");
  if (a.follow) {
    if (a.view == View::summary) {
      if (a.view_given)
        return usage_error(
            "--follow streams rows: use `fy-netlog rows --follow` or "
            "`fy-netlog refusals --follow`");
      a.view = View::rows;
    }
    if (a.lines < 0) a.lines = 10;
  }
  if (a.by_principal && a.view != View::summary)
    return usage_error("--by principal applies to the summary view");
  if (a.follow && a.view == View::credentials)
    return usage_error("--follow streams rows: `credentials` is read once");
  if ((a.view == View::summary || a.view == View::credentials) && a.lines >= 0)
    return usage_error("--lines applies to the rows and refusals views");
  a.filter.refusals_only = a.view == View::refusals;
  return -1;
}

int detect_width() {
  if (const char* cols = std::getenv("COLUMNS")) {
    long w;
    if (parse_long_in(cols, 1, 100000, &w)) return static_cast<int>(w);
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 80;
}

void write_out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
}

void report_bad_lines(const ReadStats& st) {
  if (st.bad_lines == 0) return;
  std::fflush(stdout);
  fmt::print(stderr, "fy-netlog: skipped {} (first: {})\n",
             st.bad_lines == 1
                 ? std::string("1 line that is not a Network Log row")
                 : fmt::format("{} lines that are not Network Log rows", st.bad_lines),
             st.first_bad);
}

int read_error(const Error& e, const std::string& path) {
  if (e.code == Errc::not_found) {
    fmt::print(stderr,
               "fy-netlog: no Network Log at {} — is fy-proxy running with --netlog {}? Give "
               "the log's path (or its directory) as the last argument.\n",
               path, path);
    return kExitNoLog;
  }
  fmt::print(stderr, "fy-netlog: {}\n", e.message);
  return e.code == Errc::permission ? kExitNoLog : kExitRead;
}

// Reads the engine snapshots (engine.jsonl and its backups) into `res`. None
// is not an error: principals are then shown as their stamps.
void load_engine(const std::string& path, Resolver& res) {
  ReadStats st;
  uint64_t bad = 0;
  std::string first_bad;
  auto files = list_log_files(path);
  if (files) {
    for (const auto& f : *files) {
      FILE* fp = std::fopen(f.path.c_str(), "re");
      if (!fp) continue;
      char* line = nullptr;
      size_t cap = 0;
      ssize_t len;
      uint64_t no = 0;
      while ((len = ::getline(&line, &cap, fp)) > 0) {
        ++no;
        std::string_view l(line, static_cast<size_t>(len));
        if (l.back() != '\n') break;  // torn last line: being written
        l.remove_suffix(1);
        if (is_blank(l)) continue;
        auto s = parse_snapshot(l);
        if (s)
          res.add(*s);
        else if (bad++ == 0)
          first_bad = fmt::format("{}:{}: {}", f.path, no, s.error().message);
      }
      std::free(line);
      std::fclose(fp);
    }
  }
  res.finish();
  if (bad)
    fmt::print(stderr, "fy-netlog: skipped {} engine snapshot line{} (first: {})\n", bad,
               bad == 1 ? "" : "s", first_bad);
}

// Following engine.jsonl beside a followed log: each poll adds the snapshots
// appended since (across its rotations) and rebuilds the resolver's timelines,
// so a row that arrives now resolves against the snapshots that arrive with it.
class EngineFollower {
 public:
  EngineFollower(std::string path, Resolver& res) : f_(std::move(path), true), res_(res) {}
  // True when snapshots were added.
  bool poll() {
    size_t before = res_.snapshots();
    ReadStats st;
    (void)f_.poll(st, [&](const Row&, std::string_view l) {
      auto s = parse_snapshot(l);
      if (s)
        res_.add(*s);
      else if (bad_++ == 0)
        fmt::print(stderr, "fy-netlog: skipped an engine snapshot line of {}: {} (further ones "
                           "are counted)\n", f_.path(), s.error().message);
    });
    if (res_.snapshots() == before && started_) return false;
    started_ = true;
    res_.finish();
    return true;
  }
  uint64_t bad() const { return bad_; }

 private:
  Follower f_;
  Resolver& res_;
  uint64_t bad_ = 0;
  bool started_ = false;
};

// How long a followed row whose principal is not known yet waits for the
// snapshot that names it (fy-engine-watch records a start within an event
// round trip; a row often arrives first). Rows behind it wait with it, so the
// stream keeps its order.
constexpr uint64_t kResolveWaitMs = 2000;

std::string engine_path(const Args& a) {
  if (!a.engine.empty()) {
    struct stat st;
    bool dir = ::stat(a.engine.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    return dir ? a.engine + "/engine.jsonl" : a.engine;
  }
  size_t slash = a.path.rfind('/');
  return (slash == std::string::npos ? std::string() : a.path.substr(0, slash + 1)) + "engine.jsonl";
}

int run_principals(const Args& a, const ViewOptions& vo) {
  PrincipalView pv;
  CredentialsView cv;
  ReadStats st;
  auto r = read_log(a.path, st, [&](const Row& row, std::string_view) {
    if (!a.filter.matches(row)) return;
    Principal p = vo.resolver->resolve(row);
    if (a.view == View::credentials)
      cv.add(row, p);
    else
      pv.add(row, p);
  });
  if (!r) return read_error(r.error(), a.path);
  if (a.view == View::credentials)
    write_out(a.json ? cv.json() : cv.render(vo));
  else
    write_out(a.json ? pv.json() : pv.render(vo));
  report_bad_lines(st);
  return kExitOk;
}

int run_summary(const Args& a, const ViewOptions& vo) {
  Summary sum;
  ReadStats st;
  const bool resolving = vo.resolving();
  auto r = read_log(a.path, st, [&](const Row& row, std::string_view) {
    if (!a.filter.matches(row)) return;
    sum.add(row, resolving ? vo.resolver->resolve(row).label() : std::string());
  });
  if (!r) return read_error(r.error(), a.path);
  auto hosts = sum.hosts();
  write_out(a.json ? summary_json(hosts, sum.total(), st, a.path)
                   : render_summary(hosts, sum.total(), vo));
  report_bad_lines(st);
  return kExitOk;
}

// The rows and refusals views, once or following.
int run_rows(const Args& a, const ViewOptions& vo, EngineFollower* engine) {
  RowPrinter printer(a.view == View::rows ? RowPrinter::Kind::rows : RowPrinter::Kind::refusals,
                     vo);
  Grants grants;
  ReadStats st;
  // Rows held back for --lines N (the last N of the first read); streamed after.
  std::deque<std::pair<Row, std::string>> held;
  bool streaming = a.lines < 0;
  std::set<std::string> hinted;  // keys whose grant command was shown (following)
  uint64_t shown = 0;
  auto emit = [&](const Row& row, std::string_view line) {
    ++shown;
    if (a.json) {
      // refusals: the row as the log has it, plus who asked.
      write_out(a.view == View::refusals ? refusal_json(line, row, vo.resolver->resolve(row))
                                         : std::string(line) + "\n");
      return;
    }
    write_out(printer.line(row));
    if (a.follow && a.view == View::refusals) {
      std::string key = to_lower(row.host);
      if (is_grantable_key(key) && hinted.insert(key).second)
        write_out(
            fmt::format("{:9}grant: fy allow add {}{}\n", "", key, row.build ? " --build" : ""));
    }
  };
  // Following, text or refusals' JSON: rows waiting for a snapshot that names
  // their principal, with the monotonic time each arrived.
  std::deque<std::tuple<Row, std::string, uint64_t>> waiting;
  const bool names = !a.json || a.view == View::refusals;
  auto pending = [&](const Row& row) {
    if (!engine || !names || row.attribution != Attribution::attributed) return false;
    Principal p = vo.resolver->resolve(row);
    return p.kind == Principal::Kind::unresolved ||
           (p.kind == Principal::Kind::container && p.claims.name.empty());
  };
  auto release = [&](bool all) {
    uint64_t now = mono_ms();
    while (!waiting.empty()) {
      auto& [row, line, since] = waiting.front();
      if (!all && now < since + kResolveWaitMs && pending(row)) break;
      emit(row, line);
      waiting.pop_front();
    }
  };
  auto on_row = [&](const Row& row, std::string_view line) {
    if (!a.filter.matches(row)) return;
    if (!a.follow && a.view == View::refusals) {
      Principal p = vo.resolver->resolve(row);
      grants.add(row, vo.resolving() ? principal_of(row, vo) : std::string(), &p);
    }
    if (streaming) {
      if (waiting.empty() && !pending(row))
        emit(row, line);
      else
        waiting.emplace_back(row, std::string(line), mono_ms());
      return;
    }
    if (a.lines == 0) return;
    held.emplace_back(row, std::string(line));
    if (held.size() > static_cast<size_t>(a.lines)) held.pop_front();
  };

  Follower f(a.path);
  auto r = f.poll(st, on_row);
  if (!r && !(a.follow && r.error().code == Errc::not_found)) return read_error(r.error(), a.path);
  if (!r) fmt::print(stderr, "fy-netlog: waiting for {} to appear…\n", a.path);
  if (!a.follow) f.finish(st);
  for (const auto& [row, line] : held) emit(row, line);
  held.clear();
  streaming = true;

  if (!a.follow) {
    if (a.json && a.view == View::refusals)
      write_out(grants.json());  // the last line: the grants, after the rows
    else if (!a.json && a.view == View::refusals)
      write_out(grants.empty() ? std::string("no refusals\n") : grants.render(vo));
    else if (!a.json && shown == 0)
      write_out("no rows\n");
    report_bad_lines(st);
    return kExitOk;
  }

  // Following: bad lines are reported once when first seen, and the total on exit.
  std::fflush(stdout);
  uint64_t reported = 0;
  auto note_bad = [&] {
    if (st.bad_lines == 0 || reported != 0) return;
    report_bad_lines(st);
    fmt::print(stderr, "fy-netlog: further bad lines are counted; the total is shown on exit\n");
    reported = st.bad_lines;
  };
  note_bad();
  while (!g_stop) {
    timespec ts{0, 200 * 1000 * 1000};
    ::nanosleep(&ts, nullptr);
    if (g_stop) break;
    if (engine) engine->poll();
    auto pr = f.poll(st, on_row);
    release(false);
    std::fflush(stdout);
    if (!pr && pr.error().code != Errc::not_found) return read_error(pr.error(), a.path);
    note_bad();
  }
  release(true);
  std::fflush(stdout);
  if (st.bad_lines > reported) report_bad_lines(st);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t now = wall_ms();
  Args a;
  if (int code = parse_args(argc, argv, a, now); code >= 0) return code;
  if (a.path.empty()) a.path = default_log_path();
  a.path = resolve_log_path(a.path);

  ViewOptions vo;
  vo.width = a.width ? a.width : detect_width();
  vo.now_ms = now;
  vo.utc = a.utc;
  if (vo.utc) {
    ::setenv("TZ", "UTC", 1);
  }
  ::tzset();

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  Resolver resolver;
  std::optional<EngineFollower> engine;
  if (a.follow) {
    engine.emplace(engine_path(a), resolver);
    engine->poll();
  } else {
    load_engine(engine_path(a), resolver);
  }
  vo.resolver = &resolver;
  if (a.by_principal || a.view == View::credentials) return run_principals(a, vo);
  return a.view == View::summary ? run_summary(a, vo)
                                 : run_rows(a, vo, engine ? &*engine : nullptr);
}

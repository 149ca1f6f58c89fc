#include "proxy/netlog/reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/json.h"
#include "core/clock.h"
#include "core/paths.h"
#include "core/text.h"

namespace fy::netlog {
namespace {

using Json = nlohmann::json;

// The latest ts a row may carry: 9999-12-31T23:59:59.999Z (what the writer can
// print back with a four-digit year).
constexpr int64_t kMaxTsMs = 253402300799999;

// Field readers: absent is fine (the default stays); present with the wrong
// type is an error naming the field.
class Fields {
 public:
  explicit Fields(const Json& obj) : obj_(obj) {}

  const Json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  bool str(const char* key, std::string* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_string()) return fail(key, "a string");
    *out = v->get_ref<const std::string&>();
    return true;
  }
  bool flag(const char* key, bool* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_boolean()) return fail(key, "true or false");
    *out = v->get<bool>();
    return true;
  }
  bool unum(const char* key, uint64_t* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_number_unsigned()) return fail(key, "a non-negative integer");
    *out = v->get<uint64_t>();
    return true;
  }
  bool nonneg_i64(const char* key, int64_t* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_number_unsigned() || v->get<uint64_t>() > uint64_t(INT64_MAX))
      return fail(key, "a non-negative integer");
    *out = static_cast<int64_t>(v->get<uint64_t>());
    return true;
  }
  bool fail(const char* key, const char* want) {
    error = fmt::format("field `{}` is not {}", key, want);
    return false;
  }
  std::string error;

 private:
  const Json& obj_;
};

std::string errno_text(int e) {
  return std::strerror(e);
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string lower_no_dot(std::string_view s) {
  std::string out = to_lower(s);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

std::optional<uint16_t> parse_port(std::string_view s) {
  auto v = parse_u64(s);
  if (!v || *v == 0 || *v > 65535 || s.size() > 5) return std::nullopt;
  return static_cast<uint16_t>(*v);
}

uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

// A row is a flat object; a line nested deeper than this is not one, and is
// refused before a parser builds a tree for it.
constexpr int kMaxDepth = 16;


}  // namespace

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

Result<Row> parse_row(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() > kMaxLine) return make_error(Errc::too_large, "longer than {} bytes", kMaxLine);
  if (json_nesting_exceeds(line, kMaxDepth)) return make_error(Errc::parse, "nested deeper than {} levels", kMaxDepth);
  Json j;
  try {
    j = Json::parse(line.begin(), line.end());
  } catch (const Json::parse_error& e) {
    return make_error(Errc::parse, "not JSON (syntax error at byte {})", e.byte);
  } catch (const std::exception&) {
    return make_error(Errc::parse, "not JSON");
  }
  if (!j.is_object()) return make_error(Errc::parse, "not a JSON object");

  Row r;
  Fields f(j);
  const Json* ts = f.find("ts");
  if (!ts) return make_error(Errc::parse, "no `ts` field");
  if (!ts->is_string()) return make_error(Errc::parse, "field `ts` is not a string");
  auto ms = parse_iso8601(ts->get_ref<const std::string&>());
  if (!ms || *ms < 0 || *ms > kMaxTsMs)
    return make_error(Errc::parse, "field `ts` is not an ISO 8601 time with an offset");
  r.ts_ms = *ms;

  const Json* host = f.find("host");
  if (!host) return make_error(Errc::parse, "no `host` field");
  if (!host->is_string() || host->get_ref<const std::string&>().empty())
    return make_error(Errc::parse, "field `host` is not a non-empty string");
  r.host = host->get_ref<const std::string&>();

  const Json* status = f.find("status");
  if (!status) return make_error(Errc::parse, "no `status` field");
  if (!status->is_number_integer() || status->get<int64_t>() < 0 || status->get<int64_t>() > 999)
    return make_error(Errc::parse, "field `status` is not an integer 0..999");
  r.status = static_cast<int>(status->get<int64_t>());

  bool unattributed = false;
  bool ok = f.str("method", &r.method) && f.str("path", &r.path) && f.unum("conn", &r.conn) &&
            f.str("peer", &r.peer) && f.flag("injected", &r.injected) &&
            f.flag("replayed", &r.replayed) && f.str("ua", &r.ua) &&
            f.str("error_body", &r.error_body) && f.flag("passthrough", &r.passthrough) &&
            f.flag("blocked", &r.blocked) && f.flag("would_block", &r.would_block) &&
            f.flag("build", &r.build) && f.flag("mint_failed", &r.mint_failed) &&
            f.flag("overlap", &r.overlap) && f.str("held", &r.held) && f.str("rule", &r.rule) &&
            f.str("tls", &r.tls) && f.str("sni", &r.sni) && f.unum("bytes_up", &r.bytes_up) &&
            f.unum("bytes_down", &r.bytes_down) && f.nonneg_i64("duration_ms", &r.duration_ms) &&
            f.str("error", &r.error) && f.str("src", &r.src) && f.str("net", &r.net) &&
            f.str("who", &r.who) && f.str("boot", &r.boot) && f.unum("seq", &r.seq) &&
            f.flag("unattributed", &unattributed);
  if (!ok) return make_error(Errc::parse, "{}", f.error);
  if (unattributed)
    r.attribution = Attribution::unattributed;
  else if (f.find("src") || f.find("net") || f.find("who"))
    r.attribution = Attribution::attributed;
  return r;
}

// ---- Files ------------------------------------------------------------------

std::string default_log_path() {
  // The same rule as fy-proxy's default --state-dir (core/paths.h).
  return default_proxy_state_dir() + "/logs/egress.jsonl";
}

std::string resolve_log_path(const std::string& arg) {
  struct stat st;
  if (::stat(arg.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string dir = arg;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return (dir == "/" ? "" : dir) + "/egress.jsonl";
  }
  return arg;
}

std::optional<BackupKey> parse_backup_name(std::string_view name, std::string_view base) {
  size_t dot = base.rfind('.');
  std::string_view stem = base, ext;
  if (dot != std::string_view::npos && dot != 0) {
    stem = base.substr(0, dot);
    ext = base.substr(dot);
  }
  // <stem>.YYYYmmddTHHMMSSZ[-n]<ext>
  if (name.size() < stem.size() + 1 + 16 + ext.size()) return std::nullopt;
  if (name.substr(0, stem.size()) != stem || name[stem.size()] != '.') return std::nullopt;
  if (name.substr(name.size() - ext.size()) != ext) return std::nullopt;
  std::string_view mid = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
  std::string_view stamp = mid.substr(0, 16);
  if (!all_digits(stamp.substr(0, 8)) || stamp[8] != 'T' || !all_digits(stamp.substr(9, 6)) ||
      stamp[15] != 'Z')
    return std::nullopt;
  BackupKey key{std::string(stamp), 0};
  std::string_view rest = mid.substr(16);
  if (!rest.empty()) {
    if (rest[0] != '-' || rest.size() > 20 || !all_digits(rest.substr(1))) return std::nullopt;
    auto n = parse_u64(rest.substr(1));
    if (!n) return std::nullopt;
    key.n = *n;
  }
  return key;
}

Result<std::vector<LogFile>> list_log_files(const std::string& path) {
  std::string dir = dir_of(path), base = base_of(path);
  std::vector<std::pair<BackupKey, std::string>> backups;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR) return make_error(Errc::not_found, "no directory {}", dir);
    return make_error(e == EACCES ? Errc::permission : Errc::io, "cannot read {}: {}", dir,
                      errno_text(e));
  }
  while (dirent* e = ::readdir(d)) {
    if (auto key = parse_backup_name(e->d_name, base)) backups.emplace_back(*key, e->d_name);
  }
  ::closedir(d);
  std::sort(backups.begin(), backups.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  std::vector<LogFile> files;
  auto add = [&](std::string p, bool current) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    files.push_back(LogFile{std::move(p), current, st.st_dev, st.st_ino});
  };
  std::string prefix = dir == "/" ? "/" : dir + "/";
  for (auto& [key, name] : backups) add(prefix + name, false);
  add(path, true);
  if (files.empty()) return make_error(Errc::not_found, "no Network Log at {}", path);
  return files;
}

// ---- Reading ----------------------------------------------------------------

void LineParser::bad(std::string_view reason, ReadStats& stats) {
  if (stats.bad_lines++ == 0) stats.first_bad = fmt::format("{}:{}: {}", name_, line_no_, reason);
}

void LineParser::line(std::string_view l, ReadStats& stats, const RowFn& fn) {
  ++line_no_;
  if (is_blank(l)) return;
  if (raw_) {
    static const Row kNone;
    if (fn) fn(kNone, l);
    return;
  }
  auto row = parse_row(l);
  if (!row) {
    bad(row.error().message, stats);
    return;
  }
  ++stats.rows;
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  if (fn) fn(*row, l);
}

void LineParser::feed(std::string_view bytes, ReadStats& stats, const RowFn& fn) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view chunk = bytes.substr(0, nl);
    bytes.remove_prefix(nl == std::string_view::npos ? bytes.size() : nl + 1);
    bool complete = nl != std::string_view::npos;
    if (overlong_) {
      // Skipping the rest of a line already counted as bad.
      if (complete) overlong_ = false;
      continue;
    }
    if (partial_.size() + chunk.size() > kMaxLine) {
      ++line_no_;
      bad(fmt::format("longer than {} bytes", kMaxLine), stats);
      partial_.clear();
      overlong_ = !complete;
      continue;
    }
    if (!complete) {
      partial_.append(chunk);
      break;
    }
    if (partial_.empty()) {
      line(chunk, stats, fn);
    } else {
      partial_.append(chunk);
      std::string whole = std::move(partial_);
      partial_.clear();
      line(whole, stats, fn);
    }
  }
}

void LineParser::finish(ReadStats& stats) {
  if (!partial_.empty() && !is_blank(partial_)) {
    ++line_no_;
    bad("torn line (no newline at the end of the file)", stats);
  }
  partial_.clear();
  overlong_ = false;
}

void LineParser::reset() {
  partial_.clear();
  overlong_ = false;
}

namespace {

// Reads fd to its end, feeding the parser; returns the bytes read.
Result<uint64_t> read_to_end(int fd, const std::string& name, LineParser& parser, ReadStats& stats,
                             const RowFn& fn) {
  static thread_local std::string buf(1 << 16, '\0');
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::io, "cannot read {}: {}", name, errno_text(errno));
    }
    if (n == 0) return total;
    total += static_cast<uint64_t>(n);
    parser.feed(std::string_view(buf.data(), static_cast<size_t>(n)), stats, fn);
  }
}

Error open_error(const std::string& path, int e) {
  if (e == EACCES || e == EPERM)
    return make_error(Errc::permission,
                      "cannot read {}: {} — run fy-netlog as the user that runs fy-proxy", path,
                      errno_text(e));
  if (e == ENOENT || e == ENOTDIR) return make_error(Errc::not_found, "no Network Log at {}", path);
  return make_error(Errc::io, "cannot read {}: {}", path, errno_text(e));
}

}  // namespace

Result<void> Follower::read_whole(const LogFile& f, ReadStats& stats, const RowFn& fn) {
  Fd fd(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return ok();  // pruned by the writer since it was listed
    return open_error(f.path, errno);
  }
  LineParser parser(f.path, raw_);
  stats.files.push_back(f.path);
  auto r = read_to_end(fd.get(), f.path, parser, stats, fn);
  if (!r) return std::move(r).take_error();
  parser.finish(stats);
  return ok();
}

Result<void> Follower::drain(ReadStats& stats, const RowFn& fn) {
  auto n = read_to_end(fd_.get(), path_, *parser_, stats, fn);
  if (!n) return std::move(n).take_error();
  offset_ += *n;
  return ok();
}

Result<void> Follower::poll(ReadStats& stats, const RowFn& fn) {
  if (fd_) {
    struct stat st;
    bool same = ::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
    if (same) {
      if (static_cast<uint64_t>(st.st_size) < offset_) {
        // Truncated in place: start again from its beginning.
        if (::lseek(fd_.get(), 0, SEEK_SET) == 0) {
          offset_ = 0;
          parser_->reset();
        }
      }
      return drain(stats, fn);
    }
    // Rotated (or removed): the name was checked first, so the old file is
    // complete; read its end, then what came after it.
    auto r = drain(stats, fn);
    parser_->finish(stats);
    fd_.reset();
    behind_ = std::make_pair(dev_, ino_);
    if (!r) return r;
  }

  // Open the current file before listing backups: if it is rotated while we
  // read the backups, the next poll sees that by its inode.
  Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  int open_errno = errno;
  struct stat st {};
  if (fd && ::fstat(fd.get(), &st) != 0) {
    open_errno = errno;
    fd.reset();
  }
  if (!fd && open_errno != ENOENT && open_errno != ENOTDIR) return open_error(path_, open_errno);

  if (!started_ || behind_) {
    auto files = list_log_files(path_);
    if (!files && files.error().code != Errc::not_found) return std::move(files).take_error();
    if (files) {
      // Backups to read: all of them on the first poll; after a rotation,
      // those after the file we finished (none if it is gone: pruned or
      // removed, nothing to place us by).
      size_t from = 0;
      if (started_) {
        from = files->size();
        for (size_t i = 0; i < files->size(); ++i)
          if ((*files)[i].dev == behind_->first && (*files)[i].ino == behind_->second) from = i + 1;
      }
      for (size_t i = from; i < files->size(); ++i) {
        const LogFile& f = (*files)[i];
        if (f.current) break;
        if (fd && f.dev == st.st_dev && f.ino == st.st_ino) break;  // rotated just now
        auto r = read_whole(f, stats, fn);
        if (!r) return r;
        behind_ = std::make_pair(f.dev, f.ino);
      }
    }
    if (!started_ && !fd && !files) {
      return make_error(Errc::not_found, "no Network Log at {}", path_);
    }
    started_ = true;
  }
  if (!fd) return ok();  // rotated and not recreated yet: the next poll opens it

  fd_ = std::move(fd);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  offset_ = 0;
  behind_.reset();
  parser_.emplace(path_, raw_);
  stats.files.push_back(path_);
  return drain(stats, fn);
}

void Follower::finish(ReadStats& stats) {
  if (parser_) parser_->finish(stats);
}

Result<void> read_log(const std::string& path, ReadStats& stats, const RowFn& fn) {
  Follower f(path);
  FY_TRY(f.poll(stats, fn));
  f.finish(stats);
  return ok();
}

// ---- Filters ----------------------------------------------------------------

HostKey split_host_key(std::string_view key) {
  HostKey k{key, std::nullopt};
  if (!key.empty() && key[0] == '[') {
    size_t close = key.find(']');
    if (close == std::string_view::npos) return k;
    k.host = key.substr(0, close + 1);
    if (close + 1 < key.size() && key[close + 1] == ':') k.port = parse_port(key.substr(close + 2));
    return k;
  }
  size_t colon = key.rfind(':');
  // One colon only: a bare IPv6 address without brackets is a host.
  if (colon != std::string_view::npos && key.find(':') == colon) {
    if (auto p = parse_port(key.substr(colon + 1))) {
      k.host = key.substr(0, colon);
      k.port = p;
    }
  }
  return k;
}

Result<HostPattern> parse_host_pattern(std::string_view s) {
  HostPattern p;
  if (s == "*") {
    p.any = true;
    return p;
  }
  HostKey k = split_host_key(s);
  if (k.host.size() != s.size() && !k.port)
    return make_error(Errc::invalid_argument, "bad port in host pattern '{}'", s);
  std::string_view h = k.host;
  if (h.rfind("*.", 0) == 0) {
    p.wildcard = true;
    h.remove_prefix(2);
  }
  bool bracketed = !h.empty() && h.front() == '[';
  if (h.empty() || h.find('*') != std::string_view::npos || h.find('/') != std::string_view::npos ||
      (!bracketed && h.find(':') != std::string_view::npos))
    return make_error(Errc::invalid_argument,
                      "bad host pattern '{}': use a host (api.github.com), a wildcard "
                      "(*.github.com) or either with a port (github.com:22)",
                      s);
  p.host = lower_no_dot(h);
  p.port = k.port;
  return p;
}

bool host_matches(const HostPattern& p, std::string_view key) {
  if (p.any) return true;
  HostKey k = split_host_key(key);
  if (p.port) {
    uint16_t want = *p.port;
    if (k.port ? *k.port != want : (want != 443 && want != 80)) return false;
  }
  std::string h = lower_no_dot(k.host);
  if (!p.wildcard) return h == p.host;
  return h.size() > p.host.size() + 1 &&
         h.compare(h.size() - p.host.size(), p.host.size(), p.host) == 0 &&
         h[h.size() - p.host.size() - 1] == '.';
}

Result<std::vector<StatusRange>> parse_status_spec(std::string_view spec) {
  std::vector<StatusRange> out;
  auto bad = [&](std::string_view item) {
    return make_error(Errc::invalid_argument,
                      "bad status '{}': use 403, 4xx, >=500, <400 or 200-299 (comma-separated)",
                      item);
  };
  auto num = [](std::string_view s) -> std::optional<int> {
    auto v = parse_u64(s);
    if (!v || *v > 999 || s.size() > 3) return std::nullopt;
    return static_cast<int>(*v);
  };
  for (std::string_view item : split_list(spec, ',')) {
    StatusRange r;
    if (item.size() == 3 && item[0] >= '0' && item[0] <= '9' &&
        (item[1] == 'x' || item[1] == 'X') && (item[2] == 'x' || item[2] == 'X')) {
      r.lo = (item[0] - '0') * 100;
      r.hi = r.lo + 99;
    } else if (item.rfind(">=", 0) == 0 || item.rfind("<=", 0) == 0) {
      auto v = num(trim_ows(item.substr(2)));
      if (!v) return bad(item);
      r = item[0] == '>' ? StatusRange{*v, 999} : StatusRange{0, *v};
    } else if (item[0] == '>' || item[0] == '<') {
      auto v = num(trim_ows(item.substr(1)));
      if (!v) return bad(item);
      if (item[0] == '>') {
        if (*v >= 999) return bad(item);
        r = {*v + 1, 999};
      } else {
        if (*v == 0) return bad(item);
        r = {0, *v - 1};
      }
    } else if (size_t dash = item.find('-'); dash != std::string_view::npos) {
      auto lo = num(item.substr(0, dash)), hi = num(item.substr(dash + 1));
      if (!lo || !hi || *lo > *hi) return bad(item);
      r = {*lo, *hi};
    } else {
      auto v = num(item);
      if (!v) return bad(item);
      r = {*v, *v};
    }
    out.push_back(r);
  }
  if (out.empty()) return bad(spec);
  return out;
}

Result<int64_t> parse_time_spec(std::string_view s, int64_t now_ms) {
  auto bad = [&] {
    return make_error(Errc::invalid_argument,
                      "bad time '{}': use a duration ago (90s, 10m, 2h, 3d, 1w), 'now', or an "
                      "ISO time (2026-11-29T21:30:00Z, 2026-11-29T21:30, 2026-11-29)",
                      s);
  };
  if (s == "now") return now_ms;
  if (s.size() >= 2 && all_digits(s.substr(0, s.size() - 1))) {
    int64_t unit = 0;
    switch (s.back()) {
      case 's':
        unit = 1000;
        break;
      case 'm':
        unit = 60 * 1000;
        break;
      case 'h':
        unit = 3600 * 1000;
        break;
      case 'd':
        unit = 86400 * 1000;
        break;
      case 'w':
        unit = 7 * 86400 * 1000;
        break;
      default:
        return bad();
    }
    auto n = parse_u64(s.substr(0, s.size() - 1));
    if (!n || *n > uint64_t(INT64_MAX / unit)) return bad();
    int64_t d = static_cast<int64_t>(*n) * unit;
    return now_ms - std::min(d, now_ms);
  }
  if (auto t = parse_iso8601(s)) return *t;
  // No offset: local time, like the times fy-netlog prints.
  // YYYY-MM-DD[(T| )HH:MM[:SS]]
  auto num = [&](size_t pos, size_t n, int* out) {
    if (pos + n > s.size() || !all_digits(s.substr(pos, n))) return false;
    *out = static_cast<int>(*parse_u64(s.substr(pos, n)));
    return true;
  };
  int Y, M, D, h = 0, m = 0, sec = 0;
  if (!num(0, 4, &Y) || s.size() < 10 || s[4] != '-' || !num(5, 2, &M) || s[7] != '-' ||
      !num(8, 2, &D))
    return bad();
  if (s.size() > 10) {
    if ((s[10] != 'T' && s[10] != ' ') || s.size() < 16 || !num(11, 2, &h) || s[13] != ':' ||
        !num(14, 2, &m))
      return bad();
    if (s.size() > 16 && (s.size() != 19 || s[16] != ':' || !num(17, 2, &sec))) return bad();
  }
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return bad();
  tm t{};
  t.tm_year = Y - 1900;
  t.tm_mon = M - 1;
  t.tm_mday = D;
  t.tm_hour = h;
  t.tm_min = m;
  t.tm_sec = sec;
  t.tm_isdst = -1;
  time_t secs = ::mktime(&t);
  if (secs == static_cast<time_t>(-1)) return bad();
  return static_cast<int64_t>(secs) * 1000;
}

bool is_error(const Row& r) {
  return !r.error.empty() || (r.status >= 400 && !is_refusal(r));
}

bool Filter::matches(const Row& r) const {
  if (refusals_only && !is_refusal(r)) return false;
  if (since_ms && r.ts_ms < *since_ms) return false;
  if (until_ms && r.ts_ms > *until_ms) return false;
  if (!hosts.empty() && std::none_of(hosts.begin(), hosts.end(),
                                     [&](const HostPattern& p) { return host_matches(p, r.host); }))
    return false;
  if (!statuses.empty() &&
      std::none_of(statuses.begin(), statuses.end(),
                   [&](const StatusRange& s) { return r.status >= s.lo && r.status <= s.hi; }))
    return false;
  return true;
}

// ---- Summary ----------------------------------------------------------------

namespace {

void add_to(HostSummary& s, const Row& r) {
  // A row flagged both ways was refused: blocked wins.
  if (r.blocked) {
    ++s.requests;
    ++s.blocked;
  } else if (r.would_block) {
    ++s.would_block;
  } else {
    ++s.requests;
  }
  if (is_error(r)) ++s.errors;
  s.bytes_up = sat_add(s.bytes_up, r.bytes_up);
  s.bytes_down = sat_add(s.bytes_down, r.bytes_down);
  if (s.requests + s.would_block == 1) {
    s.first_ms = s.last_ms = r.ts_ms;
  } else {
    s.first_ms = std::min(s.first_ms, r.ts_ms);
    s.last_ms = std::max(s.last_ms, r.ts_ms);
  }
}

}  // namespace

void Summary::add(const Row& r, const std::string& principal) {
  ++rows_;
  std::string key = to_lower(r.host);
  auto [it, fresh] = by_host_.try_emplace(key);
  if (fresh) it->second.host = std::move(key);
  add_to(it->second, r);
  if (!principal.empty()) ++it->second.principals[principal];
  add_to(total_, r);
}

std::vector<HostSummary> Summary::hosts() const {
  std::vector<HostSummary> out;
  out.reserve(by_host_.size());
  for (const auto& [k, s] : by_host_) out.push_back(s);
  std::sort(out.begin(), out.end(), [](const HostSummary& a, const HostSummary& b) {
    return a.last_ms != b.last_ms ? a.last_ms > b.last_ms : a.host < b.host;
  });
  return out;
}

bool is_grantable_key(std::string_view key) {
  if (key.empty() || key.size() > 260) return false;
  HostKey k = split_host_key(key);
  if (k.host.size() != key.size() && !k.port) return false;
  std::string_view h = k.host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
    if (h.empty()) return false;
    for (char c : h)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
            c == ':' || c == '.'))
        return false;
    return true;
  }
  if (h.rfind("*.", 0) == 0) h.remove_prefix(2);
  if (h.empty() || h.front() == '.' || h.front() == '-') return false;
  for (char c : h)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
          c == '-' || c == '_'))
      return false;
  return true;
}

}  // namespace fy::netlog

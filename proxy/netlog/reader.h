// Reading the Network Log back: one row parsed from one line, the log's files
// in time order (dated backups, then the current file), a follower that keeps
// reading across rotations, filters and the per-host summary. Used by
// fy-netlog; the row format is the contract in docs/netlog.md.
//
// The log is written by fy-proxy, but much of what it holds (paths, user
// agents, hosts, error bodies) was chosen by clients: everything here treats a
// line as untrusted bytes. A line that is not a row is skipped and counted,
// never fatal.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/fd.h"
#include "core/result.h"
#include "proxy/netlog/row.h"

namespace fy::netlog {

// Lines longer than this are not rows (the longest row the writer can produce
// is a few KiB); they are skipped and counted without being buffered whole.
inline constexpr size_t kMaxLine = 1 << 20;

// Parses one line (without its '\n'; a trailing '\r' is tolerated). `ts`,
// `host` (non-empty) and `status` (0..999) are required; every other field
// may be absent. A field present with the wrong type or an impossible value
// makes the whole line bad: a reader cannot tell which of its fields to
// believe. Unknown fields are ignored (newer writers may add some). The error
// message says what is wrong, for the operator. Never throws.
Result<Row> parse_row(std::string_view line);

// True for a line made only of whitespace: not a row, not counted as bad.
bool is_blank(std::string_view line);

// ---- Files ----------------------------------------------------------------

// The proxy's default: $XDG_STATE_HOME/foldyard/egress/logs/egress.jsonl, with
// XDG_STATE_HOME defaulting to ~/.local/state.
std::string default_log_path();

// The operator's argument: an existing directory means <dir>/egress.jsonl;
// anything else is the log file's path.
std::string resolve_log_path(const std::string& arg);

// A dated backup's place in time: the rotation stamp (YYYYmmddTHHMMSSZ) and
// the suffix the writer adds for a second rotation within one second.
struct BackupKey {
  std::string stamp;
  uint64_t n = 0;  // egress.<stamp>-<n>.jsonl; 0 without a suffix
  friend bool operator<(const BackupKey& a, const BackupKey& b) {
    return a.stamp != b.stamp ? a.stamp < b.stamp : a.n < b.n;
  }
};

// Recognises `name` as a dated backup of the log whose file name is `base`
// ("egress.jsonl" -> "egress.20261129T213000Z.jsonl", "...Z-2.jsonl").
std::optional<BackupKey> parse_backup_name(std::string_view name, std::string_view base);

struct LogFile {
  std::string path;
  bool current = false;  // the live file (not a backup)
  dev_t dev = 0;
  ino_t ino = 0;
};

// The log's files, oldest first: the dated backups beside `path`, then `path`
// itself when it exists. Errc::not_found when neither the file nor a backup
// exists; Errc::permission / Errc::io when the directory cannot be read.
Result<std::vector<LogFile>> list_log_files(const std::string& path);

// ---- Reading ---------------------------------------------------------------

// What reading found, for the operator's "skipped N bad lines" note.
struct ReadStats {
  uint64_t rows = 0;               // lines that were rows
  uint64_t bad_lines = 0;          // lines that were not (garbage, torn, wrong-typed, overlong)
  std::string first_bad;           // "<file>:<line>: <reason>" of the first bad line
  std::vector<std::string> files;  // every file read, in order
};

// Called for each row read, with the line it came from (valid JSON, no '\n').
using RowFn = std::function<void(const Row& row, std::string_view line)>;

// Splits one file's bytes into lines and parses them. A partial last line is
// kept until more bytes arrive, or counted as torn by finish().
class LineParser {
 public:
  // `raw`: every complete non-blank line goes to the callback unparsed (with
  // an empty Row), for files of another format read the same way (engine.jsonl).
  explicit LineParser(std::string name, bool raw = false) : name_(std::move(name)), raw_(raw) {}
  void feed(std::string_view bytes, ReadStats& stats, const RowFn& fn);
  // The file ended for good (read once, or rotated away): a pending partial
  // line is a torn row.
  void finish(ReadStats& stats);
  // Forgets a pending partial line (the file was truncated under us).
  void reset();
  bool has_partial() const { return !partial_.empty() || overlong_; }

 private:
  void line(std::string_view l, ReadStats& stats, const RowFn& fn);
  void bad(std::string_view reason, ReadStats& stats);
  std::string name_;
  std::string partial_;
  bool raw_ = false;
  bool overlong_ = false;  // discarding the rest of a line past kMaxLine
  uint64_t line_no_ = 0;
};

// Reads the Network Log at `path` and keeps reading as it grows, across
// rotations (tail -F semantics). The first poll() reads every backup and the
// current file; later polls read what was appended since, including the end of
// a file that was rotated away and any backup written in between, so no row is
// read twice or skipped while at most `backups` rotations happen between two
// polls. Identity is the file's (device, inode), not its name.
class Follower {
 public:
  // `raw`: lines are handed over unparsed (LineParser's `raw`); fy-netlog
  // --follow reads engine.jsonl so.
  explicit Follower(std::string path, bool raw = false) : path_(std::move(path)), raw_(raw) {}
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  // Reads what is new. Errc::not_found when nothing exists yet (the caller
  // may poll again: the log appears with the proxy's first row); other errors
  // (permission, I/O) are worth reporting.
  Result<void> poll(ReadStats& stats, const RowFn& fn);
  // Ends a one-shot read: a partial last line of the current file is torn.
  void finish(ReadStats& stats);
  const std::string& path() const { return path_; }

 private:
  Result<void> read_whole(const LogFile& f, ReadStats& stats, const RowFn& fn);
  Result<void> drain(ReadStats& stats, const RowFn& fn);
  std::string path_;
  bool raw_ = false;
  bool started_ = false;
  Fd fd_;  // the current file as last opened; kept open across a rename
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint64_t offset_ = 0;
  std::optional<LineParser> parser_;
  // The last file read to its end after it was rotated away, while the new
  // current file could not be opened yet: backups after it still need reading.
  std::optional<std::pair<dev_t, ino_t>> behind_;
};

// Reads the whole log once (backups, then the current file; a torn last line
// counted). Errors as Follower::poll.
Result<void> read_log(const std::string& path, ReadStats& stats, const RowFn& fn);

// ---- Filters ---------------------------------------------------------------

// A --host pattern: an exact host (case-insensitive, trailing dot ignored) or
// `*.suffix` (subdomains at any depth, not the bare domain), with an optional
// port. Without a port it matches the host on any port; with one it matches
// that port only, where :443 and :80 also match a key written without a port
// (the log omits the default port). `*` alone matches every host.
struct HostPattern {
  std::string host;  // lower case, without the "*." of a wildcard
  bool wildcard = false;
  bool any = false;
  std::optional<uint16_t> port;
};
Result<HostPattern> parse_host_pattern(std::string_view s);
bool host_matches(const HostPattern& p, std::string_view key);

// Splits a log key ("h", "h:p", "[v6]", "[v6]:p") into host and port.
struct HostKey {
  std::string_view host;
  std::optional<uint16_t> port;
};
HostKey split_host_key(std::string_view key);

// A --status spec: comma-separated items, each `403`, `4xx`, `>=500`, `>499`,
// `<=399`, `<400` or `200-299`. Status 0 is a tunnel or would_block row.
struct StatusRange {
  int lo = 0;
  int hi = 0;  // inclusive
};
Result<std::vector<StatusRange>> parse_status_spec(std::string_view s);

// A --since/--until time: relative to `now_ms` (`90s`, `10m`, `2h`, `3d`,
// `1w`: that long ago; `now`), ISO 8601 with an offset
// (`2026-11-29T21:30:00Z`), or without one (`2026-11-29T21:30`, `2026-11-29`):
// local time, as the times fy-netlog prints.
Result<int64_t> parse_time_spec(std::string_view s, int64_t now_ms);

struct Filter {
  std::vector<HostPattern> hosts;     // any of them (none: every host)
  std::vector<StatusRange> statuses;  // any of them (none: every status)
  std::optional<int64_t> since_ms;    // ts >= since
  std::optional<int64_t> until_ms;    // ts <= until
  bool refusals_only = false;         // blocked or would_block rows
  bool matches(const Row& row) const;
};

// A refusal: the allowlist refused the row (blocked) or would have (would_block).
inline bool is_refusal(const Row& r) {
  return r.blocked || r.would_block;
}
// An error: an upstream failure (`error`) or a status >= 400 on a row that is
// not a refusal (refusals are counted as such, not twice).
bool is_error(const Row& r);

// ---- Summary ---------------------------------------------------------------

struct HostSummary {
  std::string host;          // the log key, lower case
  uint64_t requests = 0;     // rows other than would_block observations
  uint64_t blocked = 0;      // refused by the allowlist (part of requests)
  uint64_t would_block = 0;  // observe/learn: would have been refused
  uint64_t errors = 0;       // see is_error()
  uint64_t bytes_up = 0;     // saturating sums
  uint64_t bytes_down = 0;
  int64_t first_ms = 0;
  int64_t last_ms = 0;
  // Who made the rows (Principal::label(), resolved from engine snapshots),
  // with counts; empty when fy-netlog had no snapshots to resolve with.
  std::map<std::string, uint64_t> principals;
};

class Summary {
 public:
  // `principal`: the row's resolved principal, "" when not resolved at all.
  void add(const Row& row, const std::string& principal = {});
  // Hosts, most recently seen first (ties by name).
  std::vector<HostSummary> hosts() const;
  // Every host added up (host is empty).
  const HostSummary& total() const { return total_; }
  uint64_t rows() const { return rows_; }

 private:
  std::unordered_map<std::string, HostSummary> by_host_;
  HostSummary total_;
  uint64_t rows_ = 0;
};

// A refusal key an operator can grant with `fy allow add <key>`: a host name,
// `*.suffix`, an IP literal or `[v6]`, with an optional port. Anything else
// (the key came from a client) is never printed as a command to run.
bool is_grantable_key(std::string_view key);

}  // namespace fy::netlog

// fy-netlog's views: the per-host summary, one line per row, the refusals
// and how to grant them, and the summary as JSON. Every line fits the given
// width (display columns, not bytes), and every string from the log is made
// safe for a terminal first: control characters, bidi overrides and
// invisible characters come out as visible escapes (`\x1b`, `\u202e`), so a
// client cannot draw on the operator's terminal or disguise a host.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/netlog/reader.h"
#include "proxy/netlog/snapshot.h"

namespace fy::netlog {

struct ViewOptions {
  int width = 80;      // display columns; clamped to kMinWidth..kMaxWidth
  int64_t now_ms = 0;  // for "5m ago"
  bool utc = false;    // times in UTC instead of local time
  // Engine snapshots to name principals with; null or empty: the stamps are
  // shown as they are (docs/fy-netlog.md).
  const Resolver* resolver = nullptr;
  bool resolving() const { return resolver && resolver->snapshots() > 0; }
};
inline constexpr int kMinWidth = 64;  // the summary needs 51 columns beside the host
inline constexpr int kMaxWidth = 1000;

// ---- Text helpers (exposed for tests and the fuzz target) --------------------

// Escapes what a terminal must not see raw; the result is valid UTF-8.
std::string sanitize(std::string_view s);
// Columns that sanitized text takes (East Asian wide = 2, combining = 0).
size_t display_width(std::string_view s);
// Cuts sanitized text to `w` columns, marking a cut with "…" at the end.
std::string fit_end(std::string_view s, size_t w);
// Cuts sanitized text to `w` columns keeping both ends ("build-cache…example.com:8443"):
// for hosts, whose start and end both tell them apart.
std::string fit_middle(std::string_view s, size_t w);
// 512B, 1.2K, 45M, 2.0G (binary units), at most 5 columns.
std::string human_bytes(uint64_t n);
// A count in at most `w` columns (1234567 -> 1.2M when it does not fit).
std::string compact_count(uint64_t n, size_t w);
// "now", "42s ago", "5m ago", "3h ago", "12d ago".
std::string format_age(int64_t ts_ms, int64_t now_ms);
// HH:MM:SS on the day of now_ms, else MM-DD HH:MM, or YYYY-MM-DD in another year.
std::string format_stamp(int64_t ts_ms, const ViewOptions& o);
// The stamp fields for display: "ctr:3f2a9c1b7d0e podman1 10.89.1.2",
// "unattributed", or "-" when the proxy has no stamp key.
std::string who_of(const Row& r);
// Who made the row: its resolved principal's label when resolving and the
// stamp resolved ("svc:shop/web", "ctr:web", "build:…", "user"), else who_of().
std::string principal_of(const Row& r, const ViewOptions& o);

// ---- Views ---------------------------------------------------------------------

// The summary table with a footer; `hosts` as Summary::hosts() returns them.
std::string render_summary(const std::vector<HostSummary>& hosts, const HostSummary& total,
                           const ViewOptions& o);

// The summary as one JSON document (times in UTC ISO 8601).
std::string summary_json(const std::vector<HostSummary>& hosts, const HostSummary& total,
                         const ReadStats& stats, const std::string& log_path);

// Streams a table of rows (the `rows` and `refusals` views): a header once,
// a "-- 2026-11-29 Sun --" line whenever the day changes, one line per row.
class RowPrinter {
 public:
  enum class Kind { rows, refusals };
  RowPrinter(Kind kind, ViewOptions o);
  // The lines for one row (a header or date line may come first).
  std::string line(const Row& r);

 private:
  std::string row_line(const Row& r) const;
  std::string refusal_line(const Row& r) const;
  Kind kind_;
  ViewOptions o_;
  bool header_done_ = false;
  std::string day_;
};

// The label a JSON view names a principal by: its label(), except that an
// unresolved stamp is told apart by its address ("unresolved 10.89.0.3@podman1").
std::string json_label(const Row& r, const Principal& p);

// A `refusals --json` line: the row's line as the log has it (every field
// kept as it is) with `asked_by` added, the principal as `--by principal
// --json` writes one. One line, with '\n'.
std::string refusal_json(std::string_view line, const Row& r, const Principal& p);

// Collects refusals by key and prints how to grant them; when resolving,
// each grant says which principals asked and with which User-Agents.
class Grants {
 public:
  // `principal`: who asked as the text shows it ("" when not resolving);
  // `p`: the resolved principal, for json() (null: json() lists nobody).
  void add(const Row& r, const std::string& principal = {}, const Principal* p = nullptr);
  bool empty() const { return by_key_.empty(); }
  std::string render(const ViewOptions& o) const;
  // The same list as one JSON line, `{"grants": [...]}`, most recent first:
  // per key its host, the command (null when no safe command exists), the
  // counts, the last time, and who asked with counts and User-Agents.
  std::string json() const;

 private:
  struct Tally {
    uint64_t blocked = 0;
    uint64_t would_block = 0;
    int64_t last_ms = 0;
    bool build = false;
    std::map<std::string, std::map<std::string, uint64_t>> asked;  // principal -> ua -> n
    // json(): by json_label, the principal and its ua -> n.
    std::map<std::string, std::pair<Principal, std::map<std::string, uint64_t>>> asked_json;
  };
  // The keys, the most recent first, each with its command ("" when none is safe).
  std::vector<std::pair<const std::string*, const Tally*>> ordered() const;
  static std::string command(const std::string& key, const Tally& t);
  std::map<std::string, Tally> by_key_;
};

// `--by principal`: per principal, the hosts it used.
class PrincipalView {
 public:
  void add(const Row& r, const Principal& p);
  std::string render(const ViewOptions& o) const;
  std::string json() const;

 private:
  struct Tally {
    Principal p;
    uint64_t requests = 0, blocked = 0, would_block = 0;
    int64_t last_ms = 0;
    std::map<std::string, uint64_t> hosts;
  };
  std::map<std::string, Tally> by_label_;
};

// `credentials`: per injection rule, the principals it was injected for
// (rows with `injected`), with hosts and counts, over the filtered time range.
class CredentialsView {
 public:
  void add(const Row& r, const Principal& p);
  std::string render(const ViewOptions& o) const;
  std::string json() const;

 private:
  struct Use {
    uint64_t n = 0;
    int64_t first_ms = 0, last_ms = 0;
    std::map<std::string, uint64_t> hosts;
    bool claim = false;
    std::string reason;
  };
  std::map<std::string, std::map<std::string, Use>> by_rule_;  // rule -> principal -> use
};

}  // namespace fy::netlog

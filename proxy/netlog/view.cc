#include "proxy/netlog/view.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/text.h"
#include "proxy/netlog/error_kind.h"

namespace fy::netlog {
namespace {

// Decodes one code point at s[i]; an invalid byte is U+FFFD of length 1.
char32_t next_cp(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = s.size() - i;
  auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c >= 0xC2 && c <= 0xDF && n >= 2 && cont(i + 1)) {
    char32_t cp = ((c & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu);
    i += 2;
    return cp;
  }
  if (c >= 0xE0 && c <= 0xEF && n >= 3 && cont(i + 1) && cont(i + 2)) {
    char32_t cp = ((c & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      i += 3;
      return cp;
    }
  }
  if (c >= 0xF0 && c <= 0xF4 && n >= 4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    char32_t cp = ((c & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) | ((b(i + 2) & 0x3Fu) << 6) |
                  (b(i + 3) & 0x3Fu);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      i += 4;
      return cp;
    }
  }
  ++i;
  return 0xFFFD;
}

void put_cp(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Controls, bidi formatting, invisible and line-breaking characters: shown as
// escapes so they can neither act on the terminal nor hide in a name.
bool must_escape(char32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xAD || cp == 0x34F || cp == 0x61C ||
         (cp >= 0x115F && cp <= 0x1160) || (cp >= 0x17B4 && cp <= 0x17B5) ||
         (cp >= 0x180B && cp <= 0x180F) || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0x3164 ||
         (cp >= 0xFE00 && cp <= 0xFE0F) || cp == 0xFEFF || cp == 0xFFA0 ||
         (cp >= 0xFFF0 && cp <= 0xFFFB) || (cp >= 0x1D173 && cp <= 0x1D17A) ||
         (cp >= 0xE0000 && cp <= 0xE0FFF);
}

int cp_width(char32_t cp) {
  // Combining marks take no column of their own.
  if ((cp >= 0x300 && cp <= 0x36F) || (cp >= 0x483 && cp <= 0x489) ||
      (cp >= 0x591 && cp <= 0x5BD) || (cp >= 0x610 && cp <= 0x61A) ||
      (cp >= 0x64B && cp <= 0x65F) || (cp >= 0x1AB0 && cp <= 0x1AFF) ||
      (cp >= 0x1DC0 && cp <= 0x1DFF) || (cp >= 0x20D0 && cp <= 0x20FF) ||
      (cp >= 0xFE20 && cp <= 0xFE2F))
    return 0;
  // East Asian Wide and Fullwidth, and the emoji blocks terminals draw wide.
  if ((cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x231A && cp <= 0x231B) ||
      (cp >= 0x2329 && cp <= 0x232A) || (cp >= 0x23E9 && cp <= 0x23EC) ||
      (cp >= 0x25FD && cp <= 0x25FE) || (cp >= 0x2614 && cp <= 0x2615) ||
      (cp >= 0x2648 && cp <= 0x2653) || (cp >= 0x26AA && cp <= 0x26AB) ||
      (cp >= 0x26BD && cp <= 0x26BE) || (cp >= 0x26C4 && cp <= 0x26C5) ||
      (cp >= 0x2705 && cp <= 0x2705) || (cp >= 0x270A && cp <= 0x270B) ||
      (cp >= 0x2753 && cp <= 0x2755) || (cp >= 0x2795 && cp <= 0x2797) ||
      (cp >= 0x2B1B && cp <= 0x2B1C) || (cp >= 0x2E80 && cp <= 0x303E) ||
      (cp >= 0x3041 && cp <= 0x33FF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
      (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xA000 && cp <= 0xA4CF) ||
      (cp >= 0xA960 && cp <= 0xA97F) || (cp >= 0xAC00 && cp <= 0xD7A3) ||
      (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFE10 && cp <= 0xFE19) ||
      (cp >= 0xFE30 && cp <= 0xFE6F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
      (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x16FE0 && cp <= 0x18AFF) ||
      (cp >= 0x1B000 && cp <= 0x1B2FF) || (cp >= 0x1F004 && cp <= 0x1F004) ||
      (cp >= 0x1F0CF && cp <= 0x1F0CF) || (cp >= 0x1F18E && cp <= 0x1F18E) ||
      (cp >= 0x1F191 && cp <= 0x1F19A) || (cp >= 0x1F200 && cp <= 0x1F251) ||
      (cp >= 0x1F300 && cp <= 0x1F64F) || (cp >= 0x1F680 && cp <= 0x1F6FF) ||
      (cp >= 0x1F900 && cp <= 0x1F9FF) || (cp >= 0x1FA70 && cp <= 0x1FAFF) ||
      (cp >= 0x20000 && cp <= 0x3FFFD))
    return 2;
  return 1;
}

std::string pad_right(std::string s, size_t w) {
  size_t dw = display_width(s);
  if (dw < w) s.append(w - dw, ' ');
  return s;
}

std::string pad_left(const std::string& s, size_t w) {
  size_t dw = display_width(s);
  return dw < w ? std::string(w - dw, ' ') + s : s;
}

// Sanitized and cut to `w` columns, then padded to exactly `w`.
std::string cell(std::string_view raw, size_t w, bool middle = false) {
  std::string s = sanitize(raw);
  return pad_right(middle ? fit_middle(s, w) : fit_end(s, w), w);
}

tm to_tm(int64_t ts_ms, bool utc) {
  time_t secs = static_cast<time_t>(ts_ms / 1000);
  if (ts_ms < 0 && ts_ms % 1000 != 0) --secs;
  tm t{};
  if (utc)
    gmtime_r(&secs, &t);
  else
    localtime_r(&secs, &t);
  return t;
}

const char* kWeekdays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};

std::string day_line(const tm& t) {
  return fmt::format("-- {:04}-{:02}-{:02} {} --", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                     kWeekdays[t.tm_wday % 7]);
}

std::string day_key(const tm& t) {
  return fmt::format("{:04}-{:02}-{:02}", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday);
}

std::string hms(const tm& t) {
  return fmt::format("{:02}:{:02}:{:02}", t.tm_hour, t.tm_min, t.tm_sec);
}

// The error kind of a failure row, for its flags: "dns" from "dns: NXDOMAIN"
// (the kinds: error_kind.h), "client" for a client-side failure. An error
// that names no kind of the table (a row of another writer) shows its first
// word, at most 12 characters.
std::string_view error_kind(std::string_view e) {
  if (e.starts_with(kClientPrefix)) return "client";
  if (auto k = parse_error_kind(e)) return error_kind_name(*k);
  size_t colon = e.find(':');
  return e.substr(0, std::min<size_t>(colon == std::string_view::npos ? e.size() : colon, 12));
}

std::string flags_of(const Row& r) {
  std::vector<std::string> f;
  if (r.blocked) f.emplace_back("BLOCKED");
  if (r.would_block) f.emplace_back("would-block");
  if (r.passthrough) f.emplace_back("tunnel");
  if (r.injected) f.emplace_back("inj");
  if (r.replayed) f.emplace_back("+replay");
  if (r.build) f.emplace_back("build");
  if (!r.held.empty()) f.emplace_back("held:" + std::string(r.held.substr(0, 16)));
  if (r.mint_failed) f.emplace_back("mint-failed");
  if (r.overlap) f.emplace_back("overlap");
  if (!r.error.empty()) f.emplace_back("err:" + std::string(error_kind(r.error)));
  std::string out;
  for (const auto& s : f) {
    if (!out.empty()) out += ' ';
    out += s;
  }
  return sanitize(out);
}

int clamp_width(int w) {
  return std::clamp(w, kMinWidth, kMaxWidth);
}

std::string iso_or_null(int64_t ms) {
  return iso8601_utc(ms, /*millis=*/true, /*z_suffix=*/true);
}

}  // namespace

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp = next_cp(s, i);
    if (!must_escape(cp)) {
      put_cp(out, cp);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    }
  }
  return out;
}

size_t display_width(std::string_view s) {
  size_t w = 0, i = 0;
  while (i < s.size()) w += static_cast<size_t>(cp_width(next_cp(s, i)));
  return w;
}

std::string fit_end(std::string_view s, size_t w) {
  if (display_width(s) <= w) return std::string(s);
  if (w == 0) return "";
  std::string out;
  size_t used = 0, i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t cp = next_cp(s, i);
    size_t cw = static_cast<size_t>(cp_width(cp));
    if (used + cw > w - 1) break;
    used += cw;
    out.append(s.substr(start, i - start));
  }
  return out + "…";
}

std::string fit_middle(std::string_view s, size_t w) {
  if (display_width(s) <= w) return std::string(s);
  if (w < 5) return fit_end(s, w);
  // Decode once; keep about a third from the front and the rest from the end.
  std::vector<std::pair<std::string_view, size_t>> cps;  // (bytes, width)
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t cp = next_cp(s, i);
    cps.emplace_back(s.substr(start, i - start), static_cast<size_t>(cp_width(cp)));
  }
  size_t budget = w - 1, head_w = budget / 3, tail_w = budget - head_w;
  std::string head, tail;
  size_t used = 0, h = 0;
  for (; h < cps.size() && used + cps[h].second <= head_w; ++h) {
    used += cps[h].second;
    head.append(cps[h].first);
  }
  used = 0;
  size_t t = cps.size();
  while (t > h && used + cps[t - 1].second <= tail_w) {
    --t;
    used += cps[t].second;
  }
  for (size_t k = t; k < cps.size(); ++k) tail.append(cps[k].first);
  return head + "…" + tail;
}

std::string human_bytes(uint64_t n) {
  if (n < 1024) return fmt::format("{}B", n);
  const char* units = "KMGTPE";
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (v < 9.95) return fmt::format("{:.1f}{}", v, units[u]);
  if (v < 1023.5 || u == 5) return fmt::format("{:.0f}{}", v, units[u]);
  return fmt::format("1.0{}", units[u + 1]);
}

std::string compact_count(uint64_t n, size_t w) {
  std::string s = std::to_string(n);
  if (s.size() <= w) return s;
  const char* units = "kMGTPE";
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  s = v < 9.95 ? fmt::format("{:.1f}{}", v, units[u]) : fmt::format("{:.0f}{}", v, units[u]);
  return s.size() <= w ? s : std::string(w, '#');
}

std::string format_age(int64_t ts_ms, int64_t now_ms) {
  int64_t s = (now_ms - ts_ms) / 1000;
  if (s < 1) return "now";
  if (s < 60) return fmt::format("{}s ago", s);
  if (s < 3600) return fmt::format("{}m ago", s / 60);
  if (s < 86400 * 2) return fmt::format("{}h ago", s / 3600);
  if (s < 86400 * 999) return fmt::format("{}d ago", s / 86400);
  return fmt::format("{}y ago", std::min<int64_t>(s / (86400 * 365), 999));
}

std::string format_stamp(int64_t ts_ms, const ViewOptions& o) {
  tm t = to_tm(ts_ms, o.utc), now = to_tm(o.now_ms, o.utc);
  if (t.tm_year == now.tm_year && t.tm_yday == now.tm_yday) return hms(t);
  if (t.tm_year == now.tm_year)
    return fmt::format("{:02}-{:02} {:02}:{:02}", t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min);
  return day_key(t);
}

std::string who_of(const Row& r) {
  switch (r.attribution) {
    case Attribution::none:
      return "-";
    case Attribution::unattributed:
      return "unattributed";
    case Attribution::attributed:
      break;
  }
  std::string who = r.who;
  if (who.rfind("container:", 0) == 0) {
    // A container id is 64 hex digits; 12 tell containers apart, as docker shows them.
    std::string_view id = std::string_view(who).substr(10);
    size_t i = 0;
    for (int n = 0; n < 12 && i < id.size(); ++n) next_cp(id, i);
    who = "ctr:" + std::string(id.substr(0, i));
  }
  std::string out;
  for (const std::string* p : std::array<const std::string*, 3>{&who, &r.net, &r.src}) {
    if (p->empty()) continue;
    if (!out.empty()) out += ' ';
    out += *p;
  }
  return out.empty() ? "attributed" : sanitize(out);
}

std::string principal_of(const Row& r, const ViewOptions& o) {
  if (!o.resolving() || r.attribution != Attribution::attributed) return who_of(r);
  Principal p = o.resolver->resolve(r);
  if (p.kind == Principal::Kind::unresolved) return who_of(r) + " (unresolved)";
  return sanitize(p.label());
}

// ---- Summary ---------------------------------------------------------------------

std::string render_summary(const std::vector<HostSummary>& hosts, const HostSummary& total,
                           const ViewOptions& opt) {
  const size_t width = static_cast<size_t>(clamp_width(opt.width));
  struct Col {
    const char* name;
    size_t w;
  };
  static const Col cols[] = {{"REQS", 6}, {"BLOCK", 6}, {"WOULD", 6}, {"ERR", 6},
                             {"UP", 6},   {"DOWN", 6},  {"LAST", 8}};
  size_t fixed = 0;
  for (const Col& c : cols) fixed += 1 + c.w;
  const size_t host_w = width - fixed;
  std::string out = pad_right("HOST", host_w);
  for (const Col& c : cols) out += ' ' + pad_left(c.name, c.w);
  out += '\n';
  for (const HostSummary& h : hosts) {
    out += cell(h.host, host_w, /*middle=*/true);
    const std::string vals[] = {compact_count(h.requests, 6),     compact_count(h.blocked, 6),
                                compact_count(h.would_block, 6),  compact_count(h.errors, 6),
                                human_bytes(h.bytes_up),          human_bytes(h.bytes_down),
                                format_age(h.last_ms, opt.now_ms)};
    for (size_t i = 0; i < std::size(cols); ++i) out += ' ' + pad_left(vals[i], cols[i].w);
    out += '\n';
    if (!h.principals.empty()) {
      // Who used it, the most rows first: "  by svc:shop/web 12, ctr:db 3, unattributed 1".
      std::vector<std::pair<std::string, uint64_t>> ps(h.principals.begin(), h.principals.end());
      std::stable_sort(ps.begin(), ps.end(),
                       [](const auto& a, const auto& b) { return a.second > b.second; });
      std::string by = "  by ";
      for (size_t i = 0; i < ps.size(); ++i)
        by += (i ? ", " : "") + sanitize(ps[i].first) + " " + std::to_string(ps[i].second);
      out += fit_end(by, width) + '\n';
    }
  }
  // Footer: what was counted, over what time, and where to look next.
  uint64_t rows = total.requests + total.would_block;
  std::vector<std::string> lines;
  if (rows == 0) {
    lines.push_back("no rows");
  } else {
    lines.push_back(fmt::format("{} host{}, {} row{}, {} up, {} down", hosts.size(),
                                hosts.size() == 1 ? "" : "s", rows, rows == 1 ? "" : "s",
                                human_bytes(total.bytes_up), human_bytes(total.bytes_down)));
    auto full = [&](int64_t ms) {
      tm t = to_tm(ms, opt.utc);
      return fmt::format("{} {:02}:{:02}", day_key(t), t.tm_hour, t.tm_min);
    };
    lines.push_back(fmt::format("from {} to {} ({})", full(total.first_ms), full(total.last_ms),
                                opt.utc ? "UTC" : "local time"));
    if (total.blocked + total.would_block > 0)
      lines.push_back(fmt::format("{} blocked, {} would-block: see `fy-netlog refusals`",
                                  total.blocked, total.would_block));
  }
  out += '\n';
  for (const auto& l : lines) out += fit_end(l, width) + '\n';
  return out;
}

std::string summary_json(const std::vector<HostSummary>& hosts, const HostSummary& total,
                         const ReadStats& stats, const std::string& log_path) {
  using Json = nlohmann::ordered_json;
  auto one = [](const HostSummary& h, bool with_host) {
    Json j;
    if (with_host) j["host"] = h.host;
    j["requests"] = h.requests;
    j["blocked"] = h.blocked;
    j["would_block"] = h.would_block;
    j["errors"] = h.errors;
    j["bytes_up"] = h.bytes_up;
    j["bytes_down"] = h.bytes_down;
    bool any = h.requests + h.would_block > 0;
    j["first_seen"] = any ? Json(iso_or_null(h.first_ms)) : Json(nullptr);
    j["last_seen"] = any ? Json(iso_or_null(h.last_ms)) : Json(nullptr);
    if (!h.principals.empty()) {
      Json ps = Json::object();
      for (const auto& [k, n] : h.principals) ps[k] = n;
      j["principals"] = std::move(ps);
    }
    return j;
  };
  Json doc;
  doc["log"] = log_path;
  doc["files"] = stats.files;
  doc["rows_read"] = stats.rows;
  doc["bad_lines"] = stats.bad_lines;
  doc["total"] = one(total, false);
  Json arr = Json::array();
  for (const auto& h : hosts) arr.push_back(one(h, true));
  doc["hosts"] = std::move(arr);
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// ---- Row tables --------------------------------------------------------------------

RowPrinter::RowPrinter(Kind kind, ViewOptions o) : kind_(kind), o_(o) {
  o_.width = clamp_width(o_.width);
}

std::string RowPrinter::line(const Row& r) {
  std::string out;
  const size_t width = static_cast<size_t>(o_.width);
  if (!header_done_) {
    header_done_ = true;
    if (kind_ == Kind::rows) {
      size_t host_w = std::clamp<size_t>((width - 21) * 2 / 5, 16, 48);
      out += fit_end(fmt::format("{:<8} {:>3} {:<7} {} {}", "TIME", "STS", "METHOD",
                                 pad_right("HOST", host_w), "PATH  FLAGS"),
                     width);
    } else {
      size_t from_w = std::clamp<size_t>(width * 3 / 10, 24, 48);
      size_t req_w = width - 8 - 1 - 5 - 1 - 1 - from_w;
      out += fmt::format("{:<8} {:<5} {} {}", "TIME", "KIND", pad_right("REQUEST", req_w), "FROM");
    }
    out += '\n';
  }
  tm t = to_tm(r.ts_ms, o_.utc);
  std::string day = day_key(t);
  if (day != day_) {
    day_ = day;
    out += day_line(t) + '\n';
  }
  out += kind_ == Kind::rows ? row_line(r) : refusal_line(r);
  out += '\n';
  return out;
}

std::string RowPrinter::row_line(const Row& r) const {
  const size_t width = static_cast<size_t>(o_.width);
  size_t host_w = std::clamp<size_t>((width - 21) * 2 / 5, 16, 48);
  std::string status = r.status == 0 ? "-" : std::to_string(r.status);
  std::string out = hms(to_tm(r.ts_ms, o_.utc)) + ' ' + pad_left(status, 3) + ' ' +
                    cell(r.method, 7) + ' ' + cell(r.host, host_w, /*middle=*/true) + ' ';
  size_t rest = width - display_width(out);
  std::string f = flags_of(r);
  // Who made it, when engine snapshots name principals (the stamp alone is in --json).
  if (o_.resolving() && r.attribution == Attribution::attributed)
    f += (f.empty() ? "by:" : " by:") + principal_of(r, o_);
  std::string flags = fit_end(f, rest);
  size_t fw = display_width(flags);
  std::string path = sanitize(r.path);
  if (fw == 0) return out + fit_end(path, rest);
  if (fw + 2 >= rest) return out + flags;
  return out + pad_right(fit_end(path, rest - fw - 2), rest - fw - 2) + "  " + flags;
}

std::string RowPrinter::refusal_line(const Row& r) const {
  const size_t width = static_cast<size_t>(o_.width);
  size_t from_w = std::clamp<size_t>(width * 3 / 10, 24, 48);
  size_t req_w = width - 8 - 1 - 5 - 1 - 1 - from_w;
  std::string req = sanitize(r.method);
  std::string target = sanitize(r.host) + sanitize(r.path);
  if (!req.empty()) req += ' ';
  req += target;
  return hms(to_tm(r.ts_ms, o_.utc)) + ' ' + (r.blocked ? "block" : "would") + ' ' +
         pad_right(fit_end(req, req_w), req_w) + ' ' + fit_end(principal_of(r, o_), from_w);
}

// ---- Principals ------------------------------------------------------------------------

namespace {
std::string kind_name(Principal::Kind k) {
  switch (k) {
    case Principal::Kind::container: return "container";
    case Principal::Kind::build: return "build";
    case Principal::Kind::user: return "user";
    case Principal::Kind::uid: return "uid";
    case Principal::Kind::unresolved: return "unresolved";
    case Principal::Kind::unattributed: return "unattributed";
    case Principal::Kind::none: return "none";
  }
  return "none";
}

nlohmann::ordered_json principal_json(const Principal& p) {
  nlohmann::ordered_json j;
  j["principal"] = p.label();
  j["kind"] = kind_name(p.kind);
  if (!p.id.empty()) j["id"] = p.id;
  if (p.kind == Principal::Kind::container) {
    // Names are what the engine says: the container's creator chose them.
    j["claims"] = {{"name", p.claims.name}, {"project", p.claims.project},
                   {"service", p.claims.service}};
    j["basis"] = p.claim ? "engine_claim" : "stamp_only";
  }
  if (!p.reason.empty()) j["reason"] = p.reason;
  return j;
}

std::string top_hosts(const std::map<std::string, uint64_t>& hosts) {
  std::vector<std::pair<std::string, uint64_t>> hs(hosts.begin(), hosts.end());
  std::stable_sort(hs.begin(), hs.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (size_t i = 0; i < hs.size(); ++i)
    out += (i ? ", " : "") + sanitize(hs[i].first) + " " + std::to_string(hs[i].second);
  return out;
}
}  // namespace

// ---- Grants ---------------------------------------------------------------------------

std::string json_label(const Row& r, const Principal& p) {
  if (p.kind == Principal::Kind::unresolved) return "unresolved " + r.src + "@" + r.net;
  return p.label();
}

std::string refusal_json(std::string_view line, const Row& r, const Principal& p) {
  auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  // The reader took it for a row, so it is an object; anything else is left as it is.
  if (!j.is_object()) return std::string(line) + "\n";
  auto who = principal_json(p);
  who["principal"] = json_label(r, p);
  j["asked_by"] = std::move(who);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

void Grants::add(const Row& r, const std::string& principal, const Principal* p) {
  if (!is_refusal(r)) return;
  Tally& t = by_key_[to_lower(r.host)];
  if (!principal.empty()) ++t.asked[principal][r.ua];
  if (p) {
    auto& [who, uas] = t.asked_json[json_label(r, *p)];
    if (uas.empty()) who = *p;
    ++uas[r.ua];
  }
  if (r.blocked)
    ++t.blocked;
  else
    ++t.would_block;
  t.last_ms = std::max(t.last_ms, r.ts_ms);
  t.build = t.build || r.build;
}

std::vector<std::pair<const std::string*, const Grants::Tally*>> Grants::ordered() const {
  std::vector<std::pair<const std::string*, const Tally*>> keys;
  for (const auto& [key, t] : by_key_) keys.emplace_back(&key, &t);
  std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) {
    return a.second->last_ms > b.second->last_ms;
  });
  return keys;
}

std::string Grants::command(const std::string& key, const Tally& t) {
  if (!is_grantable_key(key)) return {};
  return "fy allow add " + key + (t.build ? " --build" : "");
}

std::string Grants::render(const ViewOptions& o) const {
  const size_t width = static_cast<size_t>(clamp_width(o.width));
  auto keys = ordered();
  std::string out = "\nTo grant, run on this computer (not in the box):\n";
  size_t cmd_w = 0;
  std::vector<std::string> cmds;
  for (const auto& [key, t] : keys) {
    std::string cmd = command(*key, *t);
    cmds.push_back(cmd);
    // Long commands do not widen the column for the others.
    if (display_width(cmd) <= width * 5 / 8) cmd_w = std::max(cmd_w, display_width(cmd));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = *keys[i].first;
    const Tally& t = *keys[i].second;
    std::string what;
    if (t.blocked) what = fmt::format("{} blocked", t.blocked);
    if (t.would_block)
      what += fmt::format("{}{} would-block", what.empty() ? "" : ", ", t.would_block);
    what += ", last " + format_stamp(t.last_ms, o);
    if (cmds[i].empty()) {
      out += fit_end("  (not a host `fy allow` accepts: " + sanitize(key) + ")  " + what, width);
    } else {
      // A command is never cut: it is what the operator copies. The comment
      // after it is cut, or left out when the command alone fills the line.
      std::string cmd = "  " + cmds[i];
      std::string l = "  " + pad_right(cmds[i], cmd_w) + "  # " + what;
      if (display_width(l) <= width)
        out += l;
      else if (display_width(cmd) + 8 <= width)
        out += fit_end(l, width);
      else
        out += cmd;
    }
    out += '\n';
    if (!t.asked.empty()) {
      // Who asked, and with which tools (User-Agent; "no User-Agent" when none was sent).
      std::string l = "      asked by ";
      bool first = true;
      for (const auto& [who, uas] : t.asked) {
        uint64_t n = 0;
        std::string tools;
        for (const auto& [ua, k] : uas) {
          n += k;
          if (!tools.empty()) tools += ", ";
          tools += ua.empty() ? "no User-Agent" : sanitize(ua);
        }
        l += (first ? "" : "; ") + sanitize(who) + " " + std::to_string(n) + "x (" + tools + ")";
        first = false;
      }
      out += fit_end(l, width) + '\n';
    }
  }
  return out;
}

std::string Grants::json() const {
  using Json = nlohmann::ordered_json;
  Json arr = Json::array();
  for (const auto& [key, t] : ordered()) {
    Json g;
    g["host"] = *key;
    std::string cmd = command(*key, *t);
    g["command"] = cmd.empty() ? Json(nullptr) : Json(cmd);
    g["blocked"] = t->blocked;
    g["would_block"] = t->would_block;
    g["build"] = t->build;
    g["last_seen"] = iso_or_null(t->last_ms);
    Json asked = Json::array();
    for (const auto& [label, e] : t->asked_json) {
      const auto& [p, uas] = e;
      Json who = principal_json(p);
      who["principal"] = label;
      uint64_t n = 0;
      Json tools = Json::array();
      for (const auto& [ua, k] : uas) {
        n += k;
        tools.push_back({{"user_agent", ua.empty() ? Json(nullptr) : Json(ua)}, {"requests", k}});
      }
      who["requests"] = n;
      who["user_agents"] = std::move(tools);
      asked.push_back(std::move(who));
    }
    g["asked_by"] = std::move(asked);
    arr.push_back(std::move(g));
  }
  Json doc;
  doc["grants"] = std::move(arr);
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

void PrincipalView::add(const Row& r, const Principal& p) {
  std::string label = json_label(r, p);
  Tally& t = by_label_[label];
  if (t.requests + t.would_block == 0) t.p = p;
  if (r.would_block && !r.blocked)
    ++t.would_block;
  else
    ++t.requests;
  if (r.blocked) ++t.blocked;
  t.last_ms = std::max(t.last_ms, r.ts_ms);
  ++t.hosts[to_lower(r.host)];
}

std::string PrincipalView::render(const ViewOptions& o) const {
  const size_t width = static_cast<size_t>(clamp_width(o.width));
  const size_t pw = std::clamp<size_t>(width * 3 / 10, 20, 40);
  std::vector<const std::pair<const std::string, Tally>*> ps;
  for (const auto& e : by_label_) ps.push_back(&e);
  std::stable_sort(ps.begin(), ps.end(), [](auto a, auto b) { return a->second.last_ms > b->second.last_ms; });
  std::string out = pad_right("PRINCIPAL", pw) + "   REQS  BLOCK  WOULD  HOSTS\n";
  bool claims = false;
  for (auto e : ps) {
    const Tally& t = e->second;
    claims = claims || t.p.claim;
    std::string l = cell(e->first, pw) + ' ' + pad_left(compact_count(t.requests, 6), 6) + ' ' +
                    pad_left(compact_count(t.blocked, 6), 6) + ' ' +
                    pad_left(compact_count(t.would_block, 6), 6) + "  " + top_hosts(t.hosts);
    out += fit_end(l, width) + '\n';
    if (!t.p.reason.empty()) out += fit_end("    " + sanitize(t.p.reason), width) + '\n';
  }
  if (ps.empty()) out += "no rows\n";
  if (claims)
    out += '\n' + fit_end("names are the engine's claims (chosen by whoever created the container)", width) + '\n';
  return out;
}

std::string PrincipalView::json() const {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& [label, t] : by_label_) {
    auto j = principal_json(t.p);
    j["principal"] = label;
    j["requests"] = t.requests;
    j["blocked"] = t.blocked;
    j["would_block"] = t.would_block;
    j["last_seen"] = iso_or_null(t.last_ms);
    j["hosts"] = t.hosts;
    arr.push_back(std::move(j));
  }
  nlohmann::ordered_json doc;
  doc["principals"] = std::move(arr);
  return doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

void CredentialsView::add(const Row& r, const Principal& p) {
  if (!r.injected) return;
  std::string label = json_label(r, p);
  Use& u = by_rule_[r.rule.empty() ? std::string("(no rule id)") : r.rule][label];
  if (u.n++ == 0) u.first_ms = r.ts_ms;
  u.first_ms = std::min(u.first_ms, r.ts_ms);
  u.last_ms = std::max(u.last_ms, r.ts_ms);
  ++u.hosts[to_lower(r.host)];
  u.claim = p.claim;
  u.reason = p.reason;
}

std::string CredentialsView::render(const ViewOptions& o) const {
  const size_t width = static_cast<size_t>(clamp_width(o.width));
  if (by_rule_.empty()) return "no injected rows\n";
  std::string out;
  for (const auto& [rule, users] : by_rule_) {
    uint64_t n = 0;
    for (const auto& [_, u] : users) n += u.n;
    out += fit_end(fmt::format("rule {}: injected {} time{} for {} principal{}", sanitize(rule), n,
                               n == 1 ? "" : "s", users.size(), users.size() == 1 ? "" : "s"),
                   width) + '\n';
    for (const auto& [who, u] : users) {
      out += fit_end(fmt::format("  {} {}x, {} to {}: {}", sanitize(who), u.n, format_stamp(u.first_ms, o),
                                 format_stamp(u.last_ms, o), top_hosts(u.hosts)),
                     width) + '\n';
      if (!u.reason.empty()) out += fit_end("      " + sanitize(u.reason), width) + '\n';
    }
  }
  return out;
}

std::string CredentialsView::json() const {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& [rule, users] : by_rule_) {
    nlohmann::ordered_json r;
    r["rule"] = rule;
    nlohmann::ordered_json ps = nlohmann::ordered_json::array();
    for (const auto& [who, u] : users) {
      nlohmann::ordered_json j;
      j["principal"] = who;
      j["injections"] = u.n;
      j["first_seen"] = iso_or_null(u.first_ms);
      j["last_seen"] = iso_or_null(u.last_ms);
      j["hosts"] = u.hosts;
      if (u.claim) j["basis"] = "engine_claim";
      if (!u.reason.empty()) j["reason"] = u.reason;
      ps.push_back(std::move(j));
    }
    r["principals"] = std::move(ps);
    arr.push_back(std::move(r));
  }
  nlohmann::ordered_json doc;
  doc["credentials"] = std::move(arr);
  return doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace fy::netlog

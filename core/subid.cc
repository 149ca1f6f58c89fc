#include "core/subid.h"

#include <fmt/format.h>
#include <pwd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/text.h"

namespace fy::subid {
namespace {

bool c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

// The LOGIN field shown in a message: printable ASCII as is, else escaped.
std::string shown(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '\'')
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out + "'";
}

const char* id_word(Kind k) {
  return k == Kind::uid ? "uid" : "gid";
}

}  // namespace

const char* default_path(Kind k) {
  return k == Kind::uid ? "/etc/subuid" : "/etc/subgid";
}

std::optional<uint64_t> shadow_getulong(std::string_view s) {
  if (s.empty()) return std::nullopt;  // getulong: '\0' == *numstr
  size_t i = 0;
  while (i < s.size() && c_space(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  int base = 10;
  if (i < s.size() && s[i] == '0') {
    // "0x" counts as a prefix only when a hex digit follows; otherwise strtoul
    // reads the "0" and stops at the 'x'.
    if (i + 2 < s.size() && (s[i + 1] == 'x' || s[i + 1] == 'X') && digit_value(s[i + 2]) < 16) {
      base = 16;
      i += 2;
    } else {
      base = 8;
    }
  }
  size_t first = i;
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    int d = digit_value(s[i]);
    if (d >= base) break;
    if (v > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base))
      return std::nullopt;  // ERANGE
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  // No digits: strtoul sets end to the start of the string, which is not its end.
  if (i == first || i != s.size()) return std::nullopt;
  return negative ? (~v + 1) : v;
}

std::optional<Range> granted(uint64_t start, uint64_t count) {
  uint64_t last = start + count - 1;  // modulo 2^64, as find_range computes it
  if (last < start || start > kMaxId) return std::nullopt;
  return Range{static_cast<uint32_t>(start),
               static_cast<uint32_t>(std::min<uint64_t>(last, kMaxId))};
}

std::vector<Range> merged(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi;
  });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && static_cast<uint64_t>(r.lo) <= static_cast<uint64_t>(out.back().hi) + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<Range> uncovered(const std::vector<Range>& want, const std::vector<Range>& have) {
  std::vector<Range> h = merged(have);
  std::vector<Range> out;
  for (const Range& w : merged(want)) {
    uint64_t at = w.lo;  // the first id of w not yet accounted for
    for (const Range& c : h) {
      if (at > w.hi) break;
      if (c.hi < at || c.lo > w.hi) continue;
      if (c.lo > at) out.push_back({static_cast<uint32_t>(at), c.lo - 1});
      at = static_cast<uint64_t>(c.hi) + 1;
    }
    if (at <= w.hi) out.push_back({static_cast<uint32_t>(at), w.hi});
  }
  return out;
}

std::string format_range(const Range& r) {
  return r.lo == r.hi ? std::to_string(r.lo) : fmt::format("{}-{}", r.lo, r.hi);
}

std::string format_ranges(const std::vector<Range>& ranges) {
  std::string out;
  for (const Range& r : ranges) out += (out.empty() ? "" : ", ") + format_range(r);
  return out;
}

Result<Subids> parse(std::string_view text, const Owner& who, const NameToUid& lookup,
                     std::string_view path) {
  Subids out;
  const std::string uid_text = std::to_string(who.uid);
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.find('\0') != std::string_view::npos) {
      return make_error(Errc::parse,
                        "{}:{}: the file holds a NUL byte — newuidmap reads such a file "
                        "unpredictably; rewrite it as text (LOGIN:START:COUNT lines)",
                        path, line_no);
    }
    // commonio: NIS lines are kept unparsed; subordinate_parse: too long.
    if (line.empty() || line[0] == '+' || line[0] == '-' || line.size() >= kMaxLineBytes) continue;
    std::string_view f[3];
    std::string_view rest = line;
    int n = 0;
    bool more = true;
    for (; n < 3 && more; ++n) {
      size_t c = rest.find(':');
      f[n] = rest.substr(0, c);
      more = c != std::string_view::npos;
      if (more) rest.remove_prefix(c + 1);
    }
    if (n != 3 || f[0].empty() || f[1].empty() || f[2].empty()) continue;
    const std::string login(f[0]);
    bool mine = login == who.name || login == uid_text;
    if (!mine && lookup) {
      auto u = lookup(login);
      mine = u && *u == who.uid;
    }
    if (!mine) continue;
    out.keyed_lines.push_back(line_no);
    auto start = shadow_getulong(f[1]);
    auto count = shadow_getulong(f[2]);
    if (!start || !count) {
      out.ignored.push_back(
          fmt::format("{}:{}: START or COUNT is not a number newuidmap reads "
                      "(it ignores the line)",
                      path, line_no));
      continue;
    }
    auto ids = granted(*start, *count);
    if (!ids) {
      out.ignored.push_back(
          fmt::format("{}:{}: {}:{}:{} grants no id (COUNT 0, a range that wraps, or past {})",
                      path, line_no, login, f[1], f[2], kMaxId));
      continue;
    }
    if (ids->lo == 0) {
      return make_error(
          Errc::invalid_argument,
          "{}:{}: the line {} grants {} id 0 (root){} — newuidmap would let the user map root "
          "itself, and root cannot be walled; give the user a range above its own id "
          "(usermod --del-subuids/--add-subuids)",
          path, line_no,
          shown(std::string(f[0]) + ":" + std::string(f[1]) + ":" + std::string(f[2])),
          shown(who.name),
          *count == 0 ? " (shadow reads COUNT 0 at START 0 as every id: the last id wraps)" : "");
    }
    out.grants.push_back(Grant{line_no, login, *start, *count, *ids});
  }
  std::vector<Range> all;
  for (const Grant& g : out.grants) all.push_back(g.ids);
  out.ranges = merged(std::move(all));
  if (out.ranges.size() > kMaxRanges) {
    return make_error(Errc::invalid_argument,
                      "{}: {} has {} separate subordinate ranges, more than the {} the walls "
                      "hold — merge them into fewer lines",
                      path, shown(who.name), out.ranges.size(), kMaxRanges);
  }
  return out;
}

Source parse_nsswitch(std::string_view text) {
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    size_t nl = text.find('\n');
    // getline keeps the '\n'; strlen and the rest stop at a NUL.
    std::string_view line = text.substr(0, nl == std::string_view::npos ? text.size() : nl + 1);
    text.remove_prefix(line.size());
    line = line.substr(0, line.find('\0'));
    if (line.empty() || line[0] == '#' || line.size() < 8) continue;
    if (!istarts_with(line, "subid:")) continue;
    std::string_view p = line.substr(6);
    while (!p.empty() && c_space(p.front())) p.remove_prefix(1);
    if (p.empty()) continue;
    // strtok_r(p, " \n\t"): p starts with no space, so the token runs to the
    // first of those three.
    std::string_view token = p.substr(0, p.find_first_of(" \n\t"));
    if (token == "files" || token.size() > 50) return Source{true, "", line_no};
    return Source{false, std::string(token), line_no};
  }
  return Source{};
}

std::optional<uint32_t> passwd_uid(const std::string& login) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwnam_r(login.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found)
    return std::nullopt;
  return static_cast<uint32_t>(pw.pw_uid);
}

Result<Owner> find_owner(std::string_view user) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  auto uid = parse_u64(user);
  int rc = uid && *uid <= kMaxId
               ? getpwuid_r(static_cast<uid_t>(*uid), &pw, buf.data(), buf.size(), &found)
               : getpwnam_r(std::string(user).c_str(), &pw, buf.data(), buf.size(), &found);
  if (rc != 0 && rc != ENOENT && rc != ESRCH) {
    return make_error(Errc::io, "looking up {} in the passwd database failed: {}", shown(user),
                      strerror(rc));
  }
  if (!found) {
    return make_error(Errc::not_found,
                      "{} has no passwd entry (getent passwd {} finds nothing) — name an "
                      "existing user",
                      shown(user), user);
  }
  return Owner{pw.pw_name ? pw.pw_name : "", static_cast<uint32_t>(pw.pw_uid)};
}

namespace {

// The file's text; *absent when it does not exist.
Result<std::string> read_text(const std::string& path, bool* absent) {
  *absent = false;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) {
      *absent = true;
      return std::string();
    }
    return make_error(Errc::io, "{} cannot be read: {} — check its permissions", path,
                      strerror(errno));
  }
  std::string out;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (out.size() > kMaxFileBytes)
      return make_error(Errc::too_large, "{} is over 16 MiB; is it the right file?", path);
  }
  return out;
}

}  // namespace

Result<Subids> from_texts(Kind kind, const Owner& who, std::string_view nsswitch_text,
                          std::string_view nsswitch_path, std::string_view text,
                          std::string_view path, const NameToUid& lookup) {
  Source src = parse_nsswitch(nsswitch_text);
  if (!src.files) {
    return make_error(
        Errc::refused,
        "{}:{}: 'subid: {}' — {} asks the NSS module libsubid_{}.so for subordinate "
        "ids, not {}, and a module grants each mapping by its own has_range, which no list "
        "of ranges is bound to, so the walls cannot know every {} the user can map; set "
        "'subid: files' (or remove the line) and keep the ranges in /etc/subuid and "
        "/etc/subgid",
        nsswitch_path, src.line, src.module, kind == Kind::uid ? "newuidmap" : "newgidmap",
        src.module, path, id_word(kind));
  }
  return parse(text, who, lookup, path);
}

Result<Subids> read(Kind kind, const Owner& who, const std::string& path,
                    const std::string& nsswitch) {
  bool absent = false;
  auto ns = read_text(nsswitch, &absent);
  if (!ns) return std::move(ns).take_error();
  // A module named, the files are not read (newuidmap does not read them).
  if (!parse_nsswitch(*ns).files) return from_texts(kind, who, *ns, nsswitch, "", path, nullptr);
  auto text = read_text(path, &absent);
  if (!text) return std::move(text).take_error();
  return from_texts(kind, who, *ns, nsswitch, *text, path, passwd_uid);
}

}  // namespace fy::subid

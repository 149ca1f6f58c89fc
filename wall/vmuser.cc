#include "wall/vmuser.h"

#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/text.h"

namespace fy::wall {
namespace {

constexpr size_t kMaxFileBytes = 16 << 20;

std::vector<std::string_view> lines_of(std::string_view t) {
  std::vector<std::string_view> v;
  while (!t.empty()) {
    size_t nl = t.find('\n');
    std::string_view line = t.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    v.push_back(line);
    t.remove_prefix(nl == std::string_view::npos ? t.size() : nl + 1);
  }
  return v;
}

// The file at `path`, or "" when it does not exist; an error when it exists
// and cannot be read (it could hold a line for the user).
Result<std::string> read_or_absent(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::string();
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

std::string env_or(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v && *v ? v : fallback;
}

PasswdEntry entry_of(const passwd& pw) {
  return PasswdEntry{pw.pw_name ? pw.pw_name : "", pw.pw_uid, pw.pw_gid};
}

// The first and last id of the line's range, for the message ("" when the
// line is not LOGIN:START:COUNT).
std::string range_of_line(std::string_view text, size_t line_no) {
  auto lines = lines_of(text);
  if (line_no == 0 || line_no > lines.size()) return "";
  auto parts = split_list(lines[line_no - 1], ':');
  if (parts.size() != 3) return "";
  auto start = parse_u64(parts[1]);
  auto count = parse_u64(parts[2]);
  if (!start || !count || *count == 0) return "";
  return fmt::format(" {}-{}", *start, *start + *count - 1);
}

Result<void> refuse_subids(std::string_view kind, const std::string& path, std::string_view text,
                           const PasswdEntry& e) {
  auto lines = subid_lines_naming(text, e.name, e.uid);
  if (lines.empty()) return ok();
  std::string where = fmt::format("{}:{}", path, lines.front());
  for (size_t i = 1; i < lines.size(); ++i) where += fmt::format(",{}", lines[i]);
  const std::string range = range_of_line(text, lines.front());
  const std::string how =
      range.empty() ? "" : fmt::format(" (usermod --del-sub{}s{} {})", kind, range, e.name);
  return make_error(
      Errc::invalid_argument,
      "{}: the VM user '{}' has subordinate {}s — {} lets it run processes as them in a user "
      "namespace, and the host wall matches only its own uid and gid: a VM user needs none; "
      "remove every line naming '{}' or {}{}",
      where, e.name, kind, kind == "uid" ? "newuidmap" : "newgidmap", e.name, e.uid, how);
}

}  // namespace

Result<VmUserSources> VmUserSources::from_system() {
  VmUserSources s;
  s.find = [](const UserRef& u) -> Result<std::optional<PasswdEntry>> {
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    int rc = u.numeric ? getpwuid_r(u.uid, &pw, buf.data(), buf.size(), &found)
                       : getpwnam_r(u.name.c_str(), &pw, buf.data(), buf.size(), &found);
    if (rc != 0 && rc != ENOENT && rc != ESRCH) {
      return make_error(Errc::io, "looking it up in the passwd database failed: {}", strerror(rc));
    }
    if (!found) return std::optional<PasswdEntry>();
    return std::optional<PasswdEntry>(entry_of(pw));
  };
  s.all = [] {
    std::vector<PasswdEntry> out;
    setpwent();
    while (passwd* pw = getpwent()) out.push_back(entry_of(*pw));
    endpwent();
    return out;
  };
  s.subuid_path = env_or("FY_WALL_SUBUID_FILE", "/etc/subuid");
  s.subgid_path = env_or("FY_WALL_SUBGID_FILE", "/etc/subgid");
  s.nsswitch_path = env_or("FY_WALL_NSSWITCH_CONF", "/etc/nsswitch.conf");
  for (auto [path, text] :
       {std::pair{&s.subuid_path, &s.subuid}, std::pair{&s.subgid_path, &s.subgid},
        std::pair{&s.nsswitch_path, &s.nsswitch}}) {
    auto t = read_or_absent(*path);
    if (!t) return std::move(t).take_error();
    *text = std::move(*t);
  }
  return s;
}

std::vector<size_t> subid_lines_naming(std::string_view text, std::string_view name, uint32_t uid) {
  const std::string uid_str = std::to_string(uid);
  std::vector<size_t> out;
  size_t line_no = 0;
  for (std::string_view line : lines_of(text)) {
    ++line_no;
    size_t c = line.find(':');
    if (c == std::string_view::npos) continue;
    std::string_view login = line.substr(0, c);
    if (login == uid_str || (!name.empty() && login == name)) out.push_back(line_no);
  }
  return out;
}

std::string nsswitch_subid_sources(std::string_view text) {
  std::string out;
  for (std::string_view line : lines_of(text)) {
    line = line.substr(0, line.find('#'));
    line = trim_ows(line);
    if (!line.starts_with("subid")) continue;
    std::string_view rest = trim_ows(line.substr(5));
    if (!rest.starts_with(":")) continue;
    out = std::string(trim_ows(rest.substr(1)));  // the last line wins, as glibc's does
  }
  return out;
}

Result<VmUser> resolve_vm_user(const UserRef& who, const std::string& where,
                               const VmUserSources& src) {
  const std::string shown =
      who.numeric ? fmt::format("uid {}", who.uid) : fmt::format("'{}'", who.name);
  auto found = src.find(who);
  if (!found) {
    return make_error(Errc::io, "{}: {}: {}", where, shown, found.error().message);
  }
  if (!*found) {
    return make_error(Errc::not_found,
                      "{}: the VM user {} has no passwd entry (getent passwd {} finds nothing) "
                      "— create the VM's own account first (docs/fy-wall.md, \"The VM user\"): "
                      "useradd --system --user-group --no-create-home --shell "
                      "/usr/sbin/nologin fyvm-<vm>",
                      where, shown, who.numeric ? std::to_string(who.uid) : who.name);
  }
  const PasswdEntry e = **found;
  if (e.uid == 0) {
    return make_error(Errc::invalid_argument,
                      "{}: the VM user is root (uid 0) — the host wall would wall every root "
                      "process; name the account the VM runs as, one of its own",
                      where);
  }
  if (e.gid == 0) {
    return make_error(Errc::invalid_argument,
                      "{}: the VM user '{}' has primary group 0 (root) — the wall matches the "
                      "VM user's group too (meta skgid), which would wall every process of "
                      "group root; give it a group of its own (useradd --user-group)",
                      where, e.name);
  }
  if (src.all) {
    for (const PasswdEntry& o : src.all()) {
      if (o.gid != e.gid || o.uid == e.uid) continue;
      return make_error(Errc::invalid_argument,
                        "{}: gid {}, the primary group of the VM user '{}', is also the primary "
                        "group of '{}' (uid {}) — the wall matches the VM user's group too (meta "
                        "skgid), so it would wall that account, and the group must be the VM's "
                        "alone: give the VM user a group of its own (useradd --user-group)",
                        where, e.gid, e.name, o.name, o.uid);
    }
  }
  FY_TRY(refuse_subids("uid", src.subuid_path, src.subuid, e));
  FY_TRY(refuse_subids("gid", src.subgid_path, src.subgid, e));
  if (std::string db = nsswitch_subid_sources(src.nsswitch); !db.empty()) {
    return make_error(Errc::invalid_argument,
                      "{}: 'subid: {}' — newuidmap and newgidmap ask that database for "
                      "subordinate ids instead of {} and {}, and fy-wall cannot list what it "
                      "grants the VM user '{}': remove the subid: line (the files are then "
                      "used, and checked), or run the VM's host wall on a host without it",
                      src.nsswitch_path, db, src.subuid_path, src.subgid_path, e.name);
  }
  return VmUser{e.name, e.uid, e.gid};
}

std::optional<TaskIds> parse_proc_status(std::string_view text) {
  TaskIds t;
  bool uid = false, gid = false;
  for (std::string_view line : lines_of(text)) {
    size_t c = line.find(':');
    if (c == std::string_view::npos) continue;
    std::string_view key = line.substr(0, c);
    std::string_view val = line.substr(c + 1);
    if (key == "Name") {
      t.name = std::string(trim_ows(val));
      continue;
    }
    if (key != "Uid" && key != "Gid") continue;
    uint32_t* into = key == "Uid" ? t.uid : t.gid;
    size_t n = 0;
    while (n < 4) {
      size_t s = val.find_first_not_of(" \t");
      if (s == std::string_view::npos) break;
      val.remove_prefix(s);
      size_t e = val.find_first_of(" \t");
      auto v = parse_u64(val.substr(0, e));
      if (!v || *v > 0xffffffffULL) return std::nullopt;
      into[n++] = static_cast<uint32_t>(*v);
      val.remove_prefix(e == std::string_view::npos ? val.size() : e);
    }
    if (n != 4) return std::nullopt;
    (key == "Uid" ? uid : gid) = true;
  }
  if (!uid || !gid) return std::nullopt;
  return t;
}

bool task_is_vm_users(const TaskIds& t, const VmUser& u) {
  for (int i = 0; i < 4; ++i) {
    if (t.uid[i] == u.uid || t.gid[i] == u.gid) return true;
  }
  return false;
}

std::optional<std::string> proc_cgroup_v2(std::string_view text) {
  for (std::string_view line : lines_of(text)) {
    if (line.starts_with("0::")) return std::string(line.substr(3));
  }
  return std::nullopt;
}

bool cgroup_within(std::string_view path, std::string_view slice) {
  if (path.empty() || path[0] != '/' || slice.empty()) return false;
  path.remove_prefix(1);
  if (!path.starts_with(slice)) return false;
  return path.size() == slice.size() || path[slice.size()] == '/';
}

std::vector<std::string> cgroup_proper_ancestors(std::string_view slice) {
  std::vector<std::string> out;
  while (!slice.empty()) {
    size_t slash = slice.rfind('/');
    slice = slash == std::string_view::npos ? std::string_view() : slice.substr(0, slash);
    out.emplace_back(slice);
  }
  return out;
}

bool writable_by(uint32_t owner, uint32_t group, mode_t mode, uint32_t uid,
                 const std::vector<uint32_t>& groups) {
  if (uid == owner) return (mode & S_IWUSR) != 0;
  if (std::find(groups.begin(), groups.end(), group) != groups.end()) return (mode & S_IWGRP) != 0;
  return (mode & S_IWOTH) != 0;
}

bool only_root_writes(uint32_t owner, uint32_t group, mode_t mode) {
  if (owner != 0 && (mode & S_IWUSR)) return false;
  if (group != 0 && (mode & S_IWGRP)) return false;
  return (mode & S_IWOTH) == 0;
}

}  // namespace fy::wall

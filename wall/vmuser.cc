#include "wall/vmuser.h"

#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/text.h"

namespace fy::wall {
namespace {

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

PasswdEntry entry_of(const passwd& pw) {
  return PasswdEntry{pw.pw_name ? pw.pw_name : "", pw.pw_uid, pw.pw_gid};
}

// Refuses every line of the subuid (subgid) file keyed to the VM user, as
// core/subid reads the file after nsswitch.conf: a VM user needs none, since
// the host wall matches its own uid and gid alone.
Result<void> refuse_subids(subid::Kind kind, const std::string& path, const VmUserSources& src,
                           const PasswdEntry& e) {
  const char* word = kind == subid::Kind::uid ? "uid" : "gid";
  const char* mapper = kind == subid::Kind::uid ? "newuidmap" : "newgidmap";
  if (!src.subids) return make_error(Errc::internal, "no reader of subordinate ids was given");
  auto ids = src.subids(kind, subid::Owner{e.name, e.uid}, path);
  if (!ids) {
    Error err = std::move(ids).take_error();
    if (err.code == Errc::io || err.code == Errc::too_large) return err;
    // An NSS module (no list is bound to what it grants), a grant of id 0, a
    // NUL byte: the operator's configuration, which leaves the VM user's
    // subordinate ids unknown or some.
    return make_error(Errc::invalid_argument,
                      "{} — the host wall's VM user '{}' must have no subordinate {}s, and "
                      "fy-wall cannot tell that it has none",
                      err.message, e.name, word);
  }
  if (ids->keyed_lines.empty()) return ok();
  std::string where = fmt::format("{}:{}", path, ids->keyed_lines.front());
  for (size_t i = 1; i < ids->keyed_lines.size(); ++i)
    where += fmt::format(",{}", ids->keyed_lines[i]);
  // usermod removes a line by its exact range; a line that grants nothing
  // (COUNT 0, a number newuidmap cannot read) or past the largest id is
  // removed by hand.
  bool usermod = ids->grants.size() == ids->keyed_lines.size();
  std::string how = " (usermod";
  for (const subid::Grant& g : ids->grants) {
    usermod = usermod && g.ids.lo == g.start && g.ids.hi == g.start + g.count - 1;
    how += fmt::format(" --del-sub{}s {}-{}", word, g.ids.lo, g.ids.hi);
  }
  how = usermod ? how + fmt::format(" {})", e.name) : "";
  return make_error(
      Errc::invalid_argument,
      "{}: the VM user '{}' has subordinate {}s — {} lets it run processes as them in a user "
      "namespace, and the host wall matches only its own uid and gid: a VM user needs none; "
      "remove every line naming '{}' or {} (or another login name of uid {}){}",
      where, e.name, word, mapper, e.name, e.uid, e.uid, how);
}

}  // namespace

VmUserSources VmUserSources::from_system() {
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
  s.subids = [](subid::Kind kind, const subid::Owner& who, const std::string& path) {
    return subid::read(kind, who, path);
  };
  return s;
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
  FY_TRY(refuse_subids(subid::Kind::uid, src.subuid_path, src, e));
  FY_TRY(refuse_subids(subid::Kind::gid, src.subgid_path, src, e));
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

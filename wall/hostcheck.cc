#include "wall/hostcheck.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "core/fd.h"
#include "core/text.h"
#include "wall/vmuser.h"

namespace fy::wall {
namespace {

constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

// A small /proc or cgroupfs file whole; nullopt when it is gone (the task
// exited while the scan ran) or unreadable.
std::optional<std::string> read_small(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) return std::nullopt;
  std::string out;
  char buf[4096];
  while (out.size() < (1 << 20)) {
    ssize_t n = ::read(f.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::vector<uint32_t> groups_of(const VmUser& u) {
  std::vector<gid_t> g(64);
  int n = static_cast<int>(g.size());
  if (getgrouplist(u.name.c_str(), u.gid, g.data(), &n) < 0) {
    g.resize(static_cast<size_t>(n));
    if (getgrouplist(u.name.c_str(), u.gid, g.data(), &n) < 0) n = 0;
  }
  std::vector<uint32_t> out{u.gid};
  for (int i = 0; i < n; ++i)
    if (g[i] != u.gid) out.push_back(g[i]);
  return out;
}

std::vector<std::string> numeric_entries(const std::string& dir) {
  std::vector<std::string> out;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return out;
  while (dirent* e = readdir(d.get())) {
    std::string_view name = e->d_name;
    if (!name.empty() && parse_u64(name)) out.emplace_back(name);
  }
  return out;
}

std::string cmdline_of(const std::string& pid) {
  auto raw = read_small("/proc/" + pid + "/cmdline");
  if (!raw) return "";
  std::string s = *raw;
  while (!s.empty() && s.back() == '\0') s.pop_back();
  for (char& c : s)
    if (c == '\0' || c == '\n') c = ' ';
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

}  // namespace

Result<void> check_slice_holds(const std::string& slice, const VmUser& user) {
  const std::vector<uint32_t> groups = groups_of(user);
  for (const std::string& a : cgroup_proper_ancestors(slice)) {
    std::string procs = a.empty() ? fmt::format("{}/cgroup.procs", kCgroupRoot)
                                  : fmt::format("{}/{}/cgroup.procs", kCgroupRoot, a);
    struct stat st {};
    if (stat(procs.c_str(), &st) != 0) {
      return make_error(Errc::io, "cannot read {} ({}) to check the VM's slice can hold it", procs,
                        strerror(errno));
    }
    if (only_root_writes(st.st_uid, st.st_gid, st.st_mode)) continue;
    const bool vm = writable_by(st.st_uid, st.st_gid, st.st_mode, user.uid, groups);
    return make_error(
        Errc::permission,
        "the cgroup '{}', an ancestor of the VM's slice '{}', has a cgroup.procs {} can write "
        "(owner uid {}, group {}, mode {:04o}) — {}; run the VM in a slice only root can "
        "write: a system unit with User={} (e.g. systemd-run --slice=fy-machine-<vm>.slice "
        "--uid={} --gid={} ...), not under a user@UID.service (docs/fy-wall.md, \"The VM "
        "user\")",
        a.empty() ? std::string("/") : a, slice,
        vm ? fmt::format("the VM user '{}'", user.name) : std::string("someone other than root"),
        st.st_uid, st.st_gid, st.st_mode & 07777,
        vm ? "a process in the slice could move itself out, and a set-ID program it then runs "
             "could leave the wall"
           : "whoever that is could move the VM's processes out of the slice, and the wall's "
             "slice rule with them",
        user.name, user.name, user.gid);
  }
  return ok();
}

UserTasks vm_user_tasks(const VmUser& user, const std::string& slice) {
  UserTasks out;
  for (const std::string& pid : numeric_entries("/proc")) {
    const std::string base = "/proc/" + pid + "/task";
    std::optional<Stray> stray;
    bool theirs = false;
    for (const std::string& tid : numeric_entries(base)) {
      auto status = read_small(base + "/" + tid + "/status");
      auto ids = status ? parse_proc_status(*status) : std::nullopt;
      if (!ids || !task_is_vm_users(*ids, user)) continue;
      theirs = true;
      auto cg = read_small(base + "/" + tid + "/cgroup");
      std::optional<std::string> path = cg ? proc_cgroup_v2(*cg) : std::nullopt;
      if (path && cgroup_within(*path, slice)) continue;
      stray = Stray{static_cast<int>(*parse_u64(pid)),
                    ids->name,
                    path ? *path : std::string("(unknown)"),
                    "",
                    ids->uid[1],
                    ids->gid[1]};
      break;
    }
    if (stray) {
      stray->cmdline = cmdline_of(pid);
      out.outside.push_back(std::move(*stray));
    } else if (theirs) {
      ++out.inside;
    }
  }
  std::sort(out.outside.begin(), out.outside.end(),
            [](const Stray& a, const Stray& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace fy::wall

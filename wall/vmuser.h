// The host wall's VM user: the dedicated account the VM's processes run as,
// whose uid and gid the host wall matches (`meta skuid`, `meta skgid`) beside
// the VM's slice. A process cannot change its uid or gid without privilege,
// and cannot leave a slice whose ancestors only root can write; a cgroup alone
// it can leave when its own user may write an ancestor's cgroup.procs, and a
// daemon of its own user outside the slice (`systemd-run --user`, D-Bus
// activation, cron) acts for it without it (docs/fy-wall.md, "The VM user").
//
// Resolving the user refuses an account that is not dedicated to the VM:
// uid or gid 0, a primary group another account shares, any subordinate id
// (newuidmap/newgidmap would let it run processes as ids the wall does not
// match), a subid database fy-wall cannot read. The checks are pure over the
// sources handed in; VmUserSources::from_system reads the real ones.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "wall/parse.h"
#include "wall/spec.h"

namespace fy::wall {

// One passwd entry, as much of it as the checks read.
struct PasswdEntry {
  std::string name;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// Where the VM user is looked up and checked against.
struct VmUserSources {
  // The passwd database (NSS, as `getent passwd` does): nullopt when the user
  // has no entry; an error when the lookup itself failed.
  std::function<Result<std::optional<PasswdEntry>>(const UserRef&)> find;
  // Every entry the database lists (getpwent; NSS sources that do not
  // enumerate list nothing), for the shared-group check.
  std::function<std::vector<PasswdEntry>()> all;
  // The subordinate-id files and nsswitch.conf, as texts ("" when absent),
  // with the paths the messages name.
  std::string subuid_path, subuid;
  std::string subgid_path, subgid;
  std::string nsswitch_path, nsswitch;

  // The system's: NSS, /etc/subuid, /etc/subgid, /etc/nsswitch.conf (the
  // files FY_WALL_SUBUID_FILE, FY_WALL_SUBGID_FILE, FY_WALL_NSSWITCH_CONF name
  // instead, for the tests). An unreadable file (not an absent one) is an
  // error: it could hold a line for the user.
  static Result<VmUserSources> from_system();
};

// The lines (1-based) of an /etc/subuid or /etc/subgid text whose LOGIN is
// `name` or the decimal `uid`, whatever their START and COUNT: newuidmap and
// newgidmap take every such line (shadow-utils' list_owner_ranges).
std::vector<size_t> subid_lines_naming(std::string_view text, std::string_view name, uint32_t uid);

// The sources after "subid:" in an nsswitch.conf text ("" when there is no
// such line): when set, newuidmap asks that NSS module (libsubid) instead of
// the files.
std::string nsswitch_subid_sources(std::string_view text);

// Resolves and checks the VM user named at `who.where`. Refuses (each
// message says what to do): no passwd entry; uid 0; gid 0; a gid that is
// another listed account's primary group; any line naming it in the subuid
// or subgid file (`path:line`); a `subid:` line in nsswitch.conf.
Result<VmUser> resolve_vm_user(const UserRef& who, const std::string& where,
                               const VmUserSources& src);

// ---- what `status host` and `apply host` read from /proc and the cgroup tree

// The ids of one task, from its /proc/PID/status: real, effective, saved, fs.
struct TaskIds {
  uint32_t uid[4] = {0, 0, 0, 0};
  uint32_t gid[4] = {0, 0, 0, 0};
  std::string name;  // "Name:", the command (comm)
};
// Parses a /proc/PID/status text; nullopt when a Uid: or Gid: line is missing
// or malformed.
std::optional<TaskIds> parse_proc_status(std::string_view text);

// Whether any of the task's uids is the VM user's uid, or any of its gids the
// VM user's gid: a task of the VM user, or one running a set-ID program it
// started.
bool task_is_vm_users(const TaskIds& t, const VmUser& u);

// The cgroup v2 path in a /proc/PID/cgroup text (the "0::" line), relative
// to the reader's cgroup namespace root, with its leading '/'; nullopt when
// there is no such line.
std::optional<std::string> proc_cgroup_v2(std::string_view text);

// Whether `path` (as proc_cgroup_v2 gives it, "/a/b") is the cgroup `slice`
// (relative, no leading '/', as parse_cgroup_path gives it) or below it.
bool cgroup_within(std::string_view path, std::string_view slice);

// The proper ancestors of `slice`, nearest first, ending with "" (the root):
// "a/b/c" -> {"a/b", "a", ""}. The cgroups whose cgroup.procs decides whether
// a process in the slice may move itself out: the kernel lets it only with
// write access to the common ancestor's (cgroup_procs_write_permission).
std::vector<std::string> cgroup_proper_ancestors(std::string_view slice);

// Whether a file of owner `owner`, group `group` and mode `mode` is writable
// by a process of uid `uid` whose groups are `groups` (its primary group
// first), by the mode bits alone, as generic_permission reads them for an
// unprivileged process.
bool writable_by(uint32_t owner, uint32_t group, mode_t mode, uint32_t uid,
                 const std::vector<uint32_t>& groups);
// Whether only root (uid 0, group 0) may write such a file: no write bit for a
// non-root owner or group, none for others.
bool only_root_writes(uint32_t owner, uint32_t group, mode_t mode);

}  // namespace fy::wall

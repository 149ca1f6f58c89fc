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
// match, read by core/subid.h, the one reader), a subid database no list is
// bound to. The checks are pure over the sources handed in;
// VmUserSources::from_system reads the real ones.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/subid.h"
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
  // The owner's subordinate ids as newuidmap (kind uid) or newgidmap (kind
  // gid) grants them, from the file at `path`: the one reader's, core/subid.h
  // (its read() on the system, from_texts() over texts in the tests).
  std::function<Result<subid::Subids>(subid::Kind, const subid::Owner&, const std::string& path)>
      subids;
  std::string subuid_path = subid::default_path(subid::Kind::uid);
  std::string subgid_path = subid::default_path(subid::Kind::gid);

  // The system's: NSS, and /etc/subuid and /etc/subgid after
  // /etc/nsswitch.conf, read when resolve_vm_user asks.
  static VmUserSources from_system();
};

// Resolves and checks the VM user named at `who.where`. Refuses (each
// message says what to do): no passwd entry; uid 0; gid 0; a gid that is
// another listed account's primary group; any line of the subuid or subgid
// file keyed to it (its name, its uid or another name of its uid; any
// COUNT: newuidmap reads every line), naming `path:line`; and whatever
// core/subid refuses for it (`subid:` naming an NSS module in nsswitch.conf,
// whose grants no list is bound to; a NUL byte).
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

// What `apply host` and `status host` check on the system beside the table:
// that the VM's slice is one its processes cannot leave, and that no process
// of the VM user runs outside it. The decisions are wall/vmuser.h's pure
// functions; this reads the cgroup tree and /proc for them.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "wall/spec.h"

namespace fy::wall {

// Refuses a slice whose processes anyone but root could move out: a proper
// ancestor (up to the cgroup2 root fy-wall sees) whose cgroup.procs a non-root
// owner or group, or anyone, may write — as under a user@UID.service
// (Delegate=yes), the VM user's own (then a process in the slice could move
// itself out) or another's. The cgroup2 view must be in place
// (ensure_cgroup2_view). Errc::permission names the ancestor, its owner and
// mode, whether the VM user (its uid, its groups) can write it, and what to
// do; Errc::io when the tree cannot be read.
Result<void> check_slice_holds(const std::string& slice, const VmUser& user);

// A process with a task of the VM user (any of its uids or gids) in a cgroup
// outside the slice.
struct Stray {
  int pid = 0;
  std::string name;     // the task's command (comm)
  std::string cgroup;   // as /proc shows it, from fy-wall's cgroup namespace
  std::string cmdline;  // argv joined by spaces, at most 120 characters
  uint32_t uid = 0;     // the task's effective uid and gid
  uint32_t gid = 0;
};
struct UserTasks {
  std::vector<Stray> outside;  // one per process, pid order
  size_t inside = 0;           // processes of the VM user in the slice
};
// Every task in /proc (every thread of every process fy-wall can see).
UserTasks vm_user_tasks(const VmUser& user, const std::string& slice);

}  // namespace fy::wall

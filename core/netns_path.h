// Where a followed network namespace is now: the path a daemon opens.
//
// fy-forwarder's [bridge] and fy-dnsfwd's followed listeners name the rootless
// bridge namespace by a path that is, or will be, a bind mount of an nsfs file.
// Rootless podman makes two things of that path that the path alone does not
// say (both seen in a real Debian 12 guest, podman 4.3.1; docs/fy-machine.md):
//  - It binds the namespace inside its own mount namespace, the pause
//    process's. That namespace is owned by the VM user's user namespace, so
//    the mount never propagates back: in the daemon's mount namespace the path
//    is an empty file, and a namespace that exists is never followed.
//    `mount_ns_pid_file` names a process in whose mount namespace to look (for
//    podman, $XDG_RUNTIME_DIR/libpod/tmp/pause.pid): the path is then read as
//    /proc/<pid>/root<path>.
//  - Podman 4 names it rootless-netns-<a hash of its storage paths>, podman 5
//    rootless-netns/rootless-netns. A last component that ends in '*' matches
//    the one entry of its directory that starts with what precedes the '*'.
#pragma once

#include <sys/types.h>

#include <string>

#include "core/fd.h"
#include "core/result.h"

namespace fy {

// The path to open now for `path` (see above; `mount_ns_pid_file` "" = this
// process's mount namespace). Errc::not_found, with a message that says why,
// when the pid file holds no live pid or nothing matches the pattern (yet);
// Errc::invalid_argument when the pattern matches more than one entry, which
// are named: following one of them would be a guess.
Result<std::string> locate_netns(const std::string& path, const std::string& mount_ns_pid_file);

// Why `path` cannot name a followed namespace ("" when it can): it must be
// absolute, and a '*' may only end its last component. For config readers.
std::string netns_path_problem(const std::string& path);

// A network namespace's identity: its nsfs inode. While a daemon holds the
// namespace open (a descriptor or a socket in it), the inode cannot be reused,
// so a different inode at a followed path is always a new namespace.
struct NsId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const NsId&) const = default;
  bool valid() const { return ino != 0; }
};

struct NsHandle {
  Fd fd;  // O_RDONLY on the nsfs file; pass to setns()
  NsId id;
};

// Opens `path` when it is a network namespace (an nsfs file of type
// CLONE_NEWNET). Errc::not_found when the path is absent or not (yet) a
// namespace: podman leaves an empty file where it has not bound one, or has
// unbound it. Errc::invalid_argument for a namespace of another type.
Result<NsHandle> open_netns(const std::string& path);

// What a follower says of locate_netns' answers: a pattern that matches
// several entries is worth one warning when it starts, not one per rescan.
// update() returns that problem's message when it is new (empty otherwise,
// and when it has cleared); other failures (not_found) are never said here.
class LocateNotice {
 public:
  std::string update(const Result<std::string>& located);

 private:
  std::string last_;
};

// Reads a pid file (decimal, optional trailing newline or spaces); 0 when it
// is absent, empty or malformed, or names no possible pid.
pid_t read_pid_file(const std::string& path);

}  // namespace fy

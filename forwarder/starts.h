// Which container holds each bridge address, as the OCI prestart hook reports
// it at the container's start (docs/fy-forwarder.md, "Starts").
//
// The hook runs synchronously before the container's process: it sends
// `start <id> <pid>` over the control socket, the forwarder reads that
// process's network namespace and records each of its addresses for the id.
// A connection from such an address is then stamped `who=container:<id>`, so
// the row names its container by id even when the container is gone before
// fy-engine-watch lists it (ADR-0034; docs/engine-watch.md, "Limits").
//
// What it proves: the addresses are what the kernel shows in that pid's
// namespace; the id is the runtime's claim, checked against the pid's cgroup
// when that names a container (libpod-<id>.scope): a pid in another
// container's scope is refused. An entry
// lives only while that namespace does: before each use the pid's namespace
// inode is compared with the one recorded, so an address the container no
// longer holds (it exited; the address went to something the hook never
// reported) falls back to an address-only stamp.
//
// Thread-safe: the control socket records on the main loop, every worker
// looks up. One mutex; a lookup is a map find and one stat(2).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::fwd {

class Starts {
 public:
  static constexpr size_t kMaxEntries = 65536;

  // Reads pid's network namespace and records its addresses (loopback
  // and IPv6 link-local excluded) for `id`, replacing any earlier holder of
  // each. Returns how many addresses it recorded.
  Result<size_t> record(std::string_view id, pid_t pid);
  // The container id recorded for `ip`; "" when none, no longer valid (its
  // namespace is gone), or shared by two recorded containers (a pod, or
  // --network container:), where the address names none of them alone.
  std::string holder(const std::string& ip);
  size_t size() const;
  uint64_t recorded() const;

  // 12..64 lower-case hex digits.
  static bool valid_id(std::string_view id);

 private:
  struct Entry {
    std::string id;
    pid_t pid = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    bool shared = false;  // another container started in the same namespace
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> by_ip_;  // guarded by mu_
  uint64_t recorded_ = 0;                            // guarded by mu_
};

// Parses the control line "start <id> <pid>"; false when it is not one.
bool parse_start_line(std::string_view line, std::string* id, pid_t* pid);

}  // namespace fy::fwd

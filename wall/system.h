// What fy-wall needs from the system besides nftables and netlink: a cgroup2
// view for `socket cgroupv2` paths, and the kernel log's deny lines.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/result.h"

namespace fy::wall {

// nft resolves a `socket cgroupv2` path against /sys/fs/cgroup, in userspace,
// when it parses a rule (and back when it lists one). On a pure cgroup2 host
// that is the cgroup2 mount. On a hybrid host (v1 controllers at
// /sys/fs/cgroup, v2 at /sys/fs/cgroup/unified) and under `ip netns exec`
// (a fresh sysfs with nothing at /sys/fs/cgroup) it is not, and nft fails.
// Then this moves the process into a private mount namespace and mounts
// cgroup2 at /sys/fs/cgroup there: the host's mounts are untouched, and the
// view dies with the process. Must run before any thread is started.
// `mounted` tells whether it had to.
Result<void> ensure_cgroup2_view(bool* mounted);

// Refuses a cgroup that does not exist: the rule keys on its id, which nft
// takes when the table is applied.
Result<void> check_cgroup_exists(const std::string& relative);

// The newest `max` lines of the kernel log (/dev/kmsg) that contain any of
// `needles`, oldest first, as "[seconds.micros] message". The log is the
// whole machine's: lines from every network namespace are mixed in it.
Result<std::vector<std::string>> kernel_log_lines(const std::vector<std::string>& needles,
                                                  size_t max, size_t* total);

}  // namespace fy::wall

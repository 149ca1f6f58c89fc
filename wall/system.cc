#include "wall/system.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "core/fd.h"
#include "core/text.h"

namespace fy::wall {
namespace {

constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

bool is_cgroup2(const char* path) {
  struct statfs fs {};
  return statfs(path, &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC;
}

}  // namespace

Result<void> ensure_cgroup2_view(bool* mounted) {
  *mounted = false;
  if (is_cgroup2(kCgroupRoot)) return ok();
  struct stat st {};
  if (stat(kCgroupRoot, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return make_error(Errc::not_found,
                      "{} does not exist, so nft cannot resolve cgroup paths — mount sysfs, or "
                      "run fy-wall on the host itself",
                      kCgroupRoot);
  }
  if (unshare(CLONE_NEWNS) != 0) {
    return make_error(errno == EPERM ? Errc::permission : Errc::io,
                      "{} is not a cgroup2 mount and a private mount namespace to mount one in "
                      "could not be made ({}) — run fy-wall as root",
                      kCgroupRoot, strerror(errno));
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return make_error(Errc::io, "cannot make fy-wall's mounts private: {}", strerror(errno));
  }
  if (mount("cgroup2", kCgroupRoot, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    return make_error(Errc::io,
                      "cannot mount cgroup2 at {} in fy-wall's private mount namespace: {} — "
                      "does this kernel have cgroup v2?",
                      kCgroupRoot, strerror(errno));
  }
  *mounted = true;
  return ok();
}

Result<void> check_cgroup_exists(const std::string& relative) {
  std::string path = fmt::format("{}/{}", kCgroupRoot, relative);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return make_error(Errc::not_found,
                      "the cgroup '{}' does not exist in the cgroup2 hierarchy — start the VM's "
                      "slice first (nft keys the rule on the cgroup's id, taken when the wall is "
                      "applied; re-apply after the slice is re-created)",
                      relative);
  }
  return ok();
}

Result<std::vector<std::string>> kernel_log_lines(const std::vector<std::string>& needles,
                                                  size_t max, size_t* total) {
  *total = 0;
  Fd f(::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!f) {
    return make_error(errno == EACCES || errno == EPERM ? Errc::permission : Errc::io,
                      "cannot read the kernel log (/dev/kmsg): {}", strerror(errno));
  }
  std::deque<std::string> keep;
  char buf[8192];
  while (true) {
    ssize_t n = read(f.get(), buf, sizeof buf - 1);
    if (n < 0) {
      if (errno == EPIPE) continue;  // a record was overwritten while reading; go on
      if (errno == EINTR) continue;
      break;  // EAGAIN: the end of the log
    }
    if (n == 0) break;
    std::string_view rec(buf, static_cast<size_t>(n));
    // "prio,seq,usec,flags[,...];message\n" followed by " KEY=value" lines.
    size_t semi = rec.find(';');
    if (semi == std::string_view::npos) continue;
    std::string_view head = rec.substr(0, semi);
    std::string_view msg = rec.substr(semi + 1);
    msg = msg.substr(0, msg.find('\n'));
    bool hit = false;
    for (const std::string& n2 : needles) hit = hit || msg.find(n2) != std::string_view::npos;
    if (!hit) continue;
    auto parts = split_list(head, ',');
    uint64_t usec = parts.size() > 2 ? parse_u64(parts[2]).value_or(0) : 0;
    ++*total;
    keep.push_back(fmt::format("[{:5}.{:06}] {}", usec / 1000000, usec % 1000000, msg));
    if (keep.size() > max) keep.pop_front();
  }
  return std::vector<std::string>(keep.begin(), keep.end());
}

}  // namespace fy::wall

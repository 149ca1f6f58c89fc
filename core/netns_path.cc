#include "core/netns_path.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef NSFS_MAGIC
#define NSFS_MAGIC 0x6e736673
#endif

namespace fy {

pid_t read_pid_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char* end = nullptr;
  long v = strtol(buf, &end, 10);
  if (end == buf || v <= 0 || v > 4194304) return 0;
  while (*end == '\n' || *end == ' ') ++end;
  return *end ? 0 : static_cast<pid_t>(v);
}

std::string netns_path_problem(const std::string& path) {
  if (path.empty() || path[0] != '/') return "must be an absolute path";
  size_t star = path.find('*');
  if (star == std::string::npos) return "";
  if (star != path.size() - 1)
    return "a '*' may only end the last component (rootless-netns-*), once";
  if (path[star - 1] == '/') return "a '*' needs a prefix before it (rootless-netns-*)";
  return "";
}

Result<std::string> locate_netns(const std::string& path, const std::string& mount_ns_pid_file) {
  std::string root;
  if (!mount_ns_pid_file.empty()) {
    pid_t pid = read_pid_file(mount_ns_pid_file);
    if (!pid) return make_error(Errc::not_found, "no pid in {} (not started yet?)", mount_ns_pid_file);
    root = "/proc/" + std::to_string(pid) + "/root";
    struct stat st;
    if (::stat(root.c_str(), &st) != 0)
      return make_error(Errc::not_found, "the pid {} of {} is not running", pid, mount_ns_pid_file);
  }
  if (path.empty() || path.back() != '*') return root + path;
  size_t slash = path.rfind('/');
  std::string dir = root + path.substr(0, slash);
  std::string prefix = path.substr(slash + 1, path.size() - slash - 2);
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    return make_error(errno == ENOENT ? Errc::not_found : Errc::io, "{} cannot be read: {}", dir,
                      strerror(errno));
  std::vector<std::string> found;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix)
      found.emplace_back(name);
  }
  ::closedir(d);
  if (found.empty())
    return make_error(Errc::not_found, "nothing in {} matches {}* (yet)", dir, prefix);
  if (found.size() > 1) {
    std::string names;
    for (const auto& f : found) names += (names.empty() ? "" : ", ") + f;
    return make_error(Errc::invalid_argument,
                      "{} entries in {} match {}* ({}): not following a guess; name the one "
                      "to follow",
                      found.size(), dir, prefix, names);
  }
  return dir + "/" + found[0];
}

Result<NsHandle> open_netns(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(errno == ENOENT ? Errc::not_found : Errc::io, "{} cannot be opened: {}", path,
                      strerror(errno));
  NsHandle h;
  h.fd.reset(fd);
  struct statfs sfs;
  if (fstatfs(fd, &sfs) != 0 || static_cast<unsigned long>(sfs.f_type) != NSFS_MAGIC)
    return make_error(Errc::not_found, "{} is not a namespace (not mounted yet?)", path);
  int type = ioctl(fd, NS_GET_NSTYPE);
  if (type != CLONE_NEWNET)
    return make_error(Errc::invalid_argument, "{} is a namespace but not a network namespace",
                      path);
  struct stat st;
  if (fstat(fd, &st) != 0) return make_error(Errc::io, "fstat {}: {}", path, strerror(errno));
  h.id = NsId{st.st_dev, st.st_ino};
  return h;
}

std::string LocateNotice::update(const Result<std::string>& located) {
  std::string now =
      !located && located.error().code == Errc::invalid_argument ? located.error().message : "";
  if (now == last_) return {};
  last_ = now;
  return now;
}

}  // namespace fy

#include "core/paths.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace fy {

std::string state_home() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && x[0] == '/') return x;
  std::string home;
  if (const char* h = std::getenv("HOME"); h && h[0]) {
    home = h;
  } else if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && pw->pw_dir[0]) {
    home = pw->pw_dir;
  }
  if (home.empty()) return "";
  while (home.size() > 1 && home.back() == '/') home.pop_back();
  return (home == "/" ? "" : home) + "/.local/state";
}

std::string default_proxy_state_dir() {
  std::string s = state_home();
  return s.empty() ? "/var/lib/foldyard/egress" : s + "/foldyard/egress";
}

Result<std::vector<std::string>> make_dirs(const std::string& dir, mode_t mode) {
  std::vector<std::string> made;
  if (dir.empty()) return make_error(Errc::invalid_argument, "an empty directory name");
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    if (dir[i - 1] == '/') continue;  // "a//b", a trailing slash
    std::string part = dir.substr(0, i);
    bool last = dir.find_first_not_of('/', i) == std::string::npos;
    struct stat st;
    if (::stat(part.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return make_error(
            Errc::io, "cannot make the directory {}: {} exists and is not a directory", dir, part);
      continue;
    }
    if (errno != ENOENT)
      return make_error(Errc::io, "cannot make the directory {}: {}: {}", dir, part,
                        strerror(errno));
    if (::mkdir(part.c_str(), last ? mode : 0755) != 0 && errno != EEXIST)
      return make_error(Errc::io, "cannot make the directory {}: {}: {}", dir, part,
                        strerror(errno));
    made.push_back(part);
  }
  return made;
}

}  // namespace fy

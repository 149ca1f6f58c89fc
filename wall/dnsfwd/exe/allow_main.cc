// fy-dnsfwd-allow: renders fy-dnsfwd's allow file from fy-proxy's policy,
// on the host, where the policy lives (docs/fy-dnsfwd.md, "The allow list
// from the policy"). The provisioning copies the file into the guest and
// sends fy-dnsfwd SIGHUP.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/clock.h"
#include "wall/dnsfwd/allow.h"

namespace {

constexpr const char* kUsage =
    "usage: fy-dnsfwd-allow POLICY [--out FILE]\n"
    "       fy-dnsfwd-allow --help\n"
    "\n"
    "Renders fy-dnsfwd's allow_file from fy-proxy's policy file: the host part of\n"
    "every allow, build_allow, unexpired grant and injection pattern, one a line.\n"
    "A policy the proxy would fail closed on renders nothing (exit 3).\n"
    "\n"
    "  --out FILE   write FILE atomically (a temporary file renamed over it);\n"
    "               default: stdout\n"
    "\n"
    "Exit: 0 rendered; 2 usage; 3 the policy is bad or unreadable; 4 FILE could\n"
    "not be written.\n";

bool write_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      unlink(tmp.c_str());
      return false;
    }
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    errno = e;
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string policy, out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fputs(kUsage, stdout);
      return 0;
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (!a.empty() && a[0] != '-' && policy.empty()) {
      policy = a;
    } else {
      fprintf(stderr, "✗ unknown or incomplete option '%s' — see fy-dnsfwd-allow --help\n",
              a.c_str());
      return 2;
    }
  }
  if (policy.empty()) {
    fprintf(stderr, "✗ name the proxy's policy file — see fy-dnsfwd-allow --help\n");
    return 2;
  }
  FILE* f = fopen(policy.c_str(), "re");
  if (!f) {
    fprintf(stderr, "✗ cannot read the policy %s: %s — name fy-proxy's policy file\n",
            policy.c_str(), strerror(errno));
    return 3;
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (4 << 20)) text.append(buf, n);
  fclose(f);
  auto a = fy::dnsfwd::allow_from_policy(text, policy, fy::wall_ms());
  if (!a) {
    fprintf(stderr, "✗ %s\n✗ nothing rendered: fix the policy (the proxy fails closed on it too)\n",
            a.error().message.c_str());
    return 3;
  }
  for (const std::string& w : a->warnings) fprintf(stderr, "! %s\n", w.c_str());
  std::string body = fy::dnsfwd::render_allow_file(*a, policy);
  if (out.empty()) {
    fputs(body.c_str(), stdout);
    return 0;
  }
  if (!write_atomic(out, body)) {
    fprintf(stderr, "✗ cannot write %s: %s — check its directory\n", out.c_str(), strerror(errno));
    return 4;
  }
  fprintf(stderr, "✓ %s: %zu name(s) from %s\n", out.c_str(), a->names.size(), policy.c_str());
  return 0;
}

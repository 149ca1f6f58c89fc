#include "forwarder/control_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/fd.h"

namespace fy::fwd {

Result<std::string> control_query(const std::string& path, const std::string& command,
                                  int timeout_ms) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path)
    return make_error(Errc::invalid_argument, "control socket path {} is too long", path);
  std::memcpy(sa.sun_path, path.data(), path.size());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(Errc::io, "socket: {}", strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return make_error(errno == ENOENT || errno == ECONNREFUSED ? Errc::refused : Errc::io,
                      "fy-forwarder's control socket {} does not answer: {}", path,
                      strerror(errno));
  std::string line = command + "\n";
  if (::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return make_error(Errc::io, "writing to {}: {}", path, strerror(errno));
  std::string out;
  uint64_t deadline = mono_ms() + static_cast<uint64_t>(timeout_ms);
  while (true) {
    uint64_t now = mono_ms();
    if (now >= deadline)
      return make_error(Errc::timeout, "fy-forwarder did not answer on {} within {} ms", path,
                        timeout_ms);
    pollfd p{fd.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(deadline - now));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.find('\n') != std::string::npos) break;
  }
  size_t nl = out.find('\n');
  if (nl == std::string::npos)
    return make_error(Errc::io, "fy-forwarder closed {} without an answer", path);
  return out.substr(0, nl);
}

}  // namespace fy::fwd

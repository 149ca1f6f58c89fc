// An owned file descriptor: closed when the owner goes. The one fd owner of
// every binary (the forwarder's sockets and namespaces, fy-wall's lock file,
// the engine client's socket, the Network Log's files), so a close is never
// forgotten on an early return and never done twice.
//
// Contract: move-only; a moved-from Fd holds -1. release() hands the
// descriptor to a caller who closes it itself (libuv's uv_*_open, for one);
// reset(fd) closes what was held and takes fd. close(2)'s own errors are
// ignored, as there is nothing an owner can do about them after the fact
// (a writer that must know whether its data reached the disk fsyncs first).
#pragma once

#include <unistd.h>

#include <utility>

namespace fy {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  [[nodiscard]] int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace fy

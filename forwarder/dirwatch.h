// DirWatch: one inotify watch (uv_fs_event_t) on a directory that may not
// exist yet, may be removed and re-created, or renamed away.
//
// Ownership contract (the fix for a double close that aborted the forwarder
// in uv__finish_close when the bridge directory was missing at start): every
// arm() makes a fresh heap handle, and drop() is the one close point. The
// handle is freed by its own close callback, so a handle whose close is
// still pending is never initialised again, and nothing else closes it.
//
// on_event runs for every inotify event while armed. When the event says the
// directory itself is gone (removed, renamed, its inode replaced) or libuv
// reports an error, the watch drops itself before on_event runs; the caller
// re-arms (the forwarder's poll timer does). on_event must not destroy the
// DirWatch.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <functional>
#include <string>

namespace fy::fwd {

class DirWatch {
 public:
  DirWatch(uv_loop_t* loop, std::function<void()> on_event);
  ~DirWatch();  // drop(); the pending close completes in the loop's next turn
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  // Watches dir; false (and not armed) when it cannot be watched now (it does
  // not exist, inotify limits). Re-arming while armed drops the old watch.
  bool arm(const std::string& dir);
  void drop();
  bool armed() const { return h_ != nullptr; }
  const std::string& dir() const { return dir_; }
  uint64_t drops() const { return drops_; }  // watches dropped because the dir went away

 private:
  static void on_fs_event(uv_fs_event_t* h, const char* name, int events, int status);
  bool dir_still_there() const;

  uv_loop_t* loop_;
  std::function<void()> on_event_;
  uv_fs_event_t* h_ = nullptr;  // owned; handed to uv_close only by drop()
  std::string dir_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint64_t drops_ = 0;
};

}  // namespace fy::fwd

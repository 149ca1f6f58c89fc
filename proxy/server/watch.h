// Watches one file that others rewrite (atomically, by rename): a directory
// watch (inotify) for promptness plus a 1 s stat poll as the fallback; bursts
// of events become one callback after a 50 ms debounce.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

namespace fy::proxy {

class FileWatch {
 public:
  FileWatch(uv_loop_t* loop, std::string path, std::function<void()> on_change);
  ~FileWatch();
  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;
  void start();
  // Closes the handles; the object may be destroyed once the loop has run
  // their close callbacks (the owner drains the loop before freeing).
  void close();

 private:
  static void on_event(uv_fs_event_t* h, const char* filename, int events, int status);
  static void on_poll(uv_fs_poll_t* h, int status, const uv_stat_t* prev, const uv_stat_t* curr);
  static void on_debounce(uv_timer_t* h);
  std::string path_;
  std::string base_;
  std::function<void()> on_change_;
  uv_fs_event_t event_;
  uv_fs_poll_t poll_;
  uv_timer_t debounce_;
  bool started_ = false;
};

}  // namespace fy::proxy

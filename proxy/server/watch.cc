#include "proxy/server/watch.h"

namespace fy::proxy {

FileWatch::FileWatch(uv_loop_t* loop, std::string path, std::function<void()> on_change)
    : path_(std::move(path)), on_change_(std::move(on_change)) {
  size_t slash = path_.rfind('/');
  base_ = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  uv_fs_event_init(loop, &event_);
  uv_fs_poll_init(loop, &poll_);
  uv_timer_init(loop, &debounce_);
  event_.data = poll_.data = debounce_.data = this;
}

FileWatch::~FileWatch() = default;

void FileWatch::start() {
  started_ = true;
  size_t slash = path_.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  // The directory, not the file: an atomic rename replaces the file's inode.
  uv_fs_event_start(&event_, on_event, dir.c_str(), 0);
  uv_fs_poll_start(&poll_, on_poll, path_.c_str(), 1000);
}

void FileWatch::close() {
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&event_),
                         reinterpret_cast<uv_handle_t*>(&poll_),
                         reinterpret_cast<uv_handle_t*>(&debounce_)}) {
    if (!uv_is_closing(h)) uv_close(h, nullptr);
  }
}

void FileWatch::on_event(uv_fs_event_t* h, const char* filename, int, int status) {
  auto* self = static_cast<FileWatch*>(h->data);
  if (status < 0) return;
  if (filename && self->base_ != filename) return;
  uv_timer_start(&self->debounce_, on_debounce, 50, 0);
}

void FileWatch::on_poll(uv_fs_poll_t* h, int, const uv_stat_t*, const uv_stat_t*) {
  auto* self = static_cast<FileWatch*>(h->data);
  uv_timer_start(&self->debounce_, on_debounce, 50, 0);
}

void FileWatch::on_debounce(uv_timer_t* h) { static_cast<FileWatch*>(h->data)->on_change_(); }

}  // namespace fy::proxy

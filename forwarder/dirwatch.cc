#include "forwarder/dirwatch.h"

#include <sys/stat.h>

namespace fy::fwd {

namespace {
void free_handle(uv_handle_t* h) { delete reinterpret_cast<uv_fs_event_t*>(h); }
}  // namespace

DirWatch::DirWatch(uv_loop_t* loop, std::function<void()> on_event)
    : loop_(loop), on_event_(std::move(on_event)) {}

DirWatch::~DirWatch() { drop(); }

bool DirWatch::arm(const std::string& dir) {
  drop();
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  auto* h = new uv_fs_event_t{};
  uv_fs_event_init(loop_, h);
  h->data = this;
  if (uv_fs_event_start(h, &DirWatch::on_fs_event, dir.c_str(), 0) != 0) {
    // Initialised, never started: this handle is closed here and freed by
    // its callback; h_ never saw it.
    uv_close(reinterpret_cast<uv_handle_t*>(h), free_handle);
    return false;
  }
  h_ = h;
  dir_ = dir;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  return true;
}

void DirWatch::drop() {
  if (!h_) return;
  uv_fs_event_t* h = h_;
  h_ = nullptr;
  h->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(h), free_handle);  // stops it, frees it
}

bool DirWatch::dir_still_there() const {
  struct stat st{};
  return ::stat(dir_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

void DirWatch::on_fs_event(uv_fs_event_t* h, const char* /*name*/, int events, int status) {
  auto* self = static_cast<DirWatch*>(h->data);
  if (!self || self->h_ != h) return;  // dropped earlier in this batch of events
  // libuv on Linux reports the directory's own removal (IN_DELETE_SELF,
  // IN_MOVE_SELF, IN_IGNORED) as UV_RENAME with status 0: check the inode.
  if (status < 0 || ((events & UV_RENAME) && !self->dir_still_there())) {
    self->drop();
    ++self->drops_;
  }
  if (self->on_event_) self->on_event_();
}

}  // namespace fy::fwd

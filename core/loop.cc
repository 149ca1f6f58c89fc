#include "core/loop.h"

namespace fy::uv {

std::string error_string(int rc) {
  return std::string(uv_err_name(rc)) + ": " + uv_strerror(rc);
}

int close_all_and_drain(uv_loop_t* loop) {
  uv_walk(
      loop,
      [](uv_handle_t* h, void*) {
        if (!uv_is_closing(h)) uv_close(h, nullptr);
      },
      nullptr);
  uv_run(loop, UV_RUN_DEFAULT);
  return uv_loop_close(loop);
}

}  // namespace fy::uv

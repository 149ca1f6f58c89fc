// libuv helpers. Ownership rules every daemon follows (libuv's own):
//  - a handle's memory is freed only in or after its close callback;
//  - a uv_write_t lives until its callback;
//  - objects embed their handles by value and count pending closes, freeing
//    themselves when the last close callback has run (see CloseCounter).
#pragma once

#include <uv.h>

#include <string>
#include <string_view>

#include "core/result.h"

namespace fy::uv {

// "ECONNREFUSED: connection refused".
std::string error_string(int rc);

inline Result<void> check(int rc, std::string_view what) {
  if (rc >= 0) return {};
  return make_error(Errc::io, "{}: {}", what, error_string(rc));
}

// Starts closing `h` unless it is closing already (or was never initialized:
// pass handles whose `data` you set at init, and check `initialized`).
template <class H>
void close(H* h, uv_close_cb cb) {
  auto* hh = reinterpret_cast<uv_handle_t*>(h);
  if (!uv_is_closing(hh)) uv_close(hh, cb);
}

// Counts handles an object has started to close; `done()` returns true once
// every close callback has run and the object may be freed.
class CloseCounter {
 public:
  void started() { ++pending_; }
  bool finished_one() { return --pending_ == 0; }
  int pending() const { return pending_; }

 private:
  int pending_ = 0;
};

// Runs every handle still open on `loop` through uv_close and spins the loop
// until they are gone; returns uv_loop_close's result. For tests and for the
// last step of a daemon's shutdown.
int close_all_and_drain(uv_loop_t* loop);

}  // namespace fy::uv

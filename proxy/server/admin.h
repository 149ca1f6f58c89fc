// The admin endpoint (loopback): GET /healthz answers "ok" with the policy
// state, GET /metrics the Prometheus text of the server's counters. One
// request per connection; anything else is 404/405.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

#include "core/result.h"

namespace fy::proxy {

class Server;

// A listening TCP socket that keeps serving through accept(2) failures.
//
// libuv retries a failed accept in a loop without returning to the event loop.
// On EMFILE/ENFILE it first tries its own trick (close a spare descriptor,
// accept and close every pending client, reopen the spare); when that spare is
// gone too, the loop would spin, calling back with the error on every turn.
// So on any accept error the Listener stops accepting for `pause_ms`: it closes
// its libuv handle (freeing that descriptor) while a duplicate of the socket,
// taken at listen(), keeps it bound and listening, so clients wait in the
// kernel's backlog instead of being refused; then it resumes on the same
// socket, or pauses again while no descriptor can be had.
//
// Ownership: the handles are members; the Listener must outlive their close
// callbacks (close(), then let the loop run). Loop thread only.
class Listener {
 public:
  // A client is waiting: call uv_accept on the stream (or let it wait).
  using AcceptFn = std::function<void(uv_stream_t*)>;
  // accept failed with `status` (a libuv error); accepting pauses.
  using ErrorFn = std::function<void(int status)>;

  Listener(uv_loop_t* loop, int backlog, AcceptFn on_accept, ErrorFn on_error,
           uint64_t pause_ms = 100);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds "ip:port" (port may be 0) and listens; returns the bound port.
  Result<int> listen(const std::string& endpoint);
  // Stops accepting for good and closes the socket. Idempotent.
  void close();
  bool paused() const { return state_ == State::paused; }
  uint64_t pause_ms() const { return pause_ms_; }

 private:
  enum class State { idle, listening, paused, closed };
  static void on_connection(uv_stream_t* s, int status);
  static void on_resume(uv_timer_t* t);
  static void on_tcp_closed(uv_handle_t* h);
  void pause();

  uv_loop_t* loop_;
  int backlog_;
  AcceptFn on_accept_;
  ErrorFn on_error_;
  uint64_t pause_ms_;
  uv_tcp_t tcp_;
  uv_timer_t timer_;
  bool tcp_open_ = false;  // tcp_ initialized and its close callback not yet run
  int spare_fd_ = -1;      // a duplicate of the listening socket
  State state_ = State::idle;
};

class Admin {
 public:
  Admin(Server& srv, uv_loop_t* loop);
  ~Admin();
  // Binds `endpoint` ("127.0.0.1:0"); returns the bound port.
  Result<int> listen(const std::string& endpoint);
  void close();

 private:
  Server& srv_;
  Listener listener_;
};

// Binds a TCP handle to "ip:port" (port may be 0) and listens.
Result<int> bind_and_listen(uv_tcp_t* tcp, const std::string& endpoint, int backlog,
                            uv_connection_cb cb);

}  // namespace fy::proxy

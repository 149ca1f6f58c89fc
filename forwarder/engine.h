// The data path's event engine: an inner edge-triggered epoll set driven by
// one libuv poll handle, plus one-shot timers, plus deferred deletion.
//
// Why not a uv_poll_t per socket: a relay through splice(2) wants raw fds, a
// re-dial wants to swap the upstream fd under a live connection, and a
// connection should be freeable the moment it closes. libuv's rule that a
// handle's memory outlives its close callback would make every connection a
// two-step free and every re-dial a handle dance. So libuv owns the loop, the
// signals, the control socket, the namespace watchers and the thread pool;
// this engine owns the listening and relayed sockets.
//
// Contracts:
//  - One engine per worker (forwarder/worker.h), used on that worker's thread
//    only, except watch(), which is one epoll_ctl and may be called from any
//    thread (the main thread registers a new listener's sockets with it).
//  - Watch() registers an fd once (EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET for
//    relayed sockets, level-triggered EPOLLIN for listeners); closing the fd
//    removes it. A Watcher must outlive its registration.
//  - Events are never delivered synchronously from Watch() or a timer call.
//  - retire() queues an object for deletion after the current batch of events,
//    so a handler may close a connection that a later event in the same batch
//    still names; handlers check the object's own closed flag.
#pragma once

#include <uv.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace fy::fwd {

class Watcher {
 public:
  virtual ~Watcher() = default;
  // `events` is the epoll event mask of the one fd this watcher registered.
  virtual void on_io(uint32_t events) = 0;
};

class Retirable {
 public:
  virtual ~Retirable() = default;
};

class Engine;

// A one-shot timer slot owned by its user; at most one deadline at a time.
class TimerSlot {
 public:
  virtual ~TimerSlot() = default;
  virtual void on_timer() = 0;

 private:
  friend class Engine;
  std::multimap<uint64_t, TimerSlot*>::iterator it_;
  bool armed_ = false;
};

class Engine {
 public:
  explicit Engine(uv_loop_t* loop);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts polling; false when epoll cannot be created.
  bool start();
  // Stops the libuv handles; `done` runs after both are closed.
  void stop(void (*done)(void*), void* arg);

  bool watch(int fd, uint32_t events, Watcher* w);
  // Replaces the event mask of a watched fd (EPOLL_CTL_MOD: readiness is
  // re-checked, so an edge that is already there is delivered).
  bool modify(int fd, uint32_t events, Watcher* w);
  void unwatch(int fd);

  // Arms `t` to fire once after `ms`; re-arming replaces the deadline.
  void arm(TimerSlot* t, uint64_t ms);
  void disarm(TimerSlot* t);

  // Calls `w->on_io(0)` on a later turn of the loop, without waiting for an
  // event: for a watcher that stopped before EAGAIN so that others could run
  // (its readiness is still what it last saw). At most once per call; a
  // watcher that goes first must cancel_again() itself.
  void again(Watcher* w);
  void cancel_again(Watcher* w);

  void retire(Retirable* r) { graveyard_.push_back(r); }
  uv_loop_t* loop() const { return loop_; }
  uint64_t now_ms() const { return uv_now(loop_); }

 private:
  static void on_epoll(uv_poll_t* h, int status, int events);
  static void on_uv_timer(uv_timer_t* t);
  static void on_idle(uv_idle_t* h);
  void run_batch();
  void run_timers();
  void reschedule();
  void bury();

  uv_loop_t* loop_;
  int epfd_ = -1;
  uv_poll_t poll_{};
  uv_timer_t timer_{};
  uv_idle_t idle_{};  // active while again_ is not empty: the loop polls without blocking
  bool started_ = false;
  int closing_ = 0;
  void (*stop_done_)(void*) = nullptr;
  void* stop_arg_ = nullptr;
  std::multimap<uint64_t, TimerSlot*> timers_;
  std::vector<Retirable*> graveyard_;
  std::vector<Watcher*> again_;
};

}  // namespace fy::fwd

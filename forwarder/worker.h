// One event loop of the data path ([limits] workers; docs/fy-forwarder.md,
// "Workers").
//
// Worker 0 runs on the daemon's own loop, beside the namespace following, the
// control socket and the signals; workers 1..n-1 each run a thread and a loop
// of their own. Each listening port has one socket per worker (SO_REUSEPORT,
// forwarder/listener.h), so the kernel spreads new connections over the
// workers by their 4-tuple and a connection lives its whole life on the
// worker that accepted it: there is no hand-off and no lock on the data path.
//
// Ownership and threads:
//  - A worker owns its Engine, its PipePool, its RelayContext (counters and
//    the list of live connections) and every Connection it accepted. Only its
//    own thread touches them, with two exceptions that are safe from any
//    thread: Engine::watch() (one epoll_ctl) and reading the counters.
//  - Everything else reaches a worker through post(), which runs a task on
//    the worker's thread, in order. On worker 0 post() from the main thread
//    runs the task at once.
//  - stop() resets the worker's connections, closes its handles and joins
//    its thread; the Worker may be destroyed after it returns.
#pragma once

#include <uv.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/result.h"
#include "forwarder/engine.h"
#include "forwarder/relay.h"

namespace fy::fwd {

class Worker {
 public:
  // `base`: the fields every worker shares (cfg, stamper, attributor,
  // upstream, shared); engine and pipes are the worker's own.
  Worker(unsigned index, const RelayContext& base);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Worker 0: runs on `main_loop` (the caller's thread). Others: make a loop
  // and a thread (`main_loop` null). An error leaves nothing running.
  Result<void> start(uv_loop_t* main_loop);
  // Runs `task` on the worker's thread, after what was posted before. From
  // the main thread; worker 0 (whose thread that is) and a joined worker run
  // it at once.
  void post(std::function<void()> task);
  // Asks the worker to reset every live connection and stop its loop, and
  // returns (worker 0: does it at once).
  void begin_stop();
  // begin_stop() if not asked yet, then joins the thread. From the main
  // thread; again is a no-op.
  void stop();

  // Liveness (from the main thread). beat() asks the worker's loop to note
  // the time; since_beat_ms() is how long ago it last did (0 for worker 0,
  // whose loop is the caller's). A loop that stops turning (a wedged thread)
  // lets it grow while the main loop still answers the probe.
  void beat();
  uint64_t since_beat_ms(uint64_t now_ms) const;

  unsigned index() const { return index_; }
  RelayContext& ctx() { return ctx_; }
  const RelayContext& ctx() const { return ctx_; }
  const PipePool* pipes() const { return pipes_.get(); }

 private:
  static void thread_main(void* arg);
  static void on_async(uv_async_t* a);
  void run_tasks();
  void shutdown_here();  // on the worker's thread

  unsigned index_;
  RelayContext ctx_;
  uv_loop_t* loop_ = nullptr;
  uv_loop_t own_loop_{};  // workers 1..n-1
  bool threaded_ = false;
  uv_thread_t thread_{};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<PipePool> pipes_;
  uv_async_t async_{};
  bool started_ = false;
  bool stopping_ = false;  // begin_stop() ran
  bool stopped_ = false;
  bool joined_ = false;  // the thread has ended: post() runs tasks at once
  std::atomic<uint64_t> beat_ms_{0};  // mono_ms() of the last beat the loop ran
  std::mutex mu_;
  std::vector<std::function<void()>> tasks_;  // guarded by mu_
};

}  // namespace fy::fwd

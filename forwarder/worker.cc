#include "forwarder/worker.h"

#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/clock.h"
#include "core/log.h"

namespace fy::fwd {

Worker::Worker(unsigned index, const RelayContext& base) : index_(index) {
  ctx_.cfg = base.cfg;
  ctx_.stamper = base.stamper;
  ctx_.starts = base.starts;
  ctx_.attributor = base.attributor;
  ctx_.shared = base.shared;
  ctx_.upstream = base.upstream;
  ctx_.upstream_len = base.upstream_len;
  ctx_.worker = index;
}

Worker::~Worker() {
  // A thread still running is stopped and joined first. Worker 0's handles
  // are the main loop's, closed with it before this runs.
  if (threaded_) stop();
  // The engine (and with it the last retired connections) goes now.
  engine_.reset();
  pipes_.reset();
  if (threaded_ && uv_loop_close(&own_loop_) != 0)
    log::warn("worker {}: its event loop still had handles open at exit", index_);
}

Result<void> Worker::start(uv_loop_t* main_loop) {
  threaded_ = main_loop == nullptr;
  if (threaded_) {
    int rc = uv_loop_init(&own_loop_);
    if (rc != 0) {
      threaded_ = false;
      return make_error(Errc::io, "worker {}: event loop: {}", index_, uv_strerror(rc));
    }
    loop_ = &own_loop_;
  } else {
    loop_ = main_loop;
  }
  engine_ = std::make_unique<Engine>(loop_);
  if (!engine_->start()) return make_error(Errc::io, "epoll_create: {}", strerror(errno));
  pipes_ = std::make_unique<PipePool>(ctx_.cfg->pipe_size, ctx_.cfg->bulk_pipes,
                                      &ctx_.shared->pipes_grown);
  ctx_.engine = engine_.get();
  ctx_.pipes = pipes_.get();
  if (threaded_) {
    // On an error: the engine's handles closed on the loop no thread runs.
    auto unwind = [this] {
      engine_->stop(nullptr, nullptr);
      uv_run(loop_, UV_RUN_DEFAULT);
    };
    if (int rc = uv_async_init(loop_, &async_, &Worker::on_async); rc != 0) {
      unwind();
      return make_error(Errc::io, "worker {}: async handle: {}", index_, uv_strerror(rc));
    }
    async_.data = this;
    // Handles are made before the thread runs the loop; from here on only the
    // worker's thread touches the loop.
    int rc = uv_thread_create(&thread_, &Worker::thread_main, this);
    if (rc != 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
      unwind();
      return make_error(Errc::io, "worker {}: thread: {}", index_, uv_strerror(rc));
    }
  }
  beat_ms_.store(mono_ms(), std::memory_order_relaxed);
  started_ = true;
  return {};
}

void Worker::thread_main(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  // Named for top -H and the tests: "fy-fwd-w<index>".
  std::string name = "fy-fwd-w" + std::to_string(w->index_);
  pthread_setname_np(pthread_self(), name.c_str());
  uv_run(w->loop_, UV_RUN_DEFAULT);
}

void Worker::beat() {
  if (!threaded_ || !started_ || stopping_) return;
  post([this] { beat_ms_.store(mono_ms(), std::memory_order_relaxed); });
}

uint64_t Worker::since_beat_ms(uint64_t now_ms) const {
  if (!threaded_ || !started_ || stopping_) return 0;
  uint64_t b = beat_ms_.load(std::memory_order_relaxed);
  return now_ms > b ? now_ms - b : 0;
}

void Worker::post(std::function<void()> task) {
  if (!threaded_ || joined_) {
    // Worker 0: the caller is on the main loop's thread. A joined worker has
    // no thread left to race with.
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    tasks_.push_back(std::move(task));
  }
  uv_async_send(&async_);
}

void Worker::on_async(uv_async_t* a) { static_cast<Worker*>(a->data)->run_tasks(); }

void Worker::run_tasks() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> g(mu_);
    batch.swap(tasks_);
  }
  for (auto& t : batch) t();
}

void Worker::shutdown_here() {
  while (ctx_.head) ctx_.head->abort_now();
  engine_->stop(nullptr, nullptr);
  if (threaded_) uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
}

void Worker::begin_stop() {
  if (!started_ || stopping_) return;
  stopping_ = true;
  post([this] { shutdown_here(); });  // worker 0: at once
}

void Worker::stop() {
  if (!started_ || stopped_) return;
  begin_stop();
  stopped_ = true;
  if (!threaded_) return;
  uv_thread_join(&thread_);
  joined_ = true;
  // Tasks posted while the loop was ending run here, on this thread.
  run_tasks();
}

}  // namespace fy::fwd

#include "forwarder/engine.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace fy::fwd {

Engine::Engine(uv_loop_t* loop) : loop_(loop) {}

Engine::~Engine() {
  bury();
  if (epfd_ >= 0) ::close(epfd_);
}

bool Engine::start() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return false;
  uv_poll_init(loop_, &poll_, epfd_);
  poll_.data = this;
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
  uv_idle_init(loop_, &idle_);
  idle_.data = this;
  uv_poll_start(&poll_, UV_READABLE, &Engine::on_epoll);
  started_ = true;
  return true;
}

void Engine::stop(void (*done)(void*), void* arg) {
  stop_done_ = done;
  stop_arg_ = arg;
  if (!started_) {
    if (done) done(arg);
    return;
  }
  started_ = false;
  again_.clear();
  closing_ = 3;
  auto cb = [](uv_handle_t* h) {
    auto* self = static_cast<Engine*>(h->data);
    if (--self->closing_ == 0 && self->stop_done_) self->stop_done_(self->stop_arg_);
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), cb);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), cb);
  uv_close(reinterpret_cast<uv_handle_t*>(&idle_), cb);
}

void Engine::again(Watcher* w) {
  if (!started_) return;
  if (again_.empty()) uv_idle_start(&idle_, &Engine::on_idle);
  again_.push_back(w);
}

void Engine::cancel_again(Watcher* w) {
  for (size_t i = 0; i < again_.size(); ++i) {
    if (again_[i] == w) {
      again_.erase(again_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  if (again_.empty() && started_) uv_idle_stop(&idle_);
}

void Engine::on_idle(uv_idle_t* h) {
  auto* self = static_cast<Engine*>(h->data);
  std::vector<Watcher*> batch;
  batch.swap(self->again_);
  // Nothing is freed before bury(): a watcher in this batch that another
  // closed meanwhile is still there, and ignores the call (it is closed).
  for (Watcher* w : batch) w->on_io(0);
  self->bury();
  if (self->again_.empty() && self->started_) uv_idle_stop(&self->idle_);
  self->run_timers();
  self->bury();
  self->reschedule();
}

bool Engine::watch(int fd, uint32_t events, Watcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

bool Engine::modify(int fd, uint32_t events, Watcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0;
}

void Engine::unwatch(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

void Engine::arm(TimerSlot* t, uint64_t ms) {
  if (t->armed_) timers_.erase(t->it_);
  t->it_ = timers_.emplace(uv_now(loop_) + ms, t);
  t->armed_ = true;
  if (t->it_ == timers_.begin()) reschedule();
}

void Engine::disarm(TimerSlot* t) {
  if (!t->armed_) return;
  timers_.erase(t->it_);
  t->armed_ = false;
}

void Engine::on_epoll(uv_poll_t* h, int status, int events) {
  static_cast<Engine*>(h->data)->run_batch();
}

void Engine::on_uv_timer(uv_timer_t* t) {
  auto* self = static_cast<Engine*>(t->data);
  self->run_timers();
  self->bury();
  self->reschedule();
}

void Engine::run_batch() {
  epoll_event evs[256];
  // Bounded rounds so timers and libuv's own handles are never starved.
  for (int round = 0; round < 4; ++round) {
    int n = epoll_wait(epfd_, evs, 256, 0);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) {
      auto* w = static_cast<Watcher*>(evs[i].data.ptr);
      w->on_io(evs[i].events);
    }
    bury();
    if (n < 256) break;
  }
  run_timers();
  bury();
  reschedule();
}

void Engine::run_timers() {
  uint64_t now = uv_now(loop_);
  while (!timers_.empty() && timers_.begin()->first <= now) {
    TimerSlot* t = timers_.begin()->second;
    timers_.erase(timers_.begin());
    t->armed_ = false;
    t->on_timer();
  }
}

void Engine::reschedule() {
  if (!started_) return;
  if (timers_.empty()) {
    uv_timer_stop(&timer_);
    return;
  }
  uint64_t now = uv_now(loop_);
  uint64_t due = timers_.begin()->first;
  uv_timer_start(&timer_, &Engine::on_uv_timer, due > now ? due - now : 0, 0);
}

void Engine::bury() {
  while (!graveyard_.empty()) {
    std::vector<Retirable*> g;
    g.swap(graveyard_);
    for (Retirable* r : g) delete r;
  }
}

}  // namespace fy::fwd

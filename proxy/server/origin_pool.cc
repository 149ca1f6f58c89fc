#include "proxy/server/origin_pool.h"

namespace fy::proxy {

OriginPool::OriginPool(uv_loop_t* loop, size_t per_key, uint64_t idle_ms)
    : loop_(loop), per_key_(per_key), idle_ms_(idle_ms) {
  uv_timer_init(loop, &sweep_);
  sweep_.data = this;
}

OriginPool::~OriginPool() = default;

Stream* OriginPool::take(const std::string& key, StreamHandler* new_owner) {
  auto it = idle_.find(key);
  if (it == idle_.end()) return nullptr;
  while (!it->second.empty()) {
    // Newest first: the one least likely to have been closed by the origin.
    Idle idle = it->second.back();
    it->second.pop_back();
    keys_.erase(idle.stream);
    --count_;
    if (idle.stream->closing() || idle.stream->eof_seen()) continue;  // already dropped
    idle.stream->set_handler(new_owner);
    ++reused_;
    if (it->second.empty()) idle_.erase(it);
    return idle.stream;
  }
  idle_.erase(it);
  return nullptr;
}

void OriginPool::put(const std::string& key, Stream* s) {
  if (closed_ || count_ >= max_total_) {
    if (!closed_) ++full_;
    s->close_and_delete();
    return;
  }
  auto& list = idle_[key];
  if (list.size() >= per_key_) {
    s->close_and_delete();
    return;
  }
  s->set_handler(this);
  s->resume();
  s->start_reading();  // so an end or a stray byte is seen
  list.push_back(Idle{s, uv_now(loop_)});
  keys_[s] = key;
  ++count_;
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&sweep_))) {
    uv_timer_start(&sweep_, on_sweep, idle_ms_, idle_ms_);
    uv_unref(reinterpret_cast<uv_handle_t*>(&sweep_));
  }
}

void OriginPool::drop(Stream& s) {
  auto k = keys_.find(&s);
  if (k != keys_.end()) {
    auto it = idle_.find(k->second);
    if (it != idle_.end()) {
      for (auto i = it->second.begin(); i != it->second.end(); ++i) {
        if (i->stream == &s) {
          it->second.erase(i);
          break;
        }
      }
      if (it->second.empty()) idle_.erase(it);
    }
    keys_.erase(k);
    --count_;
  }
  s.close_and_delete();
}

void OriginPool::on_sweep(uv_timer_t* t) {
  auto* self = static_cast<OriginPool*>(t->data);
  uint64_t now = uv_now(self->loop_);
  for (auto it = self->idle_.begin(); it != self->idle_.end();) {
    auto& list = it->second;
    while (!list.empty() && now - list.front().since_ms >= self->idle_ms_) {
      Stream* s = list.front().stream;
      list.pop_front();
      self->keys_.erase(s);
      --self->count_;
      s->close_and_delete();
    }
    it = list.empty() ? self->idle_.erase(it) : std::next(it);
  }
  if (self->count_ == 0) uv_timer_stop(&self->sweep_);
}

void OriginPool::clear() {
  for (auto& [key, list] : idle_)
    for (Idle& i : list) i.stream->close_and_delete();
  idle_.clear();
  keys_.clear();
  count_ = 0;
  uv_timer_stop(&sweep_);
}

void OriginPool::close() {
  clear();
  closed_ = true;
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&sweep_)))
    uv_close(reinterpret_cast<uv_handle_t*>(&sweep_), nullptr);
}

}  // namespace fy::proxy

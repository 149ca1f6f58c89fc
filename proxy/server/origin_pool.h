// Idle cleartext origin connections, kept a short while for the next client
// that goes to the same origin (a client that opens a new connection per
// request otherwise costs the proxy a new origin connection each time).
//
// Contract: only idle, reusable, cleartext connections are put here (never
// TLS: a decrypted connection's origin is its own); a pooled connection that
// reads anything, ends or fails is closed and dropped; one is kept at most
// `idle_ms`; at most `per_key` per origin and `max_total` in all (each holds a
// descriptor the clients' budget counts); clear() closes them all (a policy
// change, a drain). take() hands the Stream and its ownership to the caller,
// which becomes its handler.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include "proxy/io/stream.h"

namespace fy::proxy {

class OriginPool final : public StreamHandler {
 public:
  OriginPool(uv_loop_t* loop, size_t per_key = 16, uint64_t idle_ms = 2000);
  ~OriginPool() override;
  Stream* take(const std::string& key, StreamHandler* new_owner);
  void put(const std::string& key, Stream* s);
  // The bound on all idle connections together; one past it is closed, not kept.
  void set_max_total(size_t n) { max_total_ = n; }
  void clear();
  void close();  // for shutdown: clear() and stop the sweep timer
  size_t size() const { return count_; }
  uint64_t reused() const { return reused_; }
  uint64_t full() const { return full_; }  // connections closed because the pool was full

  // StreamHandler: what a pooled connection may do is end.
  void on_read(Stream& s, const ChunkRef&, const char*, size_t) override { drop(s); }
  void on_eof(Stream& s) override { drop(s); }
  void on_error(Stream& s, Errc, const std::string&) override { drop(s); }
  void on_ready(Stream&) override {}
  void on_closed(Stream&) override {}

 private:
  struct Idle {
    Stream* stream;
    uint64_t since_ms;
  };
  void drop(Stream& s);
  static void on_sweep(uv_timer_t* t);
  uv_loop_t* loop_;
  size_t per_key_;
  size_t max_total_ = SIZE_MAX;
  uint64_t idle_ms_;
  std::unordered_map<std::string, std::deque<Idle>> idle_;
  std::unordered_map<Stream*, std::string> keys_;
  size_t count_ = 0;
  uint64_t reused_ = 0;
  uint64_t full_ = 0;
  uv_timer_t sweep_;
  bool closed_ = false;
};

}  // namespace fy::proxy

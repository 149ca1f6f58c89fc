// Pooled, reference-counted byte chunks and the write queue built on them.
//
// Reads land in a Chunk; forwarding a byte range means pushing a Slice that
// holds a reference to the chunk, so relayed bytes are never copied. Generated
// bytes (a rewritten head, a chunk-size line) are copied into the queue's own
// chunks. A chunk returns to its thread's pool when the last reference drops.
//
// Thread model: a chunk belongs to the thread that allocated it (each event
// loop has its own pool). Never hand a ChunkRef to another thread.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string_view>
#include <utility>

namespace fy {

class Chunk {
 public:
  static constexpr size_t kSize = 64 * 1024;
  char* data() { return bytes_; }
  const char* data() const { return bytes_; }
  uint32_t refs() const { return refs_; }

 private:
  friend class ChunkRef;
  friend class ChunkPool;
  uint32_t refs_ = 0;
  Chunk* next_free_ = nullptr;
  alignas(16) char bytes_[kSize];
};

// Intrusive owning pointer to a Chunk.
class ChunkRef {
 public:
  ChunkRef() = default;
  explicit ChunkRef(Chunk* c) : c_(c) {
    if (c_) ++c_->refs_;
  }
  ChunkRef(const ChunkRef& o) : ChunkRef(o.c_) {}
  ChunkRef(ChunkRef&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  ChunkRef& operator=(ChunkRef o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~ChunkRef() { reset(); }
  void reset();
  Chunk* get() const { return c_; }
  Chunk* operator->() const { return c_; }
  explicit operator bool() const { return c_ != nullptr; }
  // True when this is the only reference: the bytes may be overwritten.
  bool unique() const { return c_ && c_->refs_ == 1; }

 private:
  Chunk* c_ = nullptr;
};

// Per-thread pool. Keeps at most `kMaxFree` idle chunks; the rest go back to
// the allocator so an idle daemon shrinks after a burst.
class ChunkPool {
 public:
  static constexpr size_t kMaxFree = 64;
  static ChunkRef alloc();
  static void release(Chunk* c);
  static size_t live();  // chunks allocated and not yet returned (this thread)
  // Frees a free list at thread exit (internal).
  static void destroy_list(Chunk* head);
};

struct Slice {
  ChunkRef chunk;
  uint32_t off = 0;
  uint32_t len = 0;
  const char* data() const { return chunk->data() + off; }
};

// Bytes waiting to be written to one stream. At most one write is in flight;
// the owner peeks iovecs for its writer (writev, uv_write, SSL) and
// consume(n)s what left. Pure: no libuv (the Stream turns the iovecs into
// uv_buf_t).
class WriteQueue {
 public:
  static constexpr size_t kMaxIov = 32;

  // Zero-copy: shares the chunk holding [p, p+n).
  void push(const ChunkRef& c, const char* p, size_t n);
  // Copies the bytes into the queue's own chunks.
  void push_copy(const char* p, size_t n);
  void push_copy(std::string_view s) { push_copy(s.data(), s.size()); }

  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  // Fills up to `max` buffers from the front; returns how many.
  size_t peek(iovec* bufs, size_t max) const;
  // Drops the first n bytes.
  void consume(size_t n);
  void clear();

 private:
  std::deque<Slice> slices_;
  size_t bytes_ = 0;
};

}  // namespace fy

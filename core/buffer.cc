#include "core/buffer.h"

#include <cassert>
#include <cstring>
#include <new>

namespace fy {
namespace {

struct PoolState {
  Chunk* free = nullptr;
  size_t nfree = 0;
  size_t live = 0;
  ~PoolState() { ChunkPool::destroy_list(free); }
};

thread_local PoolState g_pool;

}  // namespace

void ChunkRef::reset() {
  if (c_ && --c_->refs_ == 0) ChunkPool::release(c_);
  c_ = nullptr;
}

ChunkRef ChunkPool::alloc() {
  Chunk* c;
  if (g_pool.free) {
    c = g_pool.free;
    g_pool.free = c->next_free_;
    --g_pool.nfree;
  } else {
    c = new Chunk;
  }
  c->next_free_ = nullptr;
  ++g_pool.live;
  return ChunkRef(c);
}

void ChunkPool::release(Chunk* c) {
  --g_pool.live;
  if (g_pool.nfree >= kMaxFree) {
    delete c;
    return;
  }
  c->next_free_ = g_pool.free;
  g_pool.free = c;
  ++g_pool.nfree;
}

size_t ChunkPool::live() { return g_pool.live; }

void ChunkPool::destroy_list(Chunk* head) {
  while (head) {
    Chunk* next = head->next_free_;
    delete head;
    head = next;
  }
}

void WriteQueue::push(const ChunkRef& c, const char* p, size_t n) {
  if (n == 0) return;
  assert(p >= c->data() && p + n <= c->data() + Chunk::kSize);
  uint32_t off = static_cast<uint32_t>(p - c->data());
  // Extend the last slice when the bytes are adjacent in the same chunk.
  if (!slices_.empty()) {
    Slice& last = slices_.back();
    if (last.chunk.get() == c.get() && last.off + last.len == off) {
      last.len += static_cast<uint32_t>(n);
      bytes_ += n;
      return;
    }
  }
  slices_.push_back(Slice{c, off, static_cast<uint32_t>(n)});
  bytes_ += n;
}

void WriteQueue::push_copy(const char* p, size_t n) {
  while (n > 0) {
    // Append into the tail slice's chunk when the queue owns it alone and it
    // has room after the slice.
    if (!slices_.empty()) {
      Slice& last = slices_.back();
      size_t end = last.off + last.len;
      if (last.chunk.unique() && end < Chunk::kSize) {
        size_t take = std::min(n, Chunk::kSize - end);
        memcpy(last.chunk->data() + end, p, take);
        last.len += static_cast<uint32_t>(take);
        bytes_ += take;
        p += take;
        n -= take;
        continue;
      }
    }
    ChunkRef c = ChunkPool::alloc();
    size_t take = std::min(n, Chunk::kSize);
    memcpy(c->data(), p, take);
    slices_.push_back(Slice{std::move(c), 0, static_cast<uint32_t>(take)});
    bytes_ += take;
    p += take;
    n -= take;
  }
}

size_t WriteQueue::peek(iovec* bufs, size_t max) const {
  size_t i = 0;
  for (const Slice& s : slices_) {
    if (i == max) break;
    bufs[i] = iovec{const_cast<char*>(s.data()), s.len};
    ++i;
  }
  return i;
}

void WriteQueue::consume(size_t n) {
  assert(n <= bytes_);
  bytes_ -= n;
  while (n > 0) {
    Slice& s = slices_.front();
    if (n >= s.len) {
      n -= s.len;
      slices_.pop_front();
    } else {
      s.off += static_cast<uint32_t>(n);
      s.len -= static_cast<uint32_t>(n);
      n = 0;
    }
  }
}

void WriteQueue::clear() {
  slices_.clear();
  bytes_ = 0;
}

}  // namespace fy

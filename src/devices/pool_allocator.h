// A device's pooled allocator, over the raw blocks its BlockSource gives (host memory for the
// CPU, device memory for CUDA).
// Small blocks (under kSplitFrom) are reused from per-size free lists. Large blocks are carved
// from segments (the source's blocks): a request takes the smallest free range that holds it,
// split off the front, and a freed block joins the free ranges beside it in its segment. So the
// activations of a decode's later, larger levels are made of the memory its earlier levels freed,
// instead of each size keeping blocks of its own (a bounded pool of exact sizes gave back and
// re-mapped ~4.5 GB of fresh, kernel-zeroed pages in every 1024² bf16 decode).
// `in_use` counts bytes handed out, `peak` its high-water mark. The pool never makes the
// allocator hold more than pool_bound() of the most it has had in use since the pool was last
// emptied, as far as whole free blocks and segments can be given back: a new block that would pass
// that first returns the least recently freed ones to the system. So the process holds about what
// the memory plan predicts (the in-use peak), not that plus a block of every size a run ever asked
// for.
// With a capacity set, an allocation that would push in-use + pooled bytes past it first
// drops the pool, then fails with an error naming the requested and available bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "core/buffer.h"

namespace kiln {

// Where a pool's blocks come from: `allocate` returns at least `bytes` bytes (nullptr when the
// device has none left), `free` takes them back with the same `bytes`.
struct BlockSource {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* p, size_t bytes)> free;
};

struct AllocatorStats {
  size_t in_use_bytes = 0;    // currently handed out (rounded block sizes)
  size_t peak_bytes = 0;      // high-water mark of in_use_bytes
  size_t pooled_bytes = 0;    // freed bytes kept for reuse (small blocks and free ranges of segments)
  size_t reserved_peak_bytes = 0;  // high-water mark of in_use_bytes + pooled_bytes (what the source gave)
  size_t capacity_bytes = 0;  // 0 = unlimited
  uint64_t allocations = 0;   // requests served
  uint64_t pool_hits = 0;     // requests served from the pool
  uint64_t pool_evictions = 0;  // pooled blocks and segments returned to the system to stay within the bound
  uint64_t source_allocations = 0;  // blocks and segments taken from the source
};

class PoolAllocator {
 public:
  PoolAllocator(Device device, BlockSource source);
  ~PoolAllocator();
  PoolAllocator(const PoolAllocator&) = delete;
  PoolAllocator& operator=(const PoolAllocator&) = delete;

  // Returns a buffer of at least `bytes` bytes, 64-byte aligned (large blocks keep the source's
  // alignment up to kSegmentAlign). Its release returns the block.
  // When the source has no block left, the pool is returned to it and the allocation tried again.
  BufferPtr allocate(size_t bytes);

  void set_capacity(size_t bytes);  // 0 = unlimited
  AllocatorStats stats() const;
  void reset_peak();
  void release_pool();  // frees every pooled block and every wholly free segment back to the system

  // Blocks of this size and more are carved from segments.
  static constexpr size_t kSplitFrom = size_t(4) << 20;
  // Large block sizes are multiples of this (a huge page), so every carved block starts on one
  // when its segment does.
  static constexpr size_t kSegmentAlign = size_t(2) << 20;

  // Block size a request is rounded up to (size classes keep the pool reusable).
  static size_t round_size(size_t bytes);
  // What in use plus pooled may reach for an in-use peak: 1.5x. The half on top keeps blocks that
  // a step frees late (the device frees them as its kernels finish) for the next step; with no
  // slack a 1024² bf16 step re-mapped and re-faulted ~100 blocks each time and ran 25 % slower.
  static size_t pool_bound(size_t in_use_peak);

 private:
  struct Pooled {
    size_t block;
    void* p;
    uint64_t freed_at;
  };
  using Lru = std::list<Pooled>;  // least recently freed first

  struct Segment {
    size_t size;
    size_t used = 0;       // bytes of it handed out
    uint64_t freed_at = 0;  // when a block of it was last given back
  };
  struct Range {
    uintptr_t segment;  // base of the segment it lies in
    size_t size;
    bool free;
  };

  void* take_small_locked(size_t block);
  void* take_large_locked(size_t block);
  void* take_from_source_locked(size_t block, size_t bytes);
  void give_back(void* p, size_t block);
  void give_back_large_locked(uintptr_t at, size_t block);
  bool evict_oldest_locked();
  void release_pool_locked();
  void evict_small_locked(Lru::iterator it);
  void release_segment_locked(std::map<uintptr_t, Segment>::iterator seg);

  Device device_;
  BlockSource source_;
  mutable std::mutex mu_;
  uint64_t clock_ = 0;  // counts give-backs: the age of pooled memory
  // Small blocks.
  Lru lru_;
  std::multimap<size_t, Lru::iterator> free_;  // block size -> its entry in lru_
  // Large blocks: segments, and every range of them (in use or free) by address.
  std::map<uintptr_t, Segment> segments_;
  std::map<uintptr_t, Range> ranges_;
  std::set<std::pair<size_t, uintptr_t>> free_ranges_;  // (size, address): the best fit first
  size_t high_water_ = 0;  // most in use since the pool was last emptied: the pool's bound's base
  AllocatorStats stats_;
};

}  // namespace kiln

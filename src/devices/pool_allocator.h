// A device's pooled allocator, over the raw blocks its BlockSource gives (host memory for the
// CPU, device memory for CUDA).
// Freed blocks go back to per-size free lists and are reused; `in_use` counts bytes
// handed out, `peak` its high-water mark. The pool never makes the allocator hold more than
// pool_bound() of the most it has had in use since the pool was last emptied: a new block that
// would pass that first returns the least recently freed pooled blocks to the system. So the
// process holds about what the memory plan predicts (the in-use peak), not that plus a block of
// every size a run ever asked for (tiles of several shapes would otherwise each keep their own
// set: 3.46 GB for a 0.80 GB in-use peak at 1024²).
// With a capacity set, an allocation that would push in-use + pooled bytes past it first
// drops the pool, then fails with an error naming the requested and available bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
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
  size_t pooled_bytes = 0;    // freed blocks kept for reuse
  size_t reserved_peak_bytes = 0;  // high-water mark of in_use_bytes + pooled_bytes (<= pool_bound(peak_bytes))
  size_t capacity_bytes = 0;  // 0 = unlimited
  uint64_t allocations = 0;   // requests served
  uint64_t pool_hits = 0;     // requests served from the pool
  uint64_t pool_evictions = 0;  // pooled blocks returned to the system to stay within the bound
};

class PoolAllocator {
 public:
  PoolAllocator(Device device, BlockSource source);
  ~PoolAllocator();
  PoolAllocator(const PoolAllocator&) = delete;
  PoolAllocator& operator=(const PoolAllocator&) = delete;

  // Returns a buffer of at least `bytes` bytes, 64-byte aligned. Its release returns the block.
  // When the source has no block left, the pool is returned to it and the allocation tried again.
  BufferPtr allocate(size_t bytes);

  void set_capacity(size_t bytes);  // 0 = unlimited
  AllocatorStats stats() const;
  void reset_peak();
  void release_pool();  // frees every pooled block back to the system

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
  };
  using Lru = std::list<Pooled>;  // least recently freed first

  void give_back(void* p, size_t block);
  void release_pool_locked();
  void evict_locked(Lru::iterator it);

  Device device_;
  BlockSource source_;
  mutable std::mutex mu_;
  Lru lru_;
  std::multimap<size_t, Lru::iterator> free_;  // block size -> its entry in lru_
  size_t high_water_ = 0;  // most in use since the pool was last emptied: the pool's bound's base
  AllocatorStats stats_;
};

}  // namespace kiln

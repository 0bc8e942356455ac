#include "devices/pool_allocator.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "core/error.h"

namespace kiln {

namespace {
constexpr size_t kAlign = 64;
}

PoolAllocator::PoolAllocator(Device device, BlockSource source) : device_(device), source_(std::move(source)) {}

PoolAllocator::~PoolAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();
}

size_t PoolAllocator::round_size(size_t bytes) {
  if (bytes <= 4096) return bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  // Above 4 KiB: four size classes per power of two (at most 25% slack).
  size_t pow2 = 4096;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

size_t PoolAllocator::pool_bound(size_t in_use_peak) { return in_use_peak + in_use_peak / 2; }

BufferPtr PoolAllocator::allocate(size_t bytes) {
  const size_t block = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The capacity bounds what is in use, however the block is found (pooled or new).
    if (stats_.capacity_bytes != 0 && stats_.in_use_bytes + block > stats_.capacity_bytes) {
      fail("alloc", "out of memory on ", device_.str(), ": requested ", bytes, " bytes (block ", block,
           "), available ", stats_.capacity_bytes - std::min(stats_.capacity_bytes, stats_.in_use_bytes),
           " of capacity ", stats_.capacity_bytes, " bytes (", stats_.in_use_bytes, " in use)");
    }
    auto it = free_.find(block);
    if (it != free_.end()) {
      p = it->second->p;
      lru_.erase(it->second);
      free_.erase(it);
      stats_.pooled_bytes -= block;
      ++stats_.pool_hits;
    } else {
      if (stats_.capacity_bytes != 0 &&
          stats_.in_use_bytes + stats_.pooled_bytes + block > stats_.capacity_bytes) {
        release_pool_locked();
      }
      // Stay within the pool's bound (or the new in-use total, when that is higher).
      const size_t bound = std::max(pool_bound(high_water_), stats_.in_use_bytes + block);
      while (!lru_.empty() && stats_.in_use_bytes + stats_.pooled_bytes + block > bound) {
        evict_locked(lru_.begin());
      }
      p = source_.allocate(block);
      if (!p && !lru_.empty()) {  // the device is full: what the pool holds goes back first
        release_pool_locked();
        p = source_.allocate(block);
      }
      KILN_CHECK(p != nullptr, "alloc", "out of memory on ", device_.str(), ": the device has no block of ", block,
                 " bytes left (", stats_.in_use_bytes, " bytes in use)");
    }
    stats_.in_use_bytes += block;
    high_water_ = std::max(high_water_, stats_.in_use_bytes);
    if (stats_.in_use_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.in_use_bytes;
    stats_.reserved_peak_bytes =
        std::max(stats_.reserved_peak_bytes, stats_.in_use_bytes + stats_.pooled_bytes);
    ++stats_.allocations;
  }
  return std::make_shared<Buffer>(p, bytes, device_, [this, p, block] { give_back(p, block); });
}

void PoolAllocator::give_back(void* p, size_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= block;
  free_.emplace(block, lru_.insert(lru_.end(), Pooled{block, p}));
  stats_.pooled_bytes += block;
}

void PoolAllocator::set_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.capacity_bytes = bytes;
}

AllocatorStats PoolAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void PoolAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.in_use_bytes;
  stats_.reserved_peak_bytes = stats_.in_use_bytes + stats_.pooled_bytes;
}

void PoolAllocator::release_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();
}

void PoolAllocator::release_pool_locked() {
  for (const Pooled& b : lru_) source_.free(b.p, b.block);
  lru_.clear();
  free_.clear();
  stats_.pooled_bytes = 0;
  high_water_ = stats_.in_use_bytes;
}

void PoolAllocator::evict_locked(Lru::iterator it) {
  auto [first, last] = free_.equal_range(it->block);
  for (auto f = first; f != last; ++f) {
    if (f->second == it) {
      free_.erase(f);
      break;
    }
  }
  stats_.pooled_bytes -= it->block;
  ++stats_.pool_evictions;
  source_.free(it->p, it->block);
  lru_.erase(it);
}

}  // namespace kiln

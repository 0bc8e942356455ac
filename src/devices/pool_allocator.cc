#include "devices/pool_allocator.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>

#include "core/error.h"

namespace kiln {

namespace {
constexpr size_t kAlign = 64;
}

PoolAllocator::PoolAllocator(Device device, BlockSource source) : device_(device), source_(std::move(source)) {}

PoolAllocator::~PoolAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();  // segments with blocks still handed out stay with their holders
}

size_t PoolAllocator::round_size(size_t bytes) {
  if (bytes <= 4096) return bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  // Above 4 KiB: four size classes per power of two (at most 25% slack); large blocks in whole
  // segment alignments.
  size_t pow2 = 4096;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const size_t step = pow2 >= kSplitFrom ? std::max(pow2 / 4, kSegmentAlign) : pow2 / 4;
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
    p = block >= kSplitFrom ? take_large_locked(block) : take_small_locked(block);
    if (p) {
      ++stats_.pool_hits;
    } else {
      p = take_from_source_locked(block, bytes);
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

void* PoolAllocator::take_small_locked(size_t block) {
  auto it = free_.find(block);
  if (it == free_.end()) return nullptr;
  void* p = it->second->p;
  lru_.erase(it->second);
  free_.erase(it);
  stats_.pooled_bytes -= block;
  return p;
}

// The smallest free range that holds the block; what it has past the block stays free.
void* PoolAllocator::take_large_locked(size_t block) {
  const auto fit = free_ranges_.lower_bound({block, 0});
  if (fit == free_ranges_.end()) return nullptr;
  const uintptr_t at = fit->second;
  free_ranges_.erase(fit);
  Range& r = ranges_.at(at);
  const size_t rest = r.size - block;
  r.size = block;
  r.free = false;
  if (rest > 0) {
    ranges_.emplace(at + block, Range{r.segment, rest, true});
    free_ranges_.emplace(rest, at + block);
  }
  segments_.at(r.segment).used += block;
  stats_.pooled_bytes -= block;
  return reinterpret_cast<void*>(at);
}

void* PoolAllocator::take_from_source_locked(size_t block, size_t bytes) {
  if (stats_.capacity_bytes != 0 && stats_.in_use_bytes + stats_.pooled_bytes + block > stats_.capacity_bytes) {
    release_pool_locked();
  }
  // Stay within the pool's bound (or the new in-use total, when that is higher).
  const size_t bound = std::max(pool_bound(high_water_), stats_.in_use_bytes + block);
  while (stats_.in_use_bytes + stats_.pooled_bytes + block > bound && evict_oldest_locked()) {
  }
  void* p = source_.allocate(block);
  if (!p && stats_.pooled_bytes > 0) {  // the device is full: what the pool holds goes back first
    release_pool_locked();
    p = source_.allocate(block);
  }
  KILN_CHECK(p != nullptr, "alloc", "out of memory on ", device_.str(), ": the device has no block of ", block,
             " bytes left for ", bytes, " requested (", stats_.in_use_bytes, " bytes in use)");
  ++stats_.source_allocations;
  if (block >= kSplitFrom) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    segments_.emplace(at, Segment{block, block, clock_});
    ranges_.emplace(at, Range{at, block, false});
  }
  return p;
}

void PoolAllocator::give_back(void* p, size_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= block;
  stats_.pooled_bytes += block;
  ++clock_;
  if (block >= kSplitFrom) {
    give_back_large_locked(reinterpret_cast<uintptr_t>(p), block);
  } else {
    free_.emplace(block, lru_.insert(lru_.end(), Pooled{block, p, clock_}));
  }
}

// The block becomes free and joins the free ranges on either side of it in its segment.
void PoolAllocator::give_back_large_locked(uintptr_t at, size_t block) {
  auto r = ranges_.find(at);
  Segment& seg = segments_.at(r->second.segment);
  seg.used -= block;
  seg.freed_at = clock_;
  r->second.free = true;
  const auto next = std::next(r);
  if (next != ranges_.end() && next->second.free && next->second.segment == r->second.segment) {
    free_ranges_.erase({next->second.size, next->first});
    r->second.size += next->second.size;
    ranges_.erase(next);
  }
  if (r != ranges_.begin()) {
    const auto prev = std::prev(r);
    if (prev->second.free && prev->second.segment == r->second.segment) {
      free_ranges_.erase({prev->second.size, prev->first});
      prev->second.size += r->second.size;
      ranges_.erase(r);
      r = prev;
    }
  }
  free_ranges_.emplace(r->second.size, r->first);
}

// Returns the least recently freed of the pooled small blocks and wholly free segments to the
// system; false when there is none (a segment with a block still in use cannot go back).
bool PoolAllocator::evict_oldest_locked() {
  auto oldest = segments_.end();
  for (auto s = segments_.begin(); s != segments_.end(); ++s) {
    if (s->second.used == 0 && (oldest == segments_.end() || s->second.freed_at < oldest->second.freed_at)) oldest = s;
  }
  if (!lru_.empty() && (oldest == segments_.end() || lru_.front().freed_at <= oldest->second.freed_at)) {
    evict_small_locked(lru_.begin());
  } else if (oldest != segments_.end()) {
    release_segment_locked(oldest);
  } else {
    return false;
  }
  ++stats_.pool_evictions;
  return true;
}

void PoolAllocator::evict_small_locked(Lru::iterator it) {
  auto [first, last] = free_.equal_range(it->block);
  for (auto f = first; f != last; ++f) {
    if (f->second == it) {
      free_.erase(f);
      break;
    }
  }
  stats_.pooled_bytes -= it->block;
  source_.free(it->p, it->block);
  lru_.erase(it);
}

// A wholly free segment is one free range, at its base.
void PoolAllocator::release_segment_locked(std::map<uintptr_t, Segment>::iterator seg) {
  const uintptr_t at = seg->first;
  const size_t size = seg->second.size;
  free_ranges_.erase({size, at});
  ranges_.erase(at);
  stats_.pooled_bytes -= size;
  source_.free(reinterpret_cast<void*>(at), size);
  segments_.erase(seg);
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
  while (!lru_.empty()) evict_small_locked(lru_.begin());
  for (auto s = segments_.begin(); s != segments_.end();) {
    const auto next = std::next(s);
    if (s->second.used == 0) release_segment_locked(s);
    s = next;
  }
  high_water_ = stats_.in_use_bytes;
}

}  // namespace kiln

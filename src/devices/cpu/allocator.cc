#include "devices/cpu/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace kiln::cpu {

namespace {
constexpr size_t kAlign = 64;
}

Allocator::Allocator(Device device) : device_(device) {}

Allocator::~Allocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();
}

size_t Allocator::round_size(size_t bytes) {
  if (bytes <= 4096) return bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  // Above 4 KiB: four size classes per power of two (at most 25% slack).
  size_t pow2 = 4096;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

namespace {
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kMappedFrom = 2 * kHuge;  // blocks this large get a mapping of their own

size_t aligned_block(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }
size_t mapped_length(size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }
}  // namespace

void* system_allocate(size_t bytes) {
  const size_t block = aligned_block(bytes);
  if (block < kMappedFrom) return std::aligned_alloc(kAlign, block);  // aligned_alloc's size rule
  // Map one huge page more than needed and trim it to a 2 MiB boundary.
  const size_t length = mapped_length(block);
  void* raw = mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + length + kHuge;
  if (end > aligned + length) munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, length, MADV_HUGEPAGE);
  return p;
}

void system_free(void* p, size_t bytes) {
  if (!p) return;
  const size_t block = aligned_block(bytes);
  if (block < kMappedFrom) {
    std::free(p);
  } else {
    munmap(p, mapped_length(block));
  }
}

size_t Allocator::pool_bound(size_t in_use_peak) { return in_use_peak + in_use_peak / 2; }

BufferPtr Allocator::allocate(size_t bytes) {
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
      p = system_allocate(block);
      KILN_CHECK(p != nullptr, "alloc", "system allocation of ", block, " bytes failed on ",
                 device_.str());
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

void Allocator::give_back(void* p, size_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= block;
  free_.emplace(block, lru_.insert(lru_.end(), Pooled{block, p}));
  stats_.pooled_bytes += block;
}

void Allocator::set_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.capacity_bytes = bytes;
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.in_use_bytes;
  stats_.reserved_peak_bytes = stats_.in_use_bytes + stats_.pooled_bytes;
}

void Allocator::release_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();
}

void Allocator::release_pool_locked() {
  for (const Pooled& b : lru_) system_free(b.p, b.block);
  lru_.clear();
  free_.clear();
  stats_.pooled_bytes = 0;
  high_water_ = stats_.in_use_bytes;
}

void Allocator::evict_locked(Lru::iterator it) {
  auto [first, last] = free_.equal_range(it->block);
  for (auto f = first; f != last; ++f) {
    if (f->second == it) {
      free_.erase(f);
      break;
    }
  }
  stats_.pooled_bytes -= it->block;
  ++stats_.pool_evictions;
  system_free(it->p, it->block);
  lru_.erase(it);
}

}  // namespace kiln::cpu

#include "devices/cpu/allocator.h"

#include <sys/mman.h>

#include <algorithm>
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

void* system_allocate(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t block = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;  // aligned_alloc's rule
  if (block < 2 * kHuge) return std::aligned_alloc(kAlign, block);
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, block) != 0) return nullptr;  // any size, unlike aligned_alloc
  madvise(p, block, MADV_HUGEPAGE);
  return p;
}

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
      p = it->second;
      free_.erase(it);
      stats_.pooled_bytes -= block;
      ++stats_.pool_hits;
    } else {
      if (stats_.capacity_bytes != 0 &&
          stats_.in_use_bytes + stats_.pooled_bytes + block > stats_.capacity_bytes) {
        release_pool_locked();
      }
      p = system_allocate(block);
      KILN_CHECK(p != nullptr, "alloc", "system allocation of ", block, " bytes failed on ",
                 device_.str());
    }
    stats_.in_use_bytes += block;
    if (stats_.in_use_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.in_use_bytes;
    ++stats_.allocations;
  }
  return std::make_shared<Buffer>(p, bytes, device_, [this, p, block] { give_back(p, block); });
}

void Allocator::give_back(void* p, size_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= block;
  free_.emplace(block, p);
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
}

void Allocator::release_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  release_pool_locked();
}

void Allocator::release_pool_locked() {
  for (auto& [size, p] : free_) std::free(p);
  free_.clear();
  stats_.pooled_bytes = 0;
}

}  // namespace kiln::cpu

#include "devices/cpu/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace kiln::cpu {

namespace {
constexpr size_t kAlign = 64;
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

}  // namespace kiln::cpu

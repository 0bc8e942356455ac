// The CPU device's memory: host memory from the system, pooled by PoolAllocator.
#pragma once
#include <cstddef>

#include "devices/pool_allocator.h"

namespace kiln::cpu {

// Host memory straight from the system (not pooled, not counted): at least `bytes`, 64-byte
// aligned; blocks of 4 MiB and up are mapped on their own, start on a 2 MiB boundary and ask for
// transparent huge pages, so touching fresh memory faults once per 2 MiB instead of once per
// 4 KiB page, and freeing them returns them to the system at once (a heap would keep them).
// Free it with system_free and the same `bytes`. nullptr when the system has none.
void* system_allocate(size_t bytes);
void system_free(void* p, size_t bytes);

// The CPU's allocator: a pool of system_allocate's blocks.
class Allocator : public PoolAllocator {
 public:
  explicit Allocator(Device device) : PoolAllocator(device, BlockSource{system_allocate, system_free}) {}
};

}  // namespace kiln::cpu

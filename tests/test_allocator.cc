// The CPU device's pooled allocator: counters, reuse, capacity errors.
#include "devices/cpu/allocator.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "devices/runtime.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(Allocator, CountsInUseAndPeakAndReusesBlocks) {
  cpu::Allocator alloc(Device::cpu());
  {
    BufferPtr a = alloc.allocate(1000);
    BufferPtr b = alloc.allocate(100000);
    const auto s = alloc.stats();
    EXPECT_EQ(s.in_use_bytes, cpu::Allocator::round_size(1000) + cpu::Allocator::round_size(100000));
    EXPECT_EQ(s.peak_bytes, s.in_use_bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  }
  auto s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_GT(s.pooled_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, cpu::Allocator::round_size(1000) + cpu::Allocator::round_size(100000));
  BufferPtr again = alloc.allocate(99000);  // same size class as 100000: served from the pool
  EXPECT_EQ(alloc.stats().pool_hits, 1u);
}

// Blocks of 4 MiB and up (weights, packed weights, activations) start on a 2 MiB boundary, where
// the transparent huge pages the allocator asks for can back them, also when they are carved from
// a larger freed block; smaller ones stay 64-byte aligned.
TEST(Allocator, LargeBlocksStartOnAHugePageBoundary) {
  cpu::Allocator alloc(Device::cpu());
  const size_t mib = size_t(1) << 20;
  for (const size_t bytes : {4 * mib, 9 * mib + 12345, 64 * mib}) {
    BufferPtr b = alloc.allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2 * mib), 0u) << bytes;
    static_cast<char*>(b->data())[bytes - 1] = 1;  // the whole block is usable
  }
  const uint64_t taken = alloc.stats().source_allocations;
  std::vector<BufferPtr> carved;  // from the freed 64 MiB block, one after another
  for (const size_t bytes : {5 * mib, 7 * mib + 1, 11 * mib}) {
    carved.push_back(alloc.allocate(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(carved.back()->data()) % (2 * mib), 0u) << bytes;
    std::memset(carved.back()->data(), 1, bytes);
  }
  EXPECT_EQ(alloc.stats().source_allocations, taken);
  BufferPtr small = alloc.allocate(100000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small->data()) % 64, 0u);
}

// A decode's levels ask for ever larger activations (here three blocks of 32, then 64, then
// 128 MiB alive at once), and the next decode starts small again. Holding a block of every size
// would pass the pool's bound, so a pool of exact sizes gives back and maps anew blocks of some
// level in every decode (the system then zeroes their pages again). Large blocks are carved from
// freed ones, and freed neighbours join: from the second decode on, no block comes from the system.
TEST(Allocator, LargeBlocksAreCarvedFromFreedOnesAcrossSizes) {
  cpu::Allocator alloc(Device::cpu());
  const size_t mib = size_t(1) << 20;
  const size_t levels[] = {32 * mib, 64 * mib, 128 * mib};
  const size_t in_use_peak = 3 * levels[2];
  ASSERT_GT(3 * (levels[0] + levels[1] + levels[2]), cpu::Allocator::pool_bound(in_use_peak));
  for (int decode = 0; decode < 3; ++decode) {
    const uint64_t taken = alloc.stats().source_allocations;
    for (const size_t level : levels) {
      std::vector<BufferPtr> alive;
      for (int i = 0; i < 3; ++i) alive.push_back(alloc.allocate(level));
    }
    if (decode > 0) {
      EXPECT_EQ(alloc.stats().source_allocations, taken) << "decode " << decode;
    }
  }
  const auto s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, in_use_peak);
  EXPECT_LE(s.reserved_peak_bytes, cpu::Allocator::pool_bound(in_use_peak));
  EXPECT_EQ(s.pooled_bytes, in_use_peak);  // the last level's blocks, joined back into their segments
}

// Tiles of several shapes each ask for their own block sizes. Without a bound the pool would keep
// blocks for every shape that a freed one cannot hold; with it, what the allocator holds (in use +
// pooled) never passes pool_bound() of the most it has had in use, and the blocks it gives back are
// the least recently freed.
TEST(Allocator, PoolNeverHoldsMoreThanItsBoundOfTheInUsePeak) {
  cpu::Allocator alloc(Device::cpu());
  const size_t mib = size_t(1) << 20;
  size_t in_use_peak = 0;
  for (const size_t tile : {16 * mib, 24 * mib, 32 * mib, 48 * mib, 64 * mib, 16 * mib}) {
    std::vector<BufferPtr> chain;  // one tile's activations: three blocks alive at once
    for (int i = 0; i < 3; ++i) chain.push_back(alloc.allocate(tile));
    in_use_peak = std::max(in_use_peak, alloc.stats().in_use_bytes);
  }
  const auto s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, in_use_peak);
  const size_t bound = cpu::Allocator::pool_bound(in_use_peak);
  EXPECT_LT(bound, 2 * in_use_peak);
  EXPECT_LE(s.reserved_peak_bytes, bound);  // without the bound: 5 shapes' worth, 552 MiB
  EXPECT_LE(s.pooled_bytes, bound);
  EXPECT_GT(s.pool_evictions, 0u);
  // The blocks of the shapes used most recently stay: a 16 MiB tile again is served from the pool.
  const uint64_t hits = s.pool_hits;
  { BufferPtr again = alloc.allocate(16 * mib); }
  EXPECT_EQ(alloc.stats().pool_hits, hits + 1);
}

size_t resident() {
  long pages = 0, rss = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    std::fclose(f);
  }
  return size_t(rss) * size_t(sysconf(_SC_PAGESIZE));
}

// Large blocks are mappings of their own: returning them (the pool's bound, release_pool) gives
// the memory back to the system at once, so the process's resident memory falls with it.
TEST(Allocator, ReleasedLargeBlocksLeaveTheProcess) {
  cpu::Allocator alloc(Device::cpu());
  const size_t bytes = size_t(256) << 20;
  {
    BufferPtr b = alloc.allocate(bytes);
    std::memset(b->data(), 1, bytes);  // resident now
  }
  const size_t pooled = resident();
  alloc.release_pool();
  const size_t released = resident();
  EXPECT_GE(pooled, released + bytes * 9 / 10) << "pooled " << pooled << " after release " << released;
}

// Host buffers (weights converted or quantized at load, load panels) of 1 MiB and more are
// mappings too. Through malloc they would land in its heap once its mmap threshold has risen (it
// rises to the largest mapped block freed, up to 32 MiB), and a freed block in the middle of the
// heap stays resident: quantizing FLUX.1's transformer at load held 3.9 GB of such holes.
TEST(HostAllocate, LargeBlocksLeaveTheProcessWhenFreedAfterMallocsThresholdRose) {
  {
    std::vector<char> big(size_t(30) << 20, 1);  // malloc maps it; freeing it raises the threshold
  }
  const size_t bytes = size_t(24) << 20;
  BufferPtr block = host_allocate(bytes);
  BufferPtr after = host_allocate(4096);  // a small block after it, as the load's next weight
  std::memset(block->data(), 1, bytes);
  const size_t held = resident();
  block.reset();
  const size_t freed = resident();
  EXPECT_GE(held, freed + bytes * 9 / 10) << "held " << held << ", after freeing " << freed;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(after->data()) % 64, 0u);
}

TEST(Allocator, CapacityErrorNamesRequestedAndAvailableBytes) {
  cpu::Allocator alloc(Device::cpu());
  alloc.set_capacity(1 << 20);
  BufferPtr a = alloc.allocate(600 * 1024);
  test::expect_error([&] { alloc.allocate(600 * 1024); },
                     {"[alloc] out of memory on cpu:0", "requested 614400 bytes", "available 393216",
                      "capacity 1048576"});
  a.reset();
  // The freed block is pooled; the capacity counts it, so the allocator drops the pool and succeeds.
  BufferPtr b = alloc.allocate(900 * 1024);
  EXPECT_NE(b, nullptr);
}

TEST(Allocator, DeviceCapacityStopsAnOpAtItsCall) {
  EagerModeGuard strict(EagerMode::DeferNever);  // deferred mode allocates at the flush instead
  DeviceRuntime& rt = runtime(Device::cpu());
  synchronize();
  const size_t used = rt.memory().in_use_bytes;
  rt.set_memory_capacity(used + (1 << 20));
  test::expect_error([&] { zeros({1024, 1024}); }, {"[alloc] out of memory", "requested 4194304 bytes"});
  rt.set_memory_capacity(0);
  EXPECT_EQ(zeros({1024, 1024}).numel(), 1 << 20);
}

TEST(Allocator, PeakTracksOpOutputs) {
  DeviceRuntime& rt = runtime(Device::cpu());
  synchronize();
  rt.reset_peak_memory();
  const size_t base = rt.memory().in_use_bytes;
  {
    const Tensor a = zeros({256, 1024});  // 1 MiB
    const Tensor b = a + 1.0;             // 1 MiB more (plus a 0-d scalar)
    synchronize();
  }
  EXPECT_GE(rt.memory().peak_bytes, base + 2 * (1u << 20));
  EXPECT_EQ(rt.memory().in_use_bytes, base);
}

}  // namespace
}  // namespace kiln

// Counters the engine exposes (process-wide, all devices). Memory counters come from each
// device's allocator: kiln::runtime(device).memory().
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace kiln {

struct Counters {
  uint64_t ops_dispatched = 0;    // every op call, views included
  uint64_t kernels_launched = 0;  // work items enqueued on a device queue
  uint64_t sync_points = 0;       // host reads / explicit syncs
  uint64_t host_waits = 0;        // sync points that actually blocked on unfinished work
  // Kernels those work items run: one per strict-eager op; a deferred launch runs one per op of
  // its chain plus one for its fused elementwise pass (a linear+rms_norm+epilogue item is three).
  uint64_t kernels_run = 0;
};

Counters counters();
// Kernels launched per kernel name since the last reset (eager: the op name; deferred mode:
// "fused_elementwise", or "<op>+epilogue" for a producer with a fused elementwise epilogue).
std::map<std::string, uint64_t> kernels_by_name();
void reset_counters();

namespace detail {
void count_op();
void count_kernel(const std::string& name, uint64_t kernels_run = 1);
void count_sync(bool waited);
}  // namespace detail

}  // namespace kiln

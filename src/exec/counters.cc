#include "exec/counters.h"

#include <atomic>

namespace kiln {

namespace {
std::atomic<uint64_t> g_ops{0}, g_kernels{0}, g_syncs{0}, g_waits{0};
}

Counters counters() {
  return Counters{g_ops.load(), g_kernels.load(), g_syncs.load(), g_waits.load()};
}

void reset_counters() {
  g_ops = 0;
  g_kernels = 0;
  g_syncs = 0;
  g_waits = 0;
}

namespace detail {
void count_op() { g_ops.fetch_add(1, std::memory_order_relaxed); }
void count_kernel() { g_kernels.fetch_add(1, std::memory_order_relaxed); }
void count_sync(bool waited) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  if (waited) g_waits.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace kiln

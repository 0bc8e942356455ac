#include "core/thread_count.h"

#include <omp.h>

#include <atomic>

namespace kiln {

namespace {

std::atomic<int> g_count{0};
// Each thread starts with OpenMP's default: its count is only changed once one was set.
thread_local int t_applied = 0;

}  // namespace

void set_thread_count(int n) {
  g_count.store(n < 0 ? 0 : n);
  apply_thread_count();
}

void apply_thread_count() {
  const int n = g_count.load(std::memory_order_relaxed);
  if (n == t_applied || n == 0) return;
  omp_set_num_threads(n);
  t_applied = n;
}

int threads_in_use() {
  apply_thread_count();
  return omp_get_max_threads();
}

}  // namespace kiln

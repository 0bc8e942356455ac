#include "exec/counters.h"

#include <atomic>
#include <mutex>

namespace kiln {

namespace {
std::atomic<uint64_t> g_ops{0}, g_kernels{0}, g_syncs{0}, g_waits{0}, g_run{0};
std::mutex g_by_name_mu;
std::map<std::string, uint64_t>& by_name() {
  static auto* m = new std::map<std::string, uint64_t>;  // leaked: kernels may launch during exit
  return *m;
}
}

Counters counters() {
  return Counters{g_ops.load(), g_kernels.load(), g_syncs.load(), g_waits.load(), g_run.load()};
}

std::map<std::string, uint64_t> kernels_by_name() {
  std::lock_guard<std::mutex> lock(g_by_name_mu);
  return by_name();
}

void reset_counters() {
  {
    std::lock_guard<std::mutex> lock(g_by_name_mu);
    by_name().clear();
  }
  g_ops = 0;
  g_kernels = 0;
  g_syncs = 0;
  g_waits = 0;
  g_run = 0;
}

namespace detail {
void count_op() { g_ops.fetch_add(1, std::memory_order_relaxed); }
void count_kernel(const std::string& name, uint64_t kernels_run) {
  g_kernels.fetch_add(1, std::memory_order_relaxed);
  g_run.fetch_add(kernels_run, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_by_name_mu);
  ++by_name()[name];
}
void count_sync(bool waited) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  if (waited) g_waits.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace kiln

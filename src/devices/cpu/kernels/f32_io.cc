#include "devices/cpu/kernels/f32_io.h"

#include <atomic>

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

std::atomic<int64_t> g_conversion_bytes{0};

}  // namespace

int64_t f32_conversion_bytes() { return g_conversion_bytes.load(std::memory_order_relaxed); }

void detail::count_f32_conversion(int64_t bytes) { g_conversion_bytes.fetch_add(bytes, std::memory_order_relaxed); }

}  // namespace kiln::cpu::KILN_CPU_LEVEL

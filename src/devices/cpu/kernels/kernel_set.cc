// This copy of the CPU kernels as the device sees it (devices/cpu/kernel_set.h). Which
// extensions it needs is read from the compiler's own macros, so it is exactly what the level's
// flags (or -march=native) let the compiler use.
#include <iterator>
#include <span>

#include "devices/cpu/kernel_set.h"
#include "devices/cpu/kernels/conv2d.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/fused_elementwise.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/gemv.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/level.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/prepacked_weights.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

// The extensions the compiler was allowed to use in this copy (its own macros), by the names
// __builtin_cpu_supports knows (devices/cpu/kernel_set.cc checks them).
constexpr const char* kNeeds[] = {
#ifdef __SSSE3__
    "ssse3",
#endif
#ifdef __SSE4_1__
    "sse4.1",
#endif
#ifdef __SSE4_2__
    "sse4.2",
#endif
#ifdef __POPCNT__
    "popcnt",
#endif
#ifdef __AES__
    "aes",
#endif
#ifdef __PCLMUL__
    "pclmul",
#endif
#ifdef __AVX__
    "avx",
#endif
#ifdef __AVX2__
    "avx2",
#endif
#ifdef __FMA__
    "fma",
#endif
#ifdef __F16C__
    "f16c",
#endif
#ifdef __BMI__
    "bmi",
#endif
#ifdef __BMI2__
    "bmi2",
#endif
#ifdef __LZCNT__
    "lzcnt",
#endif
#ifdef __MOVBE__
    "movbe",
#endif
#ifdef __AVX512F__
    "avx512f",
#endif
#ifdef __AVX512BW__
    "avx512bw",
#endif
#ifdef __AVX512CD__
    "avx512cd",
#endif
#ifdef __AVX512DQ__
    "avx512dq",
#endif
#ifdef __AVX512VL__
    "avx512vl",
#endif
#ifdef __AVX512VNNI__
    "avx512vnni",
#endif
#ifdef __AVX512VBMI__
    "avx512vbmi",
#endif
#ifdef __AVX512VBMI2__
    "avx512vbmi2",
#endif
#ifdef __AVX512BITALG__
    "avx512bitalg",
#endif
#ifdef __AVX512VPOPCNTDQ__
    "avx512vpopcntdq",
#endif
#ifdef __AVX512IFMA__
    "avx512ifma",
#endif
#ifdef __AVX512BF16__
    "avx512bf16",
#endif
#ifdef __AVX512FP16__
    "avx512fp16",
#endif
#ifdef __GFNI__
    "gfni",
#endif
#ifdef __VAES__
    "vaes",
#endif
#ifdef __VPCLMULQDQ__
    "vpclmulqdq",
#endif
#ifdef __AMX_TILE__
    "amx-tile",
#endif
#ifdef __AMX_BF16__
    "amx-bf16",
#endif
    nullptr};  // never read: keeps the array non-empty on plain x86-64

void add_kernels(KernelTable& table) {
  add_elementwise_kernels(table);
  add_reduction_kernels(table);
  add_movement_kernels(table);
  add_contraction_kernels(table);
  add_collective_kernels(table);
}

void warm_up() {
  gemm_warm_up();
  linear_gemm_warm_up();
  conv2d_warm_up();
}

uint64_t prepacked_live_bytes() { return prepack_stats().live_bytes; }

// Operand bytes kernels converted to f32 copies (0 when every weight and activation is read in
// its own dtype), and compiled mode's pre-packed GEMM weights: made, their bytes (made, still
// held), launches that reused one and launches that read plain weights instead.
std::map<std::string, uint64_t> counters() {
  const PrepackStats p = prepack_stats();
  return {{"f32_conversion_bytes", uint64_t(f32_conversion_bytes())},
          {"prepacked_weights", p.packed},
          {"prepacked_bytes", p.bytes},
          {"prepacked_live_bytes", p.live_bytes},
          {"prepacked_reused", p.reused},
          {"prepacked_skipped", p.skipped}};
}

std::map<std::string, std::string> settings() {
  return {{"cpu_kernels", KILN_CPU_LEVEL_NAME}, {"bf16_linear", bf16_linear_path_name(bf16_linear_path())}};
}

std::shared_ptr<const void> prepacked_weight(const Tensor& w, uint64_t after_write) {
  return prepacked_linear_weight(w, after_write);
}

}  // namespace

// Constant-initialised: reading it runs none of this copy's code.
extern const CpuKernelSet kernel_set;
const CpuKernelSet kernel_set{KILN_CPU_LEVEL_NAME,
                              std::span<const char* const>(kNeeds, std::size(kNeeds) - 1),
                              add_kernels,
                              warm_up,
                              fused_elementwise,
                              grouped_linear_rows,
                              linear_reads_packed_weight,
                              prepacked_weight,
                              prepacked_live_bytes,
                              counters,
                              settings};

}  // namespace kiln::cpu::KILN_CPU_LEVEL

#include "devices/cpu/kernel_set.h"

#include <string>
#include <string_view>

#include "core/env.h"
#include "core/error.h"

namespace kiln::cpu {
namespace {

std::string joined(const std::vector<std::string>& words, const char* separator) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : separator) + w;
  return s;
}

// __builtin_cpu_supports takes only a literal: one entry per extension a copy may need.
bool cpu_supports(std::string_view feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
#define KILN_FEATURE(name) \
  if (feature == name) return __builtin_cpu_supports(name);
  KILN_FEATURE("sse3") KILN_FEATURE("ssse3") KILN_FEATURE("sse4.1") KILN_FEATURE("sse4.2") KILN_FEATURE("popcnt")
  KILN_FEATURE("aes") KILN_FEATURE("pclmul")
  KILN_FEATURE("avx") KILN_FEATURE("avx2") KILN_FEATURE("fma") KILN_FEATURE("f16c") KILN_FEATURE("bmi")
  KILN_FEATURE("bmi2") KILN_FEATURE("lzcnt") KILN_FEATURE("movbe") KILN_FEATURE("avx512f") KILN_FEATURE("avx512bw")
  KILN_FEATURE("avx512cd") KILN_FEATURE("avx512dq") KILN_FEATURE("avx512vl") KILN_FEATURE("avx512vnni")
  KILN_FEATURE("avx512vbmi") KILN_FEATURE("avx512vbmi2") KILN_FEATURE("avx512bitalg") KILN_FEATURE("avx512vpopcntdq")
  KILN_FEATURE("avx512ifma") KILN_FEATURE("avx512bf16") KILN_FEATURE("avx512fp16") KILN_FEATURE("gfni")
  KILN_FEATURE("vaes") KILN_FEATURE("vpclmulqdq") KILN_FEATURE("amx-tile") KILN_FEATURE("amx-bf16")
#undef KILN_FEATURE
#endif
  return false;  // an extension this table does not know: the set does not run here
}

std::vector<std::string> built_names() {
  std::vector<std::string> names;
  for (const CpuKernelSet* set : built_cpu_kernel_sets()) names.push_back(set->name);
  return names;
}

const CpuKernelSet& choose() {
  const std::vector<const CpuKernelSet*> sets = built_cpu_kernel_sets();
  if (const auto wanted = env::text("KILN_CPU_KERNELS")) {
    for (const CpuKernelSet* set : sets) {
      if (*wanted != set->name) continue;
      const std::vector<std::string> missing = missing_features(*set);
      KILN_CHECK(missing.empty(), "cpu", "KILN_CPU_KERNELS=", *wanted, " needs ", joined(missing, ", "),
                 ", which this CPU lacks");
      return *set;
    }
    fail("cpu", "KILN_CPU_KERNELS=", *wanted, " is not one of the kernel sets this kiln was built with (",
         joined(built_names(), ", "), ")");
  }
  for (const CpuKernelSet* set : sets)
    if (missing_features(*set).empty()) return *set;
  const CpuKernelSet& least = *sets.back();
  if (std::string(least.name) == "native")
    fail("cpu", "this kiln was compiled for the CPU that built it (-DKILN_NATIVE=ON), which had ",
         joined(missing_features(least), ", "),
         "; this CPU lacks them: build kiln here, or with -DKILN_NATIVE=OFF for any x86-64 machine");
  fail("cpu", "this CPU lacks ", joined(missing_features(least), ", "), ", which even kiln's ", least.name,
       " kernels need");
}

}  // namespace

std::vector<std::string> missing_features(const CpuKernelSet& set) {
  std::vector<std::string> missing;
  for (const char* feature : set.needs)
    if (!cpu_supports(feature)) missing.push_back(feature);
  return missing;
}

const CpuKernelSet& cpu_kernel_set() {
  static const CpuKernelSet& chosen = choose();
  return chosen;
}

}  // namespace kiln::cpu

// The CPU kernel sets (devices/cpu/kernel_set.h). A test build links the native copy of the
// kernels and every portable level's copy (cmake/cpu_kernels.cmake); everything else is the same
// code a portable build (-DKILN_NATIVE=OFF) runs. So the copy a portable build would choose on
// this CPU, forced with KILN_CPU_KERNELS, is the portable build's run here, and it must give the
// native build's image byte for byte. tests/portable_cpu.sh runs the program on emulated older
// CPUs (no AVX at all, or not even AES).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "devices/cpu/kernel_set.h"
#include "devices/runtime.h"
#include "io/png.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kPortableLevels = {"avx512-bf16", "x86-64-v4", "x86-64-v3", "x86-64-v2"};

// What a portable build runs on this CPU: its most capable level this CPU runs.
const cpu::CpuKernelSet& portable_choice() {
  for (const cpu::CpuKernelSet* set : cpu::built_cpu_kernel_sets())
    if (std::string(set->name) != "native" && cpu::missing_features(*set).empty()) return *set;
  throw std::runtime_error("no portable kernel set runs here");
}

std::pair<int, std::string> generate(const std::string& kernels, const fs::path& png, const std::string& args) {
  const std::string env = kernels.empty() ? "" : "KILN_CPU_KERNELS=" + kernels + " ";
  return test::run_command(env + KILN_CLI_PATH + std::string(" generate -o ") + png.string() + " " + args);
}

TEST(CpuKernelSets, TheProcessRunsTheMostCapableSetThisCpuRuns) {
  const std::vector<const cpu::CpuKernelSet*> sets = cpu::built_cpu_kernel_sets();
  std::vector<std::string> names;
  for (const cpu::CpuKernelSet* set : sets) names.push_back(set->name);
  // A native build's tests add its own copy in front (a portable build has the levels alone).
  std::vector<std::string> expected = kPortableLevels;
  if (!names.empty() && names.front() == "native") expected.insert(expected.begin(), "native");
  ASSERT_EQ(names, expected);
  // Each portable level needs everything the next one needs, and more.
  for (size_t i = names.front() == "native" ? 1 : 0; i + 1 < sets.size(); ++i) {
    const std::set<std::string> more(sets[i]->needs.begin(), sets[i]->needs.end());
    const std::set<std::string> less(sets[i + 1]->needs.begin(), sets[i + 1]->needs.end());
    EXPECT_TRUE(std::includes(more.begin(), more.end(), less.begin(), less.end())) << names[i];
    EXPECT_GT(more.size(), less.size()) << names[i];
  }
  const std::vector<std::string> floor(sets.back()->needs.begin(), sets.back()->needs.end());
  EXPECT_EQ(floor, (std::vector<std::string>{"ssse3", "sse4.1", "sse4.2", "popcnt", "aes", "pclmul"}));
  const cpu::CpuKernelSet* first = nullptr;
  for (const cpu::CpuKernelSet* set : sets)
    if (!first && cpu::missing_features(*set).empty()) first = set;
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(&cpu::cpu_kernel_set(), first);
  EXPECT_EQ(runtime(Device::cpu()).device_settings().at("cpu_kernels"), first->name);
}

TEST(CpuKernelSets, ThePortableChoiceGivesTheNativeImageInEveryMode) {
  const test::ScopedTempDir dir("kernel_sets");
  const std::string portable = portable_choice().name;
  for (const char* mode : {"eager", "defer", "compile"}) {
    SCOPED_TRACE(std::string(mode) + " with " + portable);
    const fs::path native_png = dir.path() / "native.png", portable_png = dir.path() / "portable.png";
    const fs::path report = dir.path() / "portable.json";
    const auto native = generate("", native_png, std::string("--mode ") + mode);
    ASSERT_EQ(native.first, 0) << native.second;
    const auto chosen = generate(portable, portable_png, std::string("--mode ") + mode + " --report " + report.string());
    ASSERT_EQ(chosen.first, 0) << chosen.second;
    const auto json = nlohmann::json::parse(test::read_text_file(report));
    EXPECT_EQ(json["engine"]["cpu_kernels"], portable);
    EXPECT_EQ(test::read_text_file(native_png), test::read_text_file(portable_png));
  }
}

// Every level this CPU runs makes the image; levels without FMA round differently, so the
// images agree closely rather than bit for bit.
TEST(CpuKernelSets, EveryLevelThisCpuRunsMakesTheImage) {
  const test::ScopedTempDir dir("kernel_levels");
  const fs::path native_png = dir.path() / "native.png";
  const auto native = generate("", native_png, "");
  ASSERT_EQ(native.first, 0) << native.second;
  const io::PngImage reference = io::read_png(native_png);
  int levels_run = 0;
  for (const cpu::CpuKernelSet* set : cpu::built_cpu_kernel_sets()) {
    if (!cpu::missing_features(*set).empty()) continue;
    SCOPED_TRACE(set->name);
    const fs::path png = dir.path() / (std::string(set->name) + ".png");
    const auto run = generate(set->name, png, "");
    ASSERT_EQ(run.first, 0) << run.second;
    const io::PngImage image = io::read_png(png);
    ASSERT_EQ(image.rgb.size(), reference.rgb.size());
    double total = 0;
    int largest = 0;
    for (size_t i = 0; i < image.rgb.size(); ++i) {
      const int d = std::abs(int(image.rgb[i]) - int(reference.rgb[i]));
      total += d;
      largest = std::max(largest, d);
    }
    EXPECT_LE(total / double(image.rgb.size()), 0.05);
    EXPECT_LE(largest, 4);
    ++levels_run;
  }
  EXPECT_GE(levels_run, 2);  // a level that matches this CPU, and x86-64-v2 at least
}

TEST(CpuKernelSets, ASetNotBuiltOrNotRunnableHereIsOneLine) {
  const test::ScopedTempDir dir("kernel_choice");
  const fs::path png = dir.path() / "out.png";
  const auto unknown = generate("avx1024", png, "");
  EXPECT_NE(unknown.first, 0);
  std::string built;
  for (const cpu::CpuKernelSet* set : cpu::built_cpu_kernel_sets()) built += (built.empty() ? "" : ", ") + std::string(set->name);
  EXPECT_NE(unknown.second.find("KILN_CPU_KERNELS=avx1024 is not one of the kernel sets this kiln was built with (" +
                                built + ")"),
            std::string::npos)
      << unknown.second;
  EXPECT_FALSE(fs::exists(png));
  for (const cpu::CpuKernelSet* set : cpu::built_cpu_kernel_sets()) {
    const std::vector<std::string> missing = cpu::missing_features(*set);
    if (missing.empty()) continue;
    const auto refused = generate(set->name, png, "");
    EXPECT_NE(refused.first, 0) << set->name;
    EXPECT_NE(refused.second.find(std::string("KILN_CPU_KERNELS=") + set->name + " needs " + missing.front()),
              std::string::npos)
        << refused.second;
    EXPECT_NE(refused.second.find("which this CPU lacks"), std::string::npos) << refused.second;
    EXPECT_FALSE(fs::exists(png));
  }
}

}  // namespace
}  // namespace kiln

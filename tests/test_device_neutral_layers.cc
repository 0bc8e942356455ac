// The layers above the device seam (graph, exec, nn, models, pipelines) name no
// device backend: no cpu:: function, no devices/cpu header, no Device::cpu() (where no tensor
// says where, they use default_device()). What a device does they reach only through
// DeviceRuntime (devices/runtime.h), so another device plugs in below them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "core/device.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

TEST(DeviceNeutralLayers, NoCpuSpecificNameAboveTheDeviceSeam) {
  const std::regex cpu_specific(R"(\bcpu::|devices/cpu/|Device::cpu\(\))");
  std::ostringstream hits;
  int files = 0, found = 0;
  for (const char* layer : {"graph", "exec", "nn", "models", "pipelines"}) {
    const fs::path dir = fs::path(KILN_SOURCE_DIR) / "src" / layer;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cc")) continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (std::regex_search(line, cpu_specific)) {
          ++found;
          hits << fs::relative(e.path(), KILN_SOURCE_DIR).string() << ":" << n << ": " << line << "\n";
        }
    }
  }
  EXPECT_GT(files, 100);  // the layers were read
  EXPECT_EQ(found, 0) << "CPU-specific names above the device seam:\n" << hits.str();
}

TEST(DeviceNeutralLayers, TheDefaultDeviceIsScopedPerThread) {
  EXPECT_EQ(default_device(), Device::cpu());
  {
    DefaultDeviceGuard guard(Device::parse("cuda:1"));
    EXPECT_EQ(default_device(), Device::parse("cuda:1"));
    {
      DefaultDeviceGuard inner(Device::parse("cpu"));
      EXPECT_EQ(default_device(), Device::cpu());
    }
    EXPECT_EQ(default_device(), Device::parse("cuda:1"));
    Device other_thread;
    std::thread([&] { other_thread = default_device(); }).join();
    EXPECT_EQ(other_thread, Device::cpu());  // a guard is its thread's only
  }
  EXPECT_EQ(default_device(), Device::cpu());
}

}  // namespace
}  // namespace kiln

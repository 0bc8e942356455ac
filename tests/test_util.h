// Helpers shared by the tests: seeded random tensors, closeness checks, message checks.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "nn/tensor_map_source.h"

namespace kiln::test {

// The device a test runs its ops on: KILN_TEST_DEVICE ("cuda:0": scripts/gpu-check.sh, the GPU
// tests of tests/CMakeLists.txt), else the CPU.
inline Device test_device() {
  const char* d = std::getenv("KILN_TEST_DEVICE");
  return d && *d ? Device::parse(d) : Device::cpu();
}

// A pipeline placed on the test device: its weights copied there (pipe.to) unless that is the
// CPU, where they are read in place as users run them by default.
template <class Pipeline>
Pipeline on_test_device(Pipeline pipe) {
  if (test_device() != Device::cpu()) pipe.to(test_device());
  return pipe;
}

// A fresh folder under `parent` (the system's temporary folder unless given), removed with
// everything in it at the end.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& name,
                         const std::filesystem::path& parent = std::filesystem::temp_directory_path())
      : path_(parent / ("kiln_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Sets an environment variable for one test (nullptr: unsets it) and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::vector<float> random_values(int64_t n, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(dist(rng));
  return v;
}

inline Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = DType::f32, double lo = -2,
                            double hi = 2) {
  return from_vector(random_values(numel(shape), seed, lo, hi), shape, dtype);
}

// Largest |a - b| / (atol + rtol |b|); <= 1 means close.
inline double closeness(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    worst = std::max(worst, std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i])));
  }
  return worst;
}

// Runs `f`, expecting a kiln::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a kiln::Error containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

// Named tensors held in memory as a checkpoint.
using MapSource = nn::TensorMapSource;

}  // namespace kiln::test

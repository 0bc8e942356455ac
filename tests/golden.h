// Reference outputs computed by Diffusers/transformers (tests/fixtures/<set>/golden.safetensors)
// and the closeness checks the golden tests use.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "exec/host.h"
#include "io/safetensors.h"

namespace kiln::test {

// The fixtures folder: KILN_TEST_FIXTURES where the tests run away from the tree they were built
// in (scripts/gpu-check.sh carries a build to a GPU machine), else the tree's tests/fixtures.
inline std::filesystem::path fixtures_root() {
  const char* moved = std::getenv("KILN_TEST_FIXTURES");
  return moved && *moved ? std::filesystem::path(moved) : std::filesystem::path(KILN_FIXTURES_DIR);
}
inline std::filesystem::path fixture(const std::string& set) { return fixtures_root() / set; }
inline std::filesystem::path pipeline_dir(const std::string& set) { return fixture(set) / "pipeline"; }

inline const io::SafetensorsFile& golden_file(const std::string& set) {
  static std::map<std::string, std::shared_ptr<io::SafetensorsFile>> files;
  auto& f = files[set];
  if (!f) f = std::make_shared<io::SafetensorsFile>(fixture(set) / "golden.safetensors");
  return *f;
}

// A golden tensor of `set` by key, as stored (f32 for activations, i64 for ids).
inline Tensor golden(const std::string& set, const std::string& key) { return golden_file(set).load(key); }

// kiln has no u8 dtype, so golden uint8 images (U8) are read as raw bytes from the mapping.
inline std::vector<uint8_t> golden_u8(const std::string& set, const std::string& key) {
  const auto& f = golden_file(set);
  const io::TensorInfo& info = f.info(key);
  EXPECT_EQ(info.dtype_string, "U8");
  const auto bytes = f.mapped_range();
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + info.byte_begin;
  return std::vector<uint8_t>(p, p + info.nbytes());
}

// Number of bytes that differ and the largest difference.
inline std::pair<size_t, int> byte_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  int worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const int d = std::abs(int(a[i]) - int(b[i]));
    n += d != 0;
    worst = std::max(worst, d);
  }
  return {n, worst};
}

// Max |got - want| <= atol + rtol * max|want|, with the worst element in the message.
inline void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = to_vector(got), w = to_vector(want);
  double scale = 0, worst = 0;
  size_t at = 0;
  for (float v : w) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::fabs(double(g[i]) - double(w[i]));
    if (!(d <= worst)) worst = d, at = i;
  }
  EXPECT_LE(worst, atol + rtol * scale) << what << ": max abs error " << worst << " at flat index " << at
                                        << " (got " << g[at] << ", want " << w[at] << "; max |want| " << scale << ")";
}

}  // namespace kiln::test

// Reference outputs computed by Diffusers/transformers (tests/fixtures/<set>/golden.safetensors)
// and the closeness checks the golden tests use.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "exec/host.h"
#include "io/safetensors.h"

namespace kiln::test {

inline std::filesystem::path fixture(const std::string& set) { return std::filesystem::path(KILN_FIXTURES_DIR) / set; }
inline std::filesystem::path pipeline_dir(const std::string& set) { return fixture(set) / "pipeline"; }

// A golden tensor of `set` by key, as stored (f32 for activations, i64 for ids).
inline Tensor golden(const std::string& set, const std::string& key) {
  static std::map<std::string, std::shared_ptr<io::SafetensorsFile>> files;
  auto& f = files[set];
  if (!f) f = std::make_shared<io::SafetensorsFile>(fixture(set) / "golden.safetensors");
  return f->load(key);
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

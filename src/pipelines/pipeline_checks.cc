#include "pipelines/pipeline_checks.h"

#include <cmath>

#include "core/error.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "io/safetensors.h"
#include "nn/weight_source.h"

namespace kiln::pipeline_checks {

namespace fs = std::filesystem;

namespace {

bool all_finite(const Tensor& t) {
  for (float v : to_vector(t))
    if (!std::isfinite(v)) return false;
  return true;
}

bool has_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

}  // namespace

void check_bounds(const std::string& where, const std::string& name, int64_t value, int64_t lo, int64_t hi,
                  const std::string& why) {
  KILN_CHECK(value >= lo, where, name, " must be at least ", lo, ", got ", value);
  KILN_CHECK(value <= hi, where, name, " must be at most ", hi, why.empty() ? std::string() : " (" + why + ")",
             ", got ", value);
}

void finite_scalar(const std::string& name, double value, const std::string& expected) {
  KILN_CHECK(std::isfinite(value), "pipeline", name, " is ", value, ", expected ", expected);
}

void finite_input(const std::string& what, const Tensor& t) {
  KILN_CHECK(all_finite(t), "pipeline", what, " hold NaN or Inf values; every value must be a finite number");
}

Tensor finite_probe(const Tensor& t) { return sum(cast(t, DType::f32) * 0.0); }

void expect_finite(const Tensor& probe, const std::string& stage, const fs::path& component_dir,
                   const std::vector<std::string>& not_loaded, const std::string& otherwise) {
  if (item(probe) == 0.0) return;
  const std::string weight = nonfinite_weight(component_dir, not_loaded);
  fail("pipeline", stage, " produced NaN/Inf values; likely cause: ", weight.empty() ? otherwise : weight);
}

std::string nonfinite_weight(const fs::path& component_dir, const std::vector<std::string>& not_loaded) {
  if (!has_checkpoint(component_dir)) return "";
  try {
    const io::SafetensorsIndex index(component_dir);
    for (const std::string& name : index.names()) {
      const io::TensorInfo info = index.info(name);
      if (!info.dtype || !is_floating(*info.dtype) || nn::key_under(name, not_loaded)) continue;
      if (!all_finite(index.load(name)))
        return "tensor '" + name + "' in " + index.shard_path(name).string() + " holds NaN/Inf values";
    }
  } catch (const Error&) {
    // The checkpoint loaded once already; a failure to re-read it only loses the detail.
  }
  return "";
}

}  // namespace kiln::pipeline_checks

#include "schedulers/flow_match_euler.h"

#include <cmath>

#include "core/error.h"
#include "exec/ops.h"
#include "io/config_fields.h"
#include "io/json_config.h"

namespace kiln {

FlowMatchEulerConfig FlowMatchEulerConfig::load(const std::filesystem::path& file) {
  const io::JsonConfig j(file);
  FlowMatchEulerConfig c;
  io::read_fields(j, {{"num_train_timesteps", c.num_train_timesteps}, {"shift", c.shift},
                      {"use_dynamic_shifting", c.use_dynamic_shifting}, {"base_shift", c.base_shift},
                      {"max_shift", c.max_shift}, {"base_image_seq_len", c.base_image_seq_len},
                      {"max_image_seq_len", c.max_image_seq_len}});
  for (const char* flag : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                           "stochastic_sampling", "use_flow_sigmas"})
    KILN_CHECK(!j.get_bool(flag, false), "scheduler", file.string(), ": '", flag,
               "' is not supported by kiln's FlowMatchEulerDiscreteScheduler");
  KILN_CHECK(!j.has("shift_terminal"), "scheduler", file.string(), ": 'shift_terminal' is not supported");
  c.validate(file.string());
  KILN_CHECK(j.get_string("time_shift_type", "exponential") == "exponential", "scheduler", file.string(),
             ": only time_shift_type 'exponential' is supported");
  return c;
}

void FlowMatchEulerConfig::validate(const std::string& source) const {
  // The ranges in which Diffusers' schedule is defined: timesteps are sigma * num_train_timesteps,
  // the static shift divides by 1 + (shift - 1) sigma, the dynamic one interpolates between two
  // distinct sequence lengths. Outside them every sigma is 0 or NaN and the image is black.
  KILN_CHECK(num_train_timesteps >= 1, "scheduler", source, ": field 'num_train_timesteps' is ",
             num_train_timesteps, ", expected at least 1 (FLUX uses 1000)");
  KILN_CHECK(std::isfinite(shift) && shift > 0, "scheduler", source, ": field 'shift' is ", shift,
             ", expected a positive number (FLUX.1-schnell uses 1.0, dev 3.0)");
  if (!use_dynamic_shifting) return;
  KILN_CHECK(std::isfinite(base_shift) && std::isfinite(max_shift), "scheduler", source,
             ": fields 'base_shift' and 'max_shift' must be finite numbers, got ", base_shift, " and ", max_shift);
  KILN_CHECK(base_image_seq_len >= 1 && max_image_seq_len > base_image_seq_len, "scheduler", source,
             ": fields 'base_image_seq_len' (", base_image_seq_len, ") and 'max_image_seq_len' (", max_image_seq_len,
             ") must satisfy 1 <= base < max");
}

double FlowMatchEulerDiscreteScheduler::calculate_shift(int64_t image_seq_len) const {
  const double m = (config_.max_shift - config_.base_shift) /
                   double(config_.max_image_seq_len - config_.base_image_seq_len);
  const double b = config_.base_shift - m * double(config_.base_image_seq_len);
  return double(image_seq_len) * m + b;
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(int64_t n, double mu) {
  KILN_CHECK(n >= 1, "scheduler", "num_inference_steps must be at least 1, got ", n);
  // np.linspace(1, 1/N, N) in float64 (last element exact), then float32.
  std::vector<float> s(static_cast<size_t>(n));
  const double end = 1.0 / double(n);
  const double step = n > 1 ? (end - 1.0) / double(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i) s[size_t(i)] = float(i == n - 1 ? end : 1.0 + double(i) * step);
  if (config_.use_dynamic_shifting) {
    const float e = float(std::exp(mu));  // exp in double, rounded to fp32; the rest in fp32
    for (float& v : s) v = e / (e + (1.0f / v - 1.0f));
  } else {
    const float shift = float(config_.shift);
    for (float& v : s) v = shift * v / (1.0f + (shift - 1.0f) * v);
  }
  use_sigmas(s);
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(int64_t n) {
  KILN_CHECK(n >= 1, "scheduler", "num_inference_steps must be at least 1, got ", n);
  KILN_CHECK(!config_.use_dynamic_shifting, "scheduler",
             "dynamic shifting needs mu: set_timesteps(num_inference_steps, mu)");
  // The training sigmas t/N_T for t = N_T..1, shifted in fp32 (the constructor's torch ops).
  const float n_t = float(config_.num_train_timesteps), shift = float(config_.shift);
  const auto trained = [&](float t) {
    const float sigma = t / n_t;
    return shift * sigma / (1.0f + (shift - 1.0f) * sigma);
  };
  const double sigma_max = trained(n_t), sigma_min = trained(1.0f);
  // np.linspace(sigma_max * N_T, sigma_min * N_T, n) in float64 (last element exact), / N_T, the
  // shift again in float64, then fp32.
  const double start = sigma_max * double(config_.num_train_timesteps);
  const double stop = sigma_min * double(config_.num_train_timesteps);
  const double step = n > 1 ? (stop - start) / double(n - 1) : 0.0;
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double sigma = (n > 1 && i == n - 1 ? stop : start + double(i) * step) / double(config_.num_train_timesteps);
    s[size_t(i)] = float(config_.shift * sigma / (1.0 + (config_.shift - 1.0) * sigma));
  }
  use_sigmas(s);
}

void FlowMatchEulerDiscreteScheduler::use_sigmas(const std::vector<float>& s) {
  timesteps_.resize(s.size());
  for (size_t i = 0; i < s.size(); ++i) timesteps_[i] = s[i] * float(config_.num_train_timesteps);
  sigmas_ = s;
  sigmas_.push_back(0.0f);
  step_index_ = 0;
}

Tensor FlowMatchEulerDiscreteScheduler::step(const Tensor& velocity, const Tensor& latents) {
  KILN_CHECK(step_index_ + 1 < int64_t(sigmas_.size()), "scheduler", "step ", step_index_,
             " called after the last of ", sigmas_.size() - 1, " steps (call set_timesteps first)");
  const float dt = sigmas_[size_t(step_index_ + 1)] - sigmas_[size_t(step_index_)];
  ++step_index_;
  const Tensor x = cast(latents, DType::f32);
  return cast(x + velocity * double(dt), velocity.dtype());
}

}  // namespace kiln

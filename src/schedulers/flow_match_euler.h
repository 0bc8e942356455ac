// FlowMatchEulerDiscreteScheduler as FLUX and SD3 use it: the sigma
// schedule is computed on the host in the same precision as Diffusers (fp32 after a float64
// linspace), with static or dynamic (resolution-dependent) shifting; step() is an Euler update whose
// per-step dt is a host scalar handed to the device as a value.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct FlowMatchEulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5, max_shift = 1.15;
  int64_t base_image_seq_len = 256, max_image_seq_len = 4096;

  // Reads scheduler_config.json; unsupported options (Karras, shift_terminal, ...) are errors.
  static FlowMatchEulerConfig load(const std::filesystem::path& file);
  // Fails, naming `source` and the field, on values outside the range the schedule is defined for.
  void validate(const std::string& source) const;
};

class FlowMatchEulerDiscreteScheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig config) : config_(config) {}

  // mu for an image of `image_seq_len` packed tokens (linear in the sequence length).
  double calculate_shift(int64_t image_seq_len) const;
  // N steps from linspace(1, 1/N, N); `mu` is used only with dynamic shifting (FluxPipeline
  // passes these sigmas).
  void set_timesteps(int64_t num_inference_steps, double mu);
  // set_timesteps(N) without sigmas (StableDiffusion3Pipeline): N steps from the largest to the
  // smallest training sigma (both already shifted at construction, in fp32), shifted again in
  // float64 (a Diffusers quirk: the last nonzero sigma is shifted twice), then fp32.
  void set_timesteps(int64_t num_inference_steps);

  const std::vector<float>& sigmas() const { return sigmas_; }        // N + 1 values, last 0
  const std::vector<float>& timesteps() const { return timesteps_; }  // N values (sigma * 1000)
  // latents + (sigma[i+1] - sigma[i]) * velocity, for step i = 0, 1, ... in order.
  Tensor step(const Tensor& velocity, const Tensor& latents);
  int64_t step_index() const { return step_index_; }
  const FlowMatchEulerConfig& config() const { return config_; }

 private:
  void use_sigmas(const std::vector<float>& sigmas);  // timesteps = sigmas * N_T, then a final sigma 0

  FlowMatchEulerConfig config_;
  std::vector<float> sigmas_, timesteps_;
  int64_t step_index_ = 0;
};

}  // namespace kiln

// Checks every pipeline runs so that bad values fail loudly instead of decoding a black image:
// the call's scalars before any work, and finite values after each stage (a 0-d reduction
// queued with the stage's own work, read when the stage is waited for anyway). When a stage
// produced NaN/Inf, the component's checkpoint is scanned (on that error path only) for the
// weight that holds them, so the message names the likely cause.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::pipeline_checks {

// ---- input bounds ----
// Bounds on a call's sizes and counts, far beyond any real use, so that a typo such as
// --steps 2147483648 fails at once with a line naming it instead of allocating per step or per
// pixel first. Every entry point checks against them: the CLI's flags, the server's request
// fields (server/generation_request.cc) and DiffusionPipeline's call itself.
constexpr int64_t kMaxSteps = 10000;               // num_inference_steps (FLUX.1-dev uses 28-50)
constexpr int64_t kMaxSide = int64_t(1) << 20;     // image pixels per side; keeps size math far from overflow
constexpr int64_t kMaxWarmupSizes = 256;           // sizes one warmup (or serve --warmup) compiles

// Fails "[where] NAME must be at least LO, got V" or "... at most HI, got V", `why` appended to
// the second (what the bound is for), so each bound reads as one line naming the flag or field.
void check_bounds(const std::string& where, const std::string& name, int64_t value, int64_t lo, int64_t hi,
                  const std::string& why = "");

// Fails "[pipeline] <name> is <value>, expected <expected>" unless `value` is finite.
void finite_scalar(const std::string& name, double value, const std::string& expected = "a finite number");
// Fails naming `what` (e.g. "initial latents") when `t` holds NaN or Inf (reads it now).
void finite_input(const std::string& what, const Tensor& t);

// A 0-d f32 tensor that is 0 when every value of `t` is finite and NaN otherwise (sum(t * 0)),
// queued now with the work that produces `t`.
Tensor finite_probe(const Tensor& t);
// Reads a probe (waiting for it). When it is not 0, fails "[pipeline] <stage> produced NaN/Inf
// values; <cause>", where the cause is the first checkpoint tensor under `component_dir` that
// holds NaN/Inf (if any) or `otherwise`.
void expect_finite(const Tensor& probe, const std::string& stage, const std::filesystem::path& component_dir,
                   const std::vector<std::string>& not_loaded, const std::string& otherwise);

// The first floating-point tensor of the checkpoint in `component_dir` holding NaN or Inf, as
// "tensor 'NAME' in FILE holds NaN/Inf values", or "" when there is none (or no checkpoint).
// Tensors under the `not_loaded` key prefixes (those the model skips) are not scanned.
std::string nonfinite_weight(const std::filesystem::path& component_dir, const std::vector<std::string>& not_loaded);

}  // namespace kiln::pipeline_checks

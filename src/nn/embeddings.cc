#include "nn/embeddings.h"

#include <cmath>

#include "core/error.h"
#include "exec/host.h"

namespace kiln::nn {

Tensor timestep_sinusoid(const Tensor& t, int64_t channels) {
  KILN_CHECK(t.rank() == 1, "timestep_sinusoid", "expects a 1-D tensor of timesteps, got ", to_string(t.shape()));
  KILN_CHECK(channels > 0 && channels % 2 == 0, "timestep_sinusoid", "channels must be even, got ", channels);
  const int64_t half = channels / 2;
  // Diffusers builds the exponent in f32: (k * f32(-ln 1e4)) / (half - shift), shift = 0.
  const Tensor exponent = arange(0, double(half), 1, DType::f32, t.device()) * -std::log(10000.0) / double(half);
  // The sinusoid is always evaluated in f32 (timesteps[:, None].float()).
  const Tensor arg = unsqueeze(cast(t, DType::f32), 1) * unsqueeze(exp(exponent), 0);
  // flip_sin_to_cos: the cos half comes first.
  return concat({cos(arg), sin(arg)}, 1);
}

MlpEmbedder::MlpEmbedder(const Weights& w, int64_t in_features, int64_t dim, bool bias)
    : linear_1(w.sub("linear_1"), in_features, dim, bias), linear_2(w.sub("linear_2"), dim, dim, bias) {}

TimeTextEmbed::TimeTextEmbed(const Weights& w, int64_t dim, int64_t pooled_dim, bool guidance_embeds)
    : timestep_embedder_(w.sub("timestep_embedder"), 256, dim),
      guidance_embedder_(guidance_embeds ? MlpEmbedder(w.sub("guidance_embedder"), 256, dim) : MlpEmbedder()),
      text_embedder_(w.sub("text_embedder"), pooled_dim, dim),
      guidance_embeds_(guidance_embeds) {}

Tensor TimeTextEmbed::operator()(const Tensor& ts, const std::optional<Tensor>& gs, const Tensor& pooled) const {
  KILN_CHECK(gs.has_value() == guidance_embeds_, "time_text_embed",
             guidance_embeds_ ? "this model has guidance_embeds=true: a guidance tensor is required"
                              : "this model has guidance_embeds=false: guidance must not be given");
  // The f32 sinusoid is cast to the pooled projections' dtype before the MLPs.
  Tensor temb = timestep_embedder_(cast(timestep_sinusoid(ts), pooled.dtype()));
  if (gs) temb = temb + guidance_embedder_(cast(timestep_sinusoid(*gs), pooled.dtype()));
  return temb + text_embedder_(pooled);
}

void TimeTextEmbed::append_parameters(std::vector<Tensor>& out) const {
  timestep_embedder_.append_parameters(out);
  if (guidance_embeds_) guidance_embedder_.append_parameters(out);
  text_embedder_.append_parameters(out);
}

}  // namespace kiln::nn

#include "models/flux/flux_embeddings.h"

#include <cmath>

#include "core/error.h"
#include "exec/host.h"

namespace kiln::flux {

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

MlpEmbedder::MlpEmbedder(const nn::Weights& w, int64_t in_features, int64_t dim)
    : linear_1(w.sub("linear_1"), in_features, dim), linear_2(w.sub("linear_2"), dim, dim) {}

TimeTextEmbed::TimeTextEmbed(const nn::Weights& w, int64_t dim, int64_t pooled_dim, bool guidance_embeds)
    : timestep_embedder_(w.sub("timestep_embedder"), 256, dim),
      guidance_embedder_(guidance_embeds ? MlpEmbedder(w.sub("guidance_embedder"), 256, dim) : MlpEmbedder()),
      text_embedder_(w.sub("text_embedder"), pooled_dim, dim),
      guidance_embeds_(guidance_embeds) {}

Tensor TimeTextEmbed::operator()(const Tensor& ts, const std::optional<Tensor>& gs, const Tensor& pooled) const {
  KILN_CHECK(gs.has_value() == guidance_embeds_, "FluxTransformer2DModel",
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

RotaryTables RotaryTables::of(Tensor cos, Tensor sin) {
  // A whole head row of (-1, 1) pairs rather than one pair, so kernels read it in long runs.
  const int64_t hd = cos.dim(-1);
  std::vector<float> pattern(static_cast<size_t>(hd));
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = i % 2 == 0 ? -1.0f : 1.0f;
  Tensor sign = from_vector(pattern, {hd / 2, 2}, DType::f32, cos.device());
  return RotaryTables{std::move(cos), std::move(sin), std::move(sign)};
}

RotaryTables flux_pos_embed(const Tensor& ids, const std::vector<int64_t>& axes_dim, double theta) {
  KILN_CHECK(ids.rank() == 2 && ids.dim(1) == int64_t(axes_dim.size()), "FluxPosEmbed", "expects ids [S, ",
             axes_dim.size(), "], got ", to_string(ids.shape()));
  int64_t hd = 0;
  for (int64_t d : axes_dim) {
    KILN_CHECK(d > 0 && d % 2 == 0, "FluxPosEmbed", "every axes_dims_rope entry must be even, got ", d);
    hd += d;
  }
  // Diffusers computes these tables in float64 and rounds them to f32; the op API has no f64,
  // so they are built on the host (S x head_dim values, negligible next to the blocks). This
  // reads the ids, which are pipeline inputs, so it waits only for them.
  const int64_t S = ids.dim(0), n_axes = ids.dim(1);
  const std::vector<float> pos = to_vector(ids);  // pos = ids.float()
  std::vector<float> cos_t(size_t(S * hd)), sin_t(size_t(S * hd));
  int64_t col = 0;
  for (int64_t a = 0; a < n_axes; ++a) {
    const int64_t d = axes_dim[size_t(a)];
    for (int64_t j = 0; j < d / 2; ++j) {
      const double freq = 1.0 / std::pow(theta, double(2 * j) / double(d));
      for (int64_t s = 0; s < S; ++s) {
        const double phase = double(pos[size_t(s * n_axes + a)]) * freq;
        const float c = float(std::cos(phase)), sn = float(std::sin(phase));
        const size_t at = size_t(s * hd + col + 2 * j);
        cos_t[at] = cos_t[at + 1] = c;  // repeat_interleave(2): the pair shares one frequency
        sin_t[at] = sin_t[at + 1] = sn;
      }
    }
    col += d;
  }
  return RotaryTables::of(from_vector(cos_t, {S, hd}, DType::f32, ids.device()),
                          from_vector(sin_t, {S, hd}, DType::f32, ids.device()));
}

Tensor apply_rotary_emb(const Tensor& x, const RotaryTables& rope) {
  KILN_CHECK(x.rank() == 4, "apply_rotary_emb", "expects [B, S, H, hd], got ", to_string(x.shape()));
  const int64_t B = x.dim(0), S = x.dim(1), H = x.dim(2), hd = x.dim(3);
  KILN_CHECK(rope.cos.shape() == Shape({S, hd}), "apply_rotary_emb", "tables ", to_string(rope.cos.shape()),
             " do not match sequence ", S, " x head dim ", hd);
  const Tensor xf = cast(x, DType::f32);
  // In pairs (x[2i], x[2i+1]): x_rotated = (-x[2i+1], x[2i]) = the pair reversed (a view) times
  // (-1, 1), exactly; every product and sum is Diffusers' x*cos + x_rotated*sin, element by element.
  const Tensor pairs = reshape(xf, {B, S, H, hd / 2, 2});
  const Tensor rotated = flip(pairs, 4) * rope.pair_sign;
  const Tensor c = reshape(rope.cos, {1, S, 1, hd / 2, 2}), s = reshape(rope.sin, {1, S, 1, hd / 2, 2});
  return cast(reshape(pairs * c + rotated * s, {B, S, H, hd}), x.dtype());
}

}  // namespace kiln::flux

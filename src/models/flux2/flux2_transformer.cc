#include "models/flux2/flux2_transformer.h"

#include <tuple>

#include "core/error.h"
#include "exec/capture.h"
#include "io/config_fields.h"
#include "nn/tp_plans.h"

namespace kiln {
// Errors name the Diffusers class.
constexpr const char* kWhere = Flux2Transformer2DModel::kClassName;

// ---- config ----

Flux2TransformerConfig Flux2TransformerConfig::from_json(const io::JsonConfig& j) {
  Flux2TransformerConfig c;
  nn::read_transformer_fields(j, c);
  io::read_fields(j, {{"out_channels", c.out_channels}, {"num_single_layers", c.num_single_layers},
                      {"timestep_guidance_channels", c.timestep_guidance_channels}, {"mlp_ratio", c.mlp_ratio},
                      {"axes_dims_rope", c.axes_dims_rope}, {"rope_theta", c.rope_theta}, {"eps", c.eps},
                      {"guidance_embeds", c.guidance_embeds}});
  c.validate(j.source());
  return c;
}

void Flux2TransformerConfig::validate(const std::string& source) const {
  nn::check_transformer_fields(*this, kWhere, source);
  if (out_channels) nn::check_positive(*out_channels, "out_channels", kWhere, source);
  KILN_CHECK(num_layers >= 0 && num_single_layers >= 0, kWhere, source, ": block counts must be >= 0, got ",
             num_layers, " and ", num_single_layers);
  nn::check_positive(mlp_hidden(), "mlp_ratio", kWhere, source);
  KILN_CHECK(timestep_guidance_channels > 0 && timestep_guidance_channels % 2 == 0, kWhere, source,
             ": 'timestep_guidance_channels' must be even and positive, got ", timestep_guidance_channels);
  KILN_CHECK(eps == 1e-6, kWhere, source, ": eps ", eps, " is not supported (FLUX.2's norms use 1e-6)");
  nn::check_axes_dims_rope(axes_dims_rope, attention_head_dim, kWhere, source);
}

// ---- class data ----

std::vector<TensorParallelEntry> Flux2Transformer2DModel::tp_plan(const Flux2TransformerConfig& c,
                                                                  bool shard_modulation) {
  // The packed entries' blocks are the widths themselves (sizes are proportional to them): the
  // single block's fused projection is [Q D | K D | V D | gate F | up F], its to_out reads
  // [attention D | MLP F], and the double blocks' linear_in is [gate F | up F].
  const int64_t D = c.inner_dim(), F = c.mlp_hidden();
  return nn::concat_plans({
      nn::joint_attention_plan("transformer_blocks.*.attn"),
      {{"transformer_blocks.*.ff.linear_in", "packed_colwise", {1, 1}},
       {"transformer_blocks.*.ff.linear_out", "rowwise", {}},
       {"transformer_blocks.*.ff_context.linear_in", "packed_colwise", {1, 1}},
       {"transformer_blocks.*.ff_context.linear_out", "rowwise", {}},
       {"single_transformer_blocks.*.attn.to_qkv_mlp_proj", "packed_colwise", {D, D, D, F, F}},
       {"single_transformer_blocks.*.attn.to_out", "packed_rowwise", {D, F}}},
      shard_modulation ? nn::gathered_plan({"double_stream_modulation_img.linear",
                                            "double_stream_modulation_txt.linear",
                                            "single_stream_modulation.linear", "norm_out.linear"})
                       : nn::TensorParallelPlan{},
  });
}

// ---- construction ----

Flux2Transformer2DModel::Flux2Transformer2DModel(Flux2TransformerConfig config, const nn::Weights& w)
    : PretrainedTransformer(std::move(config)) {
  const Flux2TransformerConfig& c = config_;
  c.validate();
  const int64_t D = c.inner_dim();
  if (!c.guidance_embeds)
    refuse_extra(w, "time_guidance_embed.guidance_embedder.linear_1.weight", "the config has guidance_embeds=false");
  refuse_more_blocks(w, "transformer_blocks", c.num_layers, "attn.to_q.weight", "num_layers");
  refuse_more_blocks(w, "single_transformer_blocks", c.num_single_layers, "attn.to_qkv_mlp_proj.weight",
                     "num_single_layers");

  Core& m = core_;
  nn::ParameterRecorder recorded;
  m.x_embedder = nn::Linear(w.sub("x_embedder"), c.in_channels, D, false);
  m.context_embedder = nn::Linear(w.sub("context_embedder"), c.joint_attention_dim, D, false);
  const nn::Weights tge = w.sub("time_guidance_embed");
  const int64_t ch = c.timestep_guidance_channels;
  m.timestep_embedder = nn::MlpEmbedder(tge.sub("timestep_embedder"), ch, D, false);
  if (c.guidance_embeds) m.guidance_embedder = nn::MlpEmbedder(tge.sub("guidance_embedder"), ch, D, false);
  m.guidance_embeds = c.guidance_embeds;
  m.double_stream_modulation_img = nn::Linear(w.sub("double_stream_modulation_img").sub("linear"), D, 6 * D, false);
  m.double_stream_modulation_txt = nn::Linear(w.sub("double_stream_modulation_txt").sub("linear"), D, 6 * D, false);
  m.single_stream_modulation = nn::Linear(w.sub("single_stream_modulation").sub("linear"), D, 3 * D, false);
  const nn::BlockDims dims{D, c.attention_head_dim, c.mlp_hidden()};
  for (int64_t i = 0; i < c.num_layers; ++i) nn::load_block(m.transformer_blocks, w.sub("transformer_blocks", i), dims);
  for (int64_t i = 0; i < c.num_single_layers; ++i)
    nn::load_block(m.single_transformer_blocks, w.sub("single_transformer_blocks", i), dims);
  m.norm_out = nn::AdaLayerNormContinuous(w.sub("norm_out"), D, /*bias=*/false);
  m.proj_out = nn::Linear(w.sub("proj_out"), D, c.out_features(), false);
  set_named_parameters(recorded.named(w.path()));
  rope_ = nn::JointRotaryEmbedding(c.axes_dims_rope, c.rope_theta, kClassName);
}

// ---- forward ----

Tensor Flux2Transformer2DModel::time_guidance_embed(const Tensor& timestep,
                                                    const std::optional<Tensor>& guidance) const {
  return core_.time_embedding(timestep, guidance);
}

Tensor Flux2Transformer2DModel::Core::time_embedding(const Tensor& timestep,
                                                     const std::optional<Tensor>& guidance) const {
  // Cast chain: to the model dtype first, then ×1000 in that dtype; the f32 sinusoid
  // is cast back to the model dtype before the MLPs.
  const DType dt = x_embedder.dtype;
  const int64_t channels = timestep_embedder.linear_1.weight.dim(1);
  Tensor temb = timestep_embedder(cast(nn::timestep_sinusoid(cast(timestep, dt) * 1000.0, channels), dt));
  if (guidance && guidance_embeds)
    temb = temb + guidance_embedder(cast(nn::timestep_sinusoid(cast(*guidance, dt) * 1000.0, channels), dt));
  return temb;
}

Flux2Transformer2DModel::Modulations Flux2Transformer2DModel::Core::modulations(const Tensor& temb) const {
  const Tensor act = silu(temb);
  return {double_stream_modulation_img(act), double_stream_modulation_txt(act), single_stream_modulation(act)};
}

Tensor Flux2Transformer2DModel::Core::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                              const Tensor& timestep, const nn::RotaryTables& rope,
                                              const std::optional<Tensor>& guidance) const {
  const Tensor temb = time_embedding(timestep, guidance);
  const Modulations mod = modulations(temb);  // once per forward, shared by every block
  Tensor x = x_embedder(hidden_states);
  Tensor ctx = context_embedder(encoder_hidden_states);
  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    ModuleScope scope("transformer_blocks", int64_t(i));
    std::tie(ctx, x) = transformer_blocks[i](x, ctx, mod.img, mod.txt, rope);
  }
  const int64_t L_txt = ctx.dim(1);
  Tensor s = concat({ctx, x}, 1);
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i) {
    ModuleScope scope("single_transformer_blocks", int64_t(i));
    s = single_transformer_blocks[i](s, mod.single, rope);
  }
  ModuleScope scope("norm_out");
  return proj_out(norm_out(slice(s, 1, L_txt, s.dim(1)), temb));
}

std::vector<Tensor> Flux2Transformer2DModel::compiled_args(const Tensor& hidden_states,
                                                           const Tensor& encoder_hidden_states,
                                                           const Tensor& timestep, const nn::RotaryTables& rope,
                                                           const std::optional<Tensor>& guidance) {
  std::vector<Tensor> a = rope.args({hidden_states, encoder_hidden_states, timestep});
  if (guidance) a.push_back(*guidance);
  return a;
}

Flux2Transformer2DModel::Traced Flux2Transformer2DModel::traced() const {
  return [core = core_](const std::vector<Tensor>& a) {
    std::optional<Tensor> guidance;
    if (a.size() > 6) guidance = a[6];
    return std::vector<Tensor>{core.forward(a[0], a[1], a[2], nn::RotaryTables::from_args(a, 3), guidance)};
  };
}

std::vector<std::string> Flux2Transformer2DModel::arg_names() const {
  return {"hidden_states", "encoder_hidden_states", "timestep", "rope.cos", "rope.sin", "rope.pair_sign", "guidance"};
}

void Flux2Transformer2DModel::for_each_block(const std::function<void(nn::CompilableBlock&)>& f) {
  for (auto& b : core_.transformer_blocks) f(b);
  for (auto& b : core_.single_transformer_blocks) f(b);
}

std::vector<Tensor> Flux2Transformer2DModel::placeholder_args(int64_t batch, int64_t l_img, int64_t l_txt,
                                                              bool with_guidance) const {
  const Flux2TransformerConfig& c = config_;
  KILN_CHECK(batch > 0 && l_img > 0 && l_txt > 0, kWhere, "needs positive sizes, got B=", batch, " L_img=", l_img,
             " L_txt=", l_txt);
  const DType dt = dtype();
  const int64_t hd = c.attention_head_dim;
  const nn::RotaryTables rope = nn::JointRotaryEmbedding::placeholder(l_txt + l_img, hd);
  std::optional<Tensor> guidance;
  if (with_guidance && c.guidance_embeds) guidance = placeholder_tensor({batch}, DType::f32);
  return compiled_args(placeholder_tensor({batch, l_img, c.in_channels}, dt),
                       placeholder_tensor({batch, l_txt, c.joint_attention_dim}, dt),
                       placeholder_tensor({batch}, DType::f32), rope, guidance);
}

Tensor Flux2Transformer2DModel::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                        const Tensor& timestep, const Tensor& img_ids, const Tensor& txt_ids,
                                        std::optional<Tensor> guidance) const {
  const Flux2TransformerConfig& c = config_;
  const int64_t B = check_image_tokens(hidden_states, c.in_channels);
  check_text_states(encoder_hidden_states, B, c.joint_attention_dim);
  check_per_sample(timestep, B, "timestep");
  if (!c.guidance_embeds) guidance.reset();  // Diffusers has no guidance embedder to give it to
  if (guidance) check_per_sample(*guidance, B, "guidance");
  const nn::RotaryTables rope =  // text rows first
      rope_.for_step(img_ids, txt_ids, hidden_states.dim(1), encoder_hidden_states.dim(1));
  if (is_compiled()) return run_compiled(compiled_args(hidden_states, encoder_hidden_states, timestep, rope, guidance))[0];
  return core_.forward(hidden_states, encoder_hidden_states, timestep, rope, guidance);
}

}  // namespace kiln

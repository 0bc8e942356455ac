#include "models/flux/flux_transformer.h"

#include <tuple>

#include "core/error.h"
#include "exec/capture.h"
#include "io/config_fields.h"
#include "nn/tp_plans.h"

namespace kiln {
// Errors name the Diffusers class.
constexpr const char* kWhere = FluxTransformer2DModel::kClassName;

// ---- config ----

FluxTransformerConfig FluxTransformerConfig::from_json(const io::JsonConfig& j) {
  FluxTransformerConfig c;
  nn::read_transformer_fields(j, c);
  io::read_fields(j, {{"out_channels", c.out_channels}, {"num_single_layers", c.num_single_layers},
                      {"pooled_projection_dim", c.pooled_projection_dim}, {"guidance_embeds", c.guidance_embeds},
                      {"axes_dims_rope", c.axes_dims_rope}});
  c.validate(j.source());
  return c;
}

void FluxTransformerConfig::validate(const std::string& source) const {
  nn::check_transformer_fields(*this, kWhere, source);
  if (out_channels) nn::check_positive(*out_channels, "out_channels", kWhere, source);
  KILN_CHECK(num_layers >= 0 && num_single_layers >= 0, kWhere, source, ": block counts must be >= 0, got ",
             num_layers, " and ", num_single_layers);
  nn::check_positive(pooled_projection_dim, "pooled_projection_dim", kWhere, source);
  nn::check_axes_dims_rope(axes_dims_rope, attention_head_dim, kWhere, source);
}

// ---- class data ----

std::vector<TensorParallelEntry> FluxTransformer2DModel::tp_plan(const FluxTransformerConfig&, bool shard_modulation) {
  // The single block's proj_out reads [attn (D) | mlp (4D)], each sharded on its own: packed
  // rowwise [1, 4].
  return nn::concat_plans({
      nn::joint_attention_plan("transformer_blocks.*.attn"),
      nn::feed_forward_plan("transformer_blocks.*.ff"),
      nn::feed_forward_plan("transformer_blocks.*.ff_context"),
      {{"single_transformer_blocks.*.attn.to_q", "colwise", {}},
       {"single_transformer_blocks.*.attn.to_k", "colwise", {}},
       {"single_transformer_blocks.*.attn.to_v", "colwise", {}},
       {"single_transformer_blocks.*.proj_mlp", "colwise", {}},
       {"single_transformer_blocks.*.proj_out", "packed_rowwise", {1, 4}}},
      shard_modulation ? nn::gathered_plan({"transformer_blocks.*.norm1.linear",
                                            "transformer_blocks.*.norm1_context.linear",
                                            "single_transformer_blocks.*.norm.linear", "norm_out.linear"})
                       : nn::TensorParallelPlan{},
  });
}

// ---- construction ----

FluxTransformer2DModel::FluxTransformer2DModel(FluxTransformerConfig config, const nn::Weights& w)
    : PretrainedTransformer(std::move(config)) {
  const FluxTransformerConfig& c = config_;
  c.validate();
  const int64_t D = c.inner_dim();
  if (!c.guidance_embeds)
    refuse_extra(w, "time_text_embed.guidance_embedder.linear_1.weight", "the config has guidance_embeds=false");
  refuse_more_blocks(w, "transformer_blocks", c.num_layers, "norm1.linear.weight", "num_layers");
  refuse_more_blocks(w, "single_transformer_blocks", c.num_single_layers, "norm.linear.weight", "num_single_layers");

  Core& m = core_;
  nn::ParameterRecorder recorded;  // the parameter list is the names the modules read
  m.x_embedder = nn::Linear(w.sub("x_embedder"), c.in_channels, D);
  m.context_embedder = nn::Linear(w.sub("context_embedder"), c.joint_attention_dim, D);
  m.time_text_embed = nn::TimeTextEmbed(w.sub("time_text_embed"), D, c.pooled_projection_dim, c.guidance_embeds);
  const nn::BlockDims dims{D, c.attention_head_dim, c.mlp_hidden()};
  for (int64_t i = 0; i < c.num_layers; ++i) nn::load_block(m.transformer_blocks, w.sub("transformer_blocks", i), dims);
  for (int64_t i = 0; i < c.num_single_layers; ++i)
    nn::load_block(m.single_transformer_blocks, w.sub("single_transformer_blocks", i), dims);
  m.norm_out = nn::AdaLayerNormContinuous(w.sub("norm_out"), D);
  m.proj_out = nn::Linear(w.sub("proj_out"), D, c.out_features());
  set_named_parameters(recorded.named(w.path()));
  rope_ = nn::JointRotaryEmbedding(c.axes_dims_rope, 10000, kClassName);
}

// ---- forward ----

Tensor FluxTransformer2DModel::time_text_embed(const Tensor& timestep, const Tensor& pooled_projections,
                                               const std::optional<Tensor>& guidance) const {
  return core_.time_embedding(timestep, pooled_projections, guidance);
}

Tensor FluxTransformer2DModel::Core::time_embedding(const Tensor& timestep, const Tensor& pooled_projections,
                                                    const std::optional<Tensor>& guidance) const {
  // Cast chain: to the model dtype first, then ×1000 in that dtype.
  const DType dt = x_embedder.dtype;
  std::optional<Tensor> gs;
  if (guidance) gs = cast(*guidance, dt) * 1000.0;
  return time_text_embed(cast(timestep, dt) * 1000.0, gs, pooled_projections);
}

Tensor FluxTransformer2DModel::Core::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                             const Tensor& pooled_projections, const Tensor& timestep,
                                             const nn::RotaryTables& rope,
                                             const std::optional<Tensor>& guidance) const {
  Tensor x = x_embedder(hidden_states);
  const Tensor temb = time_embedding(timestep, pooled_projections, guidance);
  Tensor ctx = context_embedder(encoder_hidden_states);
  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    ModuleScope scope("transformer_blocks", int64_t(i));
    std::tie(ctx, x) = transformer_blocks[i](x, ctx, temb, rope);
  }
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i) {
    ModuleScope scope("single_transformer_blocks", int64_t(i));
    std::tie(ctx, x) = single_transformer_blocks[i](x, ctx, temb, rope);
  }
  ModuleScope scope("norm_out");
  return proj_out(norm_out(x, temb));
}

std::vector<Tensor> FluxTransformer2DModel::compiled_args(const Tensor& hidden_states,
                                                          const Tensor& encoder_hidden_states,
                                                          const Tensor& pooled_projections, const Tensor& timestep,
                                                          const nn::RotaryTables& rope,
                                                          const std::optional<Tensor>& guidance) const {
  std::vector<Tensor> a = rope.args({hidden_states, encoder_hidden_states, pooled_projections, timestep});
  if (guidance) a.push_back(*guidance);
  return a;
}

FluxTransformer2DModel::Traced FluxTransformer2DModel::traced() const {
  return [core = core_](const std::vector<Tensor>& a) {
    std::optional<Tensor> guidance;
    if (a.size() > 7) guidance = a[7];
    return std::vector<Tensor>{core.forward(a[0], a[1], a[2], a[3], nn::RotaryTables::from_args(a, 4), guidance)};
  };
}

std::vector<std::string> FluxTransformer2DModel::arg_names() const {
  std::vector<std::string> names =
      nn::RotaryTables::arg_names({"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"});
  names.push_back("guidance");
  return names;
}

void FluxTransformer2DModel::for_each_block(const std::function<void(nn::CompilableBlock&)>& f) {
  for (auto& b : core_.transformer_blocks) f(b);
  for (auto& b : core_.single_transformer_blocks) f(b);
}

std::vector<Tensor> FluxTransformer2DModel::placeholder_args(int64_t batch, int64_t l_img, int64_t l_txt) const {
  const FluxTransformerConfig& c = config_;
  KILN_CHECK(batch > 0 && l_img > 0 && l_txt > 0, kWhere, "needs positive sizes, got B=", batch, " L_img=", l_img,
             " L_txt=", l_txt);
  const DType dt = core_.x_embedder.dtype;
  const auto placeholder = placeholder_tensor;
  const int64_t hd = c.attention_head_dim;
  const nn::RotaryTables rope = nn::JointRotaryEmbedding::placeholder(l_txt + l_img, hd);
  std::optional<Tensor> guidance;
  if (c.guidance_embeds) guidance = placeholder({batch}, DType::f32);
  return compiled_args(placeholder({batch, l_img, c.in_channels}, dt),
                       placeholder({batch, l_txt, c.joint_attention_dim}, dt),
                       placeholder({batch, c.pooled_projection_dim}, dt), placeholder({batch}, DType::f32), rope,
                       guidance);
}

Tensor FluxTransformer2DModel::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                       const Tensor& pooled_projections, const Tensor& timestep,
                                       const Tensor& img_ids, const Tensor& txt_ids,
                                       std::optional<Tensor> guidance) const {
  const FluxTransformerConfig& c = config_;
  const int64_t B = check_image_tokens(hidden_states, c.in_channels);
  check_text_states(encoder_hidden_states, B, c.joint_attention_dim);
  check_pooled(pooled_projections, B, c.pooled_projection_dim);
  check_per_sample(timestep, B, "timestep");
  if (guidance) check_per_sample(*guidance, B, "guidance");
  const nn::RotaryTables rope =  // text rows first
      rope_.for_step(img_ids, txt_ids, hidden_states.dim(1), encoder_hidden_states.dim(1));
  if (is_compiled())
    return run_compiled(compiled_args(hidden_states, encoder_hidden_states, pooled_projections, timestep, rope, guidance))[0];
  return core_.forward(hidden_states, encoder_hidden_states, pooled_projections, timestep, rope, guidance);
}

}  // namespace kiln

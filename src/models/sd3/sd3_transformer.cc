#include "models/sd3/sd3_transformer.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "exec/capture.h"
#include "io/config_fields.h"
#include "nn/tp_plans.h"

namespace kiln {
// Errors name the Diffusers class.
constexpr const char* kWhere = SD3Transformer2DModel::kClassName;

// ---- config ----

SD3TransformerConfig SD3TransformerConfig::from_json(const io::JsonConfig& j) {
  SD3TransformerConfig c;
  nn::read_transformer_fields(j, c);
  io::read_fields(j, {{"sample_size", c.sample_size}, {"caption_projection_dim", c.caption_projection_dim},
                      {"pooled_projection_dim", c.pooled_projection_dim}});
  // JsonConfig reads null as absent, but here they differ: an absent out_channels is the class
  // default 16, a null one means in_channels.
  const nlohmann::json& raw = j.json();
  const auto is_null = [&](const char* field) { return raw.contains(field) && raw.at(field).is_null(); };
  c.out_channels = is_null("out_channels") ? c.in_channels : j.get_int("out_channels", c.out_channels);
  // A null pos_embed_max_size makes Diffusers compute an (interpolated) table instead of
  // loading one; no released checkpoint does that.
  KILN_CHECK(!is_null("pos_embed_max_size"), kWhere, j.source(),
             ": 'pos_embed_max_size' null (a computed, non-persistent positional table) is not supported");
  c.pos_embed_max_size = j.get_int("pos_embed_max_size", c.pos_embed_max_size);
  c.dual_attention_layers = j.get_int_list("dual_attention_layers", c.dual_attention_layers);
  if (j.has("qk_norm")) c.qk_norm = j.get_string("qk_norm");
  c.validate(j.source());
  return c;
}

void SD3TransformerConfig::validate(const std::string& source) const {
  nn::check_transformer_fields(*this, kWhere, source);
  KILN_CHECK(num_layers >= 0, kWhere, source, ": 'num_layers' must be >= 0, got ", num_layers);
  for (const auto& [v, field] : {std::pair{sample_size, "sample_size"}, {out_channels, "out_channels"},
                                 {caption_projection_dim, "caption_projection_dim"},
                                 {pooled_projection_dim, "pooled_projection_dim"},
                                 {pos_embed_max_size, "pos_embed_max_size"}})
    nn::check_positive(v, field, kWhere, source);
  // The blocks run the text stream at the image stream's width (every released config).
  KILN_CHECK(caption_projection_dim == inner_dim(), kWhere, source, ": 'caption_projection_dim' (",
             caption_projection_dim, ") must equal num_attention_heads * attention_head_dim = ", num_attention_heads,
             " * ", attention_head_dim, " = ", inner_dim());
  for (int64_t i : dual_attention_layers)
    KILN_CHECK(i >= 0 && i < num_layers, kWhere, source, ": 'dual_attention_layers' entry ", i,
               " is not a block index (num_layers = ", num_layers, ")");
  KILN_CHECK(!qk_norm || *qk_norm == "rms_norm", kWhere, source, ": 'qk_norm' must be null or \"rms_norm\", got \"",
             qk_norm.value_or(""), "\"");
}

sd3::JointBlockStructure SD3TransformerConfig::block_structure(int64_t i) const {
  sd3::JointBlockStructure s;
  s.dual_attention =
      std::find(dual_attention_layers.begin(), dual_attention_layers.end(), i) != dual_attention_layers.end();
  s.context_pre_only = i == num_layers - 1;
  s.qk_norm = qk_norm.has_value();
  return s;
}

// ---- class data ----

std::vector<TensorParallelEntry> SD3Transformer2DModel::tp_plan(const SD3TransformerConfig&, bool shard_modulation) {
  // The last block has no to_add_out / ff_context, so those entries simply match nothing there.
  return nn::concat_plans({
      nn::joint_attention_plan("transformer_blocks.*.attn"),
      nn::self_attention_plan("transformer_blocks.*.attn2"),
      nn::feed_forward_plan("transformer_blocks.*.ff"),
      nn::feed_forward_plan("transformer_blocks.*.ff_context"),
      shard_modulation ? nn::gathered_plan({"transformer_blocks.*.norm1.linear",
                                            "transformer_blocks.*.norm1_context.linear", "norm_out.linear"})
                       : nn::TensorParallelPlan{},
  });
}

// ---- construction ----

SD3Transformer2DModel::SD3Transformer2DModel(SD3TransformerConfig config, const nn::Weights& w)
    : PretrainedTransformer(std::move(config)) {
  const SD3TransformerConfig& c = config_;
  c.validate();
  const int64_t D = c.inner_dim();
  // A checkpoint with more blocks, or tensors of a variant the config does not name, would load
  // "fine" and compute another model, so those disagreements are errors too. (The opposite
  // cases fail on a missing tensor or on norm1's shape.)
  refuse_more_blocks(w, "transformer_blocks", c.num_layers, "norm1.linear.weight", "num_layers");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string block = "transformer_blocks." + std::to_string(i);
    if (!c.block_structure(i).dual_attention)
      refuse_extra(w, block + ".attn2.to_q.weight",
                   "the config's dual_attention_layers does not list block " + std::to_string(i));
    if (!c.qk_norm) refuse_extra(w, block + ".attn.norm_q.weight", "the config has qk_norm=null");
  }

  Core& m = core_;
  nn::ParameterRecorder recorded;  // the parameter list is the names the modules read
  m.patch_size = c.patch_size;
  m.out_channels = c.out_channels;
  m.pos_embed = sd3::PatchEmbed(w.sub("pos_embed"), c.in_channels, D, c.patch_size, c.pos_embed_max_size);
  m.time_text_embed = nn::TimeTextEmbed(w.sub("time_text_embed"), D, c.pooled_projection_dim,
                                          /*guidance_embeds=*/false);
  m.context_embedder = nn::Linear(w.sub("context_embedder"), c.joint_attention_dim, c.caption_projection_dim);
  const nn::BlockDims dims{D, c.attention_head_dim, c.mlp_hidden()};
  for (int64_t i = 0; i < c.num_layers; ++i)
    nn::load_block(m.transformer_blocks, w.sub("transformer_blocks", i), dims, c.block_structure(i));
  m.norm_out = nn::AdaLayerNormContinuous(w.sub("norm_out"), D);
  m.proj_out = nn::Linear(w.sub("proj_out"), D, c.out_features());
  set_named_parameters(recorded.named(w.path()));
}

// ---- forward ----

Tensor SD3Transformer2DModel::Core::time_embedding(const Tensor& timestep, const Tensor& pooled_projections) const {
  // CombinedTimestepTextProjEmbeddings: the timestep is used as given (no ×1000, unlike FLUX's
  // sigma), its f32 sinusoid cast to the pooled projections' dtype.
  return time_text_embed(timestep, std::nullopt, pooled_projections);
}

Tensor SD3Transformer2DModel::Core::unpatchify(const Tensor& y, int64_t height, int64_t width) const {
  const int64_t p = patch_size, h = height / p, w = width / p, B = y.dim(0), C = out_channels;
  // [B, h, w, p, p, C] -> [B, C, h, p, w, p] (einsum "nhwpqc->nchpwq") -> [B, C, h·p, w·p].
  const Tensor t = permute(reshape(y, {B, h, w, p, p, C}), {0, 5, 1, 3, 2, 4});
  return reshape(t, {B, C, height, width});
}

Tensor SD3Transformer2DModel::Core::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                            const Tensor& pooled_projections, const Tensor& timestep,
                                            const std::vector<int64_t>& skip) const {
  Tensor x;
  {
    ModuleScope scope("pos_embed");
    x = pos_embed(hidden_states);
  }
  const Tensor temb = time_embedding(timestep, pooled_projections);
  Tensor ctx = context_embedder(encoder_hidden_states);
  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    // A skipped block passes both streams through unchanged.
    if (std::binary_search(skip.begin(), skip.end(), int64_t(i))) continue;
    ModuleScope scope("transformer_blocks", int64_t(i));
    std::tie(ctx, x) = transformer_blocks[i](x, ctx, temb);
  }
  ModuleScope scope("norm_out");
  return unpatchify(proj_out(norm_out(x, temb)), hidden_states.dim(2), hidden_states.dim(3));
}

std::vector<int64_t> SD3Transformer2DModel::checked_skip_layers(const std::vector<int64_t>& skip_layers) const {
  std::vector<int64_t> skip = skip_layers;
  std::sort(skip.begin(), skip.end());
  skip.erase(std::unique(skip.begin(), skip.end()), skip.end());
  // Diffusers ignores an index past the last block; here it is an error, as it is most likely a
  // list meant for a deeper model (SD3.5 Medium's [7, 8, 9] on a smaller one).
  for (int64_t i : skip)
    KILN_CHECK(i >= 0 && i < config_.num_layers, kWhere, "skip_layers entry ", i,
               " is not a block index (the model has ", config_.num_layers, " blocks)");
  return skip;
}

Tensor SD3Transformer2DModel::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                      const Tensor& pooled_projections, const Tensor& timestep,
                                      const std::vector<int64_t>& skip_layers) const {
  const SD3TransformerConfig& c = config_;
  KILN_CHECK(hidden_states.rank() == 4 && hidden_states.dim(1) == c.in_channels, kWhere, "hidden_states must be [B, ",
             c.in_channels, ", h, w], got ", to_string(hidden_states.shape()));
  const int64_t B = hidden_states.dim(0), h = hidden_states.dim(2), w = hidden_states.dim(3), p = c.patch_size;
  KILN_CHECK(h % p == 0 && w % p == 0, kWhere, "the latent height and width (", h, "x", w,
             ") must be multiples of patch_size = ", p);
  KILN_CHECK(h / p <= c.pos_embed_max_size && w / p <= c.pos_embed_max_size, kWhere, "a latent of ", h, "x", w, " is ",
             h / p, "x", w / p, " patches, more than pos_embed_max_size = ", c.pos_embed_max_size, " in a dimension");
  check_text_states(encoder_hidden_states, B, c.joint_attention_dim);
  check_pooled(pooled_projections, B, c.pooled_projection_dim);
  check_per_sample(timestep, B, "timestep");
  const std::vector<int64_t> skip = checked_skip_layers(skip_layers);

  if (is_compiled())
    return run_compiled({hidden_states, encoder_hidden_states, pooled_projections, timestep},
                        skip.empty() ? "" : "skip_layers=" + to_string(skip), [&] { return traced_skipping(skip); })[0];
  return core_.forward(hidden_states, encoder_hidden_states, pooled_projections, timestep, skip);
}

// ---- compiled mode ----

SD3Transformer2DModel::Traced SD3Transformer2DModel::traced_skipping(const std::vector<int64_t>& skip) const {
  return [core = core_, skip](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{core.forward(a[0], a[1], a[2], a[3], skip)};
  };
}

std::vector<std::string> SD3Transformer2DModel::arg_names() const {
  return {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"};
}

void SD3Transformer2DModel::for_each_block(const std::function<void(nn::CompilableBlock&)>& f) {
  for (auto& b : core_.transformer_blocks) f(b);
}

std::vector<Tensor> SD3Transformer2DModel::placeholder_args(int64_t batch, int64_t height, int64_t width,
                                                            int64_t l_txt) const {
  const SD3TransformerConfig& c = config_;
  KILN_CHECK(batch > 0 && height > 0 && width > 0 && l_txt > 0, kWhere, "needs positive sizes, got B=", batch,
             " h=", height, " w=", width, " L_txt=", l_txt);
  KILN_CHECK(height % c.patch_size == 0 && width % c.patch_size == 0, kWhere, "the latent height and width (", height,
             "x", width, ") must be multiples of patch_size = ", c.patch_size);
  const DType dt = dtype();
  const auto placeholder = placeholder_tensor;
  return {placeholder({batch, c.in_channels, height, width}, dt),
          placeholder({batch, l_txt, c.joint_attention_dim}, dt), placeholder({batch, c.pooled_projection_dim}, dt),
          placeholder({batch}, DType::f32)};
}

}  // namespace kiln

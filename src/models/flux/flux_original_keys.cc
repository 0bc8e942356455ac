#include "models/flux/flux_original_keys.h"

namespace kiln {

namespace {

using io::KeyRule;
using io::KeyTransform;

void linear(std::vector<KeyRule>& r, const std::string& original, const std::string& diffusers, bool optional = false) {
  io::add_linear(r, original, diffusers, optional);
}

void fused(std::vector<KeyRule>& r, const std::string& original, const std::vector<std::string>& diffusers,
           std::vector<int64_t> units, const std::string& unit_from = "", int unit_dim = 0) {
  io::add_fused_linear(r, original, diffusers, std::move(units), false, unit_from, unit_dim);
}

}  // namespace

std::vector<KeyRule> flux1_original_key_rules() {
  std::vector<KeyRule> r;
  linear(r, "img_in", "x_embedder");
  linear(r, "txt_in", "context_embedder");
  linear(r, "time_in.in_layer", "time_text_embed.timestep_embedder.linear_1");
  linear(r, "time_in.out_layer", "time_text_embed.timestep_embedder.linear_2");
  linear(r, "vector_in.in_layer", "time_text_embed.text_embedder.linear_1");
  linear(r, "vector_in.out_layer", "time_text_embed.text_embedder.linear_2");
  // FLUX.1 [dev] only (guidance_embeds).
  linear(r, "guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1", /*optional=*/true);
  linear(r, "guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2", /*optional=*/true);

  // Double-stream blocks: the image and text streams' fused q, k, v are three equal row parts.
  const std::string d = "double_blocks.{i}.", t = "transformer_blocks.{i}.";
  linear(r, d + "img_mod.lin", t + "norm1.linear");
  linear(r, d + "txt_mod.lin", t + "norm1_context.linear");
  fused(r, d + "img_attn.qkv", {t + "attn.to_q", t + "attn.to_k", t + "attn.to_v"}, {1, 1, 1});
  fused(r, d + "txt_attn.qkv", {t + "attn.add_q_proj", t + "attn.add_k_proj", t + "attn.add_v_proj"}, {1, 1, 1});
  r.push_back({.original = d + "img_attn.norm.query_norm.scale", .diffusers = {t + "attn.norm_q.weight"}});
  r.push_back({.original = d + "img_attn.norm.key_norm.scale", .diffusers = {t + "attn.norm_k.weight"}});
  r.push_back({.original = d + "txt_attn.norm.query_norm.scale", .diffusers = {t + "attn.norm_added_q.weight"}});
  r.push_back({.original = d + "txt_attn.norm.key_norm.scale", .diffusers = {t + "attn.norm_added_k.weight"}});
  linear(r, d + "img_attn.proj", t + "attn.to_out.0");
  linear(r, d + "txt_attn.proj", t + "attn.to_add_out");
  linear(r, d + "img_mlp.0", t + "ff.net.0.proj");
  linear(r, d + "img_mlp.2", t + "ff.net.2");
  linear(r, d + "txt_mlp.0", t + "ff_context.net.0.proj");
  linear(r, d + "txt_mlp.2", t + "ff_context.net.2");

  // Single-stream blocks: linear1 is q, k, v (hidden rows each, hidden = its in_features) then
  // the MLP's input projection (the rest).
  const std::string s = "single_blocks.{i}.", st = "single_transformer_blocks.{i}.";
  linear(r, s + "modulation.lin", st + "norm.linear");
  fused(r, s + "linear1", {st + "attn.to_q", st + "attn.to_k", st + "attn.to_v", st + "proj_mlp"}, {1, 1, 1, io::kRestOfRows},
        s + "linear1.weight", 1);
  r.push_back({.original = s + "norm.query_norm.scale", .diffusers = {st + "attn.norm_q.weight"}});
  r.push_back({.original = s + "norm.key_norm.scale", .diffusers = {st + "attn.norm_k.weight"}});
  linear(r, s + "linear2", st + "proj_out");

  linear(r, "final_layer.linear", "proj_out");
  // BFL's final AdaLN emits (shift, scale); Diffusers' AdaLayerNormContinuous reads (scale, shift).
  for (const char* p : {".weight", ".bias"})
    r.push_back({.original = std::string("final_layer.adaLN_modulation.1") + p,
                 .diffusers = {std::string("norm_out.linear") + p},
                 .transform = KeyTransform::swap_halves});
  return r;
}

}  // namespace kiln

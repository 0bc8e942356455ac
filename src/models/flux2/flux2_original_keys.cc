#include "models/flux2/flux2_original_keys.h"

namespace kiln {

namespace {

using io::KeyRule;
using io::KeyTransform;

}  // namespace

std::vector<KeyRule> flux2_original_key_rules() {
  std::vector<KeyRule> r;
  const auto same = [&](const std::string& original, const std::string& diffusers, bool optional = false) {
    r.push_back({.original = original, .diffusers = {diffusers}, .optional = optional});
  };
  same("img_in.weight", "x_embedder.weight");
  same("txt_in.weight", "context_embedder.weight");
  same("time_in.in_layer.weight", "time_guidance_embed.timestep_embedder.linear_1.weight");
  same("time_in.out_layer.weight", "time_guidance_embed.timestep_embedder.linear_2.weight");
  // FLUX.2 [dev] (guidance_embeds); klein has none.
  same("guidance_in.in_layer.weight", "time_guidance_embed.guidance_embedder.linear_1.weight", true);
  same("guidance_in.out_layer.weight", "time_guidance_embed.guidance_embedder.linear_2.weight", true);
  // One modulation per stream, shared by every block.
  same("double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight");
  same("double_stream_modulation_txt.lin.weight", "double_stream_modulation_txt.linear.weight");
  same("single_stream_modulation.lin.weight", "single_stream_modulation.linear.weight");

  const std::string d = "double_blocks.{i}.", t = "transformer_blocks.{i}.";
  r.push_back({.original = d + "img_attn.qkv.weight",
               .diffusers = {t + "attn.to_q.weight", t + "attn.to_k.weight", t + "attn.to_v.weight"},
               .transform = KeyTransform::rows,
               .row_units = {1, 1, 1}});
  r.push_back({.original = d + "txt_attn.qkv.weight",
               .diffusers = {t + "attn.add_q_proj.weight", t + "attn.add_k_proj.weight", t + "attn.add_v_proj.weight"},
               .transform = KeyTransform::rows,
               .row_units = {1, 1, 1}});
  same(d + "img_attn.norm.query_norm.scale", t + "attn.norm_q.weight");
  same(d + "img_attn.norm.key_norm.scale", t + "attn.norm_k.weight");
  same(d + "txt_attn.norm.query_norm.scale", t + "attn.norm_added_q.weight");
  same(d + "txt_attn.norm.key_norm.scale", t + "attn.norm_added_k.weight");
  same(d + "img_attn.proj.weight", t + "attn.to_out.0.weight");
  same(d + "txt_attn.proj.weight", t + "attn.to_add_out.weight");
  same(d + "img_mlp.0.weight", t + "ff.linear_in.weight");
  same(d + "img_mlp.2.weight", t + "ff.linear_out.weight");
  same(d + "txt_mlp.0.weight", t + "ff_context.linear_in.weight");
  same(d + "txt_mlp.2.weight", t + "ff_context.linear_out.weight");

  const std::string s = "single_blocks.{i}.", st = "single_transformer_blocks.{i}.";
  same(s + "linear1.weight", st + "attn.to_qkv_mlp_proj.weight");
  same(s + "linear2.weight", st + "attn.to_out.weight");
  same(s + "norm.query_norm.scale", st + "attn.norm_q.weight");
  same(s + "norm.key_norm.scale", st + "attn.norm_k.weight");

  same("final_layer.linear.weight", "proj_out.weight");
  // (shift, scale) in BFL's final AdaLN, (scale, shift) in Diffusers'.
  r.push_back({.original = "final_layer.adaLN_modulation.1.weight",
               .diffusers = {"norm_out.linear.weight"},
               .transform = KeyTransform::swap_halves});
  return r;
}

}  // namespace kiln

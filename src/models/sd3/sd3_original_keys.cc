#include "models/sd3/sd3_original_keys.h"

namespace kiln {

namespace {

using io::BlockCondition;
using io::KeyRule;
using io::KeyTransform;

void linear(std::vector<KeyRule>& r, const std::string& original, const std::string& diffusers, bool optional = false,
            KeyTransform transform = KeyTransform::whole, BlockCondition when = BlockCondition::any) {
  io::add_linear(r, original, diffusers, optional, transform, when);
}

// A fused q, k, v projection: three equal row parts (weight and bias).
void qkv(std::vector<KeyRule>& r, const std::string& original, const std::string& attn, const std::vector<std::string>& qkv,
         bool optional = false) {
  io::add_fused_linear(r, original, {attn + qkv[0], attn + qkv[1], attn + qkv[2]}, {1, 1, 1}, optional);
}

}  // namespace

std::vector<KeyRule> sd3_original_key_rules() {
  std::vector<KeyRule> r;
  r.push_back({.original = "pos_embed", .diffusers = {"pos_embed.pos_embed"}});
  linear(r, "x_embedder.proj", "pos_embed.proj");
  linear(r, "t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1");
  linear(r, "t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2");
  linear(r, "y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1");
  linear(r, "y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2");
  linear(r, "context_embedder", "context_embedder");

  const std::string x = "joint_blocks.{i}.x_block.", c = "joint_blocks.{i}.context_block.", t = "transformer_blocks.{i}.";
  qkv(r, x + "attn.qkv", t + "attn.", {"to_q", "to_k", "to_v"});
  qkv(r, c + "attn.qkv", t + "attn.", {"add_q_proj", "add_k_proj", "add_v_proj"});
  // Per-head RMSNorm of q and k (qk_norm "rms_norm": SD3.5).
  const auto norm = [&](const std::string& original, const std::string& diffusers) {
    r.push_back({.original = original, .diffusers = {diffusers}, .optional = true});
  };
  norm(x + "attn.ln_q.weight", t + "attn.norm_q.weight");
  norm(x + "attn.ln_k.weight", t + "attn.norm_k.weight");
  norm(c + "attn.ln_q.weight", t + "attn.norm_added_q.weight");
  norm(c + "attn.ln_k.weight", t + "attn.norm_added_k.weight");
  linear(r, x + "attn.proj", t + "attn.to_out.0");
  // The last block's context stream is pre-only: no output projection, no MLP.
  linear(r, c + "attn.proj", t + "attn.to_add_out", /*optional=*/true);
  // MMDiT-X's second image self-attention (dual_attention_layers: SD3.5 Medium).
  qkv(r, x + "attn2.qkv", t + "attn2.", {"to_q", "to_k", "to_v"}, /*optional=*/true);
  norm(x + "attn2.ln_q.weight", t + "attn2.norm_q.weight");
  norm(x + "attn2.ln_k.weight", t + "attn2.norm_k.weight");
  linear(r, x + "attn2.proj", t + "attn2.to_out.0", /*optional=*/true);

  linear(r, x + "adaLN_modulation.1", t + "norm1.linear");
  // The context stream's modulation, except in the last block, whose pre-only context norm is an
  // AdaLayerNormContinuous in Diffusers: (scale, shift) where the original has (shift, scale).
  linear(r, c + "adaLN_modulation.1", t + "norm1_context.linear", false, KeyTransform::whole, BlockCondition::not_last);
  linear(r, c + "adaLN_modulation.1", t + "norm1_context.linear", false, KeyTransform::swap_halves, BlockCondition::last);
  linear(r, x + "mlp.fc1", t + "ff.net.0.proj");
  linear(r, x + "mlp.fc2", t + "ff.net.2");
  linear(r, c + "mlp.fc1", t + "ff_context.net.0.proj", /*optional=*/true);
  linear(r, c + "mlp.fc2", t + "ff_context.net.2", /*optional=*/true);

  linear(r, "final_layer.linear", "proj_out");
  linear(r, "final_layer.adaLN_modulation.1", "norm_out.linear", false, KeyTransform::swap_halves);
  return r;
}

}  // namespace kiln

// Flux2Transformer2DModel: the FLUX.2 (dev, klein) diffusion transformer, as in Diffusers.
// Loaded from a Diffusers "transformer" folder (config.json + safetensors) with the
// Diffusers state-dict names. Differences from FLUX.1 that shape this file: three shared
// modulation Linears computed once per forward, no biases, 4-axis RoPE (theta 2000), and no pooled
// text vector.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/pretrained_transformer.h"
#include "distributed/tensor_parallel.h"
#include "io/json_config.h"
#include "models/flux2/flux2_blocks.h"
#include "nn/embeddings.h"

namespace kiln {

// transformer/config.json with the class defaults.
struct Flux2TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  std::optional<int64_t> out_channels;  // null -> in_channels
  int64_t num_layers = 8;               // double-stream blocks
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope{32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;

  static Flux2TransformerConfig from_json(const io::JsonConfig& json);  // reads and validates
  void validate(const std::string& source = "Flux2TransformerConfig") const;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t out_features() const { return patch_size * patch_size * out_channels.value_or(in_channels); }
  int64_t mlp_hidden() const { return int64_t(double(inner_dim()) * mlp_ratio); }  // F = int(D · mlp_ratio)
};


class Flux2Transformer2DModel
    : public nn::PretrainedTransformer<Flux2Transformer2DModel, Flux2TransformerConfig, flux2::Flux2TransformerBlock,
                                      flux2::Flux2SingleTransformerBlock> {
 public:
  static constexpr const char* kClassName = "Flux2Transformer2DModel";
  // Diffusers' _tp_plan for this config's widths; every Linear not listed is
  // replicated. With shard_modulation the three shared modulation Linears and norm_out.linear
  // are added as colwise_gather (each rank computes a slice, all gather it).
  static std::vector<TensorParallelEntry> tp_plan(const Flux2TransformerConfig& config, bool shard_modulation = false);

  Flux2Transformer2DModel(Flux2TransformerConfig config, const nn::Weights& weights);

  // hidden_states [B, L_img, in_ch], encoder_hidden_states [B, L_txt, joint_dim], timestep [B]
  // (sigma = t/1000), img_ids [L_img, 4] and txt_ids [L_txt, 4] (3-D ids use batch element 0),
  // guidance [B] (used only when guidance_embeds; may be absent then) -> [B, L_img, out_features].
  Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& timestep,
                 const Tensor& img_ids, const Tensor& txt_ids, std::optional<Tensor> guidance = std::nullopt) const;

  DType dtype() const { return core_.x_embedder.dtype; }  // torch_dtype it was loaded in

  // ---- compiled mode (nn::DiffusionTransformer) ----
  void warmup(int64_t batch, int64_t l_img, int64_t l_txt, bool with_guidance) const {
    warmup_with(placeholder_args(batch, l_img, l_txt, with_guidance));
  }
  size_t activation_bytes(int64_t batch, int64_t l_img, int64_t l_txt) const {
    return activation_bytes_with(placeholder_args(batch, l_img, l_txt, true));
  }

  // ---- sub-steps of forward (public so tests can compare them with Diffusers' modules) ----
  Tensor x_embedder(const Tensor& hidden_states) const { return core_.x_embedder(hidden_states); }
  Tensor context_embedder(const Tensor& encoder_hidden_states) const {
    return core_.context_embedder(encoder_hidden_states);
  }
  // timestep/guidance as given to forward (already /1000) -> temb [B, D].
  Tensor time_guidance_embed(const Tensor& timestep, const std::optional<Tensor>& guidance) const;
  struct Modulations {
    Tensor img, txt, single;  // [B, 6D], [B, 6D], [B, 3D]
  };
  Modulations modulations(const Tensor& temb) const { return core_.modulations(temb); }
  nn::RotaryTables pos_embed(const Tensor& img_ids, const Tensor& txt_ids) const { return rope_(img_ids, txt_ids); }
  const std::vector<flux2::Flux2TransformerBlock>& transformer_blocks() const { return core_.transformer_blocks; }
  const std::vector<flux2::Flux2SingleTransformerBlock>& single_transformer_blocks() const {
    return core_.single_transformer_blocks;
  }
  Tensor norm_out(const Tensor& x, const Tensor& temb) const { return core_.norm_out(x, temb); }
  Tensor proj_out(const Tensor& x) const { return core_.proj_out(x); }

 private:
  struct Core {
    nn::Linear x_embedder, context_embedder, proj_out;
    nn::MlpEmbedder timestep_embedder, guidance_embedder;
    bool guidance_embeds = false;
    nn::Linear double_stream_modulation_img, double_stream_modulation_txt, single_stream_modulation;
    std::vector<flux2::Flux2TransformerBlock> transformer_blocks;
    std::vector<flux2::Flux2SingleTransformerBlock> single_transformer_blocks;
    nn::AdaLayerNormContinuous norm_out;

    Tensor time_embedding(const Tensor& timestep, const std::optional<Tensor>& guidance) const;
    Modulations modulations(const Tensor& temb) const;
    Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& timestep,
                   const nn::RotaryTables& rope, const std::optional<Tensor>& guidance) const;
  };
  // Executable args: hidden_states, encoder_hidden_states, timestep, rope.cos, rope.sin,
  // rope.pair_sign[, guidance].
  static std::vector<Tensor> compiled_args(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                           const Tensor& timestep, const nn::RotaryTables& rope,
                                           const std::optional<Tensor>& guidance);
  std::vector<Tensor> placeholder_args(int64_t batch, int64_t l_img, int64_t l_txt, bool with_guidance) const;

  Traced traced() const override;
  std::vector<std::string> arg_names() const override;
  void for_each_block(const std::function<void(nn::CompilableBlock&)>& f) override;

  Core core_;
  nn::JointRotaryEmbedding rope_;
};

}  // namespace kiln

// FluxTransformer2DModel: the FLUX.1 (schnell / dev) diffusion transformer, as in Diffusers
// Loaded from a Diffusers "transformer" folder (config.json + safetensors)
// with the Diffusers state-dict names; computes in f32.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "distributed/tensor_parallel.h"
#include "models/flux/flux_blocks.h"
#include "nn/pretrained_transformer.h"
#include "nn/embeddings.h"

namespace kiln {

// transformer/config.json with the class defaults.
struct FluxTransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  std::optional<int64_t> out_channels;  // null -> in_channels
  int64_t num_layers = 19;              // double-stream blocks
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  static FluxTransformerConfig from_json(const io::JsonConfig& json);  // reads and validates
  // Errors (naming `source`) when a size is not positive or axes_dims_rope does not fit attention_head_dim.
  void validate(const std::string& source = "FluxTransformerConfig") const;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t out_features() const { return patch_size * patch_size * out_channels.value_or(in_channels); }
  int64_t mlp_hidden() const { return 4 * inner_dim(); }
};

class FluxTransformer2DModel
    : public nn::PretrainedTransformer<FluxTransformer2DModel, FluxTransformerConfig, flux::FluxTransformerBlock,
                                      flux::FluxSingleTransformerBlock> {
 public:
  static constexpr const char* kClassName = "FluxTransformer2DModel";
  // Diffusers' _tp_plan for this model; every Linear not listed is
  // replicated. With shard_modulation the AdaLN modulation linears are added as colwise_gather.
  static std::vector<TensorParallelEntry> tp_plan(const FluxTransformerConfig& config = {},
                                                  bool shard_modulation = false);

  // Builds from an explicit config and checkpoint (shapes checked against the config).
  FluxTransformer2DModel(FluxTransformerConfig config, const nn::Weights& weights);

  // hidden_states [B, L_img, in_ch], encoder_hidden_states [B, L_txt, joint_dim],
  // pooled_projections [B, pooled_dim], timestep [B] (sigma = t/1000), img_ids [L_img, 3],
  // txt_ids [L_txt, 3] (3-D ids use batch element 0), guidance [B] iff guidance_embeds
  // -> velocity [B, L_img, patch²·out_ch].
  Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& pooled_projections,
                 const Tensor& timestep, const Tensor& img_ids, const Tensor& txt_ids,
                 std::optional<Tensor> guidance = std::nullopt) const;

  DType dtype() const { return core_.x_embedder.dtype; }  // torch_dtype it was loaded in

  // ---- compiled mode (nn::DiffusionTransformer) ----
  // Whole-model compile: the RoPE tables are built on the host from the ids (f64, as Diffusers),
  // cached per ids, and passed to the executable as inputs; everything else (embeddings, all
  // blocks, norm_out, proj_out) is one graph.
  // Traces and compiles the executables a call with these shapes would use, without running
  // anything (kiln warmup): batch B, l_img image and l_txt text tokens.
  void warmup(int64_t batch, int64_t l_img, int64_t l_txt) const { warmup_with(placeholder_args(batch, l_img, l_txt)); }
  // Peak activation bytes of one forward at these sizes run op by op (the traced graph's
  // liveness, exec/memory_plan.h): model offload's fail-fast estimate. Runs nothing.
  size_t activation_bytes(int64_t batch, int64_t l_img, int64_t l_txt) const {
    return activation_bytes_with(placeholder_args(batch, l_img, l_txt));
  }

  // ---- sub-steps of forward (public so tests can compare them with Diffusers' modules) ----
  Tensor x_embedder(const Tensor& hidden_states) const { return core_.x_embedder(hidden_states); }
  Tensor context_embedder(const Tensor& encoder_hidden_states) const {
    return core_.context_embedder(encoder_hidden_states);
  }
  // timestep/guidance as given to forward (already /1000): applies the ×1000 of the cast chain.
  Tensor time_text_embed(const Tensor& timestep, const Tensor& pooled_projections,
                         const std::optional<Tensor>& guidance = std::nullopt) const;
  // pos_embed over concat(txt_ids, img_ids) -> cos/sin [L_txt + L_img, head_dim].
  nn::RotaryTables pos_embed(const Tensor& img_ids, const Tensor& txt_ids) const { return rope_(img_ids, txt_ids); }
  const std::vector<flux::FluxTransformerBlock>& transformer_blocks() const { return core_.transformer_blocks; }
  const std::vector<flux::FluxSingleTransformerBlock>& single_transformer_blocks() const {
    return core_.single_transformer_blocks;
  }
  Tensor norm_out(const Tensor& x, const Tensor& temb) const { return core_.norm_out(x, temb); }
  Tensor proj_out(const Tensor& x) const { return core_.proj_out(x); }

 private:
  // The modules, and forward past the input checks and RoPE tables: what a whole-model compile
  // traces (a copy of it lives in the compiled callable; tensors are shared handles).
  struct Core {
    nn::Linear x_embedder, context_embedder, proj_out;
    nn::TimeTextEmbed time_text_embed;
    std::vector<flux::FluxTransformerBlock> transformer_blocks;
    std::vector<flux::FluxSingleTransformerBlock> single_transformer_blocks;
    nn::AdaLayerNormContinuous norm_out;

    Tensor time_embedding(const Tensor& timestep, const Tensor& pooled_projections,
                          const std::optional<Tensor>& guidance) const;
    Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& pooled_projections,
                   const Tensor& timestep, const nn::RotaryTables& rope, const std::optional<Tensor>& guidance) const;
  };
  // Executable args: hidden_states, encoder_hidden_states, pooled_projections, timestep,
  // rope.cos, rope.sin, rope.pair_sign[, guidance].
  std::vector<Tensor> compiled_args(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                    const Tensor& pooled_projections, const Tensor& timestep,
                                    const nn::RotaryTables& rope, const std::optional<Tensor>& guidance) const;

  // Inputs with the right shapes and dtypes whose contents are never read (warmup, estimates).
  std::vector<Tensor> placeholder_args(int64_t batch, int64_t l_img, int64_t l_txt) const;

  Traced traced() const override;
  std::vector<std::string> arg_names() const override;
  void for_each_block(const std::function<void(nn::CompilableBlock&)>& f) override;

  Core core_;

  nn::JointRotaryEmbedding rope_;
};

}  // namespace kiln
